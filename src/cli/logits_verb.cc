// switchyard logits: float32 logits for token sequences, for conformance checks.
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "base/clock.h"
#include "cli/common.h"
#include "cli/parallel_setup.h"
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
  ParallelArgs parallel;
};

void RunLogits(const LogitsArgs& args) {
  auto parsed = ParseTokenLists(args.tokens, "--tokens");
  if (!parsed.ok()) FailVerb(parsed.status().message());
  {
    // Check the output can be written before computing anything (a directory, a missing
    // parent, no permission), without leaving a file behind when the run fails later.
    std::error_code error;
    if (std::filesystem::is_directory(args.out, error))
      FailVerb(args.out + ": is a directory (--out names the file to write)");
    const bool existed = std::filesystem::exists(args.out, error);
    std::ofstream probe(args.out, std::ios::binary | std::ios::app);
    if (!probe) FailVerb(args.out + ": cannot create (" + std::strerror(errno) + ")");
    probe.close();
    if (!existed) std::filesystem::remove(args.out, error);
  }
  const auto& sequences = parsed.value();
  ParallelRun run = LoadParallel(ResolveModelDirectory(args.model), args.parallel);
  Communicator& comm = *run.comm;
  const Model& model = *run.model;
  const int64_t vocab = model.config().vocab_size;
  // Every rank checks every sequence, so a bad id fails all ranks alike before any step.
  for (size_t s = 0; s < sequences.size(); ++s)
    for (size_t i = 0; i < sequences[s].size(); ++i)
      if (sequences[s][i] >= vocab)
        FailEverywhere(
            comm, fmt::format("--tokens: sequence {}, position {}: token id {} is outside [0, {})",
                              s, i, sequences[s][i], vocab));

  ForwardOptions options = run.Options();
  if (args.attention == "expanded")
    options.attention = AttentionForm::kExpanded;
  else if (args.attention == "absorbed")
    options.attention = AttentionForm::kAbsorbed;

  int64_t local_tokens = 0;
  for (size_t s = 0; s < sequences.size(); ++s)
    if (run.Owns(s)) local_tokens += static_cast<int64_t>(sequences[s].size());
  LatentCache cache = model.NewCache(local_tokens, static_cast<int64_t>(sequences.size()),
                                     KvDTypeOrFail(args.kv_dtype));
  std::vector<SequenceCache> caches(sequences.size());
  std::vector<std::vector<float>> rows(sequences.size());  // this rank's sequences only
  std::vector<float> logits;
  auto step = [&](const ForwardBatch& batch, const std::vector<size_t>& members) {
    Status status = model.Forward(batch, cache, options, &logits);
    if (!status.ok()) comm.Abort(status.message(), 1);  // inputs were checked: a real fault
    for (size_t i = 0; i < members.size(); ++i) {
      const auto& slice = batch.sequences[i];
      rows[members[i]].insert(rows[members[i]].end(), logits.begin() + slice.token_offset * vocab,
                              logits.begin() + (slice.token_offset + slice.token_count) * vocab);
    }
  };

  // Prefill: positions [0, K) of this rank's sequences (all of them without --decode-from).
  // Every rank steps, with an empty batch if it has nothing, so expert exchanges complete.
  const int64_t prefill_until = args.decode_from < 0 ? INT64_MAX : args.decode_from;
  ForwardBatch prefill;
  std::vector<size_t> members;
  for (size_t s = 0; s < sequences.size(); ++s) {
    if (!run.Owns(s)) continue;
    const int64_t count =
        std::min<int64_t>(prefill_until, static_cast<int64_t>(sequences[s].size()));
    if (count == 0) continue;
    caches[s].prompt_end = count;  // later positions are decode steps
    prefill.Add(sequences[s].data(), count, &caches[s]);
    members.push_back(s);
  }
  // Step times are the slowest rank's: a step is done when every rank is.
  auto slowest = [&](double seconds) {
    return static_cast<double>(comm.AllReduceMax(static_cast<int64_t>(seconds * 1e9))) / 1e9;
  };
  const int64_t prefill_tokens = comm.AllReduceSum(prefill.size());
  comm.AllReduceMax(0);  // start together
  double started = NowSeconds();
  step(prefill, members);
  const double prefill_seconds = slowest(NowSeconds() - started);
  int64_t decode_steps = 0;
  started = NowSeconds();
  // Decode: one position per unfinished sequence per step, until no rank has work left.
  while (true) {
    ForwardBatch batch;
    members.clear();
    for (size_t s = 0; s < sequences.size(); ++s) {
      if (!run.Owns(s)) continue;
      const int64_t position = caches[s].length;
      if (position >= static_cast<int64_t>(sequences[s].size())) continue;
      batch.Add(&sequences[s][position], 1, &caches[s]);
      members.push_back(s);
    }
    if (comm.AllReduceMax(static_cast<int64_t>(members.size())) == 0) break;
    step(batch, members);
    ++decode_steps;
  }
  const double decode_seconds = slowest(NowSeconds() - started);
  if (comm.rank() == 0) {
    // Each DP group's tokens count once (a TP group's ranks hold the same tokens).
    std::fprintf(stderr, "prefill: %lld tokens in %.3f s (%.1f tok/s)",
                 static_cast<long long>(prefill_tokens / run.tp), prefill_seconds,
                 static_cast<double>(prefill_tokens / run.tp) / prefill_seconds);
    if (decode_steps > 0)
      std::fprintf(stderr, "; decode: %lld steps in %.3f s", static_cast<long long>(decode_steps),
                   decode_seconds);
    std::fprintf(stderr, "\n");
  }

  // Rank 0 writes every sequence's rows in input order.
  std::vector<std::vector<float>> ordered = GatherSequencesToRoot(run, rows);
  if (comm.rank() != 0) return;
  std::ofstream out(args.out, std::ios::binary | std::ios::trunc);
  if (!out) FailVerb(args.out + ": cannot create");
  int64_t total = 0;
  for (const auto& sequence_rows : ordered) {
    out.write(reinterpret_cast<const char*>(sequence_rows.data()),
              static_cast<std::streamsize>(sequence_rows.size() * sizeof(float)));
    total += static_cast<int64_t>(sequence_rows.size()) / vocab;
  }
  if (!out) FailVerb(args.out + ": write failed");
  std::fprintf(stderr, "wrote %lld rows x %lld logits to %s\n", static_cast<long long>(total),
               static_cast<long long>(vocab), args.out.c_str());
}

}  // namespace

