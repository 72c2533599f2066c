// Prefill-sized products through oneDNN's matmul (Debian's libdnnl), on CPUs where it beats our
// own kernels: oneDNN drives AMX tiles (Sapphire Rapids and later) and its AVX-512 BF16 brgemm
// reached 370–460 GFLOP/s on Zen 4 where our GEMM reached 192. We call a library there instead
// of chasing it by hand: the fastest correct answer wins.
//
// The packed weights (fp8, bf16 or f32) are dequantized a block of panels at a time into a buffer
// reused across calls, never into a second copy of the model. Where oneDNN has a bf16 matmul,
// activations and weights are rounded to bf16 (fp8 × its block scale, relative error ≤ 2⁻⁸ a
// weight, as the AVX-512 BF16 GEMM already rounds activations); elsewhere it runs in f32 on each
// weight as the reference kernel has it (fp8 × block scale rounded once to f32).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "tensor/packed_matrix.h"

namespace sy::kernels {

// Whether oneDNN has a bf16 matmul on this CPU (AVX-512 BF16 or AMX); asked once.
bool OnednnHasBf16Matmul();
// Whether OnednnLinear runs in bf16: oneDNN has a bf16 matmul and --f32-products is off
// (GlobalKernelOptions().bf16_dot); else in f32.
bool OnednnRunsBf16();

// y[m, w.rows] = x[m, w.cols] · wᵀ through oneDNN, on as many OpenMP threads as the pool has.
// w is fp8, bf16 or f32 (not int8); calls are serialized (one block buffer). Throws if oneDNN
// refuses the product.
void OnednnLinear(const float* x, int64_t m, const PackedMatrix& w, float* y);

// Which GEMM prefill-sized products (m ≥ kOnednnMinRows, outside decode steps) run. kOwn by
// default: our kernels give a row the same bits whatever rows share its product, so a request's
// answer does not depend on its batch, its prompt's chunks or the prefix cache; oneDNN's
// blocking, and so a row's bits, depend on m, and a prompt computed whole (oneDNN) or after a
// cached prefix (ours, fewer rows) would differ. The others trade that for prefill speed:
//  - kAuto: kMeasure where OnednnRunsBf16(), else ours (oneDNN's f32 matmul lost to ours by
//    1.35–1.7× on Zen 3, so measuring it there would only cost time).
//  - kMeasure: the first such product of each weight shape (dtype, rows, cols) times ours and
//    oneDNN's on its own rows and keeps the faster for that shape.
//  - kOwn, kOnednn: always that one (kOnednn: the f32 matmul where there is no bf16 one).
enum class PrefillGemm : uint8_t { kAuto, kMeasure, kOwn, kOnednn };
PrefillGemm& GlobalPrefillGemm();
inline constexpr int64_t kOnednnMinRows = 256;

// A prefill-sized product (the caller checked m ≥ kOnednnMinRows, no decode step, no batch
// invariance) by the GEMM GlobalPrefillGemm() picks. Returns false when it is ours (or oneDNN
// failed: one warning on stderr): the caller runs it. `own` writes y with our kernel (the
// calibration times it).
bool RunPrefillLinear(const float* x, int64_t m, const PackedMatrix& w, float* y,
                      const std::function<void()>& own);

// The shapes measured so far and what each chose (the stderr note says the same when oneDNN wins).
struct PrefillGemmDecision {
  int64_t rows = 0, cols = 0;
  std::string dtype;
  bool onednn = false;
  double own_seconds = 0, onednn_seconds = 0;
};
std::vector<PrefillGemmDecision> PrefillGemmDecisions();

}  // namespace sy::kernels
