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

// The per-row scales of a packed matrix are a stream of their own beside the panels (Q4_K: 20
// bytes per 128 of codes), so they come from the same huge-page chunks while a PanelArenaScope
// lives, and from the heap otherwise (both 64-byte aligned).
void* AllocatePanelScales(size_t bytes);
void FreePanelScales(void* memory);

template <typename T>
struct PanelAllocator {
  using value_type = T;
  PanelAllocator() = default;
  template <typename U>
  PanelAllocator(const PanelAllocator<U>&) {}  // NOLINT: converting, as allocators are
  T* allocate(size_t n) { return static_cast<T*>(AllocatePanelScales(n * sizeof(T))); }
  void deallocate(T* memory, size_t) { FreePanelScales(memory); }
  friend bool operator==(const PanelAllocator&, const PanelAllocator&) { return true; }
  friend bool operator!=(const PanelAllocator&, const PanelAllocator&) { return false; }
};
template <typename T>
using PanelVector = std::vector<T, PanelAllocator<T>>;

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
  // bf16 panels whose columns come in pairs: inside a panel [cols / 2][kPanelRows][2], columns
  // 2k and 2k + 1 of a row side by side, so 32 columns of a panel are one TDPBF16PS weight tile
  // as it lies and the AMX kernel loads its tiles straight from the panels (no conversion per
  // product), and each pair of columns is one VDPBF16PS operand, which the AVX-512 BF16 dot
  // kernel (kernels/cpu/bf16_dot.h) reads in place. Bf16PairsWanted says when Pack lays them
  // out.
  bool bf16_pairs = false;
  // A column-range view (ColumnRange) keeps the full matrix's panel stride and scale columns.
  int64_t panel_stride = 0;      // columns between panels; 0 means `cols`
  int64_t scale_col_offset = 0;  // first scale column of the view
  // int8 (PackInt8): inside a panel the layout is [cols / 4][kPanelRows][4] — each row's four
  // adjacent columns side by side, what one VPMADDUBSW lane pair and VPMADDWD sum. Per panel,
  // group (kInt8GroupCols columns) and row: the f32 scale and 128 × the sum of the row's codes
  // in the group (the correction for activations stored as code + 128).
  PanelVector<float> row_scales;     // [panels][groups][kPanelRows]
  PanelVector<int32_t> row_offsets;  // [panels][groups][kPanelRows]
  int64_t groups = 0;
  // GGML blocks kept quantized (PackGgml, dtype kGgml), in the integer form of
  // tensor/ggml_quants.h: weight = d · sc · (q − offset) (shared_d) or d · sc · q − dmin · mn.
  // Codes (code_bits 4, 6 or 8) per panel:
  //   8: int8's layout, [cols / 4][kPanelRows][4] bytes;
  //   4: [cols / 8][kPanelRows][4] bytes, the low nibble of byte (k, r, b) column 8k + b, the
  //      high nibble column 8k + 4 + b (one 64-byte load, two masks, two VPDPBUSD);
  //   6: [cols / 16] groups of 192 bytes, one per 16 columns: the low four bits of the group's
  //      columns as 4 (two [kPanelRows][4] units, 128 bytes), then [kPanelRows][4] bytes of the
  //      top two: bits 2t, 2t + 1 of byte (r, b) are column 16g + 4t + b's. Interleaved, so a
  //      panel is one forward stream: low bits and top bits as two streams cols · 8 bytes apart
  //      read Q6_K from memory at 0.55-0.65x Q4_K's bytes per second on AMD Zen 4, interleaved
  //      at the same rate (one thread, 100 MB cycled; benchmarks.md, fifteenth session).
  // Per panel, sub-block (sub_cols) and row sc, and mn where not shared_d — none where
  // unit_scales (sc = 1, mn = 1); per panel, block (super_cols: 32 or 256) and row d and dmin,
  // IEEE half bits as the file has them (exact). Resident: the file's bits per weight, except 5-bit
  // codes, which take 6 (Q5_0, Q5_1, Q5_K).
  GgmlType ggml_type = GgmlType::kF32;
  int code_bits = 8;
  int64_t sub_cols = 0, super_cols = 0;
  bool shared_d = false, unit_scales = false;
  int ggml_offset = 0;
  PanelVector<int8_t> sub_scales;    // [panels][cols / sub_cols][kPanelRows]
  PanelVector<int8_t> sub_mins;      // [panels][cols / sub_cols][kPanelRows]
  PanelVector<uint16_t> super_d;     // [panels][cols / super_cols][kPanelRows]
  PanelVector<uint16_t> super_dmin;  // [panels][cols / super_cols][kPanelRows]

  size_t ElementBytes() const { return DTypeSize(dtype); }
  // Bytes of one panel's elements (codes) per column.
  size_t PanelColumnBytes() const {
    return dtype == DType::kGgml ? static_cast<size_t>(kPanelRows * code_bits / 8)
                                 : static_cast<size_t>(kPanelRows) * ElementBytes();
  }
  const uint8_t* Panel(int64_t panel) const {
    const int64_t stride = panel_stride ? panel_stride : cols;
    return data.get() + static_cast<size_t>(panel * stride) * PanelColumnBytes();
  }
  // The scale row of the block that holds `panel`, from the view's first column.
  const float* PanelScales(int64_t panel) const {
    return scales.data() + (panel * kPanelRows / block_rows) * scale_cols + scale_col_offset;
  }
  size_t Bytes() const { return static_cast<size_t>(panels * cols) * PanelColumnBytes(); }
  // Everything a product reads: the panels and every scale and offset beside them.
  double StoredBytes() const {
    return static_cast<double>(Bytes()) +
           4.0 * static_cast<double>(scales.size() + row_scales.size() + row_offsets.size()) +
           static_cast<double>(sub_scales.size() + sub_mins.size()) +
           2.0 * static_cast<double>(super_d.size() + super_dmin.size());
  }
};

