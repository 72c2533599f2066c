#include "serve/messages_api.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <optional>
#include <set>
#include <utility>
#include <vector>

namespace sy::serve {
namespace {

using json = nlohmann::ordered_json;

// The shared body readers (openai_api.h), by short names.
constexpr auto& Invalid = InvalidField;
constexpr auto& Get = NonNullField;

// Top-level fields. Those that change nothing here are accepted (metadata, cache_control:
// prefix caching is automatic; service_tier); those that would change the output and are not
// implemented are refused with the reason.
std::optional<ApiError> RefuseUnsupported(const json& body, bool count_tokens) {
  static const char* const kKnown[] = {
      "model",         "messages",      "system",        "max_tokens",  "stop_sequences",
      "temperature",   "top_p",         "top_k",         "stream",      "tools",
      "tool_choice",   "thinking",      "output_config", "metadata",    "service_tier",
      "cache_control", "inference_geo", "speed",         "diagnostics", "user_profile_id",
      "workspace_id",  "thread"};
  for (const auto& [key, value] : body.items()) {
    bool known = false;
    for (const char* k : kKnown)
      known = known || key == k;
    if (!known) {
      if (key == "container" || key == "mcp_servers")
        return Invalid(key, "server-side tools are not run by this server");
      return Invalid(key, "is not supported by this server's Messages API");
    }
  }
  if (Get(body, "diagnostics"))
    return Invalid("diagnostics", "is not supported (no prompt-cache diagnostics are kept)");
  for (const char* key : {"user_profile_id", "workspace_id", "inference_geo"})
    if (const json* v = Get(body, key); v && !v->is_string())
      return Invalid(key, "must be a string");
  if (count_tokens)
    for (const char* key : {"max_tokens", "stop_sequences", "temperature", "top_p", "top_k",
                            "stream", "metadata", "service_tier", "thread"})
      if (Get(body, key)) return Invalid(key, "is not a count_tokens field");
  if (const json* tier = Get(body, "service_tier");
      tier && *tier != "auto" && *tier != "standard_only")
    return Invalid("service_tier", "must be \"auto\" or \"standard_only\"");
  if (const json* speed = Get(body, "speed"); speed && *speed != "standard")
    return Invalid("speed", "only \"standard\" is supported");
  if (const json* metadata = Get(body, "metadata")) {
    if (!metadata->is_object()) return Invalid("metadata", "must be an object");
    if (auto bad = UnknownField(*metadata, "metadata.", {"user_id"}, "is not a metadata field"))
      return bad;
  }
  return std::nullopt;
}

// A text block's text: {"type": "text", "text": ...} (cache_control and citations change
// nothing here).
std::optional<ApiError> TextOfBlock(const json& block, const std::string& where,
                                    std::string* text) {
  if (auto bad = UnknownField(block, where + ".", {"type", "text", "cache_control", "citations"},
                              "is not a text block field"))
    return bad;
  const json* t = Get(block, "text");
  if (!t || !t->is_string()) return Invalid(where + ".text", "must be a string");
  *text = t->get<std::string>();
  return std::nullopt;
}

std::string BlockType(const json& block) {
  return block.is_object() && block.contains("type") && block["type"].is_string()
             ? block["type"].get<std::string>()
             : "";
}

// A refusal for a block type this server cannot read, naming it.
ApiError UnsupportedBlock(const std::string& where, const std::string& type, const char* allowed) {
  if (type == "image" || type == "document" || type == "search_result")
    return Invalid(where + ".type",
                   fmt::format("'{}' blocks are not supported: this model reads text only", type));
  if (type.empty()) return Invalid(where, "must be an object with a string \"type\"");
  return Invalid(where + ".type",
                 fmt::format("'{}' blocks are not supported here (only {})", type, allowed));
}

// Text blocks joined by newlines, as vLLM joins a message's text parts for templates that take
// a string (the DeepSeek ones).
std::optional<ApiError> JoinedText(const json& content, const std::string& where,
                                   std::string* text) {
  if (content.is_string()) {
    *text = content.get<std::string>();
    return std::nullopt;
  }
  if (!content.is_array()) return Invalid(where, "must be a string or a list of text blocks");
  std::vector<std::string> texts;
  for (size_t i = 0; i < content.size(); ++i) {
    const std::string at = fmt::format("{}[{}]", where, i);
    if (BlockType(content[i]) != "text") return UnsupportedBlock(at, BlockType(content[i]), "text");
    std::string t;
    if (auto error = TextOfBlock(content[i], at, &t)) return error;
    texts.push_back(std::move(t));
  }
  *text = fmt::format("{}", fmt::join(texts, "\n"));
  return std::nullopt;
}

// A user turn's blocks: each tool_result a tool message (in order), the text blocks one user
// message after them.
std::optional<ApiError> AddUserTurn(const json& content, const std::string& where, json* messages) {
  if (content.is_string()) {
    messages->push_back({{"role", "user"}, {"content", content}});
    return std::nullopt;
  }
  if (!content.is_array() || content.empty())
    return Invalid(where, "must be a string or a non-empty list of content blocks");
  std::vector<std::string> texts;
  for (size_t i = 0; i < content.size(); ++i) {
    const json& block = content[i];
    const std::string at = fmt::format("{}[{}]", where, i);
    const std::string type = BlockType(block);
    if (type == "text") {
      std::string t;
      if (auto error = TextOfBlock(block, at, &t)) return error;
      texts.push_back(std::move(t));
    } else if (type == "tool_result") {
      if (auto bad = UnknownField(block, at + ".",
                                  {"type", "tool_use_id", "content", "is_error", "cache_control"},
                                  "is not a tool_result field"))
        return bad;
      const json* id = Get(block, "tool_use_id");
      if (!id || !id->is_string()) return Invalid(at + ".tool_use_id", "must be a string");
      const json* is_error = Get(block, "is_error");
      if (is_error && !is_error->is_boolean())
        return Invalid(at + ".is_error", "must be a boolean");
      std::string result;
      if (const json* c = Get(block, "content"))
        if (auto error = JoinedText(*c, at + ".content", &result)) return error;
      messages->push_back({{"role", "tool"}, {"tool_call_id", *id}, {"content", result}});
    } else {
      return UnsupportedBlock(at, type, "text and tool_result");
    }
  }
  if (!texts.empty())
    messages->push_back({{"role", "user"}, {"content", fmt::format("{}", fmt::join(texts, "\n"))}});
  return std::nullopt;
}

// An assistant turn's blocks: text its content, each tool_use a tool call (its input as the
// arguments' JSON text). Thinking blocks are dropped: the chat templates keep no earlier turn's
// reasoning.
std::optional<ApiError> AddAssistantTurn(const json& content, const std::string& where,
                                         json* messages) {
  if (content.is_string()) {
    messages->push_back({{"role", "assistant"}, {"content", content}});
    return std::nullopt;
  }
  if (!content.is_array()) return Invalid(where, "must be a string or a list of content blocks");
  std::vector<std::string> texts;
  json calls = json::array();
  for (size_t i = 0; i < content.size(); ++i) {
    const json& block = content[i];
    const std::string at = fmt::format("{}[{}]", where, i);
    const std::string type = BlockType(block);
    if (type == "text") {
      std::string t;
      if (auto error = TextOfBlock(block, at, &t)) return error;
      texts.push_back(std::move(t));
    } else if (type == "tool_use") {
      for (const char* key : {"id", "name"})
        if (!block.contains(key) || !block[key].is_string())
          return Invalid(at + "." + key, "must be a string");
      const json* input = Get(block, "input");
      if (!input || !input->is_object()) return Invalid(at + ".input", "must be an object");
      calls.push_back({{"id", block["id"]},
                       {"type", "function"},
                       {"function", {{"name", block["name"]}, {"arguments", DumpJson(*input)}}}});
    } else if (type != "thinking" && type != "redacted_thinking") {
      return UnsupportedBlock(at, type, "text, tool_use and thinking");
    }
  }
  json message = {{"role", "assistant"}};
  message["content"] =
      texts.empty() && !calls.empty() ? json() : json(fmt::format("{}", fmt::join(texts, "\n")));
  if (!calls.empty()) message["tool_calls"] = std::move(calls);
  messages->push_back(std::move(message));
  return std::nullopt;
}

// system, then messages, as chat messages; *prefill: the last is the assistant's, to continue.
std::optional<ApiError> ChatMessages(const json& body, json* messages, bool* prefill) {
  if (const json* system = Get(body, "system")) {
    // Blocks joined as they come, as vLLM joins them.
    std::string text;
    if (system->is_string()) {
      text = system->get<std::string>();
    } else if (system->is_array()) {
      for (size_t i = 0; i < system->size(); ++i) {
        const std::string at = fmt::format("system[{}]", i);
        if (BlockType((*system)[i]) != "text")
          return UnsupportedBlock(at, BlockType((*system)[i]), "text");
        std::string t;
        if (auto error = TextOfBlock((*system)[i], at, &t)) return error;
        text += t;
      }
    } else {
      return Invalid("system", "must be a string or a list of text blocks");
    }
    messages->push_back({{"role", "system"}, {"content", text}});
  }
  const json* list = Get(body, "messages");
  if (!list || !list->is_array() || list->empty())
    return Invalid("messages", "must be a non-empty list");
  for (size_t i = 0; i < list->size(); ++i) {
    const json& m = (*list)[i];
    const std::string where = fmt::format("messages[{}]", i);
    if (!m.is_object()) return Invalid(where, "must be an object");
    if (auto bad = UnknownField(m, where + ".", {"role", "content"},
                                "is not a message field (role, content)"))
      return bad;
    const json* role = Get(m, "role");
    const json* content = Get(m, "content");
    if (!content) return Invalid(where + ".content", "is required");
    if (role && *role == "user") {
      if (auto error = AddUserTurn(*content, where + ".content", messages)) return error;
    } else if (role && *role == "assistant") {
      if (auto error = AddAssistantTurn(*content, where + ".content", messages)) return error;
      // A final assistant message is a prefill: the answer continues its text.
      *prefill = i + 1 == list->size();
      if (*prefill && messages->back().contains("tool_calls"))
        return Invalid(where + ".content",
                       "a final assistant message (a prefill) may hold only text to continue");
    } else if (role && *role == "system") {
      // Not in Anthropic's schema, but some clients send system reminders inline; the DeepSeek
      // templates gather every system message into the system prompt.
      std::string text;
      if (auto error = JoinedText(*content, where + ".content", &text)) return error;
      messages->push_back({{"role", "system"}, {"content", text}});
    } else {
      return Invalid(where + ".role", "must be \"user\" or \"assistant\"");
    }
  }
  return std::nullopt;
}

// tools (client tools: name, description, input_schema) and tool_choice as the chat path's.
std::optional<ApiError> Tools(const json& body, json* chat) {
  if (const json* tools = Get(body, "tools")) {
    if (!tools->is_array()) return Invalid("tools", "must be a list of tools");
    json list = json::array();
    for (size_t i = 0; i < tools->size(); ++i) {
      const json& tool = (*tools)[i];
      const std::string where = fmt::format("tools[{}]", i);
      if (!tool.is_object()) return Invalid(where, "must be an object");
      if (const json* type = Get(tool, "type"); type && *type != "custom")
        return Invalid(where + ".type",
                       fmt::format("{} is a server tool, and this server runs none (only client "
                                   "tools: name, description, input_schema)",
                                   type->dump()));
      json function = json::object();
      for (const auto& [key, value] : tool.items()) {
        if (key == "type" || key == "cache_control") continue;
        if (key == "name" || key == "description" || key == "strict") {
          function[key] = value;
        } else if (key == "input_schema") {
          function["parameters"] = value;
        } else {
          return Invalid(where + "." + key, "is not a tool field");
        }
      }
      if (!function.contains("parameters")) return Invalid(where + ".input_schema", "is required");
      list.push_back({{"type", "function"}, {"function", std::move(function)}});
    }
    if (!list.empty()) (*chat)["tools"] = std::move(list);
  }
  if (const json* choice = Get(body, "tool_choice")) {
    if (!choice->is_object() || !choice->contains("type") || !(*choice)["type"].is_string())
      return Invalid("tool_choice", "must be an object with a string \"type\"");
    if (auto bad =
            UnknownField(*choice, "tool_choice.", {"type", "name", "disable_parallel_tool_use"},
                         "is not a tool_choice field"))
      return bad;
    const std::string type = (*choice)["type"].get<std::string>();
    if (type == "auto") {
      (*chat)["tool_choice"] = "auto";
    } else if (type == "any") {
      (*chat)["tool_choice"] = "required";
    } else if (type == "none") {
      (*chat)["tool_choice"] = "none";
    } else if (type == "tool") {
      const json* name = Get(*choice, "name");
      if (!name || !name->is_string()) return Invalid("tool_choice.name", "must be a string");
      (*chat)["tool_choice"] = {{"type", "function"}, {"function", {{"name", *name}}}};
    } else {
      return Invalid("tool_choice.type", "must be \"auto\", \"any\", \"tool\" or \"none\"");
    }
    if (const json* one = Get(*choice, "disable_parallel_tool_use")) {
      if (!one->is_boolean())
        return Invalid("tool_choice.disable_parallel_tool_use", "must be a boolean");
      (*chat)["parallel_tool_calls"] = !one->get<bool>();
    }
  }
  return std::nullopt;
}

// thinking: V3.1's template switch (enabled: think; disabled: answer directly; adaptive: the
// template's default). The other templates decide themselves (R1 always thinks). budget_tokens
// is checked as Anthropic checks it and enforced as the reasoning budget (thinking_token_budget:
// "</think>" comes at the latest after that many thinking tokens); max_tokens bounds the whole
// output, thinking included.
std::optional<ApiError> Thinking(const json& body, int64_t max_tokens, json* chat) {
  const json* thinking = Get(body, "thinking");
  if (!thinking) return std::nullopt;
  if (!thinking->is_object() || !thinking->contains("type") || !(*thinking)["type"].is_string())
    return Invalid("thinking", "must be an object with a string \"type\"");
  const std::string type = (*thinking)["type"].get<std::string>();
  if (auto bad = UnknownField(*thinking, "thinking.", {"type", "budget_tokens", "display"},
                              "is not a thinking field"))
    return bad;
  if (const json* display = Get(*thinking, "display"); display && *display != "summarized")
    return Invalid("thinking.display",
                   "only \"summarized\" (the thinking as written) is supported");
  if (type == "enabled") {
    const json* budget = Get(*thinking, "budget_tokens");
    if (!budget || !budget->is_number_integer() || *budget < 1024)
      return Invalid("thinking.budget_tokens", "must be an integer of at least 1024");
    if (max_tokens > 0 && budget->get<int64_t>() >= max_tokens)
      return Invalid("thinking.budget_tokens", "must be less than max_tokens");
    (*chat)["chat_template_kwargs"] = {{"thinking", true}};
    (*chat)["thinking_token_budget"] = *budget;
  } else if (type == "disabled") {
    (*chat)["chat_template_kwargs"] = {{"thinking", false}};
  } else if (type != "adaptive") {
    return Invalid("thinking.type", "must be \"enabled\", \"disabled\" or \"adaptive\"");
  }
  return std::nullopt;
}

// output_config.format (a JSON schema) as the chat path's response_format, output_config.effort
// as its reasoning_effort.
std::optional<ApiError> OutputConfig(const json& body, json* chat) {
  const json* config = Get(body, "output_config");
  if (!config) return std::nullopt;
  if (!config->is_object()) return Invalid("output_config", "must be an object");
  for (const auto& [key, value] : config->items()) {
    if (value.is_null() || key == "format") continue;
    if (key == "effort") {  // the chat path's reasoning_effort: a thinking budget
      (*chat)["reasoning_effort"] = value;
      continue;
    }
    return Invalid("output_config." + key, "is not an output_config field");
  }
  const json* format = Get(*config, "format");
  if (!format) return std::nullopt;
  if (!format->is_object() || format->value("type", json()) != "json_schema")
    return Invalid("output_config.format",
                   "must be {\"type\": \"json_schema\", \"schema\": {...}}");
  if (auto bad = UnknownField(*format, "output_config.format.", {"type", "schema"},
                              "is not a format field"))
    return bad;
  const json* schema = Get(*format, "schema");
  if (!schema || !schema->is_object())
    return Invalid("output_config.format.schema", "must be an object");
  (*chat)["response_format"] = {{"type", "json_schema"},
                                {"json_schema", {{"name", "output"}, {"schema", *schema}}}};
  return std::nullopt;
}

// An error the chat path reports about a field this request named differently.
ApiError Renamed(ApiError error) {
  return RenameFields(std::move(error),
                      {{"stop", "stop_sequences"},
                       {"response_format", "output_config.format"},
                       {"chat_template_kwargs", "thinking"},
                       {"reasoning_effort", "output_config.effort"}},
                      {{"].function.parameters", "].input_schema"}, {"].function", "]"}});
}

// The chat request a Messages body amounts to; `count_tokens`: max_tokens is not needed (one
// token is planned, so a prompt that fills the context still counts).
ParsedRequest PlanChat(const json& root, const TextCodec& codec, const ServingLimits& limits,
                       bool count_tokens) {
  ParsedRequest out;
  if (!root.is_object()) {
    out.error = {400, "the body must be a JSON object", "", "invalid_value"};
    return out;
  }
  json chat = json::object();
  json messages = json::array();
  std::optional<ApiError> error = RefuseUnsupported(root, count_tokens);
  const json* max_tokens = Get(root, "max_tokens");
  if (!error && !count_tokens) {
    if (!max_tokens) {
      error = Invalid("max_tokens", "is required");
    } else if (!max_tokens->is_number_integer() || *max_tokens < 1) {
      error = Invalid("max_tokens", "must be a positive integer");
    }
  }
  if (!error && !Get(root, "model")) error = Invalid("model", "is required");
  bool prefill = false;
  if (!error) error = ChatMessages(root, &messages, &prefill);
  if (!error) error = Tools(root, &chat);
  if (!error)
    error = Thinking(root,
                     max_tokens && max_tokens->is_number_integer() ? max_tokens->get<int64_t>() : 0,
                     &chat);
  if (!error) error = OutputConfig(root, &chat);
  if (error) {
    out.error = *error;
    return out;
  }
  chat["messages"] = std::move(messages);
  if (prefill) {
    chat["continue_final_message"] = true;
    chat["add_generation_prompt"] = false;
  }
  for (const char* key : {"model", "temperature", "top_p", "top_k", "stream"})
    if (const json* v = Get(root, key)) chat[key] = *v;
  chat["max_tokens"] = count_tokens ? json(1) : *max_tokens;
  if (const json* stop = Get(root, "stop_sequences")) {
    if (!stop->is_array()) {
      out.error = Invalid("stop_sequences", "must be a list of strings");
      return out;
    }
    chat["stop"] = *stop;
  }
  out = PlanGenerationRequest(Endpoint::kChat, chat, codec, limits);
  if (!out.plan) out.error = Renamed(out.error);
  return out;
}

json ParseOrError(const std::string& body, ApiError* error) {
  json root = json::parse(body, nullptr, false);
  if (root.is_discarded()) *error = {400, "the body is not valid JSON", "", "invalid_value"};
  return root;
}

// Where the output stopped, in Anthropic's words.
struct StopReason {
  const char* reason;
  json sequence;
};
StopReason StopOf(const ChoiceResult& r, bool called) {
  if (r.finish_reason == "length") return {"max_tokens", nullptr};
  if (called) return {"tool_use", nullptr};
  if (r.stop_string) return {"stop_sequence", *r.stop_string};
  return {"end_turn", nullptr};
}

// Anthropic counts input as input_tokens + cache_read_input_tokens (+ cache creation, which
// this server does not charge for).
json Usage(const ChoiceResult& r) {
  return {{"input_tokens", r.prompt_tokens - r.cached_tokens},
          {"cache_creation_input_tokens", 0},
          {"cache_read_input_tokens", r.cached_tokens},
          {"output_tokens", static_cast<int64_t>(r.tokens.size())}};
}

// A thinking block's signature: Anthropic's verifies that a client sends the thinking back
// unchanged. This server drops earlier turns' thinking (the templates do), so it only names
// where the block came from.
std::string Signature(const std::string& message_id, int index) {
  return fmt::format("{}/{}", message_id, index);
}

// A tool_use block's input: the arguments' JSON object; a call the budget cut short (not JSON
// yet) has an empty one, and the message's stop_reason says max_tokens.
json ToolInput(const std::string& arguments) {
  json input = json::parse(arguments, nullptr, false);
  return input.is_object() ? input : json::object();
}

// thread: {"type": "create"} keeps this conversation; {"type": "continue",
// "previous_message_id"} puts the stored thread's messages and reply before this request's, and
// takes its system and tools. `root` becomes the whole request.
std::optional<ApiError> ResolveThread(json& root, ResponsesStore* store, MessagesPlan& plan) {
  const json& thread = root["thread"];
  if (!store)
    return ApiError{400,
                    "thread: this server keeps no conversation state (--responses-store-mb 0): "
                    "send the whole conversation without thread",
                    "thread", "thread_unsupported_request"};
  const json type = thread.is_object() ? thread.value("type", json()) : json();
  if (type == "create") {
    if (auto bad = UnknownField(thread, "thread.", {"type"}, "is not a create field")) return bad;
  } else if (type == "continue") {
    if (auto bad = UnknownField(thread, "thread.", {"type", "previous_message_id"},
                                "is not a continue field"))
      return bad;
    const json* id = Get(thread, "previous_message_id");
    if (!id || !id->is_string()) return Invalid("thread.previous_message_id", "must be a string");
    plan.continues = id->get<std::string>();
    auto stored = store->Get(plan.continues);
    if (!stored || !stored->context.is_object() || !stored->context.contains("messages"))
      return ApiError{404,
                      fmt::format("thread.previous_message_id: no stored thread reply '{}' (never "
                                  "stored, or evicted): replay the conversation with thread "
                                  "{{\"type\": \"create\"}}",
                                  plan.continues),
                      "thread.previous_message_id", "thread_not_found"};
    // system and tools are the thread's: a request may repeat them, not change them.
    std::vector<std::string> changed;
    for (const char* key : {"system", "tools"}) {
      const json* given = Get(root, key);
      const json kept = stored->context.value(key, json());
      if (given && *given != kept) changed.push_back(key);
      if (kept.is_null()) {
        root.erase(key);
      } else {
        root[key] = kept;
      }
    }
    if (!changed.empty())
      return ApiError{400,
                      fmt::format("{}: differ from the thread's (a thread keeps those it was "
                                  "created with): send them unchanged or leave them out, or "
                                  "replay the conversation with thread {{\"type\": \"create\"}}",
                                  fmt::join(changed, ", ")),
                      changed[0], "thread_fingerprint_mismatch"};
    const json* given = Get(root, "messages");
    if (given && !given->is_array()) return Invalid("messages", "must be a list");
    json messages = stored->context["messages"];
    messages.push_back(
        {{"role", "assistant"}, {"content", stored->response.value("content", json::array())}});
    if (given)
      for (const json& m : *given)
        messages.push_back(m);
    root["messages"] = std::move(messages);
  } else {
    return Invalid("thread",
                   "must be {\"type\": \"create\"} or {\"type\": \"continue\", "
                   "\"previous_message_id\": ...}");
  }
  root.erase("thread");
  plan.thread = true;
  plan.context = {{"system", root.value("system", json())},
                  {"tools", root.value("tools", json())},
                  {"messages", root.value("messages", json::array())}};
  return std::nullopt;
}

}  // namespace

StoredResponse MessageToStore(const MessagesPlan& plan, json message) {
  StoredResponse stored;
  stored.response = std::move(message);
  stored.context = plan.context;
  return stored;
}

ParsedMessagesRequest ParseMessagesRequest(const std::string& body, const TextCodec& codec,
                                           const ServingLimits& limits, ResponsesStore* store) {
  ParsedMessagesRequest out;
  try {
    json root = ParseOrError(body, &out.error);
    if (root.is_discarded()) return out;
    MessagesPlan plan;
    if (root.is_object() && Get(root, "thread")) {
      if (auto error = ResolveThread(root, store, plan)) {
        out.error = *error;
        return out;
      }
    }
    ParsedRequest chat = PlanChat(root, codec, limits, false);
    if (!chat.plan) {
      out.error = chat.error;
      return out;
    }
    plan.chat = std::move(*chat.plan);
    out.plan = std::move(plan);
  } catch (const json::exception& e) {  // a value of an unexpected type deep in the body
    out.error = {400, fmt::format("malformed request: {}", e.what()), "", "invalid_value"};
  }
  return out;
}

std::string CountTokensBody(const std::string& body, const TextCodec& codec,
                            const ServingLimits& limits, ApiError* error) {
  try {
    json root = ParseOrError(body, error);
    if (root.is_discarded()) return "";
    ParsedRequest parsed = PlanChat(root, codec, limits, true);
    if (!parsed.plan) {
      *error = parsed.error;
      return "";
    }
    return DumpJson({{"input_tokens", parsed.plan->prompts[0].size()}});
  } catch (const json::exception& e) {
    *error = {400, fmt::format("malformed request: {}", e.what()), "", "invalid_value"};
    return "";
  }
}

namespace {

// Anthropic's custom_id: 1 to 64 of [a-zA-Z0-9_-].
bool ValidCustomId(const std::string& id) {
  if (id.empty() || id.size() > 64) return false;
  return std::all_of(id.begin(), id.end(),
                     [](unsigned char c) { return std::isalnum(c) || c == '_' || c == '-'; });
}

}  // namespace

std::optional<std::string> MessageBatchRequestLines(const std::string& body, ApiError* error) {
  auto fail = [&](std::string message, std::string param) {
    *error = {400, std::move(message), std::move(param), ""};
    return std::nullopt;
  };
  const json request = json::parse(body, nullptr, false);
  if (!request.is_object()) return fail("the body must be a JSON object", "");
  for (const auto& [key, value] : request.items())
    if (key != "requests") return fail(fmt::format("{}: Extra inputs are not permitted", key), key);
  auto requests = request.find("requests");
  if (requests == request.end() || !requests->is_array() || requests->empty())
    return fail("requests: a non-empty list of requests is required", "requests");
  std::string lines;
  std::set<std::string> seen;
  for (size_t i = 0; i < requests->size(); ++i) {
    const json& entry = (*requests)[i];
    auto refuse = [&](const std::string& what) {
      return fail(fmt::format("requests.{}{}", i, what), "requests");
    };
    if (!entry.is_object()) return refuse(": each request must be an object");
    for (const auto& [key, value] : entry.items())
      if (key != "custom_id" && key != "params")
        return refuse(fmt::format(".{}: Extra inputs are not permitted", key));
    auto custom = entry.find("custom_id");
    if (custom == entry.end() || !custom->is_string() || !ValidCustomId(custom->get<std::string>()))
      return refuse(".custom_id: 1 to 64 characters of letters, digits, '_' and '-' are required");
    if (!seen.insert(custom->get<std::string>()).second)
      return refuse(
          fmt::format(".custom_id: \"{}\" is used by an earlier request; each "
                      "request's custom_id must be unique",
                      custom->get<std::string>()));
    auto params = entry.find("params");
    if (params == entry.end() || !params->is_object())
      return refuse(".params: an object (a Messages request) is required");
    lines += json{{"custom_id", *custom}, {"params", *params}}.dump(-1, ' ', false,
                                                                    json::error_handler_t::replace);
    lines += '\n';
  }
  return lines;
}

std::string MessagesErrorBody(const ApiError& error) {
  const char* type = "api_error";
  switch (error.status) {
    case 400:
      type = "invalid_request_error";
      break;
    case 401:
      type = "authentication_error";
      break;
    case 403:
      type = "permission_error";
      break;
    case 404:
      type = "not_found_error";
      break;
    case 405:
      type = "invalid_request_error";
      break;
    case 413:
      type = "request_too_large";
      break;
    case 429:
      type = "rate_limit_error";
      break;
    case 503:
    case 529:
      type = "overloaded_error";
      break;
    default:
      break;
  }
  json body = {{"type", "error"}, {"error", {{"type", type}, {"message", error.message}}}};
  if (error.code.starts_with("thread_")) {
    body["error"]["details"] = {{"error_code", error.code}};
    // Nothing the request named: this server keeps no threads at all.
    if (error.code == "thread_unsupported_request")
      body["error"]["details"]["unsupported"] = json::array();
  }
  return DumpJson(body);
}

json MessageObject(const GenerationPlan& plan, const ChoiceResult& result, const std::string& id,
                   const ServingLimits& limits) {
  chat_output::ChatMessage m;
  if (plan.parse_output) {
    m = FinishedChatChoice(plan, result).message;
  } else {
    m.content = result.text;
  }
  json content = json::array();
  if (m.reasoning)
    content.push_back({{"type", "thinking"},
                       {"thinking", *m.reasoning},
                       {"signature", Signature(id, static_cast<int>(content.size()))}});
  if (m.content && !m.content->empty()) content.push_back({{"type", "text"}, {"text", *m.content}});
  for (const auto& call : m.tool_calls)
    content.push_back({{"type", "tool_use"},
                       {"id", call.id},
                       {"name", call.name},
                       {"input", ToolInput(call.arguments)}});
  const StopReason stop = StopOf(result, !m.tool_calls.empty());
  return {{"id", id},
          {"type", "message"},
          {"role", "assistant"},
          {"model", limits.model_name},
          {"content", std::move(content)},
          {"stop_reason", stop.reason},
          {"stop_sequence", stop.sequence},
          {"usage", Usage(result)}};
}

MessagesStream::MessagesStream(const GenerationPlan& plan, std::string id,
                               const ServingLimits& limits)
    : id_(std::move(id)), model_(limits.model_name), output_(plan) {}

MessagesStream::~MessagesStream() = default;

namespace {
std::string Event(const char* type, json body) {
  json out = {{"type", type}};
  out.update(body);
  return fmt::format("event: {}\ndata: {}\n\n", type, DumpJson(out));
}
}  // namespace

std::string MessagesStream::Open(Kind kind, const std::string& id, const std::string& name) {
  std::string out = Close();
  json block;
  if (kind == Kind::kReasoning) block = {{"type", "thinking"}, {"thinking", ""}, {"signature", ""}};
  if (kind == Kind::kText) block = {{"type", "text"}, {"text", ""}};
  if (kind == Kind::kCall) {
    block = {{"type", "tool_use"}, {"id", id}, {"name", name}, {"input", json::object()}};
    called_ = true;
  }
  out += Event("content_block_start", {{"index", blocks_}, {"content_block", std::move(block)}});
  ++blocks_;
  open_ = kind;
  return out;
}

std::string MessagesStream::Append(const std::string& piece) {
  if (piece.empty()) return "";
  json delta;
  if (open_ == Kind::kReasoning) {
    delta = {{"type", "thinking_delta"}, {"thinking", piece}};
  } else if (open_ == Kind::kText) {
    delta = {{"type", "text_delta"}, {"text", piece}};
  } else {
    delta = {{"type", "input_json_delta"}, {"partial_json", piece}};
  }
  return Event("content_block_delta", {{"index", blocks_ - 1}, {"delta", std::move(delta)}});
}

std::string MessagesStream::Close() {
  if (open_ == Kind::kNone) return "";
  std::string out;
  const int index = blocks_ - 1;
  if (open_ == Kind::kReasoning)
    out += Event("content_block_delta",
                 {{"index", index},
                  {"delta", {{"type", "signature_delta"}, {"signature", Signature(id_, index)}}}});
  out += Event("content_block_stop", {{"index", index}});
  open_ = Kind::kNone;
  return out;
}

std::string MessagesStream::OnEvent(const RequestEvent& event, const ChoiceResult& so_far) {
  std::string out;
  if (!started_) {
    started_ = true;
    json usage = Usage(so_far);
    usage["output_tokens"] = 0;
    out += Event("message_start", {{"message",
                                    {{"id", id_},
                                     {"type", "message"},
                                     {"role", "assistant"},
                                     {"model", model_},
                                     {"content", json::array()},
                                     {"stop_reason", nullptr},
                                     {"stop_sequence", nullptr},
                                     {"usage", std::move(usage)}}}});
    out += Event("ping", json::object());
  }
  out += output_.Feed(
      event, open_,
      [this](Kind kind, const std::string& call_id, const std::string& name) {
        return Open(kind, call_id, name);
      },
      [this](const std::string& piece) { return Append(piece); });
  if (!event.finish_reason) return out;
  out += Close();
  const StopReason stop = StopOf(so_far, called_);
  out += Event("message_delta",
               {{"delta", {{"stop_reason", stop.reason}, {"stop_sequence", stop.sequence}}},
                {"usage", Usage(so_far)}});
  out += Event("message_stop", json::object());
  return out;
}

std::string MessagesStream::Failed(const std::string& message) {
  return Event("error", {{"error", {{"type", "api_error"}, {"message", message}}}});
}

}  // namespace sy::serve
