// A routed expert's weights as they travel between ranks when online rebalancing moves it
// (parallel/expert_migration.h): each matrix as its holder keeps it — the packed panels with
// every scale and offset beside them where the model packs its weights (a GGUF's or an int4
// checkpoint's blocks as their GGML panels), else the checkpoint's rows and fp8 block scales (or
// GGML blocks). The receiver keeps exactly those bytes. The form is this build's own
// (both ends run the same binary; a run's ranks compare their flags and checkpoint at start),
// in native byte order.
#pragma once

#include <cstdint>
#include <vector>

#include "base/status.h"
#include "model/weights.h"

namespace sy {

std::vector<uint8_t> SerializeExpert(const FeedForwardWeights& expert);
// `width` and `hidden`: the shapes the arriving matrices must have ([width, hidden] for gate and
// up, [hidden, width] for down). An error names the matrix and what is wrong: a short or long
// message, an element type or layout an expert cannot have.
Result<FeedForwardWeights> DeserializeExpert(const std::vector<uint8_t>& bytes, int64_t width,
                                             int64_t hidden);

// Whether two experts are the same bytes: every packed panel, scale and offset, and the
// checkpoint rows where there are no panels. A message names the first difference.
Status SameExpertBytes(const FeedForwardWeights& a, const FeedForwardWeights& b);

}  // namespace sy