// Zeroed, 64-byte aligned memory for `bytes` of panels: what Pack lays panels into, and what
// panels that arrive from another process are copied into. From 2 MiB up a matrix is mapped on
// its own in huge pages; a smaller one comes from shared huge-page chunks while a
// PanelArenaScope lives (a model's load), else from the heap.
std::shared_ptr<uint8_t> AllocatePanels(size_t bytes);

// While one lives (any thread), matrices under 2 MiB are packed side by side into 64 MiB chunks
// of huge pages instead of each into its own 4 KiB pages: a decode step of a small model (the
// bench model's experts are under 1 MB each) otherwise streams most of its weights through
// 4 KiB TLB entries, one page walk every 64 cache lines. A chunk is freed when the last matrix in
// it is. Only loads open one: a matrix freed while others in its chunk live is not reused, so
// runtime allocations (experts moving between ranks) stay on the heap and cannot pin chunks.
class PanelArenaScope {
 public:
  PanelArenaScope();
  ~PanelArenaScope();
  PanelArenaScope(const PanelArenaScope&) = delete;
  PanelArenaScope& operator=(const PanelArenaScope&) = delete;
};

// Columns [begin, end) of a packed matrix, sharing its storage (split-K). For fp8, begin must
// fall on a scale-block boundary.
PackedMatrix ColumnRange(const PackedMatrix& m, int64_t begin, int64_t end);

// Whether `m` can be packed: fp8 blocks must hold whole panels (DeepSeek's 128 rows do).
bool CanPack(const Matrix& m);
// Re-lays out `m` (CanPack must hold); bf16 in pairs where Bf16PairsWanted and allow_pairs.
// Parallel over panels.
std::shared_ptr<const PackedMatrix> Pack(const Matrix& m, bool allow_pairs = true);
// Pack for a matrix whose products keep f32 activations (the MoE router, the absorbed MLA's
// per-head matrices: kernels::LinearPanelsF32): bf16 in pairs only where the tiles run
// (GlobalBf16Pairs). Where only the dot kernel would read pairs they stay in columns, for the f32
// kernel's sums: three bf16 parts through the dot kernel are as accurate but other bits, and the
// router's near ties on the random bench model went the other way with them.
std::shared_ptr<const PackedMatrix> PackForF32Products(const Matrix& m);

