// Reasoning split from the answer: DeepSeek-R1's "<think> … </think>" (vLLM's reasoning parsers
// "deepseek_r1" and "deepseek_v3"). The R1 templates' generation prompt opens the think block,
// so the output starts inside the reasoning and "</think>" ends it; an output that never writes
// "</think>" is all reasoning. A "<think>" at the very start (older R1 outputs) is dropped. When
// the request does not start in reasoning (V3.1 without `thinking`, the V3 parser without it) the
// output is all content.
//
// kimi_k2 (vLLM's, for Kimi K2-Thinking): the same "<think> … </think>", in reasoning unless the
// request's chat_template_kwargs say thinking: false; the reasoning also ends where the model
// starts calling tools ("<|tool_calls_section_begin|>", which stays with the answer).
#pragma once

#include <string>
#include <string_view>
#include <utility>

#include "chat_output/tool_parser.h"

namespace sy::chat_output {

enum class ReasoningFormat { kDeepSeekR1, kDeepSeekV3, kKimiK2 };
std::optional<ReasoningFormat> ReasoningFormatByName(std::string_view name);

inline constexpr std::string_view kThinkBegin = "<think>";
inline constexpr std::string_view kThinkEnd = "</think>";

// Whether a request's output starts inside the reasoning: deepseek_r1 always (as vLLM's);
// deepseek_v3 and kimi_k2 when the request asks for thinking (chat_template_kwargs thinking).
bool StartsInReasoning(ReasoningFormat format, bool thinking);

// Where reasoning that starts at `from` ends in `text`: {end of the reasoning, start of the
// answer}; both npos while it has not ended.
std::pair<size_t, size_t> FindReasoningEnd(ReasoningFormat format, std::string_view text,
                                           size_t from = 0);

class ReasoningParser {
 public:
  explicit ReasoningParser(bool starts_in_reasoning,
                           ReasoningFormat format = ReasoningFormat::kDeepSeekR1);
  // Appends to out->reasoning and out->content; text that may be the start of "</think>" is held.
  void Feed(std::string_view text, OutputDelta* out);
  void Finish(OutputDelta* out);
  bool in_reasoning() const { return in_reasoning_; }

 private:
  void Run(OutputDelta* out, bool final);
  ReasoningFormat format_;
  bool in_reasoning_;
  bool at_start_;
  std::string buffer_;
};

}  // namespace sy::chat_output
