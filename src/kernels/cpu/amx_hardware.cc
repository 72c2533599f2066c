// The AMX kernels (amx_kernels_body.h) on the CPU's tiles. Used only where AmxAllowed(): the
// CPU has AMX-TILE, -INT8 and -BF16, the OS saves the tile state, and Linux granted this process
// the tile data (isa_level.cc asks).
#include "kernels/cpu/amx_kernels.h"

#if defined(__x86_64__)
#include <immintrin.h>

#include <algorithm>
#include <vector>

#include "kernels/cpu/amx_tiles.h"
#include "kernels/cpu/bf16_dot.h"
#include "kernels/cpu/bf16_pairs.h"

// Every CPU with AMX (Sapphire Rapids on) has AVX-512 with BF16 and VBMI as well: the weights'
// conversion and the sums' flush use them.
#define SY_AMX_KERNEL \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,avx512vbmi,fma,f16c")))

namespace sy::kernels {
namespace {

// The tile instructions as inline assembly, not GCC's intrinsics: those paste the tile number
// into the instruction text by stringizing their argument (so it cannot be a template
// parameter), and declare no memory effects (so a compiler may move a TILESTORED's readers
// before it). Here the number is an immediate operand ("n", printed bare by %c) and loads and
// stores clobber memory. AT&T order: sources first, the destination tile last.
struct HardwareTiles {
  static void Configure(const TileConfig& config) {
    asm volatile("ldtilecfg %0" : : "m"(config) : "memory");
  }
  static void Release() { asm volatile("tilerelease" ::: "memory"); }
  template <int T>
  static void Zero() {
    asm volatile("tilezero %%tmm%c0" : : "n"(T));
  }
  template <int T>
  static void Load(const void* base, int64_t stride) {
    asm volatile("tileloadd (%0,%1,1), %%tmm%c2" : : "r"(base), "r"(stride), "n"(T) : "memory");
  }
  template <int T>
  static void Store(void* base, int64_t stride) {
    asm volatile("tilestored %%tmm%c2, (%0,%1,1)" : : "r"(base), "r"(stride), "n"(T) : "memory");
  }
  template <int C, int A, int B>
  static void DotUnsignedSigned() {
    asm volatile("tdpbusd %%tmm%c2, %%tmm%c1, %%tmm%c0" : : "n"(C), "n"(A), "n"(B));
  }
  template <int C, int A, int B>
  static void DotSignedUnsigned() {
    asm volatile("tdpbsud %%tmm%c2, %%tmm%c1, %%tmm%c0" : : "n"(C), "n"(A), "n"(B));
  }
  template <int C, int A, int B>
  static void DotBf16() {
    asm volatile("tdpbf16ps %%tmm%c2, %%tmm%c1, %%tmm%c0" : : "n"(C), "n"(A), "n"(B));
  }
};

// Software prefetch distance in each panel's stream, in columns (4 KiB of fp8). The weights are
// read once, in runs of a chunk of columns; at decode's few rows nothing else hides the latency.
constexpr int64_t kConvertPrefetchColumns = 256;

// Columns [c0, c1) of panels [panel, panel + count) as TDPBF16PS weight rows, panel j's at
// out + j · out_stride: bf16_pairs.h's quad conversion, each pair vector stored as one row. The
// panels are walked side by side, so their streams are in flight together.
SY_AMX_KERNEL void ConvertPairsAvx512(const PackedMatrix& w, int64_t panel, int64_t count,
                                      int64_t c0, int64_t c1, uint16_t* out, int64_t out_stride) {
  const Converter k = MakeConverter();
  const bool fp8 = w.dtype == DType::kF8E4M3;
  const int64_t column_bytes = kPanelRows * (fp8 ? 1 : 2);
  const uint8_t* base[2] = {w.Panel(panel), w.Panel(panel + count - 1)};
  for (int64_t c = c0; c < c1; c += 4) {
    for (int64_t j = 0; j < count; ++j) {
      const char* ahead =
          reinterpret_cast<const char*>(base[j] + (c + kConvertPrefetchColumns) * column_bytes);
      _mm_prefetch(ahead, _MM_HINT_T0);
      if (!fp8) _mm_prefetch(ahead + 64, _MM_HINT_T0);
      __m512i first, second;
      if (fp8) {
        ConvertQuad<true>(k, base[j], c, first, second);
      } else {
        ConvertQuad<false>(k, base[j], c, first, second);
      }
      uint16_t* row = out + j * out_stride + (c - c0) / 2 * 2 * kPanelRows;
      _mm512_storeu_si512(row, first);
      _mm512_storeu_si512(row + 2 * kPanelRows, second);
    }
  }
}

// Keys r0 and r1 as one row of P·V's weight tiles (MlaDecodeBody's PairRows): per 16 dims, the
// two rows' halves interleaved by one permute.
SY_AMX_KERNEL void PairRowsAvx512(const uint8_t* r0, const uint8_t* r1, int64_t latent,
                                  uint16_t* out, int64_t tile_stride) {
  const __m512i index = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24,
                                         8, 23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  for (int64_t dt = 0; dt < latent / kPanelRows; ++dt) {
    const __m256i low = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(r0 + 32 * dt));
    const __m256i high = r1 != nullptr
                             ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(r1 + 32 * dt))
                             : _mm256_setzero_si256();
    _mm512_storeu_si512(
        out + dt * tile_stride,
        _mm512_permutexvar_epi16(index, _mm512_inserti64x4(_mm512_zextsi256_si512(low), high, 1)));
  }
}

}  // namespace
}  // namespace sy::kernels

