// Products on Intel AMX tiles (Sapphire Rapids and later): TDPBUSD for int8 weights
// (`--int8-products`), TDPBSUD for GGML blocks (a GGUF's Q2_K..Q8_0), TDPBF16PS for fp8 and bf16
// weights and for absorbed MLA attention (`--amx-bf16`). One tile multiply does 16 rows × 16
// outputs × 64 bytes of products, eight to sixteen times an AVX-512 instruction's.
//
// Each kernel is written once (amx_kernels_body.h) and built twice: on the hardware's tiles and
// on the emulator of amx_tiles.h, so its tiling and packing are tested on CPUs without AMX.
//
// int8 and GGML: the same arithmetic as int8_gemm.h and ggml_gemm.h, bit for bit — each 128-column
// group's integer sums are exact whatever the tile shape, and the group's term is added to a row's
// result as the portable kernel adds it (GGML: each sub-block's). So it may take any batch at any
// size without a row's bits moving, and Int8Panels and GgmlPanels use it from one tile of rows up.
//
// fp8 and bf16: activations rounded to bf16 once per row. fp8 weights: a panel's converted to
// bf16 pairs (exact) one scale block at a time; for each block, TDPBF16PS sums its columns into
// a zeroed tile 32 columns at a time, and each row's result is fma(block sum, block scale,
// result so far). bf16 weights: one chain of TDPBF16PS over all columns, from panels converted
// per product or laid out as the tiles at load (PackedMatrix::bf16_pairs), the same bits either
// way. A row's tile row never sees another row, so its bits do not depend on the batch; they do
// differ from the bf16 dot kernel's (another order of sums), so the choice is one for all row
// counts, made before a model runs (KernelOptions::amx_bf16, or bf16 pairs at load).
#pragma once

#include <cstdint>

#include "kernels/cpu/ggml_gemm.h"
#include "kernels/cpu/mla_decode.h"
#include "tensor/packed_matrix.h"

