// Absorbed MLA attention read straight from the paged latent cache, flash-decoding style:
// keys are visited a chunk at a time with an online softmax, so nothing of size
// heads × keys is materialized and the cache is read once per head block.
#pragma once

#include <algorithm>
#include <cstdint>

#include "kernels/cpu/latent_row.h"
#include "tensor/dtype.h"

namespace sy::kernels {

// One sequence's rows of one layer of the paged latent cache.
struct LatentPages {
  const uint8_t* base = nullptr;  // the layer's storage
  LatentRowLayout layout;         // how a row's values are stored
  int64_t page_size = 0;
  const int32_t* pages = nullptr;  // page of position p is pages[p / page_size]

  const uint8_t* Row(int64_t position) const {
    const int64_t slot =
        static_cast<int64_t>(pages[position / page_size]) * page_size + position % page_size;
    return base + static_cast<size_t>(slot * layout.row_bytes);
  }
};

// q_latent: [tokens, heads, latent]  W_UKᵀ·q_nope per head
// q_pe:     [tokens, heads, rope]    rotated
// positions:[tokens]                 query t sees cache rows j ≤ positions[t]
// o_latent: [tokens, heads, latent]  Σ_j softmax_j(scale · (q_latent·c_j + q_pe·k_pe_j)) · c_j
// Heads [head_begin, head_end) only; one thread. `heads` is the row stride of the arrays.
void MlaDecodeAttention(const float* q_latent, const float* q_pe, int64_t tokens,
                        const int64_t* positions, const LatentPages& cache, int64_t keys,
                        int64_t heads, int64_t head_begin, int64_t head_end, int64_t latent,
                        int64_t rope, float softmax_scale, float* o_latent);

// What every MlaDecodeAttention kernel does first: zeroes the outputs of heads [head_begin,
// head_end) of every token, and returns how many keys the furthest-seeing token sees (the keys
// the walk visits).
inline int64_t BeginMlaDecode(const int64_t* positions, int64_t tokens, int64_t keys, int64_t heads,
                              int64_t head_begin, int64_t head_end, int64_t latent,
                              float* o_latent) {
  int64_t last_visible = 0;
  for (int64_t t = 0; t < tokens; ++t) {
    std::fill(o_latent + (t * heads + head_begin) * latent,
              o_latent + (t * heads + head_end) * latent, 0.0f);
    last_visible = std::max(last_visible, std::min(keys, positions[t] + 1));
  }
  return last_visible;
}

// An fp8 cache row's first `width` values (its latent, then bf16 columns) as bf16, exactly
// (latent_row.h): what the bf16 dot and AMX kernels read in its place. The latent a multiple of
// 16. AVX-512 where the CPU has it (mla_decode_bf16.cc), else a table lookup a value at a time.
void StageLatentRowBf16(const LatentRowLayout& layout, const uint8_t* row, int64_t width,
                        uint16_t* out);

// The bf16 dot-product version (mla_decode_bf16.cc), which MlaDecodeAttention runs when this
// holds (a bf16 or fp8 cache, AVX-512 BF16, latent a multiple of 16) and the dot kernel is
// enabled. An fp8 cache's rows are widened to bf16 first, exactly (latent_row.h).
bool MlaDecodeBf16Applies(DType cache_dtype, int64_t latent, int64_t rope);
void MlaDecodeAttentionBf16(const float* q_latent, const float* q_pe, int64_t tokens,
                            const int64_t* positions, const LatentPages& cache, int64_t keys,
                            int64_t heads, int64_t head_begin, int64_t head_end, int64_t latent,
                            int64_t rope, float softmax_scale, float* o_latent);

}  // namespace sy::kernels
