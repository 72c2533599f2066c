#include "kernels/cpu/panel_gemm.h"

#include <algorithm>
#include <cstring>
#include <type_traits>
#include <vector>

#include "kernels/cpu/row_tiles.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/panel_gemm.cc"
#include "hwy/cache_control.h"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace sy::kernels::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::CappedTag<float, kPanelRows>;

// Sign-extended e4m3 bytes (s eeee mmm) to f16 bits s 0eeee mmm0000000: the same number divided
// by 2^8 (the factor goes into the block scale). Shifting the sign-extended byte left by 7 puts
// the sign at bit 15 and a copy at bit 14, which the mask clears: three operations.
template <class DI16>
HWY_INLINE hn::Vec<DI16> Fp8ToF16Bits(DI16 di16, hn::Vec<DI16> sign_extended) {
  return hn::And(hn::ShiftLeft<7>(sign_extended), hn::Set(di16, static_cast<int16_t>(0xBF80)));
}

// kPanelRows weights of column `col` starting at panel row `lane`, as f32 lanes.
template <DType kType>
HWY_INLINE hn::Vec<DF> LoadWeights(DF df, const uint8_t* panel, int64_t col, size_t lane) {
  if constexpr (kType == DType::kF8E4M3) {
    const hn::Rebind<int8_t, DF> di8;
    const hn::Rebind<int16_t, DF> di16;
    const hn::Rebind<hwy::float16_t, DF> df16;
    return hn::PromoteTo(
        df, hn::BitCast(
                df16,
                Fp8ToF16Bits(di16, hn::PromoteTo(
                                       di16, hn::LoadU(di8, reinterpret_cast<const int8_t*>(panel) +
                                                                col * kPanelRows + lane)))));
  } else if constexpr (kType == DType::kBF16) {
    const hn::Rebind<uint16_t, DF> du16;
    const hn::Rebind<uint32_t, DF> du32;
    auto halves =
        hn::LoadU(du16, reinterpret_cast<const uint16_t*>(panel) + col * kPanelRows + lane);
    return hn::BitCast(df, hn::ShiftLeft<16>(hn::PromoteTo(du32, halves)));
  } else {
    return hn::LoadU(df, reinterpret_cast<const float*>(panel) + col * kPanelRows + lane);
  }
}

#if HWY_TARGET != HWY_SCALAR
// Columns `col` and `col + 1` of a panel whose rows fill one vector (N == kPanelRows): fp8 is
// decoded 32 weights at a time, halving the decode work per weight.
template <DType kType>
HWY_INLINE void LoadWeightPair(DF df, const uint8_t* panel, int64_t col, hn::Vec<DF>& first,
                               hn::Vec<DF>& second) {
  if constexpr (kType == DType::kF8E4M3) {
    const hn::Repartition<int16_t, DF> di16;  // 2N lanes
    const hn::Rebind<int8_t, decltype(di16)> di8;
    const hn::Repartition<hwy::float16_t, DF> df16;
    const hn::Half<decltype(df16)> dh;
    const auto bits = hn::BitCast(
        df16, Fp8ToF16Bits(
                  di16, hn::PromoteTo(di16, hn::LoadU(di8, reinterpret_cast<const int8_t*>(panel) +
                                                               col * kPanelRows))));
    first = hn::PromoteTo(df, hn::LowerHalf(dh, bits));
    second = hn::PromoteTo(df, hn::UpperHalf(dh, bits));
  } else {
    first = LoadWeights<kType>(df, panel, col, 0);
    second = LoadWeights<kType>(df, panel, col + 1, 0);
  }
}
#define SY_HAVE_PAIR_LOADS 1
#else
#define SY_HAVE_PAIR_LOADS 0
#endif

