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

  size_t ElementBytes() const { return DTypeSize(dtype); }
  const uint8_t* Panel(int64_t panel) const {
    return data.get() + static_cast<size_t>(panel * cols * kPanelRows) * ElementBytes();
  }
  // The scale row of the block that holds `panel`.
  const float* PanelScales(int64_t panel) const {
    return scales.data() + (panel * kPanelRows / block_rows) * scale_cols;
  }
  size_t Bytes() const { return static_cast<size_t>(panels * cols * kPanelRows) * ElementBytes(); }
};

// Whether `m` can be packed: fp8 blocks must hold whole panels (DeepSeek's 128 rows do).
bool CanPack(const Matrix& m);
// Re-lays out `m` (CanPack must hold). Parallel over panels.
std::shared_ptr<const PackedMatrix> Pack(const Matrix& m);

}  // namespace sy
