#include "tokenizer/chat_template.h"

#include <xxhash.h>

#include <array>

#include <nlohmann/json.hpp>

#include "jinja/template.h"
#include "tokenizer/deepseek_v32_encoding.h"

namespace sy {
namespace {

using json = nlohmann::ordered_json;

// The exact templates recognised, by XXH3-64 of their bytes (the texts are in
// tests/fixtures/tokenizer/templates, with where each came from).
struct KnownTemplate {
  uint64_t hash;
  ChatTemplateKind kind;
  const char* name;
};
constexpr std::array<KnownTemplate, 4> kKnownTemplates = {{
    {0x6d68488b86e2e184ull, ChatTemplateKind::kDeepSeekV3, "deepseek-v3"},
    {0x56a138c31521e7c8ull, ChatTemplateKind::kDeepSeekR1, "deepseek-r1"},
    {0x2c92a8e6f77c96b8ull, ChatTemplateKind::kDeepSeekV3_0324, "deepseek-v3-0324"},
    {0xd48c10c1962fbd84ull, ChatTemplateKind::kDeepSeekV3_1, "deepseek-v3.1"},
}};

constexpr std::string_view kEos = "<｜end▁of▁sentence｜>";
constexpr std::string_view kUser = "<｜User｜>";
constexpr std::string_view kAssistant = "<｜Assistant｜>";
constexpr std::string_view kCallsBegin = "<｜tool▁calls▁begin｜>";
constexpr std::string_view kCallsEnd = "<｜tool▁calls▁end｜>";
constexpr std::string_view kCallBegin = "<｜tool▁call▁begin｜>";
constexpr std::string_view kCallEnd = "<｜tool▁call▁end｜>";
constexpr std::string_view kSep = "<｜tool▁sep｜>";
constexpr std::string_view kOutputsBegin = "<｜tool▁outputs▁begin｜>";
constexpr std::string_view kOutputsEnd = "<｜tool▁outputs▁end｜>";
constexpr std::string_view kOutputBegin = "<｜tool▁output▁begin｜>";
constexpr std::string_view kOutputEnd = "<｜tool▁output▁end｜>";

// Jinja's view of one message: a missing key is undefined, null is none.
class Message {
 public:
  Message(const json& value, size_t index) : value_(value), index_(index) {}

  std::string_view role() const {
    auto it = value_.find("role");
    return it != value_.end() && it->is_string()
               ? std::string_view(it->get_ref<const std::string&>())
               : std::string_view();
  }
  bool Has(const char* key) const { return value_.contains(key); }
  // `message[key] is none`: present and null.
  bool IsNone(const char* key) const {
    auto it = value_.find(key);
    return it != value_.end() && it->is_null();
  }
  // `message[key] is defined and message[key] is not none`.
  bool DefinedNotNone(const char* key) const {
    auto it = value_.find(key);
    return it != value_.end() && !it->is_null();
  }
  // Jinja truthiness of message[key] (undefined and none are false).
  bool Truthy(const char* key) const {
    auto it = value_.find(key);
    if (it == value_.end() || it->is_null()) return false;
    if (it->is_boolean()) return it->get<bool>();
    if (it->is_number()) return it->get<double>() != 0;
    if (it->is_string() || it->is_array() || it->is_object()) return !it->empty();
    return false;
  }
  // message[key] where the template concatenates it to a string.
  Result<std::string> String(const char* key) const {
    auto it = value_.find(key);
    if (it == value_.end())
      return Status::Errorf("messages[{}] ({}): \"{}\" is missing", index_, role(), key);
    if (!it->is_string())
      return Status::Errorf("messages[{}] ({}): \"{}\" must be a string, not {}", index_, role(),
                            key, it->is_null() ? "null" : it->type_name());
    return it->get<std::string>();
  }
  Result<const json*> ToolCalls() const {
    auto it = value_.find("tool_calls");
    if (it == value_.end() || !it->is_array())
      return Status::Errorf("messages[{}] ({}): \"tool_calls\" must be a list", index_, role());
    return &*it;
  }
  size_t index() const { return index_; }

