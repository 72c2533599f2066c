// switchyard bench tokenizer (encode throughput beside Hugging Face tokenizers, or the tiktoken
// library for a tiktoken.model checkpoint), bench
// chat-template (prompt rendering beside transformers') and bench serve (a load generator with
// vLLM bench serve's metrics).
#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "bench/chat_template_bench.h"
#include "bench/tokenizer_bench.h"
#include "cli/common.h"
#include "cli/verbs.h"

namespace sy {

void AddBenchTokenizerCommand(CLI::App& bench_app) {
  struct Args {
    bench::TokenizerBenchOptions options;
    bool json = false;
  };
  auto args = std::make_shared<Args>();
  args->options.tokenizer = std::string(SY_SOURCE_DIR) + "/tests/fixtures/tokenizer/deepseek-v3";
  args->options.corpus = std::string(SY_SOURCE_DIR) + "/tests/fixtures/tokenizer/corpus.jsonl";
  args->options.hf_python = std::string(SY_SOURCE_DIR) + "/.venv-tokenizer/bin/python";
  CLI::App* t = bench_app.add_subcommand(
      "tokenizer",
      "Encode throughput on one thread, side by side with Hugging Face tokenizers (tiktoken for "
      "a tiktoken.model checkpoint)");
  t->add_option("--tokenizer", args->options.tokenizer,
                "tokenizer.json or its directory, or a directory with tiktoken.model (Kimi K2's; "
                "tests/fixtures/tiktoken is one) (default: DeepSeek-V3's, from the fixtures)");
  t->add_option("--corpus", args->options.corpus, "JSON Lines of {\"text\": ...}");
  t->add_option(
      "--hf-python", args->options.hf_python,
      "A Python with `tokenizers` (and `tiktoken`) installed (default: .venv-tokenizer in "
      "the checkout)");
  t->add_option("--model", args->options.model,
                "Model whose prefill rate the long prompt is set against (default: the embedded "
                "model)");
  t->add_option("--repetitions", args->options.repetitions, "Timed repetitions (median reported)")
      ->check(CLI::Range(1, 101));
  t->add_flag("--json", args->json, "Print one JSON object");
  t->callback([args] {
    args->options.model = ResolveModelDirectory(args->options.model);
    auto report = bench::BenchTokenizer(args->options);
    if (!report.ok()) FailVerb(report.status().message());
    std::fputs((args->json ? bench::TokenizerReportJson(report.value()) + "\n"
                           : bench::TokenizerReportTable(report.value()))
                   .c_str(),
               stdout);
  });
}

void AddBenchChatTemplateCommand(CLI::App& bench_app) {
  auto options = std::make_shared<bench::ChatTemplateBenchOptions>();
  const std::string fixtures = std::string(SY_SOURCE_DIR) + "/tests/fixtures";
  options->hf_python = std::string(SY_SOURCE_DIR) + "/.venv-tokenizer/bin/python";
  options->conversations = {fixtures + "/tokenizer/chat/conversations.json",
                            fixtures + "/jinja/conversations.json"};
  CLI::App* c = bench_app.add_subcommand(
      "chat-template",
      "Prompt rendering per chat template, side by side with transformers' (Jinja2)");
  c->add_option("--templates", options->templates,
                "Template files (default: the committed ones, tests/fixtures/{jinja,tokenizer}/"
                "templates)");
  c->add_option("--conversations", options->conversations,
                "JSON lists of {messages, add_generation_prompt, tools?, extra?} (default: the "
                "fixtures')");
  c->add_option("--hf-python", options->hf_python,
                "A Python with transformers installed (default: .venv-tokenizer in the checkout)");
  c->add_option("--repetitions", options->repetitions, "Timed repetitions (median reported)")
      ->check(CLI::Range(1, 101));
  c->callback([options, fixtures] {
    if (options->templates.empty())
      for (const char* dir : {"/jinja/templates", "/tokenizer/templates"})
        for (const auto& entry : std::filesystem::directory_iterator(fixtures + dir))
          if (entry.path().extension() == ".jinja") options->templates.push_back(entry.path());
    std::sort(options->templates.begin(), options->templates.end());
    auto report = bench::RunChatTemplateBench(*options);
    if (!report.ok()) FailVerb(report.status().message());
    std::fputs(bench::ChatTemplateReportTable(report.value()).c_str(), stdout);
  });
}

}  // namespace sy

#include "bench/serve_bench.h"

