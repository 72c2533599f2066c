// switchyard generate: greedy decoding of one or more prompts, batched. Prompts are token ids
// (--prompt-tokens) or text (--prompt, repeatable; --chat renders each as a user message through
// the checkpoint's chat template); text prompts print text.
#include <algorithm>
#include <cstdio>

#include <nlohmann/json.hpp>

#include "base/clock.h"

#include "cli/common.h"
#include "cli/parallel_setup.h"
#include "cli/token_lists.h"
#include "cli/verbs.h"

namespace sy {
namespace {

struct GenerateArgs {
  std::string model;
  std::string prompt_tokens;
  std::vector<std::string> prompts;
  bool chat = false;
  bool json = false;
  int64_t max_tokens = 16;
  bool ignore_eos = false;
  std::string kv_dtype = "bf16";
  SpeculativeArgs speculative;
  ParallelArgs parallel;
};

int32_t Argmax(const float* row, int64_t size) {
  return static_cast<int32_t>(std::max_element(row, row + size) - row);
}

// The prompts as ids: parsed from --prompt-tokens, or each --prompt tokenized.
std::vector<std::vector<int32_t>> PromptIds(const GenerateArgs& args, const TextCodec* codec) {
  if (codec == nullptr) {
    auto parsed = ParseTokenLists(args.prompt_tokens, "--prompt-tokens");
    if (!parsed.ok()) FailVerb(parsed.status().message());
    return parsed.value();
  }
  std::vector<std::vector<int32_t>> prompts;
  for (size_t i = 0; i < args.prompts.size(); ++i) {
    auto ids =
        args.chat ? codec->EncodeChat(args.prompts[i]) : codec->EncodePrompt(args.prompts[i]);
    if (!ids.ok()) FailVerb(fmt::format("--prompt {}: {}", i, ids.status().message()));
    if (ids->empty()) FailVerb(fmt::format("--prompt {}: the prompt has no tokens", i));
    prompts.push_back(std::move(ids).value());
  }
  return prompts;
}

std::string Text(const TextCodec& codec, const std::vector<int32_t>& ids) {
  auto text = codec.tokenizer->Decode(ids, /*skip_special_tokens=*/true);
  return text.ok() ? text.value() : "";
}

void RunGenerate(const GenerateArgs& args) {
  if (args.prompts.empty() == args.prompt_tokens.empty())
    FailVerb("give the prompts either as --prompt TEXT (repeatable) or as --prompt-tokens IDS");
  if (args.chat && args.prompts.empty()) FailVerb("--chat applies to --prompt TEXT");
  const std::string directory = ResolveModelDirectory(args.model);
  std::unique_ptr<TextCodec> codec;
  if (!args.prompts.empty() || args.json)
    codec = std::make_unique<TextCodec>(LoadTextCodecOrFail(directory));
  const std::vector<std::vector<int32_t>> prompts =
      PromptIds(args, args.prompts.empty() ? nullptr : codec.get());
  ParallelRun run = LoadParallel(directory, args.parallel);
  Communicator& comm = *run.comm;
  const Model& model = *run.model;
  const ModelConfig& config = model.config();
  const int64_t vocab = config.vocab_size;
  const size_t count = prompts.size();
  for (size_t s = 0; s < count; ++s)
    for (size_t i = 0; i < prompts[s].size(); ++i)
      if (prompts[s][i] >= vocab)
        FailEverywhere(
            comm,
            fmt::format("--prompt-tokens: sequence {}, position {}: token id {} is outside [0, {})",
                        s, i, prompts[s][i], vocab));

  for (size_t s = 0; s < count; ++s) {
    const int64_t length = static_cast<int64_t>(prompts[s].size()) + args.max_tokens;
    if (length > config.max_position_embeddings)
      FailEverywhere(
          comm, fmt::format("sequence {}: {} prompt tokens + --max-tokens {} exceed the "
                            "model's context of {} tokens",
                            s, prompts[s].size(), args.max_tokens, config.max_position_embeddings));
  }
  const int64_t K = SpeculativeTokensOrFail(args.speculative, model);
  int64_t capacity = 0;
  for (size_t s = 0; s < count; ++s)
    if (run.Owns(s)) capacity += static_cast<int64_t>(prompts[s].size()) + args.max_tokens;
  LatentCache cache = model.NewCache(capacity, static_cast<int64_t>(count),
                                     KvDTypeOrFail(args.kv_dtype), 16, K > 0);
  std::vector<SequenceCache> caches(count);
  std::vector<std::vector<int32_t>> generated(count);
  std::vector<std::vector<int32_t>> drafts(count);
  ForwardOptions options = run.Options();
  options.logit_rows = LogitRows::kLast;
  std::vector<float> logits, hidden, mtp_logits, mtp_hidden;
  auto forward = [&](const ForwardBatch& batch) {
    Status status = model.Forward(batch, cache, options, &logits, K > 0 ? &hidden : nullptr);
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
  int64_t draft_tokens = 0, accepted_tokens = 0;
  std::vector<int64_t> accepted_per_position(static_cast<size_t>(K), 0);
  auto draft = [&](const std::vector<MtpRows>& rows) {
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
          model.ForwardMtp(mtp, hidden_in.data(), cache, options, &mtp_logits, &mtp_hidden);
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
        const int64_t left = args.max_tokens - static_cast<int64_t>(generated[s].size());
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
    prefill.Add(prompts[s].data(), static_cast<int64_t>(prompts[s].size()), &caches[s]);
    members.push_back(s);
  }
  if (args.max_tokens > 0)
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
    const bool stop = (!args.ignore_eos && token == config.eos_token_id) ||
                      static_cast<int64_t>(generated[s].size()) >= args.max_tokens;
    if (stop) continue;
    running.push_back(s);
    mtp_rows.push_back({s, 0, prefill.sequences[i].token_count, prefill.sequences[i].token_offset});
  }
  if (K > 0 && args.max_tokens > 0) draft(mtp_rows);
  const double prefill_done = NowSeconds();
  int64_t decode_steps = 0, decoded_tokens = 0;
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
    ++decode_steps;
    // Greedy verification: keep drafts while they equal the model's own argmax; the row after
    // the last kept draft gives one more token. Rejected drafts' rows leave the cache.
    std::vector<size_t> next_members;
    mtp_rows.clear();
    int64_t row = 0;
    for (size_t i = 0; i < members.size(); ++i) {
      const size_t s = members[i];
      const SequenceSlice& slice = step.sequences[i];
      const int64_t n_drafts = static_cast<int64_t>(drafts[s].size());
      bool stop = false;
      int64_t kept = 0;
      for (int64_t j = 0; j <= n_drafts && !stop; ++j) {
        const int32_t token = Argmax(logits.data() + (row + j) * vocab, vocab);
        generated[s].push_back(token);
        ++decoded_tokens;
        stop = (!args.ignore_eos && token == config.eos_token_id) ||
               static_cast<int64_t>(generated[s].size()) >= args.max_tokens;
        if (j == n_drafts || token != drafts[s][static_cast<size_t>(j)]) break;
        ++kept;
        if (j < K) ++accepted_per_position[static_cast<size_t>(j)];
      }
      row += slice.all_logit_rows ? slice.token_count : 1;
      draft_tokens += n_drafts;
      accepted_tokens += kept;
      cache.Truncate(caches[s], slice.start_position + 1 + kept);
      if (stop) continue;
      next_members.push_back(s);
      mtp_rows.push_back({s, slice.start_position, 1 + kept, slice.token_offset});
    }
    if (K > 0) draft(mtp_rows);
    members = std::move(next_members);
  }
  const double end = NowSeconds();

