#include "model/gguf.h"

#include <algorithm>
#include <cstring>
#include <fstream>
#include <limits>

namespace sy {
namespace {

constexpr uint32_t kMaxDims = 4;     // GGML_MAX_DIMS
constexpr int kMaxArrayNesting = 8;  // deeper arrays are refused, never recursed into
constexpr uint64_t kMaxAlignment = 1 << 20;
// The fewest bytes one metadata pair and one tensor info can take: how absurd counts are caught
// before anything is allocated for them.
constexpr uint64_t kMinMetadataBytes = 8 + 1 + 4 + 1;            // key "x", type, a u8
constexpr uint64_t kMinTensorInfoBytes = 8 + 1 + 4 + 8 + 4 + 8;  // name "x", 1 dim, type, offset

// The encoded size of a scalar value type; 0 for strings and arrays.
uint64_t ScalarSize(GgufValueType type) {
  switch (type) {
    case GgufValueType::kUint8:
    case GgufValueType::kInt8:
    case GgufValueType::kBool:
      return 1;
    case GgufValueType::kUint16:
    case GgufValueType::kInt16:
      return 2;
    case GgufValueType::kUint32:
    case GgufValueType::kInt32:
    case GgufValueType::kFloat32:
      return 4;
    case GgufValueType::kUint64:
    case GgufValueType::kInt64:
    case GgufValueType::kFloat64:
      return 8;
    default:
      return 0;
  }
}

// The fewest bytes one element of an array of `type` takes.
uint64_t MinElementSize(GgufValueType type) {
  if (type == GgufValueType::kString) return 8;
  if (type == GgufValueType::kArray) return 4 + 8;
  return ScalarSize(type);
}

bool KnownValueType(uint32_t type) {
  return type <= static_cast<uint32_t>(GgufValueType::kFloat64);
}

}  // namespace

std::string_view GgufValueTypeName(GgufValueType type) {
  static constexpr std::string_view kNames[] = {"uint8",  "int8",    "uint16", "int16",  "uint32",
                                                "int32",  "float32", "bool",   "string", "array",
                                                "uint64", "int64",   "float64"};
  const auto index = static_cast<uint32_t>(type);
  return index < std::size(kNames) ? kNames[index] : "unknown";
}

std::optional<int64_t> GgufValue::AsInt() const {
  switch (type) {
    case GgufValueType::kUint8:
    case GgufValueType::kUint16:
    case GgufValueType::kUint32:
    case GgufValueType::kUint64:
    case GgufValueType::kBool:
      if (unsigned_value > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        return std::nullopt;
      return static_cast<int64_t>(unsigned_value);
    case GgufValueType::kInt8:
    case GgufValueType::kInt16:
    case GgufValueType::kInt32:
    case GgufValueType::kInt64:
      return signed_value;
    default:
      return std::nullopt;
  }
}

std::optional<double> GgufValue::AsFloat() const {
  if (type == GgufValueType::kFloat32 || type == GgufValueType::kFloat64) return float_value;
  if (type == GgufValueType::kBool) return std::nullopt;
  if (auto integer = AsInt()) return static_cast<double>(*integer);
  return std::nullopt;
}

std::optional<std::string_view> GgufValue::AsString() const {
  if (type != GgufValueType::kString) return std::nullopt;
  return string_value;
}

// A cursor over the file's bytes; every read checks what is left first.
class GgufParser {
 public:
  GgufParser(const uint8_t* bytes, size_t size, GgufFile* file)
      : bytes_(bytes), size_(size), file_(file) {}

  Status Run() {
    SY_RETURN_IF_ERROR(ReadHeader());
    for (uint64_t i = 0; i < metadata_count_; ++i)
      SY_RETURN_IF_ERROR(ReadMetadataPair(i));
    SY_RETURN_IF_ERROR(ReadAlignment());
    for (uint64_t i = 0; i < tensor_count_; ++i)
      SY_RETURN_IF_ERROR(ReadTensorInfo(i));
    return PlaceData();
  }

 private:
  template <typename... Args>
  Status Error(uint64_t at, fmt::format_string<Args...> format, Args&&... args) const {
    return Status::Errorf("{}: {} (at byte {})", file_->source_,
                          fmt::format(format, std::forward<Args>(args)...), at);
  }

  uint64_t Left() const { return size_ - position_; }

  Status Need(uint64_t bytes, std::string_view what) const {
    if (bytes > Left())
      return Error(position_, "truncated: {} needs {} bytes, {} left", what, bytes, Left());
    return Status::Ok();
  }

  template <typename T>
  Status Read(T* value, std::string_view what) {
    SY_RETURN_IF_ERROR(Need(sizeof(T), what));
    std::memcpy(value, bytes_ + position_, sizeof(T));
    position_ += sizeof(T);
    return Status::Ok();
  }

  Status ReadString(std::string_view* value, std::string_view what) {
    const uint64_t at = position_;
    uint64_t length = 0;
    SY_RETURN_IF_ERROR(Read(&length, what));
    if (length > Left())
      return Error(at, "truncated: {} claims {} bytes, {} left", what, length, Left());
    *value = std::string_view(reinterpret_cast<const char*>(bytes_ + position_), length);
    position_ += length;
    return Status::Ok();
  }

  Status ReadHeader() {
    char magic[4];
    SY_RETURN_IF_ERROR(Need(4, "the magic"));
    std::memcpy(magic, bytes_, 4);
    if (std::memcmp(magic, "GGUF", 4) != 0) return Error(0, "not a GGUF file (bad magic)");
    position_ = 4;
    uint32_t version = 0;
    SY_RETURN_IF_ERROR(Read(&version, "the version"));
    if (version == 0x02000000u || version == 0x03000000u)
      return Error(4, "a big-endian GGUF file; only little-endian files are supported");
    if (version != 2 && version != 3)
      return Error(4, "GGUF version {} is not supported (2 and 3 are)", version);
    file_->version_ = version;
    SY_RETURN_IF_ERROR(Read(&tensor_count_, "the tensor count"));
    SY_RETURN_IF_ERROR(Read(&metadata_count_, "the metadata count"));
    // Counts that the rest of the file cannot hold are refused before anything is reserved.
    if (metadata_count_ > Left() / kMinMetadataBytes)
      return Error(16, "metadata count {} cannot fit in the {} bytes left", metadata_count_,
                   Left());
    if (tensor_count_ > Left() / kMinTensorInfoBytes)
      return Error(8, "tensor count {} cannot fit in the {} bytes left", tensor_count_, Left());
    file_->metadata_.reserve(metadata_count_);
    file_->tensors_.reserve(tensor_count_);
    return Status::Ok();
  }

  Status ReadValue(GgufValueType type, std::string_view key, int depth, GgufValue* value) {
    value->type = type;
    const uint64_t at = position_;
    switch (type) {
      case GgufValueType::kUint8:
        return ReadUnsigned<uint8_t>(key, value);
      case GgufValueType::kUint16:
        return ReadUnsigned<uint16_t>(key, value);
      case GgufValueType::kUint32:
        return ReadUnsigned<uint32_t>(key, value);
      case GgufValueType::kUint64:
        return ReadUnsigned<uint64_t>(key, value);
      case GgufValueType::kInt8:
        return ReadSigned<int8_t>(key, value);
      case GgufValueType::kInt16:
        return ReadSigned<int16_t>(key, value);
      case GgufValueType::kInt32:
        return ReadSigned<int32_t>(key, value);
      case GgufValueType::kInt64:
        return ReadSigned<int64_t>(key, value);
      case GgufValueType::kBool: {
        SY_RETURN_IF_ERROR(ReadUnsigned<uint8_t>(key, value));
        if (value->unsigned_value > 1)
          return Error(at, "{}: bool value {}, not 0 or 1", key, value->unsigned_value);
        return Status::Ok();
      }
      case GgufValueType::kFloat32: {
        float number = 0;
        SY_RETURN_IF_ERROR(Read(&number, key));
        value->float_value = number;
        return Status::Ok();
      }
      case GgufValueType::kFloat64:
        return Read(&value->float_value, key);
      case GgufValueType::kString:
        return ReadString(&value->string_value, key);
      case GgufValueType::kArray:
        return ReadArray(key, depth, value);
    }
    return Error(at, "{}: unknown value type {}", key, static_cast<uint32_t>(type));
  }

  template <typename T>
  Status ReadUnsigned(std::string_view key, GgufValue* value) {
    T number = 0;
    SY_RETURN_IF_ERROR(Read(&number, key));
    value->unsigned_value = number;
    return Status::Ok();
  }
  template <typename T>
  Status ReadSigned(std::string_view key, GgufValue* value) {
    T number = 0;
    SY_RETURN_IF_ERROR(Read(&number, key));
    value->signed_value = number;
    return Status::Ok();
  }

  Status ReadArray(std::string_view key, int depth, GgufValue* value) {
    const uint64_t at = position_;
    if (depth >= kMaxArrayNesting)
      return Error(at, "{}: arrays nested deeper than {}", key, kMaxArrayNesting);
    uint32_t element_type = 0;
    uint64_t count = 0;
    SY_RETURN_IF_ERROR(Read(&element_type, key));
    SY_RETURN_IF_ERROR(Read(&count, key));
    if (!KnownValueType(element_type))
      return Error(at, "{}: unknown array element type {}", key, element_type);
    value->element_type = static_cast<GgufValueType>(element_type);
    if (count > Left() / MinElementSize(value->element_type))
      return Error(at, "{}: array of {} {} values cannot fit in the {} bytes left", key, count,
                   GgufValueTypeName(value->element_type), Left());
    value->elements.resize(count);
    for (auto& element : value->elements)
      SY_RETURN_IF_ERROR(ReadValue(value->element_type, key, depth + 1, &element));
    return Status::Ok();
  }

  Status ReadMetadataPair(uint64_t index) {
    const uint64_t at = position_;
    std::string_view key;
    SY_RETURN_IF_ERROR(ReadString(&key, fmt::format("metadata key {}", index)));
    if (key.empty()) return Error(at, "metadata key {} is empty", index);
    const std::string what = fmt::format("metadata '{}'", key);
    uint32_t type = 0;
    SY_RETURN_IF_ERROR(Read(&type, what));
    if (!KnownValueType(type)) return Error(at, "{}: unknown value type {}", what, type);
    GgufValue value;
    SY_RETURN_IF_ERROR(ReadValue(static_cast<GgufValueType>(type), what, 0, &value));
    if (!file_->metadata_index_.emplace(key, file_->metadata_.size()).second)
      return Error(at, "metadata key '{}' appears twice", key);
    file_->metadata_.emplace_back(key, std::move(value));
    return Status::Ok();
  }

  Status ReadAlignment() {
    const GgufValue* value = file_->Find("general.alignment");
    if (value == nullptr) return Status::Ok();
    if (value->type != GgufValueType::kUint32)
      return Error(position_, "general.alignment is a {}, not a uint32",
                   GgufValueTypeName(value->type));
    const uint64_t alignment = value->unsigned_value;
    if (alignment == 0 || (alignment & (alignment - 1)) != 0 || alignment > kMaxAlignment)
      return Error(position_, "general.alignment {} is not a power of two up to {}", alignment,
                   kMaxAlignment);
    file_->alignment_ = alignment;
    return Status::Ok();
  }

  Status ReadTensorInfo(uint64_t index) {
    GgufTensorInfo tensor;
    tensor.info_offset = position_;
    const uint64_t at = position_;
    SY_RETURN_IF_ERROR(ReadString(&tensor.name, fmt::format("the name of tensor {}", index)));
    if (tensor.name.empty()) return Error(at, "tensor {} has an empty name", index);
    const std::string what = fmt::format("tensor '{}'", tensor.name);
    uint32_t dims = 0;
    SY_RETURN_IF_ERROR(Read(&dims, what));
    if (dims == 0 || dims > kMaxDims)
      return Error(at, "{}: {} dimensions (1 to {} allowed)", what, dims, kMaxDims);
    int64_t elements = 1;
    for (uint32_t d = 0; d < dims; ++d) {
      uint64_t extent = 0;
      SY_RETURN_IF_ERROR(Read(&extent, what));
      if (extent == 0 || extent > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        return Error(at, "{}: dimension {} is {}", what, d, extent);
      tensor.dims.push_back(static_cast<int64_t>(extent));
      if (__builtin_mul_overflow(elements, tensor.dims.back(), &elements))
        return Error(at, "{}: element count overflows 64 bits", what);
    }
    tensor.elements = elements;
    uint32_t type_id = 0;
    SY_RETURN_IF_ERROR(Read(&type_id, what));
    const auto traits = GgmlTypeInfo(type_id);
    if (!traits || GgmlTypeIsInternal(traits->type))
      return Error(at, "{}: unknown GGML type id {}", what, type_id);
    tensor.type = traits->type;
    if (tensor.dims[0] % traits->block_size != 0)
      return Error(at, "{}: row length {} is not a multiple of {}'s block size {}", what,
                   tensor.dims[0], traits->name, traits->block_size);
    const uint64_t blocks = static_cast<uint64_t>(elements / traits->block_size);
    if (__builtin_mul_overflow(blocks, static_cast<uint64_t>(traits->block_bytes),
                               &tensor.byte_size))
      return Error(at, "{}: byte size overflows 64 bits", what);
    SY_RETURN_IF_ERROR(Read(&tensor.offset, what));
    if (tensor.offset % file_->alignment_ != 0)
      return Error(at, "{}: data offset {} is not a multiple of the alignment {}", what,
                   tensor.offset, file_->alignment_);
    if (!file_->tensor_index_.emplace(tensor.name, file_->tensors_.size()).second)
      return Error(at, "tensor '{}' appears twice", tensor.name);
    file_->tensors_.push_back(std::move(tensor));
    return Status::Ok();
  }

  // The data section starts at the next multiple of the alignment; every tensor must lie inside
  // the file, and no two may share bytes.
  Status PlaceData() {
    const uint64_t alignment = file_->alignment_;
    const uint64_t data_offset = (position_ + alignment - 1) / alignment * alignment;
    file_->data_offset_ = data_offset;
    if (file_->tensors_.empty()) return Status::Ok();
    if (data_offset > size_)
      return Error(position_, "truncated: the data section would start at byte {}, past the end",
                   data_offset);
    const uint64_t data_size = size_ - data_offset;
    std::vector<const GgufTensorInfo*> by_offset;
    by_offset.reserve(file_->tensors_.size());
    for (const auto& tensor : file_->tensors_) {
      if (tensor.offset > data_size || tensor.byte_size > data_size - tensor.offset)
        return Error(tensor.info_offset,
                     "tensor '{}': bytes [{}, {}) of the data section run past its end ({} bytes)",
                     tensor.name, tensor.offset, tensor.offset + tensor.byte_size, data_size);
      by_offset.push_back(&tensor);
    }
    std::sort(by_offset.begin(), by_offset.end(),
              [](const auto* a, const auto* b) { return a->offset < b->offset; });
    for (size_t i = 1; i < by_offset.size(); ++i) {
      const auto* before = by_offset[i - 1];
      const auto* after = by_offset[i];
      if (before->offset + before->byte_size > after->offset)
        return Error(after->info_offset, "tensors '{}' and '{}' overlap in the data section",
                     before->name, after->name);
    }
    return Status::Ok();
  }

  const uint8_t* bytes_;
  size_t size_;
  GgufFile* file_;
  uint64_t position_ = 0;
  uint64_t tensor_count_ = 0;
  uint64_t metadata_count_ = 0;
};

Result<GgufFile> GgufFile::Parse(const uint8_t* bytes, size_t size, std::string source) {
  GgufFile file;
  file.bytes_ = bytes;
  file.size_ = size;
  file.source_ = std::move(source);
  GgufParser parser(bytes, size, &file);
  SY_RETURN_IF_ERROR(parser.Run());
  return file;
}

Result<GgufFile> GgufFile::Open(const std::string& path) {
  SY_ASSIGN_OR_RETURN(auto mapping, MappedFile::Open(path));
  SY_ASSIGN_OR_RETURN(GgufFile file, Parse(mapping->data(), mapping->size(), path));
  file.file_ = std::move(mapping);
  return file;
}

bool IsGgufFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  char magic[4] = {};
  return in.read(magic, 4) && std::string_view(magic, 4) == "GGUF";
}

const GgufValue* GgufFile::Find(std::string_view key) const {
  auto it = metadata_index_.find(key);
  return it == metadata_index_.end() ? nullptr : &metadata_[it->second].second;
}

const GgufTensorInfo* GgufFile::FindTensor(std::string_view name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

}  // namespace sy