 private:
  const json& value_;
  size_t index_;
};

struct ToolCall {
  std::string type, name, arguments;
};

// tool['type'], tool['function']['name'], tool['function']['arguments'] as strings.
Result<ToolCall> ReadToolCall(const json& tool, size_t message, size_t call, bool need_type) {
  auto where = [&](const char* field) {
    return fmt::format("messages[{}].tool_calls[{}]: \"{}\" must be a string", message, call,
                       field);
  };
  if (!tool.is_object())
    return Status::Errorf("messages[{}].tool_calls[{}]: not an object", message, call);
  ToolCall out;
  if (need_type) {
    if (!tool.contains("type") || !tool["type"].is_string()) return Status::Error(where("type"));
    out.type = tool["type"].get<std::string>();
  }
  if (!tool.contains("function") || !tool["function"].is_object())
    return Status::Errorf("messages[{}].tool_calls[{}]: \"function\" must be an object", message,
                          call);
  const json& function = tool["function"];
  if (!function.contains("name") || !function["name"].is_string())
    return Status::Error(where("function.name"));
  if (!function.contains("arguments") || !function["arguments"].is_string())
    return Status::Error(where("function.arguments"));
  out.name = function["name"].get<std::string>();
  out.arguments = function["arguments"].get<std::string>();
  return out;
}

// The V3/R1 and V3-0324 templates spell one call the same way.
std::string V3Call(const ToolCall& call) {
  return fmt::format("{}{}{}{}\n```json\n{}\n```{}", kCallBegin, call.type, kSep, call.name,
                     call.arguments, kCallEnd);
}

// The tool-call list every variant writes for an assistant message with calls:
//   [before-first] content? <calls_begin> call (separator call)* <calls_end> EOS
// `before_first`: what precedes the first call (V3 repeats the assistant tag); `separator`:
// between calls ("\n" for V3 and V3-0324, nothing for V3.1); `is_first`: the template's
// namespace flag (V3 never resets it, so a later message continues the list).
Status AppendToolCalls(const Message& m, std::string_view before_first, std::string_view separator,
                       bool with_type, bool& is_first, std::string& out) {
  SY_ASSIGN_OR_RETURN(const json* calls, m.ToolCalls());
  for (size_t c = 0; c < calls->size(); ++c) {
    SY_ASSIGN_OR_RETURN(ToolCall call, ReadToolCall((*calls)[c], m.index(), c, with_type));
    const std::string spelled = with_type ? V3Call(call)
                                          : fmt::format("{}{}{}{}{}", kCallBegin, call.name, kSep,
                                                        call.arguments, kCallEnd);
    if (!is_first) {
      out += before_first;
      if (!m.IsNone("content")) {
        SY_ASSIGN_OR_RETURN(std::string content, m.String("content"));
        out += content;
      }
      out += kCallsBegin;
      is_first = true;
    } else {
      out += separator;
    }
    out += spelled;
  }
  out += kCallsEnd;
  out += kEos;
  return Status::Ok();
}

// Jinja's `tojson` as transformers runs it: json.dumps with ", " and ": " separators, non-ASCII
// kept.
void PythonJson(const json& value, std::string& out) {
  if (value.is_object()) {
    out += '{';
    bool first = true;
    for (auto it = value.begin(); it != value.end(); ++it) {
      if (!first) out += ", ";
      first = false;
      out += json(it.key()).dump();
      out += ": ";
      PythonJson(it.value(), out);
    }
    out += '}';
  } else if (value.is_array()) {
    out += '[';
    for (size_t i = 0; i < value.size(); ++i) {
      if (i) out += ", ";
      PythonJson(value[i], out);
    }
    out += ']';
  } else {
    out += value.dump(-1, ' ', false, json::error_handler_t::replace);
  }
}

// The tools block vLLM's tool chat template for the variant appends to the system prompt.
std::string ToolsBlock(ChatTemplateKind kind, const json& tools) {
  std::string out;
  if (kind == ChatTemplateKind::kDeepSeekV3_1) {  // tool_chat_template_deepseekv31.jinja
    out = "\n\n## Tools\nYou have access to the following tools:\n";
    for (const json& tool : tools)
      PythonJson(tool, out);
    out +=
        "IMPORTANT: ALWAYS adhere to this exact format for tool use:\n"
        "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>tool_call_name<｜tool▁sep｜>tool_call_arguments"
        "<｜tool▁call▁end｜>{{additional_tool_calls}}<｜tool▁calls▁end｜>\n\nWhere:\n\n"
        "- `tool_call_name` must be an exact match to one of the available tools\n"
        "- `tool_call_arguments` must be valid JSON that strictly follows the tool's Parameters "
        "Schema\n"
        "- For multiple tool calls, chain them directly without separators or spaces\n";
  } else if (kind == ChatTemplateKind::kDeepSeekR1) {  // tool_chat_template_deepseekr1.jinja
    out =
        "\n\nYou are a helpful assistant with tool calling capabilities. When a tool call is "
        "needed, you MUST use the following format to issue the call:\n"
        "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>FUNCTION_NAME\n"
        "```json\n{\"param1\": \"value1\", \"param2\": \"value2\"}\n```<｜tool▁call▁end｜>"
        "<｜tool▁calls▁end｜>\n\nMake sure the JSON is valid.## Tools\n\n### Function\n\nYou "
        "have the following functions available:\n\n";
    for (const json& tool : tools) {
      out += "\n```json\n";
      PythonJson(tool, out);
      out += "\n```\n";
    }
  } else {  // V3 and V3-0324: tool_chat_template_deepseekv3.jinja
    out =
        "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n<tools>";
    for (const json& tool : tools) {
      out += "\n";
      PythonJson(tool, out);
    }
    out +=
        "\n</tools>\n\nFor function call returns, you should first print "
        "<｜tool▁calls▁begin｜>For each function call, you should return object like:\n"
        "<｜tool▁call▁begin｜>function<｜tool▁sep｜><function_name>\n```json\n"
        "<function_arguments_in_json_format>\n```<｜tool▁call▁end｜>At the end of function call "
        "returns, you should print <｜tool▁calls▁end｜><｜end▁of▁sentence｜>";
  }
  return out;
}

// System messages are hoisted to the front, joined by a blank line (every variant); the tools
// block, when there are tools, follows them.
Result<std::string> SystemPrompt(const json& messages, ChatTemplateKind kind,
                                 const ChatOptions& options) {
  std::string prompt;
  bool first = true;
  for (size_t i = 0; i < messages.size(); ++i) {
    Message m(messages[i], i);
    if (m.role() != "system") continue;
    SY_ASSIGN_OR_RETURN(std::string content, m.String("content"));
    if (!first) prompt += "\n\n";
    prompt += content;
    first = false;
  }
  if (options.tools && options.tools->is_array() && !options.tools->empty())
    prompt += ToolsBlock(kind, *options.tools);
  return prompt;
}

// DeepSeek-V3 (December 2024) and R1 (January 2025); R1 differs only in the generation prompt.
Result<std::string> RenderV3(const json& messages, const ChatOptions& options,
                             const std::string& bos, bool r1) {
  bool is_first = false, is_tool = false, is_output_first = true;
  SY_ASSIGN_OR_RETURN(
      std::string out,
      SystemPrompt(messages, r1 ? ChatTemplateKind::kDeepSeekR1 : ChatTemplateKind::kDeepSeekV3,
                   options));
  out.insert(0, bos);
  for (size_t i = 0; i < messages.size(); ++i) {
    Message m(messages[i], i);
    const std::string_view role = m.role();
    if (role == "user") {
      is_tool = false;
      SY_ASSIGN_OR_RETURN(std::string content, m.String("content"));
      out += kUser;
      out += content;
    }
    if (role == "assistant" && m.Has("tool_calls")) {
      is_tool = false;
      // is_first is never reset between messages in this template: a second assistant message
      // with calls continues the first one's list. Reproduced as the template is.
      SY_RETURN_IF_ERROR(AppendToolCalls(m, kAssistant, "\n", true, is_first, out));
    }
    if (role == "assistant" && !m.Has("tool_calls")) {
      SY_ASSIGN_OR_RETURN(std::string content, m.String("content"));
      if (is_tool) {
        out += kOutputsEnd;
        out += content;
        out += kEos;
        is_tool = false;
      } else {
        // Only the answer after the last </think> stays in the history.
        if (const size_t at = content.rfind("</think>"); at != std::string::npos)
          content = content.substr(at + 8);
        out += kAssistant;
        out += content;
        out += kEos;
      }
    }
    if (role == "tool") {
      is_tool = true;
      SY_ASSIGN_OR_RETURN(std::string content, m.String("content"));
      if (is_output_first) {
        out += kOutputsBegin;
        is_output_first = false;
      }
      out += kOutputBegin;
      out += content;
      out += kOutputEnd;
    }
  }
  if (is_tool) out += kOutputsEnd;
  if (options.add_generation_prompt && !is_tool) {
    out += kAssistant;
    if (r1) out += "<think>\n";
  }
  return out;
}

// DeepSeek-V3-0324: user turns carry the assistant tag; the generation prompt is added only when
// the last message is not such a user turn.
Result<std::string> RenderV3_0324(const json& messages, const ChatOptions& options,
                                  const std::string& bos) {
  bool is_first = false, is_tool = false, is_output_first = true, is_last_user = false;
  SY_ASSIGN_OR_RETURN(std::string out,
                      SystemPrompt(messages, ChatTemplateKind::kDeepSeekV3_0324, options));
  out.insert(0, bos);
  for (size_t i = 0; i < messages.size(); ++i) {
    Message m(messages[i], i);
    const std::string_view role = m.role();
    if (role == "user") {
      is_tool = false;
      is_first = false;
      is_last_user = true;
      SY_ASSIGN_OR_RETURN(std::string content, m.String("content"));
      out += kUser;
      out += content;
      out += kAssistant;
    }
    const bool has_calls = m.DefinedNotNone("tool_calls");
    if (role == "assistant" && has_calls) {
      is_last_user = false;
      if (is_tool) out += kOutputsEnd;
      is_first = false;
      is_tool = false;
      is_output_first = true;
      SY_RETURN_IF_ERROR(AppendToolCalls(m, "", "\n", true, is_first, out));
    }
    if (role == "assistant" && !has_calls) {
      is_last_user = false;
      SY_ASSIGN_OR_RETURN(std::string content, m.String("content"));
      if (is_tool) {
        out += kOutputsEnd;
        is_tool = false;
      }
      out += content;
      out += kEos;
    }
    if (role == "tool") {
      is_last_user = false;
      is_tool = true;
      SY_ASSIGN_OR_RETURN(std::string content, m.String("content"));
      if (is_output_first) {
        out += kOutputsBegin;
        is_output_first = false;
      } else {
        out += "\n";
      }
      out += kOutputBegin;
      out += content;
      out += kOutputEnd;
    }
  }
  if (is_tool) out += kOutputsEnd;
  if (options.add_generation_prompt && !is_last_user && !is_tool) out += kAssistant;
  return out;
}

// DeepSeek-V3.1: the assistant tag is followed by </think> (answer directly) or <think>.
Result<std::string> RenderV3_1(const json& messages, const ChatOptions& options,
                               const std::string& bos) {
  bool is_first = false, is_tool = false, is_last_user = false;
  SY_ASSIGN_OR_RETURN(std::string out,
                      SystemPrompt(messages, ChatTemplateKind::kDeepSeekV3_1, options));
  out.insert(0, bos);
  for (size_t i = 0; i < messages.size(); ++i) {
    Message m(messages[i], i);
    const std::string_view role = m.role();
    if (role == "user") {
      is_tool = false;
      is_first = false;
      is_last_user = true;
      SY_ASSIGN_OR_RETURN(std::string content, m.String("content"));
      out += kUser;
      out += content;
    }
    const bool has_calls = m.DefinedNotNone("tool_calls");
    if (role == "assistant" && has_calls) {
      if (is_last_user) {
        out += kAssistant;
        out += "</think>";
      }
      is_last_user = false;
      is_first = false;
      is_tool = false;
      SY_RETURN_IF_ERROR(AppendToolCalls(m, "", "", false, is_first, out));
    }
    if (role == "assistant" && !has_calls) {
      if (is_last_user) {
        out += kAssistant;
        out += m.Truthy("prefix") && options.thinking ? "<think>" : "</think>";
      }
      is_last_user = false;
      SY_ASSIGN_OR_RETURN(std::string content, m.String("content"));
      if (is_tool) {
        is_tool = false;
      } else if (const size_t at = content.find("</think>"); at != std::string::npos) {
        content = content.substr(at + 8);  // split('</think>', 1)[1]
      }
      out += content;
      out += kEos;
    }
    if (role == "tool") {
      is_last_user = false;
      is_tool = true;
      SY_ASSIGN_OR_RETURN(std::string content, m.String("content"));
      out += kOutputBegin;
      out += content;
      out += kOutputEnd;
    }
  }
  if (options.add_generation_prompt && is_last_user && !is_tool) {
    out += kAssistant;
    out += options.thinking ? "<think>" : "</think>";
  }
  return out;
}

}  // namespace

Result<ChatTemplate> ChatTemplate::Recognize(std::string_view template_text,
                                             std::string bos_token) {
  if (template_text.empty()) return Status::Error("the tokenizer has no chat template");
  const uint64_t hash = XXH3_64bits(template_text.data(), template_text.size());
  for (const KnownTemplate& known : kKnownTemplates)
    if (known.hash == hash) return ChatTemplate(known.kind, std::move(bos_token));
  std::string names;
  for (const KnownTemplate& known : kKnownTemplates)
    names += fmt::format("{}{}", names.empty() ? "" : ", ", known.name);
  return Status::Errorf(
      "chat template not recognised (XXH3-64 {:016x}, {} bytes): switchyard renders only the "
      "DeepSeek templates it knows exactly ({})",
      hash, template_text.size(), names);
}

Result<ChatTemplate> ChatTemplate::Load(std::string_view template_text,
                                        const SpecialTokens& tokens) {
  if (template_text.empty()) return Status::Error("the tokenizer has no chat template");
  auto known = Recognize(template_text, tokens.bos_token);
  if (known.ok()) {
    known->eos_ = tokens.eos_token;
    return known;
  }
  return Interpret(template_text, tokens);
}

Result<ChatTemplate> ChatTemplate::Interpret(std::string_view template_text,
                                             const SpecialTokens& tokens) {
  auto parsed = jinja::Template::Parse(template_text);
  if (!parsed.ok()) return parsed.status().WithContext("chat template");
  ChatTemplate chat(ChatTemplateKind::kJinja, tokens.bos_token);
  chat.eos_ = tokens.eos_token;
  chat.takes_content_parts_ = parsed->IteratesOver("content");
  chat.jinja_ = std::make_shared<const jinja::Template>(std::move(parsed).value());
  return chat;
}

ChatTemplate ChatTemplate::DeepSeekV32(const SpecialTokens& tokens) {
  ChatTemplate chat(ChatTemplateKind::kDeepSeekV3_2, tokens.bos_token);
  chat.eos_ = tokens.eos_token;
  return chat;
}

std::string_view ChatTemplate::name() const {
  if (kind_ == ChatTemplateKind::kJinja) return "jinja";
  if (kind_ == ChatTemplateKind::kDeepSeekV3_2) return "deepseek-v3.2 (encoding_dsv32)";
  for (const KnownTemplate& known : kKnownTemplates)
    if (known.kind == kind_) return known.name;
  return "unknown";
}

namespace {

// transformers' (4.57) continue_final_message, step for step: the final message's text gets a
// marker appended, the conversation is rendered, and the prompt is cut where the marker begins
// (and trailing whitespace trimmed when the template trimmed the marker's). A template that
// drops part of the final message (the V3 family keeps only what follows "</think>") is an
// error, as there.
constexpr std::string_view kContinueTag = "CONTINUE_FINAL_MESSAGE_TAG ";

std::string_view StripAsciiSpace(std::string_view s) {
  constexpr std::string_view kSpace = " \t\n\r\f\v";
  const size_t begin = s.find_first_not_of(kSpace);
  if (begin == std::string_view::npos) return {};
  return s.substr(begin, s.find_last_not_of(kSpace) - begin + 1);
}

}  // namespace

Result<std::string> ChatTemplate::Render(const nlohmann::ordered_json& messages,
                                         const ChatOptions& options) const {
  if (!messages.is_array()) return Status::Error("messages must be a list");
  for (size_t i = 0; i < messages.size(); ++i)
    if (!messages[i].is_object()) return Status::Errorf("messages[{}] must be an object", i);
  if (!options.continue_final_message) return RenderKind(messages, options);
  if (options.add_generation_prompt)
    return Status::Error(
        "continue_final_message and add_generation_prompt cannot both be set: one continues the "
        "final message, the other starts a new assistant message");
  if (messages.empty()) return Status::Error("continue_final_message needs a final message");
  const size_t last = messages.size() - 1;
  nlohmann::ordered_json tagged = messages;
  json& content = tagged[last]["content"];
  std::string final_text;
  if (content.is_string()) {
    final_text = content.get<std::string>();
    content = final_text + std::string(kContinueTag);
  } else if (content.is_array()) {
    // A list of parts: the last part with text is the one continued, as transformers does.
    bool found = false;
    for (auto part = content.rbegin(); part != content.rend() && !found; ++part)
      if (part->is_object() && part->contains("text") && (*part)["text"].is_string()) {
        final_text = (*part)["text"].get<std::string>();
        (*part)["text"] = final_text + std::string(kContinueTag);
        found = true;
      }
    if (!found)
      return Status::Errorf(
          "messages[{}]: continue_final_message needs a text part in the final message", last);
  } else {
    return Status::Errorf("messages[{}]: continue_final_message needs the final message's text",
                          last);
  }
  SY_ASSIGN_OR_RETURN(std::string rendered, RenderKind(tagged, options));
  const std::string_view marker = StripAsciiSpace(kContinueTag);
  if (rendered.find(StripAsciiSpace(final_text)) == std::string::npos ||
      rendered.find(marker) == std::string::npos)
    return Status::Errorf(
        "messages[{}]: continue_final_message is set but the chat template drops part of the "
        "final message{}",
        last,
        kind_ == ChatTemplateKind::kJinja
            ? ""
            : " (the DeepSeek-V3 family keeps only what follows \"</think>\")");
  const size_t at = rendered.rfind(marker);
  if (rendered.compare(at, kContinueTag.size(), kContinueTag) == 0) {
    rendered.resize(at);
  } else {
    rendered = std::string(rendered.substr(0, at));
    rendered.resize(rendered.find_last_not_of(" \t\n\r\f\v") + 1);
  }
  return rendered;
}

Result<std::string> ChatTemplate::RenderKind(const nlohmann::ordered_json& messages,
                                             const ChatOptions& options) const {
  switch (kind_) {
    case ChatTemplateKind::kDeepSeekV3:
      return RenderV3(messages, options, bos_, false);
    case ChatTemplateKind::kDeepSeekR1:
      return RenderV3(messages, options, bos_, true);
    case ChatTemplateKind::kDeepSeekV3_0324:
      return RenderV3_0324(messages, options, bos_);
    case ChatTemplateKind::kDeepSeekV3_1:
      return RenderV3_1(messages, options, bos_);
    case ChatTemplateKind::kDeepSeekV3_2:
      return RenderDeepSeekV32(messages, options, bos_, eos_);
    case ChatTemplateKind::kJinja:
      return RenderInterpreted(messages, options);
  }
  return Status::Error("unreachable chat template kind");
}

Result<std::string> ChatTemplate::RenderInterpreted(const nlohmann::ordered_json& messages,
                                                    const ChatOptions& options) const {
  // transformers' render(messages=…, tools=…, documents=None, add_generation_prompt=…,
  // **special tokens, **kwargs): the request's kwargs may replace a special token, not the
  // conversation.
  // The request's JSON may nest deeper than a template's values can (jinja::kMaxValueNesting).
  try {
    return RenderInterpretedChecked(messages, options);
  } catch (const jinja::TemplateError& error) {
    return Status::Error(std::string("chat template: the request's ") + error.what());
  }
}

Result<std::string> ChatTemplate::RenderInterpretedChecked(const nlohmann::ordered_json& messages,
                                                           const ChatOptions& options) const {
  auto context = std::make_shared<jinja::Dict>();
  auto set = [&](const char* key, jinja::Value value) {
    context->Set(jinja::Value::String(key), std::move(value));
  };
  set("bos_token", jinja::Value::String(bos_));
  set("eos_token", jinja::Value::String(eos_));
  if (options.template_kwargs && options.template_kwargs->is_object())
    for (const auto& [key, value] : options.template_kwargs->items())
      if (key != "messages" && key != "tools" && key != "documents" &&
          key != "add_generation_prompt")
        context->Set(jinja::Value::String(key), jinja::Value::FromJson(value));
  set("messages", jinja::Value::FromJson(messages));
  set("tools", options.tools ? jinja::Value::FromJson(*options.tools) : jinja::Value::None());
  set("documents", jinja::Value::None());
  set("add_generation_prompt", jinja::Value::Bool(options.add_generation_prompt));
  jinja::Limits limits;
  if (options.fixed_time) limits.fixed_time = *options.fixed_time;
  auto rendered = jinja_->Render(jinja::Value::MakeDict(std::move(context)), limits);
  if (!rendered.ok()) return rendered.status().WithContext("chat template");
  return rendered;
}

Result<ChatTemplate> ChatTemplateCache::Interpret(std::string_view template_text,
                                                  const SpecialTokens& tokens) {
  std::string key = tokens.bos_token;
  key.append(1, '\0').append(tokens.eos_token).append(1, '\0').append(template_text);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto it = entries_.begin(); it != entries_.end(); ++it)
      if (it->first == key) {
        entries_.splice(entries_.begin(), entries_, it);
        ++hits_;
        return entries_.front().second;
      }
  }
  // Parsed outside the lock: a slow template does not hold up the others.
  SY_ASSIGN_OR_RETURN(ChatTemplate chat, ChatTemplate::Interpret(template_text, tokens));
  std::lock_guard<std::mutex> lock(mutex_);
  entries_.emplace_front(std::move(key), chat);
  while (entries_.size() > capacity_)
    entries_.pop_back();
  return chat;
}

int64_t ChatTemplateCache::hits() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return hits_;
}

}  // namespace sy