// kVectors vectors of N lanes cover one panel; kTokens rows of x share every weight load. With
// few tokens, kUnroll independent accumulator sets over the columns keep enough multiply-adds
// in flight to hide their latency (one chain per register would run at a quarter speed).
// With one vector per panel row (AVX-512) every tile sums even and odd columns apart, as
// PanelQuadTile does: a row's result is then the same whatever the number of rows beside it,
// so decoding does not depend on the batch and a recomputed prompt gets decode's exact rows.
template <DType kType, size_t kVectors, size_t kTokens>
HWY_NOINLINE void PanelTile(const float* x, int64_t x_stride, const PackedMatrix& w, int64_t panel,
                            float* out /* [kTokens][kPanelRows] */) {
  constexpr size_t kUnroll =
      kVectors == 1 ? 2 : (kTokens * kVectors >= 4 ? 1 : 4 / (kTokens * kVectors));
  const DF df;
  const size_t N = hn::Lanes(df);
  const uint8_t* base = w.Panel(panel);
  hn::Vec<DF> acc[kTokens][kVectors];
#pragma GCC unroll 16
  for (size_t t = 0; t < kTokens; ++t)
#pragma GCC unroll 16
    for (size_t v = 0; v < kVectors; ++v)
      acc[t][v] = hn::Zero(df);
  // fp8 scales change every block_cols columns: accumulate each block apart, then scale it.
  const int64_t block = kType == DType::kF8E4M3 ? w.block_cols : w.cols;
  const float* scales = kType == DType::kF8E4M3 ? w.PanelScales(panel) : nullptr;
  for (int64_t begin = 0; begin < w.cols; begin += block) {
    const int64_t end = std::min(w.cols, begin + block);
    hn::Vec<DF> part[kUnroll][kTokens][kVectors];
#pragma GCC unroll 16
    for (size_t u = 0; u < kUnroll; ++u)
#pragma GCC unroll 16
      for (size_t t = 0; t < kTokens; ++t)
#pragma GCC unroll 16
        for (size_t v = 0; v < kVectors; ++v)
          part[u][t][v] = hn::Zero(df);
    int64_t c = begin;
    if constexpr (SY_HAVE_PAIR_LOADS && kVectors == 1 && kUnroll % 2 == 0) {
#if SY_HAVE_PAIR_LOADS
      for (; c + static_cast<int64_t>(kUnroll) <= end; c += kUnroll) {
#pragma GCC unroll 16
        for (size_t u = 0; u < kUnroll; u += 2) {
          hn::Vec<DF> w0, w1;
          LoadWeightPair<kType>(df, base, c + u, w0, w1);
#pragma GCC unroll 16
          for (size_t t = 0; t < kTokens; ++t) {
            part[u][t][0] = hn::MulAdd(hn::Set(df, x[t * x_stride + c + u]), w0, part[u][t][0]);
            part[u + 1][t][0] =
                hn::MulAdd(hn::Set(df, x[t * x_stride + c + u + 1]), w1, part[u + 1][t][0]);
          }
        }
      }
#endif
    } else {
      for (; c + static_cast<int64_t>(kUnroll) <= end; c += kUnroll) {
#pragma GCC unroll 16
        for (size_t u = 0; u < kUnroll; ++u)
#pragma GCC unroll 16
          for (size_t v = 0; v < kVectors; ++v) {
            const auto weights = LoadWeights<kType>(df, base, c + u, v * N);
#pragma GCC unroll 16
            for (size_t t = 0; t < kTokens; ++t)
              part[u][t][v] =
                  hn::MulAdd(hn::Set(df, x[t * x_stride + c + u]), weights, part[u][t][v]);
          }
      }
    }
    for (; c < end; ++c)
#pragma GCC unroll 16
      for (size_t v = 0; v < kVectors; ++v) {
        const auto weights = LoadWeights<kType>(df, base, c, v * N);
#pragma GCC unroll 16
        for (size_t t = 0; t < kTokens; ++t)
          part[0][t][v] = hn::MulAdd(hn::Set(df, x[t * x_stride + c]), weights, part[0][t][v]);
      }
#pragma GCC unroll 16
    for (size_t u = 1; u < kUnroll; ++u)
#pragma GCC unroll 16
      for (size_t t = 0; t < kTokens; ++t)
#pragma GCC unroll 16
        for (size_t v = 0; v < kVectors; ++v)
          part[0][t][v] = hn::Add(part[0][t][v], part[u][t][v]);
    if constexpr (kType == DType::kF8E4M3) {
      const auto scale = hn::Set(df, scales[begin / block] * 256.0f);
#pragma GCC unroll 16
      for (size_t t = 0; t < kTokens; ++t)
#pragma GCC unroll 16
        for (size_t v = 0; v < kVectors; ++v)
          acc[t][v] = hn::MulAdd(part[0][t][v], scale, acc[t][v]);
    } else {
#pragma GCC unroll 16
      for (size_t t = 0; t < kTokens; ++t)
#pragma GCC unroll 16
        for (size_t v = 0; v < kVectors; ++v)
          acc[t][v] = hn::Add(part[0][t][v], acc[t][v]);
    }
  }
#pragma GCC unroll 16
  for (size_t t = 0; t < kTokens; ++t)
#pragma GCC unroll 16
    for (size_t v = 0; v < kVectors; ++v)
      hn::StoreU(acc[t][v], df, out + t * kPanelRows + v * N);
}

