// Tool calls in a model's output text: DeepSeek's formats turned into OpenAI tool calls, whole or
// streamed. The text is what the detokenizer writes with special tokens kept, so the format's
// tokens ("<｜tool▁calls▁begin｜>", ...) appear in it as their text.
//
//   deepseek_v3  (V3, R1, V3-0324, R1-0528 — vLLM's parser "deepseek_v3"):
//     content? <｜tool▁calls▁begin｜> CALL ("\n"? CALL)* <｜tool▁calls▁end｜>
//     CALL = <｜tool▁call▁begin｜> TYPE <｜tool▁sep｜> NAME "\n```json\n" ARGS "\n```"
//     <｜tool▁call▁end｜>
//   deepseek_v31 (V3.1 — vLLM's "deepseek_v31"):
//     content? <｜tool▁calls▁begin｜> CALL* <｜tool▁calls▁end｜>
//     CALL = <｜tool▁call▁begin｜> NAME <｜tool▁sep｜> ARGS <｜tool▁call▁end｜>
//   kimi_k2 (Moonshot's Kimi K2, K2-Instruct, K2-Thinking — vLLM's "kimi_k2"):
//     content? <|tool_calls_section_begin|> CALL* <|tool_calls_section_end|>
//     CALL = <|tool_call_begin|> ID <|tool_call_argument_begin|> ARGS <|tool_call_end|>
//     ID = "functions." NAME ":" INDEX (INDEX counts the conversation's calls). The call's id is
//     ID itself, which the template writes back into the next prompt; the name is what comes
//     before the first ":", after its last "." (vLLM's reading). Space around ID and ARGS is
//     dropped.
//   deepseek_v32 (DeepSeek-V3.2's DSML — vLLM's "deepseek_v32"):
//     content? <｜DSML｜function_calls> INVOKE* </｜DSML｜function_calls>
//     INVOKE = <｜DSML｜invoke name="NAME"> PARAM* </｜DSML｜invoke>
//     PARAM = <｜DSML｜parameter name="KEY" string="true|false"> VALUE </｜DSML｜parameter>
//     with newlines between the tags (space there is dropped). The arguments are the JSON object
//     DeepSeek's encoding decodes them to, {"KEY": VALUE, ...} with Python's separators: a
//     string="true" value as a JSON string of its text, a string="false" one as written (it must
//     be JSON). Streamed a parameter's text at a time, the object's punctuation around it.
//
// Streaming follows vLLM's deltas: a call's first delta carries its index, id ("call_" + 24
// characters), type and name once the name is whole; later deltas append argument text. Text
// that may be the start of a marker is held back until the next text decides it, so any split
// of the output into chunks gives the same deltas in total.
//
// Malformed output — a call left unterminated, arguments that are not JSON, text where a call
// should begin — is, whole, returned as content with no tool calls (vLLM returns the model output
// as content when its parser fails). A stream cannot take back what it sent: there, the calls
// sent stay, and the rest of the text from the point it went wrong is sent as content.
//
// An output cut by its token budget (finish_reason "length") is not malformed for being
// unfinished: its calls are the ones read, the last with the arguments written before the cut —
// what the stream sent, and what OpenAI returns (arguments that may not parse) — and a call whose
// name was not whole is dropped (the stream sent none of it). Raw format tokens as content would
// be no answer at all, and a forced call cut short would read differently streamed and whole.
#pragma once

#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <vector>

