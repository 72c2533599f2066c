#include "model/decoder_schedule.h"

#include <algorithm>
#include <cstring>

#include "base/allocator.h"
#include "base/stage_timer.h"
#include "base/thread_pool.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/fast_linear.h"
#include "model/feed_forward.h"
#include "model/sparse_attention.h"

namespace sy {

std::vector<MicroBatch> SplitBatch(const ForwardBatch& batch, int parts, int sp_size, int sp_rank) {
  const int64_t T = batch.size();
  std::vector<MicroBatch> out(static_cast<size_t>(parts));
  for (int p = 0; p < parts; ++p) {
    MicroBatch& mb = out[p];
    const int64_t begin = T * p / parts, end = T * (p + 1) / parts;
    mb.first_token = begin;
    mb.batch.tokens.assign(batch.tokens.begin() + begin, batch.tokens.begin() + end);
    for (const SequenceSlice& seq : batch.sequences) {
      const int64_t s_begin = std::max(begin, seq.token_offset);
      const int64_t s_end = std::min(end, seq.token_offset + seq.token_count);
      if (s_begin >= s_end) continue;
      const int64_t skipped = s_begin - seq.token_offset;
      mb.batch.sequences.push_back(
          {s_begin - begin, s_end - s_begin, seq.start_position + skipped, seq.cache});
      for (int64_t i = 0; i < s_end - s_begin; ++i)
        mb.positions.push_back(seq.start_position + skipped + i);
    }
    const int64_t size = end - begin;
    mb.row_begin = size * sp_rank / sp_size;
    mb.rows = size * (sp_rank + 1) / sp_size - mb.row_begin;
  }
  return out;
}

namespace {

// Work below this many elements runs on the calling thread: waking the pool costs more.
constexpr int64_t kParallelElements = 16384;

class LayerRunner {
 public:
  LayerRunner(const DecoderContext& context, const ForwardOptions& options,
              std::vector<MicroBatch>& parts)
      : c_(*context.config),
        attention_c_(*context.attention_config),
        context_(context),
        options_(options),
        parts_(parts),
        moe_(options.moe != nullptr ? *options.moe : local_moe_),
        group_(options.attention_group),
        sequence_parallel_(group_ != nullptr && group_->size() > 1 &&
                           options.attention_split == AttentionSplit::kSequence) {
    for (size_t p = 0; p < parts.size(); ++p) {
      normed_[p] = UninitializedArray<float>(parts[p].rows * c_.hidden_size);
      delta_[p] = UninitializedArray<float>(parts[p].rows * c_.hidden_size);
    }
  }

  // Stages 1–2: input norm, attention, residual, post-attention norm (into normed_[p]).
  void Attend(int p, int64_t l) {
    MicroBatch& mb = parts_[p];
    const DecoderLayerWeights& layer = Layer(l);
    const int64_t D = c_.hidden_size;
    const float eps = static_cast<float>(c_.rms_norm_eps);
    kernels::RmsNorm(mb.hidden, mb.rows, D, layer.self_attn.input_layernorm.data(), eps,
                     normed_[p].get());
    if (sequence_parallel_) {
      AttendSequenceParallel(mb, l, normed_[p].get(), delta_[p].get());
    } else {
      MlaForward(attention_c_, *context_.rope, layer.self_attn, l, mb.batch, mb.positions,
                 *context_.cache, options_.attention, normed_[p].get(), delta_[p].get());
      if (group_ != nullptr) group_->Sum(delta_[p].get(), mb.rows * D);
    }
    // The residual and the post-attention norm in one pass over each row, on every thread.
    AddDelta(p, layer.post_attention_layernorm.data());
  }

  void Dense(int p, int64_t l) {
    FeedForward(Layer(l).mlp, normed_[p].get(), parts_[p].rows, delta_[p].get());
    AddDelta(p);
  }
  void MoeWhole(int p, int64_t l) {
    moe_.Run(c_, Layer(l).moe, l, normed_[p].get(), parts_[p].rows, delta_[p].get());
    AddDelta(p);
  }
  void MoeBegin(int p, int64_t l) {
    moe_.Begin(c_, Layer(l).moe, l, normed_[p].get(), parts_[p].rows, p);
  }
  void MoeMiddle(int p) { moe_.Middle(p); }
  void MoeEnd(int p) {
    moe_.End(p, delta_[p].get());
    AddDelta(p);
  }