#if SY_HAVE_PAIR_LOADS
// Decode with one or two rows of x is memory-bound, and one core streaming a single panel while
// decoding it keeps too few cache misses in flight: measured here, one stream reaches 6.8 GB/s
// and four interleaved streams 11.7 GB/s, near the core's pure-read rate. So four panels are
// walked side by side. Needs one vector per panel row (N == kPanelRows).
template <DType kType, size_t kTokens>
HWY_NOINLINE void PanelQuadTile(const float* x, int64_t x_stride, const PackedMatrix& w,
                                int64_t panel, float* out /* [4][kTokens][kPanelRows] */) {
  constexpr int kPanels = 4;
  const DF df;
  const uint8_t* base[kPanels];
  const float* scales[kPanels];
  for (int q = 0; q < kPanels; ++q) {
    base[q] = w.Panel(panel + q);
    scales[q] = kType == DType::kF8E4M3 ? w.PanelScales(panel + q) : nullptr;
  }
  hn::Vec<DF> acc[kPanels][kTokens];
  for (int q = 0; q < kPanels; ++q)
    for (size_t t = 0; t < kTokens; ++t)
      acc[q][t] = hn::Zero(df);
  const int64_t block = kType == DType::kF8E4M3 ? w.block_cols : w.cols;
  for (int64_t begin = 0; begin < w.cols; begin += block) {
    const int64_t end = std::min(w.cols, begin + block);
    hn::Vec<DF> even[kPanels][kTokens], odd[kPanels][kTokens];
    for (int q = 0; q < kPanels; ++q)
      for (size_t t = 0; t < kTokens; ++t)
        even[q][t] = odd[q][t] = hn::Zero(df);
    int64_t c = begin;
    for (; c + 2 <= end; c += 2) {
      for (int q = 0; q < kPanels; ++q) {
        hn::Vec<DF> w0, w1;
        LoadWeightPair<kType>(df, base[q], c, w0, w1);
        for (size_t t = 0; t < kTokens; ++t) {
          even[q][t] = hn::MulAdd(hn::Set(df, x[t * x_stride + c]), w0, even[q][t]);
          odd[q][t] = hn::MulAdd(hn::Set(df, x[t * x_stride + c + 1]), w1, odd[q][t]);
        }
      }
    }
    for (; c < end; ++c)
      for (int q = 0; q < kPanels; ++q) {
        const auto w0 = LoadWeights<kType>(df, base[q], c, 0);
        for (size_t t = 0; t < kTokens; ++t)
          even[q][t] = hn::MulAdd(hn::Set(df, x[t * x_stride + c]), w0, even[q][t]);
      }
    for (int q = 0; q < kPanels; ++q) {
      const auto scale =
          hn::Set(df, kType == DType::kF8E4M3 ? scales[q][begin / block] * 256.0f : 1.0f);
      for (size_t t = 0; t < kTokens; ++t)
        acc[q][t] = hn::MulAdd(hn::Add(even[q][t], odd[q][t]), scale, acc[q][t]);
    }
  }
  for (int q = 0; q < kPanels; ++q)
    for (size_t t = 0; t < kTokens; ++t)
      hn::StoreU(acc[q][t], df, out + (q * kTokens + t) * kPanelRows);
}
#endif

// ---- Panels wider than one vector (AVX2, SSE4, NEON: kVectors = kPanelRows / N ≥ 2) ----
//
// Every row follows one order of arithmetic whatever the number of rows beside it: per output
// lane and scale block, one multiply-add chain over the block's columns in order from zero, then
// the chain times the block's scale added to the row's sum. A row's result is then the same bits
// at every batch size (decode does not depend on the batch; a recomputed prompt gets decode's
// exact rows). The independent chains that hide the multiply-add latency come from output
// vectors, rows and panels side by side, never from splitting a row's columns.

// One column's kVectors weight vectors. fp8 decodes 2N weights per conversion (one widening load
// of 2N bytes), halving the decode work per weight on targets with 16-bit lanes.
template <DType kType, size_t kVectors>
HWY_INLINE void LoadColumn(DF df, const uint8_t* panel, int64_t col, hn::Vec<DF>* out) {
#if HWY_TARGET != HWY_SCALAR
  if constexpr (kType == DType::kF8E4M3) {
    const hn::Repartition<int16_t, DF> di16;  // 2N lanes
    const hn::Rebind<int8_t, decltype(di16)> di8;
    const hn::Repartition<hwy::float16_t, DF> df16;
    const hn::Half<decltype(df16)> dh;
    const size_t N = hn::Lanes(df);
    const int8_t* column = reinterpret_cast<const int8_t*>(panel) + col * kPanelRows;
#pragma GCC unroll 16
    for (size_t v = 0; v < kVectors; v += 2) {
      const auto bits = hn::BitCast(
          df16, Fp8ToF16Bits(di16, hn::PromoteTo(di16, hn::LoadU(di8, column + v * N))));
      out[v] = hn::PromoteTo(df, hn::LowerHalf(dh, bits));
      out[v + 1] = hn::PromoteTo(df, hn::UpperHalf(dh, bits));
    }
    return;
  }
#endif
  const size_t N = hn::Lanes(df);
#pragma GCC unroll 16
  for (size_t v = 0; v < kVectors; ++v)
    out[v] = LoadWeights<kType>(df, panel, col, v * N);
}

// Adds a finished block's chains into the row sums in `sums` (memory: the sums change once per
// block, and keeping them out of registers leaves the registers to the chains).
template <DType kType, size_t kCount>
HWY_INLINE void FoldBlock(DF df, float scale, hn::Vec<DF>* chains, float* sums) {
  const size_t N = hn::Lanes(df);
  const auto factor = hn::Set(df, scale * 256.0f);
#pragma GCC unroll 16
  for (size_t i = 0; i < kCount; ++i) {
    const auto sum = hn::LoadU(df, sums + i * N);
    hn::StoreU(
        kType == DType::kF8E4M3 ? hn::MulAdd(chains[i], factor, sum) : hn::Add(chains[i], sum), df,
        sums + i * N);
    chains[i] = hn::Zero(df);
  }
}

