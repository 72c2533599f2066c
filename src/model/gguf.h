// The GGUF file format (llama.cpp's single-file checkpoints), versions 2 and 3, little-endian:
//
//   magic "GGUF", u32 version, u64 tensor_count, u64 metadata_kv_count,
//   metadata: { string key, u32 value_type, value }...,
//   tensor infos: { string name, u32 n_dims, u64 ne[n_dims], u32 ggml_type, u64 offset }...,
//   padding to general.alignment (default 32), then the data section; each tensor's bytes start
//   at data_offset + offset. Strings are a u64 length and bytes (no terminator).
//
// The reader trusts nothing: every length is checked against the bytes left before it is used
// (so absurd counts fail before any allocation), and every tensor's type, shape, size, alignment
// and extent are validated, with overlaps and duplicate names refused. Errors name the file, the
// key or tensor, and the byte offset. The file is memory-mapped; values and names are views into
// the mapping, which the GgufFile keeps alive.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/mapped_file.h"
#include "base/status.h"
#include "tensor/ggml_quants.h"

namespace sy {

enum class GgufValueType : uint32_t {
  kUint8 = 0,
  kInt8 = 1,
  kUint16 = 2,
  kInt16 = 3,
  kUint32 = 4,
  kInt32 = 5,
  kFloat32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kUint64 = 10,
  kInt64 = 11,
  kFloat64 = 12,
};
std::string_view GgufValueTypeName(GgufValueType type);

// One metadata value. Scalars are decoded into the field their type calls for; strings are views
// into the file; arrays hold their elements (arrays of arrays nest).
struct GgufValue {
  GgufValueType type = GgufValueType::kUint8;
  uint64_t unsigned_value = 0;  // kUint*, kBool
  int64_t signed_value = 0;     // kInt*
  double float_value = 0;       // kFloat32, kFloat64
  std::string_view string_value;
  GgufValueType element_type = GgufValueType::kUint8;  // kArray
  std::vector<GgufValue> elements;

  // Integer types (and bool) whose value fits; nullopt otherwise.
  std::optional<int64_t> AsInt() const;
  // Float types, or an integer type converted.
  std::optional<double> AsFloat() const;
  std::optional<std::string_view> AsString() const;
};

struct GgufTensorInfo {
  std::string_view name;
  std::vector<int64_t> dims;  // GGML order: dims[0] is the row length (innermost)
  GgmlType type = GgmlType::kF32;
  uint64_t offset = 0;       // within the data section
  uint64_t byte_size = 0;    // whole blocks of `type`
  int64_t elements = 0;      // the product of dims
  uint64_t info_offset = 0;  // where its info record starts in the file, for messages
};

// Whether `path` is a GGUF file (by its magic), so a model path can be routed either way.
bool IsGgufFile(const std::string& path);

class GgufFile {
 public:
  static constexpr uint64_t kDefaultAlignment = 32;

  // Maps and parses `path`.
  static Result<GgufFile> Open(const std::string& path);
  // Parses bytes the caller keeps alive for the GgufFile's lifetime; `source` names them in
  // messages.
  static Result<GgufFile> Parse(const uint8_t* bytes, size_t size, std::string source);

  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  uint64_t data_offset() const { return data_offset_; }
  const std::string& source() const { return source_; }
  // The mapping the tensors' bytes live in; null when the caller owns the bytes (Parse).
  const std::shared_ptr<MappedFile>& mapping() const { return file_; }

  // Metadata in file order.
  const std::vector<std::pair<std::string_view, GgufValue>>& metadata() const { return metadata_; }
  // Null when the key is absent.
  const GgufValue* Find(std::string_view key) const;

  // Tensors in file order.
  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
  // Null when the tensor is absent.
  const GgufTensorInfo* FindTensor(std::string_view name) const;
  // The tensor's bytes (byte_size of them, inside the file).
  const uint8_t* TensorData(const GgufTensorInfo& tensor) const {
    return bytes_ + data_offset_ + tensor.offset;
  }

 private:
  std::shared_ptr<MappedFile> file_;  // null when the caller owns the bytes
  const uint8_t* bytes_ = nullptr;
  size_t size_ = 0;
  std::string source_;
  uint32_t version_ = 0;
  uint64_t alignment_ = kDefaultAlignment;
  uint64_t data_offset_ = 0;
  std::vector<std::pair<std::string_view, GgufValue>> metadata_;
  std::map<std::string_view, size_t> metadata_index_;
  std::vector<GgufTensorInfo> tensors_;
  std::map<std::string_view, size_t> tensor_index_;

  friend class GgufParser;
};

}  // namespace sy
