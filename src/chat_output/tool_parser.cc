#include "chat_output/tool_parser.h"

#include <fmt/format.h>

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
// DSML: what ends an invoke's or a parameter's opening tag, and parts a parameter's name from
// its string flag.
constexpr std::string_view kDsmlTagEnd = "\">";
constexpr std::string_view kDsmlStringFlag = "\" string=\"";
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
    case ToolCallFormat::kDeepSeekV32:
      return {kDsmlCallsBegin, kDsmlCallsEnd, kDsmlInvokeBegin, kDsmlTagEnd, kDsmlInvokeEnd};
  }
  return {};
}

// Text as inside a JSON string, as Python's json.dumps(ensure_ascii=False) writes it: '"', '\\'
// and control characters escaped, everything else (UTF-8 included) as it is. Byte by byte, so
// a piece of a value escapes as the whole value would.
std::string JsonEscaped(std::string_view text) {
  std::string out;
  for (const char c : text) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20)
          out += fmt::format("\\u{:04x}", static_cast<unsigned char>(c));
        else
          out += c;
    }
  }
  return out;
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
  if (name == "deepseek_v32" || name == "deepseekv32") return ToolCallFormat::kDeepSeekV32;
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
    case ToolCallFormat::kDeepSeekV32:
      return "deepseek_v32";
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
  const bool dsml = format_ == ToolCallFormat::kDeepSeekV32;
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
          // DSML's call list follows its content after a blank line, which is not content.
          size_t end = at;
          while (dsml && end > 0 && IsSpace(buffer_[end - 1]))
            --end;
          out->content += buffer_.substr(0, end);
          buffer_.erase(0, at + m.calls_begin.size());
          state_ = State::kBetween;
          continue;
        }
        size_t hold = final ? 0 : HeldSuffix(buffer_, m.calls_begin);
        while (dsml && !final && hold < buffer_.size() &&
               IsSpace(buffer_[buffer_.size() - hold - 1]))
          ++hold;  // space that may precede the call list: sent once text follows it
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
        } else if (dsml) {
          const std::string_view name = std::string_view(buffer_).substr(0, at);
          if (name.empty() || name.find_first_of("<\"\n") != std::string_view::npos) {
            junk();
            continue;
          }
          current_.name = std::string(name);
          current_.id = NewId();
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
        state_ = dsml ? State::kParameters : State::kArguments;
        parameters_ = 0;
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
          AppendArguments(buffer_.substr(0, take), out);
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
      case State::kParameters:
      case State::kParameterHeader:
      case State::kValue: {
        bool done = false;
        if (RunDsml(out, final, cut, &done) && done) return;
        continue;
      }
    }
  }
}

void ToolCallParser::AppendArguments(const std::string& text, OutputDelta* out) {
  if (text.empty()) return;
  current_.arguments += text;
  if (!out->tool_calls.empty() && out->tool_calls.back().index == static_cast<int>(calls_.size())) {
    out->tool_calls.back().arguments += text;  // one delta per call per Feed
  } else {
    ToolCallDelta delta;
    delta.index = static_cast<int>(calls_.size());
    delta.arguments = text;
    out->tool_calls.push_back(std::move(delta));
  }
}

// One step of DSML's invoke body; *done when Run must return (more text is needed, or the end).
bool ToolCallParser::RunDsml(OutputDelta* out, bool final, bool cut, bool* done) {
  auto junk = [&] {
    malformed_ = true;
    state_ = State::kJunk;
  };
  // The end of the output inside an invoke: a budget cut keeps the call as written so far (the
  // stream sent it), anything else is malformed.
  auto ended = [&] {
    if (cut) {
      calls_.push_back(std::move(current_));
      current_ = ToolCall{};
    } else {
      malformed_ = true;
    }
    buffer_.clear();
    *done = true;
  };
  switch (state_) {
    case State::kParameters: {
      size_t skip = 0;
      while (skip < buffer_.size() && IsSpace(buffer_[skip]))
        ++skip;
      buffer_.erase(0, skip);
      if (buffer_.starts_with(kDsmlParameterBegin)) {
        buffer_.erase(0, kDsmlParameterBegin.size());
        state_ = State::kParameterHeader;
        return true;
      }
      if (buffer_.starts_with(kDsmlInvokeEnd)) {
        buffer_.erase(0, kDsmlInvokeEnd.size());
        AppendArguments(parameters_ == 0 ? "{}" : "}", out);
        if (!nlohmann::json::accept(current_.arguments)) malformed_ = true;
        calls_.push_back(std::move(current_));
        current_ = ToolCall{};
        state_ = State::kBetween;
        return true;
      }
      if (buffer_.empty() ||
          ((kDsmlParameterBegin.starts_with(buffer_) || kDsmlInvokeEnd.starts_with(buffer_)))) {
        if (final) {
          ended();
        } else {
          *done = true;
        }
        return true;
      }
      junk();
      return true;
    }
    case State::kParameterHeader: {
      const size_t at = buffer_.find(kDsmlTagEnd);
      if (at == std::string::npos) {
        if (final) {
          ended();  // the parameter's name was not whole: nothing of it was sent
        } else {
          *done = true;
        }
        return true;
      }
      const std::string_view header = std::string_view(buffer_).substr(0, at);
      const size_t flag = header.rfind(kDsmlStringFlag);
      const std::string_view key =
          flag == std::string_view::npos ? std::string_view() : header.substr(0, flag);
      const std::string_view value_kind = flag == std::string_view::npos
                                              ? std::string_view()
                                              : header.substr(flag + kDsmlStringFlag.size());
      if (key.empty() || key.find_first_of("<\n") != std::string_view::npos ||
          (value_kind != "true" && value_kind != "false")) {
        junk();
        return true;
      }
      string_value_ = value_kind == "true";
      AppendArguments(std::string(parameters_ == 0 ? "{" : ", ") + "\"" + JsonEscaped(key) +
                          "\": " + (string_value_ ? "\"" : ""),
                      out);
      ++parameters_;
      buffer_.erase(0, at + kDsmlTagEnd.size());
      state_ = State::kValue;
      return true;
    }
    case State::kValue: {
      const size_t at = buffer_.find(kDsmlParameterEnd);
      const size_t take = at != std::string::npos ? at
                          : final                 ? buffer_.size()
                                  : buffer_.size() - HeldSuffix(buffer_, kDsmlParameterEnd);
      const std::string_view piece = std::string_view(buffer_).substr(0, take);
      AppendArguments(string_value_ ? JsonEscaped(piece) : std::string(piece), out);
      buffer_.erase(0, take);
      if (at == std::string::npos) {
        if (final) {
          ended();
        } else {
          *done = true;
        }
        return true;
      }
      buffer_.erase(0, kDsmlParameterEnd.size());
      if (string_value_) AppendArguments("\"", out);
      state_ = State::kParameters;
      return true;
    }
    default:
      return false;
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