// Few rows (decode): kPanels panels of kTokens rows walked side by side from packed memory,
// weights decoded in registers. Several panels keep several streams of cache misses in flight
// (one stream per core does not reach the core's read rate) and give the chains to hide latency.
// sums: [kPanels][kTokens][kPanelRows], zeroed by the caller.
template <DType kType, size_t kVectors, size_t kTokens, size_t kPanels>
HWY_NOINLINE void StreamPanels(const float* x, int64_t x_stride, const PackedMatrix& w,
                               int64_t panel, float* sums) {
  constexpr size_t kChains = kPanels * kTokens * kVectors;
  const DF df;
  const uint8_t* base[kPanels];
  const float* scales[kPanels];
  for (size_t q = 0; q < kPanels; ++q) {
    base[q] = w.Panel(panel + static_cast<int64_t>(q));
    scales[q] = kType == DType::kF8E4M3 ? w.PanelScales(panel + static_cast<int64_t>(q)) : nullptr;
  }
  constexpr int64_t kColumnBytes =
      kPanelRows * (kType == DType::kF8E4M3 ? 1 : (kType == DType::kBF16 ? 2 : 4));
  // fp8 and f32 weights are prefetched 2 KiB ahead in every stream. bf16 weights are not: the
  // hardware's stream prefetchers keep up with them through huge pages, and the prefetch cost
  // bandwidth (Zen 4 under --max-isa avx2, one row, against the read probe in one process: 0.75-
  // 0.80 of it with the prefetch, 0.87-0.90 without; fp8 0.66-0.72 with, 0.64-0.67 without).
  constexpr bool kPrefetch = kType != DType::kBF16;
  constexpr int64_t kAhead = 2048 / kColumnBytes;
  hn::Vec<DF> chains[kChains];
#pragma GCC unroll 64
  for (size_t i = 0; i < kChains; ++i)
    chains[i] = hn::Zero(df);
  const int64_t block = kType == DType::kF8E4M3 ? w.block_cols : w.cols;
  for (int64_t begin = 0; begin < w.cols; begin += block) {
    const int64_t end = std::min(w.cols, begin + block);
    for (int64_t c = begin; c < end; ++c) {
      if (kPrefetch && (c * kColumnBytes) % 64 == 0 && c + kAhead < w.cols) {
#pragma GCC unroll 16
        for (size_t q = 0; q < kPanels; ++q)
          hwy::Prefetch(base[q] + (c + kAhead) * kColumnBytes);
      }
#pragma GCC unroll 16
      for (size_t q = 0; q < kPanels; ++q) {
        hn::Vec<DF> weights[kVectors];
        LoadColumn<kType, kVectors>(df, base[q], c, weights);
#pragma GCC unroll 16
        for (size_t t = 0; t < kTokens; ++t) {
          const auto xv = hn::Set(df, x[static_cast<int64_t>(t) * x_stride + c]);
#pragma GCC unroll 16
          for (size_t v = 0; v < kVectors; ++v) {
            auto& chain = chains[(q * kTokens + t) * kVectors + v];
            chain = hn::MulAdd(xv, weights[v], chain);
          }
        }
      }
    }
#pragma GCC unroll 16
    for (size_t q = 0; q < kPanels; ++q)
      FoldBlock<kType, kTokens * kVectors>(
          df, kType == DType::kF8E4M3 ? scales[q][begin / block] : 1.0f,
          chains + q * kTokens * kVectors, sums + q * kTokens * kPanelRows);
  }
}

// Many rows: a range of a panel's columns is decoded once into f32 in L1 and shared by every row,
// so the decode cost per weight falls as 1/m and the inner loop is loads and multiply-adds.
constexpr int64_t kScratchColumns = 256;  // 16 KiB of f32: half of a 32 KiB L1