  // Rank 0 prints every sequence in input order.
  std::vector<std::vector<int32_t>> ordered = GatherSequencesToRoot(run, generated);
  const int64_t total_decoded = comm.AllReduceSum(decoded_tokens);
  const int64_t total_drafts = comm.AllReduceSum(draft_tokens);
  const int64_t total_accepted = comm.AllReduceSum(accepted_tokens);
  std::vector<int64_t> per_position;
  for (int64_t a : accepted_per_position)
    per_position.push_back(comm.AllReduceSum(a));
  if (comm.rank() != 0) return;
  int64_t total_generated = 0;
  for (size_t s = 0; s < count; ++s)
    total_generated += static_cast<int64_t>(ordered[s].size());
  const double decode_seconds = end - prefill_done;
  if (args.json) {
    nlohmann::json outputs = nlohmann::json::array();
    for (size_t s = 0; s < count; ++s)
      outputs.push_back(
          {{"prompt", args.prompts.empty() ? Text(*codec, prompts[s]) : args.prompts[s]},
           {"text", Text(*codec, ordered[s])},
           {"token_ids", ordered[s]}});
    nlohmann::json report = {
        {"outputs", outputs},
        {"prefill_seconds", prefill_done - start},
        {"decode_tokens_per_second", total_decoded / std::max(decode_seconds, 1e-9)},
        {"mtp", nullptr}};
    if (K > 0) {
      report["mtp"] = {
          {"draft_tokens", total_drafts},
          {"accepted_tokens", total_accepted},
          {"acceptance_rate", total_drafts > 0 ? double(total_accepted) / total_drafts : 0.0},
          {"num_speculative_tokens", K},
          {"accepted_per_position", per_position}};
    }
    std::printf("%s\n",
                report.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
    return;
  }
  for (size_t s = 0; s < count; ++s) {
    std::printf("sequence %zu:", s);
    for (int32_t token : ordered[s])
      std::printf(" %d", token);
    std::printf("\n");
    if (!args.prompts.empty())
      std::printf("text %zu: %s\n", s,
                  nlohmann::json(Text(*codec, ordered[s]))
                      .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)
                      .c_str());
  }
  std::printf(
      "generated %lld tokens for %zu sequences in %.3f s: %.1f tok/s overall; prefill %.3f s; "
      "decode %.1f "
      "tok/s over %lld steps on %d rank(s)\n",
      static_cast<long long>(total_generated), count, end - start,
      total_generated / std::max(end - start, 1e-9), prefill_done - start,
      total_decoded / std::max(decode_seconds, 1e-9), static_cast<long long>(decode_steps),
      comm.size());
  if (K > 0)
    std::printf("mtp: %lld of %lld draft tokens accepted (%.3f), up to %lld per step\n",
                static_cast<long long>(total_accepted), static_cast<long long>(total_drafts),
                total_drafts > 0 ? double(total_accepted) / total_drafts : 0.0,
                static_cast<long long>(K));
}

}  // namespace

