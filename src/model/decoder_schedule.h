// The order in which one step's decoder layers run over its tokens on this rank:
//   one part:   every layer over the whole batch — attention, then the MoE (or dense) block;
//   two parts:  the seed's five-stage micro-batch schedule. The batch is cut into two
//               micro-batches of nearly equal token counts; in each MoE layer
//                 A: attention (stages 1–2), dispatch send + shared expert (stage 3)
//                 B: the same                      ← A's rows travel meanwhile
//                 A: dispatch recv, experts, combine send (stage 4)
//                 B: the same                      ← A's outputs travel meanwhile
//               and A's combine receive (stage 5) comes at the start of A's next layer, after
//               which B's combine receive comes while A's next dispatch travels. Compute
//               switches micro-batch after every dispatch send and combine send.
// Attention is data parallel (all of the group's tokens, all heads), TP over heads, or SP-TP-SP
// (model/attention_group.h).
#pragma once

#include <cstdint>
#include <vector>

#include "model/attention_group.h"
#include "model/batch.h"
#include "model/config.h"
#include "model/latent_cache.h"
#include "model/mla.h"
#include "model/moe_executor.h"
#include "model/rope.h"
#include "model/weights.h"

namespace sy {

enum class LogitRows {
  kAll,   // one row per input token
  kLast,  // one row per sequence: its last token (what decoding needs)
};

struct ForwardOptions {
  AttentionForm attention = AttentionForm::kAuto;
  LogitRows logit_rows = LogitRows::kAll;
  // Runs the MoE layers; null means all experts in this process.
  MoeExecutor* moe = nullptr;
  // The TP group sharing this DP group's attention; null without TP.
  AttentionGroup* attention_group = nullptr;
  AttentionSplit attention_split = AttentionSplit::kHeads;
  // Two micro-batches in the five-stage schedule (dense-first layers still run whole, unless the
  // attention is SP-TP-SP, whose token shards are per micro-batch). Every rank of an
  // expert-parallel job must agree on it: each micro-batch makes its own exchanges.
  bool micro_batches = false;
};

// A micro-batch as this rank holds it.
struct MicroBatch {
  ForwardBatch batch;              // all its tokens and sequences (alike across a TP group)
  std::vector<int64_t> positions;  // the absolute position of each of batch's tokens
  int64_t first_token = 0;         // where batch starts in the step's batch
  int64_t row_begin = 0;           // this rank's rows: [row_begin, row_begin + rows) of batch —
  int64_t rows = 0;                // all of them, or its SP shard
  float* hidden = nullptr;         // [rows, D] residual stream
};

// Cuts `batch` into `parts` consecutive micro-batches of nearly equal token counts; always
// `parts` of them, some perhaps empty. A sequence cut in two continues in the second part from
// where the first stops: attention allows it, since the first part writes a layer's latent rows
// before the second attends in that layer. With sp_size > 1 each rank holds rows
// [T·r/sp_size, T·(r+1)/sp_size) of each part (r = sp_rank).
std::vector<MicroBatch> SplitBatch(const ForwardBatch& batch, int parts, int sp_size, int sp_rank);

struct DecoderContext {
  const ModelConfig* config = nullptr;            // the model
  const ModelConfig* attention_config = nullptr;  // the heads this rank computes (H / TP)
  const RopeParams* rope = nullptr;
  // Layer l of the stack: the main layers, then the MTP blocks (index num_hidden_layers + i).
  const std::vector<const DecoderLayerWeights*>* layers = nullptr;
  LatentCache* cache = nullptr;  // layer l of the cache belongs to layers[l]
};

// Runs layers [first, last) over the parts' hidden rows, in place: one part in order, two in
// the five-stage schedule.
void RunDecoderLayers(const DecoderContext& context, const ForwardOptions& options,
                      std::vector<MicroBatch>& parts, int64_t first, int64_t last);

}  // namespace sy
