// A weight matrix re-laid out once at load time into the order the CPU kernels stream best —
// the CPU counterpart of the Huawei recipe's load-time weight layout.
//
// Rows are grouped into panels of kPanelRows output rows; inside a panel the layout is
// [cols][kPanelRows]: the kPanelRows weights of one input column are adjacent, so one vector load
// feeds kPanelRows outputs at once and a whole panel streams sequentially from memory. A partial
// last panel is zero-padded. fp8 stays fp8 (one byte per weight, the block scales kept per
// block); f16 is widened to f32 (rare in checkpoints); bf16 and f32 keep their type.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "tensor/matrix.h"

namespace sy {

inline constexpr int64_t kPanelRows = 16;
// int8 weights (PackInt8): columns per quantization group, and per unit of the panel layout.
inline constexpr int64_t kInt8GroupCols = 128;
inline constexpr int64_t kInt8QuadCols = 4;
// The largest int8 weight code. Seven bits, not eight: VPMADDUBSW multiplies unsigned
// activation bytes (up to 255) by signed weight bytes and saturates each pair's sum to int16,
// and 2 · 255 · 63 = 32130 is the most that never saturates.
inline constexpr int kInt8WeightMax = 63;

struct PackedMatrix {
  DType dtype = DType::kF32;  // kF8E4M3, kBF16, kF32, or kI8 (PackInt8)
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t panels = 0;
  // [panels][cols][kPanelRows] elements, 64-byte aligned.
  std::shared_ptr<uint8_t> data;
  // fp8: scales[row_block][col_block] with block_rows a multiple of kPanelRows.
  std::vector<float> scales;
  int64_t block_rows = 0;
  int64_t block_cols = 0;
  int64_t scale_cols = 0;
  // A column-range view (ColumnRange) keeps the full matrix's panel stride and scale columns.
  int64_t panel_stride = 0;      // columns between panels; 0 means `cols`
  int64_t scale_col_offset = 0;  // first scale column of the view
  // int8 (PackInt8): inside a panel the layout is [cols / 4][kPanelRows][4] — each row's four
  // adjacent columns side by side, what one VPMADDUBSW lane pair and VPMADDWD sum. Per panel,
  // group (kInt8GroupCols columns) and row: the f32 scale and 128 × the sum of the row's codes
  // in the group (the correction for activations stored as code + 128).
  std::vector<float> row_scales;     // [panels][groups][kPanelRows]
  std::vector<int32_t> row_offsets;  // [panels][groups][kPanelRows]
  int64_t groups = 0;

  size_t ElementBytes() const { return DTypeSize(dtype); }
  const uint8_t* Panel(int64_t panel) const {
    const int64_t stride = panel_stride ? panel_stride : cols;
    return data.get() + static_cast<size_t>(panel * stride * kPanelRows) * ElementBytes();
  }
  // The scale row of the block that holds `panel`, from the view's first column.
  const float* PanelScales(int64_t panel) const {
    return scales.data() + (panel * kPanelRows / block_rows) * scale_cols + scale_col_offset;
  }
  size_t Bytes() const { return static_cast<size_t>(panels * cols * kPanelRows) * ElementBytes(); }
  // Everything a product reads: the panels and every scale and offset beside them.
  double StoredBytes() const {
    return static_cast<double>(Bytes()) +
           4.0 * static_cast<double>(scales.size() + row_scales.size() + row_offsets.size());
  }
};

// Zeroed, 64-byte aligned memory for `bytes` of panels (huge pages from 2 MiB up): what Pack
// lays panels into, and what panels that arrive from another process are copied into.
std::shared_ptr<uint8_t> AllocatePanels(size_t bytes);

// Columns [begin, end) of a packed matrix, sharing its storage (split-K). For fp8, begin must
// fall on a scale-block boundary.
PackedMatrix ColumnRange(const PackedMatrix& m, int64_t begin, int64_t end);

// Whether `m` can be packed: fp8 blocks must hold whole panels (DeepSeek's 128 rows do).
bool CanPack(const Matrix& m);
// Re-lays out `m` (CanPack must hold). Parallel over panels.
std::shared_ptr<const PackedMatrix> Pack(const Matrix& m);

// How the loader packs fp8 and bf16 weights: as they are, or re-quantized to int8 (lossy,
// `--int8-products`; kernels/cpu/int8_gemm.h). Set once, before a model loads.
enum class WeightPacking : uint8_t { kExact, kInt8 };
WeightPacking& GlobalWeightPacking();

// Whether `m` can be re-quantized to int8: fp8 or bf16, columns a multiple of 4.
bool CanPackInt8(const Matrix& m);
// `m` as int8 codes of at most ±kInt8WeightMax, one f32 scale (max |w| / kInt8WeightMax) per row
// and group of kInt8GroupCols columns, codes rounded to nearest. Parallel over panels.
std::shared_ptr<const PackedMatrix> PackInt8(const Matrix& m);
// Pack or PackInt8, as GlobalWeightPacking() says for this matrix.
std::shared_ptr<const PackedMatrix> PackForLoad(const Matrix& m);

}  // namespace sy
