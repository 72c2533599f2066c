// `switchyard bench kernels`: each fast kernel at DeepSeek-V3's real shapes, with the bytes it
// must move, the FLOPs it does, and its fraction of the roofline built from the machine's peaks
// measured in the same run.
#pragma once

#include <string>
#include <vector>

#include "bench/machine_peaks.h"

namespace sy::bench {

struct KernelResult {
  std::string kernel;        // gemv, gemm, grouped_gemm, mla_decode
  std::string weight_dtype;  // fp8, bf16 (mla_decode: the cache's)
  std::string path;          // which implementation ran (panel-f32, avx512-bf16, flash-decode)
  int64_t m = 0, n = 0, k = 0, groups = 1;
  double seconds = 0;  // median of the repetitions
  double bytes = 0, flops = 0;
  double gbps = 0, gflops = 0;
  double roofline_fraction = 0;
  // Our rows beside a oneDNN row of the same shape and m: our GFLOP/s over oneDNN's (0: none).
  double vs_onednn = 0;
  std::string implementation;  // oneDNN rows: the implementation it chose
};

struct KernelBenchOptions {
  bool quick = false;
  int repetitions = 5;
  int64_t stream_bytes = 1ll << 30;  // weights cycled per shape: 4× even a 260 MB last-level cache
  bool onednn = true;                // oneDNN's bf16 matmul beside ours
  bool ggml_only = false;            // only the GGML (GGUF Q4_K, Q6_K) products
  bool amx_only = false;             // only the AMX bf16 products, and oneDNN's o_proj beside them
  bool dsa_only = false;             // only DeepSeek-V3.2's sparse attention (dsa_decode rows)
  bool mla_only = false;             // only the flash-decode kernel, bf16 and fp8 caches
};

std::vector<KernelResult> BenchKernels(const MachinePeaks& peaks,
                                       const KernelBenchOptions& options);

// Completes gbps, gflops and roofline_fraction from seconds, bytes and flops.
void Score(KernelResult& result, const MachinePeaks& peaks, double peak_gflops);

std::string KernelResultsJson(const MachinePeaks& peaks, const std::vector<KernelResult>& results);
std::string KernelResultsTable(const MachinePeaks& peaks, const std::vector<KernelResult>& results);

}  // namespace sy::bench