void AddLogitsVerb(CLI::App& app) {
  auto args = std::make_shared<LogitsArgs>();
  CLI::App* verb =
      app.add_subcommand("logits", "Write float32 logits [rows x vocab] for token sequences");
  verb->add_option("--model", args->model,
                   "Checkpoint directory (config.json + safetensors; default: models/default)");
  verb->add_option("--tokens", args->tokens, "Token ids: '1,2,3;4,5' is two sequences")->required();
  verb->add_option("--out", args->out, "Output file: little-endian f32, one row per position")
      ->required();
  verb->add_option("--decode-from", args->decode_from,
                   "Prefill positions [0, K), then decode every later position one token per step")
      ->check(CLI::NonNegativeNumber);
  verb->add_option(
          "--kv-dtype", args->kv_dtype,
          "Latent cache dtype (f32 keeps the reference's arithmetic; bf16 as deployed; fp8)")
      ->check(CLI::IsMember(kKvDTypeNames));
  verb->add_option(
          "--attention", args->attention,
          "MLA form: auto (expanded for prefill, absorbed for decode), expanded or absorbed")
      ->check(CLI::IsMember({"auto", "expanded", "absorbed"}));
  AddParallelOptions(verb, args->parallel);
  verb->callback([args] { RunLogits(*args); });
}

}  // namespace sy