namespace sy {

void AddBenchServeCommand(CLI::App& bench_app) {
  struct Args {
    bench::ServeBenchOptions options;
    bool json = false;
  };
  auto args = std::make_shared<Args>();
  auto& o = args->options;
  CLI::App* s = bench_app.add_subcommand(
      "serve", "Load an OpenAI-compatible server; vLLM bench serve's metrics and JSON keys");
  s->add_option("--url", o.url, "Server base URL (http://HOST:PORT)");
  s->add_option("--model", o.model, "Model name (default: the server's first)");
  s->add_option("--dataset", o.dataset, "random or shared-prefix")
      ->check(CLI::IsMember({"random", "shared-prefix"}));
  s->add_option("--num-prompts", o.num_prompts, "Requests")->check(CLI::Range(1, 1000000));
  s->add_option("--input-len", o.input_len, "Prompt tokens")->check(CLI::Range(1, 1 << 24));
  s->add_option("--output-len", o.output_len, "Generated tokens")->check(CLI::Range(1, 1 << 24));
  s->add_option("--range-ratio", o.range_ratio, "Lengths drawn from [L(1-r), L(1+r)]")
      ->check(CLI::Range(0.0, 1.0));
  s->add_option("--concurrency", o.concurrency,
                "Requests in flight at most (vLLM's --max-concurrency)")
      ->check(CLI::Range(1, 100000));
  s->add_option("--request-rate", o.request_rate,
                "Poisson arrivals per second (default: all at once)")
      ->check(CLI::Range(0.0, 1e6));
  s->add_option("--prefix-len", o.prefix_len,
                "shared-prefix: tokens a group shares (default 3/4 of input)");
  s->add_option("--num-prefixes", o.num_prefixes, "shared-prefix: groups (default num-prompts/8)");
  s->add_option("--vocab-size", o.vocab_size, "Prompt ids are drawn from [16, V) (default 4096)");
  s->add_option("--seed", o.seed, "Random seed for prompts and arrivals");
  s->add_option("--goodput-ttft-ms", o.goodput_ttft_ms, "SLO for goodput: TTFT");
  s->add_option("--goodput-tpot-ms", o.goodput_tpot_ms, "SLO for goodput: TPOT");
  s->add_option("--goodput-e2el-ms", o.goodput_e2el_ms, "SLO for goodput: end-to-end latency");
  s->add_option("--api-key", o.api_key, "Bearer key");
  s->add_option("--ssl-ca-certs", o.ssl_ca_certs,
                "https://: PEM CAs to verify the server with (default: the system's)");
  s->add_flag("--insecure", o.insecure, "https://: do not verify the server's certificate");
  s->add_option("--response-format", o.response_format_file,
                "JSON file: a response_format sent with every request (structured output; "
                "requests then end when their output is complete)");
  s->add_flag("--cold-grammar", o.cold_grammar,
              "With a json_schema --response-format: a different schema text per request, so "
              "each compiles its grammar afresh");
  s->add_flag("--json", args->json, "Print vLLM's result JSON");
  s->callback([args] {
    auto result = bench::BenchServe(args->options);
    if (!result.ok()) FailVerb(result.status().message());
    std::fputs((args->json ? result->json + "\n" : result->table).c_str(), stdout);
  });
}

}  // namespace sy

#include "bench/accuracy_bench.h"
#include "bench/beam_bench.h"
#include "bench/mtp_bench.h"
#include "cli/parallel_setup.h"
#include "engine/sampling.h"

