#include "chat_output/chat_output.h"

namespace sy::chat_output {

ChatOutputParser::ChatOutputParser(const ChatOutputOptions& options) : options_(options) {
  if (options_.reasoning)
    reasoning_.emplace(options_.starts_in_reasoning, options_.reasoning_format);
  if (options_.tool_format) tools_.emplace(*options_.tool_format);
}

void ChatOutputParser::Pass(OutputDelta& delta, bool final, bool cut) {
  // What the reasoning parser left as answer goes on to the tool-call parser.
  std::string answer = std::move(delta.content);
  delta.content.clear();
  answer_text_ += answer;
  reasoning_text_ += delta.reasoning;
  if (!tools_) {
    delta.content = std::move(answer);
  } else {
    tools_->Feed(answer, &delta);
    if (final) tools_->Finish(&delta, cut);
    if (options_.max_calls >= 0)
      std::erase_if(delta.tool_calls,
                    [&](const ToolCallDelta& d) { return d.index >= options_.max_calls; });
  }
  content_text_ += delta.content;
}

OutputDelta ChatOutputParser::Feed(std::string_view text) {
  OutputDelta delta;
  if (reasoning_) {
    reasoning_->Feed(text, &delta);
  } else {
    delta.content = std::string(text);
  }
  Pass(delta, false, false);
  return delta;
}

OutputDelta ChatOutputParser::Finish(bool cut) {
  OutputDelta delta;
  if (reasoning_) reasoning_->Finish(&delta);
  Pass(delta, true, cut);
  return delta;
}

ChatMessage ChatOutputParser::Message() const {
  ChatMessage m;
  if (!reasoning_text_.empty()) m.reasoning = reasoning_text_;
  if (tools_ && tools_->malformed()) {
    if (!answer_text_.empty()) m.content = answer_text_;
    return m;
  }
  if (!content_text_.empty()) m.content = content_text_;
  if (tools_) {
    m.tool_calls = tools_->calls();
    if (options_.max_calls >= 0 && static_cast<int>(m.tool_calls.size()) > options_.max_calls)
      m.tool_calls.resize(static_cast<size_t>(options_.max_calls));
  }
  return m;
}

bool ChatOutputParser::CalledTools() const {
  return tools_ && !tools_->malformed() && !tools_->calls().empty();
}

ChatMessage ParseChatOutput(const ChatOutputOptions& options, std::string_view text, bool cut) {
  ChatOutputParser parser(options);
  parser.Feed(text);
  parser.Finish(cut);
  return parser.Message();
}

}  // namespace sy::chat_output
