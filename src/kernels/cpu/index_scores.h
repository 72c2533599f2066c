// The scores of DeepSeek-V3.2's lightning indexer (DSA, model/sparse_attention.h): how much one
// query wants each cached key, from which the query's top-k keys are chosen.
#pragma once

#include <cstdint>

#include "kernels/cpu/mla_decode.h"

namespace sy::kernels {

// scores[j − first] = Σ_h weights[h] · max(0, q[h]·k_j) for j in [first, first + count), where
// k_j is `dim` values from column `column` of row j of `keys` (the indexer keys in a DSA cache
// row, bf16 or f32, read in place). q: [heads, dim]; weights: [heads]. One thread. Each score
// sums over dim, then over heads, in one order with every product rounded (no FMA) whatever the
// CPU's vector width: the scores, and so the keys a query attends to, are the same bits on every
// CPU.
void IndexScores(const float* q, const float* weights, int64_t heads, int64_t dim,
                 const LatentPages& keys, int64_t column, int64_t first, int64_t count,
                 float* scores);

}  // namespace sy::kernels
