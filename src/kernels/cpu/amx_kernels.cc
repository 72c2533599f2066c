#include "kernels/cpu/amx_kernels.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "kernels/cpu/amx_tiles.h"
#include "kernels/cpu/fast_linear.h"
#include "kernels/cpu/int8_gemm.h"
#include "kernels/cpu/isa_level.h"
#include "tensor/dtype.h"
#include "tensor/ggml_quants.h"

namespace sy::kernels {

AmxBackend ActiveAmxBackend() {
  if (AmxAllowed()) return AmxBackend::kHardware;
  static const bool emulate = [] {
    const char* value = std::getenv("SWITCHYARD_AMX_EMULATE");
    return value != nullptr && std::strcmp(value, "1") == 0;
  }();
  return emulate ? AmxBackend::kEmulated : AmxBackend::kNone;
}

const char* AmxBackendName(AmxBackend backend) {
  switch (backend) {
    case AmxBackend::kHardware:
      return "hardware";
    case AmxBackend::kEmulated:
      return "emulated";
    case AmxBackend::kNone:
      break;
  }
  return "none";
}

bool AmxInt8Applies(const PackedMatrix& w) {
  return w.dtype == DType::kI8 && w.cols > 0 && w.cols % 64 == 0;
}

void AmxInt8Panels(AmxBackend backend, const uint8_t* codes, int64_t stride, const float* scales,
                   int64_t m, const PackedMatrix& w, int64_t panel_begin, int64_t panel_end,
                   float* y) {
  if (backend == AmxBackend::kHardware) {
    amx_detail::Int8PanelsHardware(codes, stride, scales, m, w, panel_begin, panel_end, y);
  } else {
    amx_detail::Int8PanelsEmulated(codes, stride, scales, m, w, panel_begin, panel_end, y);
  }
}

namespace {

// Whether `gives_the_bits` held on `backend`, asked once per backend; a warning where not.
template <typename Check>
bool CheckedOnce(AmxBackend backend, const char* kernel, Check gives_the_bits) {
  auto check = [&](AmxBackend b) {
    if (gives_the_bits(b)) return true;
    std::fprintf(stderr,
                 "warning: the AMX %s kernel (%s) disagreed with the portable kernel on its "
                 "check; not using it\n",
                 kernel, AmxBackendName(b));
    return false;
  };
  if (backend == AmxBackend::kHardware) {
    static const bool ok = check(AmxBackend::kHardware);
    return ok;
  }
  static const bool ok = check(AmxBackend::kEmulated);
  return ok;
}

std::atomic<bool> amx_int8_enabled{true};

// A product that crosses every case of the kernel — three panels, the last partial; a full
// group of 128 columns and a short one of 64; 37 rows, tiles of two heights (13, 12, 12) — on
// codes spanning their whole range: the AMX kernel must give the portable kernel's bits. Built
// by hand, without the thread pool: the first product to ask may be running on a pool worker.
bool AmxInt8GivesThePortableBits(AmxBackend backend) {
  constexpr int64_t kRows = 40, kCols = 192, kM = 37, kStride = 192 + 64;
  uint32_t seed = 2024;
  auto next = [&] { return seed = seed * 1664525u + 1013904223u, seed >> 8; };
  PackedMatrix w;
  w.dtype = DType::kI8;
  w.rows = kRows;
  w.cols = kCols;
  w.panels = (kRows + kPanelRows - 1) / kPanelRows;
  w.groups = (kCols + kInt8GroupCols - 1) / kInt8GroupCols;
  const size_t codes = static_cast<size_t>(w.panels * kCols * kPanelRows);
  w.data = AllocatePanels(codes);
  for (size_t i = 0; i < codes; ++i)
    w.data.get()[i] = static_cast<uint8_t>(static_cast<int>(next() % 127) - kInt8WeightMax);
  w.row_scales.resize(static_cast<size_t>(w.panels * w.groups * kPanelRows));
  w.row_offsets.resize(w.row_scales.size());
  for (size_t i = 0; i < w.row_scales.size(); ++i) {
    w.row_scales[i] = static_cast<float>(next() % 1000 + 1) * 1e-3f;
    w.row_offsets[i] = static_cast<int32_t>(next() % 20000) - 10000;
  }
  std::vector<uint8_t> x(static_cast<size_t>(kM * kStride));
  for (auto& v : x)
    v = static_cast<uint8_t>(1 + next() % 255);
  std::vector<float> x_scales(static_cast<size_t>(kM * w.groups));
  for (auto& v : x_scales)
    v = static_cast<float>(next() % 1000 + 1) * 1e-4f;
  std::vector<float> want(static_cast<size_t>(kM * kRows)), got(want.size(), -1.0f);
  Int8PanelsOn(Int8Kernel::kPortable, x.data(), kStride, x_scales.data(), kM, w, 0, w.panels,
               want.data());
  AmxInt8Panels(backend, x.data(), kStride, x_scales.data(), kM, w, 0, w.panels, got.data());
  return std::memcmp(want.data(), got.data(), want.size() * sizeof(float)) == 0;
}

}  // namespace

bool UseAmxInt8(int64_t m, const PackedMatrix& w) {
  if (m < kAmxInt8MinRows || !amx_int8_enabled.load(std::memory_order_relaxed) ||
      !AmxInt8Applies(w))
    return false;
  const AmxBackend backend = ActiveAmxBackend();
  return backend != AmxBackend::kNone &&
         CheckedOnce(backend, "int8", [](AmxBackend b) { return AmxInt8GivesThePortableBits(b); });
}

void EnableAmxInt8(bool enabled) {
  amx_int8_enabled.store(enabled, std::memory_order_relaxed);
}

bool AmxGgmlApplies(const PackedMatrix& w) {
  return w.dtype == DType::kGgml && w.sub_cols > 0 && w.sub_cols % 4 == 0 &&
         (w.sub_cols <= kAmxMaxColsBytes || w.sub_cols % kAmxMaxColsBytes == 0) &&
         w.super_cols % w.sub_cols == 0 &&
         (w.code_bits == 4 || w.code_bits == 6 || w.code_bits == 8);
}

void AmxGgmlPanels(AmxBackend backend, const Q8Rows& x, int64_t first, int64_t m,
                   const PackedMatrix& w, int64_t panel_begin, int64_t panel_end, float* y) {
  if (backend == AmxBackend::kHardware) {
    amx_detail::GgmlPanelsHardware(x, first, m, w, panel_begin, panel_end, y);
  } else {
    amx_detail::GgmlPanelsEmulated(x, first, m, w, panel_begin, panel_end, y);
  }
}

namespace {

// Off unless asked for (SWITCHYARD_AMX_GGML=1, or EnableAmxGgml): measured on an Intel Xeon with
// AMX (2 cores, 2026-12-05, docs/benchmarks.md), the tile kernel made a Q4_K_M model's 32-sequence
// decode 3.3x slower and its prefill 5x slower than the AVX-512 VNNI kernel. It spends one
// TDPBSUD of 16 or 32 columns per sub-block and then stores and recombines the sums, so the tiles
// wait on each other; the vector kernel keeps its sums in registers. The bits are the same.
std::atomic<bool> amx_ggml_enabled{[] {
  const char* value = std::getenv("SWITCHYARD_AMX_GGML");
  return value != nullptr && std::strcmp(value, "1") == 0;
}()};

// As AmxInt8GivesThePortableBits, for one GGML type's panel layout: 40 rows (the last panel
// partial) and two blocks of random codes, scales and minimums; 37 rows of activations.
bool AmxGgmlGivesThePortableBits(AmxBackend backend, GgmlType type) {
  constexpr int64_t kRows = 40, kM = 37;
  uint32_t seed = 99 + static_cast<uint32_t>(type);
  auto next = [&] { return seed = seed * 1664525u + 1013904223u, seed >> 8; };
  PackedMatrix w;
  w.dtype = DType::kGgml;
  if (!SetGgmlPanelLayout(type, w)) return false;
  w.rows = kRows;
  w.cols = 2 * w.super_cols;
  w.panels = (kRows + kPanelRows - 1) / kPanelRows;
  const int64_t subs = w.cols / w.sub_cols, blocks = w.cols / w.super_cols;
  const size_t bytes = static_cast<size_t>(w.panels * w.cols) * w.PanelColumnBytes();
  w.data = AllocatePanels(bytes);
  for (size_t i = 0; i < bytes; ++i)
    w.data.get()[i] = static_cast<uint8_t>(next());
  auto half = [&] {
    return F32ToF16(static_cast<float>(static_cast<int>(next() % 2001) - 1000) * 1e-5f);
  };
  const size_t per_sub = static_cast<size_t>(w.panels * subs * kPanelRows);
  const size_t per_block = static_cast<size_t>(w.panels * blocks * kPanelRows);
  if (!w.unit_scales) {
    for (size_t i = 0; i < per_sub; ++i)
      w.sub_scales.push_back(static_cast<int8_t>(next() % 64));
    if (!w.shared_d)
      for (size_t i = 0; i < per_sub; ++i)
        w.sub_mins.push_back(static_cast<int8_t>(next() % 64));
  }
  for (size_t i = 0; i < per_block; ++i)
    w.super_d.push_back(half());
  if (!w.shared_d)
    for (size_t i = 0; i < per_block; ++i)
      w.super_dmin.push_back(half());
  Q8Rows x;
  x.cols = w.cols;
  x.stride = w.cols + 64;
  x.block_cols = w.super_cols;
  x.sub_cols = w.sub_cols;
  x.blocks = blocks;
  x.subs = subs;
  x.offset = Q8Rows::ActivationOffset(w);
  x.codes.resize(static_cast<size_t>(kM * x.stride));
  for (auto& v : x.codes)
    v = static_cast<int8_t>(static_cast<int>(next() % 255) - 127);
  for (int64_t i = 0; i < kM * blocks; ++i)
    x.scales.push_back(static_cast<float>(next() % 1000 + 1) * 1e-4f);
  for (int64_t i = 0; i < kM * subs; ++i)
    x.sums.push_back(static_cast<int32_t>(next() % 8001) - 4000);
  std::vector<float> want(static_cast<size_t>(kM * kRows)), got(want.size(), -1.0f);
  GgmlPanelsOn(GgmlKernel::kPortable, x, 0, kM, w, 0, w.panels, want.data());
  AmxGgmlPanels(backend, x, 0, kM, w, 0, w.panels, got.data());
  return std::memcmp(want.data(), got.data(), want.size() * sizeof(float)) == 0;
}

}  // namespace

bool UseAmxGgml(int64_t m, const PackedMatrix& w) {
  if (m < kAmxInt8MinRows || !amx_ggml_enabled.load(std::memory_order_relaxed) ||
      !AmxGgmlApplies(w))
    return false;
  const AmxBackend backend = ActiveAmxBackend();
  return backend != AmxBackend::kNone && CheckedOnce(backend, "GGML", [](AmxBackend b) {
           // 4-bit codes with separate minimums, 6-bit with a shared offset, bytes, and HF int4's
           // 128-column groups (two multiplies a group).
           return AmxGgmlGivesThePortableBits(b, GgmlType::kQ4_K) &&
                  AmxGgmlGivesThePortableBits(b, GgmlType::kHfInt4) &&
                  AmxGgmlGivesThePortableBits(b, GgmlType::kQ6_K) &&
                  AmxGgmlGivesThePortableBits(b, GgmlType::kQ8_0);
         });
}

void EnableAmxGgml(bool enabled) {
  amx_ggml_enabled.store(enabled, std::memory_order_relaxed);
}

bool AmxBf16Applies(const PackedMatrix& w) {
  if (w.cols <= 0 || w.cols % 32 != 0) return false;
  if (w.dtype == DType::kF8E4M3) return w.block_cols > 0 && w.block_cols % 32 == 0;
  return w.dtype == DType::kBF16;
}

void AmxToBf16Rows(AmxBackend backend, const float* x, int64_t m, int64_t cols, uint16_t* out) {
  const int64_t stride = AmxBf16RowStride(cols);
  // The rows past m, which tile loads read (a row's own padding past cols is never read).
  std::fill(out + m * stride, out + AmxBf16Elements(m, cols), uint16_t{0});
  for (int64_t r = 0; r < m; ++r)
    AmxToBf16Row(backend, x + r * cols, cols, out + r * stride);
}

void AmxToBf16Row(AmxBackend backend, const float* x, int64_t cols, uint16_t* out) {
  if (backend == AmxBackend::kHardware) {
    amx_detail::ToBf16RowsHardware(x, 1, cols, out);
  } else {
    for (int64_t c = 0; c < cols; ++c)
      out[c] = F32ToBF16(x[c]);
  }
}

void AmxToBf16RowFanOut(AmxBackend backend, const float* x, int64_t cols, uint16_t* const* outs,
                        int64_t count) {
  if (backend == AmxBackend::kHardware) {
    amx_detail::ToBf16RowFanOutHardware(x, cols, outs, count);
  } else {
    for (int64_t i = 0; i < count; ++i)
      AmxToBf16Row(backend, x, cols, outs[i]);
  }
}

void AmxBf16Panels(AmxBackend backend, const uint16_t* x_bf16, int64_t m, const PackedMatrix& w,
                   int64_t panel_begin, int64_t panel_end, float* y) {
  if (backend == AmxBackend::kHardware) {
    amx_detail::Bf16PanelsHardware(x_bf16, m, w, panel_begin, panel_end, y);
  } else {
    amx_detail::Bf16PanelsEmulated(x_bf16, m, w, panel_begin, panel_end, y);
  }
}

bool AmxGateUpFuses(const PackedMatrix& gate, const PackedMatrix& up) {
  return AmxBf16Applies(gate) && gate.dtype == up.dtype && gate.bf16_pairs == up.bf16_pairs &&
         gate.rows == up.rows && gate.cols == up.cols &&
         (gate.dtype != DType::kF8E4M3 || gate.block_cols == up.block_cols);
}

void AmxBf16GateUpPanels(AmxBackend backend, const uint16_t* x_bf16, int64_t m,
                         const PackedMatrix& gate, const PackedMatrix& up, int64_t panel_begin,
                         int64_t panel_end, uint16_t* out) {
  if (backend == AmxBackend::kHardware) {
    amx_detail::Bf16GateUpHardware(x_bf16, m, gate, up, panel_begin, panel_end, out);
  } else {
    amx_detail::Bf16GateUpEmulated(x_bf16, m, gate, up, panel_begin, panel_end, out);
  }
}

void AmxBf16RoutedPanels(AmxBackend backend, const uint16_t* x_bf16, int64_t m,
                         const PackedMatrix& w, int64_t panel_begin, int64_t panel_end,
                         const AmxRoutedRows& rows) {
  if (backend == AmxBackend::kHardware) {
    amx_detail::Bf16RoutedHardware(x_bf16, m, w, panel_begin, panel_end, rows);
  } else {
    amx_detail::Bf16RoutedEmulated(x_bf16, m, w, panel_begin, panel_end, rows);
  }
}

bool UseAmxBf16(const PackedMatrix& w) {
  const bool tiles = GlobalKernelOptions().amx_bf16 && ActiveAmxBackend() != AmxBackend::kNone;
  // Panels of bf16 pairs are read by the tiles where they run, else by the AVX-512 BF16 dot
  // kernel where it runs; with neither (tests, `--max-isa` lowered after the weights were laid
  // out), AmxBf16Panels runs them on the emulator.
  if (w.bf16_pairs) return tiles || !UseBf16Dot(w);
  return tiles && AmxBf16Applies(w);
}

bool AmxMlaApplies(DType cache_dtype, int64_t latent, int64_t rope) {
  return (cache_dtype == DType::kBF16 || cache_dtype == DType::kF8E4M3) && latent > 0 &&
         latent % 16 == 0 && rope >= 0;
}

void AmxMlaDecode(AmxBackend backend, const float* q_latent, const float* q_pe, int64_t tokens,
                  const int64_t* positions, const LatentPages& cache, int64_t keys, int64_t heads,
                  int64_t head_begin, int64_t head_end, int64_t latent, int64_t rope,
                  float softmax_scale, float* o_latent) {
  if (backend == AmxBackend::kHardware) {
    amx_detail::MlaDecodeHardware(q_latent, q_pe, tokens, positions, cache, keys, heads, head_begin,
                                  head_end, latent, rope, softmax_scale, o_latent);
  } else {
    amx_detail::MlaDecodeEmulated(q_latent, q_pe, tokens, positions, cache, keys, heads, head_begin,
                                  head_end, latent, rope, softmax_scale, o_latent);
  }
}

bool UseAmxMla(DType cache_dtype, int64_t latent, int64_t rope) {
  return GlobalKernelOptions().amx_bf16 && AmxMlaApplies(cache_dtype, latent, rope) &&
         ActiveAmxBackend() != AmxBackend::kNone;
}

double AmxPeakLoop(AmxBackend backend, bool bf16, int64_t iterations) {
  return backend == AmxBackend::kHardware ? amx_detail::PeakLoopHardware(bf16, iterations)
                                          : amx_detail::PeakLoopEmulated(bf16, iterations);
}

}  // namespace sy::kernels
