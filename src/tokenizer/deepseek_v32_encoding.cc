#include "tokenizer/deepseek_v32_encoding.h"

#include <fmt/format.h>

#include "jinja/value.h"

namespace sy {
namespace {

using json = nlohmann::ordered_json;

constexpr std::string_view kUser = "<｜User｜>";
constexpr std::string_view kAssistant = "<｜Assistant｜>";
constexpr std::string_view kThinkStart = "<think>";
constexpr std::string_view kThinkEnd = "</think>";

// The tools block DeepSeek's encoding appends to a system prompt (its words: the model was
// trained on them).
std::string ToolsBlock(const std::string& schemas) {
  const std::string d(kDsmlToken);
  return "## Tools\n\nYou have access to a set of tools you can use to answer the user's "
         "question.\nYou can invoke functions by writing a \"<" +
         d + "function_calls>\" block like the following as part of your reply to the user:\n<" +
         d + "function_calls>\n<" + d + "invoke name=\"$FUNCTION_NAME\">\n<" + d +
         "parameter name=\"$PARAMETER_NAME\" string=\"true|false\">$PARAMETER_VALUE</" + d +
         "parameter>\n...\n</" + d + "invoke>\n<" + d +
         "invoke name=\"$FUNCTION_NAME2\">\n...\n</" + d + "invoke>\n</" + d +
         "function_calls>\n\nString and scalar parameters should be specified as is without any "
         "escaping or quotes, while lists and objects should use JSON format. The \"string\" "
         "attribute should be set to \"true\" for string type parameters and \"false\" for "
         "other types (numbers, booleans, arrays, objects).\n\nIf the thinking_mode is enabled, "
         "then after function results you should strongly consider outputting a thinking block. "
         "Here is an example:\n\n<" +
         d + "function_calls>\n...\n</" + d +
         "function_calls>\n\n<function_results>\n...\n</function_results>\n\n" +
         std::string(kThinkStart) + "...thinking about results" + std::string(kThinkEnd) +
         "\n\nHere are the functions available in JSONSchema format:\n<functions>\n" + schemas +
         "\n</functions>\n";
}

// Python's json.dumps(value, ensure_ascii=False): ", " and ": ", floats as repr.
Result<std::string> ToJson(const json& value) {
  std::string out, why;
  if (!jinja::ToJson(jinja::Value::FromJson(value), jinja::JsonStyle{}, &out, &why))
    return Status::Error(why);
  return out;
}

// str.format's view of a message field: a string as it is, null as "None" (the encoding formats
// whatever the message holds).
Result<std::string> Text(const json& message, const char* key, size_t index) {
  auto it = message.find(key);
  if (it == message.end() || it->is_null()) return std::string("None");
  if (it->is_string()) return it->get<std::string>();
  return Status::Errorf("messages[{}]: \"{}\" must be a string", index, key);
}

// `content or ""`.
std::string TextOrEmpty(const json& message, const char* key) {
  auto it = message.find(key);
  return it != message.end() && it->is_string() ? it->get<std::string>() : std::string();
}

bool Truthy(const json& message, const char* key) {
  auto it = message.find(key);
  if (it == message.end() || it->is_null()) return false;
  if (it->is_boolean()) return it->get<bool>();
  if (it->is_string() || it->is_array() || it->is_object()) return !it->empty();
  return true;
}

std::string Role(const json& message) {
  auto it = message.find("role");
  return it != message.end() && it->is_string() ? it->get<std::string>() : std::string();
}

int64_t LastUserIndex(const json& messages) {
  for (int64_t i = static_cast<int64_t>(messages.size()) - 1; i >= 0; --i) {
    const std::string role = Role(messages[i]);
    if (role == "user" || role == "developer") return i;
  }
  return -1;
}

// "\n\n" + the tools block of OpenAI-format tools ({"function": {...}} each, as vLLM dumps
// them), and the response-format block where the message has one.
Result<std::string> SystemExtras(const json& message, const json* tools, size_t index) {
  std::string out;
  if (tools != nullptr && tools->is_array() && !tools->empty()) {
    std::string schemas;
    for (size_t i = 0; i < tools->size(); ++i) {
      const json& tool = (*tools)[i];
      if (!tool.is_object() || !tool.contains("function"))
        return Status::Errorf("messages[{}]: tools[{}] has no \"function\"", index, i);
      SY_ASSIGN_OR_RETURN(std::string schema, ToJson(tool["function"]));
      schemas += (i ? "\n" : "") + schema;
    }
    out += "\n\n" + ToolsBlock(schemas);
  }
  if (auto it = message.find("response_format"); it != message.end() && !it->is_null()) {
    SY_ASSIGN_OR_RETURN(std::string schema, ToJson(*it));
    out +=
        "\n\n## Response Format:\n\nYou MUST strictly adhere to the following schema to "
        "reply:\n" +
        schema;
  }
  return out;
}

// An assistant message's calls in DSML.
Result<std::string> ToolCallsDsml(const json& calls, size_t index) {
  const std::string d(kDsmlToken);
  std::string invokes;
  for (size_t c = 0; c < calls.size(); ++c) {
    const json& call = calls[c];
    const std::string where = fmt::format("messages[{}].tool_calls[{}]", index, c);
    if (!call.is_object() || !call.contains("function") || !call["function"].is_object())
      return Status::Errorf("{}: \"function\" must be an object", where);
    const json& function = call["function"];
    if (!function.contains("name") || !function["name"].is_string())
      return Status::Errorf("{}.function.name must be a string", where);
    json arguments;
    auto a = function.find("arguments");
    if (a != function.end() && a->is_string()) {
      arguments = json::parse(a->get<std::string>(), nullptr, false);
      if (arguments.is_discarded())
        return Status::Errorf("{}.function.arguments is not JSON", where);
    } else if (a != function.end() && a->is_object()) {
      arguments = *a;
    } else {
      return Status::Errorf("{}.function.arguments must be a JSON object's text", where);
    }
    if (!arguments.is_object())
      return Status::Errorf("{}.function.arguments must be a JSON object", where);
    std::string parameters;
    bool first = true;
    for (const auto& [key, value] : arguments.items()) {
      std::string text;
      if (value.is_string()) {
        text = value.get<std::string>();
      } else {
        SY_ASSIGN_OR_RETURN(text, ToJson(value));
      }
      parameters += (first ? "" : "\n") +
                    fmt::format("<{}parameter name=\"{}\" string=\"{}\">{}</{}parameter>", d, key,
                                value.is_string() ? "true" : "false", text, d);
      first = false;
    }
    invokes += (c ? "\n" : "") + fmt::format("<{}invoke name=\"{}\">\n{}\n</{}invoke>", d,
                                             function["name"].get<std::string>(), parameters, d);
  }
  return fmt::format("\n\n<{}function_calls>\n{}\n</{}function_calls>", d, invokes, d);
}

}  // namespace

Result<std::string> RenderDeepSeekV32(const json& given, const ChatOptions& options,
                                      std::string_view bos, std::string_view eos) {
  const bool thinking = options.thinking;
  // vLLM: the request's tools in a system message of their own, first.
  json messages = json::array();
  if (options.tools != nullptr && options.tools->is_array() && !options.tools->empty())
    messages.push_back({{"role", "system"}, {"tools", *options.tools}});
  for (const json& m : given)
    messages.push_back(m);
  // Earlier reasoning is dropped when a user turn ends the conversation (thinking mode only):
  // assistants before the last user turn lose their reasoning_content.
  const bool drop_thinking = !messages.empty() && Role(messages.back()) == "user";
  int64_t last_user = LastUserIndex(messages);
  if (thinking && drop_thinking) {
    for (int64_t i = 0; i < last_user; ++i) {
      const std::string role = Role(messages[i]);
      if (role == "assistant") {
        messages[i].erase("reasoning_content");
      } else if (role != "user" && role != "system" && role != "tool") {
        // The encoding drops such a message and then indexes past its list's end.
        return Status::Errorf(
            "messages[{}]: a \"{}\" message before the last user message cannot be encoded in "
            "thinking mode (DeepSeek-V3.2's encoding fails on it)",
            i, role);
      }
    }
  }
  std::string out(bos);
  for (size_t i = 0; i < messages.size(); ++i) {
    const json& m = messages[i];
    const std::string role = Role(m);
    const int64_t index = static_cast<int64_t>(i);
    const json* tools = m.contains("tools") && !m["tools"].is_null() ? &m["tools"] : nullptr;
    if (role == "system") {
      out += TextOrEmpty(m, "content");
      SY_ASSIGN_OR_RETURN(std::string extras, SystemExtras(m, tools, i));
      out += extras;
    } else if (role == "developer") {
      if (!Truthy(m, "content"))
        return Status::Errorf("messages[{}] (developer): \"content\" must not be empty", i);
      SY_ASSIGN_OR_RETURN(std::string extras, SystemExtras(m, tools, i));
      SY_ASSIGN_OR_RETURN(std::string content, Text(m, "content", i));
      out += std::string(kUser) + extras + "\n\n# The user's message is: " + content +
             std::string(kAssistant);
      out += index == last_user && thinking ? kThinkStart : kThinkEnd;
    } else if (role == "user") {
      SY_ASSIGN_OR_RETURN(std::string content, Text(m, "content", i));
      out += std::string(kUser) + content + std::string(kAssistant);
      out += index == last_user && thinking ? kThinkStart : kThinkEnd;
    } else if (role == "tool") {
      int64_t assistant = index - 1;
      while (assistant >= 0 && Role(messages[assistant]) == "tool")
        --assistant;
      if (assistant < 0 || Role(messages[assistant]) != "assistant")
        return Status::Errorf("messages[{}] (tool): no assistant message with tool calls before it",
                              i);
      const json& calls = messages[assistant].value("tool_calls", json());
      const int64_t order = index - assistant;
      if (!calls.is_array() || static_cast<int64_t>(calls.size()) < order)
        return Status::Errorf(
            "messages[{}] (tool): more tool results than messages[{}] made tool calls", i,
            assistant);
      if (order == 1) out += "\n\n<function_results>";
      SY_ASSIGN_OR_RETURN(std::string content, Text(m, "content", i));
      out += "\n<result>" + content + "</result>";
      if (order == static_cast<int64_t>(calls.size())) {
        out += "\n</function_results>\n\n";
        out += index >= last_user && thinking ? kThinkStart : kThinkEnd;
      }
    } else if (role == "assistant") {
      std::string calls;
      if (Truthy(m, "tool_calls")) {
        if (!m["tool_calls"].is_array())
          return Status::Errorf("messages[{}] (assistant): \"tool_calls\" must be a list", i);
        SY_ASSIGN_OR_RETURN(calls, ToolCallsDsml(m["tool_calls"], i));
      }
      if (thinking && index > last_user) {
        if (!Truthy(m, "reasoning_content") && !Truthy(m, "tool_calls"))
          return Status::Errorf(
              "messages[{}] (assistant): in thinking mode an assistant message after the last "
              "user message needs reasoning_content or tool_calls",
              i);
        out += TextOrEmpty(m, "reasoning_content");
        out += kThinkEnd;
      }
      out += TextOrEmpty(m, "content") + calls + std::string(eos);
    } else {
      return Status::Errorf("messages[{}]: unknown role \"{}\"", i, role);
    }
  }
  return out;
}

}  // namespace sy
