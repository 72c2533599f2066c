#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <type_traits>
#include <vector>

namespace sy {

// A scratch array every element of which the caller writes before reading: no zero fill. (A
// decode step at batch 32 zero-filled megabytes of such buffers on one thread while the others
// waited: a few percent of the step.)
template <typename T>
std::unique_ptr<T[]> UninitializedArray(int64_t count) {
  return std::make_unique_for_overwrite<T[]>(static_cast<size_t>(count));
}

// Arrays that start on a 64-byte line, for rows that AMX tile loads read (TILELOADD reads 64
// bytes a row): glibc's malloc aligns to 16, so every row of a tile straddled two lines, and
// the bf16 tile kernel ran at ~0.8x (1.20 against 1.44 TFLOP/s on one core of a Xeon with AMX,
// 256 × 2048 × 1536).
inline constexpr std::align_val_t kCacheLine{64};

template <typename T>
struct CacheLineAllocator {
  using value_type = T;
  CacheLineAllocator() = default;
  template <typename U>
  CacheLineAllocator(const CacheLineAllocator<U>&) {}  // NOLINT: allocators convert implicitly
  T* allocate(size_t n) { return static_cast<T*>(::operator new(n * sizeof(T), kCacheLine)); }
  void deallocate(T* p, size_t) { ::operator delete(p, kCacheLine); }
  template <typename U>
  bool operator==(const CacheLineAllocator<U>&) const {
    return true;
  }
};
template <typename T>
using CacheLineVector = std::vector<T, CacheLineAllocator<T>>;

// UninitializedArray on a 64-byte line; T trivial (no constructors run).
struct CacheLineDelete {
  void operator()(void* p) const { ::operator delete(p, kCacheLine); }
};
template <typename T>
using CacheLineArray = std::unique_ptr<T[], CacheLineDelete>;
template <typename T>
CacheLineArray<T> UninitializedCacheLineArray(int64_t count) {
  static_assert(std::is_trivial_v<T>);
  return CacheLineArray<T>(
      static_cast<T*>(::operator new(static_cast<size_t>(count) * sizeof(T), kCacheLine)));
}

// Keeps large freed blocks in the heap instead of returning them to the kernel. A forward step
// allocates multi-megabyte scratch buffers; with glibc's defaults each one is a fresh mmap whose
// pages the kernel must zero again (2 MiB at a time under transparent huge pages), which cost
// more than the step's arithmetic. Call once at start-up.
void KeepFreedMemoryInHeap();

}  // namespace sy
