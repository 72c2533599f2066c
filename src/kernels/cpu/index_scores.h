// The scores of DeepSeek-V3.2's lightning indexer (DSA, model/sparse_attention.h): how much one
// query wants each cached key, from which the query's top-k keys are chosen.
#pragma once

#include <cstdint>

namespace sy::kernels {

// scores[j] = Σ_h weights[h] · max(0, q[h]·keys[j]) for j < count.
// q: [heads, dim]; weights: [heads]; keys: [count, dim] f32 rows. One thread. Each score sums
// over dim, then over heads, in one order with every product rounded (no FMA) whatever the CPU's
// vector width: the scores, and so the keys a query attends to, are the same bits on every CPU.
void IndexScores(const float* q, const float* weights, int64_t heads, int64_t dim,
                 const float* keys, int64_t count, float* scores);

}  // namespace sy::kernels