  const DecoderLayerWeights& Layer(int64_t l) const { return *(*context_.layers)[l]; }

 private:
  // hidden += delta, and with `norm`, normed_[p] = RmsNorm(hidden) row by row while it is in
  // L1: on one thread, at a prompt's thousands of rows, the add alone was a few percent of the
  // prefill while the other threads waited.
  void AddDelta(int p, const float* norm = nullptr) {
    float* h = parts_[p].hidden;
    const float* d = delta_[p].get();
    float* normed = normed_[p].get();
    const int64_t D = c_.hidden_size, rows = parts_[p].rows;
    const float eps = static_cast<float>(c_.rms_norm_eps);
    ThreadPool::Global().ParallelForIf(
        rows * D >= kParallelElements, static_cast<size_t>(rows), [&](size_t begin, size_t end) {
          for (int64_t r = static_cast<int64_t>(begin); r < static_cast<int64_t>(end); ++r) {
            for (int64_t i = r * D; i < (r + 1) * D; ++i)
              h[i] += d[i];
            if (norm != nullptr) kernels::RmsNormRows(h, r, r + 1, D, norm, eps, normed);
          }
        });
  }

  // SP-TP-SP: this rank's token shard is projected for every head; q goes to the head owners
  // and the latent rows to everyone (the cache is replicated over the group); attention runs
  // over this rank's heads for all the micro-batch's tokens; the outputs go back to the token
  // owners for a whole o_proj.
  void AttendSequenceParallel(const MicroBatch& mb, int64_t l, const float* x, float* out) {
    const AttentionWeights& w = Layer(l).self_attn;
    const int P = group_->size();
    const int64_t T = mb.batch.size(), rows = mb.rows, H = c_.num_attention_heads;
    const int64_t local_heads = attention_c_.num_attention_heads;
    const int64_t dqk = c_.qk_head_dim(), dv = c_.v_head_dim, width = c_.cache_row_width();
    std::vector<int64_t> shard_rows(static_cast<size_t>(P));
    for (int r = 0; r < P; ++r)
      shard_rows[r] = T * (r + 1) / P - T * r / P;

    std::vector<float> q(static_cast<size_t>(rows * H * dqk)),
        latent(static_cast<size_t>(rows * width));
    // DSA: the indexer's queries of every token go to every rank with the latent rows, and each
    // rank chooses the keys of all the micro-batch's queries for its heads (the same choice on
    // every rank: the same rows, the same arithmetic).
    const int64_t index_width = w.has_indexer() ? IndexerQueryWidth(c_) : 0;
    std::vector<float> index_queries(static_cast<size_t>(rows * index_width));
    MlaProject(c_, *context_.rope, w, rows, mb.positions.data() + mb.row_begin, x, q.data(),
               latent.data(), index_queries.data());
    // Every rank's latent rows, in token order, into the replicated cache.
    std::vector<int64_t> counts(static_cast<size_t>(P));
    for (int r = 0; r < P; ++r)
      counts[r] = shard_rows[r] * width;
    std::vector<float> all_latent(static_cast<size_t>(T * width));
    group_->AllGather(latent.data(), counts, all_latent.data());
    MlaWriteCache(c_, l, mb.batch, all_latent.data(), *context_.cache);
    std::vector<float> all_index_queries(static_cast<size_t>(T * index_width));
    if (index_width > 0) {
      for (int r = 0; r < P; ++r)
        counts[r] = shard_rows[r] * index_width;
      group_->AllGather(index_queries.data(), counts, all_index_queries.data());
    }

    // q: to rank j go this shard's queries for heads [j·Hl, (j+1)·Hl); from each rank come its
    // tokens' queries for this rank's heads, in token order.
    const int64_t q_head_block = local_heads * dqk;
    std::vector<float> q_send(q.size());
    std::vector<int64_t> send_counts(static_cast<size_t>(P)), recv_counts(static_cast<size_t>(P));
    for (int j = 0; j < P; ++j) {
      for (int64_t t = 0; t < rows; ++t)
        std::memcpy(q_send.data() + (j * rows + t) * q_head_block,
                    q.data() + t * H * dqk + j * q_head_block, q_head_block * sizeof(float));
      send_counts[j] = rows * q_head_block;
      recv_counts[j] = shard_rows[j] * q_head_block;
    }
    std::vector<float> q_heads(static_cast<size_t>(T * q_head_block));
    group_->AllToAll(q_send.data(), send_counts, q_heads.data(), recv_counts);

    const int64_t out_block = local_heads * dv;
    std::vector<float> heads_out(static_cast<size_t>(T * out_block));
    MlaAttend(attention_c_, *context_.rope, w, l, mb.batch, mb.positions, *context_.cache,
              options_.attention, q_heads.data(),
              index_width > 0 ? all_index_queries.data() : nullptr, heads_out.data());

    // Back to the token owners: rank j gets its shard's rows of this rank's heads.
    for (int j = 0; j < P; ++j) {
      send_counts[j] = shard_rows[j] * out_block;
      recv_counts[j] = rows * out_block;
    }
    std::vector<float> received(static_cast<size_t>(P * rows * out_block));
    group_->AllToAll(heads_out.data(), send_counts, received.data(), recv_counts);
    std::vector<float> mine(static_cast<size_t>(rows * H * dv));
    for (int r = 0; r < P; ++r)
      for (int64_t t = 0; t < rows; ++t)
        std::memcpy(mine.data() + t * H * dv + r * out_block,
                    received.data() + (r * rows + t) * out_block, out_block * sizeof(float));
    ScopedStage gemm(Stage::kGemm);
    if (rows > 0) kernels::LinearAuto(mine.data(), rows, w.o_proj, out);
  }

