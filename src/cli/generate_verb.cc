// switchyard generate: greedy decoding of one or more prompts, batched. Prompts are token ids
// (--prompt-tokens) or text (--prompt, repeatable; --chat renders each as a user message through
// the checkpoint's chat template); text prompts print text.
#include <algorithm>
#include <cstdio>
#include <fstream>

#include <nlohmann/json.hpp>

#include "cli/chat_output_options.h"
#include "cli/common.h"
#include "cli/parallel_setup.h"
#include "cli/token_lists.h"
#include "cli/verbs.h"
#include "parallel/batch_decode.h"

namespace sy {
namespace {

struct GenerateArgs {
  std::string model;
  std::string prompt_tokens;
  std::vector<std::string> prompts;
  bool chat = false;
  std::string chat_template;  // --chat-template: instead of the checkpoint's
  bool json = false;
  int64_t max_tokens = 16;
  int64_t warmup = 0;  // untimed runs of the whole batch before the measured one
  bool ignore_eos = false;
  std::string kv_dtype = "bf16";
  SpeculativeArgs speculative;
  bool batch_invariant = false;
  std::string record_expert_load;  // a file for the measured expert load
  ParallelArgs parallel;
};

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
  ApplyChatTemplateOrFail(args.chat_template, codec.get());
  const std::vector<std::vector<int32_t>> prompts =
      PromptIds(args, args.prompts.empty() ? nullptr : codec.get());
  ParallelArgs parallel = args.parallel;
  parallel.record_expert_load = true;  // cheap, and the run reports its imbalance
  ParallelRun run = LoadParallel(directory, parallel);
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
  const Speculation speculation = SpeculationOrFail(args.speculative, model);
  const int64_t K = speculation.tokens;
  BatchDecodeOptions decode_options;
  decode_options.max_tokens = args.max_tokens;
  decode_options.ignore_eos = args.ignore_eos;
  decode_options.speculative_tokens = K;
  decode_options.drafter = speculation.drafter;
  decode_options.ngram = speculation.ngram;
  decode_options.kv_dtype = KvDTypeOrFail(args.kv_dtype);
  ForwardOptions invariant;
  ApplyBatchInvariant(args.batch_invariant, invariant);
  decode_options.attention = invariant.attention;
  // Warm-up runs: the measured run then finds its buffers allocated and their pages mapped, as a
  // serving process does after its first requests (and as tools/vllm/run_vllm.py measures vLLM).
  // Their routing counts are cleared from the recorded expert load (the exchange sample behind
  // the imbalance keeps theirs: the same batch, so the same proportions).
  for (int64_t i = 0; i < args.warmup; ++i)
    BatchDecode(run, prompts, decode_options);
  if (args.warmup > 0 && run.load) run.load->Clear();
  const BatchDecodeResult result = BatchDecode(run, prompts, decode_options);
  const std::vector<std::vector<int32_t>>& generated = result.generated;
  const int64_t decode_steps = result.decode_steps;
  const double prefill_seconds = result.prefill_seconds, decode_seconds = result.decode_seconds;
  const double total_seconds = prefill_seconds + decode_seconds;

