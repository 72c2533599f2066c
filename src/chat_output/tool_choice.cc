#include "chat_output/tool_choice.h"

#include <fmt/format.h>

#include <algorithm>
#include <set>

namespace sy::chat_output {
namespace {

using json = nlohmann::ordered_json;

bool ValidName(const std::string& name) {
  if (name.empty() || name.size() > 64) return false;
  for (char c : name)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-')) return false;
  return true;
}

json Token(std::string_view token) {
  return {{"type", "token"}, {"token", std::string(token)}};
}
json Text(std::string_view text) {
  return {{"type", "text"}, {"text", std::string(text)}};
}

}  // namespace

namespace {

// A JSON schema whose values include every string with no constraint on it: {"type": "string"},
// or any schema of annotations only. Such a DSML parameter may be written as plain text.
bool AnyString(const json& schema) {
  if (schema.is_boolean()) return schema.get<bool>();
  if (!schema.is_object()) return false;
  static const std::set<std::string> kAnnotations = {"type",    "description", "title",
                                                     "default", "examples",    "$comment"};
  for (const auto& [key, value] : schema.items())
    if (!kAnnotations.count(key)) return false;
  auto type = schema.find("type");
  if (type == schema.end()) return true;
  if (type->is_string()) return *type == "string";
  if (type->is_array()) return std::find(type->begin(), type->end(), json("string")) != type->end();
  return false;
}

// DeepSeek-V3.2's DSML call to `f`: its schema's properties as parameters in the schema's order,
// the required ones always, each as plain text (string="true", no "</" in it, which would end
// it early) where the property takes any string, or as JSON its schema validates (string="false",
// which the arguments take as written). Keys the schema requires without describing take any
// JSON value. No properties: no parameters (an empty object).
json DsmlInvokeGrammar(const FunctionTool& f) {
  const json& schema = f.parameters;
  json required = json::array();
  if (schema.is_object() && schema.contains("required") && schema["required"].is_array())
    required = schema["required"];
  const auto is_required = [&](const std::string& key) {
    return std::find(required.begin(), required.end(), json(key)) != required.end();
  };
  json properties = json::object();
  if (schema.is_object() && schema.contains("properties") && schema["properties"].is_object())
    properties = schema["properties"];
  for (const json& key : required)
    if (key.is_string() && !properties.contains(key.get<std::string>()))
      properties[key.get<std::string>()] = json::object();
  json elements = json::array({Text(std::string(kDsmlInvokeBegin) + f.name + "\">\n")});
  if (properties.empty()) elements.push_back(Text("\n"));
  for (const auto& [key, property] : properties.items()) {
    json forms = json::array();
    if (AnyString(property))
      forms.push_back(
          {{"type", "sequence"},
           {"elements", {Text("true\">"), {{"type", "regex"}, {"pattern", "([^<]|<+[^</])*<*"}}}}});
    forms.push_back(
        {{"type", "sequence"},
         {"elements", {Text("false\">"), {{"type", "json_schema"}, {"schema", property}}}}});
    json parameter = {{"type", "sequence"},
                      {"elements",
                       {Text(std::string(kDsmlParameterBegin) + key + "\" string=\""),
                        {{"type", "alternatives"}, {"elements", forms}},
                        Text(std::string(kDsmlParameterEnd) + "\n")}}};
    elements.push_back(
        is_required(key)
            ? parameter
            : json{{"type", "repeat"}, {"element", parameter}, {"min", 0}, {"max", 1}});
  }
  elements.push_back(Text(kDsmlInvokeEnd));
  return {{"type", "sequence"}, {"elements", elements}};
}

}  // namespace

json ToolCallGrammar(ToolCallFormat format, const std::vector<FunctionTool>& functions,
                     int max_calls) {
  if (format == ToolCallFormat::kDeepSeekV32) {
    json invokes = json::array();
    for (const FunctionTool& f : functions)
      invokes.push_back(DsmlInvokeGrammar(f));
    json repeat = {{"type", "repeat"},
                   {"element", {{"type", "alternatives"}, {"elements", invokes}}},
                   {"min", 1},
                   {"max", max_calls},
                   {"separator", Text("\n")}};
    return {{"type", "sequence"},
            {"elements",
             {Text(std::string(kDsmlCallsBegin) + "\n"), repeat,
              Text("\n" + std::string(kDsmlCallsEnd))}}};
  }
  json calls = json::array();
  for (const FunctionTool& f : functions) {
    json schema = {{"type", "json_schema"}, {"schema", f.parameters}};
    if (format == ToolCallFormat::kDeepSeekV3) {
      calls.push_back({{"type", "sequence"},
                       {"elements",
                        {Token(kCallBegin), Text("function"), Token(kToolSep), Text(f.name),
                         Text("\n```json\n"), schema, Text("\n```"), Token(kCallEnd)}}});
    } else if (format == ToolCallFormat::kKimiK2) {
      // "functions.NAME:INDEX": the index counts the conversation's calls, which only the model
      // keeps, so any 1 to 4 digits.
      json digit = {{"type", "alternatives"}, {"elements", json::array()}};
      for (char d = '0'; d <= '9'; ++d)
        digit["elements"].push_back(Text(std::string(1, d)));
      json index = {{"type", "repeat"}, {"element", digit}, {"min", 1}, {"max", 4}};
      calls.push_back({{"type", "sequence"},
                       {"elements",
                        {Token(kKimiCallBegin), Text("functions." + f.name + ":"), index,
                         Token(kKimiArgumentsBegin), schema, Token(kKimiCallEnd)}}});
    } else {
      calls.push_back(
          {{"type", "sequence"},
           {"elements",
            {Token(kCallBegin), Text(f.name), Token(kToolSep), schema, Token(kCallEnd)}}});
    }
  }
  json repeat = {{"type", "repeat"},
                 {"element", {{"type", "alternatives"}, {"elements", calls}}},
                 {"min", 1},
                 {"max", max_calls}};
  if (format == ToolCallFormat::kDeepSeekV3) repeat["separator"] = Text("\n");
  const bool kimi = format == ToolCallFormat::kKimiK2;
  return {{"type", "sequence"},
          {"elements",
           {Token(kimi ? kKimiCallsBegin : kCallsBegin), repeat,
            Token(kimi ? kKimiCallsEnd : kCallsEnd)}}};
}

std::optional<structured::GrammarSpec> AnswerOrCalls(ToolCallFormat format,
                                                     const ToolRequest& request,
                                                     const structured::GrammarSpec& answer) {
  using Kind = structured::GrammarSpec::Kind;
  if (request.choice != ToolChoice::kAuto || request.functions.empty()) return std::nullopt;
  json schema;
  if (answer.kind == Kind::kJsonObject) {
    schema = {{"type", "object"}};  // AnyJsonObjectGrammar's schema
  } else if (answer.kind == Kind::kJsonSchema) {
    schema = json::parse(answer.text, nullptr, false);
    if (schema.is_discarded()) return std::nullopt;
  } else {
    return std::nullopt;
  }
  const json either = {{"type", "alternatives"},
                       {"elements",
                        {{{"type", "json_schema"}, {"schema", std::move(schema)}},
                         ToolCallGrammar(format, request.functions, request.max_calls())}}};
  structured::GrammarSpec spec{Kind::kStructural, either.dump(), {}, ""};
  if (!structured::CheckCompiles(spec).ok()) return std::nullopt;
  return spec;
}

namespace {

json SortedKeys(const json& value) {
  if (value.is_array()) {
    json out = json::array();
    for (const json& item : value)
      out.push_back(SortedKeys(item));
    return out;
  }
  if (!value.is_object()) return value;
  std::vector<std::string> keys;
  for (const auto& [key, item] : value.items())
    keys.push_back(key);
  std::sort(keys.begin(), keys.end());  // Python's sorted(): by code point, as UTF-8 bytes sort
  json out = json::object();
  for (const std::string& key : keys)
    out[key] = SortedKeys(value[key]);
  return out;
}

}  // namespace

json ToolsForTemplate(const json& tools, bool sort_keys) {
  if (sort_keys) return SortedKeys(ToolsForTemplate(tools, false));
  json out = json::array();
  for (const json& tool : tools) {
    const json& function = tool.at("function");
    json f = {{"name", function.at("name")},
              {"description", function.value("description", json())},
              {"parameters", function.value("parameters", json())}};
    for (const auto& [key, value] : function.items())
      if (key != "name" && key != "description" && key != "parameters") f[key] = value;
    json t = {{"type", tool.at("type")}, {"function", std::move(f)}};
    for (const auto& [key, value] : tool.items())
      if (key != "type" && key != "function") t[key] = value;
    out.push_back(std::move(t));
  }
  return out;
}

ToolRequestOrError ReadToolRequest(const json* tools, const json* tool_choice,
                                   const json* parallel_tool_calls, ToolCallFormat format,
                                   bool auto_enabled) {
  ToolRequestOrError out;
  auto fail = [&](std::string param, std::string message) {
    out.error = ToolRequestError{std::move(param), std::move(message)};
    out.request.reset();
    return out;
  };
  ToolRequest request;
  if (tools) {
    if (!tools->is_array()) return fail("tools", "must be a list of tools");
    std::set<std::string> names;
    for (size_t i = 0; i < tools->size(); ++i) {
      const json& tool = (*tools)[i];
      const std::string where = fmt::format("tools[{}]", i);
      if (!tool.is_object()) return fail(where, "must be an object");
      if (tool.value("type", json()) != "function")
        return fail(where + ".type", "must be \"function\" (the only tool type supported)");
      auto function = tool.find("function");
      if (function == tool.end() || !function->is_object())
        return fail(where + ".function", "must be an object with a \"name\"");
      auto name = function->find("name");
      if (name == function->end() || !name->is_string() || !ValidName(name->get<std::string>()))
        return fail(where + ".function.name",
                    "must be 1 to 64 characters of a-z, A-Z, 0-9, underscores and dashes");
      if (!names.insert(name->get<std::string>()).second)
        return fail(where + ".function.name",
                    fmt::format("\"{}\" is given twice", name->get<std::string>()));
      FunctionTool f;
      f.name = name->get<std::string>();
      // No parameters: an empty parameter list (OpenAI's meaning), so {} only.
      f.parameters = {
          {"type", "object"}, {"properties", json::object()}, {"additionalProperties", false}};
      if (auto p = function->find("parameters"); p != function->end() && !p->is_null()) {
        if (!p->is_object()) return fail(where + ".function.parameters", "must be a JSON schema");
        f.parameters = *p;
      }
      request.functions.push_back(std::move(f));
    }
  }
  if (parallel_tool_calls) {
    if (!parallel_tool_calls->is_boolean())
      return fail("parallel_tool_calls", "must be true or false");
    request.parallel = parallel_tool_calls->get<bool>();
  }
  const bool have_tools = !request.functions.empty();
  request.choice = have_tools ? ToolChoice::kAuto : ToolChoice::kNone;
  if (tool_choice) {
    if (*tool_choice == "none") {
      request.choice = ToolChoice::kNone;
    } else if (*tool_choice == "auto") {
      request.choice = ToolChoice::kAuto;
    } else if (*tool_choice == "required") {
      request.choice = ToolChoice::kRequired;
    } else if (tool_choice->is_object() && tool_choice->value("type", json()) == "function" &&
               tool_choice->contains("function") && (*tool_choice)["function"].is_object() &&
               (*tool_choice)["function"].value("name", json()).is_string()) {
      request.choice = ToolChoice::kNamed;
      request.named = (*tool_choice)["function"]["name"].get<std::string>();
    } else {
      return fail("tool_choice",
                  "must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", "
                  "\"function\": {\"name\": ...}}");
    }
  }
  if (request.choice != ToolChoice::kNone && !have_tools)
    return fail("tool_choice", "needs tools (the request gives none)");
  if (request.choice == ToolChoice::kAuto && !auto_enabled)
    return fail("tool_choice",
                "\"auto\" tool choice (the default when tools are given) requires the server "
                "to be started with --enable-auto-tool-choice; \"required\", a named function "
                "and \"none\" work without it");
  std::vector<FunctionTool> forced;
  if (request.choice == ToolChoice::kNamed) {
    for (const FunctionTool& f : request.functions)
      if (f.name == request.named) forced.push_back(f);
    if (forced.empty())
      return fail("tool_choice", fmt::format("names function \"{}\", which is not among the tools",
                                             request.named));
  } else if (request.choice == ToolChoice::kRequired) {
    forced = request.functions;
  }
  if (!forced.empty()) {
    // Each schema on its own first, so an error names its tool.
    for (size_t i = 0; i < request.functions.size(); ++i) {
      const FunctionTool& f = request.functions[i];
      if (request.choice == ToolChoice::kNamed && f.name != request.named) continue;
      structured::GrammarSpec spec{
          structured::GrammarSpec::Kind::kJsonSchema, f.parameters.dump(), {}, ""};
      // Remembered by text: a client sends the same tools with every request.
      if (Status checked = structured::CheckCompiles(spec); !checked.ok())
        return fail(fmt::format("tools[{}].function.parameters", i), checked.message());
    }
    structured::GrammarSpec spec{structured::GrammarSpec::Kind::kStructural,
                                 ToolCallGrammar(format, forced, request.max_calls()).dump(),
                                 {},
                                 ""};
    if (Status checked = structured::CheckCompiles(spec); !checked.ok())
      return fail("tools", checked.message());
    request.grammar = std::move(spec);
  }
  if (tools || tool_choice) out.request = std::move(request);
  return out;
}

}  // namespace sy::chat_output