namespace sy::kernels {

// Where the AMX kernels run: the CPU's tiles (isa_level.h's AmxAllowed()), the emulator
// (environment SWITCHYARD_AMX_EMULATE=1 on a CPU without them: slow, for testing the kernels'
// use end to end), or nowhere.
enum class AmxBackend : uint8_t { kNone, kEmulated, kHardware };
AmxBackend ActiveAmxBackend();
const char* AmxBackendName(AmxBackend backend);

// int8 weights the kernel takes: kI8 with columns a multiple of 64 (one tile's depth).
bool AmxInt8Applies(const PackedMatrix& w);
// Int8Panels's contract (int8_gemm.h), on `backend`'s tiles.
void AmxInt8Panels(AmxBackend backend, const uint8_t* codes, int64_t stride, const float* scales,
                   int64_t m, const PackedMatrix& w, int64_t panel_begin, int64_t panel_end,
                   float* y);
// Whether Int8Panels takes the AMX kernel for m rows against `w`: a backend runs, the kernel
// gave the portable kernel's bits on a fixed problem the first time this was asked (else a
// warning on stderr and never), tests have not switched it off, m fills a tile (below that the
// vector kernels do the same work with less), and w applies.
bool UseAmxInt8(int64_t m, const PackedMatrix& w);
inline constexpr int64_t kAmxInt8MinRows = 16;
// Tests: whether UseAmxInt8 may say yes (on by default).
void EnableAmxInt8(bool enabled);

// GGML blocks kept quantized (ggml_gemm.h) with sub-blocks of at most 64 columns or whole
// multiples of 64: every type PackGgml keeps, HF int4's 128-column groups included.
bool AmxGgmlApplies(const PackedMatrix& w);
// GgmlPanels's contract, on `backend`'s tiles: TDPBSUD sums each sub-block's signed activation
// codes times its unsigned weight codes (unpacked from nibbles and top bits into bytes), and the
// sub-block and block arithmetic is ggml_gemm.h's, so the bits are the vector kernels'.
void AmxGgmlPanels(AmxBackend backend, const Q8Rows& x, int64_t first, int64_t m,
                   const PackedMatrix& w, int64_t panel_begin, int64_t panel_end, float* y);
// As UseAmxInt8, for GgmlPanels (its check: Q4_K, HF int4, Q6_K and Q8_0 layouts), but off
// unless enabled: slower than the AVX-512 VNNI kernel where measured (amx_kernels.cc).
bool UseAmxGgml(int64_t m, const PackedMatrix& w);
// Whether UseAmxGgml may say yes: SWITCHYARD_AMX_GGML=1 at start, or tests.
void EnableAmxGgml(bool enabled);

// fp8 (scale blocks of a multiple of 32 columns) or bf16 weights with columns a multiple of 32.
bool AmxBf16Applies(const PackedMatrix& w);
// x as AmxBf16Panels reads it: whole tiles of 16 rows (those past m zero), each row a cache line
// longer than its columns, so that the 16 or 32 rows a tile load reads do not all fall in one L1
// set (a row of 2^n bf16 is a multiple of 4 KiB).
inline int64_t AmxBf16RowStride(int64_t cols) {
  return cols + 32;
}
inline int64_t AmxBf16Elements(int64_t m, int64_t cols) {
  return (m + 15) / 16 * 16 * AmxBf16RowStride(cols);
}
// Rows of x rounded to bf16 (nearest even) for AmxBf16Panels, AmxBf16Elements(m, cols) of them
// at `out`.
void AmxToBf16Rows(AmxBackend backend, const float* x, int64_t m, int64_t cols, uint16_t* out);
// One row as AmxToBf16Rows rounds it: `cols` values at out (no rows of zeros after it).
void AmxToBf16Row(AmxBackend backend, const float* x, int64_t cols, uint16_t* out);
// One row rounded as AmxToBf16Row into each of outs[0, count) (64-byte aligned; cols a multiple
// of 32), written past the caches: for copies nothing reads before they have left them.
void AmxToBf16RowFanOut(AmxBackend backend, const float* x, int64_t cols, uint16_t* const* outs,
                        int64_t count);
// y[m, w.rows] = x · wᵀ for panels [panel_begin, panel_end); one thread. x_bf16 as
// AmxToBf16Rows writes it.
void AmxBf16Panels(AmxBackend backend, const uint16_t* x_bf16, int64_t m, const PackedMatrix& w,
                   int64_t panel_begin, int64_t panel_end, float* y);
// Whether AmxBf16GateUpPanels takes gate and up: weights the kernel applies to (fp8 or bf16),
// both of one dtype, layout, shape and (fp8) block size.
bool AmxGateUpFuses(const PackedMatrix& gate, const PackedMatrix& up);
// An expert's first half for down's product: SiLU(x·gateᵀ)·(x·upᵀ) at gate's and up's panels
// [panel_begin, panel_end), each row's values rounded to bf16 at columns [16 · panel_begin,
// min(gate.rows, 16 · panel_end)) of `out`'s rows (AmxBf16RowStride(gate.rows) apart: down's x as
// AmxToBf16Rows writes it, but for the zero rows past m, which are the caller's). The bits of
// AmxBf16Panels for gate and for up, SiluMul on those columns of each row, then AmxToBf16Rows,
// with no f32 rows written: gate's and up's panels are walked as pairs, so each tile of x loaded
// serves both (fp8 panels are converted a unit at a time, each its own matrix's). One thread;
// AmxGateUpFuses(gate, up).
void AmxBf16GateUpPanels(AmxBackend backend, const uint16_t* x_bf16, int64_t m,
                         const PackedMatrix& gate, const PackedMatrix& up, int64_t panel_begin,
                         int64_t panel_end, uint16_t* out);
// An expert's down products summed into its tokens' rows (the routing sum of
// model/feed_forward.h's FinalizeRouting, done in the kernel's copy-out): row r of the call adds
// weight[r] · its outputs into out's row token[r] (out_stride apart), from zero where first[r] —
// AddWeightedRow's arithmetic, so called expert by expert in ascending order for a range of
// columns, each token's sum has FinalizeRouting's bits.
struct AmxRoutedRows {
  const int64_t* token = nullptr;
  const float* weight = nullptr;
  const uint8_t* first = nullptr;
  float* out = nullptr;
  int64_t out_stride = 0;
};
// AmxBf16Panels's products for panels [panel_begin, panel_end), added into rows.out at those
// columns instead of written to y. One thread.
void AmxBf16RoutedPanels(AmxBackend backend, const uint16_t* x_bf16, int64_t m,
                         const PackedMatrix& w, int64_t panel_begin, int64_t panel_end,
                         const AmxRoutedRows& rows);
// Whether fp8 and bf16 products take the AMX bf16 kernel: KernelOptions::amx_bf16, a backend,
// and w applies; always for panels of bf16 pairs (no other kernel reads them).
bool UseAmxBf16(const PackedMatrix& w);

// Absorbed MLA attention (mla_decode.h's MlaDecodeAttention) with heads as tile rows: a bf16 or
// fp8 latent cache (an fp8 one widened to bf16 a chunk at a time, exactly), latent a multiple
// of 16 (any rope width: the dims are zero-padded to tiles).
bool AmxMlaApplies(DType cache_dtype, int64_t latent, int64_t rope);
void AmxMlaDecode(AmxBackend backend, const float* q_latent, const float* q_pe, int64_t tokens,
                  const int64_t* positions, const LatentPages& cache, int64_t keys, int64_t heads,
                  int64_t head_begin, int64_t head_end, int64_t latent, int64_t rope,
                  float softmax_scale, float* o_latent);
// Whether MlaDecodeAttention takes it: KernelOptions::amx_bf16 (the products' flag, one choice
// per process: prompts and decode steps take the same kernel either way), a backend, and it
// applies.
bool UseAmxMla(DType cache_dtype, int64_t latent, int64_t rope);

// The tile multiplies' peak, for `bench kernels`: `iterations` rounds of four independent
// TDPBF16PS (bf16) or TDPBUSD (int8) on a 2 × 2 block of 16 × 16 output tiles, every operand 1.
// Returns output [0][0] of the first tile — iterations · 32 (bf16, exact below 2^24) or · 64 —
// so that the work is seen to be done.
double AmxPeakLoop(AmxBackend backend, bool bf16, int64_t iterations);
// Operations (2 per multiply-add) per round of AmxPeakLoop.
inline double AmxOpsPerRound(bool bf16) {
  return 4.0 * 16 * 16 * (bf16 ? 32 : 64) * 2;
}

// One backend's kernels, for the dispatch above (amx_emulated.cc, amx_hardware.cc).
namespace amx_detail {
void Int8PanelsEmulated(const uint8_t* codes, int64_t stride, const float* scales, int64_t m,
                        const PackedMatrix& w, int64_t panel_begin, int64_t panel_end, float* y);
void Int8PanelsHardware(const uint8_t* codes, int64_t stride, const float* scales, int64_t m,
                        const PackedMatrix& w, int64_t panel_begin, int64_t panel_end, float* y);
void GgmlPanelsEmulated(const Q8Rows& x, int64_t first, int64_t m, const PackedMatrix& w,
                        int64_t panel_begin, int64_t panel_end, float* y);
void GgmlPanelsHardware(const Q8Rows& x, int64_t first, int64_t m, const PackedMatrix& w,
                        int64_t panel_begin, int64_t panel_end, float* y);
void Bf16PanelsEmulated(const uint16_t* x_bf16, int64_t m, const PackedMatrix& w,
                        int64_t panel_begin, int64_t panel_end, float* y);
void Bf16PanelsHardware(const uint16_t* x_bf16, int64_t m, const PackedMatrix& w,
                        int64_t panel_begin, int64_t panel_end, float* y);
void Bf16RoutedEmulated(const uint16_t* x_bf16, int64_t m, const PackedMatrix& w,
                        int64_t panel_begin, int64_t panel_end, const AmxRoutedRows& rows);
void Bf16RoutedHardware(const uint16_t* x_bf16, int64_t m, const PackedMatrix& w,
                        int64_t panel_begin, int64_t panel_end, const AmxRoutedRows& rows);
void Bf16GateUpEmulated(const uint16_t* x_bf16, int64_t m, const PackedMatrix& gate,
                        const PackedMatrix& up, int64_t panel_begin, int64_t panel_end,
                        uint16_t* out);
void Bf16GateUpHardware(const uint16_t* x_bf16, int64_t m, const PackedMatrix& gate,
                        const PackedMatrix& up, int64_t panel_begin, int64_t panel_end,
                        uint16_t* out);
void ToBf16RowsHardware(const float* x, int64_t m, int64_t cols, uint16_t* out);
void ToBf16RowFanOutHardware(const float* x, int64_t cols, uint16_t* const* outs, int64_t count);
double PeakLoopEmulated(bool bf16, int64_t iterations);
void MlaDecodeEmulated(const float* q_latent, const float* q_pe, int64_t tokens,
                       const int64_t* positions, const LatentPages& cache, int64_t keys,
                       int64_t heads, int64_t head_begin, int64_t head_end, int64_t latent,
                       int64_t rope, float softmax_scale, float* o_latent);
void MlaDecodeHardware(const float* q_latent, const float* q_pe, int64_t tokens,
                       const int64_t* positions, const LatentPages& cache, int64_t keys,
                       int64_t heads, int64_t head_begin, int64_t head_end, int64_t latent,
                       int64_t rope, float softmax_scale, float* o_latent);
double PeakLoopHardware(bool bf16, int64_t iterations);
}  // namespace amx_detail

}  // namespace sy::kernels
