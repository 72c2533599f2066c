#include "bench/random_weights.h"

#include <vector>

#include "tensor/packed_matrix.h"

namespace sy::bench {

Matrix RandomPackedMatrix(DType dtype, int64_t rows, int64_t cols, uint64_t seed) {
  const size_t count = static_cast<size_t>(rows * cols);
  auto bytes = std::make_shared<std::vector<uint8_t>>(count * DTypeSize(dtype));
  uint64_t state = seed * 0x9e3779b97f4a7c15ull + 1;
  auto next = [&] {  // xorshift64*: fast, and plenty for benchmark data
    state ^= state >> 12;
    state ^= state << 25;
    state ^= state >> 27;
    return state * 0x2545f4914f6cdd1dull;
  };
  for (size_t i = 0; i < bytes->size(); i += 8) {
    uint64_t word = next();
    for (size_t b = 0; b < 8 && i + b < bytes->size(); ++b) {
      uint8_t value = static_cast<uint8_t>(word >> (8 * b));
      // fp8: keep clear of NaN (0x7f, 0xff) and of huge values; bf16: a modest exponent.
      if (dtype == DType::kF8E4M3)
        value = static_cast<uint8_t>((value & 0x80) | ((value & 0x7f) % 0x60));
      if (dtype == DType::kBF16 && (i + b) % 2 == 1)
        value = static_cast<uint8_t>((value & 0x80) | 0x3c | (value & 1));
      (*bytes)[i + b] = value;
    }
  }
  if (dtype == DType::kF32) {  // small uniform values
    float* values = reinterpret_cast<float*>(bytes->data());
    for (size_t i = 0; i < count; ++i)
      values[i] = static_cast<float>(next() >> 40) / 16777216.0f * 0.1f - 0.05f;
  }
  Matrix m;
  m.dtype = dtype;
  m.rows = rows;
  m.cols = cols;
  m.data = bytes->data();
  std::vector<float> scales;
  if (dtype == DType::kF8E4M3) {
    m.block_rows = m.block_cols = 128;
    m.scale_cols = (cols + 127) / 128;
    scales.assign(static_cast<size_t>((rows + 127) / 128 * m.scale_cols), 1e-3f);
    m.block_scales = scales.data();
  }
  // Only the packed copy is kept: it is what the fast kernels read. (Re-quantized to int8 under
  // --int8-products, as the loader would.)
  Matrix packed_only;
  packed_only.dtype = dtype;
  packed_only.rows = rows;
  packed_only.cols = cols;
  packed_only.packed = PackForLoad(m);
  return packed_only;
}

}  // namespace sy::bench
