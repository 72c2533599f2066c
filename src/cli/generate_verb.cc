// switchyard generate: greedy decoding of one or more prompts, batched.
#include <algorithm>
#include <cstdio>

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
  int64_t max_tokens = 16;
  bool ignore_eos = false;
  std::string kv_dtype = "bf16";
  ParallelArgs parallel;
};

int32_t Argmax(const float* row, int64_t size) {
  return static_cast<int32_t>(std::max_element(row, row + size) - row);
}

void RunGenerate(const GenerateArgs& args) {
  auto parsed = ParseTokenLists(args.prompt_tokens, "--prompt-tokens");
  if (!parsed.ok()) FailVerb(parsed.status().message());
  const auto& prompts = parsed.value();
  ParallelRun run = LoadParallel(args.model, args.parallel);
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

  int64_t capacity = 0;
  for (size_t s = 0; s < count; ++s)
    if (run.Owns(s)) capacity += static_cast<int64_t>(prompts[s].size()) + args.max_tokens;
  LatentCache cache =
      model.NewCache(capacity, static_cast<int64_t>(count), KvDTypeOrFail(args.kv_dtype));
  std::vector<SequenceCache> caches(count);
  std::vector<std::vector<int32_t>> generated(count);
  ForwardOptions options = run.Options();
  options.logit_rows = LogitRows::kLast;
  std::vector<float> logits;
  auto forward = [&](const ForwardBatch& batch) {
    Status status = model.Forward(batch, cache, options, &logits);
    if (!status.ok()) comm.Abort(status.message(), 1);
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
  const double prefill_done = NowSeconds();
  int64_t decode_steps = 0, decoded_tokens = 0;
  while (true) {
    // Take the next token of every local sequence still running from the last step's logits.
    ForwardBatch step;
    std::vector<size_t> next_members;
    for (size_t i = 0; i < members.size(); ++i) {
      const size_t s = members[i];
      const int32_t token = Argmax(logits.data() + i * vocab, vocab);
      generated[s].push_back(token);
      const bool stop = (!args.ignore_eos && token == config.eos_token_id) ||
                        static_cast<int64_t>(generated[s].size()) >= args.max_tokens;
      if (stop) continue;
      step.Add(&generated[s].back(), 1, &caches[s]);
      next_members.push_back(s);
    }
    members = std::move(next_members);
    // Every rank steps while any rank has work, with an empty batch if it has none.
    if (comm.AllReduceMax(static_cast<int64_t>(members.size())) == 0) break;
    forward(step);
    ++decode_steps;
    decoded_tokens += static_cast<int64_t>(members.size());
  }
  const double end = NowSeconds();

  // Rank 0 prints every sequence in input order.
  std::vector<std::vector<int32_t>> ordered = GatherSequencesToRoot(run, generated);
  const int64_t total_decoded = comm.AllReduceSum(decoded_tokens);
  if (comm.rank() != 0) return;
  int64_t total_generated = 0;
  for (size_t s = 0; s < count; ++s) {
    std::printf("sequence %zu:", s);
    for (int32_t token : ordered[s])
      std::printf(" %d", token);
    std::printf("\n");
    total_generated += static_cast<int64_t>(ordered[s].size());
  }
  const double decode_seconds = end - prefill_done;
  std::printf(
      "generated %lld tokens for %zu sequences in %.3f s: %.1f tok/s overall; prefill %.3f s; "
      "decode %.1f "
      "tok/s over %lld steps on %d rank(s)\n",
      static_cast<long long>(total_generated), count, end - start,
      total_generated / std::max(end - start, 1e-9), prefill_done - start,
      total_decoded / std::max(decode_seconds, 1e-9), static_cast<long long>(decode_steps),
      comm.size());
}

}  // namespace

void AddGenerateVerb(CLI::App& app) {
  auto args = std::make_shared<GenerateArgs>();
  CLI::App* verb = app.add_subcommand("generate", "Greedy decoding of token prompts, batched");
  verb->add_option("--model", args->model, "Checkpoint directory")->required();
  verb->add_option("--prompt-tokens", args->prompt_tokens,
                   "Prompt token ids: '1,2,3;4,5' is two prompts")
      ->required();
  verb->add_option("--max-tokens", args->max_tokens, "Tokens to generate per prompt")
      ->check(CLI::NonNegativeNumber);
  verb->add_flag("--ignore-eos", args->ignore_eos,
                 "Keep generating past the end-of-sequence token");
  verb->add_option("--kv-dtype", args->kv_dtype, "Latent cache dtype")
      ->check(CLI::IsMember({"bf16", "f32"}));
  AddParallelOptions(verb, args->parallel);
  verb->callback([args] { RunGenerate(*args); });
}

}  // namespace sy