// kTokens rows over columns [begin, end) of one panel decoded in `scratch` (column c at
// (c - begin) * kPanelRows), continuing the chains and sums kept in `state` between ranges:
// state[t] = {chains [kPanelRows], sums [kPanelRows]}.
template <DType kType, size_t kVectors, size_t kTokens>
HWY_NOINLINE void ScratchTile(const float* x, int64_t x_stride, const PackedMatrix& w,
                              const float* panel_scales, const float* scratch, int64_t begin,
                              int64_t end, float* state) {
  constexpr size_t kChains = kTokens * kVectors;
  const DF df;
  const size_t N = hn::Lanes(df);
  hn::Vec<DF> chains[kChains];
#pragma GCC unroll 64
  for (size_t t = 0; t < kTokens; ++t)
#pragma GCC unroll 16
    for (size_t v = 0; v < kVectors; ++v)
      chains[t * kVectors + v] = hn::LoadU(df, state + t * 2 * kPanelRows + v * N);
  const int64_t block = kType == DType::kF8E4M3 ? w.block_cols : w.cols;
  for (int64_t c0 = begin; c0 < end;) {
    const int64_t block_end = (c0 / block + 1) * block;
    const int64_t c1 = std::min({end, block_end, w.cols});
    for (int64_t c = c0; c < c1; ++c) {
      const float* column = scratch + (c - begin) * kPanelRows;
      hn::Vec<DF> weights[kVectors];
#pragma GCC unroll 16
      for (size_t v = 0; v < kVectors; ++v)
        weights[v] = hn::Load(df, column + v * N);
#pragma GCC unroll 16
      for (size_t t = 0; t < kTokens; ++t) {
        const auto xv = hn::Set(df, x[static_cast<int64_t>(t) * x_stride + c]);
#pragma GCC unroll 16
        for (size_t v = 0; v < kVectors; ++v)
          chains[t * kVectors + v] = hn::MulAdd(xv, weights[v], chains[t * kVectors + v]);
      }
    }
    if (c1 == std::min(block_end, w.cols)) {  // the block is complete
      const float scale = kType == DType::kF8E4M3 ? panel_scales[c0 / block] : 1.0f;
#pragma GCC unroll 16
      for (size_t t = 0; t < kTokens; ++t)
        FoldBlock<kType, kVectors>(df, scale, chains + t * kVectors,
                                   state + t * 2 * kPanelRows + kPanelRows);
    }
    c0 = c1;
  }
#pragma GCC unroll 64
  for (size_t t = 0; t < kTokens; ++t)
#pragma GCC unroll 16
    for (size_t v = 0; v < kVectors; ++v)
      hn::StoreU(chains[t * kVectors + v], df, state + t * 2 * kPanelRows + v * N);
}

// Rows per scratch tile: as many as the registers hold as chains (12 of AVX2's 16), at least 1.
template <size_t kVectors>
constexpr size_t kScratchTokens = kVectors >= 12 ? 1 : 12 / kVectors;

template <DType kType, size_t kVectors, size_t kTokens = kScratchTokens<kVectors>>
void ScratchTile(int64_t count, const float* x, int64_t x_stride, const PackedMatrix& w,
                 const float* panel_scales, const float* scratch, int64_t begin, int64_t end,
                 float* state) {
  if constexpr (kTokens > 0) {
    if (count == static_cast<int64_t>(kTokens))
      return ScratchTile<kType, kVectors, kTokens>(x, x_stride, w, panel_scales, scratch, begin,
                                                   end, state);
    if constexpr (kTokens > 1)
      ScratchTile<kType, kVectors, kTokens - 1>(count, x, x_stride, w, panel_scales, scratch, begin,
                                                end, state);
  }
}

// All m rows over one decoded range, in tiles of near-equal size (8 rows: 4 + 4, not 6 + 2,
// whose second tile would have too few chains to hide the latency).
template <DType kType, size_t kVectors>
void ScratchTiles(const float* x, int64_t m, const PackedMatrix& w, const float* panel_scales,
                  const float* scratch, int64_t begin, int64_t end, float* state) {
  ForEachRowTile(m, kScratchTokens<kVectors>, [&](int64_t, int64_t t0, int64_t count) {
    ScratchTile<kType, kVectors>(count, x + t0 * w.cols, w.cols, w, panel_scales, scratch, begin,
                                 end, state + t0 * 2 * kPanelRows);
  });
}

template <DType kType, size_t kVectors>
void ScratchPanels(const float* x, int64_t m, const PackedMatrix& w, int64_t panel_begin,
                   int64_t panel_end, float* y) {
  const DF df;
  HWY_ALIGN float scratch[kScratchColumns * kPanelRows];
  thread_local std::vector<float> state;
  state.resize(static_cast<size_t>(m * 2 * kPanelRows));
  for (int64_t panel = panel_begin; panel < panel_end; ++panel) {
    std::fill(state.begin(), state.end(), 0.0f);
    const uint8_t* base = w.Panel(panel);
    const float* panel_scales = kType == DType::kF8E4M3 ? w.PanelScales(panel) : nullptr;
    for (int64_t begin = 0; begin < w.cols; begin += kScratchColumns) {
      const int64_t end = std::min(w.cols, begin + kScratchColumns);
      for (int64_t c = begin; c < end; ++c) {
        hn::Vec<DF> weights[kVectors];
        LoadColumn<kType, kVectors>(df, base, c, weights);
#pragma GCC unroll 16
        for (size_t v = 0; v < kVectors; ++v)
          hn::Store(weights[v], df, scratch + (c - begin) * kPanelRows + v * hn::Lanes(df));
      }
      ScratchTiles<kType, kVectors>(x, m, w, panel_scales, scratch, begin, end, state.data());
    }
    const int64_t row0 = panel * kPanelRows;
    const int64_t valid = std::min<int64_t>(kPanelRows, w.rows - row0);
    for (int64_t t = 0; t < m; ++t)
      std::memcpy(y + t * w.rows + row0, state.data() + (t * 2 + 1) * kPanelRows,
                  static_cast<size_t>(valid) * sizeof(float));
  }
}

