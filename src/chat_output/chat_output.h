// One choice's output, split as a chat message: reasoning (reasoning_parser.h), content and tool
// calls (tool_parser.h), streamed or whole. The OpenAI server keeps one per choice; the text it
// feeds is the engine's, special tokens kept.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "chat_output/reasoning_parser.h"
#include "chat_output/tool_parser.h"

namespace sy::chat_output {

struct ChatOutputOptions {
  std::optional<ToolCallFormat> tool_format;  // parse tool calls in the answer
  bool reasoning = false;                     // a reasoning parser is on
  ReasoningFormat reasoning_format = ReasoningFormat::kDeepSeekR1;  // ... which
  bool starts_in_reasoning = false;  // ... and this output starts inside the reasoning
  int max_calls = -1;                // parallel_tool_calls false: 1 (later ones dropped)
};

// The whole message after Finish: fields that are empty are null in the response.
struct ChatMessage {
  std::optional<std::string> reasoning;
  std::optional<std::string> content;
  std::vector<ToolCall> tool_calls;
};

class ChatOutputParser {
 public:
  explicit ChatOutputParser(const ChatOutputOptions& options);

  OutputDelta Feed(std::string_view text);
  // `cut`: the output was cut by its token budget (finish_reason "length"): an unfinished call is
  // a call, not malformed output (tool_parser.h).
  OutputDelta Finish(bool cut = false);

  // After Finish. A malformed tool-call section makes the whole answer content (tool_parser.h).
  ChatMessage Message() const;
  // Whether the output called tools (finish_reason "tool_calls" when it stopped on its own).
  bool CalledTools() const;

 private:
  void Pass(OutputDelta& delta, bool final, bool cut);

  ChatOutputOptions options_;
  std::optional<ReasoningParser> reasoning_;
  std::optional<ToolCallParser> tools_;
  std::string reasoning_text_, answer_text_, content_text_;
  std::vector<ToolCall> calls_;
};

// The whole output at once (a non-streamed response).
ChatMessage ParseChatOutput(const ChatOutputOptions& options, std::string_view text,
                            bool cut = false);

}  // namespace sy::chat_output
