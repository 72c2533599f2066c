#include "bench/chat_template_bench.h"

#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "base/clock.h"
#include "bench/side_process.h"
#include "tokenizer/chat_template.h"

namespace sy::bench {
namespace {

using json = nlohmann::ordered_json;

// The reference: transformers' renderer over the same cases, each template's whole list timed
// per repetition; the FNV-1a of each rendering (UTF-8 bytes), so the outputs can be compared.
constexpr const char* kHfScript = R"PY(
import json, sys, time
import transformers
from transformers.utils.chat_template_utils import render_jinja_template
cases = json.load(open(sys.argv[1], encoding="utf-8"))
repetitions = int(sys.argv[2])
def fnv(text):
    h = 0xcbf29ce484222325
    for b in text.encode("utf-8"):
        h = ((h ^ b) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return h
def render(template, case):
    extra = dict(case.get("extra") or {})
    cont = extra.pop("continue_final_message", False)
    if cont and case["add_generation_prompt"]:
        raise ValueError("incompatible")
    out, _ = render_jinja_template(conversations=[case["messages"]], tools=case.get("tools"),
        documents=None, chat_template=template, continue_final_message=cont,
        add_generation_prompt=case["add_generation_prompt"], bos_token=cases["bos"],
        eos_token=cases["eos"], **extra)
    return out[0]
result = {"version": transformers.__version__, "templates": []}
for template in cases["templates"]:
    ok = []
    hashes = []
    for case in cases["conversations"]:
        try:
            hashes.append(fnv(render(template, case)))
            ok.append(case)
        except Exception:
            hashes.append(None)
    times = []
    for _ in range(repetitions):
        start = time.perf_counter()
        for case in ok:
            render(template, case)
        times.append(time.perf_counter() - start)
    result["templates"].append({"hashes": hashes, "times": times})
print(json.dumps(result))
)PY";

uint64_t Fnv(const std::string& text) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char b : text)
    h = (h ^ b) * 0x100000001b3ull;
  return h;
}

std::string ReadText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

struct Case {
  json messages, tools, kwargs;
  ChatOptions options;
};

// The cases as ChatOptions, the way tests/jinja_test.cc reads the same files.
std::vector<Case> ReadCases(const json& conversations) {
  std::vector<Case> cases(conversations.size());
  for (size_t i = 0; i < conversations.size(); ++i) {
    const json& c = conversations[i];
    Case& out = cases[i];
    out.messages = c["messages"];
    out.tools = c.value("tools", json());
    out.kwargs = c.value("extra", json::object());
    out.options.add_generation_prompt = c["add_generation_prompt"].get<bool>();
    if (out.kwargs.contains("continue_final_message")) {
      out.options.continue_final_message = out.kwargs["continue_final_message"].get<bool>();
      out.kwargs.erase("continue_final_message");
    }
    for (const char* key : {"thinking", "enable_thinking"})
      if (out.kwargs.contains(key) && out.kwargs[key].is_boolean())
        out.options.thinking = out.kwargs[key].get<bool>();
  }
  for (Case& c : cases) {  // pointers once the vector no longer moves
    c.options.template_kwargs = &c.kwargs;
    c.options.tools = c.tools.is_null() ? nullptr : &c.tools;
  }
  return cases;
}

// Per-render seconds of `chat` over the cases it renders (median of repetitions), and the hashes.
double TimeRenders(const ChatTemplate& chat, const std::vector<Case>& cases,
                   const std::vector<bool>& renders, int repetitions) {
  std::vector<double> times;
  int64_t count = 0;
  for (int r = 0; r < repetitions; ++r) {
    count = 0;
    const double start = NowSeconds();
    for (size_t i = 0; i < cases.size(); ++i) {
      if (!renders[i]) continue;
      auto rendered = chat.Render(cases[i].messages, cases[i].options);
      count += rendered.ok();
    }
    times.push_back(NowSeconds() - start);
  }
  return count ? Summarize(times).median / count : 0;
}

}  // namespace