template <DType kType, size_t kVectors, size_t kTokens, size_t kPanels>
void StreamPanelRange(const float* x, int64_t m, const PackedMatrix& w, int64_t& panel,
                      int64_t panel_end, float* y) {
  HWY_ALIGN float sums[kPanels * kTokens * kPanelRows];
  for (; panel + static_cast<int64_t>(kPanels) <= panel_end; panel += kPanels) {
    std::fill(std::begin(sums), std::end(sums), 0.0f);
    StreamPanels<kType, kVectors, kTokens, kPanels>(x, w.cols, w, panel, sums);
    for (size_t q = 0; q < kPanels; ++q) {
      const int64_t row0 = (panel + static_cast<int64_t>(q)) * kPanelRows;
      const int64_t valid = std::min<int64_t>(kPanelRows, w.rows - row0);
      for (int64_t t = 0; t < m; ++t)
        std::memcpy(y + t * w.rows + row0, sums + (q * kTokens + t) * kPanelRows,
                    static_cast<size_t>(std::max<int64_t>(valid, 0)) * sizeof(float));
    }
  }
}

// Decode's rows (m ≤ kStreamRows) stream; more rows share decoded scratch. The panels per stream
// tile keep kPanels · m · kVectors chains within 12 registers, 4 panels at most.
constexpr int64_t kStreamRows = 4;

template <DType kType, size_t kVectors, size_t kTokens>
void StreamRows(const float* x, int64_t m, const PackedMatrix& w, int64_t panel_begin,
                int64_t panel_end, float* y) {
  constexpr size_t kChainsPerPanel = kTokens * kVectors;
  constexpr size_t kPanels = kChainsPerPanel * 4 <= 12 ? 4 : (kChainsPerPanel * 2 <= 12 ? 2 : 1);
  int64_t panel = panel_begin;
  StreamPanelRange<kType, kVectors, kTokens, kPanels>(x, m, w, panel, panel_end, y);
  if constexpr (kPanels > 1)
    StreamPanelRange<kType, kVectors, kTokens, 1>(x, m, w, panel, panel_end, y);
}

template <DType kType, size_t kVectors>
void WidePanelGemm(const float* x, int64_t m, const PackedMatrix& w, int64_t panel_begin,
                   int64_t panel_end, float* y) {
  switch (m) {
    case 1:
      return StreamRows<kType, kVectors, 1>(x, m, w, panel_begin, panel_end, y);
    case 2:
      return StreamRows<kType, kVectors, 2>(x, m, w, panel_begin, panel_end, y);
    case 3:
      return StreamRows<kType, kVectors, 3>(x, m, w, panel_begin, panel_end, y);
    case 4:
      return StreamRows<kType, kVectors, 4>(x, m, w, panel_begin, panel_end, y);
    default:
      return ScratchPanels<kType, kVectors>(x, m, w, panel_begin, panel_end, y);
  }
}

template <DType kType, size_t kVectors>
void PanelGemmTyped(const float* x, int64_t m, const PackedMatrix& w, int64_t panel_begin,
                    int64_t panel_end, float* y) {
  // Rows of x per tile: as many as the registers hold next to their partial sums.
  constexpr size_t kTokens = kVectors == 1 ? 8 : 4;
  HWY_ALIGN float tile[8 * kPanelRows];
#if SY_HAVE_PAIR_LOADS
  if constexpr (kVectors == 1) {
    if (m <= 2) {  // memory-bound decode: four panels side by side (see PanelQuadTile)
      for (; panel_begin + 4 <= panel_end; panel_begin += 4) {
        if (m == 1) {
          PanelQuadTile<kType, 1>(x, w.cols, w, panel_begin, tile);
        } else {
          PanelQuadTile<kType, 2>(x, w.cols, w, panel_begin, tile);
        }
        for (int q = 0; q < 4; ++q) {
          const int64_t row0 = (panel_begin + q) * kPanelRows;
          const int64_t valid = std::min<int64_t>(kPanelRows, w.rows - row0);
          for (int64_t t = 0; t < m; ++t)
            std::memcpy(y + t * w.rows + row0, tile + (q * m + t) * kPanelRows,
                        static_cast<size_t>(std::max<int64_t>(valid, 0)) * sizeof(float));
        }
      }
    }
  }
#endif
  for (int64_t panel = panel_begin; panel < panel_end; ++panel) {
    const int64_t row0 = panel * kPanelRows;
    const int64_t valid = std::min<int64_t>(kPanelRows, w.rows - row0);
    for (int64_t t0 = 0; t0 < m; t0 += kTokens) {
      const int64_t count = std::min<int64_t>(kTokens, m - t0);
      const float* xt = x + t0 * w.cols;
      if constexpr (kTokens == 8) {
        switch (count) {
          case 8:
            PanelTile<kType, kVectors, 8>(xt, w.cols, w, panel, tile);
            break;
          case 7:
            PanelTile<kType, kVectors, 7>(xt, w.cols, w, panel, tile);
            break;
          case 6:
            PanelTile<kType, kVectors, 6>(xt, w.cols, w, panel, tile);
            break;
          case 5:
            PanelTile<kType, kVectors, 5>(xt, w.cols, w, panel, tile);
            break;
          default:
            break;
        }
      }
      switch (count) {
        case 4:
          PanelTile<kType, kVectors, 4>(xt, w.cols, w, panel, tile);
          break;
        case 3:
          PanelTile<kType, kVectors, 3>(xt, w.cols, w, panel, tile);
          break;
        case 2:
          PanelTile<kType, kVectors, 2>(xt, w.cols, w, panel, tile);
          break;
        case 1:
          PanelTile<kType, kVectors, 1>(xt, w.cols, w, panel, tile);
          break;
        default:
          break;
      }
      for (int64_t t = 0; t < count; ++t)
        std::memcpy(y + (t0 + t) * w.rows + row0, tile + t * kPanelRows,
                    static_cast<size_t>(valid) * sizeof(float));
    }
  }
}

