// libFuzzer target for the grammar engine's parsers. The first byte picks what the rest is:
//   0: a JSON schema, 1: a regular expression, 2: a GBNF grammar, 3: choices separated by '\n',
//   4: a structural format (structural.h: text, named tokens, JSON schemas composed).
// Compiling must give an automaton or an error with a message — never a crash, a hang or
// unbounded memory (the limits are lowered so each input stays fast). A compiled grammar is then
// run over the input's bytes, with a rollback, to exercise the recognizer.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "structured/compiler.h"
#include "structured/matcher.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace sy::structured;
  if (size < 1) return 0;
  const std::string text(reinterpret_cast<const char*>(data) + 1, size - 1);
  GrammarSpec spec;
  switch (data[0] % 5) {
    case 0:
      spec.kind = GrammarSpec::Kind::kJsonSchema;
      break;
    case 1:
      spec.kind = GrammarSpec::Kind::kRegex;
      break;
    case 2:
      spec.kind = GrammarSpec::Kind::kGbnf;
      break;
    case 3: {
      spec.kind = GrammarSpec::Kind::kChoice;
      size_t start = 0;
      while (start <= text.size()) {
        size_t end = text.find('\n', start);
        if (end == std::string::npos) end = text.size();
        spec.choices.push_back(text.substr(start, end - start));
        start = end + 1;
      }
      break;
    }
    case 4:
      spec.kind = GrammarSpec::Kind::kStructural;
      break;
  }
  spec.text = text;
  GrammarLimits limits;
  limits.max_nfa_states = 20'000;
  limits.max_dfa_states = 5'000;
  limits.max_repeat = 200;
  limits.max_nesting = 50;
  auto compiled = CompileForBytes(spec, limits);
  if (!compiled.ok()) {
    if (compiled.status().message().empty()) std::abort();  // errors always say what is wrong
    return 0;
  }
  GrammarMatcher matcher(*compiled);
  for (size_t i = 0; i < text.size() && i < 256; ++i) {
    if (!matcher.AcceptBytes(std::string_view(&text[i], 1)).ok()) break;
  }
  if (matcher.steps() > 0 && !matcher.Rollback(1).ok()) std::abort();
  (void)matcher.IsComplete();
  return 0;
}
