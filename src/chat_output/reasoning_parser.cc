#include "chat_output/reasoning_parser.h"

#include <algorithm>

namespace sy::chat_output {
namespace {

size_t HeldPrefix(std::string_view text, std::string_view marker) {
  for (size_t n = std::min(text.size(), marker.size() - 1); n > 0; --n)
    if (text.substr(text.size() - n) == marker.substr(0, n)) return n;
  return 0;
}

}  // namespace

std::optional<ReasoningFormat> ReasoningFormatByName(std::string_view name) {
  if (name == "deepseek_r1") return ReasoningFormat::kDeepSeekR1;
  if (name == "deepseek_v3") return ReasoningFormat::kDeepSeekV3;
  if (name == "kimi_k2") return ReasoningFormat::kKimiK2;
  return std::nullopt;
}

bool StartsInReasoning(ReasoningFormat format, bool thinking) {
  return format == ReasoningFormat::kDeepSeekR1 || thinking;
}

std::pair<size_t, size_t> FindReasoningEnd(ReasoningFormat format, std::string_view text,
                                           size_t from) {
  const size_t think_end = text.find(kThinkEnd, from);
  const size_t calls = format == ReasoningFormat::kKimiK2 ? text.find(kKimiCallsBegin, from)
                                                          : std::string_view::npos;
  if (calls != std::string_view::npos && (think_end == std::string_view::npos || calls < think_end))
    return {calls, calls};  // the calls are the answer's
  if (think_end == std::string_view::npos) return {think_end, think_end};
  return {think_end, think_end + kThinkEnd.size()};
}

ReasoningParser::ReasoningParser(bool starts_in_reasoning, ReasoningFormat format)
    : format_(format), in_reasoning_(starts_in_reasoning), at_start_(starts_in_reasoning) {}

void ReasoningParser::Feed(std::string_view text, OutputDelta* out) {
  buffer_ += text;
  Run(out, false);
}

void ReasoningParser::Finish(OutputDelta* out) {
  Run(out, true);
}

void ReasoningParser::Run(OutputDelta* out, bool final) {
  if (at_start_) {  // an opening "<think>" written by the model itself is dropped
    if (buffer_.starts_with(kThinkBegin)) {
      buffer_.erase(0, kThinkBegin.size());
      at_start_ = false;
    } else if (!final && std::string_view(kThinkBegin).starts_with(buffer_)) {
      return;
    } else {
      at_start_ = false;
    }
  }
  if (in_reasoning_) {
    const auto [at, answer] = FindReasoningEnd(format_, buffer_);
    if (at == std::string::npos) {
      size_t hold = final ? 0 : HeldPrefix(buffer_, kThinkEnd);
      if (!final && format_ == ReasoningFormat::kKimiK2)
        hold = std::max(hold, HeldPrefix(buffer_, kKimiCallsBegin));
      out->reasoning += buffer_.substr(0, buffer_.size() - hold);
      buffer_.erase(0, buffer_.size() - hold);
      return;
    }
    out->reasoning += buffer_.substr(0, at);
    buffer_.erase(0, answer);
    in_reasoning_ = false;
  }
  out->content += buffer_;
  buffer_.clear();
}

}  // namespace sy::chat_output
