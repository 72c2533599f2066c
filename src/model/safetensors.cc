#include "model/safetensors.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

namespace sy {
namespace {

using nlohmann::json;

// Headers larger than this are rejected before parsing (the format's own reference limit).
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

}  // namespace

int64_t SafetensorsEntry::NumElements() const {
  int64_t count = 1;
  for (int64_t dim : shape)
    count *= dim;
  return count;
}

Result<std::vector<SafetensorsEntry>> ParseSafetensorsHeader(const uint8_t* bytes, size_t size,
                                                             const std::string& source) {
  if (size < 8) return Status::Errorf("{}: truncated: {} bytes, no header length", source, size);
  uint64_t header_size = 0;
  for (int i = 7; i >= 0; --i)
    header_size = (header_size << 8) | bytes[i];
  if (header_size > kMaxHeaderBytes)
    return Status::Errorf("{}: header length {} is implausibly large", source, header_size);
  if (header_size > size - 8)
    return Status::Errorf("{}: truncated: header needs {} bytes, file has {}", source, header_size,
                          size - 8);
  const char* text = reinterpret_cast<const char*>(bytes + 8);
  json header = json::parse(text, text + header_size, nullptr, /*allow_exceptions=*/false);
  if (header.is_discarded()) return Status::Errorf("{}: header is not valid JSON", source);
  if (!header.is_object()) return Status::Errorf("{}: header must be a JSON object", source);

  const uint64_t data_size = size - 8 - header_size;
  const uint64_t data_start = 8 + header_size;
  std::vector<SafetensorsEntry> entries;
  for (const auto& item : header.items()) {
    const std::string& name = item.key();
    const json& value = item.value();
    if (name == "__metadata__") continue;
    auto fail = [&](const std::string& what) {
      return Status::Errorf("{}: tensor '{}': {}", source, name, what);
    };
    if (!value.is_object()) return fail("header entry must be an object");
    auto dtype_it = value.find("dtype");
    auto shape_it = value.find("shape");
    auto offsets_it = value.find("data_offsets");
    if (dtype_it == value.end() || !dtype_it->is_string()) return fail("missing 'dtype'");
    if (shape_it == value.end() || !shape_it->is_array()) return fail("missing 'shape'");
    if (offsets_it == value.end() || !offsets_it->is_array() || offsets_it->size() != 2)
      return fail("'data_offsets' must be [begin, end]");
    SafetensorsEntry entry;
    entry.name = name;
    auto dtype = ParseDType(dtype_it->get<std::string>());
    if (!dtype) return fail("unknown dtype '" + dtype_it->get<std::string>() + "'");
    entry.dtype = *dtype;
    // Element count with overflow checks: a hostile shape must not wrap around.
    uint64_t elements = 1;
    for (const auto& dim : *shape_it) {
      if (!dim.is_number_unsigned()) return fail("shape entries must be non-negative integers");
      uint64_t d = dim.get<uint64_t>();
      if (d > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        return fail("shape too large");
      if (d != 0 && elements > std::numeric_limits<uint64_t>::max() / d)
        return fail("shape overflows");
      elements *= d;
      entry.shape.push_back(static_cast<int64_t>(d));
    }
    const auto& begin_json = (*offsets_it)[0];
    const auto& end_json = (*offsets_it)[1];
    if (!begin_json.is_number_unsigned() || !end_json.is_number_unsigned())
      return fail("data_offsets must be non-negative integers");
    uint64_t begin = begin_json.get<uint64_t>(), end = end_json.get<uint64_t>();
    if (begin > end) return fail(fmt::format("data_offsets [{}, {}] are reversed", begin, end));
    if (end > data_size)
      return fail(
          fmt::format("data_offsets [{}, {}] run past the data section of {} bytes "
                      "(file truncated?)",
                      begin, end, data_size));
    uint64_t element_size = DTypeSize(entry.dtype);
    if (elements > std::numeric_limits<uint64_t>::max() / element_size ||
        elements * element_size != end - begin) {
      return fail(fmt::format("holds {} bytes but shape and dtype {} need {}", end - begin,
                              DTypeName(entry.dtype), elements * element_size));
    }
    entry.data_begin = data_start + begin;
    entry.data_end = data_start + end;
    entries.push_back(std::move(entry));
  }
  std::sort(entries.begin(), entries.end(), [](const auto& a, const auto& b) {
    return a.data_begin != b.data_begin ? a.data_begin < b.data_begin : a.data_end < b.data_end;
  });
  for (size_t i = 1; i < entries.size(); ++i) {
    const auto& previous = entries[i - 1];
    const auto& current = entries[i];
    if (current.data_begin < previous.data_end) {
      return Status::Errorf("{}: tensors '{}' and '{}' overlap in the data section", source,
                            previous.name, current.name);
    }
  }
  return entries;
}

Status Checkpoint::AddShard(const std::string& path) {
  SY_ASSIGN_OR_RETURN(auto file, MappedFile::Open(path));
  auto shard = std::make_unique<Shard>();
  SY_ASSIGN_OR_RETURN(shard->entries, ParseSafetensorsHeader(file->data(), file->size(), path));
  shard->file = std::move(file);
  for (const auto& entry : shard->entries) {
    if (tensors_.count(entry.name))
      return Status::Errorf("{}: tensor '{}' appears in more than one shard", path, entry.name);
    tensors_[entry.name] =
        CheckpointTensor{&entry, shard->file->data() + entry.data_begin, &shard->file->path()};
  }
  shards_.push_back(std::move(shard));
  return Status::Ok();
}

Status Checkpoint::UseLanguageModel(const std::string& prefix,
                                    const std::vector<std::string>& set_aside) {
  std::map<std::string, CheckpointTensor> renamed;
  for (const auto& entry : tensors_) {
    const std::string& name = entry.first;
    const CheckpointTensor& tensor = entry.second;
    if (std::any_of(set_aside.begin(), set_aside.end(),
                    [&](const std::string& p) { return name.starts_with(p); })) {
      ++set_aside_count_;
      continue;
    }
    const std::string key = name.starts_with(prefix) ? name.substr(prefix.size()) : name;
    if (!renamed.emplace(key, tensor).second)
      return Status::Errorf("{}: tensor '{}' is there both with and without the prefix '{}'",
                            directory_, key, prefix);
  }
  tensors_ = std::move(renamed);
  return Status::Ok();
}

Result<Checkpoint> Checkpoint::Open(const std::string& directory) {
  namespace fs = std::filesystem;
  Checkpoint checkpoint;
  checkpoint.directory_ = directory;
  fs::path dir(directory);
  fs::path index_path = dir / "model.safetensors.index.json";
  fs::path single_path = dir / "model.safetensors";
  std::error_code error;
  if (fs::exists(index_path, error)) {
    std::ifstream in(index_path);
    std::stringstream text;
    text << in.rdbuf();
    json index = json::parse(text.str(), nullptr, false);
    if (index.is_discarded() || !index.is_object())
      return Status::Errorf("{}: not valid JSON", index_path.string());
    auto map = index.find("weight_map");
    if (map == index.end() || !map->is_object())
      return Status::Errorf("{}: missing 'weight_map' object", index_path.string());
    std::map<std::string, std::string> expected;  // tensor -> shard file name
    std::set<std::string> shard_names;
    for (const auto& [name, file] : map->items()) {
      if (!file.is_string())
        return Status::Errorf("{}: weight_map entry '{}' must name a file", index_path.string(),
                              name);
      std::string shard = file.get<std::string>();
      if (shard.find('/') != std::string::npos || shard == ".." || shard.empty())
        return Status::Errorf("{}: weight_map entry '{}' names an invalid file '{}'",
                              index_path.string(), name, shard);
      expected[name] = shard;
      shard_names.insert(shard);
    }
    for (const auto& shard : shard_names)
      SY_RETURN_IF_ERROR(checkpoint.AddShard((dir / shard).string()));
    for (const auto& [name, shard] : expected) {
      auto found = checkpoint.tensors_.find(name);
      if (found == checkpoint.tensors_.end() ||
          fs::path(*found->second.file).filename().string() != shard) {
        return Status::Errorf("{}: tensor '{}' is listed in shard '{}' but not found there",
                              index_path.string(), name, shard);
      }
    }
  } else if (fs::exists(single_path, error)) {
    SY_RETURN_IF_ERROR(checkpoint.AddShard(single_path.string()));
  } else {
    return Status::Errorf("{}: no model.safetensors or model.safetensors.index.json", directory);
  }
  return checkpoint;
}

Checkpoint Checkpoint::FromMemory(const std::string& name, std::vector<TensorToWrite> tensors,
                                  std::vector<std::string> sources) {
  Checkpoint checkpoint;
  checkpoint.directory_ = name;
  auto shard = std::make_unique<Shard>();
  shard->entries.reserve(tensors.size());
  shard->owned.reserve(tensors.size());
  shard->sources = std::move(sources);
  shard->sources.resize(tensors.size(), name);
  for (auto& tensor : tensors) {
    SafetensorsEntry entry;
    entry.name = tensor.name;
    entry.dtype = tensor.dtype;
    entry.shape = tensor.shape;
    entry.ggml_type = tensor.ggml_type;
    entry.data_end = tensor.external ? tensor.external_bytes : tensor.bytes.size();
    shard->entries.push_back(std::move(entry));
    shard->owned.push_back(std::move(tensor.bytes));
    if (tensor.external_owner) shard->keep_alive.push_back(std::move(tensor.external_owner));
  }
  for (size_t i = 0; i < shard->entries.size(); ++i)
    checkpoint.tensors_[shard->entries[i].name] = CheckpointTensor{
        &shard->entries[i], tensors[i].external ? tensors[i].external : shard->owned[i].data(),
        &shard->sources[i]};
  checkpoint.shards_.push_back(std::move(shard));
  return checkpoint;
}

const CheckpointTensor* Checkpoint::Find(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

}  // namespace sy
