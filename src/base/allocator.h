#pragma once

namespace sy {

// Keeps large freed blocks in the heap instead of returning them to the kernel. A forward step
// allocates multi-megabyte scratch buffers; with glibc's defaults each one is a fresh mmap whose
// pages the kernel must zero again (2 MiB at a time under transparent huge pages), which cost
// more than the step's arithmetic. Call once at start-up.
void KeepFreedMemoryInHeap();

}  // namespace sy
