// libFuzzer target for the Jinja interpreter (src/jinja): a request may send its own chat
// template, so template source is hostile input. The first byte picks what the rest is:
//   0: template source — parsed, and when it parses rendered over a fixed conversation under
//      tight limits: a text or an error, never a crash, a hang or unbounded memory;
//   1: a JSON message list — rendered through every committed chat template (real templates
//      from tests/fixtures/jinja/templates): the same, for the interpreter's data paths.
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "jinja/template.h"

namespace {

using json = nlohmann::ordered_json;

sy::jinja::Limits TightLimits() {
  sy::jinja::Limits limits;
  limits.max_steps = 200'000;
  limits.max_output_bytes = 1 << 20;
  limits.max_call_depth = 32;
  return limits;
}

const sy::jinja::Value& Conversation() {
  static const sy::jinja::Value context = sy::jinja::Value::FromJson(json::parse(R"({
    "messages": [{"role": "system", "content": "Be brief."},
                 {"role": "user", "content": "Weather in Paris?"},
                 {"role": "assistant", "content": null, "tool_calls": [
                   {"id": "c1", "type": "function",
                    "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
                 {"role": "tool", "tool_call_id": "c1", "content": "18"},
                 {"role": "user", "content": [{"type": "text", "text": "Thanks"}]}],
    "tools": [{"type": "function", "function": {"name": "get_weather",
               "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}],
    "add_generation_prompt": true, "bos_token": "<s>", "eos_token": "</s>"})"));
  return context;
}

const std::vector<sy::jinja::Template>& CommittedTemplates() {
  static const auto* templates = [] {
    auto* out = new std::vector<sy::jinja::Template>;
    for (const auto& entry : std::filesystem::directory_iterator(SY_FUZZ_TEMPLATES)) {
      if (entry.path().extension() != ".jinja") continue;
      std::ifstream in(entry.path(), std::ios::binary);
      std::ostringstream text;
      text << in.rdbuf();
      auto parsed = sy::jinja::Template::Parse(text.str());
      if (!parsed.ok()) std::abort();  // every committed template parses
      out->push_back(std::move(parsed).value());
    }
    return out;
  }();
  return *templates;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string_view rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  if (data[0] % 2 == 0) {
    auto parsed = sy::jinja::Template::Parse(rest);
    if (parsed.ok()) (void)parsed->Render(Conversation(), TightLimits());
    return 0;
  }
  json messages = json::parse(rest, nullptr, false);
  if (messages.is_discarded()) return 0;
  json context = {{"messages", messages},
                  {"add_generation_prompt", true},
                  {"bos_token", "<s>"},
                  {"eos_token", "</s>"}};
  const auto value = sy::jinja::Value::FromJson(context);
  for (const auto& t : CommittedTemplates())
    (void)t.Render(value, TightLimits());
  return 0;
}
