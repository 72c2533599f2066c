// switchyard bench: kernel, layer and decode benchmarks, each against the machine's peaks
// measured in the same run.
#include <cstdio>

#include "bench/kernel_bench.h"
#include "bench/machine_peaks.h"
#include "cli/common.h"
#include "cli/verbs.h"
#include "kernels/cpu/amx_kernels.h"
#include "kernels/cpu/isa_level.h"

namespace sy {
namespace {

struct BenchKernelsArgs {
  bool quick = false;
  bool json = false;
  bool onednn = true;
  bool ggml_only = false;
  bool amx_only = false;
  bool dsa_only = false;
  bool mla_only = false;
  int64_t stream_mib = 0;
  int repetitions = 5;
};

bench::MachinePeaks MeasurePeaks(bool quick) {
  // 1 GiB per array, or 2.5x the last-level cache where that is more (480 MB on some Xeons).
  return bench::MeasureMachine(bench::StreamingBytes(1ll << 30), quick ? 3 : 5);
}

void RunBenchKernels(const BenchKernelsArgs& args) {
  if (args.amx_only && kernels::ActiveAmxBackend() != kernels::AmxBackend::kHardware) {
    const kernels::AmxStatus amx = kernels::Amx();
    FailVerb("bench kernels --amx-only: this process cannot use AMX tiles (AMX: " + amx.detail +
             (amx.state == kernels::AmxState::kReady ? ", but --max-isa is below native" : "") +
             ")");
  }
  bench::MachinePeaks peaks = MeasurePeaks(args.quick);
  bench::KernelBenchOptions options;
  options.quick = args.quick;
  // Weights cycled per shape: 1 GiB (quick runs 512 MiB), or 2.5x the last-level cache where
  // that is more, so memory-bound rows measure memory, not cache.
  options.stream_bytes = bench::StreamingBytes(args.quick ? 512ll << 20 : 1ll << 30);
  options.repetitions = args.repetitions;
  options.onednn = args.onednn;
  options.ggml_only = args.ggml_only;
  options.amx_only = args.amx_only;
  options.dsa_only = args.dsa_only;
  options.mla_only = args.mla_only;
  if (args.stream_mib > 0) options.stream_bytes = args.stream_mib << 20;
  auto results = bench::BenchKernels(peaks, options);
  std::fputs((args.json ? bench::KernelResultsJson(peaks, results)
                        : bench::KernelResultsTable(peaks, results))
                 .c_str(),
             stdout);
}

}  // namespace

void AddBenchVerb(CLI::App& app) {
  CLI::App* verb = app.add_subcommand("bench", "Benchmarks against the machine's measured peaks");
  verb->require_subcommand(1);
  auto kernels = std::make_shared<BenchKernelsArgs>();
  CLI::App* k = verb->add_subcommand(
      "kernels", "Kernels at DeepSeek-V3 shapes: bandwidth, FLOP/s, roofline fraction");
  k->add_flag("--quick", kernels->quick,
              "Fewer shapes and repetitions (about three minutes on 2 cores)");
  k->add_flag("--json", kernels->json, "Print one JSON object");
  k->add_flag(
      "--onednn,!--no-onednn", kernels->onednn,
      "oneDNN's bf16 matmul beside ours on the batched-decode and prefill shapes (default)");
  k->add_flag("--ggml-only", kernels->ggml_only,
              "Only the GGUF Q4_K and Q6_K products (kernels/cpu/ggml_gemm.h)");
  k->add_flag("--amx-only", kernels->amx_only,
              "Only the products on AMX bf16 tiles, plain and grouped: fp8 (--amx-bf16), and "
              "bf16 laid out as the tiles (as the loader lays it out where the CPU has AMX), with "
              "oneDNN's o_proj beside them; where the CPU has AMX");
  k->add_flag("--dsa-only", kernels->dsa_only,
              "Only DeepSeek-V3.2's sparse attention: dense MLA, the indexer's choice and DSA "
              "whole, side by side, in decode at 4k, 16k and 64k cached keys and for a 512-token "
              "prompt chunk ending at 4k and 16k");
  k->add_flag("--mla-only", kernels->mla_only,
              "Only MLA's flash-decode kernel at DeepSeek-V3's 128 heads, over a bf16 and an fp8 "
              "latent cache side by side (--kv-dtype): 5k cached keys at batch 1, 4 and 16, and "
              "32k at batch 4 (over twice the last-level cache of most CPUs)");
  k->add_option("--stream-mib", kernels->stream_mib,
                "Weights cycled per shape, MiB (default: the rule above). Small: the kernels "
                "from cache, their compute rate")
      ->check(CLI::Range(1, 1 << 20));
  k->add_option("--repetitions", kernels->repetitions,
                "Timed repetitions per result (median reported)")
      ->check(CLI::Range(1, 101));
  k->callback([kernels] { RunBenchKernels(*kernels); });
  AddBenchLayerCommand(*verb);
  AddBenchDecodeCommand(*verb);
  AddBenchExchangeCommand(*verb);
  AddBenchTokenizerCommand(*verb);
  AddBenchChatTemplateCommand(*verb);
  AddBenchServeCommand(*verb);
  AddBenchMtpCommand(*verb);
  AddBenchBeamSearchCommand(*verb);
  AddBenchAccuracyCommand(*verb);
  AddBenchTransferCommand(*verb);
}

}  // namespace sy

