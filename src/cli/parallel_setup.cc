#include "cli/parallel_setup.h"

#include <cstdio>

#include "cli/verbs.h"

namespace sy {

void FailEverywhere(Communicator& comm, const std::string& message) {
  if (comm.size() == 1) FailVerb(message);
  // Every rank reached the same conclusion from the same inputs: exit together, no abort needed.
  if (comm.rank() == 0) std::fprintf(stderr, "error: %s\n", message.c_str());
  std::fflush(stderr);
  comm.AllReduceMax(0);  // nobody leaves while a peer still waits in a collective
  throw CLI::RuntimeError(1);
}

void AddParallelOptions(CLI::App* verb, ParallelArgs& args) {
  verb->add_option("--wire-dtype", args.wire_dtype,
                   "Row format between expert-parallel ranks: bf16, f32, or fp8 (dispatch in e4m3 "
                   "with a scale per 128 values, combine in bf16)")
      ->check(CLI::IsMember({"bf16", "f32", "fp8"}));
  verb->add_option("--tp", args.tp,
                   "Tensor-parallel ranks per DP group: attention heads split, EP = ranks")
      ->check(CLI::PositiveNumber);
  verb->add_option("--overlap", args.overlap,
                   "Communication overlap: none; dispatch (shared expert between dispatch send and "
                   "receive); microbatch (two halves whose exchanges interleave)")
      ->check(CLI::IsMember({"none", "dispatch", "microbatch"}));
  verb->add_option("--attention-split", args.attention_split,
                   "With --tp: heads (every rank holds the group's tokens, heads split, o_proj "
                   "all-reduced) or sp-tp-sp (tokens spread over the group, q and outputs "
                   "exchanged, TP over heads; the prefill recipe for few or long requests)")
      ->check(CLI::IsMember({"heads", "sp-tp-sp"}));
  verb->add_option("--progress-thread", args.progress_thread,
                   "A thread advancing started exchanges while compute runs")
      ->check(CLI::IsMember({"on", "off"}));
}

ParallelRun LoadParallel(const std::string& directory, const ParallelArgs& args) {
  auto run = LoadParallelRun(directory, args);
  if (!run.ok()) FailVerb(run.status().message());
  return std::move(run).value();
}

}  // namespace sy
