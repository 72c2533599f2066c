#include "base/allocator.h"

#include <malloc.h>

namespace sy {

void KeepFreedMemoryInHeap() {
  mallopt(M_MMAP_THRESHOLD, 1 << 30);   // the largest value glibc accepts is 32 MiB on 64-bit...
  mallopt(M_MMAP_THRESHOLD, 32 << 20);  // ...so ask for the maximum it honours
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
}

}  // namespace sy