namespace sy {

void AddBenchMtpCommand(CLI::App& bench_app) {
  struct Args {
    std::string model;
    bench::MtpBenchOptions options;
    std::string kv_dtype = "bf16";
    bool json = false;
    ParallelArgs parallel;
    std::string drafter = "mtp";
    std::optional<int64_t> lookup_min, lookup_max;
    std::string lookup_drafts;
  };
  auto args = std::make_shared<Args>();
  args->options.prompts = std::string(SY_SOURCE_DIR) + "/configs/bench/heldout-prompts.jsonl";
  CLI::App* m = bench_app.add_subcommand(
      "mtp",
      "Greedy decoding with speculative drafts (MTP, or n-gram lookup) side by side with plain "
      "decoding, by batch size");
  m->alias("speculative");
  m->add_option("--speculative", args->drafter, "The drafter: mtp (default) or ngram")
      ->check(CLI::IsMember({"mtp", "ngram"}));
  m->add_option("--prompt-lookup-min", args->lookup_min, "--speculative ngram: see serve")
      ->check(CLI::Range(1, 64));
  m->add_option("--prompt-lookup-max", args->lookup_max, "--speculative ngram: see serve")
      ->check(CLI::Range(1, 64));
  m->add_option("--prompt-lookup-drafts", args->lookup_drafts,
                "--speculative ngram: by-match or fixed (see serve)")
      ->check(CLI::IsMember({"by-match", "fixed"}));
  m->add_option("--model", args->model, "Checkpoint directory (default: the default model)");
  m->add_option("--prompts", args->options.prompts,
                "JSON Lines of {\"text\": ...} (default: held-out Tempest and Sonnets passages)");
  m->add_option("--batches", args->options.batches, "Batch sizes")
      ->delimiter(',')
      ->check(CLI::Range(int64_t{1}, int64_t{4096}));
  m->add_option("--num-speculative-tokens", args->options.draft_counts, "Draft counts K to run")
      ->delimiter(',')
      ->check(CLI::Range(int64_t{1}, int64_t{8}));
  m->add_option("--max-tokens", args->options.max_tokens, "Tokens generated per prompt")
      ->check(CLI::Range(int64_t{2}, int64_t{100000}));
  m->add_option("--repeats", args->options.repeats, "Timed runs of each case (median reported)")
      ->check(CLI::Range(1, 101));
  m->add_option("--kv-dtype", args->kv_dtype, "Latent cache dtype")
      ->check(CLI::IsMember(kKvDTypeNames));
  m->add_flag("--json", args->json, "Print one JSON object");
  AddParallelOptions(m, args->parallel);
  m->callback([args] {
    const std::string directory = ResolveModelDirectory(args->model);
    TextCodec codec = LoadTextCodecOrFail(directory);
    ParallelRun run = LoadParallel(directory, args->parallel);
    args->options.kv_dtype = KvDTypeOrFail(args->kv_dtype);
    // The drafter and lookup sizes as serve reads them (the draft counts are this verb's list).
    SpeculativeArgs speculative{args->drafter,    std::nullopt,        args->lookup_min,
                                args->lookup_max, args->lookup_drafts, ""};
    auto speculation = ParseSpeculation(speculative, run.model->has_mtp());
    if (!speculation.ok()) FailEverywhere(*run.comm, speculation.status().message());
    args->options.drafter = speculation->drafter;
    args->options.ngram = speculation->ngram;
    auto report = bench::BenchMtp(run, codec, args->options);
    if (!report.ok()) FailEverywhere(*run.comm, report.status().message());
    if (run.comm->rank() != 0) return;
    std::fputs((args->json ? bench::MtpReportJson(report.value()) + "\n"
                           : bench::MtpReportTable(report.value()))
                   .c_str(),
               stdout);
  });
}

void AddBenchBeamSearchCommand(CLI::App& bench_app) {
  struct Args {
    std::string model;
    bench::BeamBenchOptions options;
    std::string kv_dtype = "bf16";
    bool json = false;
    ParallelArgs parallel;
  };
  auto args = std::make_shared<Args>();
  args->options.prompts = std::string(SY_SOURCE_DIR) + "/configs/bench/heldout-prompts.jsonl";
  CLI::App* b = bench_app.add_subcommand(
      "beam-search",
      "Beam searches (use_beam_search) side by side with sampling as many sequences, by width");
  b->add_option("--model", args->model, "Checkpoint directory (default: the default model)");
  b->add_option("--prompts", args->options.prompts,
                "JSON Lines of {\"text\": ...} (default: held-out Tempest and Sonnets passages)");
  b->add_option("--widths", args->options.widths, "Beam widths (n)")
      ->delimiter(',')
      ->check(CLI::Range(int64_t{1}, kMaxBeamWidth));
  b->add_option("--searches", args->options.searches, "Prompts searched at once")
      ->check(CLI::Range(int64_t{1}, int64_t{256}));
  b->add_option("--max-tokens", args->options.max_tokens, "Tokens per sequence")
      ->check(CLI::Range(int64_t{1}, int64_t{100000}));
  b->add_option("--repeats", args->options.repeats, "Timed runs of each case (median reported)")
      ->check(CLI::Range(1, 101));
  b->add_option("--kv-dtype", args->kv_dtype, "Latent cache dtype")
      ->check(CLI::IsMember(kKvDTypeNames));
  b->add_flag("--no-partial-pages{false}", args->options.keep_partial_pages,
              "Recompute each step's partial last pages instead of copying the kept ones (as "
              "engines without them do)");
  b->add_flag("--no-shared-page-wait{false}", args->options.wait_for_shared_pages,
              "Let requests of one prompt arriving together each compute it (the sampling side "
              "mostly)");
  b->add_flag("--json", args->json, "Print one JSON object");
  AddParallelOptions(b, args->parallel);
  b->callback([args] {
    const std::string directory = ResolveModelDirectory(args->model);
    TextCodec codec = LoadTextCodecOrFail(directory);
    ParallelRun run = LoadParallel(directory, args->parallel);
    args->options.kv_dtype = KvDTypeOrFail(args->kv_dtype);
    auto report = bench::BenchBeamSearch(run, codec, args->options);
    if (!report.ok()) FailEverywhere(*run.comm, report.status().message());
    std::fputs((args->json ? bench::BeamReportJson(report.value()) + "\n"
                           : bench::BeamReportTable(report.value()))
                   .c_str(),
               stdout);
  });
}

void AddBenchAccuracyCommand(CLI::App& bench_app) {
  struct Args {
    std::string model;
    std::string against;
    std::string kv_dtype;
    std::string prompts = std::string(SY_SOURCE_DIR) + "/configs/bench/heldout-prompts.jsonl";
    bool json = false;
  };
  auto args = std::make_shared<Args>();
  CLI::App* a = bench_app.add_subcommand(
      "accuracy",
      "What --int8-products (or --kv-dtype, or a quantized checkpoint) costs: perplexity, KL "
      "from the exact run and top-1 agreement on held-out text");
  a->add_option("--model", args->model, "Checkpoint directory (default: the default model)");
  a->add_option("--prompts", args->prompts,
                "JSON Lines of {\"text\": ...} (default: held-out Tempest and Sonnets passages)");
  a->add_option("--against", args->against,
                "Compare the model as it loads (a GGUF with its native quantized products, say) "
                "with this checkpoint's exact products, instead of exact against int8");
  a->add_option("--kv-dtype", args->kv_dtype,
                "Compare a latent cache of this dtype (bf16, fp8) with an f32 one, the products "
                "exact in both, instead of exact against int8")
      ->check(CLI::IsMember(kKvDTypeNames));
  a->add_flag("--json", args->json, "Print one JSON object");
  a->callback([args] {
    const std::string directory = ResolveModelDirectory(args->model);
    TextCodec codec = LoadTextCodecOrFail(directory);
    if (!args->against.empty() && !args->kv_dtype.empty())
      FailVerb("--against and --kv-dtype each choose what is compared: give one");
    auto report = !args->kv_dtype.empty()
                      ? bench::BenchCacheAccuracy(directory, codec, args->prompts,
                                                  KvDTypeOrFail(args->kv_dtype))
                  : args->against.empty()
                      ? bench::BenchInt8Accuracy(directory, codec, args->prompts)
                      : bench::BenchAccuracyAgainst(directory, args->against, codec, args->prompts);
    if (!report.ok()) FailVerb(report.status().message());
    std::fputs((args->json ? bench::AccuracyReportJson(report.value()) + "\n"
                           : bench::AccuracyReportTable(report.value()))
                   .c_str(),
               stdout);
  });
}

}  // namespace sy