template <DType kType>
void PanelGemmForType(const float* x, int64_t m, const PackedMatrix& w, int64_t begin, int64_t end,
                      float* y) {
  const size_t vectors = kPanelRows / hn::Lanes(DF());
  if (vectors == 1)
    PanelGemmTyped<kType, 1>(x, m, w, begin, end, y);
  else if (vectors == 2)
    WidePanelGemm<kType, 2>(x, m, w, begin, end, y);
  else if (vectors == 4)
    WidePanelGemm<kType, 4>(x, m, w, begin, end, y);
  else
    WidePanelGemm<kType, 16>(x, m, w, begin, end, y);
}

void PanelGemmImpl(const float* x, int64_t m, const PackedMatrix& w, int64_t begin, int64_t end,
                   float* y) {
  switch (w.dtype) {
    case DType::kF8E4M3:
      PanelGemmForType<DType::kF8E4M3>(x, m, w, begin, end, y);
      break;
    case DType::kBF16:
      PanelGemmForType<DType::kBF16>(x, m, w, begin, end, y);
      break;
    default:
      PanelGemmForType<DType::kF32>(x, m, w, begin, end, y);
      break;
  }
}

// ---- Dequantization for a library's matmul (onednn_linear.cc) ----

// out = v rounded to the nearest bf16, ties to even (weights are finite).
HWY_INLINE void StoreBf16(DF df, hn::Vec<DF> v, uint16_t* out) {
  const hn::RebindToUnsigned<DF> du;
  const hn::RebindToSigned<DF> di;
  const hn::Rebind<uint16_t, DF> du16;
  const auto u = hn::BitCast(du, v);
  const auto odd = hn::And(hn::ShiftRight<16>(u), hn::Set(du, 1u));
  const auto top = hn::ShiftRight<16>(hn::Add(u, hn::Add(hn::Set(du, 0x7fffu), odd)));
  hn::StoreU(hn::DemoteTo(du16, hn::BitCast(di, top)), du16, out);
}

HWY_INLINE void StoreOut(DF df, hn::Vec<DF> v, float* out) {
  hn::StoreU(v, df, out);
}
HWY_INLINE void StoreOut(DF df, hn::Vec<DF> v, uint16_t* out) {
  StoreBf16(df, v, out);
}

// Panels [panel_begin, panel_end) as a row-major [cols][out_stride] block whose column j holds
// weight row row0 + j: fp8 times its block scale rounded once to f32 (as the reference kernel),
// then f32 or bf16.
template <DType kType, typename Out>
void DequantizeTyped(const PackedMatrix& w, int64_t panel_begin, int64_t panel_end, int64_t row0,
                     Out* out, int64_t out_stride) {
  const DF df;
  const size_t N = hn::Lanes(df);
  constexpr size_t kVectors = kPanelRows / hn::MaxLanes(DF());
  const int64_t block = kType == DType::kF8E4M3 ? w.block_cols : w.cols;
  HWY_ALIGN Out partial[kPanelRows];
  for (int64_t panel = panel_begin; panel < panel_end; ++panel) {
    const uint8_t* base = w.Panel(panel);
    const float* scales = kType == DType::kF8E4M3 ? w.PanelScales(panel) : nullptr;
    const int64_t first = panel * kPanelRows;
    const int64_t valid = std::min<int64_t>(kPanelRows, w.rows - first);
    Out* column_out = out + (first - row0);
    for (int64_t c = 0; c < w.cols; ++c, column_out += out_stride) {
      hn::Vec<DF> v[kVectors];
      if constexpr (kVectors == 1) {
        v[0] = LoadWeights<kType>(df, base, c, 0);
      } else {
        LoadColumn<kType, kVectors>(df, base, c, v);
      }
      const auto factor = hn::Set(df, kType == DType::kF8E4M3 ? scales[c / block] * 256.0f : 1.0f);
      Out* target = valid == kPanelRows ? column_out : partial;
#pragma GCC unroll 16
      for (size_t i = 0; i < kVectors; ++i)
        StoreOut(df, hn::Mul(v[i], factor), target + i * N);
      if (valid < kPanelRows) std::copy_n(partial, valid, column_out);
    }
  }
}

