#include "chat_output/tool_parser.h"

#include <nlohmann/json.hpp>

namespace sy::chat_output {
namespace {

// The length of the longest suffix of `text` that is a proper prefix of `marker`: text that may
// still become the marker.
size_t HeldSuffix(std::string_view text, std::string_view marker) {
  for (size_t n = std::min(text.size(), marker.size() - 1); n > 0; --n)
    if (text.substr(text.size() - n) == marker.substr(0, n)) return n;
  return 0;
}

bool IsSpace(char c) {
  return c == ' ' || c == '\n' || c == '\r' || c == '\t';
}

constexpr std::string_view kV3NameEnd = "\n```json\n";
constexpr std::string_view kV3ArgumentsEnd = "\n```<｜tool▁call▁end｜>";

// Each format's markers.
struct Markers {
  std::string_view calls_begin, calls_end, call_begin, name_end, arguments_end;
};

Markers MarkersOf(ToolCallFormat format) {
  switch (format) {
    case ToolCallFormat::kDeepSeekV3:
      return {kCallsBegin, kCallsEnd, kCallBegin, kV3NameEnd, kV3ArgumentsEnd};
    case ToolCallFormat::kDeepSeekV31:
      return {kCallsBegin, kCallsEnd, kCallBegin, kToolSep, kCallEnd};
    case ToolCallFormat::kKimiK2:
      return {kKimiCallsBegin, kKimiCallsEnd, kKimiCallBegin, kKimiArgumentsBegin, kKimiCallEnd};
  }
  return {};
}

// Kimi K2's call id, "functions.NAME:INDEX" (vLLM: [^<]+:\d+ with the space around dropped),
// and the name in it; false when the text is not one.
bool ReadKimiId(std::string_view text, std::string* id, std::string* name) {
  while (!text.empty() && IsSpace(text.front()))
    text.remove_prefix(1);
  while (!text.empty() && IsSpace(text.back()))
    text.remove_suffix(1);
  const size_t colon = text.rfind(':');
  if (colon == std::string_view::npos || colon == 0 || colon + 1 == text.size() ||
      text.find('<') != std::string_view::npos)
    return false;
  for (char c : text.substr(colon + 1))
    if (c < '0' || c > '9') return false;
  std::string_view before = text.substr(0, text.find(':'));
  if (const size_t dot = before.rfind('.'); dot != std::string_view::npos)
    before.remove_prefix(dot + 1);
  if (before.empty()) return false;
  *id = std::string(text);
  *name = std::string(before);
  return true;
}

}  // namespace

std::optional<ToolCallFormat> ToolCallFormatByName(std::string_view name) {
  if (name == "deepseek_v3" || name == "deepseekv3") return ToolCallFormat::kDeepSeekV3;
  if (name == "deepseek_v31" || name == "deepseekv31") return ToolCallFormat::kDeepSeekV31;
  if (name == "kimi_k2") return ToolCallFormat::kKimiK2;
  return std::nullopt;
}

std::string_view ToolCallFormatName(ToolCallFormat format) {
  switch (format) {
    case ToolCallFormat::kDeepSeekV3:
      return "deepseek_v3";
    case ToolCallFormat::kDeepSeekV31:
      return "deepseek_v31";
    case ToolCallFormat::kKimiK2:
      return "kimi_k2";
  }
  return "";
}

std::string_view CallsBeginMarker(ToolCallFormat format) {
  return MarkersOf(format).calls_begin;
}

ToolCallParser::ToolCallParser(ToolCallFormat format)
    : format_(format), rng_(std::random_device{}()) {}

std::string ToolCallParser::NewId() {
  static constexpr char kAlphabet[] =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  std::string id = "call_";
  for (int i = 0; i < 24; ++i)
    id += kAlphabet[rng_() % (sizeof(kAlphabet) - 1)];
  return id;
}

void ToolCallParser::Feed(std::string_view text, OutputDelta* out) {
  buffer_ += text;
  Run(out, false);
}

void ToolCallParser::Finish(OutputDelta* out, bool cut) {
  Run(out, true, cut);
}

void ToolCallParser::Run(OutputDelta* out, bool final, bool cut) {
  const bool v3 = format_ == ToolCallFormat::kDeepSeekV3;
  const bool kimi = format_ == ToolCallFormat::kKimiK2;
  const Markers m = MarkersOf(format_);
  auto junk = [&] {  // from here on the output is not a tool call
    malformed_ = true;
    state_ = State::kJunk;
  };
  for (;;) {
    switch (state_) {
      case State::kContent: {
        const size_t at = buffer_.find(m.calls_begin);
        if (at != std::string::npos) {
          out->content += buffer_.substr(0, at);
          buffer_.erase(0, at + m.calls_begin.size());
          state_ = State::kBetween;
          continue;
        }
        const size_t hold = final ? 0 : HeldSuffix(buffer_, m.calls_begin);
        out->content += buffer_.substr(0, buffer_.size() - hold);
        buffer_.erase(0, buffer_.size() - hold);
        return;
      }
      case State::kBetween: {
        size_t skip = 0;
        while (skip < buffer_.size() && IsSpace(buffer_[skip]))
          ++skip;
        buffer_.erase(0, skip);
        if (buffer_.starts_with(m.call_begin)) {
          buffer_.erase(0, m.call_begin.size());
          current_ = ToolCall{};
          arguments_started_ = false;
          state_ = v3 ? State::kType : State::kName;
          continue;
        }
        if (buffer_.starts_with(m.calls_end)) {
          buffer_.erase(0, m.calls_end.size());
          state_ = State::kDone;
          continue;
        }
        if (buffer_.empty()) {
          // The list may end without its closing token (the output stopped right after a call).
          if (final && calls_.empty() && !cut) malformed_ = true;
          return;
        }
        const bool may_become =
            m.call_begin.starts_with(buffer_) || m.calls_end.starts_with(buffer_);
        if (may_become && (!final || cut)) {
          if (final) buffer_.clear();  // a marker the budget cut
          return;
        }
        junk();
        continue;
      }
      case State::kType:
      case State::kName: {
        const std::string_view end = state_ == State::kType ? kToolSep : m.name_end;
        const size_t at = buffer_.find(end);
        if (at == std::string::npos) {
          if (!final) return;
          if (cut) {  // the budget cut the call's header: nothing of it was sent
            buffer_.clear();
            return;
          }
          junk();
          continue;
        }
        if (state_ == State::kType) {
          buffer_.erase(0, at + end.size());
          state_ = State::kName;
          continue;
        }
        if (kimi) {
          if (!ReadKimiId(std::string_view(buffer_).substr(0, at), &current_.id, &current_.name)) {
            junk();
            continue;
          }
        } else {
          current_.name = buffer_.substr(0, at);
          current_.id = NewId();
        }
        buffer_.erase(0, at + end.size());
        ToolCallDelta delta;
        delta.index = static_cast<int>(calls_.size());
        delta.id = current_.id;
        delta.name = current_.name;
        out->tool_calls.push_back(std::move(delta));
        state_ = State::kArguments;
        continue;
      }
      case State::kArguments: {
        const std::string_view end = m.arguments_end;
        if (kimi && !arguments_started_) {  // space before the arguments is not theirs
          size_t skip = 0;
          while (skip < buffer_.size() && IsSpace(buffer_[skip]))
            ++skip;
          buffer_.erase(0, skip);
          arguments_started_ = !buffer_.empty();
        }
        const size_t at = buffer_.find(end);
        size_t take = at != std::string::npos ? at
                      : final                 ? buffer_.size()
                                              : buffer_.size() - HeldSuffix(buffer_, end);
        if (kimi) {  // nor is space after them: held until more arguments follow it
          while (take > 0 && IsSpace(buffer_[take - 1]))
            --take;
        }
        if (take > 0) {
          const std::string piece = buffer_.substr(0, take);
          current_.arguments += piece;
          if (!out->tool_calls.empty() &&
              out->tool_calls.back().index == static_cast<int>(calls_.size())) {
            out->tool_calls.back().arguments += piece;  // one delta per call per Feed
          } else {
            ToolCallDelta delta;
            delta.index = static_cast<int>(calls_.size());
            delta.arguments = piece;
            out->tool_calls.push_back(std::move(delta));
          }
          buffer_.erase(0, take);
        }
        if (at == std::string::npos) {
          if (final && cut) {
            calls_.push_back(std::move(current_));  // the arguments written before the cut
            current_ = ToolCall{};
          } else if (final) {
            malformed_ = true;  // the call never ended
          }
          if (final) buffer_.clear();
          return;
        }
        buffer_.erase(0, at - take + end.size());
        if (!nlohmann::json::accept(current_.arguments)) malformed_ = true;
        calls_.push_back(std::move(current_));
        current_ = ToolCall{};
        state_ = State::kBetween;
        continue;
      }
      case State::kDone:
        buffer_.clear();  // after the list: dropped, as vLLM does
        return;
      case State::kJunk:
        out->content += buffer_;
        buffer_.clear();
        return;
    }
  }
}

ParsedToolCalls ParseToolCalls(ToolCallFormat format, std::string_view text, bool cut) {
  ToolCallParser parser(format);
  OutputDelta delta;
  parser.Feed(text, &delta);
  parser.Finish(&delta, cut);
  ParsedToolCalls out;
  if (parser.malformed()) {
    if (!text.empty()) out.content = std::string(text);
    return out;
  }
  if (!delta.content.empty()) out.content = std::move(delta.content);
  out.calls = parser.calls();
  return out;
}

}  // namespace sy::chat_output
