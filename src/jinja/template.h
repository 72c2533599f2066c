// Jinja chat templates, interpreted: any checkpoint's tokenizer_config.json template, a
// --chat-template file, or (when the operator allows it) a request's own template, rendered as
// transformers' apply_chat_template renders it with Jinja2 (an immutable sandbox, trim_blocks,
// lstrip_blocks, loop controls, tojson without HTML escaping, raise_exception, strftime_now).
//
// Written here because no Debian package implements Jinja2's language for C++ (jinja2cpp is not
// packaged; inja is a different language), and a prompt is only right when every byte matches.
// tests/jinja_test.cc checks the output against Jinja2 itself on the fixtures that
// tools/tokenizer/gen_jinja_fixtures.py makes: real chat templates and the language's corners.
//
// A template is untrusted input when a request sends it: rendering is bounded in steps, output
// size, call depth, value nesting and range() size, and every failure is a Status naming the line.
#pragma once

#include <cstdint>
#include <ctime>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "base/status.h"
#include "jinja/value.h"

namespace sy::jinja {

struct Limits {
  int64_t max_steps = 20'000'000;       // statements, expressions and loop iterations
  size_t max_output_bytes = 64u << 20;  // the rendered text, and any string built on the way
  int max_call_depth = 50;              // macro calls within macro calls
  // The time strftime_now() formats (local time); unset: now. Tests fix it.
  std::optional<std::tm> fixed_time;
};

class Template {
 public:
  // Parses `source`; unknown filters and tests are errors here, as Jinja2 reports them when it
  // compiles. Errors read "line N: …".
  static Result<Template> Parse(std::string_view source);

  // Renders with `context` (a dict: messages, tools, add_generation_prompt, special tokens, …).
  // A template's raise_exception("…") is an error whose message is the template's own.
  Result<std::string> Render(const Value& context, const Limits& limits = Limits()) const;

  // Whether some for loop iterates over `x.<attribute>` or `x['<attribute>']`: how vLLM tells a
  // template that takes a message's content as a list of parts from one that takes a string.
  bool IteratesOver(std::string_view attribute) const;

 private:
  struct Parsed;
  explicit Template(std::shared_ptr<const Parsed> parsed) : parsed_(std::move(parsed)) {}
  std::shared_ptr<const Parsed> parsed_;
};

}  // namespace sy::jinja
