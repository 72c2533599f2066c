#include "model/gguf_writer.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>

#include <fmt/format.h>

#include "base/partial_file.h"

namespace sy {
namespace {

// Little-endian bytes of the header, metadata and tensor infos (x86 and ARM are little-endian).
class Bytes {
 public:
  template <typename T>
  void Put(T value) {
    const size_t at = out_.size();
    out_.resize(at + sizeof(T));
    std::memcpy(out_.data() + at, &value, sizeof(T));
  }
  void PutString(const std::string& s) {
    Put<uint64_t>(s.size());
    out_.insert(out_.end(), s.begin(), s.end());
  }
  std::vector<uint8_t>& data() { return out_; }

 private:
  std::vector<uint8_t> out_;
};

uint64_t Align(uint64_t n) {
  return (n + GgufWriter::kAlignment - 1) / GgufWriter::kAlignment * GgufWriter::kAlignment;
}

}  // namespace

void GgufWriter::AddString(std::string key, std::string value) {
  Value v{GgufValueType::kString};
  v.text = std::move(value);
  metadata_.emplace_back(std::move(key), std::move(v));
}
void GgufWriter::AddUint32(std::string key, uint32_t value) {
  metadata_.emplace_back(std::move(key), Value{GgufValueType::kUint32, value});
}
void GgufWriter::AddFloat32(std::string key, float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, 4);
  metadata_.emplace_back(std::move(key), Value{GgufValueType::kFloat32, bits});
}
void GgufWriter::AddBool(std::string key, bool value) {
  metadata_.emplace_back(std::move(key), Value{GgufValueType::kBool, value ? 1u : 0u});
}
void GgufWriter::AddStrings(std::string key, std::vector<std::string> values) {
  Value v{GgufValueType::kArray};
  v.strings = std::move(values);
  metadata_.emplace_back(std::move(key), std::move(v));
}
void GgufWriter::AddInt32s(std::string key, std::vector<int32_t> values) {
  Value v{GgufValueType::kArray};
  v.ints = std::move(values);
  v.element = GgufValueType::kInt32;
  metadata_.emplace_back(std::move(key), std::move(v));
}

Status GgufWriter::AddTensor(std::string name, std::vector<int64_t> dims, GgmlType type,
                             Fill fill) {
  const auto traits = GgmlTypeInfo(type);
  if (!traits || GgmlTypeIsInternal(type))
    return Status::Errorf("{}: not a GGUF tensor type", name);
  if (dims.empty() || dims.size() > 4) return Status::Errorf("{}: {} dims", name, dims.size());
  int64_t elements = 1;
  for (int64_t d : dims) {
    if (d <= 0) return Status::Errorf("{}: a dimension of {}", name, d);
    elements *= d;
  }
  if (dims[0] % traits->block_size != 0)
    return Status::Errorf("{}: rows of {} are not whole {} blocks of {}", name, dims[0],
                          traits->name, traits->block_size);
  Tensor t{std::move(name), std::move(dims), type};
  t.offset = data_bytes_;
  t.bytes = static_cast<uint64_t>(elements / traits->block_size * traits->block_bytes);
  t.fill = std::move(fill);
  data_bytes_ = Align(t.offset + t.bytes);
  tensors_.push_back(std::move(t));
  return Status::Ok();
}

Status GgufWriter::Write(const std::string& path,
                         const std::function<void(size_t, size_t, uint64_t)>& on_tensor) const {
  Bytes head;
  head.Put<uint32_t>(0x46554747);  // "GGUF"
  head.Put<uint32_t>(3);
  head.Put<uint64_t>(tensors_.size());
  head.Put<uint64_t>(metadata_.size());
  for (const auto& [key, v] : metadata_) {
    head.PutString(key);
    head.Put<uint32_t>(static_cast<uint32_t>(v.type));
    switch (v.type) {
      case GgufValueType::kString:
        head.PutString(v.text);
        break;
      case GgufValueType::kBool:
        head.Put<uint8_t>(static_cast<uint8_t>(v.bits));
        break;
      case GgufValueType::kArray:
        head.Put<uint32_t>(static_cast<uint32_t>(v.element));
        if (v.element == GgufValueType::kInt32) {
          head.Put<uint64_t>(v.ints.size());
          for (int32_t i : v.ints)
            head.Put<int32_t>(i);
        } else {
          head.Put<uint64_t>(v.strings.size());
          for (const auto& s : v.strings)
            head.PutString(s);
        }
        break;
      default:  // u32, f32: four bytes
        head.Put<uint32_t>(static_cast<uint32_t>(v.bits));
    }
  }
  for (const Tensor& t : tensors_) {
    head.PutString(t.name);
    head.Put<uint32_t>(static_cast<uint32_t>(t.dims.size()));
    for (int64_t d : t.dims)
      head.Put<uint64_t>(static_cast<uint64_t>(d));
    head.Put<uint32_t>(static_cast<uint32_t>(t.type));
    head.Put<uint64_t>(t.offset);
  }
  head.data().resize(Align(head.data().size()), 0);

  SY_ASSIGN_OR_RETURN(PartialFile file, PartialFile::Create(path));
  SY_RETURN_IF_ERROR(file.Put(head.data().data(), head.data().size()));
  std::vector<uint8_t> buffer;
  uint64_t written = 0;
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const Tensor& t = tensors_[i];
    buffer.assign(static_cast<size_t>(Align(t.bytes)), 0);
    if (Status s = t.fill(buffer.data()); !s.ok()) return s.WithContext(t.name);
    SY_RETURN_IF_ERROR(file.Put(buffer.data(), buffer.size()));
    written += t.bytes;
    if (on_tensor) on_tensor(i + 1, tensors_.size(), written);
  }
  return file.Commit();
}

}  // namespace sy
