// The OpenAI-compatible request and response shapes (with vLLM's extensions): parsing and
// validating a request body into what the engine runs, and writing results back as JSON or
// server-sent-event chunks. Pure functions of their inputs — the HTTP layer and the fuzzer both
// call them.
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "chat_output/chat_output.h"
#include "chat_output/tool_choice.h"
#include "engine/request.h"
#include "engine/sampling.h"
#include "tokenizer/text_codec.h"

namespace sy::serve {

struct ApiError {
  int status = 400;
  std::string message;
  std::string param;  // the request field at fault, when there is one
  std::string code;   // a short machine-readable reason
};
// The code of a request whose prompt and max_tokens do not fit the context (OpenAI's).
inline constexpr const char* kContextLengthExceeded = "context_length_exceeded";

// {"error": {"message", "type", "param", "code"}} — OpenAI's shape.
std::string ErrorBody(const ApiError& error);

// What the Responses and Messages APIs share with the chat path when reading a body:
// a 400 naming the field ("param: message"; the message alone without a field),
ApiError InvalidField(const std::string& param, const std::string& message);
// body[key], unless it is absent or null,
const nlohmann::ordered_json* NonNullField(const nlohmann::ordered_json& body, const char* key);
// and an error the chat path reported, under the API's own field names: `fields` rename a
// leading field and what hangs off it ("stop[0]" → "stop_sequences[0]"), `infixes` a piece
// inside the path ("].function" → "]"); the message, which starts with the path, follows.
// The first member of `object` whose key is not in `allowed`, as a 400 naming `prefix + key`
// with `message` ("is not a tool_result field").
std::optional<ApiError> UnknownField(const nlohmann::ordered_json& object,
                                     const std::string& prefix,
                                     std::initializer_list<std::string_view> allowed,
                                     const std::string& message);
// The key=value pairs of a URL's query string, in order (no percent-decoding: the values read
// here are plain words, numbers and ids); `visit` returns false to stop.
void ForEachQueryPair(
    std::string_view query,
    const std::function<bool(std::string_view key, std::string_view value)>& visit);
// The value of `key`'s last occurrence in a query string; nothing when absent.
std::optional<std::string> QueryValue(std::string_view query, std::string_view key);
struct FieldRename {
  const char* from;
  const char* to;
};
ApiError RenameFields(ApiError error, std::initializer_list<FieldRename> fields,
                      std::initializer_list<FieldRename> infixes);

// A response body's JSON text: compact, invalid UTF-8 (a token cut mid-character) replaced.
std::string DumpJson(const nlohmann::ordered_json& value);

enum class Endpoint { kCompletions, kChat };

// "none" answers without thinking (a budget of 0); minimal, low, medium, high, xhigh and max
// leave the thinking to the model (no budget) until an operator says how long each may be.
std::map<std::string, int64_t> DefaultEffortBudgets();
// Reads "level=tokens,..." (tokens ≥ 0, or -1 for none) over `budgets`; the error names the
// entry.
Status ParseEffortBudgets(const std::string& text, std::map<std::string, int64_t>* budgets);

// What the server knows when it validates a request.
enum class ContentFormat { kAuto, kString, kOpenAI };

struct ServingLimits {
  std::string model_name;
  int64_t max_model_len = 0;
  int64_t cache_tokens = 0;  // the whole latent cache, in tokens
  int64_t max_n = 16;
  // Chat output parsing (chat_output/): the format tool calls are written and forced in
  // (--tool-call-parser, else the chat template's: deepseek_v31 for V3.1, deepseek_v3 for the
  // other DeepSeek templates, kimi_k2 for a tokenizer with Kimi K2's call tokens), whether
  // tool_choice "auto" is allowed (--enable-auto-tool-choice), and the reasoning parser
  // (--reasoning-parser; none by default, as vLLM).
  std::optional<chat_output::ToolCallFormat> tool_format;
  bool auto_tool_choice = false;
  // --exclude-tools-when-tool-choice-none (vLLM's): tool_choice "none" leaves the tools out of
  // the prompt; by default they are rendered (the model sees them but its output is not parsed).
  bool exclude_tools_when_tool_choice_none = false;
  std::optional<chat_output::ReasoningFormat> reasoning;
  // The tokenizer's class sorts the tools' keys before its template sees them (Kimi's).
  bool sort_tool_keys = false;
  // Reasoning effort (chat's reasoning_effort, the Responses API's reasoning.effort, Anthropic's
  // output_config.effort) as a thinking budget in tokens, -1 for none: DeepSeek's templates have
  // no effort levels, so the engine's budget gives them one. --reasoning-effort-budgets sets
  // levels over the defaults (DefaultEffortBudgets).
  std::map<std::string, int64_t> effort_budgets = DefaultEffortBudgets();
  // The engine schedules by priority (serve --scheduling-policy priority; behind a router, every
  // instance does): OpenAI's service_tier "priority" and "flex" then become priorities.
  bool priority_scheduling = false;
  // Chat templates (vLLM's flags): --chat-template-content-format, whether an interpreted
  // template gets a message's content as OpenAI's list of parts (kOpenAI), as one string
  // (kString), or as the template shows it wants (kAuto: a loop over content means parts); and
  // --trust-request-chat-template, whether a request may send its own template (code the server
  // runs, bounded in time and memory, so off by default).
  ContentFormat content_format = ContentFormat::kAuto;
  bool trust_request_chat_template = false;
};

// Sets `limits`' chat output fields from the serve/route flags (empty strings: not given) and
// the chat template; an unknown parser name is an error naming the flag.
Status ConfigureChatOutput(const std::string& tool_call_parser, bool enable_auto_tool_choice,
                           const std::string& reasoning_parser, const TextCodec& codec,
                           ServingLimits* limits);

// A validated generation request.
struct GenerationPlan {
  Endpoint endpoint = Endpoint::kCompletions;
  std::vector<std::vector<int32_t>> prompts;  // completions may batch several prompts
  std::vector<std::string> prompt_texts;      // what echo writes back
  int64_t n = 1;
  SamplingParams params;
  bool stream = false;
  bool include_usage = false;
  // vLLM's stream_options.continuous_usage_stats (with include_usage): every chunk carries its
  // choice's usage so far.
  bool continuous_usage = false;
  bool echo = false;
  bool chat_logprobs = false;  // chat: logprobs=true (top_logprobs in params.logprobs)
  int64_t priority = 0;        // vLLM's: lower runs first (--scheduling-policy priority)
  // vLLM's prompt_logprobs (the top k beside each prompt token's own) and return_token_ids
  // (the prompt's and the output's ids) in the response.
  std::optional<int64_t> prompt_logprobs;
  bool return_token_ids = false;
  // vLLM's return_tokens_as_token_ids: log-probabilities name tokens "token_id:N".
  bool tokens_as_ids = false;
  // OpenAI's service_tier as served ("default", "flex" or "priority"); empty where the request
  // named none (the response then names none either).
  std::string service_tier;
  // Chat: the request's tools (absent when it has none) and how each choice's output is split
  // into reasoning, content and tool calls (parse_output false: all content, as written).
  std::optional<chat_output::ToolRequest> tools;
  chat_output::ChatOutputOptions output;
  bool parse_output = false;
  int64_t choices() const { return static_cast<int64_t>(prompts.size()) * n; }
};

struct ParsedRequest {
  std::optional<GenerationPlan> plan;
  ApiError error;
};

ParsedRequest ParseGenerationRequest(Endpoint endpoint, const std::string& body,
                                     const TextCodec& codec, const ServingLimits& limits);
// The same from a parsed body (the Responses API plans its requests as chat requests here).
ParsedRequest PlanGenerationRequest(Endpoint endpoint, const nlohmann::ordered_json& body,
                                    const TextCodec& codec, const ServingLimits& limits);

// What one choice came to.
struct ChoiceResult {
  std::string text;
  std::vector<int32_t> tokens;
  std::vector<TokenLogprob> logprobs;
  std::string finish_reason;
  std::string error;
  std::optional<std::string> stop_string;  // as RequestEvent's: vLLM's stop_reason
  std::optional<int32_t> stop_token;
  int64_t prompt_tokens = 0;
  int64_t cached_tokens = 0;
  std::vector<std::optional<TokenLogprob>> prompt_logprobs;
  // Streaming chat with parse_output: the choice's parser (made by StreamChunk on first use).
  std::shared_ptr<chat_output::ChatOutputParser> output;
};

// The engine requests of a plan's choices (prompts × n), ids "<id>-<choice>"; several samples of
// one seeded prompt draw from consecutive seeds.
std::vector<EngineRequest> ChoiceRequests(const GenerationPlan& plan, const std::string& id);
// One engine event added to its choice's result; true when it finished the choice.
bool AddChoiceEvent(ChoiceResult& result, const RequestEvent& event);

// Where a choice's reasoning lies in its tokens (with a reasoning parser), by the tokens' bytes:
// `reasoning_tokens` counts the tokens inside it as vLLM's count_reasoning_tokens does — from the
// start of an output that starts in reasoning (an opening "<think>" not counted) up to "</think>"
// (not counted), all of them when it never ends; 0 when the output does not start in reasoning.
// `answer_begin`: the first token wholly after "</think>" (tokens.size() while the reasoning has
// not ended; 0 without reasoning): the answer's log-probabilities start there.
struct ReasoningSplit {
  int64_t reasoning_tokens = 0;
  size_t answer_begin = 0;
};
ReasoningSplit SplitReasoningTokens(const GenerationPlan& plan, const std::vector<int32_t>& tokens,
                                    const TextCodec& codec);

// The chat message of a finished choice and its finish reason ("tool_calls" when it called tools
// and stopped on its own) — what ResponseBody writes; the Responses API reuses it.
struct ChatChoice {
  chat_output::ChatMessage message;
  std::string finish_reason;
};
ChatChoice FinishedChatChoice(const GenerationPlan& plan, const ChoiceResult& choice);

// The whole response of a non-streaming request. `created`: seconds since the epoch.
std::string ResponseBody(const GenerationPlan& plan, const std::vector<ChoiceResult>& choices,
                         const std::string& id, int64_t created, const TextCodec& codec,
                         const ServingLimits& limits);

// One SSE "data: …\n\n" event for a streaming request: the delta of choice `index`.
// `first`: the choice's first chunk (chat sends the role then; echo sends the prompt then).
// Chat with parse_output feeds the event's text through so_far.output, so its deltas carry
// reasoning_content and tool_calls as vLLM streams them; an event that adds nothing yet gives
// "" (no chunk to send).
std::string StreamChunk(const GenerationPlan& plan, int64_t index, const RequestEvent& event,
                        ChoiceResult& so_far, bool first, const std::string& id, int64_t created,
                        const TextCodec& codec, const ServingLimits& limits);
// The closing usage chunk (stream_options.include_usage) and the terminator.
// With a reasoning parser, usage has completion_tokens_details.reasoning_tokens (as vLLM's).
std::string StreamUsageChunk(const GenerationPlan& plan, const std::vector<ChoiceResult>& choices,
                             const std::string& id, int64_t created, const TextCodec& codec,
                             const ServingLimits& limits);
// A streamed choice's output as the Responses and Messages APIs write it: a sequence of blocks —
// reasoning, text, one per tool call — in the order the model writes them. Feed() splits an
// engine event with the chat path's output parser (all text when the plan parses nothing; at the
// finish, what the parser still held), calls `open` when a block starts (a writer closes the
// block it had open first) and `append` with each piece of the block's text or arguments, and
// returns what they wrote.
class OutputBlocks {
 public:
  enum class Kind { kNone, kReasoning, kText, kCall };
  using OpenFn = std::function<std::string(Kind kind, const std::string& call_id,
                                           const std::string& call_name)>;
  using AppendFn = std::function<std::string(const std::string& piece)>;
  explicit OutputBlocks(const GenerationPlan& plan);
  ~OutputBlocks();
  // `open_kind`: the block the writer has open.
  std::string Feed(const RequestEvent& event, Kind open_kind, const OpenFn& open,
                   const AppendFn& append);

 private:
  std::unique_ptr<chat_output::ChatOutputParser> parser_;
  int call_index_ = -1;  // the open call's index in the parser's deltas
};

// One chat log-probability entry: {token, logprob, bytes, top_logprobs: [...]} (the Responses
// API's output_text logprobs take the same shape).
nlohmann::ordered_json ChatLogprobEntry(const TextCodec& codec, const TokenLogprob& logprob,
                                        bool tokens_as_ids = false);
std::string StreamError(const ApiError& error);
constexpr const char* kStreamDone = "data: [DONE]\n\n";

// /tokenize and /detokenize (vLLM's shapes); /v1/models and /v1/models/{id}, each model in
// OpenAI's shape and Anthropic's at once (a 404 for another id).
std::string TokenizeResponse(const std::string& body, const TextCodec& codec,
                             const ServingLimits& limits, ApiError* error);
std::string DetokenizeResponse(const std::string& body, const TextCodec& codec, ApiError* error);
std::string ModelsResponse(const ServingLimits& limits, int64_t created);
std::string ModelResponse(const ServingLimits& limits, int64_t created, const std::string& id,
                          ApiError* error);

}  // namespace sy::serve
