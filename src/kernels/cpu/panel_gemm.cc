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

// kPanelRows weights of column `col` starting at panel row `lane`, as f32 lanes.
template <DType kType>
HWY_INLINE hn::Vec<DF> LoadWeights(DF df, const uint8_t* panel, int64_t col, size_t lane) {
  if constexpr (kType == DType::kF8E4M3) {
    const hn::Rebind<uint8_t, DF> du8;
    const hn::Rebind<uint16_t, DF> du16;
    const hn::Rebind<hwy::float16_t, DF> df16;
    auto bytes = hn::PromoteTo(du16, hn::LoadU(du8, panel + col * kPanelRows + lane));
    // s eeee mmm -> s 0eeee mmm0000000 (f16): the same number divided by 2^8.
    auto bits = hn::Or(hn::ShiftLeft<8>(hn::And(bytes, hn::Set(du16, 0x80))),
                       hn::ShiftLeft<7>(hn::And(bytes, hn::Set(du16, 0x7f))));
    return hn::PromoteTo(df, hn::BitCast(df16, bits));
  } else if constexpr (kType == DType::kBF16) {
    const hn::Rebind<uint16_t, DF> du16;
    const hn::Rebind<uint32_t, DF> du32;
    auto halves = hn::LoadU(du16, reinterpret_cast<const uint16_t*>(panel) + col * kPanelRows + lane);
    return hn::BitCast(df, hn::ShiftLeft<16>(hn::PromoteTo(du32, halves)));
  } else {
    return hn::LoadU(df, reinterpret_cast<const float*>(panel) + col * kPanelRows + lane);
  }
}

// kVectors vectors of N lanes cover one panel; kTokens rows of x share every weight load.
template <DType kType, size_t kVectors, size_t kTokens>
HWY_NOINLINE void PanelTile(const float* x, int64_t x_stride, const PackedMatrix& w, int64_t panel,
                            float* out /* [kTokens][kPanelRows] */) {
  const DF df;
  const size_t N = hn::Lanes(df);
  const uint8_t* base = w.Panel(panel);
  hn::Vec<DF> acc[kTokens][kVectors];
  for (size_t t = 0; t < kTokens; ++t)
    for (size_t v = 0; v < kVectors; ++v) acc[t][v] = hn::Zero(df);
  // fp8 scales change every block_cols columns: accumulate each block apart, then scale it.
  const int64_t block = kType == DType::kF8E4M3 ? w.block_cols : w.cols;
  const float* scales = kType == DType::kF8E4M3 ? w.PanelScales(panel) : nullptr;
  for (int64_t begin = 0; begin < w.cols; begin += block) {
    const int64_t end = std::min(w.cols, begin + block);
    hn::Vec<DF> part[kTokens][kVectors];
    for (size_t t = 0; t < kTokens; ++t)
      for (size_t v = 0; v < kVectors; ++v) part[t][v] = hn::Zero(df);
    for (int64_t c = begin; c < end; ++c) {
      for (size_t v = 0; v < kVectors; ++v) {
        const auto weights = LoadWeights<kType>(df, base, c, v * N);
        for (size_t t = 0; t < kTokens; ++t)
          part[t][v] = hn::MulAdd(hn::Set(df, x[t * x_stride + c]), weights, part[t][v]);
      }
    }
    if constexpr (kType == DType::kF8E4M3) {
      const auto scale = hn::Set(df, scales[begin / block] * 256.0f);
      for (size_t t = 0; t < kTokens; ++t)
        for (size_t v = 0; v < kVectors; ++v) acc[t][v] = hn::MulAdd(part[t][v], scale, acc[t][v]);
    } else {
      for (size_t t = 0; t < kTokens; ++t)
        for (size_t v = 0; v < kVectors; ++v) acc[t][v] = hn::Add(part[t][v], acc[t][v]);
    }
  }
  for (size_t t = 0; t < kTokens; ++t)
    for (size_t v = 0; v < kVectors; ++v) hn::StoreU(acc[t][v], df, out + t * kPanelRows + v * N);
}

template <DType kType, size_t kVectors>
void PanelGemmTyped(const float* x, int64_t m, const PackedMatrix& w, int64_t panel_begin,
                    int64_t panel_end, float* y) {
  constexpr size_t kTokens = 4;
  HWY_ALIGN float tile[kTokens * kPanelRows];
  for (int64_t panel = panel_begin; panel < panel_end; ++panel) {
    const int64_t row0 = panel * kPanelRows;
    const int64_t valid = std::min<int64_t>(kPanelRows, w.rows - row0);
    for (int64_t t0 = 0; t0 < m; t0 += kTokens) {
      const int64_t count = std::min<int64_t>(kTokens, m - t0);
      const float* xt = x + t0 * w.cols;
      switch (count) {
        case 4: PanelTile<kType, kVectors, 4>(xt, w.cols, w, panel, tile); break;
        case 3: PanelTile<kType, kVectors, 3>(xt, w.cols, w, panel, tile); break;
        case 2: PanelTile<kType, kVectors, 2>(xt, w.cols, w, panel, tile); break;
        default: PanelTile<kType, kVectors, 1>(xt, w.cols, w, panel, tile); break;
      }
      for (int64_t t = 0; t < count; ++t)
        std::memcpy(y + (t0 + t) * w.rows + row0, tile + t * kPanelRows, static_cast<size_t>(valid) * sizeof(float));
    }
  }
}

template <DType kType>
void PanelGemmForType(const float* x, int64_t m, const PackedMatrix& w, int64_t begin, int64_t end, float* y) {
  const size_t vectors = kPanelRows / hn::Lanes(DF());
  if (vectors == 1) PanelGemmTyped<kType, 1>(x, m, w, begin, end, y);
  else if (vectors == 2) PanelGemmTyped<kType, 2>(x, m, w, begin, end, y);
  else if (vectors == 4) PanelGemmTyped<kType, 4>(x, m, w, begin, end, y);
  else PanelGemmTyped<kType, 16>(x, m, w, begin, end, y);
}

void PanelGemmImpl(const float* x, int64_t m, const PackedMatrix& w, int64_t begin, int64_t end, float* y) {
  switch (w.dtype) {
    case DType::kF8E4M3: PanelGemmForType<DType::kF8E4M3>(x, m, w, begin, end, y); break;
    case DType::kBF16: PanelGemmForType<DType::kBF16>(x, m, w, begin, end, y); break;
    default: PanelGemmForType<DType::kF32>(x, m, w, begin, end, y); break;
  }
}

}  // namespace sy::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace sy::kernels {

HWY_EXPORT(PanelGemmImpl);

void PanelGemm(const float* x, int64_t m, const PackedMatrix& w, int64_t panel_begin, int64_t panel_end,
               float* y) {
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
  for (int64_t target : hwy::SupportedAndGeneratedTargets()) targets.push_back(target);
  return targets;
}

const char* TargetName(int64_t target) { return hwy::TargetName(target); }

}  // namespace sy::kernels
#endif