template <typename Out>
void DequantizePanelsImpl(const PackedMatrix& w, int64_t panel_begin, int64_t panel_end,
                          int64_t row0, Out* out, int64_t out_stride) {
  switch (w.dtype) {
    case DType::kF8E4M3:
      return DequantizeTyped<DType::kF8E4M3>(w, panel_begin, panel_end, row0, out, out_stride);
    case DType::kBF16:
      return DequantizeTyped<DType::kBF16>(w, panel_begin, panel_end, row0, out, out_stride);
    default:
      return DequantizeTyped<DType::kF32>(w, panel_begin, panel_end, row0, out, out_stride);
  }
}

void DequantizePanelsF32(const PackedMatrix& w, int64_t panel_begin, int64_t panel_end,
                         int64_t row0, float* out, int64_t out_stride) {
  DequantizePanelsImpl(w, panel_begin, panel_end, row0, out, out_stride);
}
void DequantizePanelsBf16(const PackedMatrix& w, int64_t panel_begin, int64_t panel_end,
                          int64_t row0, uint16_t* out, int64_t out_stride) {
  DequantizePanelsImpl(w, panel_begin, panel_end, row0, out, out_stride);
}

}  // namespace sy::kernels::HWY_NAMESPACE
#undef SY_HAVE_PAIR_LOADS
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace sy::kernels {

HWY_EXPORT(PanelGemmImpl);

void PanelGemm(const float* x, int64_t m, const PackedMatrix& w, int64_t panel_begin,
               int64_t panel_end, float* y) {
  HWY_DYNAMIC_DISPATCH(PanelGemmImpl)(x, m, w, panel_begin, panel_end, y);
}

HWY_EXPORT(DequantizePanelsF32);
HWY_EXPORT(DequantizePanelsBf16);

// Panels of bf16 pairs (PackedMatrix::bf16_pairs), one weight at a time: only a library's matmul
// (`--prefill-gemm` with `--amx-bf16`) and the bench read them this way, once per block.
template <typename Out>
static void DequantizePairs(const PackedMatrix& w, int64_t panel_begin, int64_t panel_end,
                            int64_t row0, Out* out, int64_t out_stride) {
  for (int64_t panel = panel_begin; panel < panel_end; ++panel) {
    const auto* base = reinterpret_cast<const uint16_t*>(w.Panel(panel));
    const int64_t first = panel * kPanelRows;
    const int64_t valid = std::min<int64_t>(kPanelRows, w.rows - first);
    for (int64_t c = 0; c < w.cols; ++c)
      for (int64_t r = 0; r < valid; ++r) {
        const uint16_t bits = base[Bf16PairIndex(r, c)];
        if constexpr (std::is_same_v<Out, float>) {
          out[c * out_stride + first + r - row0] = BF16ToF32(bits);
        } else {
          out[c * out_stride + first + r - row0] = bits;
        }
      }
  }
}

void DequantizePanels(const PackedMatrix& w, int64_t panel_begin, int64_t panel_end, int64_t row0,
                      float* out, int64_t out_stride) {
  if (w.bf16_pairs) return DequantizePairs(w, panel_begin, panel_end, row0, out, out_stride);
  HWY_DYNAMIC_DISPATCH(DequantizePanelsF32)(w, panel_begin, panel_end, row0, out, out_stride);
}
void DequantizePanels(const PackedMatrix& w, int64_t panel_begin, int64_t panel_end, int64_t row0,
                      uint16_t* out, int64_t out_stride) {
  if (w.bf16_pairs) return DequantizePairs(w, panel_begin, panel_end, row0, out, out_stride);
  HWY_DYNAMIC_DISPATCH(DequantizePanelsBf16)(w, panel_begin, panel_end, row0, out, out_stride);
}

void ForcePanelGemmTarget(int64_t target) {
  if (target == 0) {
    hwy::SetSupportedTargetsForTest(0);
  } else {
    hwy::SetSupportedTargetsForTest(target);
  }
  hwy::GetChosenTarget().Update(hwy::SupportedTargets());
}

std::vector<int64_t> PanelGemmTargets() {
  std::vector<int64_t> targets;
  for (int64_t target : hwy::SupportedAndGeneratedTargets())
    targets.push_back(target);
  return targets;
}

const char* TargetName(int64_t target) {
  return hwy::TargetName(target);
}

}  // namespace sy::kernels
#endif
