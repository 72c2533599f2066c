// `switchyard bench serve`: a load generator for any OpenAI-compatible completions server, with
// the metric definitions and JSON keys of vLLM's `vllm bench serve`, so figures compare across
// engines: TTFT (send → first streamed token), TPOT ((latency − TTFT) / (output tokens − 1)),
// ITL (every gap between streamed chunks), E2EL (send → last byte); request, output and total
// token throughput over the run's duration; goodput against optional SLOs. Prompts are token ids
// (exact input lengths); outputs run to --output-len with ignore_eos.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"

namespace sy::bench {

struct ServeBenchOptions {
  std::string url = "http://127.0.0.1:8000";
  std::string model;               // empty: the first of /v1/models
  std::string dataset = "random";  // random | shared-prefix
  int64_t num_prompts = 100;
  int64_t input_len = 128;
  int64_t output_len = 128;
  double range_ratio = 0.0;  // input/output lengths drawn from [L(1−r), L(1+r)]
  int64_t concurrency = 0;   // 0: unbounded (with --request-rate)
  double request_rate = 0;   // requests per second, Poisson arrivals; 0: all at once
  int64_t prefix_len = 0;    // shared-prefix: tokens every prompt of a group shares
  int64_t num_prefixes = 0;  // shared-prefix: groups
  int64_t vocab_size = 0;    // 0: ask the server (/tokenize is not needed: ids below 256)
  uint64_t seed = 0;
  double goodput_ttft_ms = 0, goodput_tpot_ms = 0, goodput_e2el_ms = 0;  // 0: no SLO
  std::string api_key;
  std::string ssl_ca_certs;  // https://: the CAs to verify the server with (default: system's)
  bool insecure = false;     // https://: do not verify the server's certificate
  // Structured output: a response_format object (JSON file) sent with every request, which then
  // ends when its output is complete (no ignore_eos). cold_grammar: each request's json_schema
  // gets its own "$comment", so every one compiles its grammar afresh.
  std::string response_format_file;
  bool cold_grammar = false;
};

struct ServeBenchResult {
  std::string json;   // vLLM's keys
  std::string table;  // the same for people
};

Result<ServeBenchResult> BenchServe(const ServeBenchOptions& options);

}  // namespace sy::bench
