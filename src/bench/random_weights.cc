#include "bench/random_weights.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "tensor/dtype.h"
#include "tensor/ggml_quants.h"
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

Matrix RandomGgmlMatrix(GgmlType type, int64_t rows, int64_t cols, uint64_t seed) {
  const GgmlTypeTraits traits = *GgmlTypeInfo(type);
  const int64_t blocks = rows * cols / traits.block_size;
  std::vector<uint8_t> bytes(static_cast<size_t>(blocks * traits.block_bytes));
  uint64_t state = seed * 0x9e3779b97f4a7c15ull + 1;
  for (size_t i = 0; i < bytes.size(); i += 8) {
    state ^= state >> 12;
    state ^= state << 25;
    state ^= state >> 27;
    const uint64_t word = state * 0x2545f4914f6cdd1dull;
    std::memcpy(bytes.data() + i, &word, std::min<size_t>(8, bytes.size() - i));
  }
  // Every byte pattern is a valid block once its half-precision scales are finite: d (and dmin)
  // 1/1024 (ggml-common.h's block structs: Q4_K's at bytes 0 and 2, Q6_K's at 208).
  const uint16_t half = F32ToF16(1.0f / 1024);
  for (int64_t b = 0; b < blocks; ++b) {
    uint8_t* block = bytes.data() + b * traits.block_bytes;
    if (type == GgmlType::kQ6_K) {
      std::memcpy(block + 208, &half, 2);
    } else {
      std::memcpy(block, &half, 2);
      std::memcpy(block + 2, &half, 2);
    }
  }
  Matrix m;
  m.dtype = DType::kGgml;
  m.ggml_type = type;
  m.rows = rows;
  m.cols = cols;
  m.data = bytes.data();
  Matrix packed_only;
  packed_only.dtype = DType::kGgml;
  packed_only.ggml_type = type;
  packed_only.rows = rows;
  packed_only.cols = cols;
  packed_only.packed = PackGgml(m);
  return packed_only;
}

}  // namespace sy::bench
