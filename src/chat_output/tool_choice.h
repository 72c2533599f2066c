// A chat request's tools, tool_choice and parallel_tool_calls, read and checked once, into what
// the rest of the server needs: whether to parse the output for calls, and — for tool_choice
// "required" or a named function — the grammar that forces a call in the model's own format
// (structured/structural.h) whose arguments follow the function's parameter schema.
//
//   none      the tools are shown to the model (rendered into the prompt); nothing is parsed
//   auto      the model may call; its output is parsed (needs --enable-auto-tool-choice, as in
//             vLLM); the schemas are not compiled (the model is free) unless the request also
//             asks for a JSON answer (AnswerOrCalls below)
//   required  one call or more (exactly one when parallel_tool_calls is false) of any function
//   named     {"type": "function", "function": {"name": N}}: calls of N only
//
// Defaults as OpenAI's: "auto" when tools are given, else "none".
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "chat_output/tool_parser.h"
#include "structured/compiler.h"

namespace sy::chat_output {

enum class ToolChoice { kNone, kAuto, kRequired, kNamed };

struct FunctionTool {
  std::string name;
  nlohmann::ordered_json
      parameters;  // a JSON schema (absent: an object with no properties, {} only)
};

struct ToolRequest {
  std::vector<FunctionTool> functions;
  ToolChoice choice = ToolChoice::kNone;
  std::string named;     // kNamed: the function
  bool parallel = true;  // parallel_tool_calls
  // Required and named: the forced call format, already checked (compiled without a vocabulary).
  std::optional<structured::GrammarSpec> grammar;
  // Whether the output is parsed for tool calls (auto, required, named) and how many it may have.
  bool parse() const { return choice != ToolChoice::kNone; }
  int max_calls() const { return parallel ? -1 : 1; }
};

struct ToolRequestError {
  std::string param;  // the request field at fault: "tools[1].function.parameters", ...
  std::string message;
};

struct ToolRequestOrError {
  std::optional<ToolRequest> request;  // absent when the request has no tools and no choice
  std::optional<ToolRequestError> error;
};

// `tools`, `tool_choice`, `parallel_tool_calls`: the request's fields (null when absent).
// `auto_enabled`: the server's --enable-auto-tool-choice.
ToolRequestOrError ReadToolRequest(const nlohmann::ordered_json* tools,
                                   const nlohmann::ordered_json* tool_choice,
                                   const nlohmann::ordered_json* parallel_tool_calls,
                                   ToolCallFormat format, bool auto_enabled);

// The request's tools as vLLM hands them to the chat template (each tool's pydantic model_dump):
// {"type", "function": {"name", "description" (null when absent), "parameters" (null when
// absent), other function keys}, other tool keys}, every schema and extra field in the client's
// key order. `tools` must have passed ReadToolRequest. `sort_keys`: every object's keys sorted,
// at every depth, as Kimi's tokenizer class hands tools to its template.
nlohmann::ordered_json ToolsForTemplate(const nlohmann::ordered_json& tools,
                                        bool sort_keys = false);

// The structural grammar (structured/structural.h) of calls to `functions` in `format`: the call
// list and nothing else, `max_calls` calls at most (-1: any number, at least one).
nlohmann::ordered_json ToolCallGrammar(ToolCallFormat format,
                                       const std::vector<FunctionTool>& functions, int max_calls);

// tool_choice "auto" with a JSON answer format (response_format json_schema or json_object, what
// agent frameworks send for a typed final output): the answer is either that JSON or a call list
// of the request's tools (arguments following their schemas), one grammar. OpenAI lets the model
// call tools in such a request; applying the answer's schema to the whole output (vLLM) would make
// every call impossible. Absent for other answer formats (a regex, a choice, a GBNF grammar: the
// model answers in that form and cannot call), and where the combined grammar does not compile
// (a tool schema the compiler refuses; auto never required one to compile): then the answer's
// format alone applies, as before.
std::optional<structured::GrammarSpec> AnswerOrCalls(ToolCallFormat format,
                                                     const ToolRequest& request,
                                                     const structured::GrammarSpec& answer);

}  // namespace sy::chat_output