// Whether Pack lays every bf16 matrix out in column pairs (PackedMatrix::bf16_pairs): set once,
// before a model loads, where the AMX bf16 kernel runs them (by default on a CPU with AMX; with
// `--amx-bf16` on its emulator too).
bool& GlobalBf16Pairs();
// Whether Pack lays out in pairs the bf16 matrices multiplied by bf16 activations (all but
// PackForF32Products'): set once, before a model loads, where the AVX-512 BF16 dot kernel runs
// them (`switchyard` on such a CPU, unless --f32-products).
bool& GlobalBf16DotPairs();
// Whether a bf16 matrix of `cols` columns is packed in pairs: GlobalBf16Pairs() or
// GlobalBf16DotPairs(), and whole tiles of 32 columns (the AMX kernel's own condition).
bool Bf16PairsWanted(DType dtype, int64_t cols);
// Index of weight (row r of the panel, column c) in a panel of bf16 pairs.
inline int64_t Bf16PairIndex(int64_t r, int64_t c) {
  return (c / 2) * 2 * kPanelRows + 2 * r + c % 2;
}
// Re-lays out `p`'s bf16 panels in place to pairs or back to columns (panels that arrive from a
// process that packs the other way).
void SetBf16Pairs(PackedMatrix& p, bool pairs);

// How the loader packs fp8 and bf16 weights: as they are, or re-quantized to int8 (lossy,
// `--int8-products`; kernels/cpu/int8_gemm.h). Set once, before a model loads.
enum class WeightPacking : uint8_t { kExact, kInt8 };
WeightPacking& GlobalWeightPacking();

// Whether `m` can be re-quantized to int8: fp8 or bf16, columns a multiple of 4.
bool CanPackInt8(const Matrix& m);
// `m` as int8 codes of at most ±kInt8WeightMax, one f32 scale (max |w| / kInt8WeightMax) per row
// and group of kInt8GroupCols columns, codes rounded to nearest. Parallel over panels.
std::shared_ptr<const PackedMatrix> PackInt8(const Matrix& m);
// Whether `m` (GGML blocks) can stay quantized: its type has an integer form and a code fits a
// byte (ggml_quants.h).
bool CanPackGgml(const Matrix& m);
// GGML blocks re-laid out for the quantized kernels (kernels/cpu/ggml_gemm.h), values unchanged.
// Parallel over panels.
std::shared_ptr<const PackedMatrix> PackGgml(const Matrix& m);
// Sets the GGML panel fields that follow from the block type (ggml_type, code_bits, sub_cols,
// super_cols, shared_d, unit_scales, ggml_offset), as PackGgml lays them out; false for a type
// without an integer form. Panels that arrive from another rank are checked against it.
bool SetGgmlPanelLayout(GgmlType type, PackedMatrix& p);

// Where, within a GGML panel (code_bits 4 or 6), the [kPanelRows][4] bytes of low nibbles for
// columns [8k, 8k + 8) start, and (code_bits 6) the top bits of columns [16g, 16g + 16).
inline int64_t GgmlNibbleUnitOffset(const PackedMatrix& p, int64_t k) {
  return p.code_bits == 6 ? (k / 2) * 192 + (k % 2) * 64 : k * 64;
}
inline int64_t GgmlTopBitsOffset(int64_t g) {
  return g * 192 + 128;
}

// Pack, PackInt8 or PackGgml, as GlobalWeightPacking() and the matrix's type say. (GGML blocks
// take PackGgml; Pack decodes them to f32.)
std::shared_ptr<const PackedMatrix> PackForLoad(const Matrix& m);

}  // namespace sy
