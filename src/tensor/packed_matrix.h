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

struct PackedMatrix {
  DType dtype = DType::kF32;  // kF8E4M3, kBF16 or kF32
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
};

// Columns [begin, end) of a packed matrix, sharing its storage (split-K). For fp8, begin must
// fall on a scale-block boundary.
PackedMatrix ColumnRange(const PackedMatrix& m, int64_t begin, int64_t end);

// Whether `m` can be packed: fp8 blocks must hold whole panels (DeepSeek's 128 rows do).
bool CanPack(const Matrix& m);
// Re-lays out `m` (CanPack must hold). Parallel over panels.
std::shared_ptr<const PackedMatrix> Pack(const Matrix& m);

}  // namespace sy
