#include "serve/responses_api.h"

#include <fmt/format.h>

#include <utility>

namespace sy::serve {
namespace {

using json = nlohmann::json;

ApiError Invalid(const std::string& param, const std::string& message) {
  return {400, param + ": " + message, param, "invalid_value"};
}

std::string Dump(const json& value) {
  return value.dump(-1, ' ', false, json::error_handler_t::replace);
}

const json* Get(const json& body, const char* key) {
  auto it = body.find(key);
  return it == body.end() || it->is_null() ? nullptr : &*it;
}

// Fields that would change the output or need state this server does not keep: refused with the
// reason. (Identifiers that change nothing — user, safety_identifier, prompt_cache_key — are
// accepted.)
std::optional<ApiError> RefuseUnsupported(const json& body) {
  static const char* const kKnown[] = {
      "model",       "input",          "instructions",     "max_output_tokens",
      "temperature", "top_p",          "text",             "stream",
      "stream_options", "store",       "previous_response_id", "conversation",
      "background",  "metadata",       "user",             "safety_identifier",
      "prompt_cache_key", "parallel_tool_calls", "tool_choice", "tools",
      "truncation",  "include",        "reasoning",        "service_tier"};
  for (const auto& [key, value] : body.items()) {
    bool known = false;
    for (const char* k : kKnown)
      known = known || key == k;
    if (!known)
      return Invalid(key, "is not supported by this server's Responses API");
  }
  if (Get(body, "previous_response_id"))
    return Invalid("previous_response_id",
                   "this server keeps no state: send the whole conversation as input");
  if (const json* store = Get(body, "store"); store && *store != false)
    return Invalid("store",
                   "this server keeps no state: store must be false (send the whole "
                   "conversation as input)");
  if (Get(body, "conversation"))
    return Invalid("conversation",
                   "this server keeps no state: send the whole conversation as input");
  if (const json* b = Get(body, "background"); b && *b != false)
    return Invalid("background", "background responses need stored state; not supported");
  if (const json* tools = Get(body, "tools"); tools && !(tools->is_array() && tools->empty()))
    return Invalid("tools", "tool calling is not supported yet by this server's Responses API");
  if (const json* choice = Get(body, "tool_choice"); choice && *choice != "none" && *choice != "auto")
    return Invalid("tool_choice", "tool calling is not supported yet by this server's Responses API");
  if (const json* p = Get(body, "parallel_tool_calls"); p && !p->is_boolean())
    return Invalid("parallel_tool_calls", "must be true or false");
  if (const json* t = Get(body, "truncation"); t && *t != "disabled")
    return Invalid("truncation", "only \"disabled\" is supported (a prompt longer than the "
                                 "context is an error)");
  if (const json* include = Get(body, "include"); include && !(include->is_array() && include->empty()))
    return Invalid("include", "no additional output data is supported");
  if (const json* reasoning = Get(body, "reasoning")) {
    if (!reasoning->is_object()) return Invalid("reasoning", "must be an object");
    for (const auto& [key, value] : reasoning->items())
      if (!value.is_null())
        return Invalid("reasoning." + key, "is not supported (the model's chat template decides)");
  }
  if (const json* tier = Get(body, "service_tier"); tier && *tier != "auto" && *tier != "default")
    return Invalid("service_tier", "only \"auto\" and \"default\" are supported");
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
// assistant said before) joined.
std::optional<ApiError> MessageText(const json& content, const std::string& where,
                                    std::string* text) {
  if (content.is_string()) {
    *text = content.get<std::string>();
    return std::nullopt;
  }
  if (!content.is_array())
    return Invalid(where, "must be a string or a list of input_text parts");
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
    *text += t->get<std::string>();
  }
  return std::nullopt;
}

// instructions and input as chat messages.
std::optional<ApiError> Messages(const json& body, json* messages) {
  if (const json* instructions = Get(body, "instructions")) {
    if (!instructions->is_string()) return Invalid("instructions", "must be a string");
    messages->push_back({{"role", "system"}, {"content", *instructions}});
  }
  const json* input = Get(body, "input");
  if (!input) return Invalid("input", "is required");
  if (input->is_string()) {
    messages->push_back({{"role", "user"}, {"content", *input}});
    return std::nullopt;
  }
  if (!input->is_array() || input->empty())
    return Invalid("input", "must be a string or a non-empty list of input items");
  for (size_t i = 0; i < input->size(); ++i) {
    const json& item = (*input)[i];
    const std::string where = fmt::format("input[{}]", i);
    if (!item.is_object()) return Invalid(where, "must be an object");
    const std::string type =
        item.contains("type") && item["type"].is_string() ? item["type"].get<std::string>()
                                                          : "message";
    if (item.contains("type") && !item["type"].is_string())
      return Invalid(where + ".type", "must be a string");
    if (type == "reasoning") continue;  // the chat templates drop earlier turns' reasoning
    if (type == "function_call" || type == "function_call_output")
      return Invalid(where + ".type",
                     "tool calling is not supported yet by this server's Responses API");
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
  }
  if (messages->empty()) return Invalid("input", "holds no message");
  return std::nullopt;
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

// An error the chat path reports about a field this request named differently.
ApiError Renamed(ApiError error) {
  static const std::pair<const char*, const char*> kNames[] = {
      {"messages", "input"},
      {"prompt", "input"},
      {"max_tokens", "max_output_tokens"},
      {"response_format", "text.format"}};
  for (const auto& [chat, ours] : kNames) {
    const std::string from = chat;
    if (error.param.rfind(from, 0) != 0) continue;
    error.param = ours + error.param.substr(from.size());
    if (error.message.rfind(from, 0) == 0) error.message = ours + error.message.substr(from.size());
    break;
  }
  return error;
}

json Usage(const ChoiceResult& r) {
  const auto output = static_cast<int64_t>(r.tokens.size());
  return {{"input_tokens", r.prompt_tokens},
          {"input_tokens_details", {{"cached_tokens", r.cached_tokens}}},
          {"output_tokens", output},
          {"output_tokens_details", {{"reasoning_tokens", 0}}},
          {"total_tokens", r.prompt_tokens + output}};
}

std::string MessageId(const std::string& id) {
  return "msg_" + id.substr(id.find('_') + 1);
}

json OutputText(const std::string& text) {
  return {{"type", "output_text"}, {"text", text}, {"annotations", json::array()},
          {"logprobs", json::array()}};
}

// "completed" or "incomplete" (max_output_tokens, or the context, ran out).
bool Incomplete(const ChoiceResult& r) {
  return r.finish_reason == "length";
}

json MessageItem(const std::string& id, const ChoiceResult* r) {
  json item = {{"id", MessageId(id)},
               {"type", "message"},
               {"role", "assistant"},
               {"status", "in_progress"},
               {"content", json::array()}};
  if (r) {
    item["status"] = Incomplete(*r) ? "incomplete" : "completed";
    item["content"].push_back(OutputText(r->text));
  }
  return item;
}

// The Response object: in progress (r null), or finished with r.
json ResponseObject(const ResponsesPlan& plan, const ChoiceResult* r, const std::string& id,
                    int64_t created, const ServingLimits& limits, const char* status) {
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
  if (r) {
    out["output"].push_back(MessageItem(id, r));
    out["usage"] = Usage(*r);
    if (Incomplete(*r)) out["incomplete_details"] = {{"reason", "max_output_tokens"}};
  }
  return out;
}

ParsedResponsesRequest ParseChecked(const std::string& body, const TextCodec& codec,
                                    const ServingLimits& limits) {
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
  std::optional<ApiError> error = RefuseUnsupported(root);
  if (!error) error = Messages(root, &messages);
  if (!error) error = TextFormat(root, &chat, &format);
  const json* max_output = Get(root, "max_output_tokens");
  if (!error && max_output && !(max_output->is_number_integer() && *max_output >= 1))
    error = Invalid("max_output_tokens", "must be a positive integer");
  if (error) {
    out.error = *error;
    return out;
  }
  chat["messages"] = std::move(messages);
  for (const char* key : {"model", "temperature", "top_p", "stream"})
    if (const json* v = Get(root, key)) chat[key] = *v;
  if (max_output) chat["max_tokens"] = *max_output;
  ParsedRequest parsed = PlanGenerationRequest(Endpoint::kChat, chat, codec, limits);
  if (!parsed.plan) {
    out.error = Renamed(parsed.error);
    return out;
  }
  ResponsesPlan plan;
  plan.chat = std::move(*parsed.plan);
  const SamplingParams& p = plan.chat.params;
  plan.echo = {{"instructions", root.value("instructions", json())},
               {"max_output_tokens", max_output ? *max_output : json()},
               {"temperature", p.temperature},
               {"top_p", p.top_p},
               {"text", {{"format", format}}},
               {"tools", json::array()},
               {"tool_choice", root.value("tool_choice", json("auto"))},
               {"parallel_tool_calls", root.value("parallel_tool_calls", json(true))},
               {"metadata", root.value("metadata", json::object())},
               {"reasoning", {{"effort", nullptr}, {"summary", nullptr}}},
               {"truncation", "disabled"},
               {"service_tier", "default"},
               {"user", root.value("user", json())}};
  if (plan.echo["tool_choice"].is_null()) plan.echo["tool_choice"] = "auto";
  if (plan.echo["parallel_tool_calls"].is_null()) plan.echo["parallel_tool_calls"] = true;
  if (plan.echo["metadata"].is_null()) plan.echo["metadata"] = json::object();
  out.plan = std::move(plan);
  return out;
}

}  // namespace

ParsedResponsesRequest ParseResponsesRequest(const std::string& body, const TextCodec& codec,
                                             const ServingLimits& limits) {
  try {
    return ParseChecked(body, codec, limits);
  } catch (const json::exception& e) {  // a value of an unexpected type deep in the body
    ParsedResponsesRequest out;
    out.error = {400, fmt::format("malformed request: {}", e.what()), "", "invalid_value"};
    return out;
  }
}

std::string ResponsesBody(const ResponsesPlan& plan, const ChoiceResult& result,
                          const std::string& id, int64_t created, const ServingLimits& limits) {
  return Dump(ResponseObject(plan, &result, id, created, limits,
                             Incomplete(result) ? "incomplete" : "completed"));
}

ResponsesStream::ResponsesStream(const ResponsesPlan& plan, std::string id, int64_t created,
                                 const ServingLimits& limits)
    : plan_(plan), id_(std::move(id)), created_(created), limits_(limits) {}

std::string ResponsesStream::Event(const char* type, json body) {
  body["type"] = type;
  body["sequence_number"] = sequence_++;
  return fmt::format("event: {}\ndata: {}\n\n", type, Dump(body));
}

std::string ResponsesStream::Start() {
  const json response = ResponseObject(plan_, nullptr, id_, created_, limits_, "in_progress");
  std::string out = Event("response.created", {{"response", response}});
  out += Event("response.in_progress", {{"response", response}});
  out += Event("response.output_item.added",
               {{"output_index", 0}, {"item", MessageItem(id_, nullptr)}});
  out += Event("response.content_part.added", {{"item_id", MessageId(id_)},
                                               {"output_index", 0},
                                               {"content_index", 0},
                                               {"part", OutputText("")}});
  return out;
}

std::string ResponsesStream::OnEvent(const RequestEvent& event, const ChoiceResult& so_far) {
  std::string out;
  const json where = {{"item_id", MessageId(id_)}, {"output_index", 0}, {"content_index", 0}};
  if (!event.text.empty()) {
    json delta = where;
    delta["delta"] = event.text;
    delta["logprobs"] = json::array();
    out += Event("response.output_text.delta", std::move(delta));
  }
  if (!event.finish_reason) return out;
  json done = where;
  done["text"] = so_far.text;
  done["logprobs"] = json::array();
  out += Event("response.output_text.done", std::move(done));
  json part = where;
  part["part"] = OutputText(so_far.text);
  out += Event("response.content_part.done", std::move(part));
  out += Event("response.output_item.done",
               {{"output_index", 0}, {"item", MessageItem(id_, &so_far)}});
  const bool incomplete = Incomplete(so_far);
  out += Event(incomplete ? "response.incomplete" : "response.completed",
               {{"response", ResponseObject(plan_, &so_far, id_, created_, limits_,
                                            incomplete ? "incomplete" : "completed")}});
  return out;
}

std::string ResponsesStream::Failed(const std::string& message, const ChoiceResult& so_far) {
  json response = ResponseObject(plan_, nullptr, id_, created_, limits_, "failed");
  response["error"] = {{"code", "server_error"}, {"message", message}};
  response["usage"] = Usage(so_far);
  return Event("response.failed", {{"response", response}});
}

}  // namespace sy::serve
