#pragma once

#include <cstdint>
#include <memory>

namespace sy {

// A scratch array every element of which the caller writes before reading: no zero fill. (A
// decode step at batch 32 zero-filled megabytes of such buffers on one thread while the others
// waited: a few percent of the step.)
template <typename T>
std::unique_ptr<T[]> UninitializedArray(int64_t count) {
  return std::make_unique_for_overwrite<T[]>(static_cast<size_t>(count));
}

// Keeps large freed blocks in the heap instead of returning them to the kernel. A forward step
// allocates multi-megabyte scratch buffers; with glibc's defaults each one is a fresh mmap whose
// pages the kernel must zero again (2 MiB at a time under transparent huge pages), which cost
// more than the step's arithmetic. Call once at start-up.
void KeepFreedMemoryInHeap();

}  // namespace sy
