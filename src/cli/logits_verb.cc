// switchyard logits: float32 logits for token sequences, for conformance checks.
#include <cstdio>
#include <fstream>

#include "cli/common.h"
#include "cli/token_lists.h"
#include "cli/verbs.h"

namespace sy {
namespace {

struct LogitsArgs {
  std::string model;
  std::string tokens;
  std::string out;
  int64_t decode_from = -1;
  std::string kv_dtype = "f32";  // a conformance tool: exact by default
  std::string attention = "auto";
};

void RunLogits(const LogitsArgs& args) {
  auto parsed = ParseTokenLists(args.tokens, "--tokens");
  if (!parsed.ok()) FailVerb(parsed.status().message());
  const auto& sequences = parsed.value();
  auto model = LoadModelOrFail(args.model);
  const ModelConfig& config = model->config();

  ForwardOptions options;
  if (args.attention == "expanded") options.attention = AttentionForm::kExpanded;
  else if (args.attention == "absorbed") options.attention = AttentionForm::kAbsorbed;

  int64_t total = 0;
  for (const auto& s : sequences) total += static_cast<int64_t>(s.size());
  LatentCache cache = model->NewCache(total, static_cast<int64_t>(sequences.size()),
                                      KvDTypeOrFail(args.kv_dtype));
  std::vector<SequenceCache> caches(sequences.size());
  // Per sequence, the logits of each position in order.
  std::vector<std::vector<float>> rows(sequences.size());
  const int64_t vocab = config.vocab_size;
  std::vector<float> logits;

  // Prefill: every sequence's first K positions (all of them without --decode-from), batched.
  const int64_t prefill_until = args.decode_from < 0 ? INT64_MAX : args.decode_from;
  ForwardBatch prefill;
  std::vector<size_t> prefilled;
  for (size_t s = 0; s < sequences.size(); ++s) {
    int64_t count = std::min<int64_t>(prefill_until, static_cast<int64_t>(sequences[s].size()));
    if (count == 0) continue;
    prefill.Add(sequences[s].data(), count, &caches[s]);
    prefilled.push_back(s);
  }
  if (prefill.size() > 0) {
    Status status = model->Forward(prefill, cache, options, &logits);
    if (!status.ok()) FailVerb(status.message());
    for (size_t i = 0; i < prefilled.size(); ++i) {
      const auto& slice = prefill.sequences[i];
      auto& target = rows[prefilled[i]];
      target.insert(target.end(), logits.begin() + slice.token_offset * vocab,
                    logits.begin() + (slice.token_offset + slice.token_count) * vocab);
    }
  }
  // Decode: one position per sequence per step, all unfinished sequences batched together.
  while (true) {
    ForwardBatch step;
    std::vector<size_t> members;
    for (size_t s = 0; s < sequences.size(); ++s) {
      const int64_t position = caches[s].length;
      if (position >= static_cast<int64_t>(sequences[s].size())) continue;
      step.Add(&sequences[s][position], 1, &caches[s]);
      members.push_back(s);
    }
    if (members.empty()) break;
    Status status = model->Forward(step, cache, options, &logits);
    if (!status.ok()) FailVerb(status.message());
    for (size_t i = 0; i < members.size(); ++i)
      rows[members[i]].insert(rows[members[i]].end(), logits.begin() + i * vocab,
                              logits.begin() + (i + 1) * vocab);
  }

  std::ofstream out(args.out, std::ios::binary | std::ios::trunc);
  if (!out) FailVerb(args.out + ": cannot create");
  for (const auto& sequence_rows : rows)
    out.write(reinterpret_cast<const char*>(sequence_rows.data()),
              static_cast<std::streamsize>(sequence_rows.size() * sizeof(float)));
  if (!out) FailVerb(args.out + ": write failed");
  std::fprintf(stderr, "wrote %lld rows x %lld logits to %s\n", static_cast<long long>(total),
               static_cast<long long>(vocab), args.out.c_str());
}

}  // namespace

void AddLogitsVerb(CLI::App& app) {
  auto args = std::make_shared<LogitsArgs>();
  CLI::App* verb = app.add_subcommand("logits", "Write float32 logits [rows x vocab] for token sequences");
  verb->add_option("--model", args->model, "Checkpoint directory (config.json + safetensors)")->required();
  verb->add_option("--tokens", args->tokens, "Token ids: '1,2,3;4,5' is two sequences")->required();
  verb->add_option("--out", args->out, "Output file: little-endian f32, one row per position")->required();
  verb->add_option("--decode-from", args->decode_from,
                   "Prefill positions [0, K), then decode every later position one token per step")
      ->check(CLI::NonNegativeNumber);
  verb->add_option("--kv-dtype", args->kv_dtype, "Latent cache dtype (f32 keeps the reference's arithmetic; bf16 as deployed)")->check(CLI::IsMember({"bf16", "f32"}));
  verb->add_option("--attention", args->attention, "MLA form: auto (expanded for prefill, absorbed for decode), expanded or absorbed")
      ->check(CLI::IsMember({"auto", "expanded", "absorbed"}));
  verb->callback([args] { RunLogits(*args); });
}

}  // namespace sy
