// A file written whole or not at all: the bytes go to PATH.partial, which Commit() renames to PATH;
// dropped uncommitted (an error on the way), the .partial file is removed. So a stopped or failed
// writer never leaves a file a loader would take for a finished one.
#pragma once

#include <cstdio>
#include <memory>
#include <string>

#include "base/status.h"

namespace sy {

// fsync of the directory holding `path`: what makes a file created, renamed or removed there
// survive a power cut.
Status SyncDirectoryOf(const std::string& path);

class PartialFile {
 public:
  static Result<PartialFile> Create(const std::string& path);
  PartialFile(PartialFile&&) = default;
  PartialFile& operator=(PartialFile&&) = default;
  ~PartialFile();

  // Errors name the .partial file and the system's reason.
  Status Put(const void* bytes, size_t n);
  // `durable`: the bytes and then the rename reach the disk before it returns (fsync of the file
  // and of its directory), so that after a power cut PATH holds the old file or the new one
  // whole — not a renamed file whose bytes never arrived.
  Status Commit(bool durable = false);

 private:
  PartialFile() = default;
  std::string path_, temporary_;
  std::unique_ptr<FILE, int (*)(FILE*)> file_{nullptr, std::fclose};
};

}  // namespace sy