void AddGenerateVerb(CLI::App& app) {
  auto args = std::make_shared<GenerateArgs>();
  CLI::App* verb = app.add_subcommand("generate", "Greedy decoding of prompts, batched");
  verb->add_option("--model", args->model,
                   "Checkpoint directory (default: the embedded default model)");
  verb->add_option("--prompt", args->prompts, "A text prompt (repeat for a batch)");
  verb->add_flag("--chat", args->chat,
                 "Render each --prompt as a user message through the chat template");
  verb->add_option("--prompt-tokens", args->prompt_tokens,
                   "Prompt token ids: '1,2,3;4,5' is two prompts");
  verb->add_flag("--json", args->json, "Print one JSON object: outputs, timings");
  verb->add_option("--max-tokens", args->max_tokens, "Tokens to generate per prompt")
      ->check(CLI::NonNegativeNumber);
  verb->add_flag("--ignore-eos", args->ignore_eos,
                 "Keep generating past the end-of-sequence token");
  verb->add_option("--kv-dtype", args->kv_dtype, "Latent cache dtype")
      ->check(CLI::IsMember({"bf16", "f32"}));
  AddSpeculativeOptions(verb, args->speculative);
  AddParallelOptions(verb, args->parallel);
  verb->callback([args] { RunGenerate(*args); });
}

}  // namespace sy
