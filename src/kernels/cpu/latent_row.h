// The bytes of one row of the latent KV cache, and the conversions to and from f32.
//
// A row is [latent | rope | index keys] (kv_lora_rank, qk_rope_head_dim, and a DSA model's
// index_head_dim). It is stored in one of three ways:
//   kF32      every value as f32 (exact, for conformance checks);
//   kBF16     every value as bf16 (as deployed);
//   kF8E4M3   the latent columns as float8 e4m3 codes, one power-of-two scale per block of 128
//             of them (an int8 exponent), then the other columns as bf16, unquantized (as
//             DeepSeek's fp8 MLA cache for V3.2 keeps its rope part):
//             [codes (latent) | exponents (blocks) | pad to even | rest as bf16].
//             DeepSeek-V3: 512 + 4 + 128 = 644 bytes a row against bf16's 1,152.
// Why powers of two: code · 2^e is exact in f32 and in bf16 (4 significant bits), so every
// attention kernel — f32, bf16 dot, a row widened anywhere — sees the very values the cache
// holds, and an fp8 cache gives the answers of an f32 cache holding those values.
#pragma once

#include <cstdint>

#include "tensor/dtype.h"

namespace sy::kernels {

struct LatentRowLayout {
  static constexpr int64_t kScaleBlock = 128;
  // Exponents are kept in [-kMaxExponent, kMaxExponent]: every scaled code is then a normal f32
  // (and bf16). Latent rows are RMS-normalized, far inside this range.
  static constexpr int kMaxExponent = 100;

  DType dtype = DType::kBF16;
  int64_t width = 0;      // values a row holds
  int64_t quantized = 0;  // kF8E4M3: the leading columns held as codes; 0 otherwise
  int64_t tail = 0;       // byte offset of the first column after them (bf16 from there)
  int64_t row_bytes = 0;  // bytes per row

  // dtype kF32, kBF16 or kF8E4M3; `latent` is the quantized part for kF8E4M3 (1 ≤ latent ≤ width)
  // and ignored otherwise.
  static LatentRowLayout Of(DType dtype, int64_t width, int64_t latent);

  int64_t scale_blocks() const { return (quantized + kScaleBlock - 1) / kScaleBlock; }
  // The dtype of the columns from `quantized` on, stored whole.
  DType plain_dtype() const { return dtype == DType::kF8E4M3 ? DType::kBF16 : dtype; }
  // The leading bytes of a row that hold columns [0, columns) (what a kernel reading only those
  // prefetches).
  int64_t BytesThrough(int64_t columns) const {
    return columns <= quantized ? quantized + scale_blocks()
                                : tail + (columns - quantized) * DTypeSize(plain_dtype());
  }
  // Where column `column` (≥ quantized) of `row` starts.
  const uint8_t* Plain(const uint8_t* row, int64_t column) const {
    return row + tail + (column - quantized) * static_cast<int64_t>(DTypeSize(plain_dtype()));
  }
};

// "bf16", "f32" or "fp8": a cache dtype as --kv-dtype, logs and /metrics name it.
inline const char* LatentCacheDTypeName(DType dtype) {
  return dtype == DType::kF8E4M3 ? "fp8" : dtype == DType::kF32 ? "f32" : "bf16";
}

// Whether `count` rows (row_bytes apart) are rows this layout can hold: an fp8 row's exponents
// in [-kMaxExponent, kMaxExponent] (others decode to wrong magnitudes). Returns the first row
// that is not, or -1. Rows received from another instance are checked before they are used.
int64_t FirstBadLatentRow(const LatentRowLayout& layout, const uint8_t* rows, int64_t count);
// Stores `values` (layout.width of them) as one row.
void EncodeLatentRow(const LatentRowLayout& layout, const float* values, uint8_t* row);
// Columns [column, column + count) of a row as f32, exactly the values the row holds.
void DecodeLatentRow(const LatentRowLayout& layout, const uint8_t* row, int64_t column,
                     int64_t count, float* out);

}  // namespace sy::kernels
