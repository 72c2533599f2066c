// `switchyard bench tokenizer`: single-thread encode throughput of switchyard's tokenizer next to
// Hugging Face tokenizers' on the same tokenizer.json and texts, run side by side in one process
// tree (the Python library in a subprocess, timed inside it around encode() alone). Two loads:
// the corpus's texts one by one (many short requests) and one long prompt (≥ 1 MB), whose encode
// time is also set against the model's measured prefill rate.
#pragma once

#include <string>
#include <vector>

#include "base/status.h"

namespace sy::bench {

struct TokenizerBenchOptions {
  std::string tokenizer;  // tokenizer.json or a directory with one
  std::string corpus;     // JSON Lines with "text"
  std::string hf_python;  // a Python with `tokenizers`; empty: no side-by-side row
  std::string model;      // model whose prefill rate the long prompt is set against
  int repetitions = 5;
  int64_t long_prompt_bytes = 1 << 20;
};

struct TokenizerBenchRow {
  std::string workload;  // "corpus" or "long-prompt"
  std::string engine;    // "switchyard" or "hf-tokenizers x.y"
  double bytes = 0;
  int64_t tokens = 0;
  double median_seconds = 0;
  double min_seconds = 0;
  double max_seconds = 0;
  double MegabytesPerSecond() const { return bytes / median_seconds / 1e6; }
};

struct TokenizerBenchReport {
  std::vector<TokenizerBenchRow> rows;
  bool ids_match = true;                 // HF's ids (count and checksum) equal ours on both loads
  std::string hf_note;                   // why there is no HF row, when there is none
  double prefill_tokens_per_second = 0;  // measured on the model, 2,048-token prompt
  int64_t model_prompt_tokens = 0;       // the long prompt in the model's own tokenizer
};

Result<TokenizerBenchReport> BenchTokenizer(const TokenizerBenchOptions& options);
std::string TokenizerReportTable(const TokenizerBenchReport& report);
std::string TokenizerReportJson(const TokenizerBenchReport& report);

}  // namespace sy::bench
