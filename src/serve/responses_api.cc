#include "serve/responses_api.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <utility>
#include <vector>

namespace sy::serve {
namespace {

using json = nlohmann::ordered_json;

// The shared body readers (openai_api.h), by short names.
constexpr auto& Invalid = InvalidField;
constexpr auto& Get = NonNullField;

// Fields that would change the output or need state this server does not keep: refused with the
// reason. (Identifiers that change nothing — user, safety_identifier, prompt_cache_key — are
// accepted.)
std::optional<ApiError> RefuseUnsupported(const json& body, bool stored) {
  static const char* const kKnown[] = {"model",
                                       "input",
                                       "instructions",
                                       "max_output_tokens",
                                       "temperature",
                                       "top_p",
                                       "text",
                                       "stream",
                                       "stream_options",
                                       "store",
                                       "previous_response_id",
                                       "conversation",
                                       "background",
                                       "metadata",
                                       "user",
                                       "safety_identifier",
                                       "prompt_cache_key",
                                       "parallel_tool_calls",
                                       "tool_choice",
                                       "tools",
                                       "truncation",
                                       "include",
                                       "top_logprobs",
                                       "reasoning",
                                       "service_tier",
                                       "priority"};
  for (const auto& [key, value] : body.items()) {
    bool known = false;
    for (const char* k : kKnown)
      known = known || key == k;
    if (!known) return Invalid(key, "is not supported by this server's Responses API");
  }
  if (!stored && Get(body, "previous_response_id"))
    return Invalid("previous_response_id",
                   "this server keeps no state (--responses-store-mb 0): send the whole "
                   "conversation as input");
  if (const json* store = Get(body, "store"); store && !store->is_boolean())
    return Invalid("store", "must be true or false");
  if (const json* store = Get(body, "store"); !stored && store && *store != false)
    return Invalid("store",
                   "this server keeps no state (--responses-store-mb 0): store must be false "
                   "(send the whole conversation as input)");
  if (const json* id = Get(body, "previous_response_id"); id && !id->is_string())
    return Invalid("previous_response_id", "must be a string");
  if (const json* conversation = Get(body, "conversation")) {
    if (!stored)
      return Invalid("conversation",
                     "this server keeps no state (--responses-store-mb 0): send the whole "
                     "conversation as input");
    if (Get(body, "previous_response_id"))
      return Invalid("conversation", "cannot be combined with previous_response_id");
    const bool id = conversation->is_string() ||
                    (conversation->is_object() && conversation->contains("id") &&
                     (*conversation)["id"].is_string() && conversation->size() == 1);
    if (!id) return Invalid("conversation", "must be a conversation id or {\"id\": ...}");
  }
  if (const json* b = Get(body, "background"); b && *b != false) {
    if (!b->is_boolean()) return Invalid("background", "must be true or false");
    if (!stored)
      return Invalid("background",
                     "background responses live in the store, and this server keeps none "
                     "(--responses-store-mb 0)");
    if (const json* s = Get(body, "store"); s && *s == false)
      return Invalid("store", "a background response is stored: store cannot be false");
  }
  if (const json* t = Get(body, "truncation"); t && *t != "disabled" && *t != "auto")
    return Invalid("truncation", "must be \"auto\" or \"disabled\"");
  if (const json* include = Get(body, "include")) {
    if (!include->is_array()) return Invalid("include", "must be a list of strings");
    for (const json& item : *include)
      if (item != "message.output_text.logprobs")
        return Invalid("include", fmt::format("{} is not supported (only "
                                              "\"message.output_text.logprobs\")",
                                              item.dump()));
  }
  // reasoning.effort is the chat path's reasoning_effort (a thinking budget). A summary is
  // accepted and none is written: the reasoning item carries the reasoning text itself.
  if (const json* reasoning = Get(body, "reasoning")) {
    if (!reasoning->is_object()) return Invalid("reasoning", "must be an object");
    for (const auto& [key, value] : reasoning->items()) {
      if (value.is_null() || key == "effort") continue;
      if (key == "summary" || key == "generate_summary") {
        if (value != "auto" && value != "concise" && value != "detailed")
          return Invalid("reasoning." + key, "must be \"auto\", \"concise\" or \"detailed\"");
        continue;
      }
      return Invalid("reasoning." + key, "is not a reasoning field");
    }
  }
  if (const json* options = Get(body, "stream_options")) {
    if (!options->is_object()) return Invalid("stream_options", "must be an object");
    for (const auto& [key, value] : options->items())
      if (key != "include_obfuscation")  // padding against side channels: never sent here
        return Invalid("stream_options." + key, "is not supported");
  }
  if (const json* metadata = Get(body, "metadata")) {
    if (!metadata->is_object()) return Invalid("metadata", "must be an object of strings");
    for (const auto& [key, value] : metadata->items())
      if (!value.is_string()) return Invalid("metadata." + key, "must be a string");
  }
  for (const char* key : {"user", "safety_identifier", "prompt_cache_key"})
    if (const json* v = Get(body, key); v && !v->is_string())
      return Invalid(key, "must be a string");
  return std::nullopt;
}

// One message's content: a string, or a list of text parts (input_text; output_text for what an
// assistant said before) joined by newlines, as the chat path joins them.
std::optional<ApiError> MessageText(const json& content, const std::string& where,
                                    std::string* text) {
  if (content.is_string()) {
    *text = content.get<std::string>();
    return std::nullopt;
  }
  if (!content.is_array()) return Invalid(where, "must be a string or a list of input_text parts");
  for (size_t i = 0; i < content.size(); ++i) {
    const json& part = content[i];
    const std::string at = fmt::format("{}[{}]", where, i);
    if (!part.is_object() || !part.contains("type") || !part["type"].is_string())
      return Invalid(at, "must be an object with a string \"type\"");
    const std::string type = part["type"].get<std::string>();
    if (type != "input_text" && type != "output_text")
      return Invalid(at + ".type",
                     fmt::format("'{}' is not supported (only input_text and output_text)", type));
    auto t = part.find("text");
    if (t == part.end() || !t->is_string()) return Invalid(at + ".text", "must be a string");
    if (i > 0) *text += '\n';
    *text += t->get<std::string>();
  }
  return std::nullopt;
}

// One input item (a message, an earlier function call or its output, reasoning) appended to the
// chat messages; `where` names it in errors.
std::optional<ApiError> AddInputItem(const json& item, const std::string& where, json* messages) {
  if (!item.is_object()) return Invalid(where, "must be an object");
  const std::string type = item.contains("type") && item["type"].is_string()
                               ? item["type"].get<std::string>()
                               : "message";
  if (item.contains("type") && !item["type"].is_string())
    return Invalid(where + ".type", "must be a string");
  if (type == "reasoning") return std::nullopt;  // the chat templates drop earlier turns' reasoning
  if (type == "function_call") {
    // An earlier call: a tool call of the assistant message it follows, or of a new one.
    for (const char* key : {"call_id", "name", "arguments"})
      if (!item.contains(key) || !item[key].is_string())
        return Invalid(where + "." + key, "must be a string");
    const json call = {{"id", item["call_id"]},
                       {"type", "function"},
                       {"function", {{"name", item["name"]}, {"arguments", item["arguments"]}}}};
    if (messages->empty() || messages->back()["role"] != "assistant")
      messages->push_back({{"role", "assistant"}, {"tool_calls", json::array()}});
    json& last = messages->back();
    if (!last.contains("tool_calls")) last["tool_calls"] = json::array();
    last["tool_calls"].push_back(call);
    return std::nullopt;
  }
  if (type == "function_call_output") {
    if (!item.contains("call_id") || !item["call_id"].is_string())
      return Invalid(where + ".call_id", "must be a string");
    auto output = item.find("output");
    if (output == item.end()) return Invalid(where + ".output", "is required");
    std::string text;
    if (auto error = MessageText(*output, where + ".output", &text)) return error;
    messages->push_back({{"role", "tool"}, {"tool_call_id", item["call_id"]}, {"content", text}});
    return std::nullopt;
  }
  if (type != "message")
    return Invalid(where + ".type", fmt::format("'{}' input items are not supported", type));
  auto role = item.find("role");
  if (role == item.end() || !role->is_string())
    return Invalid(where + ".role", "must be one of user, system, developer, assistant");
  const std::string r = role->get<std::string>();
  if (r != "user" && r != "system" && r != "developer" && r != "assistant")
    return Invalid(where + ".role",
                   fmt::format("unknown role '{}' (user, system, developer, assistant)", r));
  auto content = item.find("content");
  if (content == item.end()) return Invalid(where + ".content", "is required");
  std::string text;
  if (auto error = MessageText(*content, where + ".content", &text)) return error;
  messages->push_back({{"role", r == "developer" ? "system" : r}, {"content", text}});
  return std::nullopt;
}

// instructions, then `prior` (a stored conversation's items: previous_response_id), then input,
// as chat messages.
std::optional<ApiError> Messages(const json& body, const json& prior, json* messages) {
  if (const json* instructions = Get(body, "instructions")) {
    if (!instructions->is_string()) return Invalid("instructions", "must be a string");
    messages->push_back({{"role", "system"}, {"content", *instructions}});
  }
  for (size_t i = 0; i < prior.size(); ++i)
    if (auto error =
            AddInputItem(prior[i], fmt::format("previous_response_id's item {}", i), messages))
      return error;
  const json* input = Get(body, "input");
  if (!input) return Invalid("input", "is required");
  if (input->is_string()) {
    messages->push_back({{"role", "user"}, {"content", *input}});
    return std::nullopt;
  }
  if (!input->is_array() || input->empty())
    return Invalid("input", "must be a string or a non-empty list of input items");
  for (size_t i = 0; i < input->size(); ++i)
    if (auto error = AddInputItem((*input)[i], fmt::format("input[{}]", i), messages)) return error;
  if (messages->empty()) return Invalid("input", "holds no message");
  return std::nullopt;
}

// truncation "auto" (OpenAI's): a conversation too long for the context loses its earliest turns
// — each a user message and what followed it, so a call and its output go together — after the
// leading system messages (the instructions) until it fits; the turn of this input stays. The
// fewest turns are dropped (a binary search: fewer turns, shorter prompt). `failed` is the
// untruncated attempt, answered when even the last turn alone does not fit.
ParsedRequest PlanTruncated(const json& chat, const TextCodec& codec, const ServingLimits& limits,
                            const ParsedRequest& failed) {
  const json& messages = chat["messages"];
  size_t system = 0;
  while (system < messages.size() && messages[system].value("role", "") == "system")
    ++system;
  std::vector<size_t> turns;  // where each turn starts
  for (size_t i = system; i < messages.size(); ++i)
    if (messages[i].value("role", "") == "user" || i == system) turns.push_back(i);
  auto without = [&](size_t dropped) {  // the first `dropped` turns left out
    json shorter = chat;
    json kept = json::array();
    const size_t from = dropped < turns.size() ? turns[dropped] : messages.size();
    for (size_t i = 0; i < messages.size(); ++i)
      if (i < system || i >= from) kept.push_back(messages[i]);
    shorter["messages"] = std::move(kept);
    return PlanGenerationRequest(Endpoint::kChat, shorter, codec, limits);
  };
  if (turns.size() < 2) return failed;
  size_t low = 1, high = turns.size() - 1;  // dropping `high` turns is the last resort
  ParsedRequest best = without(high);
  if (!best.plan) return best.error.code == kContextLengthExceeded ? failed : best;
  while (low < high) {
    const size_t mid = (low + high) / 2;
    ParsedRequest attempt = without(mid);
    if (attempt.plan) {
      high = mid;
      best = std::move(attempt);
    } else {
      low = mid + 1;
    }
  }
  return best;
}

// text.format as the chat path's response_format; *format is the normalized value echoed back.
std::optional<ApiError> TextFormat(const json& body, json* chat, json* format) {
  *format = {{"type", "text"}};
  const json* text = Get(body, "text");
  if (!text) return std::nullopt;
  if (!text->is_object()) return Invalid("text", "must be an object");
  for (const auto& [key, value] : text->items()) {
    if (key == "format" || value.is_null()) continue;
    if (key == "verbosity" && value == "medium") continue;  // the default: the model decides
    return Invalid("text." + key, "is not supported");
  }
  const json* f = Get(*text, "format");
  if (!f) return std::nullopt;
  if (!f->is_object() || !f->contains("type") || !(*f)["type"].is_string())
    return Invalid("text.format", "must be an object with a string \"type\"");
  const std::string type = (*f)["type"].get<std::string>();
  if (type == "text") return std::nullopt;
  if (type == "json_object") {
    (*chat)["response_format"] = {{"type", "json_object"}};
    *format = {{"type", "json_object"}};
    return std::nullopt;
  }
  if (type != "json_schema")
    return Invalid("text.format.type", "must be \"text\", \"json_object\" or \"json_schema\"");
  for (const auto& [key, value] : f->items())
    if (key != "type" && key != "name" && key != "schema" && key != "strict" &&
        key != "description")
      return Invalid("text.format." + key, "is not a json_schema format field");
  const json* name = Get(*f, "name");
  if (!name || !name->is_string()) return Invalid("text.format.name", "must be a string");
  const json* schema = Get(*f, "schema");
  if (!schema || !schema->is_object()) return Invalid("text.format.schema", "must be an object");
  const json* strict = Get(*f, "strict");
  if (strict && !strict->is_boolean()) return Invalid("text.format.strict", "must be a boolean");
  // Enforced whatever strict says: a grammar's mask is exact either way.
  (*chat)["response_format"] = {{"type", "json_schema"},
                                {"json_schema", {{"name", *name}, {"schema", *schema}}}};
  *format = *f;
  if (!strict) (*format)["strict"] = false;
  return std::nullopt;
}

// tools (function tools, flat: {"type": "function", "name", "parameters", ...}) and tool_choice
// as the chat path's ({"type": "function", "function": {...}}).
std::optional<ApiError> Tools(const json& body, json* chat) {
  if (const json* tools = Get(body, "tools")) {
    if (!tools->is_array()) return Invalid("tools", "must be a list of function tools");
    json list = json::array();
    for (size_t i = 0; i < tools->size(); ++i) {
      const json& tool = (*tools)[i];
      const std::string where = fmt::format("tools[{}]", i);
      if (!tool.is_object() || !tool.contains("type") || !tool["type"].is_string())
        return Invalid(where, "must be an object with a string \"type\"");
      if (tool["type"] != "function")
        return Invalid(where + ".type",
                       fmt::format("'{}' tools are not supported (only function tools)",
                                   tool["type"].get<std::string>()));
      json function = json::object();
      for (const auto& [key, value] : tool.items()) {
        if (key == "type") continue;
        if (key != "name" && key != "description" && key != "parameters" && key != "strict")
          return Invalid(where + "." + key, "is not a function tool field");
        function[key] = value;
      }
      list.push_back({{"type", "function"}, {"function", std::move(function)}});
    }
    if (!list.empty()) (*chat)["tools"] = std::move(list);
  }
  if (const json* choice = Get(body, "tool_choice")) {
    if (choice->is_object()) {
      if (choice->value("type", json()) != "function" || !choice->contains("name") ||
          !(*choice)["name"].is_string())
        return Invalid("tool_choice",
                       "must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", "
                       "\"name\": ...}");
      (*chat)["tool_choice"] = {{"type", "function"}, {"function", {{"name", (*choice)["name"]}}}};
    } else {
      (*chat)["tool_choice"] = *choice;
    }
  }
  if (const json* parallel = Get(body, "parallel_tool_calls"))
    (*chat)["parallel_tool_calls"] = *parallel;
  return std::nullopt;
}

// An error the chat path reports about a field this request named differently (function tools
// are flat here: tools[i].function.parameters is tools[i].parameters).
ApiError Renamed(ApiError error) {
  return RenameFields(std::move(error),
                      {{"messages", "input"},
                       {"prompt", "input"},
                       {"max_tokens", "max_output_tokens"},
                       {"response_format", "text.format"},
                       {"reasoning_effort", "reasoning.effort"}},
                      {{"].function", "]"}});
}

json Usage(const ResponsesPlan& plan, const ChoiceResult& r, const TextCodec& codec) {
  const auto output = static_cast<int64_t>(r.tokens.size());
  const int64_t reasoning = SplitReasoningTokens(plan.chat, r.tokens, codec).reasoning_tokens;
  return {{"input_tokens", r.prompt_tokens},
          {"input_tokens_details", {{"cached_tokens", r.cached_tokens}}},
          {"output_tokens", output},
          {"output_tokens_details", {{"reasoning_tokens", reasoning}}},
          {"total_tokens", r.prompt_tokens + output}};
}

// The log-probabilities of the answer's tokens (those after the reasoning).
json AnswerLogprobs(const ResponsesPlan& plan, const ChoiceResult& r, const TextCodec& codec) {
  json out = json::array();
  if (!plan.output_logprobs) return out;
  const size_t begin = SplitReasoningTokens(plan.chat, r.tokens, codec).answer_begin;
  for (size_t i = begin; i < r.logprobs.size(); ++i)
    out.push_back(ChatLogprobEntry(codec, r.logprobs[i]));
  return out;
}

// An output item's id: its kind's prefix, the response's id and its place in the output.
std::string ItemId(const char* prefix, const std::string& response_id, size_t index) {
  return fmt::format("{}_{}_{}", prefix, response_id.substr(response_id.find('_') + 1), index);
}

json OutputText(const std::string& text, json logprobs = json::array()) {
  return {{"type", "output_text"},
          {"text", text},
          {"annotations", json::array()},
          {"logprobs", std::move(logprobs)}};
}

json MessageItem(const std::string& id, const std::string* text, const char* status,
                 json logprobs = json::array()) {
  json item = {{"id", id},
               {"type", "message"},
               {"role", "assistant"},
               {"status", status},
               {"content", json::array()}};
  if (text) item["content"].push_back(OutputText(*text, std::move(logprobs)));
  return item;
}

json ReasoningItem(const std::string& id, const std::string* text, const char* status) {
  json item = {{"id", id}, {"type", "reasoning"}, {"summary", json::array()}, {"status", status}};
  if (text) item["content"] = json::array({{{"type", "reasoning_text"}, {"text", *text}}});
  return item;
}

json FunctionCallItem(const std::string& id, const std::string& call_id, const std::string& name,
                      const std::string& arguments, const char* status) {
  return {{"id", id},     {"type", "function_call"}, {"call_id", call_id},
          {"name", name}, {"arguments", arguments},  {"status", status}};
}

// "completed" or "incomplete" (max_output_tokens, or the context, ran out).
bool Incomplete(const ChoiceResult& r) {
  return r.finish_reason == "length";
}
const char* ItemStatus(const ChoiceResult& r) {
  return Incomplete(r) ? "incomplete" : "completed";
}

// A finished choice's output items: its reasoning (with a reasoning parser), its message (when
// it has text, or when there is nothing else), and its function calls.
json OutputItems(const ResponsesPlan& plan, const std::string& id, const ChoiceResult& r,
                 const TextCodec& codec) {
  chat_output::ChatMessage m;
  if (plan.chat.parse_output) {
    m = FinishedChatChoice(plan.chat, r).message;
  } else {
    m.content = r.text;
  }
  json items = json::array();
  const char* status = ItemStatus(r);
  if (m.reasoning)
    items.push_back(ReasoningItem(ItemId("rs", id, items.size()), &*m.reasoning, status));
  if ((m.content && !m.content->empty()) || (m.tool_calls.empty() && !m.reasoning)) {
    const std::string text = m.content.value_or("");
    items.push_back(MessageItem(ItemId("msg", id, items.size()), &text, status,
                                AnswerLogprobs(plan, r, codec)));
  }
  // The last item shares the response's fate, as the stream's (Close): a call the budget cut
  // is incomplete.
  for (size_t i = 0; i < m.tool_calls.size(); ++i) {
    const auto& call = m.tool_calls[i];
    items.push_back(FunctionCallItem(ItemId("fc", id, items.size()), call.id, call.name,
                                     call.arguments,
                                     i + 1 == m.tool_calls.size() ? status : "completed"));
  }
  return items;
}

// The Response object, its output and usage left for the caller to fill when finished.
json ResponseObject(const ResponsesPlan& plan, const std::string& id, int64_t created,
                    const ServingLimits& limits, const char* status) {
  json out = {{"id", id},
              {"object", "response"},
              {"created_at", created},
              {"status", status},
              {"background", false},
              {"error", nullptr},
              {"incomplete_details", nullptr},
              {"model", limits.model_name},
              {"output", json::array()},
              {"previous_response_id", nullptr},
              {"store", false},
              {"usage", nullptr}};
  out.update(plan.echo);
  return out;
}

json FinishedResponse(const ResponsesPlan& plan, const std::string& id, int64_t created,
                      const TextCodec& codec, const ServingLimits& limits, const ChoiceResult& r,
                      json output) {
  json out = ResponseObject(plan, id, created, limits, ItemStatus(r));
  out["output"] = std::move(output);
  out["usage"] = Usage(plan, r, codec);
  if (Incomplete(r)) out["incomplete_details"] = {{"reason", "max_output_tokens"}};
  return out;
}

// This request's input as stored items: a string becomes a user message, a message's string
// content becomes its text part, every item gets its type (ids come at storing time).
json NormalizedInput(const json& input) {
  if (input.is_string())
    return json::array({{{"type", "message"},
                         {"role", "user"},
                         {"content", json::array({{{"type", "input_text"}, {"text", input}}})}}});
  json items = json::array();
  for (json item : input) {
    if (!item.contains("type")) item["type"] = "message";
    if (item["type"] == "message" && item["content"].is_string()) {
      const char* part = item["role"] == "assistant" ? "output_text" : "input_text";
      item["content"] = json::array({{{"type", part}, {"text", item["content"]}}});
    }
    items.push_back(std::move(item));
  }
  return items;
}

ParsedResponsesRequest ParseChecked(const std::string& body, const TextCodec& codec,
                                    const ServingLimits& limits, ResponsesStore* store) {
  ParsedResponsesRequest out;
  json root = json::parse(body, nullptr, false);
  if (root.is_discarded()) {
    out.error = {400, "the body is not valid JSON", "", "invalid_value"};
    return out;
  }
  if (!root.is_object()) {
    out.error = {400, "the body must be a JSON object", "", "invalid_value"};
    return out;
  }
  json chat = json::object();
  json messages = json::array();
  json format;
  std::optional<ApiError> error = RefuseUnsupported(root, store != nullptr);
  // previous_response_id: the stored turn's context and output come before this input.
  json prior = json::array();
  std::string previous_id, conversation_id;
  if (!error && store) {
    if (const json* id = Get(root, "previous_response_id")) {
      previous_id = id->get<std::string>();
      auto previous = store->Get(previous_id);
      if (!previous) {
        out.error = {404,
                     fmt::format("previous_response_id: no stored response '{}' (never stored, "
                                 "deleted, or evicted from the store)",
                                 previous_id),
                     "previous_response_id", "not_found"};
        return out;
      }
      prior = previous->context;
      for (const json& item : previous->response.value("output", json::array()))
        prior.push_back(item);
    }
    // conversation: its items come before this input, and this turn is added to it.
    if (const json* conversation = Get(root, "conversation")) {
      conversation_id = conversation->is_string() ? conversation->get<std::string>()
                                                  : (*conversation)["id"].get<std::string>();
      auto stored = store->Get(conversation_id);
      if (!stored || stored->response.value("object", "") != "conversation") {
        out.error = {404,
                     fmt::format("conversation: no conversation '{}' (never made, or deleted)",
                                 conversation_id),
                     "conversation", "not_found"};
        return out;
      }
      prior = stored->context;
    }
  }
  if (!error) error = Messages(root, prior, &messages);
  if (!error) error = TextFormat(root, &chat, &format);
  if (!error) error = Tools(root, &chat);
  const json* max_output = Get(root, "max_output_tokens");
  if (!error && max_output && !(max_output->is_number_integer() && *max_output >= 1))
    error = Invalid("max_output_tokens", "must be a positive integer");
  if (error) {
    out.error = *error;
    return out;
  }
  chat["messages"] = std::move(messages);
  for (const char* key : {"model", "temperature", "top_p", "stream", "priority", "service_tier"})
    if (const json* v = Get(root, key)) chat[key] = *v;
  json effort, summary;  // echoed in the response
  if (const json* reasoning = Get(root, "reasoning")) {
    effort = reasoning->value("effort", json());
    summary = reasoning->value("summary", json());
    if (!effort.is_null()) chat["reasoning_effort"] = effort;
  }
  if (max_output) chat["max_tokens"] = *max_output;
  // Log-probabilities as vLLM's Responses API: with include's message.output_text.logprobs,
  // top_logprobs (0 to 20, default 0) alternatives per token; top_logprobs alone returns none,
  // so asking for alternatives without the include is refused rather than ignored.
  const json* top = Get(root, "top_logprobs");
  if (top && !(top->is_number_integer() && *top >= 0 && *top <= 20)) {
    out.error = Invalid("top_logprobs", "must be an integer in [0, 20]");
    return out;
  }
  bool output_logprobs = false;
  if (const json* include = Get(root, "include"))
    output_logprobs = std::find(include->begin(), include->end(),
                                json("message.output_text.logprobs")) != include->end();
  if (top && *top != 0 && !output_logprobs) {
    out.error = Invalid("top_logprobs",
                        "log-probabilities come back only with include: "
                        "[\"message.output_text.logprobs\"]");
    return out;
  }
  if (output_logprobs) {
    chat["logprobs"] = true;
    chat["top_logprobs"] = top ? *top : json(0);
  }
  ParsedRequest parsed = PlanGenerationRequest(Endpoint::kChat, chat, codec, limits);
  const bool truncate = Get(root, "truncation") && root["truncation"] == "auto";
  if (!parsed.plan && truncate && parsed.error.code == kContextLengthExceeded)
    parsed = PlanTruncated(chat, codec, limits, parsed);
  if (!parsed.plan) {
    out.error = Renamed(parsed.error);
    return out;
  }
  ResponsesPlan plan;
  plan.chat = std::move(*parsed.plan);
  plan.output_logprobs = output_logprobs;
  // OpenAI's default: stored, where the server keeps a store.
  plan.store = store && (!Get(root, "store") || root["store"] == true);
  plan.background = Get(root, "background") && root["background"] == true;
  plan.conversation = conversation_id;
  if (!conversation_id.empty()) plan.conversation_items = NormalizedInput(root["input"]);
  if (plan.store) {
    plan.context = std::move(prior);
    for (json& item : NormalizedInput(root["input"]))
      plan.context.push_back(std::move(item));
  }
  const SamplingParams& p = plan.chat.params;
  plan.echo = {{"instructions", root.value("instructions", json())},
               {"max_output_tokens", max_output ? *max_output : json()},
               {"temperature", p.temperature},
               {"top_p", p.top_p},
               {"top_logprobs", top ? *top : json(0)},
               {"text", {{"format", format}}},
               {"tools", root.value("tools", json::array())},
               {"tool_choice", root.value("tool_choice", json("auto"))},
               {"parallel_tool_calls", root.value("parallel_tool_calls", json(true))},
               {"metadata", root.value("metadata", json::object())},
               {"reasoning", {{"effort", effort}, {"summary", summary}}},
               {"truncation", truncate ? "auto" : "disabled"},
               {"service_tier",
                plan.chat.service_tier.empty() ? std::string("default") : plan.chat.service_tier},
               {"user", root.value("user", json())},
               {"store", plan.store},
               {"background", plan.background},
               {"conversation", conversation_id.empty() ? json() : json({{"id", conversation_id}})},
               {"previous_response_id", previous_id.empty() ? json() : json(previous_id)}};
  if (plan.echo["tool_choice"].is_null()) plan.echo["tool_choice"] = "auto";
  if (plan.echo["parallel_tool_calls"].is_null()) plan.echo["parallel_tool_calls"] = true;
  if (plan.echo["metadata"].is_null()) plan.echo["metadata"] = json::object();
  if (plan.echo["tools"].is_null()) plan.echo["tools"] = json::array();
  out.plan = std::move(plan);
  return out;
}

}  // namespace

ParsedResponsesRequest ParseResponsesRequest(const std::string& body, const TextCodec& codec,
                                             const ServingLimits& limits, ResponsesStore* store) {
  try {
    return ParseChecked(body, codec, limits, store);
  } catch (const json::exception& e) {  // a value of an unexpected type deep in the body
    ParsedResponsesRequest out;
    out.error = {400, fmt::format("malformed request: {}", e.what()), "", "invalid_value"};
    return out;
  }
}

json ResponsesObject(const ResponsesPlan& plan, const ChoiceResult& result, const std::string& id,
                     int64_t created, const TextCodec& codec, const ServingLimits& limits) {
  return FinishedResponse(plan, id, created, codec, limits, result,
                          OutputItems(plan, id, result, codec));
}

std::string ResponsesBody(const ResponsesPlan& plan, const ChoiceResult& result,
                          const std::string& id, int64_t created, const TextCodec& codec,
                          const ServingLimits& limits) {
  return DumpJson(ResponsesObject(plan, result, id, created, codec, limits));
}

json PendingResponse(const ResponsesPlan& plan, const std::string& id, int64_t created,
                     const ServingLimits& limits, const char* status) {
  return ResponseObject(plan, id, created, limits, status);
}

json WithItemIds(json items, const std::string& owner_id, const char* tag) {
  const std::string suffix = owner_id.substr(owner_id.find('_') + 1);
  for (size_t i = 0; i < items.size(); ++i) {
    json& item = items[i];
    if (item.contains("id")) continue;
    const std::string type = item.value("type", "message");
    const char* prefix = type == "message"                ? "msg"
                         : type == "function_call"        ? "fc"
                         : type == "function_call_output" ? "fco"
                                                          : "item";
    item["id"] = fmt::format("{}_{}_{}{}", prefix, suffix, tag, i);
  }
  return items;
}

StoredResponse ResponseToStore(const ResponsesPlan& plan, const std::string& id, json response) {
  StoredResponse stored;
  stored.response = std::move(response);
  stored.context = WithItemIds(plan.context, id, "in");
  return stored;
}

void AppendToConversation(ResponsesStore& store, const ResponsesPlan& plan,
                          const std::string& response_id, const json& response) {
  // A failed or cancelled turn is not added: the conversation holds whole turns.
  const std::string status = response.value("status", "");
  if (plan.conversation.empty() || (status != "completed" && status != "incomplete")) return;
  store.Update(plan.conversation, [&](StoredResponse& conversation) {
    for (json& item : WithItemIds(plan.conversation_items, response_id, "in"))
      conversation.context.push_back(std::move(item));
    for (const json& item : response.value("output", json::array()))
      conversation.context.push_back(item);
  });
}

std::optional<ApiError> CheckInputItems(const json& items, const std::string& where) {
  json messages = json::array();
  for (size_t i = 0; i < items.size(); ++i)
    if (auto error = AddInputItem(items[i], fmt::format("{}[{}]", where, i), &messages))
      return error;
  return std::nullopt;
}

json NormalizedInputItems(const json& items) {
  return NormalizedInput(items);
}

std::string InputItemsBody(const StoredResponse& stored, const std::string& query,
                           ApiError* error) {
  size_t limit = 20;
  bool ascending = false;
  std::string after;
  std::optional<ApiError> bad;
  ForEachQueryPair(query, [&](std::string_view key, std::string_view v) {
    const std::string value(v);
    if (key == "limit") {
      char* rest = nullptr;
      const long n = std::strtol(value.c_str(), &rest, 10);
      if (value.empty() || *rest != '\0' || n < 1 || n > 100) {
        bad = Invalid("limit", "must be an integer in [1, 100]");
        return false;
      }
      limit = static_cast<size_t>(n);
    } else if (key == "order") {
      if (value != "asc" && value != "desc") {
        bad = Invalid("order", "must be \"asc\" or \"desc\"");
        return false;
      }
      ascending = value == "asc";
    } else if (key == "after") {
      after = value;
    }  // include[] and others change nothing here
    return true;
  });
  if (bad) {
    *error = *bad;
    return "";
  }
  std::vector<const json*> items;
  for (const json& item : stored.context)
    items.push_back(&item);
  if (!ascending) std::reverse(items.begin(), items.end());
  size_t begin = 0;
  if (!after.empty()) {
    while (begin < items.size() && items[begin]->value("id", "") != after)
      ++begin;
    if (begin == items.size()) {
      *error = Invalid("after", fmt::format("no input item '{}' in this response", after));
      return "";
    }
    ++begin;
  }
  json data = json::array();
  for (size_t i = begin; i < items.size() && data.size() < limit; ++i)
    data.push_back(*items[i]);
  const bool more = begin + data.size() < items.size();
  json out = {{"object", "list"},
              {"data", data},
              {"first_id", data.empty() ? json() : data.front()["id"]},
              {"last_id", data.empty() ? json() : data.back()["id"]},
              {"has_more", more}};
  return DumpJson(out);
}

ResponsesStream::ResponsesStream(const ResponsesPlan& plan, std::string id, int64_t created,
                                 const TextCodec& codec, const ServingLimits& limits)
    : plan_(plan),
      id_(std::move(id)),
      created_(created),
      codec_(codec),
      limits_(limits),
      blocks_(plan.chat) {}

ResponsesStream::~ResponsesStream() = default;

std::string ResponsesStream::Event(const char* type, json body) {
  body["type"] = type;
  body["sequence_number"] = sequence_++;
  return fmt::format("event: {}\ndata: {}\n\n", type, DumpJson(body));
}

std::string ResponsesStream::Start() {
  const json response = ResponseObject(plan_, id_, created_, limits_, "in_progress");
  std::string out = Event("response.created", {{"response", response}});
  out += Event("response.in_progress", {{"response", response}});
  return out;
}

std::string ResponsesStream::Queued() {
  const json response = ResponseObject(plan_, id_, created_, limits_, "queued");
  std::string out = Event("response.created", {{"response", response}});
  out += Event("response.queued", {{"response", response}});
  return out;
}

std::string ResponsesStream::InProgress() {
  return Event("response.in_progress",
               {{"response", ResponseObject(plan_, id_, created_, limits_, "in_progress")}});
}

std::string ResponsesStream::Open(Kind kind, const std::string& call_id, const std::string& name) {
  std::string out = Close(nullptr);
  const size_t index = items_.size();
  json item;
  if (kind == Kind::kReasoning)
    item = ReasoningItem(ItemId("rs", id_, index), nullptr, "in_progress");
  if (kind == Kind::kText) item = MessageItem(ItemId("msg", id_, index), nullptr, "in_progress");
  if (kind == Kind::kCall)
    item = FunctionCallItem(ItemId("fc", id_, index), call_id, name, "", "in_progress");
  out += Event("response.output_item.added", {{"output_index", index}, {"item", item}});
  if (kind == Kind::kText)
    out += Event("response.content_part.added", {{"item_id", item["id"]},
                                                 {"output_index", index},
                                                 {"content_index", 0},
                                                 {"part", OutputText("")}});
  items_.push_back(std::move(item));
  open_ = kind;
  text_.clear();
  return out;
}

std::string ResponsesStream::Append(const std::string& piece) {
  if (piece.empty()) return "";
  text_ += piece;
  const json& item = items_.back();
  const size_t index = items_.size() - 1;
  json body = {{"item_id", item["id"]}, {"output_index", index}, {"delta", piece}};
  if (open_ == Kind::kCall) return Event("response.function_call_arguments.delta", std::move(body));
  body["content_index"] = 0;
  if (open_ == Kind::kReasoning) return Event("response.reasoning_text.delta", std::move(body));
  body["logprobs"] = std::exchange(pending_logprobs_, json::array());
  return Event("response.output_text.delta", std::move(body));
}

std::string ResponsesStream::Close(const ChoiceResult* finished) {
  if (open_ == Kind::kNone) return "";
  json& item = items_.back();
  const size_t index = items_.size() - 1;
  const json where = {{"item_id", item["id"]}, {"output_index", index}};
  // An item closed because another began is whole; the last one shares the response's fate.
  const char* status = finished ? ItemStatus(*finished) : "completed";
  std::string out;
  if (open_ == Kind::kText) {
    json done = where;
    done["content_index"] = 0;
    done["text"] = text_;
    done["logprobs"] = message_logprobs_;
    out += Event("response.output_text.done", done);
    done.erase("text");
    done.erase("logprobs");
    done["part"] = OutputText(text_, message_logprobs_);
    out += Event("response.content_part.done", std::move(done));
    item = MessageItem(item["id"], &text_, status, message_logprobs_);
  } else if (open_ == Kind::kReasoning) {
    json done = where;
    done["content_index"] = 0;
    done["text"] = text_;
    out += Event("response.reasoning_text.done", std::move(done));
    item = ReasoningItem(item["id"], &text_, status);
  } else {
    json done = where;
    done["arguments"] = text_;
    out += Event("response.function_call_arguments.done", std::move(done));
    item["arguments"] = text_;
    item["status"] = status;
  }
  out += Event("response.output_item.done", {{"output_index", index}, {"item", item}});
  open_ = Kind::kNone;
  return out;
}

void ResponsesStream::TakeLogprobs(const ChoiceResult& so_far) {
  if (!plan_.output_logprobs) return;
  const size_t begin = std::max(
      logprobs_seen_, SplitReasoningTokens(plan_.chat, so_far.tokens, codec_).answer_begin);
  for (size_t i = begin; i < so_far.logprobs.size(); ++i) {
    json entry = ChatLogprobEntry(codec_, so_far.logprobs[i]);
    message_logprobs_.push_back(entry);
    pending_logprobs_.push_back(std::move(entry));
  }
  logprobs_seen_ = std::max(logprobs_seen_, so_far.logprobs.size());
}

std::string ResponsesStream::OnEvent(const RequestEvent& event, const ChoiceResult& so_far) {
  TakeLogprobs(so_far);
  std::string out = blocks_.Feed(
      event, open_,
      [this](Kind kind, const std::string& call_id, const std::string& name) {
        return Open(kind, call_id, name);
      },
      [this](const std::string& piece) { return Append(piece); });
  if (!event.finish_reason) return out;
  if (*event.finish_reason == "abort") {
    out += Close(nullptr);
    final_ = FinishedResponse(plan_, id_, created_, codec_, limits_, so_far, items_);
    final_["status"] = "cancelled";
    return out;
  }
  if (items_.empty()) out += Open(Kind::kText, "", "");  // an empty answer is an empty message
  out += Close(&so_far);
  const bool incomplete = Incomplete(so_far);
  final_ = FinishedResponse(plan_, id_, created_, codec_, limits_, so_far, items_);
  out += Event(incomplete ? "response.incomplete" : "response.completed", {{"response", final_}});
  return out;
}

std::string ResponsesStream::Failed(const std::string& message, const ChoiceResult& so_far) {
  json response = ResponseObject(plan_, id_, created_, limits_, "failed");
  response["error"] = {{"code", "server_error"}, {"message", message}};
  response["output"] = items_;
  response["usage"] = Usage(plan_, so_far, codec_);
  final_ = response;
  return Event("response.failed", {{"response", response}});
}

}  // namespace sy::serve