#include "bench/decode_bench.h"
#include "bench/exchange_bench.h"
#include "bench/layer_bench.h"
#include "parallel/communicator.h"

namespace sy {
namespace {

struct BenchLayerArgs {
  bench::LayerBenchOptions options;
  bool json = false;
  std::string progress_thread = "on";
};

}  // namespace

void AddBenchLayerCommand(CLI::App& bench_app) {
  auto args = std::make_shared<BenchLayerArgs>();
  CLI::App* l =
      bench_app.add_subcommand("layer", "One DeepSeek-V3 MoE layer of one EP rank, stage by stage");
  l->add_option("--ep", args->options.ep, "EP size: this rank holds 256/EP routed experts")
      ->check(CLI::IsMember({1, 2, 4, 8, 16, 32, 64, 128, 256}));
  l->add_option("--batches", args->options.batches, "Batches per rank")->delimiter(',');
  l->add_option("--query-len", args->options.query_lengths, "Query lengths (1, or 2 with MTP)")
      ->delimiter(',');
  l->add_option("--kv-len", args->options.kv_len, "Cached tokens per request")
      ->check(CLI::PositiveNumber);
  l->add_option("--repetitions", args->options.repetitions, "Timed runs (median)")
      ->check(CLI::Range(1, 101));
  l->add_option("--overlap", args->options.overlaps,
                "Overlap modes, run alternately batch by batch: none, dispatch, microbatch "
                "(the five-stage two-micro-batch schedule)")
      ->delimiter(',')
      ->check(CLI::IsMember({"none", "dispatch", "microbatch"}));
  l->add_option("--layers", args->options.layers, "Consecutive MoE layers per timed run")
      ->check(CLI::Range(1, 8));
  l->add_option("--progress-thread", args->progress_thread,
                "Under mpirun: a thread advancing started exchanges (on) or not (off)")
      ->check(CLI::IsMember({"on", "off"}));
  l->add_flag("--json", args->json, "Print JSON");
  l->callback([args] {
    CommunicationOptions().progress_thread = args->progress_thread == "on";
    auto results = bench::BenchLayer(args->options);
    if (WorldCommunicator().rank() != 0) return;
    std::fputs((args->json ? bench::LayerResultsJson(args->options, results)
                           : bench::LayerResultsTable(args->options, results))
                   .c_str(),
               stdout);
  });
}

void AddBenchExchangeCommand(CLI::App& bench_app) {
  auto options = std::make_shared<bench::ExchangeBenchOptions>();
  CLI::App* e = bench_app.add_subcommand(
      "exchange", "Under mpirun: dispatch and combine alone, against the all-to-all peak");
  e->add_option("--tokens", options->tokens, "Tokens per rank")->delimiter(',');
  e->add_option("--wire-dtype", options->wires, "Row formats")
      ->delimiter(',')
      ->check(CLI::IsMember({"bf16", "f32", "fp8"}));
  e->add_option("--repetitions", options->repetitions, "Timed runs (median)")
      ->check(CLI::Range(1, 101));
  e->callback([options] {
    if (WorldCommunicator().size() < 2)
      FailVerb("bench exchange needs mpirun with 2 or more ranks");
    auto report = bench::BenchExchange(*options);
    if (WorldCommunicator().rank() == 0)
      std::fputs(bench::ExchangeReportTable(report).c_str(), stdout);
  });
}

void AddBenchDecodeCommand(CLI::App& bench_app) {
  struct Args {
    std::string model, against;
    bench::DecodeBenchOptions options;
  };
  auto args = std::make_shared<Args>();
  CLI::App* d = bench_app.add_subcommand(
      "decode", "End-to-end decode tok/s next to the memory-bandwidth bound");
  d->add_option("--model", args->model,
                "Checkpoint directory (default: the default model, models/default)");
  d->add_option("--batches", args->options.batches, "Batches")->delimiter(',');
  d->add_option("--steps", args->options.steps, "Timed decode steps per batch")
      ->check(CLI::PositiveNumber);
  d->add_option("--prompt-len", args->options.prompt_len, "Prompt tokens per sequence")
      ->check(CLI::PositiveNumber);
  d->add_option("--against", args->against,
                "A second checkpoint (or the same one) in the same process, decode steps "
                "alternated with --model's: the paired ratio of step times");
  d->callback([args] {
    if (!args->against.empty()) {
      const std::string a = ResolveModelDirectory(args->model);
      const std::string b = ResolveModelDirectory(args->against);
      auto paired = bench::BenchDecodePaired(a, b, args->options);
      if (!paired.ok()) FailVerb(paired.status().message());
      std::fputs(bench::PairedDecodeTable(a, b, paired.value()).c_str(), stdout);
      return;
    }
    bench::MachinePeaks peaks = bench::MeasureMachine(bench::StreamingBytes(1ll << 30), 3);
    auto results = bench::BenchDecode(ResolveModelDirectory(args->model), peaks, args->options);
    if (!results.ok()) FailVerb(results.status().message());
    std::fputs(bench::DecodeResultsTable(peaks, results.value()).c_str(), stdout);
  });
}

}  // namespace sy
