#include "base/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>

namespace sy {
namespace {

// Live mappings by start address, for ReleaseRange (which must never touch anonymous memory:
// MADV_DONTNEED would zero it).
std::mutex& RegistryMutex() {
  static std::mutex mutex;
  return mutex;
}
std::map<const uint8_t*, size_t>& Registry() {
  static std::map<const uint8_t*, size_t> mappings;
  return mappings;
}

}  // namespace

void MappedFile::ReleaseRange(const uint8_t* data, size_t bytes) {
  if (data == nullptr || bytes == 0) return;
  {
    std::lock_guard<std::mutex> lock(RegistryMutex());
    auto& mappings = Registry();
    auto it = mappings.upper_bound(data);
    if (it == mappings.begin()) return;
    --it;
    if (data + bytes > it->first + it->second) return;
  }
  const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t begin = (reinterpret_cast<uintptr_t>(data) + page - 1) / page * page;
  const uintptr_t end = (reinterpret_cast<uintptr_t>(data) + bytes) / page * page;
  if (end > begin) ::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);
}

Result<std::shared_ptr<MappedFile>> MappedFile::Open(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Status::Errorf("{}: cannot open: {}", path, std::strerror(errno));
  struct stat info {};
  if (::fstat(fd, &info) != 0 || !S_ISREG(info.st_mode)) {
    ::close(fd);
    return Status::Errorf("{}: not a regular file", path);
  }
  size_t size = static_cast<size_t>(info.st_size);
  const uint8_t* data = nullptr;
  if (size > 0) {
    void* mapping = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (mapping == MAP_FAILED) {
      ::close(fd);
      return Status::Errorf("{}: mmap failed: {}", path, std::strerror(errno));
    }
    data = static_cast<const uint8_t*>(mapping);
  }
  ::close(fd);
  if (data != nullptr) {
    std::lock_guard<std::mutex> lock(RegistryMutex());
    Registry()[data] = size;
  }
  return std::shared_ptr<MappedFile>(new MappedFile(path, data, size));
}

MappedFile::~MappedFile() {
  if (data_ == nullptr) return;
  {
    std::lock_guard<std::mutex> lock(RegistryMutex());
    Registry().erase(data_);
  }
  ::munmap(const_cast<uint8_t*>(data_), size_);
}

}  // namespace sy
