// The machine's own limits, measured in the same run as the kernels they judge: streaming read
// and triad bandwidth over buffers far larger than the last-level cache, and bf16 and f32
// multiply-add throughput with enough independent accumulators to hide instruction latency.
// Each figure is the median of several repetitions on all threads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

namespace sy::bench {

struct MachinePeaks {
  double read_gbps = 0;
  double triad_gbps = 0;
  double bf16_gflops = 0;  // AVX-512 BF16 dot products; equals f32_gflops where there are none
  double f32_gflops = 0;
  // Byte products the int8 kernel's way (AVX-512 VNNI's VPDPBUSD where the kernel uses it, else
  // VPMADDUBSW + VPMADDWD + VPADDD; 2 ops per product); 0 where the CPU has no AVX2.
  double int8_gops = 0;
  // Intel AMX's tile multiplies (TDPBF16PS, TDPBUSD) on four independent accumulator tiles a
  // thread; 0 where AMX does not run on this CPU.
  double amx_bf16_gflops = 0;
  double amx_int8_gops = 0;
  int threads = 0;
  int64_t llc_bytes = 0;     // the last-level cache the OS reports (LastLevelCacheBytes)
  int64_t stream_bytes = 0;  // each array the bandwidth figures streamed
};

// The last-level cache as the OS reports it (lscpu's figure): the sizes of every distinct
// instance of the highest cache level in /sys/devices/system/cpu, summed; sysconf's L3 where
// sysfs says nothing; 0 if neither does.
int64_t LastLevelCacheBytes();
// Bytes a memory-bound measurement must stream to measure memory rather than cache: at least
// `at_least`, and more than twice the last-level cache (2.5x, in whole MiB).
int64_t StreamingBytes(int64_t at_least);

// buffer_bytes: per array; more than twice the LLC (StreamingBytes). repetitions: odd, for a
// clean median.
MachinePeaks MeasureMachine(int64_t buffer_bytes, int repetitions);

// Streaming read bandwidth over one buffer, measured as often as asked: the decode bench reads
// it beside every batch, since a shared machine's bandwidth moves between minutes (one reading
// at the start of a run gave "of bound" figures over 100% when it fell in a slow minute).
class ReadBandwidthProbe {
 public:
  explicit ReadBandwidthProbe(int64_t buffer_bytes);
  ~ReadBandwidthProbe();
  ReadBandwidthProbe(const ReadBandwidthProbe&) = delete;
  ReadBandwidthProbe& operator=(const ReadBandwidthProbe&) = delete;
  // GB/s on all threads of the pool, the median of `repetitions` passes.
  double MeasureGbps(int repetitions);

 private:
  std::shared_ptr<uint8_t> data_;  // floats, in huge pages
  size_t floats_;
};

}  // namespace sy::bench
