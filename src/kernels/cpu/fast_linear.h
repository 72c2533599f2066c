// The fast products the model uses: packed weights, threads split so both cores finish
// together, the AVX-512 BF16 GEMM for prefill-sized batches and the Highway panel kernel for
// decode. Unpacked weights fall back to the reference kernels in linear.h.
#pragma once

#include <cstdint>

#include "tensor/matrix.h"
#include "tensor/packed_matrix.h"

namespace sy::kernels {

struct KernelOptions {
  // Where the dot kernel does not run (no VBMI, or bf16_dot off): batches of at least this many
  // rows use the bf16 GEMM where the CPU has AVX-512 BF16 (activations rounded to bf16), smaller
  // ones the f32 panel kernel — when allow_bf16_gemm is on.
  int64_t bf16_gemm_min_rows = 128;
  // Prefill paths whose rows depend on the batch: the bf16 GEMM from bf16_gemm_min_rows rows and
  // oneDNN (--prefill-gemm). Off by default, so a row's result never depends on the rows beside
  // it and a request gets one answer however it was batched, chunked or cached; --prefill-gemm
  // other than 'own' turns it on.
  bool allow_bf16_gemm = false;
  // fp8 and bf16 weights take the bf16 dot-product kernel (bf16_dot.h) at every row count
  // where the CPU has it: twice the f32 FMA's work per instruction, and batch-invariant.
  bool bf16_dot = true;
  // fp8 and bf16 weights take the AMX bf16 kernel (amx_kernels.h) at every row count where AMX
  // runs, before the dot kernel, and absorbed MLA attention its AMX kernel. The command line
  // turns it on where the CPU has the tiles (`--no-amx-bf16`: off); off here, for the tests.
  bool amx_bf16 = false;
};
KernelOptions& GlobalKernelOptions();

// While one lives on this thread, products keep to the f32 panel kernel whatever their row
// count. The model opens one for decode steps (plain or MTP verification): a row's result then
// does not depend on how many rows share its step, so greedy tokens are the same at any batch
// size and with or without drafts. (The bf16 GEMM rounds activations; prefill keeps it.)
class DecodeStepScope {
 public:
  explicit DecodeStepScope(bool active);
  ~DecodeStepScope();
  DecodeStepScope(const DecodeStepScope&) = delete;
  DecodeStepScope& operator=(const DecodeStepScope&) = delete;

 private:
  bool previous_;
};

// y[m, w.rows] = x[m, w.cols] · wᵀ on all threads.
void LinearPacked(const float* x, int64_t m, const PackedMatrix& w, float* y);

// Split-K for decode-sized products with too few panels for the threads (on by default).
bool& SplitKEnabled();

// Uses w.packed when present, the reference kernel otherwise.
void LinearAuto(const float* x, int64_t m, const Matrix& w, float* y);

// Single-threaded versions, for callers that split work themselves (grouped experts).
void LinearPanels(const float* x, const uint16_t* x_bf16, int64_t m, const PackedMatrix& w,
                  int64_t panel_begin, int64_t panel_end, float* y);
// The same with x kept to f32 accuracy, for products whose inputs bf16 would round too far (the
// absorbed MLA's per-head products). On panels of bf16 pairs each row of x is split into three
// bf16 parts that add up to it exactly (a float's 24 significant bits, 8 at a time), the 3m rows
// go through the tile kernel together and each row's three results are added: f32 products and
// sums, the f32 kernel's accuracy at the tiles' rate (where the tiles do not run, the three parts
// go through the AVX-512 BF16 dot kernel the same way). Else LinearPanels' f32 kernel. A row's
// result depends on that row alone.
void LinearPanelsF32(const float* x, int64_t m, const PackedMatrix& w, int64_t panel_begin,
                     int64_t panel_end, float* y);
// y[m, w.rows] = x · wᵀ with x kept to f32 accuracy whatever the CPU and the weights' layout:
// LinearPanelsF32 over the pool (panels split, or blocks of rows where the matrix has fewer
// panels than the pool has threads); unpacked matrices take Linear. The MoE router's product,
// which HF runs in f32: through LinearAuto it rounded x to bf16 where the bf16 dot kernel or
// AMX runs, so a near tie between experts went one way there and the other way on CPUs without
// them. A row's result depends on that row alone. (Quantized weights, a GGUF's, take their own
// kernel, as in LinearPanels.)
void LinearF32(const float* x, int64_t m, const Matrix& w, float* y);
bool UseBf16Gemm(int64_t m, const PackedMatrix& w);
// Whether products against `w` take Bf16DotPanels (with activations from ToBf16RowsForDot).
bool UseBf16Dot(const PackedMatrix& w);
// Which kernel a product of m rows against `w` runs: "amx-bf16", "bf16-dot", "avx512-bf16",
// "panel-f32", an int8 or a GGML kernel's name (AMX ones ending "-emulated" on the emulator).
const char* KernelPathName(int64_t m, const PackedMatrix& w);

}  // namespace sy::kernels
