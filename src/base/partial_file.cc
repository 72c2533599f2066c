#include "base/partial_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

namespace sy {

Status SyncDirectoryOf(const std::string& path) {
  std::string directory = std::filesystem::path(path).parent_path().string();
  if (directory.empty()) directory = ".";
  const int fd = ::open(directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  const bool synced = fd >= 0 && ::fsync(fd) == 0;
  const int error = errno;
  if (fd >= 0) ::close(fd);
  if (!synced)
    return Status::Errorf("{}: cannot sync its directory: {}", path, std::strerror(error));
  return Status::Ok();
}

Result<PartialFile> PartialFile::Create(const std::string& path) {
  PartialFile f;
  f.path_ = path;
  f.temporary_ = path + ".partial";
  f.file_.reset(std::fopen(f.temporary_.c_str(), "wb"));
  if (!f.file_) return Status::Errorf("{}: cannot create: {}", f.temporary_, std::strerror(errno));
  return f;
}

PartialFile::~PartialFile() {
  if (file_) {
    file_.reset();
    std::remove(temporary_.c_str());
  }
}

Status PartialFile::Put(const void* bytes, size_t n) {
  if (n != 0 && std::fwrite(bytes, 1, n, file_.get()) != n)
    return Status::Errorf("{}: write failed: {}", temporary_, std::strerror(errno));
  return Status::Ok();
}

Status PartialFile::Commit(bool durable) {
  bool flushed = std::fflush(file_.get()) == 0;
  if (flushed && durable) flushed = ::fsync(::fileno(file_.get())) == 0;
  const int error = errno;
  if (std::fclose(file_.release()) != 0 || !flushed) {
    std::remove(temporary_.c_str());
    return Status::Errorf("{}: write failed: {}", temporary_,
                          std::strerror(flushed ? errno : error));
  }
  if (std::rename(temporary_.c_str(), path_.c_str()) != 0) {
    const int rename_error = errno;
    std::remove(temporary_.c_str());
    return Status::Errorf("{}: cannot rename to {}: {}", temporary_, path_,
                          std::strerror(rename_error));
  }
  // The rename is an entry of the directory: synced with it.
  if (durable) return SyncDirectoryOf(path_);
  return Status::Ok();
}

}  // namespace sy
