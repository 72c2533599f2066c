// DeepSeek's chat templates, rendered natively. A checkpoint's tokenizer_config.json carries a
// Jinja template; switchyard recognises the DeepSeek-V3/R1 family by the template's exact text
// and renders it with code that follows that template line by line, byte-identical to
// transformers' apply_chat_template (tests/tokenizer_test.cc checks every variant against
// jinja2's output on a committed set of conversations). A template not recognised is an error
// when a chat is asked for — never a prompt that merely looks right.
#pragma once

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
};

struct ChatOptions {
  bool add_generation_prompt = true;
  // transformers' continue_final_message: the prompt ends inside the last message, where its
  // text ends, so the model continues it (an assistant message given as a prefix: vLLM's
  // continue_final_message, Anthropic's prefill). Not with add_generation_prompt.
  bool continue_final_message = false;
  // V3.1's `thinking` template argument; ignored by the other variants.
  bool thinking = false;
  // The request's tools (OpenAI's list of {"type": "function", "function": {...}}), or null. The
  // official DeepSeek templates do not render tools; like vLLM's tool chat templates
  // (examples/tool_chat_template_deepseekv3.jinja, _deepseekr1, _deepseekv31) a block describing
  // them and the call format is appended to the system prompt, in those templates' words; the
  // rest of the conversation is the official template's.
  // Held in the client's key order (ordered_json), as vLLM's Jinja writes it with `tojson`.
  const nlohmann::ordered_json* tools = nullptr;
};

class ChatTemplate {
 public:
  // Recognises `template_text`; `bos_token` is what the template's {{ bos_token }} writes.
  static Result<ChatTemplate> Recognize(std::string_view template_text, std::string bos_token);

  // Renders a conversation in OpenAI's message shape: [{"role", "content", "tool_calls"?,
  // "prefix"?}]. Values the template cannot use (a missing or non-string content where the
  // template concatenates it, tool calls that are not a list) are errors naming the message,
  // where jinja2 would raise.
  Result<std::string> Render(const nlohmann::ordered_json& messages,
                             const ChatOptions& options) const;

  ChatTemplateKind kind() const { return kind_; }
  std::string_view name() const;

 private:
  ChatTemplate(ChatTemplateKind kind, std::string bos) : kind_(kind), bos_(std::move(bos)) {}
  // The variant's rendering of the conversation as given.
  Result<std::string> RenderKind(const nlohmann::ordered_json& messages,
                                 const ChatOptions& options) const;
  ChatTemplateKind kind_;
  std::string bos_;
};

}  // namespace sy
