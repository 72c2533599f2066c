// Anthropic's Messages API (/v1/messages, /v1/messages/count_tokens), so the tools written for
// it (the anthropic SDK, Claude Code, agent frameworks) can be pointed at switchyard. Like the
// Responses API, a request is planned as the chat request it amounts to — system and messages
// become chat messages (tool_use blocks become tool calls, tool_result blocks tool messages),
// tools and tool_choice the chat path's, output_config.format a JSON-schema response format —
// and run by the chat path; the result is written back as a Message object or as the API's
// server-sent events (message_start, content_block_start/delta/stop, message_delta,
// message_stop). Reasoning (a reasoning parser) comes back as thinking blocks. Errors take
// Anthropic's shape ({"type": "error", "error": {"type", "message"}}). A final assistant message
// is a prefill: the answer continues its text (the chat path's continue_final_message). Fields
// that would change the output and are not implemented here (images, server tools, effort) are
// refused by name, never ignored. Pure functions and a small stream
// writer — the HTTP layer and the fuzzer both call them.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "serve/openai_api.h"
#include "serve/responses_store.h"

namespace sy::serve {

struct MessagesPlan {
  GenerationPlan chat;  // what the engine runs (one choice)
  // Anthropic's message threads (`thread`): the reply is kept in the store under its id with the
  // thread's state — `context`, {"system", "tools", "messages"}: the create-only fields and every
  // message up to this request's — so a later request continues it with only its new messages.
  bool thread = false;
  std::string continues;  // the previous_message_id this request continues ("" for a create)
  nlohmann::ordered_json context;
};

struct ParsedMessagesRequest {
  std::optional<MessagesPlan> plan;
  ApiError error;
};

// The chat request a Messages body amounts to. `store`: the front's store, where threads live
// (null: `thread` is refused as Anthropic refuses what threads cannot hold, with error_code
// thread_unsupported_request, so a client goes on without). A continue whose reply is not
// stored is a 404 (thread_not_found); one that sends a `system` or `tools` other than the
// thread's a 400 (thread_fingerprint_mismatch). Claiming the reply (each is continued once) is
// the caller's: ResponsesStore::ClaimContinuation.
ParsedMessagesRequest ParseMessagesRequest(const std::string& body, const TextCodec& codec,
                                           const ServingLimits& limits,
                                           ResponsesStore* store = nullptr);

// What a thread's finished reply is kept as: the Message object, and the thread's state.
StoredResponse MessageToStore(const MessagesPlan& plan, nlohmann::ordered_json message);

// POST /v1/messages/count_tokens: {"input_tokens": N}, the prompt the same body would run
// (max_tokens not needed); "" and *error when the body is refused.
std::string CountTokensBody(const std::string& body, const TextCodec& codec,
                            const ServingLimits& limits, ApiError* error);

// An error in Anthropic's shape; its type follows the HTTP status (invalid_request_error,
// authentication_error, not_found_error, request_too_large, overloaded_error, api_error, ...).
// A thread error (code thread_…) carries details.error_code, which clients act on.
std::string MessagesErrorBody(const ApiError& error);

// The requests of a Message Batches create body ({"requests": [{"custom_id", "params"}, ...]}),
// checked as Anthropic checks them at creation — custom_ids of 1 to 64 of [a-zA-Z0-9_-], each
// used once, params an object; whether the params make a Messages request is each request's
// result — as the JSONL a batch keeps (serve/batches.h), {"custom_id", "params"} a line. A refusal
// (*error, 400) names the request and field. Fuzzed.
std::optional<std::string> MessageBatchRequestLines(const std::string& body, ApiError* error);

// The Message object of a finished (non-streaming) request.
nlohmann::ordered_json MessageObject(const GenerationPlan& plan, const ChoiceResult& result,
                                     const std::string& id, const ServingLimits& limits);

// The events of a streaming request: message_start (with the first engine event, which knows
// how much of the prompt came from the cache) and a ping; per content block (thinking, text,
// each tool_use, in the order the model writes them) content_block_start, its deltas
// (thinking_delta, text_delta, input_json_delta) and content_block_stop (a thinking block's
// signature_delta before it); then message_delta (stop_reason, stop_sequence, the usage) and
// message_stop. A failed generation ends with an error event.
class MessagesStream {
 public:
  MessagesStream(const GenerationPlan& plan, std::string id, const ServingLimits& limits);
  ~MessagesStream();
  // The events for one engine event; `so_far` already includes it.
  std::string OnEvent(const RequestEvent& event, const ChoiceResult& so_far);
  // The generation failed: an error event.
  std::string Failed(const std::string& message);

 private:
  using Kind = OutputBlocks::Kind;  // thinking, text, tool_use
  // Closes the open block and opens one of `kind` (a tool_use with its id and name).
  std::string Open(Kind kind, const std::string& id, const std::string& name);
  std::string Append(const std::string& piece);
  std::string Close();

  std::string id_;
  std::string model_;
  OutputBlocks output_;
  bool started_ = false;
  int blocks_ = 0;  // content blocks opened so far
  Kind open_ = Kind::kNone;
  bool called_ = false;  // a tool_use block was written
};

}  // namespace sy::serve