#include "kernels/cpu/amx_kernels_body.h"

namespace sy::kernels::amx_detail {

void Int8PanelsHardware(const uint8_t* codes, int64_t stride, const float* scales, int64_t m,
                        const PackedMatrix& w, int64_t panel_begin, int64_t panel_end, float* y) {
  Int8PanelsBody<HardwareTiles>(codes, stride, scales, m, w, panel_begin, panel_end, y);
}

void GgmlPanelsHardware(const Q8Rows& x, int64_t first, int64_t m, const PackedMatrix& w,
                        int64_t panel_begin, int64_t panel_end, float* y) {
  GgmlPanelsBody<HardwareTiles>(x, first, m, w, panel_begin, panel_end, y);
}

void MlaDecodeHardware(const float* q_latent, const float* q_pe, int64_t tokens,
                       const int64_t* positions, const LatentPages& cache, int64_t keys,
                       int64_t heads, int64_t head_begin, int64_t head_end, int64_t latent,
                       int64_t rope, float softmax_scale, float* o_latent) {
  MlaDecodeBody<HardwareTiles>(q_latent, q_pe, tokens, positions, cache, keys, heads, head_begin,
                               head_end, latent, rope, softmax_scale, o_latent, PairRowsAvx512,
                               ToBf16RowsForDot);
}

double PeakLoopHardware(bool bf16, int64_t iterations) {
  return PeakLoopBody<HardwareTiles>(bf16, iterations);
}

void Bf16PanelsHardware(const uint16_t* x_bf16, int64_t m, const PackedMatrix& w,
                        int64_t panel_begin, int64_t panel_end, float* y) {
  Bf16PanelsBody<HardwareTiles>(x_bf16, m, w, panel_begin, panel_end, y, ConvertPairsAvx512);
}

void Bf16GateUpHardware(const uint16_t* x_bf16, int64_t m, const PackedMatrix& gate,
                        const PackedMatrix& up, int64_t panel_begin, int64_t panel_end,
                        uint16_t* out) {
  Bf16GateUp fused{&up, out, ToBf16RowsForDot};
  Bf16PanelsBody<HardwareTiles>(x_bf16, m, gate, panel_begin, panel_end, nullptr,
                                ConvertPairsAvx512, &fused);
}

void Bf16RoutedHardware(const uint16_t* x_bf16, int64_t m, const PackedMatrix& w,
                        int64_t panel_begin, int64_t panel_end, const AmxRoutedRows& rows) {
  Bf16PanelsBody<HardwareTiles>(x_bf16, m, w, panel_begin, panel_end, nullptr, ConvertPairsAvx512,
                                nullptr, &rows);
}

void ToBf16RowsHardware(const float* x, int64_t m, int64_t cols, uint16_t* out) {
  ToBf16RowsForDot(x, m, cols, out);  // AVX-512 BF16's rounding, as the dot kernel's
}

SY_AMX_KERNEL void ToBf16RowFanOutHardware(const float* x, int64_t cols, uint16_t* const* outs,
                                           int64_t count) {
  for (int64_t c = 0; c < cols; c += 32) {
    const __m512i both = reinterpret_cast<__m512i>(
        _mm512_cvtne2ps_pbh(_mm512_loadu_ps(x + c + 16), _mm512_loadu_ps(x + c)));
    for (int64_t i = 0; i < count; ++i)
      _mm512_stream_si512(reinterpret_cast<__m512i*>(outs[i] + c), both);
  }
  _mm_sfence();
}

}  // namespace sy::kernels::amx_detail

#else  // no AMX off x86-64: ActiveAmxBackend() never answers kHardware there

namespace sy::kernels::amx_detail {
void Int8PanelsHardware(const uint8_t*, int64_t, const float*, int64_t, const PackedMatrix&,
                        int64_t, int64_t, float*) {}
void GgmlPanelsHardware(const Q8Rows&, int64_t, int64_t, const PackedMatrix&, int64_t, int64_t,
                        float*) {}
void Bf16PanelsHardware(const uint16_t*, int64_t, const PackedMatrix&, int64_t, int64_t, float*) {}
void Bf16GateUpHardware(const uint16_t*, int64_t, const PackedMatrix&, const PackedMatrix&, int64_t,
                        int64_t, uint16_t*) {}
void Bf16RoutedHardware(const uint16_t*, int64_t, const PackedMatrix&, int64_t, int64_t,
                        const AmxRoutedRows&) {}
double PeakLoopHardware(bool, int64_t) {
  return 0;
}
void MlaDecodeHardware(const float*, const float*, int64_t, const int64_t*, const LatentPages&,
                       int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, float, float*) {}
void ToBf16RowsHardware(const float*, int64_t, int64_t, uint16_t*) {}
void ToBf16RowFanOutHardware(const float*, int64_t, uint16_t* const*, int64_t) {}
}  // namespace sy::kernels::amx_detail

#endif