  // Rank 0 prints every sequence in input order.
  std::vector<std::vector<int32_t>> ordered = GatherSequencesToRoot(run, generated);
  const int64_t total_decoded = comm.AllReduceSum(result.decoded_tokens);
  const int64_t total_drafts = comm.AllReduceSum(result.draft_tokens);
  const int64_t total_accepted = comm.AllReduceSum(result.accepted_tokens);
  std::vector<int64_t> per_position;
  for (int64_t a : result.accepted_per_position)
    per_position.push_back(comm.AllReduceSum(a));
  const ExpertLoad load = GatherExpertLoad(run);
  if (comm.rank() != 0) return;
  if (!args.record_expert_load.empty()) {
    std::ofstream out(args.record_expert_load);
    out << ExpertLoadToJson(load);
    if (!out)
      FailVerb(fmt::format("--record-expert-load {}: cannot write", args.record_expert_load));
  }
  int64_t total_generated = 0;
  for (size_t s = 0; s < count; ++s)
    total_generated += static_cast<int64_t>(ordered[s].size());
  if (args.json) {
    nlohmann::json outputs = nlohmann::json::array();
    for (size_t s = 0; s < count; ++s)
      outputs.push_back(
          {{"prompt", args.prompts.empty() ? Text(*codec, prompts[s]) : args.prompts[s]},
           {"text", Text(*codec, ordered[s])},
           {"token_ids", ordered[s]}});
    nlohmann::json report = {
        {"outputs", outputs},
        {"prefill_seconds", prefill_seconds},
        {"decode_tokens_per_second", total_decoded / std::max(decode_seconds, 1e-9)},
        {"expert_imbalance", nullptr},
        {"speculative", nullptr}};
    if (load.imbalance) report["expert_imbalance"] = *load.imbalance;
    if (K > 0) {
      report["speculative"] = {
          {"method", speculation.drafter == Drafter::kMtp ? "mtp" : "ngram"},
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
      static_cast<long long>(total_generated), count, total_seconds,
      total_generated / std::max(total_seconds, 1e-9), prefill_seconds,
      total_decoded / std::max(decode_seconds, 1e-9), static_cast<long long>(decode_steps),
      comm.size());
  if (load.imbalance)
    std::printf(
        "expert imbalance %.3f (busiest rank's routed tokens over the mean rank's, "
        "summed over layers and steps)\n",
        *load.imbalance);
  if (K > 0)
    std::printf("%s: %lld of %lld draft tokens accepted (%.3f), up to %lld per step\n",
                speculation.drafter == Drafter::kMtp ? "mtp" : "ngram",
                static_cast<long long>(total_accepted), static_cast<long long>(total_drafts),
                total_drafts > 0 ? double(total_accepted) / total_drafts : 0.0,
                static_cast<long long>(K));
}

}  // namespace

void AddGenerateVerb(CLI::App& app) {
  auto args = std::make_shared<GenerateArgs>();
  CLI::App* verb = app.add_subcommand("generate", "Greedy decoding of prompts, batched");
  verb->add_option("--model", args->model,
                   "Checkpoint directory (default: the default model, models/default)");
  verb->add_option("--prompt", args->prompts, "A text prompt (repeat for a batch)");
  verb->add_flag("--chat", args->chat,
                 "Render each --prompt as a user message through the chat template");
  verb->add_option("--chat-template", args->chat_template,
                   "With --chat: a Jinja chat template (a file, or the template's text) instead "
                   "of the checkpoint's");
  verb->add_option("--prompt-tokens", args->prompt_tokens,
                   "Prompt token ids: '1,2,3;4,5' is two prompts");
  verb->add_flag("--json", args->json, "Print one JSON object: outputs, timings");
  verb->add_option("--max-tokens", args->max_tokens, "Tokens to generate per prompt")
      ->check(CLI::NonNegativeNumber);
  verb->add_option("--warmup", args->warmup,
                   "Run the whole batch this many times untimed before the measured run (first "
                   "calls' page faults and allocations out of the timings); the output is the "
                   "measured run's")
      ->check(CLI::NonNegativeNumber);
  verb->add_flag("--ignore-eos", args->ignore_eos,
                 "Keep generating past the end-of-sequence token");
  verb->add_option("--kv-dtype", args->kv_dtype, "Latent cache dtype")
      ->check(CLI::IsMember(kKvDTypeNames));
  AddSpeculativeOptions(verb, args->speculative);
  AddBatchInvariantOption(verb, args->batch_invariant);
  verb->add_option("--record-expert-load", args->record_expert_load,
                   "Write the routed tokens per MoE layer and expert (all ranks, summed) to this "
                   "JSON file: the input of `switchyard eplb`");
  AddParallelOptions(verb, args->parallel);
  verb->callback([args] { RunGenerate(*args); });
}

}  // namespace sy
