#include "kernels/cpu/bf16_dot.h"

#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "kernels/cpu/bf16_pairs.h"
#include "kernels/cpu/isa_level.h"
#include "tensor/dtype.h"

namespace sy::kernels {

bool HasBf16Dot() {
#if defined(__x86_64__)
  static const bool has = __builtin_cpu_supports("avx512bf16") &&
                          __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("avx512vbmi");
  return has && IsaAllows(IsaLevel::kAvx512);
#else
  return false;
#endif
}

bool Bf16DotApplies(const PackedMatrix& w) {
  if (w.cols <= 0 || w.cols % 4 != 0) return false;
  if (w.dtype == DType::kF8E4M3) return w.block_cols > 0 && w.block_cols % 4 == 0;
  return w.dtype == DType::kBF16;
}

int64_t Bf16DotPanelUnit(int64_t m) {
  // Decode rows: four panels streamed side by side; more: the tiled kernel's groups of four
  // pairs.
  return m <= 2 ? 4 : 8;
}

#if defined(__x86_64__)

namespace {

constexpr int64_t kBf16Block = 128;  // columns per block for bf16 weights (fp8: the scale block)
constexpr int kMaxTileRows = 12;     // rows per GEMM-sized tile: 24 chains for a panel pair
// Software prefetch distance in each panel stream the conversion reads, in columns (32 columns =
// 512 bytes of fp8).
constexpr int64_t kPrefetchColumns = 64;

SY_DOT_TARGET inline __m512bh BroadcastPair(const uint16_t* x) {
  int32_t bits;
  std::memcpy(&bits, x, 4);
  return reinterpret_cast<__m512bh>(_mm512_set1_epi32(bits));
}

SY_DOT_TARGET inline __m512 Dot(__m512 chain, __m512bh x, __m512i w) {
  return _mm512_dpbf16_ps(chain, x, reinterpret_cast<__m512bh>(w));
}

inline float BlockScale(const PackedMatrix& w, const float* scales, int64_t column, bool fp8) {
  return fp8 ? scales[column / w.block_cols] : 1.0f;
}

inline __mmask16 ValidRows(const PackedMatrix& w, int64_t panel) {
  const int64_t valid = std::clamp<int64_t>(w.rows - panel * kPanelRows, 0, kPanelRows);
  return static_cast<__mmask16>((1u << valid) - 1);
}

// Columns c..c+3 of a panel as the operands (c, c+1) and (c+2, c+3): converted, or, for bf16
// weights laid out in pairs at load (PackedMatrix::bf16_pairs), the two vectors as stored.
template <bool kFp8, bool kPairs>
SY_DOT_TARGET inline void LoadQuad(const Converter& k, const uint8_t* panel, int64_t c,
                                   __m512i& first, __m512i& second) {
  if constexpr (kPairs) {
    const __m512i* pairs = reinterpret_cast<const __m512i*>(panel) + c / 2;
    first = _mm512_loadu_si512(pairs);
    second = _mm512_loadu_si512(pairs + 1);
  } else {
    ConvertQuad<kFp8>(k, panel, c, first, second);
  }
}

// One or two rows, memory-bound: kPanels panels streamed side by side (more misses in flight
// than one stream gets), weights converted in registers. No software prefetch: the hardware's
// stream prefetchers keep up with four sequential streams through huge pages, and a prefetch per
// quad cost bandwidth (Zen 4, one row, against the read probe in the same process: bf16 pairs
// 0.71-0.80 with it, 0.79-1.01 without; fp8 0.77-0.86 against 0.89-0.99).
template <bool kFp8, bool kPairs, int kPanels, int kRows>
SY_DOT_TARGET void StreamTile(const uint16_t* x, const PackedMatrix& w, int64_t panel, float* y) {
  const Converter k = MakeConverter();
  const uint8_t* base[kPanels];
  const float* scales[kPanels];
  for (int q = 0; q < kPanels; ++q) {
    base[q] = w.Panel(panel + q);
    scales[q] = kFp8 ? w.PanelScales(panel + q) : nullptr;
  }
  __m512 acc[kPanels][kRows];
  for (int q = 0; q < kPanels; ++q)
    for (int r = 0; r < kRows; ++r)
      acc[q][r] = _mm512_setzero_ps();
  const int64_t block = kFp8 ? w.block_cols : kBf16Block;
  for (int64_t b0 = 0; b0 < w.cols; b0 += block) {
    const int64_t b1 = std::min(w.cols, b0 + block);
    __m512 chain[kPanels][kRows];
    for (int q = 0; q < kPanels; ++q)
      for (int r = 0; r < kRows; ++r)
        chain[q][r] = _mm512_setzero_ps();
    for (int64_t c = b0; c < b1; c += 4) {
      __m512bh x01[kRows], x23[kRows];
      for (int r = 0; r < kRows; ++r) {
        x01[r] = BroadcastPair(x + r * w.cols + c);
        x23[r] = BroadcastPair(x + r * w.cols + c + 2);
      }
      for (int q = 0; q < kPanels; ++q) {
        __m512i w01, w23;
        LoadQuad<kFp8, kPairs>(k, base[q], c, w01, w23);
        for (int r = 0; r < kRows; ++r) {
          chain[q][r] = Dot(chain[q][r], x01[r], w01);
          chain[q][r] = Dot(chain[q][r], x23[r], w23);
        }
      }
    }
    for (int q = 0; q < kPanels; ++q) {
      const __m512 scale = _mm512_set1_ps(BlockScale(w, scales[q], b0, kFp8));
      for (int r = 0; r < kRows; ++r)
        acc[q][r] = _mm512_fmadd_ps(chain[q][r], scale, acc[q][r]);
    }
  }
  for (int q = 0; q < kPanels; ++q)
    for (int r = 0; r < kRows; ++r)
      _mm512_mask_storeu_ps(y + r * w.rows + (panel + q) * kPanelRows, ValidRows(w, panel + q),
                            acc[q][r]);
}

// Converts columns [k0, k1) of panels [first, end) (a group of pairs): pair g's operands start at
// scratch + g · stride, [(c - k0) / 2][panel of the pair]. The group's panels are walked side by
// side, column by column: one stream per panel keeps enough misses in flight (one stream alone
// reaches a fraction of a core's read rate).
template <bool kFp8>
SY_DOT_TARGET void ConvertGroup(const PackedMatrix& w, int64_t first, int64_t end, int64_t k0,
                                int64_t k1, __m512i* scratch, int64_t stride) {
  const Converter k = MakeConverter();
  constexpr int64_t kMostPanels = 2 * 4;
  const uint8_t* base[kMostPanels];
  const int64_t panels = end - first;
  for (int64_t q = 0; q < panels; ++q)
    base[q] = w.Panel(first + q);
  const int64_t element = kFp8 ? 1 : 2;
  for (int64_t c = k0; c < k1; c += 4) {
    for (int64_t q = 0; q < panels; ++q) {
      _mm_prefetch(
          reinterpret_cast<const char*>(base[q] + (c + kPrefetchColumns) * kPanelRows * element),
          _MM_HINT_T0);
      const int64_t g = q / 2, lane = q % 2;
      const int64_t width = std::min<int64_t>(2, panels - 2 * g);
      __m512i w01, w23;
      ConvertQuad<kFp8>(k, base[q], c, w01, w23);
      __m512i* pair = scratch + g * stride;
      _mm512_store_si512(pair + ((c - k0) / 2) * width + lane, w01);
      _mm512_store_si512(pair + ((c - k0) / 2 + 1) * width + lane, w23);
    }
  }
}

// The weights of the next column range, fetched into L2 while a tile computes on this one (one
// cache line per panel per column pair), so the next conversion does not wait on memory.
struct Prefetch {
  const uint8_t* panel[2] = {nullptr, nullptr};
  int64_t lines = 0;  // per panel
};

// Where a tile reads its panels' operands: for columns (c, c + 1), panel q's vector is
// base[((c - k0) / 2) · step + q · panel] (converted into scratch: step kPanels, panel 1; laid
// out in pairs at load: the panels themselves, step 1).
struct Operands {
  const __m512i* base;
  int64_t step, panel;
};

// kRows rows against kPanels panels' operands over columns [k0, k1) (whole scale blocks):
// acc[r · acc_stride + q · 16 + lane] carries each row's result from one column range to the
// next (zero before the first). Spilled between blocks, the arithmetic is StreamTile's.
template <int kRows, int kPanels>
SY_DOT_TARGET void ScratchTile(const uint16_t* x, const PackedMatrix& w, const Operands& operands,
                               int64_t k0, int64_t k1, const float* const* scales, float* acc,
                               int64_t acc_stride, const Prefetch& prefetch) {
  const bool fp8 = w.dtype == DType::kF8E4M3;
  const int64_t block = fp8 ? w.block_cols : kBf16Block;
  for (int64_t b0 = k0; b0 < k1; b0 += block) {
    const int64_t b1 = std::min(k1, b0 + block);
    __m512 chain[kRows][kPanels];
    for (int r = 0; r < kRows; ++r)
      for (int q = 0; q < kPanels; ++q)
        chain[r][q] = _mm512_setzero_ps();
    for (int64_t c = b0; c < b1; c += 2) {
      const int64_t step = (c - k0) / 2;
      if (step < prefetch.lines)
        for (int q = 0; q < kPanels; ++q)
          _mm_prefetch(reinterpret_cast<const char*>(prefetch.panel[q] + step * 64), _MM_HINT_T1);
      __m512i weights[kPanels];
      for (int q = 0; q < kPanels; ++q)
        weights[q] = _mm512_loadu_si512(operands.base + step * operands.step + q * operands.panel);
      for (int r = 0; r < kRows; ++r) {
        const __m512bh pair = BroadcastPair(x + r * w.cols + c);
        for (int q = 0; q < kPanels; ++q)
          chain[r][q] = Dot(chain[r][q], pair, weights[q]);
      }
    }
    for (int q = 0; q < kPanels; ++q) {
      const __m512 scale = _mm512_set1_ps(BlockScale(w, scales[q], b0, fp8));
      for (int r = 0; r < kRows; ++r) {
        float* out = acc + r * acc_stride + q * kPanelRows;
        _mm512_store_ps(out, _mm512_fmadd_ps(chain[r][q], scale, _mm512_load_ps(out)));
      }
    }
  }
}

// kRows rows against kPanels fp8 panels over columns [k0, k1), each quad of columns converted in
// registers as it is used: where one tile of rows covers the product, a converted range would be
// read once, so converting it into scratch first only stored and reloaded it, and kept the
// conversion from overlapping the tile's arithmetic. panel[q] points at panel q's column k0.
// ScratchTile's arithmetic to the bit: each chain sums its block's columns in order.
template <int kRows, int kPanels>
SY_DOT_TARGET void Fp8InRegistersTile(const uint16_t* x, const PackedMatrix& w,
                                      const uint8_t* const* panel, int64_t k0, int64_t k1,
                                      const float* const* scales, float* acc, int64_t acc_stride,
                                      const Prefetch& prefetch) {
  const Converter k = MakeConverter();
  for (int64_t b0 = k0; b0 < k1; b0 += w.block_cols) {
    const int64_t b1 = std::min(k1, b0 + w.block_cols);
    __m512 chain[kRows][kPanels];
    for (int r = 0; r < kRows; ++r)
      for (int q = 0; q < kPanels; ++q)
        chain[r][q] = _mm512_setzero_ps();
    for (int64_t c = b0; c < b1; c += 4) {
      const int64_t step = (c - k0) / 4;  // one 64-byte line of each panel per quad
      if (step < prefetch.lines)
        for (int q = 0; q < kPanels; ++q)
          _mm_prefetch(reinterpret_cast<const char*>(prefetch.panel[q] + step * 64), _MM_HINT_T1);
      __m512i w01[kPanels], w23[kPanels];
      for (int q = 0; q < kPanels; ++q)
        ConvertQuad<true>(k, panel[q], c - k0, w01[q], w23[q]);
      for (int r = 0; r < kRows; ++r) {
        const __m512bh x01 = BroadcastPair(x + r * w.cols + c);
        for (int q = 0; q < kPanels; ++q)
          chain[r][q] = Dot(chain[r][q], x01, w01[q]);
        const __m512bh x23 = BroadcastPair(x + r * w.cols + c + 2);
        for (int q = 0; q < kPanels; ++q)
          chain[r][q] = Dot(chain[r][q], x23, w23[q]);
      }
    }
    for (int q = 0; q < kPanels; ++q) {
      const __m512 scale = _mm512_set1_ps(scales[q][b0 / w.block_cols]);
      for (int r = 0; r < kRows; ++r) {
        float* out = acc + r * acc_stride + q * kPanelRows;
        _mm512_store_ps(out, _mm512_fmadd_ps(chain[r][q], scale, _mm512_load_ps(out)));
      }
    }
  }
}

// Products of up to this many rows convert fp8 weights in the tiles, each tile of rows again,
// rather than into scratch once a range (Zen 4, against the read probe in one process, a 768 ×
// 2048 expert matrix: 3 rows 1.47x, 8 rows 1.41x, 12 rows 1.35x, 16 rows 1.14x faster; 24 and
// 32 rows the same either way).
constexpr int64_t kFp8InRegistersRows = 16;
using Fp8InRegistersTileFn = void (*)(const uint16_t*, const PackedMatrix&, const uint8_t* const*,
                                      int64_t, int64_t, const float* const*, float*, int64_t,
                                      const Prefetch&);
template <int kPanels>
constexpr Fp8InRegistersTileFn kFp8InRegistersTiles[kMaxTileRows + 1] = {
    nullptr,
    Fp8InRegistersTile<1, kPanels>,
    Fp8InRegistersTile<2, kPanels>,
    Fp8InRegistersTile<3, kPanels>,
    Fp8InRegistersTile<4, kPanels>,
    Fp8InRegistersTile<5, kPanels>,
    Fp8InRegistersTile<6, kPanels>,
    Fp8InRegistersTile<7, kPanels>,
    Fp8InRegistersTile<8, kPanels>,
    Fp8InRegistersTile<9, kPanels>,
    Fp8InRegistersTile<10, kPanels>,
    Fp8InRegistersTile<11, kPanels>,
    Fp8InRegistersTile<12, kPanels>};

using ScratchTileFn = void (*)(const uint16_t*, const PackedMatrix&, const Operands&, int64_t,
                               int64_t, const float* const*, float*, int64_t, const Prefetch&);
template <int kPanels>
constexpr ScratchTileFn kScratchTiles[kMaxTileRows + 1] = {nullptr,
                                                           ScratchTile<1, kPanels>,
                                                           ScratchTile<2, kPanels>,
                                                           ScratchTile<3, kPanels>,
                                                           ScratchTile<4, kPanels>,
                                                           ScratchTile<5, kPanels>,
                                                           ScratchTile<6, kPanels>,
                                                           ScratchTile<7, kPanels>,
                                                           ScratchTile<8, kPanels>,
                                                           ScratchTile<9, kPanels>,
                                                           ScratchTile<10, kPanels>,
                                                           ScratchTile<11, kPanels>,
                                                           ScratchTile<12, kPanels>};

template <bool kFp8, bool kPairs, int kRows>
SY_DOT_TARGET void StreamPanels(const uint16_t* x, const PackedMatrix& w, int64_t panel_begin,
                                int64_t panel_end, float* y) {
  int64_t p = panel_begin;
  for (; p + 4 <= panel_end; p += 4)
    StreamTile<kFp8, kPairs, 4, kRows>(x, w, p, y);
  switch (panel_end - p) {
    case 3:
      StreamTile<kFp8, kPairs, 3, kRows>(x, w, p, y);
      break;
    case 2:
      StreamTile<kFp8, kPairs, 2, kRows>(x, w, p, y);
      break;
    case 1:
      StreamTile<kFp8, kPairs, 1, kRows>(x, w, p, y);
      break;
    default:
      break;
  }
}

// Three rows and more. Columns go in ranges that fit L1 once converted (kColumnRange: 32 KiB per
// panel pair), up to kMostPairs panel pairs at a time: each range of up to kMostPairs pairs is
// converted once, then every tile of 12 rows runs over it, its x columns reused by every pair.
// bf16 weights laid out in pairs at load (kPairs) are the operands already: the tiles read them
// in place, and the range, fetched into L2 while the range before it computes, is never copied
// (8 rows against a bf16 expert matrix on Zen 4: 0.70 of the read rate converted, 0.96 in
// place; 12 rows 1.3x, 32 rows 1.13x faster; the same bits).
constexpr int64_t kColumnRange = 512, kMostPairs = 4, kRowBlock = 192;

// The first column range of pair g of the group at panel `group` of w (up to `range` columns):
// what a tile fetches while it computes the last range of a group before it.
Prefetch FirstRange(const PackedMatrix& w, int64_t group, int64_t group_end, int64_t g,
                    int64_t range) {
  Prefetch fetch;
  const int64_t p = group + 2 * g;
  if (p >= group_end) return fetch;
  fetch.panel[0] = w.Panel(p);
  fetch.panel[1] = w.Panel(std::min(p + 1, group_end - 1));
  const int64_t element = w.dtype == DType::kF8E4M3 ? 1 : 2;
  fetch.lines = std::min(w.cols, range) * kPanelRows * element / 64;
  return fetch;
}

template <bool kFp8, bool kPairs>
SY_DOT_TARGET void TiledPanels(const uint16_t* x, int64_t m, const PackedMatrix& w,
                               int64_t panel_begin, int64_t panel_end, float* y,
                               const NextPanels& after) {
  const int64_t block = kFp8 ? w.block_cols : kBf16Block;
  const int64_t range = std::max<int64_t>(block, kColumnRange / block * block);
  const int64_t most_pairs = kMostPairs;
  thread_local std::vector<uint8_t> storage;
  storage.resize(static_cast<size_t>(most_pairs * range * 64 + 64));
  __m512i* const scratch = reinterpret_cast<__m512i*>(
      (reinterpret_cast<uintptr_t>(storage.data()) + 63) & ~static_cast<uintptr_t>(63));
  // Each row's results for the group's panels, carried across column ranges.
  thread_local std::vector<float> acc_storage;
  const int64_t acc_stride = kMostPairs * 2 * kPanelRows;
  acc_storage.resize(static_cast<size_t>(std::min(m, kRowBlock) * acc_stride + 16));
  float* const acc = reinterpret_cast<float*>(
      (reinterpret_cast<uintptr_t>(acc_storage.data()) + 63) & ~static_cast<uintptr_t>(63));
  const bool in_registers = kFp8 && m <= kFp8InRegistersRows;
  for (int64_t group = panel_begin; group < panel_end; group += 2 * most_pairs) {
    const int64_t group_end = std::min(panel_end, group + 2 * most_pairs);
    const int64_t pairs = (group_end - group + 1) / 2;
    const float* scales[kMostPairs][2];
    for (int64_t g = 0; g < pairs; ++g)
      for (int q = 0; q < 2; ++q) {
        const int64_t p = group + 2 * g + q;
        scales[g][q] = kFp8 && p < group_end ? w.PanelScales(p) : nullptr;
      }
    // Rows in blocks whose results stay in L2 across the column ranges (a prompt's 2,048 rows
    // would carry 1 MiB); each block converts the group again, a small cost against its rows.
    for (int64_t block0 = 0; block0 < m; block0 += kRowBlock) {
      const int64_t block_rows = std::min(kRowBlock, m - block0);
      std::fill_n(acc, block_rows * acc_stride, 0.0f);
      for (int64_t k0 = 0; k0 < w.cols; k0 += range) {
        const int64_t k1 = std::min(w.cols, k0 + range);
        if (!kPairs && !in_registers)
          ConvertGroup<kFp8>(w, group, group_end, k0, k1, scratch, range);
        for (int64_t r0 = 0; r0 < block_rows; r0 += kMaxTileRows) {
          const int64_t rows = std::min<int64_t>(kMaxTileRows, block_rows - r0);
          const uint16_t* xr = x + (block0 + r0) * w.cols;
          for (int64_t g = 0; g < pairs; ++g) {
            float* tile = acc + r0 * acc_stride + g * 2 * kPanelRows;
            const bool two = group + 2 * g + 1 < group_end;
            // The first tile of rows fetches the pair's next column range; on the last range
            // of the last row block, the first range of the next group's pair g, or of the
            // product that follows. Fetched while the tile computes, that range does not wait
            // on memory when it is converted: at 8 rows (a decode expert), 8-15% faster on a
            // bf16 expert down matrix (Zen 4).
            Prefetch next;
            if (r0 == 0 && k1 < w.cols) {
              const int64_t element = kFp8 ? 1 : 2;
              for (int q = 0; q < (two ? 2 : 1); ++q)
                next.panel[q] = w.Panel(group + 2 * g + q) + k1 * kPanelRows * element;
              next.lines = (std::min(w.cols, k1 + range) - k1) * kPanelRows * element / 64;
            } else if (r0 == 0 && k1 == w.cols && block0 + kRowBlock >= m) {
              const int64_t following = group + 2 * most_pairs;
              if (following < panel_end) {
                next = FirstRange(w, following, std::min(panel_end, following + 2 * most_pairs), g,
                                  range);
              } else if (after.w != nullptr) {
                next = FirstRange(*after.w, after.begin,
                                  std::min(after.end, after.begin + 2 * most_pairs), g, range);
              }
            }
            Operands operands{scratch + g * range, two ? 2 : 1, 1};
            if (kPairs) {
              const auto* first = reinterpret_cast<const __m512i*>(w.Panel(group + 2 * g));
              operands = {
                  first + k0 / 2, 1,
                  two ? reinterpret_cast<const __m512i*>(w.Panel(group + 2 * g + 1)) - first : 0};
            }
            if (in_registers) {
              const uint8_t* panels[2] = {
                  w.Panel(group + 2 * g) + k0 * kPanelRows,
                  two ? w.Panel(group + 2 * g + 1) + k0 * kPanelRows : nullptr};
              if (two) {
                kFp8InRegistersTiles<2>[rows](xr, w, panels, k0, k1, scales[g], tile, acc_stride,
                                              next);
              } else {
                kFp8InRegistersTiles<1>[rows](xr, w, panels, k0, k1, scales[g], tile, acc_stride,
                                              next);
              }
              continue;
            }
            if (two) {
              kScratchTiles<2>[rows](xr, w, operands, k0, k1, scales[g], tile, acc_stride, next);
            } else {
              kScratchTiles<1>[rows](xr, w, operands, k0, k1, scales[g], tile, acc_stride, next);
            }
          }
        }
      }
      const int64_t col0 = group * kPanelRows;
      const int64_t valid = std::min<int64_t>((group_end - group) * kPanelRows, w.rows - col0);
      for (int64_t r = 0; r < block_rows; ++r)
        std::memcpy(y + (block0 + r) * w.rows + col0, acc + r * acc_stride,
                    static_cast<size_t>(valid) * sizeof(float));
    }
  }
}

}  // namespace

SY_DOT_TARGET void ToBf16RowsForDot(const float* x, int64_t m, int64_t cols, uint16_t* out) {
  const int64_t total = m * cols;  // rows are contiguous on both sides
  int64_t i = 0;
  for (; i + 16 <= total; i += 16)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i),
                        reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(_mm512_loadu_ps(x + i))));
  if (i < total) {
    const __mmask16 mask = static_cast<__mmask16>((1u << (total - i)) - 1);
    const __m256bh half = _mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(mask, x + i));
    _mm256_mask_storeu_epi16(out + i, mask, reinterpret_cast<__m256i>(half));
  }
}

