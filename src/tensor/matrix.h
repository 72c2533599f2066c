// A read-only row-major weight matrix [rows, cols] as stored in a checkpoint: f32, bf16, f16, or
// fp8-e4m3 with one f32 dequantization multiplier ("scale_inv") per block of
// block_rows × block_cols elements, the last blocks possibly partial. Kernels decode it a row
// at a time; the fp8 form is never expanded in memory.
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "tensor/dtype.h"
#include "tensor/ggml_quants.h"

namespace sy {

struct Matrix {
  DType dtype = DType::kF32;
  int64_t rows = 0;
  int64_t cols = 0;
  const uint8_t* data = nullptr;  // rows × cols elements, row-major, possibly unaligned
  // Block scales for fp8: [ceil(total_rows / block_rows), ceil(cols / block_cols)].
  const float* block_scales = nullptr;
  int64_t block_rows = 0;
  int64_t block_cols = 0;
  int64_t scale_cols = 0;
  int64_t first_row = 0;  // row offset of this view within the quantized matrix (for scales)
  GgmlType ggml_type = GgmlType::kF32;  // kGgml: the blocks' type (each row whole blocks)
  std::shared_ptr<const void> owner;    // keeps owned data alive (mapped files, converted copies)
  // The rows are a copy made at load that nothing reads once the matrix is packed (an HF int4
  // checkpoint's weights repacked into GGML blocks): packing may drop them.
  bool rows_dropped_when_packed = false;
  // The same weights re-laid out for the fast kernels (tensor/packed_matrix.h), when packed.
  std::shared_ptr<const struct PackedMatrix> packed;

  bool empty() const { return rows == 0 || cols == 0; }
  size_t RowBytes() const {
    if (dtype == DType::kGgml) {
      const auto traits = GgmlTypeInfo(ggml_type);
      return static_cast<size_t>(cols / traits->block_size * traits->block_bytes);
    }
    return static_cast<size_t>(cols) * DTypeSize(dtype);
  }

  // Rows [begin, begin + count) as a matrix of its own (no copy).
  Matrix RowSlice(int64_t begin, int64_t count) const {
    Matrix slice = *this;
    slice.rows = count;
    slice.data = data + static_cast<size_t>(begin) * RowBytes();
    slice.first_row = first_row + begin;
    slice.packed = nullptr;  // panels do not follow arbitrary row slices
    return slice;
  }

  // Decodes columns [col_begin, col_end) of `row` to f32.
  void DecodeRow(int64_t row, int64_t col_begin, int64_t col_end, float* out) const {
    const uint8_t* source = data + static_cast<size_t>(row) * RowBytes();
    int64_t count = col_end - col_begin;
    switch (dtype) {
      case DType::kF32:
        std::memcpy(out, source + col_begin * 4, static_cast<size_t>(count) * 4);
        break;
      case DType::kBF16:
        for (int64_t i = 0; i < count; ++i) {
          uint16_t bits;
          std::memcpy(&bits, source + (col_begin + i) * 2, 2);
          out[i] = BF16ToF32(bits);
        }
        break;
      case DType::kF16:
        for (int64_t i = 0; i < count; ++i) {
          uint16_t bits;
          std::memcpy(&bits, source + (col_begin + i) * 2, 2);
          out[i] = F16ToF32(bits);
        }
        break;
      case DType::kF8E4M3: {
        const float* table = F8E4M3Table();
        const float* scales = block_scales + ((first_row + row) / block_rows) * scale_cols;
        for (int64_t i = 0; i < count; ++i) {
          int64_t col = col_begin + i;
          out[i] = table[source[col]] * scales[col / block_cols];
        }
        break;
      }
      case DType::kGgml: {
        // The blocks covering the range, decoded whole (the GGUF loader checked the type).
        const auto traits = GgmlTypeInfo(ggml_type);
        const int64_t first = col_begin / traits->block_size;
        const int64_t last = (col_end + traits->block_size - 1) / traits->block_size;
        std::vector<float> blocks(static_cast<size_t>((last - first) * traits->block_size));
        (void)DequantizeGgml(ggml_type, source + first * traits->block_bytes,
                             static_cast<int64_t>(blocks.size()), blocks.data());
        std::memcpy(out, blocks.data() + (col_begin - first * traits->block_size),
                    static_cast<size_t>(count) * 4);
        break;
      }
      default:
        std::memset(out, 0, static_cast<size_t>(count) * 4);  // loaders reject other dtypes
        break;
    }
  }

  void DecodeRow(int64_t row, float* out) const { DecodeRow(row, 0, cols, out); }
};

// An owned f32 matrix (for converted or generated weights).
inline Matrix OwnedF32Matrix(std::vector<float> values, int64_t rows, int64_t cols) {
  auto storage = std::make_shared<std::vector<float>>(std::move(values));
  Matrix m;
  m.dtype = DType::kF32;
  m.rows = rows;
  m.cols = cols;
  m.data = reinterpret_cast<const uint8_t*>(storage->data());
  m.owner = storage;
  return m;
}

}  // namespace sy
