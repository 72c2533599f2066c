// Reasoning split from the answer: DeepSeek-R1's "<think> … </think>" (vLLM's reasoning parsers
// "deepseek_r1" and "deepseek_v3"). The R1 templates' generation prompt opens the think block,
// so the output starts inside the reasoning and "</think>" ends it; an output that never writes
// "</think>" is all reasoning. A "<think>" at the very start (older R1 outputs) is dropped. When
// the request does not start in reasoning (V3.1 without `thinking`, the V3 parser without it) the
// output is all content.
#pragma once

#include <string>
#include <string_view>

#include "chat_output/tool_parser.h"

namespace sy::chat_output {

enum class ReasoningFormat { kDeepSeekR1, kDeepSeekV3 };
std::optional<ReasoningFormat> ReasoningFormatByName(std::string_view name);

inline constexpr std::string_view kThinkBegin = "<think>";
inline constexpr std::string_view kThinkEnd = "</think>";

// Whether a request's output starts inside the reasoning: deepseek_r1 always (as vLLM's);
// deepseek_v3 when the request asked for thinking (chat_template_kwargs thinking).
bool StartsInReasoning(ReasoningFormat format, bool thinking);

class ReasoningParser {
 public:
  explicit ReasoningParser(bool starts_in_reasoning);
  // Appends to out->reasoning and out->content; text that may be the start of "</think>" is held.
  void Feed(std::string_view text, OutputDelta* out);
  void Finish(OutputDelta* out);
  bool in_reasoning() const { return in_reasoning_; }

 private:
  void Run(OutputDelta* out, bool final);
  bool in_reasoning_;
  bool at_start_;
  std::string buffer_;
};

}  // namespace sy::chat_output
