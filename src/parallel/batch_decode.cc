#include "parallel/batch_decode.h"

#include <algorithm>

#include "base/clock.h"

namespace sy {
namespace {

int32_t Argmax(const float* row, int64_t size) {
  return static_cast<int32_t>(std::max_element(row, row + size) - row);
}

}  // namespace

BatchDecodeResult BatchDecode(const ParallelRun& run,
                              const std::vector<std::vector<int32_t>>& prompts,
                              const BatchDecodeOptions& options) {
  Communicator& comm = *run.comm;
  const Model& model = *run.model;
  const ModelConfig& config = model.config();
  const int64_t vocab = config.vocab_size;
  const int64_t K = options.speculative_tokens;
  const bool mtp = K > 0 && options.drafter == Drafter::kMtp;
  const size_t count = prompts.size();
  int64_t capacity = 0;
  for (size_t s = 0; s < count; ++s)
    if (run.Owns(s)) capacity += static_cast<int64_t>(prompts[s].size()) + options.max_tokens;
  LatentCache cache =
      model.NewCache(capacity, static_cast<int64_t>(count), options.kv_dtype, 16, mtp);
  std::vector<SequenceCache> caches(count);
  std::vector<std::vector<int32_t>> drafts(count);
  ForwardOptions forward_options = run.Options();
  forward_options.logit_rows = LogitRows::kLast;
  forward_options.attention = options.attention;
  std::vector<float> logits, hidden, mtp_logits, mtp_hidden;
  auto forward = [&](const ForwardBatch& batch) {
    Status status = model.Forward(batch, cache, forward_options, &logits, mtp ? &hidden : nullptr);
    if (!status.ok()) comm.Abort(status.message(), 1);
  };
  // MTP drafting (greedy): the MTP layer catches up over the positions the last step made valid
  // — row p pairs the final hidden state at p with the token at p + 1 — and each sequence's
  // last row drafts its next token; K > 1 chains the module on its own output. Every rank makes
  // the same K passes, with empty batches if need be (expert-parallel exchanges).
  // `rows[s]`: (first position, count, offset of its rows in `hidden`) per local sequence.
  struct MtpRows {
    size_t s;
    int64_t first, count, hidden_row;
  };
  BatchDecodeResult result;
  std::vector<std::vector<int32_t>>& generated = result.generated;
  generated.assign(count, {});
  result.accepted_per_position.assign(static_cast<size_t>(K), 0);
  result.drafted_per_position.assign(static_cast<size_t>(K), 0);
  auto draft = [&](const std::vector<MtpRows>& rows) {
    if (!mtp) {
      // N-gram drafts: looked up in the sequence's prompt and output, no pass of any model.
      std::vector<int32_t> tokens;
      for (const MtpRows& r : rows) {
        tokens = prompts[r.s];
        tokens.insert(tokens.end(), generated[r.s].begin(), generated[r.s].end());
        const int64_t left = options.max_tokens - static_cast<int64_t>(generated[r.s].size());
        drafts[r.s] = NgramDrafts(tokens, options.ngram, std::min(K, left - 1));
      }
      return;
    }
    ForwardBatch mtp;
    std::vector<float> hidden_in;
    const int64_t D = config.hidden_size;
    for (size_t i = 0; i < rows.size(); ++i) {
      const MtpRows& r = rows[i];
      drafts[r.s].clear();
      mtp.sequences.push_back({mtp.size(), r.count, r.first, &caches[r.s]});
      // Tokens at positions first + 1 .. first + count: the prompt's or the generated ones.
      for (int64_t p = r.first + 1; p <= r.first + r.count; ++p) {
        const int64_t n = static_cast<int64_t>(prompts[r.s].size());
        mtp.tokens.push_back(p < n ? prompts[r.s][p] : generated[r.s][p - n]);
      }
      hidden_in.insert(hidden_in.end(), hidden.begin() + r.hidden_row * D,
                       hidden.begin() + (r.hidden_row + r.count) * D);
    }
    std::vector<size_t> members_now;
    std::vector<int64_t> main_length(count, 0);
    for (const MtpRows& r : rows) {
      members_now.push_back(r.s);
      main_length[r.s] = caches[r.s].length;
    }
    for (int64_t k = 0; k < K; ++k) {
      Status status =
          model.ForwardMtp(mtp, hidden_in.data(), cache, forward_options, &mtp_logits, &mtp_hidden);
      if (!status.ok()) comm.Abort(status.message(), 1);
      ForwardBatch next;
      std::vector<float> next_hidden;
      std::vector<size_t> next_members;
      for (size_t i = 0; i < members_now.size(); ++i) {
        const size_t s = members_now[i];
        const SequenceSlice& slice = mtp.sequences[i];
        const int32_t d = Argmax(mtp_logits.data() + i * vocab, vocab);
        drafts[s].push_back(d);
        // Drafts never run past --max-tokens: at most max_tokens - generated - 1 of them.
        const int64_t left = options.max_tokens - static_cast<int64_t>(generated[s].size());
        if (k + 1 >= K || k + 2 > left - 1) continue;
        const int64_t position = slice.start_position + slice.token_count;
        next.sequences.push_back({next.size(), 1, position, &caches[s]});
        next.tokens.push_back(d);
        next_hidden.insert(next_hidden.end(),
                           mtp_hidden.begin() + (slice.token_offset + slice.token_count - 1) * D,
                           mtp_hidden.begin() + (slice.token_offset + slice.token_count) * D);
        next_members.push_back(s);
      }
      mtp = std::move(next);
      hidden_in = std::move(next_hidden);
      members_now = std::move(next_members);
    }
    for (const MtpRows& r : rows)  // rows past the main layers' were chained drafts' scratch
      cache.Truncate(caches[r.s], main_length[r.s]);
  };

  const double start = NowSeconds();
  ForwardBatch prefill;
  std::vector<size_t> members;
  for (size_t s = 0; s < count; ++s) {
    if (!run.Owns(s)) continue;
    caches[s].prompt_end = static_cast<int64_t>(prompts[s].size());
    prefill.Add(prompts[s].data(), static_cast<int64_t>(prompts[s].size()), &caches[s]);
    members.push_back(s);
  }
  if (options.max_tokens > 0)
    forward(prefill);
  else
    members.clear();
  // Take each sequence's first token; the MTP layer then covers the whole prompt.
  std::vector<size_t> running;
  std::vector<MtpRows> mtp_rows;
  for (size_t i = 0; i < members.size(); ++i) {
    const size_t s = members[i];
    const int32_t token = Argmax(logits.data() + i * vocab, vocab);
    generated[s].push_back(token);
    const bool stop = (!options.ignore_eos && config.IsEos(token)) ||
                      static_cast<int64_t>(generated[s].size()) >= options.max_tokens;
    if (stop) continue;
    running.push_back(s);
    mtp_rows.push_back({s, 0, prefill.sequences[i].token_count, prefill.sequences[i].token_offset});
  }
  if (K > 0 && options.max_tokens > 0) draft(mtp_rows);
  const double prefill_done = NowSeconds();
  members = std::move(running);
  while (true) {
    // Every rank steps while any rank has work, with an empty batch if it has none.
    if (comm.AllReduceMax(static_cast<int64_t>(members.size())) == 0) break;
    // Each sequence feeds its last token and its drafts: query length 1 + drafts.
    ForwardBatch step;
    for (size_t s : members) {
      std::vector<int32_t> query = {generated[s].back()};
      query.insert(query.end(), drafts[s].begin(), drafts[s].end());
      step.Add(query.data(), static_cast<int64_t>(query.size()), &caches[s]);
      step.sequences.back().all_logit_rows = !drafts[s].empty();
    }
    forward(step);
    ++result.decode_steps;
    // Greedy verification: keep drafts while they equal the model's own argmax; the row after
    // the last kept draft gives one more token. Rejected drafts' rows leave the cache.
    std::vector<size_t> next_members;
    mtp_rows.clear();
    int64_t row = 0;
    for (size_t i = 0; i < members.size(); ++i) {
      const size_t s = members[i];
      const SequenceSlice& slice = step.sequences[i];
      const int64_t n_drafts = static_cast<int64_t>(drafts[s].size());
      ++result.sequence_steps;
      bool stop = false;
      int64_t kept = 0;
      for (int64_t j = 0; j <= n_drafts && !stop; ++j) {
        const int32_t token = Argmax(logits.data() + (row + j) * vocab, vocab);
        generated[s].push_back(token);
        ++result.decoded_tokens;
        stop = (!options.ignore_eos && config.IsEos(token)) ||
               static_cast<int64_t>(generated[s].size()) >= options.max_tokens;
        if (j == n_drafts || token != drafts[s][static_cast<size_t>(j)]) break;
        ++kept;
        ++result.accepted_per_position[static_cast<size_t>(j)];
      }
      row += slice.all_logit_rows ? slice.token_count : 1;
      result.draft_tokens += n_drafts;
      for (int64_t j = 0; j < n_drafts; ++j)
        ++result.drafted_per_position[static_cast<size_t>(j)];
      result.accepted_tokens += kept;
      cache.Truncate(caches[s], slice.start_position + 1 + kept);
      if (stop) continue;
      next_members.push_back(s);
      mtp_rows.push_back({s, slice.start_position, 1 + kept, slice.token_offset});
    }
    if (K > 0) draft(mtp_rows);
    members = std::move(next_members);
  }
  const double end = NowSeconds();
  result.prefill_seconds = prefill_done - start;
  result.decode_seconds = end - prefill_done;
  return result;
}

}  // namespace sy