#include "bench/transfer_bench.h"

namespace sy {

void AddBenchTransferCommand(CLI::App& bench_app) {
  auto o = std::make_shared<bench::TransferBenchOptions>();
  CLI::App* t = bench_app.add_subcommand(
      "transfer", "The disaggregation transport (UCX) between two processes: --listen, --to");
  t->add_option("--listen", o->listen, "Receive on host:port (port 0: any; printed)");
  t->add_option("--to", o->to, "Send to the receiver at host:port");
  t->add_option("--tokens", o->tokens, "Rows per transfer (a prompt)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 24));
  t->add_option("--chunk", o->chunk, "Rows per message (a prefill chunk)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 24));
  t->add_option("--layers", o->layers, "Cache layers (DeepSeek-V3: 61)")
      ->check(CLI::Range(int64_t{1}, int64_t{4096}));
  t->add_option("--row-bytes", o->row_bytes, "Bytes of one layer's row (DeepSeek-V3 bf16: 1152)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  t->add_option("--transfers", o->transfers, "Transfers (the median is reported)")
      ->check(CLI::Range(int64_t{1}, int64_t{100000}));
  t->callback([o] {
    if (o->listen.empty() == o->to.empty()) FailVerb("bench transfer: give --listen or --to");
    Status s = o->listen.empty() ? bench::RunTransferSender(*o) : bench::RunTransferReceiver(*o);
    if (!s.ok()) FailVerb(s.message());
  });
}

}  // namespace sy
