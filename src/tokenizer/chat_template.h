// Chat templates. A checkpoint's tokenizer_config.json (or GGUF, or --chat-template, or a request)
// carries a Jinja template. The DeepSeek-V3/R1 family is recognised by the template's exact text
// and rendered natively, with code that follows that template line by line (and appends the
// request's tools as vLLM's DeepSeek tool templates do); any other template is interpreted by
// src/jinja. Both are byte-identical to transformers' apply_chat_template: tests/tokenizer_test.cc
// checks the native renderings, tests/jinja_test.cc the interpreter, against jinja2's output on
// committed conversations.
#pragma once

#include <ctime>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json_fwd.hpp>

#include "base/status.h"

namespace sy {

enum class ChatTemplateKind {
  kDeepSeekV3,       // December 2024: history with </think> stripped, prompt "<｜Assistant｜>"
  kDeepSeekR1,       // as V3, but the generation prompt opens the think block
  kDeepSeekV3_0324,  // V3-0324 / R1-0528 family: a user turn ends with "<｜Assistant｜>"
  kDeepSeekV3_1,     // V3.1: a `thinking` switch; </think> or <think> after "<｜Assistant｜>"
  kDeepSeekV3_2,     // V3.2: no template, DeepSeek's encoding_dsv32.py (deepseek_v32_encoding.h)
  kJinja,            // any other template, interpreted
};

// The tokenizer's special tokens a template may write ({{ bos_token }}, {{ eos_token }}).
struct SpecialTokens {
  std::string bos_token;
  std::string eos_token;
};

struct ChatOptions {
  bool add_generation_prompt = true;
  // transformers' continue_final_message: the prompt ends inside the last message, where its
  // text ends, so the model continues it (an assistant message given as a prefix: vLLM's
  // continue_final_message, Anthropic's prefill). Not with add_generation_prompt.
  bool continue_final_message = false;
  // V3.1's and V3.2's `thinking` template argument; ignored by the other variants.
  bool thinking = false;
  // The request's tools (OpenAI's list of {"type": "function", "function": {...}}), or null. The
  // official DeepSeek templates do not render tools; like vLLM's tool chat templates
  // (examples/tool_chat_template_deepseekv3.jinja, _deepseekr1, _deepseekv31) a block describing
  // them and the call format is appended to the system prompt, in those templates' words; the
  // rest of the conversation is the official template's.
  // Held in the client's key order (ordered_json), as vLLM's Jinja writes it with `tojson`.
  const nlohmann::ordered_json* tools = nullptr;
  // The request's chat_template_kwargs (an object): an interpreted template sees each key as a
  // variable, as transformers passes them; the native renderings read only `thinking` above.
  const nlohmann::ordered_json* template_kwargs = nullptr;
  // The time an interpreted template's strftime_now() formats; null: now. Tests fix it.
  const std::tm* fixed_time = nullptr;
};

namespace jinja {
class Template;
}

class ChatTemplate {
 public:
  // Recognises `template_text` as one of the DeepSeek templates rendered natively; `bos_token`
  // is what the template's {{ bos_token }} writes.
  static Result<ChatTemplate> Recognize(std::string_view template_text, std::string bos_token);
  // Any template: natively when recognised, else interpreted (an error names the line at fault).
  static Result<ChatTemplate> Load(std::string_view template_text, const SpecialTokens& tokens);
  // DeepSeek-V3.2's encoding (tokenizer/deepseek_v32_encoding.h), which its release uses in
  // place of a template.
  static ChatTemplate DeepSeekV32(const SpecialTokens& tokens);
  // Interpreted even when recognised (a request's own template; the tests' cross-check).
  static Result<ChatTemplate> Interpret(std::string_view template_text,
                                        const SpecialTokens& tokens);

  // Renders a conversation in OpenAI's message shape: [{"role", "content", "tool_calls"?,
  // "prefix"?}]. Values the template cannot use (a missing or non-string content where the
  // template concatenates it, tool calls that are not a list) are errors naming the message
  // (natively) or the template line (interpreted), where jinja2 would raise.
  Result<std::string> Render(const nlohmann::ordered_json& messages,
                             const ChatOptions& options) const;

  ChatTemplateKind kind() const { return kind_; }
  std::string_view name() const;
  // vLLM's content-format detection: whether the template loops over a message's content, so
  // it takes OpenAI's list of parts rather than one string (natively: never).
  bool takes_content_parts() const { return takes_content_parts_; }

 private:
  ChatTemplate(ChatTemplateKind kind, std::string bos) : kind_(kind), bos_(std::move(bos)) {}
  // The variant's rendering of the conversation as given.
  Result<std::string> RenderKind(const nlohmann::ordered_json& messages,
                                 const ChatOptions& options) const;
  Result<std::string> RenderInterpreted(const nlohmann::ordered_json& messages,
                                        const ChatOptions& options) const;
  Result<std::string> RenderInterpretedChecked(const nlohmann::ordered_json& messages,
                                               const ChatOptions& options) const;
  ChatTemplateKind kind_;
  std::string bos_;
  std::string eos_;
  std::shared_ptr<const jinja::Template> jinja_;
  bool takes_content_parts_ = false;
};

// Parsed templates by their text, for requests that send their own (transformers keeps an
// lru_cache of compiled templates the same way): parsing one takes 10–500 µs, a cache hit a
// comparison. The least recently used of `capacity` go first; safe from any thread.
class ChatTemplateCache {
 public:
  explicit ChatTemplateCache(size_t capacity) : capacity_(capacity) {}
  // ChatTemplate::Interpret(text, tokens), from the cache when it holds it. Failures are not
  // kept.
  Result<ChatTemplate> Interpret(std::string_view template_text, const SpecialTokens& tokens);
  int64_t hits() const;

 private:
  mutable std::mutex mutex_;
  const size_t capacity_;
  std::list<std::pair<std::string, ChatTemplate>> entries_;  // most recently used first
  int64_t hits_ = 0;
};

}  // namespace sy