void Bf16DotPanels(const uint16_t* x_bf16, int64_t m, const PackedMatrix& w, int64_t panel_begin,
                   int64_t panel_end, float* y, const NextPanels& next) {
  if (m <= 0 || panel_begin >= panel_end) return;
  const bool fp8 = w.dtype == DType::kF8E4M3;
  const bool pairs = w.bf16_pairs;
  if (m <= 2) {
    if (fp8) {
      m == 1 ? StreamPanels<true, false, 1>(x_bf16, w, panel_begin, panel_end, y)
             : StreamPanels<true, false, 2>(x_bf16, w, panel_begin, panel_end, y);
    } else if (pairs) {
      m == 1 ? StreamPanels<false, true, 1>(x_bf16, w, panel_begin, panel_end, y)
             : StreamPanels<false, true, 2>(x_bf16, w, panel_begin, panel_end, y);
    } else {
      m == 1 ? StreamPanels<false, false, 1>(x_bf16, w, panel_begin, panel_end, y)
             : StreamPanels<false, false, 2>(x_bf16, w, panel_begin, panel_end, y);
    }
    return;
  }
  if (fp8) {
    TiledPanels<true, false>(x_bf16, m, w, panel_begin, panel_end, y, next);
  } else if (pairs) {
    TiledPanels<false, true>(x_bf16, m, w, panel_begin, panel_end, y, next);
  } else {
    TiledPanels<false, false>(x_bf16, m, w, panel_begin, panel_end, y, next);
  }
}

#else
void ToBf16RowsForDot(const float*, int64_t, int64_t, uint16_t*) {}
void Bf16DotPanels(const uint16_t*, int64_t, const PackedMatrix&, int64_t, int64_t, float*,
                   const NextPanels&) {}
#endif

}  // namespace sy::kernels
