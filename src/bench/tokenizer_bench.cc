#include "bench/tokenizer_bench.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <utility>

#include <nlohmann/json.hpp>

#include "base/clock.h"
#include "bench/side_process.h"
#include "model/model.h"
#include "tokenizer/tiktoken.h"
#include "tokenizer/tokenizer.h"

namespace sy::bench {
namespace {

using json = nlohmann::json;

// The Hugging Face side: same files, same repetitions, encode() alone timed, one thread.
constexpr const char* kHfScript = R"PY(
import json, statistics, sys, time
import tokenizers
tok = tokenizers.Tokenizer.from_file(sys.argv[1])
texts = [json.loads(l)["text"] for l in open(sys.argv[2], encoding="utf-8") if l.strip()]
long_text = open(sys.argv[3], encoding="utf-8", newline="").read()  # keep \r as is
reps = int(sys.argv[4])
out = {"version": tokenizers.__version__}
for name, load in (("corpus", texts), ("long-prompt", [long_text])):
    times, tokens = [], 0
    for _ in range(reps):
        start = time.perf_counter()
        tokens = sum(len(tok.encode(t, add_special_tokens=False).ids) for t in load)
        times.append(time.perf_counter() - start)
    checksum = 0
    for t in load:
        for i in tok.encode(t, add_special_tokens=False).ids:
            checksum = (checksum * 1000003 + i) & 0xFFFFFFFFFFFFFFFF
    out[name] = {"times": times, "tokens": tokens, "checksum": checksum}
print(json.dumps(out))
)PY";

// The tiktoken side, for a tiktoken.model checkpoint of Kimi's tokenizer class: the library
// driven as vLLM drives that class through transformers (special tokens split out first, then
// its encode(): chunks of 400,000 characters, runs cut at 25,000, tiktoken), Kimi's pattern in
// tiktoken's own (Rust) syntax. Timed around that whole encode, the splitting in Python included,
// as a server running Kimi's tokenizer pays it.
constexpr const char* kTiktokenScript = R"PY(
import base64, json, re, statistics, sys, time
import tiktoken
d = sys.argv[1]
ranks = {}
for line in open(d + "/tiktoken.model", "rb").read().splitlines():
    if line:
        token, rank = line.split()
        ranks[base64.b64decode(token)] = int(rank)
config = json.load(open(d + "/tokenizer_config.json", encoding="utf-8"))
n = len(ranks)
named = {int(k): v["content"] for k, v in config.get("added_tokens_decoder", {}).items()}
specials = {named.get(i, f"<|reserved_token_{i}|>"): i for i in range(n, n + 258)}
pattern = "|".join([
    r"""[\p{Han}]+""",
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""\p{N}{1,3}""", r""" ?[^\s\p{L}\p{N}]+[\r\n]*""", r"""\s*[\r\n]+""", r"""\s+(?!\S)""",
    r"""\s+"""])
enc = tiktoken.Encoding(name="bench", pat_str=pattern, mergeable_ranks=ranks,
                        special_tokens=specials)
def runs(text):
    for at in range(0, len(text), 400000):
        s = text[at:at + 400000]
        run, space, start = 0, s[:1].isspace(), 0
        for i, c in enumerate(s):
            now = c.isspace()
            if space ^ now:
                run, space = 1, now
            else:
                run += 1
                if run > 25000:
                    yield s[start:i]
                    start, run = i, 1
        yield s[start:]
split = re.compile("(" + "|".join(map(re.escape, sorted(specials, key=len, reverse=True))) + ")")
def encode(text):  # special tokens out first (transformers' added-token split), then Kimi's encode
    ids = []
    for k, part in enumerate(split.split(text)):
        if k % 2:
            ids.append(specials[part])
        else:
            for piece in runs(part):
                ids.extend(enc.encode_ordinary(piece))
    return ids
texts = [json.loads(l)["text"] for l in open(sys.argv[2], encoding="utf-8") if l.strip()]
long_text = open(sys.argv[3], encoding="utf-8", newline="").read()  # keep \r as is
reps = int(sys.argv[4])
out = {"version": tiktoken.__version__}
for name, load in (("corpus", texts), ("long-prompt", [long_text])):
    times, tokens = [], 0
    for _ in range(reps):
        start = time.perf_counter()
        tokens = sum(len(encode(t)) for t in load)
        times.append(time.perf_counter() - start)
    checksum = 0
    for t in load:
        for i in encode(t):
            checksum = (checksum * 1000003 + i) & 0xFFFFFFFFFFFFFFFF
    out[name] = {"times": times, "tokens": tokens, "checksum": checksum}
print(json.dumps(out))
)PY";

// Prefill tokens per second of the model on a 2,048-token prompt (the median of three).
Result<double> PrefillRate(const std::string& model_dir) {
  SY_ASSIGN_OR_RETURN(std::unique_ptr<Model> model, Model::Load(model_dir));
  const int64_t length = std::min<int64_t>(2048, model->config().max_position_embeddings);
  std::vector<int32_t> prompt(length);
  for (int64_t i = 0; i < length; ++i)
    prompt[i] = static_cast<int32_t>((i * 7919 + 13) % model->config().vocab_size);
  std::vector<double> times;
  std::vector<float> logits;
  ForwardOptions options;
  options.logit_rows = LogitRows::kLast;
  for (int rep = 0; rep < 3; ++rep) {
    LatentCache cache = model->NewCache(length, 1, DType::kBF16);
    SequenceCache sequence;
    ForwardBatch batch;
    batch.Add(prompt.data(), length, &sequence);
    const double start = NowSeconds();
    SY_RETURN_IF_ERROR(model->Forward(batch, cache, options, &logits));
    times.push_back(NowSeconds() - start);
  }
  return static_cast<double>(length) / Summarize(times).median;
}

}  // namespace

Result<TokenizerBenchReport> BenchTokenizer(const TokenizerBenchOptions& options) {
  SY_ASSIGN_OR_RETURN(Tokenizer tokenizer, Tokenizer::Load(options.tokenizer));
  std::vector<std::string> texts;
  {
    std::ifstream in(options.corpus);
    if (!in) return Status::Errorf("{}: cannot open", options.corpus);
    std::string line;
    for (int64_t n = 1; std::getline(in, line); ++n) {
      if (line.empty()) continue;
      json value = json::parse(line, nullptr, false);
      if (!value.is_object() || !value.contains("text") || !value["text"].is_string())
        return Status::Errorf("{}: line {}: expected {{\"text\": ...}}", options.corpus, n);
      texts.push_back(value["text"].get<std::string>());
    }
  }
  if (texts.empty()) return Status::Errorf("{}: no texts", options.corpus);
  std::string long_prompt;
  while (static_cast<int64_t>(long_prompt.size()) < options.long_prompt_bytes)
    for (const std::string& t : texts)
      long_prompt += t + "\n";
  double corpus_bytes = 0;
  for (const auto& t : texts)
    corpus_bytes += static_cast<double>(t.size());

  TokenizerBenchReport report;
  std::vector<uint64_t> checksums;  // of our ids, per load, compared with Hugging Face's
  const std::vector<std::string> long_load = {long_prompt};
  for (const std::vector<std::string>* load : {&std::as_const(texts), &long_load}) {
    std::vector<double> times;
    int64_t tokens = 0;
    uint64_t checksum = 0;
    for (int rep = 0; rep < options.repetitions; ++rep) {
      tokens = 0;
      const double start = NowSeconds();
      for (const std::string& t : *load) {
        auto ids = tokenizer.Encode(t);
        if (!ids.ok()) return ids.status();
        tokens += static_cast<int64_t>(ids->size());
      }
      times.push_back(NowSeconds() - start);
    }
    for (const std::string& t : *load) {  // untimed: the ids compared with Hugging Face's
      const std::vector<int32_t> ids = tokenizer.Encode(t).value();
      for (int32_t id : ids)
        checksum = checksum * 1000003u + static_cast<uint64_t>(id);
    }
    checksums.push_back(checksum);
    const Timing timing = Summarize(times);
    const bool corpus = load == &texts;
    report.rows.push_back({corpus ? "corpus" : "long-prompt", "switchyard",
                           corpus ? corpus_bytes : static_cast<double>(long_prompt.size()), tokens,
                           timing.median, timing.min, timing.max});
  }

  if (options.hf_python.empty() || !std::filesystem::exists(options.hf_python)) {
    report.hf_note = options.hf_python.empty()
                         ? "no --hf-python given"
                         : options.hf_python +
                               " not found (tools/tokenizer/make_tokenizer_fixtures.sh "
                               "makes .venv-tokenizer)";
  } else {
    const std::string long_path = ScratchPath("tok", ".txt");
    std::ofstream(long_path, std::ios::binary) << long_prompt;
    std::string file = options.tokenizer;
    // A tiktoken checkpoint is set beside the tiktoken library; any other beside tokenizers.
    const bool tiktoken = std::filesystem::is_directory(file) && HasTiktokenModel(file);
    if (std::filesystem::is_directory(file) && !tiktoken) file += "/tokenizer.json";
    auto ran =
        RunPythonScript(options.hf_python, tiktoken ? kTiktokenScript : kHfScript,
                        {file, options.corpus, long_path, std::to_string(options.repetitions)},
                        "RAYON_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false");
    std::filesystem::remove(long_path);
    if (!ran.ok()) return ran.status().WithContext("the Hugging Face side");
    const std::string output = ran.value();
    json hf = json::parse(output, nullptr, false);
    if (!hf.is_object()) return Status::Errorf("the Hugging Face side printed: {}", output);
    for (const char* name : {"corpus", "long-prompt"}) {
      const Timing timing = Summarize(hf[name]["times"].get<std::vector<double>>());
      const int64_t tokens = hf[name]["tokens"].get<int64_t>();
      const bool corpus = std::string(name) == "corpus";
      const TokenizerBenchRow& ours = report.rows[corpus ? 0 : 1];
      report.ids_match = report.ids_match && tokens == ours.tokens &&
                         hf[name]["checksum"].get<uint64_t>() == checksums[corpus ? 0 : 1];
      report.rows.push_back(
          {name, (tiktoken ? "tiktoken " : "hf-tokenizers ") + hf["version"].get<std::string>(),
           ours.bytes, tokens, timing.median, timing.min, timing.max});
    }
  }

  if (!options.model.empty()) {
    SY_ASSIGN_OR_RETURN(report.prefill_tokens_per_second, PrefillRate(options.model));
    SY_ASSIGN_OR_RETURN(Tokenizer model_tokenizer, Tokenizer::Load(options.model));
    SY_ASSIGN_OR_RETURN(std::vector<int32_t> ids, model_tokenizer.Encode(long_prompt));
    report.model_prompt_tokens = static_cast<int64_t>(ids.size());
  }
  return report;
}

std::string TokenizerReportTable(const TokenizerBenchReport& report) {
  std::string out = fmt::format("{:<12} {:<22} {:>10} {:>9} {:>10} {:>9} {:>9}\n", "load", "engine",
                                "MB", "tokens", "median ms", "MB/s", "vs ref");
  for (const auto& row : report.rows) {
    double ratio = 0;
    for (const auto& other : report.rows)
      if (other.workload == row.workload && other.engine != "switchyard")
        ratio = other.median_seconds / row.median_seconds;
    out += fmt::format(
        "{:<12} {:<22} {:>10.3f} {:>9} {:>10.2f} {:>9.2f} {:>9}\n", row.workload, row.engine,
        row.bytes / 1e6, row.tokens, row.median_seconds * 1e3, row.MegabytesPerSecond(),
        row.engine == "switchyard" && ratio > 0 ? fmt::format("{:.2f}x", ratio) : std::string("-"));
  }
  if (!report.hf_note.empty()) out += "no reference row: " + report.hf_note + "\n";
  if (report.rows.size() > 2)
    out += fmt::format("ids {} {}'s (count and checksum)\n",
                       report.ids_match ? "equal" : "DIFFER from", report.rows[2].engine);
  if (report.prefill_tokens_per_second > 0) {
    const double encode = report.rows[1].median_seconds;
    const double prefill = report.model_prompt_tokens / report.prefill_tokens_per_second;
    out += fmt::format(
        "long prompt: encode {:.1f} ms; its {} tokens at the model's measured prefill rate "
        "({:.0f} tok/s at 2,048 tokens; a lower bound, attention grows with length) take at "
        "least {:.1f} s: encode = {:.5f} of prefill\n",
        encode * 1e3, report.model_prompt_tokens, report.prefill_tokens_per_second, prefill,
        encode / prefill);
  }
  return out;
}

std::string TokenizerReportJson(const TokenizerBenchReport& report) {
  json rows = json::array();
  for (const auto& row : report.rows)
    rows.push_back({{"workload", row.workload},
                    {"engine", row.engine},
                    {"bytes", row.bytes},
                    {"tokens", row.tokens},
                    {"median_seconds", row.median_seconds},
                    {"min_seconds", row.min_seconds},
                    {"max_seconds", row.max_seconds},
                    {"megabytes_per_second", row.MegabytesPerSecond()}});
  return json{{"rows", rows},
              {"ids_match", report.ids_match},
              {"hf_note", report.hf_note},
              {"prefill_tokens_per_second", report.prefill_tokens_per_second},
              {"model_prompt_tokens", report.model_prompt_tokens}}
      .dump(2);
}

}  // namespace sy::bench
