// A read-only memory-mapped file. Checkpoint tensors are views into these mappings, so loading a
// model costs page faults, not copies.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "base/status.h"

namespace sy {

class MappedFile {
 public:
  static Result<std::shared_ptr<MappedFile>> Open(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

  // Gives back the resident pages wholly inside [data, data + bytes) when that range lies in a
  // live mapping (a no-op otherwise): for a tensor that was copied (packed) and whose mapped bytes
  // are no longer read, so the process holds the checkpoint once. A later read faults the pages in
  // again from the page cache or the file.
  static void ReleaseRange(const uint8_t* data, size_t bytes);

 private:
  MappedFile(std::string path, const uint8_t* data, size_t size)
      : path_(std::move(path)), data_(data), size_(size) {}
  std::string path_;
  const uint8_t* data_;
  size_t size_;
};

}  // namespace sy
