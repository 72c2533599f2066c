#include "model/safetensors_writer.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "base/partial_file.h"
#include "model/safetensors.h"

namespace sy {

using nlohmann::json;

Status SafetensorsWriter::AddTensor(std::string name, DType dtype, std::vector<int64_t> shape,
                                    Fill fill) {
  if (dtype == DType::kGgml)
    return Status::Errorf("{}: GGML blocks have no safetensors dtype", name);
  if (!names_.insert(name).second) return Status::Errorf("{}: added twice", name);
  uint64_t elements = 1;
  for (int64_t d : shape) {
    if (d < 0) return Status::Errorf("{}: a dimension of {}", name, d);
    elements *= static_cast<uint64_t>(d);
  }
  Tensor t{std::move(name), dtype, std::move(shape), elements * DTypeSize(dtype), std::move(fill)};
  data_bytes_ += t.bytes;
  tensors_.push_back(std::move(t));
  return Status::Ok();
}

Status SafetensorsWriter::WriteRange(const std::string& path, size_t begin, size_t end,
                                     const Progress& progress, size_t& done,
                                     uint64_t& written) const {
  json header = json::object();
  header["__metadata__"] = {{"format", "pt"}};  // what transformers' save_pretrained writes
  uint64_t offset = 0;
  for (size_t i = begin; i < end; ++i) {
    const Tensor& t = tensors_[i];
    header[t.name] = {{"dtype", std::string(DTypeName(t.dtype))},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + t.bytes}}};
    offset += t.bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // keeps the data 8-byte aligned, as the spec asks
  SY_ASSIGN_OR_RETURN(PartialFile file, PartialFile::Create(path));
  uint8_t length[8];
  for (int i = 0; i < 8; ++i)
    length[i] = static_cast<uint8_t>(static_cast<uint64_t>(text.size()) >> (8 * i));
  SY_RETURN_IF_ERROR(file.Put(length, 8));
  SY_RETURN_IF_ERROR(file.Put(text.data(), text.size()));
  std::vector<uint8_t> buffer;
  for (size_t i = begin; i < end; ++i) {
    const Tensor& t = tensors_[i];
    buffer.assign(static_cast<size_t>(t.bytes), 0);
    if (Status s = t.fill(buffer.data()); !s.ok()) return s.WithContext(t.name);
    SY_RETURN_IF_ERROR(file.Put(buffer.data(), buffer.size()));
    written += t.bytes;
    if (progress) progress(++done, tensors_.size(), written);
  }
  return file.Commit();
}

Status SafetensorsWriter::WriteFile(const std::string& path, const Progress& progress) const {
  size_t done = 0;
  uint64_t written = 0;
  return WriteRange(path, 0, tensors_.size(), progress, done, written);
}

Status SafetensorsWriter::WriteDirectory(const std::string& directory, uint64_t max_shard_bytes,
                                         const Progress& progress) const {
  // Shards in the order tensors were added, a new one when the next tensor would overflow.
  std::vector<size_t> starts = {0};
  uint64_t in_shard = 0;
  for (size_t i = 0; i < tensors_.size(); ++i) {
    if (in_shard > 0 && in_shard + tensors_[i].bytes > max_shard_bytes) {
      starts.push_back(i);
      in_shard = 0;
    }
    in_shard += tensors_[i].bytes;
  }
  starts.push_back(tensors_.size());
  const size_t shards = starts.size() - 1;
  size_t done = 0;
  uint64_t written = 0;
  if (shards == 1)
    return WriteRange(directory + "/model.safetensors", 0, tensors_.size(), progress, done,
                      written);
  json index = {{"metadata", {{"total_size", data_bytes_}}}, {"weight_map", json::object()}};
  for (size_t s = 0; s < shards; ++s) {
    const std::string file = fmt::format("model-{:05d}-of-{:05d}.safetensors", s + 1, shards);
    for (size_t i = starts[s]; i < starts[s + 1]; ++i)
      index["weight_map"][tensors_[i].name] = file;
    SY_RETURN_IF_ERROR(
        WriteRange(directory + "/" + file, starts[s], starts[s + 1], progress, done, written));
  }
  const std::string path = directory + "/model.safetensors.index.json";
  std::ofstream out(path, std::ios::trunc);
  out << index.dump(2) << "\n";
  if (!out) return Status::Errorf("{}: write failed", path);
  return Status::Ok();
}

// Declared in model/safetensors.h (beside TensorToWrite); defined here, with the writer, so that
// the reader builds alone (the fuzzers link it without the writer).
Status WriteSafetensors(const std::string& path, const std::vector<TensorToWrite>& tensors) {
  SafetensorsWriter writer;
  for (const auto& tensor : tensors) {
    const std::vector<uint8_t>* bytes = &tensor.bytes;
    int64_t elements = 1;
    for (int64_t d : tensor.shape)
      elements *= d;
    if (bytes->size() != static_cast<size_t>(elements) * DTypeSize(tensor.dtype))
      return Status::Errorf("{}: {} bytes for {} elements of {}", tensor.name, bytes->size(),
                            elements, DTypeName(tensor.dtype));
    SY_RETURN_IF_ERROR(
        writer.AddTensor(tensor.name, tensor.dtype, tensor.shape, [bytes](uint8_t* out) {
          std::copy(bytes->begin(), bytes->end(), out);
          return Status::Ok();
        }));
  }
  return writer.WriteFile(path);
}

}  // namespace sy