  const ModelConfig& c_;
  const ModelConfig& attention_c_;
  const DecoderContext& context_;
  const ForwardOptions& options_;
  std::vector<MicroBatch>& parts_;
  LocalMoe local_moe_;
  MoeExecutor& moe_;
  AttentionGroup* group_;
  bool sequence_parallel_;
  // Each written whole before it is read (every layer's attention and feed-forward write all of
  // delta): no zero fill, which at a prompt's thousands of rows was 32 MB on one thread.
  std::unique_ptr<float[]> normed_[MoeExecutor::kSlots], delta_[MoeExecutor::kSlots];
};

}  // namespace

void RunDecoderLayers(const DecoderContext& context, const ForwardOptions& options,
                      std::vector<MicroBatch>& parts, int64_t first, int64_t last) {
  LayerRunner run(context, options, parts);
  if (parts.size() == 1) {
    for (int64_t l = first; l < last; ++l) {
      run.Attend(0, l);
      if (run.Layer(l).is_moe) {
        run.MoeWhole(0, l);
      } else {
        run.Dense(0, l);
      }
    }
    return;
  }
  // Two micro-batches; in_flight[p]: p's MoE layer awaits its combine receive.
  bool in_flight[MoeExecutor::kSlots] = {false, false};
  for (int64_t l = first; l < last; ++l) {
    const bool moe = run.Layer(l).is_moe;
    for (int p = 0; p < 2; ++p) {
      if (in_flight[p]) {  // stage 5 of the previous layer
        run.MoeEnd(p);
        in_flight[p] = false;
      }
      run.Attend(p, l);  // stages 1–2
      if (moe) {
        run.MoeBegin(p, l);  // stage 3; switch micro-batch after the dispatch send
        in_flight[p] = true;
      } else {
        run.Dense(p, l);
      }
    }
    if (moe)
      for (int p = 0; p < 2; ++p)
        run.MoeMiddle(p);  // stage 4; switch micro-batch after the combine send
  }
  for (int p = 0; p < 2; ++p)
    if (in_flight[p]) run.MoeEnd(p);
}

}  // namespace sy
