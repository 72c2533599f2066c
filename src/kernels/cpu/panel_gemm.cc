#include "kernels/cpu/panel_gemm.h"

#include <algorithm>
#include <cstring>
#include <vector>

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/panel_gemm.cc"
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
    PanelGemmTyped<kType, 2>(x, m, w, begin, end, y);
  else if (vectors == 4)
    PanelGemmTyped<kType, 4>(x, m, w, begin, end, y);
  else
    PanelGemmTyped<kType, 16>(x, m, w, begin, end, y);
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
