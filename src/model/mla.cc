#include "model/mla.h"

#include <algorithm>
#include <limits>

#include "base/allocator.h"
#include "base/stage_timer.h"
#include "base/thread_pool.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/fast_linear.h"
#include "kernels/cpu/int8_gemm.h"
#include "kernels/cpu/mla_attention.h"
#include "kernels/cpu/mla_decode.h"
#include "model/calibration.h"
#include "model/sparse_attention.h"

namespace sy {
namespace {

// q_a_layernorm and kv_a_layernorm use eps 1e-6 whatever rms_norm_eps says (HF and reference).
constexpr float kLatentNormEps = 1e-6f;

// The absorbed form's per-head products: for each head h, gather(h, rows) writes its T input
// rows [T][w[h].cols], they are multiplied by w[h], and scatter(h, out) takes the [T][w[h].rows]
// result; heads over the threads. Int8 matrices (`--int8-products`) take every head's rows
// quantized in one call outside the heads' loop: QuantizeRowsInt8 spreads rows over the pool
// itself, and the pool is not reentrant.
template <typename Gather, typename Scatter>
void PerHeadProducts(const std::vector<Matrix>& w, int64_t T, Gather gather, Scatter scatter) {
  const int64_t H = static_cast<int64_t>(w.size());
  const int64_t cols = w[0].packed->cols, n = w[0].packed->rows;
  if (w[0].packed->dtype != DType::kI8) {
    ThreadPool::Global().ParallelFor(static_cast<size_t>(H), [&](size_t begin, size_t end) {
      std::vector<float> in(static_cast<size_t>(T * cols)), out(static_cast<size_t>(T * n));
      for (size_t h = begin; h < end; ++h) {
        gather(static_cast<int64_t>(h), in.data());
        const PackedMatrix& m = *w[h].packed;
        kernels::LinearPanelsF32(in.data(), T, m, 0, m.panels, out.data());
        scatter(static_cast<int64_t>(h), out.data());
      }
    });
    return;
  }
  auto in = UninitializedArray<float>(H * T * cols);
  ThreadPool::Global().ParallelForIf(
      H * T * cols >= 16384, static_cast<size_t>(H), [&](size_t begin, size_t end) {
        for (size_t h = begin; h < end; ++h)
          gather(static_cast<int64_t>(h), in.get() + static_cast<int64_t>(h) * T * cols);
      });
  kernels::Int8Rows codes;
  kernels::QuantizeRowsInt8(in.get(), H * T, cols, codes);
  ThreadPool::Global().ParallelFor(static_cast<size_t>(H), [&](size_t begin, size_t end) {
    std::vector<float> out(static_cast<size_t>(T * n));
    for (size_t h = begin; h < end; ++h) {
      const int64_t first = static_cast<int64_t>(h) * T;
      const PackedMatrix& m = *w[h].packed;
      kernels::Int8Panels(codes.Codes(first), codes.stride, codes.Scales(first), T, m, 0, m.panels,
                          out.data());
      scatter(static_cast<int64_t>(h), out.data());
    }
  });
}

// The first position of a slice that takes the absorbed form under AttentionForm::kAuto: the
// sequence's generated tokens (decode steps, MTP verification), and, where the bf16 MLA kernel
// runs, prompt positions whose query sees kAbsorbedPromptKeys keys or more. A function of the
// position and its role alone: how a sequence was chunked or batched, or whether its prefix came
// from the cache, never changes the form a row was computed in. (The absorbed bf16 kernel runs
// near the bf16 peak where the expanded form's per-key scores do not; measured on the bf16 bench
// checkpoint, 4,096 prompt tokens: 256-token prompts 0.93x, 512 1.04x, 1,024 1.25x, one
// 2,000-token prompt 1.65x faster absorbed.)
int64_t FirstAbsorbedPosition(const SequenceSlice& seq, bool absorbed_prompts) {
  int64_t first = seq.cache->prompt_end;
  if (first < 0)  // role unknown: a slice of a decode step's size is one
    first = seq.token_count <= kAbsorbedMaxQueries ? seq.start_position
                                                   : std::numeric_limits<int64_t>::max();
  if (absorbed_prompts) first = std::min(first, kAbsorbedPromptKeys - 1);
  return first;
}

// Absorbed attention for the listed sequences on the fast kernels: per-head q·W_UK, attention
// straight from the cache pages, per-head W_UV; heads spread over the threads.
// A sparse query's part (one token): the physical cache slot of each key it attends to, a page
// table of one-row pages the kernels walk as if the chosen keys were the whole sequence.
// Empty for dense parts.
struct SparseView {
  std::vector<int32_t> slots;
};

void AbsorbedFast(const ModelConfig& c, const RopeParams& rope, const AttentionWeights& w,
                  int64_t layer, const ForwardBatch& batch, const std::vector<size_t>& members,
                  const std::vector<SparseView>& views, const std::vector<int64_t>& positions,
                  const LatentCache& cache, const float* q, float* heads_out) {
  const int64_t H = c.num_attention_heads, dqk = c.qk_head_dim(), dn = c.qk_nope_head_dim;
  const int64_t dr = c.qk_rope_head_dim, dv = c.v_head_dim, latent = c.kv_lora_rank;
  // The member sequences' tokens, compacted.
  std::vector<int64_t> token_index;
  for (size_t s : members)
    for (int64_t i = 0; i < batch.sequences[s].token_count; ++i)
      token_index.push_back(batch.sequences[s].token_offset + i);
  const int64_t T = static_cast<int64_t>(token_index.size());
  // Every (token, head) row of these is written below before it is read.
  auto q_latent = UninitializedArray<float>(T * H * latent);
  auto q_pe = UninitializedArray<float>(T * H * dr);
  auto o_latent = UninitializedArray<float>(T * H * latent);
  PerHeadProducts(
      w.w_uk_t, T,
      [&](int64_t h, float* nope) {
        for (int64_t t = 0; t < T; ++t) {
          const float* row = q + (token_index[t] * H + h) * dqk;
          std::copy_n(row, dn, nope + t * dn);
          std::copy_n(row + dn, dr, q_pe.get() + (t * H + h) * dr);
        }
      },
      [&](int64_t h, const float* absorbed) {
        for (int64_t t = 0; t < T; ++t)
          std::copy_n(absorbed + t * latent, latent, q_latent.get() + (t * H + h) * latent);
      });
  // Work items: (sequence, block of heads) for decode-sized sequences, so a lone sequence still
  // splits over the threads; (sequence, block of kPromptTokens tokens, block of heads) for longer
  // slices, the token blocks ordered first, last, second, second to last… so equal shares of the
  // list carry equal causal work. A row's result does not depend on the item it falls in.
  constexpr int64_t kPromptTokens = 32;
  // Each item decodes and transposes its keys once for all its heads: split heads only where
  // there are too few sequences to share out.
  const int64_t threads = ThreadPool::Global().size();
  const int64_t head_block =
      static_cast<int64_t>(members.size()) >= 2 * threads ? H : std::max<int64_t>(1, H / threads);
  // Longer slices: at most kPromptHeads heads an item, fewer where the slices have too few token
  // blocks for every thread. With every head in one item, a 32-token suffix ran on one thread,
  // and DeepSeek-V3's 128 heads' queries and outputs (16 MiB a block) spilled out of L2:
  // splitting them took the bench's V3-shaped absorbed prompt chunks 1.2x (512 fresh tokens) and
  // 2.8x (32 after 1,024 cached) faster on Zen 3 (docs/benchmarks.md).
  constexpr int64_t kPromptHeads = 16;
  int64_t prompt_blocks = 0;
  for (size_t s : members) {
    const int64_t count = batch.sequences[s].token_count;
    if (count > kAbsorbedMaxQueries) prompt_blocks += (count + kPromptTokens - 1) / kPromptTokens;
  }
  const int64_t prompt_head_block = std::clamp<int64_t>(
      (H * std::max<int64_t>(1, prompt_blocks) + 2 * threads - 1) / (2 * threads), 1,
      std::min(H, kPromptHeads));
  struct Item {
    size_t member;
    int64_t first_token;  // in the compacted arrays
    int64_t token_begin, token_count;
    int64_t head_begin, head_end;
  };
  std::vector<Item> items;
  int64_t first = 0;
  for (size_t m = 0; m < members.size(); ++m) {
    const int64_t count = batch.sequences[members[m]].token_count;
    if (count <= kAbsorbedMaxQueries) {
      for (int64_t h = 0; h < H; h += head_block)
        items.push_back({m, first, 0, count, h, std::min(H, h + head_block)});
    } else {
      std::vector<Item> blocks;
      for (int64_t t = 0; t < count; t += kPromptTokens)
        blocks.push_back({m, first, t, std::min(kPromptTokens, count - t), 0, H});
      const auto push = [&](Item block) {
        for (int64_t h = 0; h < H; h += prompt_head_block) {
          block.head_begin = h;
          block.head_end = std::min(H, h + prompt_head_block);
          items.push_back(block);
        }
      };
      for (size_t lo = 0, hi = blocks.size(); lo < hi; ++lo) {
        push(blocks[lo]);
        if (lo < --hi) push(blocks[hi]);
      }
    }
    first += count;
  }
  ThreadPool::Global().ParallelFor(items.size(), [&](size_t begin, size_t end) {
    for (size_t i = begin; i < end; ++i) {
      const Item& item = items[i];
      const SequenceSlice& seq = batch.sequences[members[item.member]];
      const int64_t t0 = item.first_token + item.token_begin;
      const SparseView* view = views.empty() ? nullptr : &views[members[item.member]];
      if (view != nullptr && !view->slots.empty()) {
        kernels::LatentPages chosen = cache.Pages(layer, *seq.cache);
        chosen.page_size = 1;
        chosen.pages = view->slots.data();
        const int64_t keys = static_cast<int64_t>(view->slots.size()), last = keys - 1;
        kernels::MlaDecodeAttention(q_latent.get() + t0 * H * latent, q_pe.get() + t0 * H * dr, 1,
                                    &last, chosen, keys, H, item.head_begin, item.head_end, latent,
                                    dr, rope.softmax_scale, o_latent.get() + t0 * H * latent);
        continue;
      }
      kernels::MlaDecodeAttention(
          q_latent.get() + t0 * H * latent, q_pe.get() + t0 * H * dr, item.token_count,
          positions.data() + seq.token_offset + item.token_begin, cache.Pages(layer, *seq.cache),
          seq.start_position + seq.token_count, H, item.head_begin, item.head_end, latent, dr,
          rope.softmax_scale, o_latent.get() + t0 * H * latent);
    }
  });
  PerHeadProducts(
      w.w_uv, T,
      [&](int64_t h, float* head_latent) {
        for (int64_t t = 0; t < T; ++t)
          std::copy_n(o_latent.get() + (t * H + h) * latent, latent, head_latent + t * latent);
      },
      [&](int64_t h, const float* head_out) {
        for (int64_t t = 0; t < T; ++t)
          std::copy_n(head_out + t * dv, dv, heads_out + (token_index[t] * H + h) * dv);
      });
}

}  // namespace

void MlaProject(const ModelConfig& c, const RopeParams& rope, const AttentionWeights& w,
                int64_t tokens, const int64_t* positions, const float* x, float* q,
                float* latent_rows, float* index_queries) {
  const int64_t T = tokens, H = c.num_attention_heads, dqk = c.qk_head_dim();
  const int64_t latent = c.kv_lora_rank, dr = c.qk_rope_head_dim, row = c.cache_row_width();
  const int64_t mla_width = c.latent_cache_width();
  if (T == 0) return;
  {
    ScopedStage gemm(Stage::kGemm);
    if (c.q_lora_rank) {
      const int64_t rq = *c.q_lora_rank;
      auto cq = UninitializedArray<float>(T * rq);  // written whole by the product
      ObserveLinearInput(w.q_a_proj, x, T, c.hidden_size, c.hidden_size);
      kernels::LinearAuto(x, T, w.q_a_proj, cq.get());
      kernels::RmsNorm(cq.get(), T, rq, w.q_a_layernorm.data(), kLatentNormEps, cq.get());
      ObserveLinearInput(w.q_b_proj, cq.get(), T, rq, rq);
      kernels::LinearAuto(cq.get(), T, w.q_b_proj, q);
      // DSA: the indexer's key goes after the latent in the cache row, its queries aside.
      if (w.has_indexer())
        IndexerProject(c, rope, w, T, positions, x, cq.get(), latent_rows + mla_width, row,
                       index_queries);
    } else {
      ObserveLinearInput(w.q_proj, x, T, c.hidden_size, c.hidden_size);
      kernels::LinearAuto(x, T, w.q_proj, q);
    }
    ObserveLinearInput(w.kv_a_proj_with_mqa, x, T, c.hidden_size, c.hidden_size);
    if (row == mla_width) {
      kernels::LinearAuto(x, T, w.kv_a_proj_with_mqa, latent_rows);
    } else {
      // Rows wider than the product (a DSA cache row): through a buffer. An MTP layer stored
      // without an indexer leaves zeros where the key would be; nothing reads them.
      auto product = UninitializedArray<float>(T * mla_width);
      kernels::LinearAuto(x, T, w.kv_a_proj_with_mqa, product.get());
      for (int64_t t = 0; t < T; ++t) {
        std::copy_n(product.get() + t * mla_width, mla_width, latent_rows + t * row);
        if (!w.has_indexer())
          std::fill(latent_rows + t * row + mla_width, latent_rows + (t + 1) * row, 0.0f);
      }
    }
  }
  // Per token: the latent's norm, and one cos/sin table for its rope part and every head's.
  ThreadPool::Global().ParallelFor(static_cast<size_t>(T), [&](size_t begin, size_t end) {
    std::vector<float> cos_sin(static_cast<size_t>(dr));
    for (size_t t = begin; t < end; ++t) {
      float* r = latent_rows + t * row;
      kernels::RmsNormRows(r, 0, 1, latent, w.kv_a_layernorm.data(), kLatentNormEps, r);
      kernels::RopeTable(dr, positions[t], rope.inv_freq.data(), rope.attention_factor,
                         cos_sin.data());
      kernels::ApplyRope(r + latent, dr, cos_sin.data());
      for (int64_t h = 0; h < H; ++h)
        kernels::ApplyRope(q + (t * H + h) * dqk + c.qk_nope_head_dim, dr, cos_sin.data());
    }
  });
  // kv_b_proj multiplies the normalized latent (either form: expanded, or absorbed into q and o).
  ObserveLinearInput(w.kv_b_proj, latent_rows, T, latent, row);
}

void MlaWriteCache(const ModelConfig& c, int64_t layer, const ForwardBatch& batch,
                   const float* latent_rows, LatentCache& cache) {
  const int64_t row = c.cache_row_width(), T = batch.size();
  // Rows over the threads (each its own): a prompt's thousands of rows on one thread were 2% of
  // its prefill while the others waited.
  std::vector<int32_t> sequence_of(static_cast<size_t>(T), -1);
  for (size_t s = 0; s < batch.sequences.size(); ++s)
    for (int64_t i = 0; i < batch.sequences[s].token_count; ++i)
      sequence_of[batch.sequences[s].token_offset + i] = static_cast<int32_t>(s);
  ThreadPool::Global().ParallelForIf(
      T * row >= 65536, static_cast<size_t>(T), [&](size_t begin, size_t end) {
        for (size_t t = begin; t < end; ++t) {
          if (sequence_of[t] < 0) continue;
          const SequenceSlice& seq = batch.sequences[sequence_of[t]];
          cache.Write(layer, *seq.cache,
                      seq.start_position + static_cast<int64_t>(t) - seq.token_offset,
                      latent_rows + static_cast<int64_t>(t) * row);
        }
      });
}

void MlaAttend(const ModelConfig& c, const RopeParams& rope, const AttentionWeights& w,
               int64_t layer, const ForwardBatch& batch, const std::vector<int64_t>& positions,
               const LatentCache& cache, AttentionForm form, const float* q,
               const float* index_queries, float* heads_out) {
  ScopedStage attention(Stage::kAttention);
  const int64_t H = c.num_attention_heads, dqk = c.qk_head_dim(), dr = c.qk_rope_head_dim;
  const int64_t latent = c.kv_lora_rank, row = c.latent_cache_width();
  const kernels::MlaDims dims{H, c.qk_nope_head_dim, dr, c.v_head_dim, latent, rope.softmax_scale};
  std::vector<float> latents;
  std::vector<size_t> fast_absorbed;
  const bool have_fast_absorbed = !w.w_uk_t.empty();
  const bool absorbed_prompts = have_fast_absorbed && kernels::GlobalKernelOptions().bf16_dot &&
                                kernels::MlaDecodeBf16Applies(cache.dtype(), latent, dr);
  // DSA: queries at positions ≥ index_topk attend to their chosen keys, each a part of its own
  // in the absorbed form; the slices below keep the positions before that, which see every key.
  const bool dsa = index_queries != nullptr && w.has_indexer();
  std::vector<SparseQuery> sparse;
  if (dsa) sparse = SelectSparseKeys(c, layer, batch, positions, cache, index_queries);
  // Each slice in at most two parts, expanded then absorbed (its rows are all in the cache
  // already, so each part attends over the keys up to its own last position).
  ForwardBatch parts;
  std::vector<bool> part_absorbed;
  for (const SequenceSlice& seq : batch.sequences) {
    const int64_t end = dsa ? std::min(seq.start_position + seq.token_count, c.index_topk)
                            : seq.start_position + seq.token_count;
    if (end <= seq.start_position) continue;
    int64_t cut = form == AttentionForm::kAbsorbed   ? seq.start_position
                  : form == AttentionForm::kExpanded ? end
                                                     : FirstAbsorbedPosition(seq, absorbed_prompts);
    cut = std::clamp(cut, seq.start_position, end);
    if (cut > seq.start_position) {
      parts.sequences.push_back(seq);
      parts.sequences.back().token_count = cut - seq.start_position;
      part_absorbed.push_back(false);
    }
    if (cut < end) {
      parts.sequences.push_back(seq);
      SequenceSlice& tail = parts.sequences.back();
      tail.token_offset += cut - seq.start_position;
      tail.token_count = end - cut;
      tail.start_position = cut;
      part_absorbed.push_back(true);
    }
  }
  std::vector<SparseView> views;
  if (!sparse.empty()) {
    views.resize(parts.sequences.size());
    const int64_t page = cache.page_size();
    for (const SparseQuery& query : sparse) {
      const SequenceSlice& seq = batch.sequences[query.sequence];
      parts.sequences.push_back({query.token, 1, query.position, seq.cache});
      part_absorbed.push_back(true);
      SparseView view;
      view.slots.reserve(query.keys.size());
      for (const int32_t key : query.keys)
        view.slots.push_back(
            static_cast<int32_t>(seq.cache->pages[key / page] * page + key % page));
      views.push_back(std::move(view));
    }
  }
  for (size_t s = 0; s < parts.sequences.size(); ++s) {
    const SequenceSlice& seq = parts.sequences[s];
    if (part_absorbed[s] && have_fast_absorbed) {
      fast_absorbed.push_back(s);
      continue;
    }
    if (!views.empty() && !views[s].slots.empty()) {
      // A sparse query on the reference kernels: its chosen rows gathered, all of them visible.
      const std::vector<int32_t>& slots = views[s].slots;
      const int64_t keys = static_cast<int64_t>(slots.size()), last = keys - 1;
      kernels::LatentPages chosen = cache.Pages(layer, *seq.cache);
      latents.resize(static_cast<size_t>(keys * row));
      for (int64_t k = 0; k < keys; ++k) {
        const uint8_t* source =
            chosen.base + static_cast<size_t>(slots[k]) * static_cast<size_t>(cache.row_bytes());
        kernels::DecodeLatentRow(cache.layout(), source, 0, row, latents.data() + k * row);
      }
      kernels::MlaAttendAbsorbed(q + seq.token_offset * H * dqk, 1, &last, latents.data(), keys,
                                 w.kv_b_proj, dims,
                                 heads_out + seq.token_offset * H * c.v_head_dim);
      continue;
    }
    const int64_t keys = seq.start_position + seq.token_count;
    latents.resize(static_cast<size_t>(keys * row));
    cache.GatherColumns(layer, *seq.cache, keys, 0, row, latents.data());
    auto attend = part_absorbed[s] ? kernels::MlaAttendAbsorbed : kernels::MlaAttendExpandedTiled;
    attend(q + seq.token_offset * H * dqk, seq.token_count, positions.data() + seq.token_offset,
           latents.data(), keys, w.kv_b_proj, dims,
           heads_out + seq.token_offset * H * c.v_head_dim);
  }
  if (!fast_absorbed.empty())
    AbsorbedFast(c, rope, w, layer, parts, fast_absorbed, views, positions, cache, q, heads_out);
}

void MlaForward(const ModelConfig& c, const RopeParams& rope, const AttentionWeights& w,
                int64_t layer, const ForwardBatch& batch, const std::vector<int64_t>& positions,
                LatentCache& cache, AttentionForm form, const float* x, float* out) {
  const int64_t T = batch.size(), H = c.num_attention_heads;
  // Written whole by MlaProject and MlaAttend before they are read.
  auto q = UninitializedArray<float>(T * H * c.qk_head_dim());
  auto latent_rows = UninitializedArray<float>(T * c.cache_row_width());
  auto index_queries = UninitializedArray<float>(w.has_indexer() ? T * IndexerQueryWidth(c) : 0);
  MlaProject(c, rope, w, T, positions.data(), x, q.get(), latent_rows.get(), index_queries.get());
  MlaWriteCache(c, layer, batch, latent_rows.get(), cache);
  auto heads_out = UninitializedArray<float>(T * H * c.v_head_dim);
  MlaAttend(c, rope, w, layer, batch, positions, cache, form, q.get(),
            w.has_indexer() ? index_queries.get() : nullptr, heads_out.get());
  ScopedStage gemm(Stage::kGemm);
  ObserveLinearInput(w.o_proj, heads_out.get(), T, H * c.v_head_dim, H * c.v_head_dim);
  if (T > 0) kernels::LinearAuto(heads_out.get(), T, w.o_proj, out);
}

}  // namespace sy
