// The routed experts' outputs summed into a token's row (model/feed_forward.h's FinalizeRouting).
#pragma once

#include <cstdint>

namespace sy::kernels {

// out[i] = ((0 + weights[0]·rows[0][i]) + weights[1]·rows[1][i] + ...) + extra[i] (extra may be
// null), for i < n: each product rounded, then each sum, in that order, so the bits are those of
// the plain loop on every CPU (weighted_sum.cc is built without fused multiply-adds).
void WeightedRowSum(const float* const* rows, const float* weights, int64_t count,
                    const float* extra, int64_t n, float* out);

// One term of that sum for n values: acc[i] = (first ? 0 : acc[i]) + weight·row[i], the product
// rounded, then the sum — WeightedRowSum's steps one term at a time, with its bits.
void AddWeightedRow(float* acc, const float* row, float weight, int64_t n, bool first);

}  // namespace sy::kernels