namespace sy::chat_output {

enum class ToolCallFormat { kDeepSeekV3, kDeepSeekV31, kKimiK2, kDeepSeekV32 };

// "deepseek_v3" / "deepseek_v31" / "kimi_k2" / "deepseek_v32" (vLLM's --tool-call-parser names;
// "deepseekv3", "deepseekv31" and "deepseekv32" too).
std::optional<ToolCallFormat> ToolCallFormatByName(std::string_view name);
std::string_view ToolCallFormatName(ToolCallFormat format);

// The format's tokens.
inline constexpr std::string_view kCallsBegin = "<｜tool▁calls▁begin｜>";
inline constexpr std::string_view kCallsEnd = "<｜tool▁calls▁end｜>";
inline constexpr std::string_view kCallBegin = "<｜tool▁call▁begin｜>";
inline constexpr std::string_view kCallEnd = "<｜tool▁call▁end｜>";
inline constexpr std::string_view kToolSep = "<｜tool▁sep｜>";
// Kimi K2's.
inline constexpr std::string_view kKimiCallsBegin = "<|tool_calls_section_begin|>";
inline constexpr std::string_view kKimiCallsEnd = "<|tool_calls_section_end|>";
inline constexpr std::string_view kKimiCallBegin = "<|tool_call_begin|>";
inline constexpr std::string_view kKimiArgumentsBegin = "<|tool_call_argument_begin|>";
inline constexpr std::string_view kKimiCallEnd = "<|tool_call_end|>";

// DeepSeek-V3.2's (DSML: text, not special tokens).
inline constexpr std::string_view kDsmlCallsBegin = "<｜DSML｜function_calls>";
inline constexpr std::string_view kDsmlCallsEnd = "</｜DSML｜function_calls>";
inline constexpr std::string_view kDsmlInvokeBegin = "<｜DSML｜invoke name=\"";
inline constexpr std::string_view kDsmlInvokeEnd = "</｜DSML｜invoke>";
inline constexpr std::string_view kDsmlParameterBegin = "<｜DSML｜parameter name=\"";
inline constexpr std::string_view kDsmlParameterEnd = "</｜DSML｜parameter>";

// Where a format's call list starts: the text a model writes to begin calling.
std::string_view CallsBeginMarker(ToolCallFormat format);

struct ToolCall {
  std::string id;  // "call_..." (Kimi K2: the model's own "functions.NAME:INDEX")
  std::string name;
  std::string arguments;  // JSON text as the model wrote it
};

// One streamed piece of a tool call (OpenAI's choices[].delta.tool_calls[]).
struct ToolCallDelta {
  int index = 0;
  std::optional<std::string> id;    // first delta of a call
  std::optional<std::string> name;  // first delta of a call
  std::string arguments;
};

// What one piece of output adds: reasoning, content and tool-call deltas.
struct OutputDelta {
  std::string reasoning;
  std::string content;
  std::vector<ToolCallDelta> tool_calls;
  bool empty() const { return reasoning.empty() && content.empty() && tool_calls.empty(); }
};

class ToolCallParser {
 public:
  explicit ToolCallParser(ToolCallFormat format);

  // More output text; what it decides is appended to `out`.
  void Feed(std::string_view text, OutputDelta* out);
  // The end of the output: releases what was held back. `cut`: the output was cut by its token
  // budget (see above).
  void Finish(OutputDelta* out, bool cut = false);

  // After Finish: the calls read (whole ones), whether the output was malformed, and all the
  // content in order (as streamed).
  const std::vector<ToolCall>& calls() const { return calls_; }
  bool malformed() const { return malformed_; }

 private:
  enum class State {
    kContent,
    kBetween,
    kType,
    kName,
    kArguments,
    kDone,
    kJunk,
    // DSML (deepseek_v32): between an invoke's parameters, in a parameter's header, its value.
    kParameters,
    kParameterHeader,
    kValue,
  };
  void Run(OutputDelta* out, bool final, bool cut = false);
  // DSML's states (deepseek_v32); false when the state is not one of them.
  bool RunDsml(OutputDelta* out, bool final, bool cut, bool* done);
  // Appends argument text of the current call to it and to `out`'s delta for it.
  void AppendArguments(const std::string& text, OutputDelta* out);
  std::string NewId();

  ToolCallFormat format_;
  State state_ = State::kContent;
  std::string buffer_;  // text fed but not yet decided
  std::vector<ToolCall> calls_;
  ToolCall current_;
  bool arguments_started_ = false;  // Kimi K2: space before the arguments is dropped
  int parameters_ = 0;              // DSML: the current invoke's parameters so far
  bool string_value_ = false;       // DSML: the current parameter has string="true"
  bool malformed_ = false;
  std::mt19937_64 rng_;
};

// The whole output at once. `content` is null when empty; a malformed output is all content.
struct ParsedToolCalls {
  std::optional<std::string> content;
  std::vector<ToolCall> calls;
};
ParsedToolCalls ParseToolCalls(ToolCallFormat format, std::string_view text, bool cut = false);

}  // namespace sy::chat_output
