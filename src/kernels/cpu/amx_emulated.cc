// The AMX kernels (amx_kernels_body.h) on amx_tiles.h's emulated tiles, with a portable weight
// conversion: the same tiling, configuration and packing as on hardware, on any CPU.
#include <cstdint>
#include <cstring>

#include "kernels/cpu/amx_kernels.h"
#include "kernels/cpu/amx_tiles.h"
#include "tensor/dtype.h"

#define SY_AMX_KERNEL

namespace sy::kernels {
namespace {

// Columns [c0, c1) of panels [panel, panel + count) as TDPBF16PS weight rows (panel j's at
// out + j · out_stride), one weight at a time (fp8 through a table of its 256 codes in bf16:
// exact, e4m3's 4 significant bits fit bf16's 8).
void ConvertPairsPortable(const PackedMatrix& w, int64_t panel, int64_t count, int64_t c0,
                          int64_t c1, uint16_t* out, int64_t out_stride) {
  static const auto* table = [] {
    auto* t = new uint16_t[256];
    for (int v = 0; v < 256; ++v)
      t[v] = F32ToBF16(F8E4M3ToF32(static_cast<uint8_t>(v)));
    return t;
  }();
  const bool fp8 = w.dtype == DType::kF8E4M3;
  for (int64_t j = 0; j < count; ++j) {
    const uint8_t* base = w.Panel(panel + j);
    for (int64_t c = c0; c < c1; ++c) {
      uint16_t* row = out + j * out_stride + (c - c0) / 2 * 2 * kPanelRows;
      for (int64_t r = 0; r < kPanelRows; ++r) {
        const int64_t at = c * kPanelRows + r;
        row[2 * r + (c - c0) % 2] =
            fp8 ? table[base[at]] : reinterpret_cast<const uint16_t*>(base)[at];
      }
    }
  }
}

// AmxToBf16Rows's rounding off the tiles.
void ToBf16RowsPortable(const float* x, int64_t m, int64_t cols, uint16_t* out) {
  for (int64_t i = 0; i < m * cols; ++i)
    out[i] = F32ToBF16(x[i]);
}

void PairRowsPortable(const uint8_t* r0, const uint8_t* r1, int64_t latent, uint16_t* out,
                      int64_t tile_stride) {
  for (int64_t d = 0; d < latent; ++d) {
    uint16_t pair[2] = {0, 0};
    std::memcpy(&pair[0], r0 + 2 * d, 2);
    if (r1 != nullptr) std::memcpy(&pair[1], r1 + 2 * d, 2);
    std::memcpy(out + (d / kPanelRows) * tile_stride + 2 * (d % kPanelRows), pair, 4);
  }
}

}  // namespace
}  // namespace sy::kernels

#include "kernels/cpu/amx_kernels_body.h"

namespace sy::kernels::amx_detail {

void Int8PanelsEmulated(const uint8_t* codes, int64_t stride, const float* scales, int64_t m,
                        const PackedMatrix& w, int64_t panel_begin, int64_t panel_end, float* y) {
  Int8PanelsBody<EmulatedTiles>(codes, stride, scales, m, w, panel_begin, panel_end, y);
}

void GgmlPanelsEmulated(const Q8Rows& x, int64_t first, int64_t m, const PackedMatrix& w,
                        int64_t panel_begin, int64_t panel_end, float* y) {
  GgmlPanelsBody<EmulatedTiles>(x, first, m, w, panel_begin, panel_end, y);
}

void MlaDecodeEmulated(const float* q_latent, const float* q_pe, int64_t tokens,
                       const int64_t* positions, const LatentPages& cache, int64_t keys,
                       int64_t heads, int64_t head_begin, int64_t head_end, int64_t latent,
                       int64_t rope, float softmax_scale, float* o_latent) {
  MlaDecodeBody<EmulatedTiles>(q_latent, q_pe, tokens, positions, cache, keys, heads, head_begin,
                               head_end, latent, rope, softmax_scale, o_latent, PairRowsPortable,
                               ToBf16RowsPortable);
}

double PeakLoopEmulated(bool bf16, int64_t iterations) {
  return PeakLoopBody<EmulatedTiles>(bf16, iterations);
}

void Bf16PanelsEmulated(const uint16_t* x_bf16, int64_t m, const PackedMatrix& w,
                        int64_t panel_begin, int64_t panel_end, float* y) {
  Bf16PanelsBody<EmulatedTiles>(x_bf16, m, w, panel_begin, panel_end, y, ConvertPairsPortable);
}

void Bf16GateUpEmulated(const uint16_t* x_bf16, int64_t m, const PackedMatrix& gate,
                        const PackedMatrix& up, int64_t panel_begin, int64_t panel_end,
                        uint16_t* out) {
  Bf16GateUp fused{&up, out, ToBf16RowsPortable};
  Bf16PanelsBody<EmulatedTiles>(x_bf16, m, gate, panel_begin, panel_end, nullptr,
                                ConvertPairsPortable, &fused);
}

void Bf16RoutedEmulated(const uint16_t* x_bf16, int64_t m, const PackedMatrix& w,
                        int64_t panel_begin, int64_t panel_end, const AmxRoutedRows& rows) {
  Bf16PanelsBody<EmulatedTiles>(x_bf16, m, w, panel_begin, panel_end, nullptr, ConvertPairsPortable,
                                nullptr, &rows);
}

}  // namespace sy::kernels::amx_detail