Result<ChatTemplateBenchReport> RunChatTemplateBench(const ChatTemplateBenchOptions& options) {
  ChatTemplateBenchReport report;
  json conversations = json::array();
  for (const std::string& file : options.conversations) {
    json part = json::parse(ReadText(file), nullptr, false);
    if (!part.is_array()) return Status::Errorf("{}: not a JSON list of conversations", file);
    for (auto& c : part)
      conversations.push_back(std::move(c));
  }
  const std::vector<Case> cases = ReadCases(conversations);
  const SpecialTokens tokens{"<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"};
  std::vector<std::string> texts;
  std::vector<std::vector<uint64_t>> hashes;
  std::vector<std::vector<bool>> renders;
  for (const std::string& path : options.templates) {
    ChatTemplateBenchRow row;
    row.name = std::filesystem::path(path).filename().string();
    texts.push_back(ReadText(path));
    std::vector<double> parse_times;
    for (int r = 0; r < options.repetitions; ++r) {
      const double start = NowSeconds();
      auto parsed = ChatTemplate::Interpret(texts.back(), tokens);
      parse_times.push_back(NowSeconds() - start);
      if (!parsed.ok()) return parsed.status().WithContext(path);
    }
    row.parse_us = Summarize(parse_times).median * 1e6;
    auto chat = ChatTemplate::Interpret(texts.back(), tokens).value();
    std::vector<uint64_t> ours(cases.size(), 0);
    std::vector<bool> ok(cases.size(), false);
    for (size_t i = 0; i < cases.size(); ++i) {
      auto rendered = chat.Render(cases[i].messages, cases[i].options);
      if (!rendered.ok()) continue;
      ok[i] = true;
      ours[i] = Fnv(*rendered);
      ++row.renders;
    }
    row.interpreted_us = TimeRenders(chat, cases, ok, options.repetitions) * 1e6;
    if (auto native = ChatTemplate::Recognize(texts.back(), tokens.bos_token); native.ok())
      row.native_us = TimeRenders(*native, cases, ok, options.repetitions) * 1e6;
    hashes.push_back(std::move(ours));
    renders.push_back(std::move(ok));
    report.rows.push_back(row);
  }

  if (options.hf_python.empty() || !std::filesystem::exists(options.hf_python)) {
    report.hf_note = options.hf_python.empty()
                         ? "no --hf-python given"
                         : options.hf_python +
                               " not found (tools/tokenizer/make_jinja_fixtures.sh makes "
                               ".venv-tokenizer)";
    return report;
  }
  const std::string input = ScratchPath("chat", ".json");
  std::ofstream(input) << json{
      {"templates", texts},
      {"conversations", conversations},
      {"bos", tokens.bos_token},
      {"eos",
       tokens.eos_token}}.dump();
  auto ran =
      RunPythonScript(options.hf_python, kHfScript, {input, std::to_string(options.repetitions)},
                      "HF_HUB_OFFLINE=1 TRANSFORMERS_VERBOSITY=error");
  std::filesystem::remove(input);
  if (!ran.ok()) return ran.status().WithContext("the transformers side");
  // transformers may print a notice (no torch) before the JSON line.
  const std::string& output = ran.value();
  const size_t brace = output.rfind("\n{");
  json hf =
      json::parse(brace == std::string::npos ? output : output.substr(brace + 1), nullptr, false);
  if (!hf.is_object()) return Status::Errorf("the transformers side printed: {}", output);
  report.hf_version = hf["version"].get<std::string>();
  for (size_t t = 0; t < report.rows.size(); ++t) {
    const json& side = hf["templates"][t];
    ChatTemplateBenchRow& row = report.rows[t];
    int64_t count = 0;
    for (size_t i = 0; i < cases.size(); ++i) {
      const json& h = side["hashes"][i];
      if (h.is_null() != !renders[t][i] || (!h.is_null() && h.get<uint64_t>() != hashes[t][i]))
        row.equal = false;
      count += !h.is_null();
    }
    if (count) row.hf_us = Summarize(side["times"].get<std::vector<double>>()).median / count * 1e6;
  }
  return report;
}

std::string ChatTemplateReportTable(const ChatTemplateBenchReport& report) {
  std::string out =
      fmt::format("{:<40} {:>7} {:>9} {:>10} {:>9} {:>11} {:>8} {:>7}\n", "template", "renders",
                  "parse us", "interp us", "native us", "transf. us", "vs HF", "equal");
  for (const auto& row : report.rows) {
    out += fmt::format(
        "{:<40} {:>7} {:>9.1f} {:>10.1f} {:>9} {:>11} {:>8} {:>7}\n", row.name, row.renders,
        row.parse_us, row.interpreted_us,
        row.native_us > 0 ? fmt::format("{:.1f}", row.native_us) : std::string("-"),
        row.hf_us > 0 ? fmt::format("{:.1f}", row.hf_us) : std::string("-"),
        row.hf_us > 0 ? fmt::format("{:.1f}x", row.hf_us / row.interpreted_us) : std::string("-"),
        row.hf_us > 0 ? (row.equal ? "yes" : "NO") : "-");
  }
  if (!report.hf_note.empty()) out += "no transformers column: " + report.hf_note + "\n";
  if (!report.hf_version.empty())
    out += fmt::format(
        "transformers {} (Jinja2) renders in a subprocess, one thread; each "
        "figure is the median over repetitions of all renders / renders\n",
        report.hf_version);
  return out;
}

}  // namespace sy::bench
