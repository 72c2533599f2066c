// OpenAI's Responses API (/v1/responses): a request is planned as the chat request it amounts to
// (instructions and input items become messages; text.format becomes response_format) and run
// by the chat path; results are written back as a Response object or as the API's typed
// server-sent events. With a store (serve/responses_store.h) a response is kept unless the
// request says store: false (OpenAI's default), and previous_response_id continues a stored one:
// its context and output come before the new input (its instructions do not); background: true
// runs it without the client (the HTTP front answers "queued" and keeps the state in the store).
// Without a store the API is stateless and refuses all three. Every field this server does not
// implement is refused by name, never ignored. Pure functions and a small stream writer — the
// HTTP layer and the fuzzer both call them.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "serve/openai_api.h"
#include "serve/responses_store.h"

namespace sy::serve {

struct ResponsesPlan {
  GenerationPlan chat;  // what the engine runs (one choice)
  nlohmann::ordered_json
      echo;  // the request fields a Response object repeats (instructions, text, ...)
  // include: ["message.output_text.logprobs"]: the message's output_text carries the answer's
  // token log-probabilities (top_logprobs alternatives each), streamed with its deltas.
  bool output_logprobs = false;
  // Whether the finished response is stored, and the input items it is stored with (the
  // previous turns' context and output, then this input; StoredResponse::context).
  bool store = false;
  nlohmann::ordered_json context;
  // conversation: the stored conversation whose items come before the input; when the response
  // finishes, this request's input items (`conversation_items`) and its output are added to it.
  std::string conversation;
  nlohmann::ordered_json conversation_items;
  // background: true — the server runs it on its own (needs the store); streamed, its events are
  // kept so a client can read them again (GET /v1/responses/{id}?stream=true&starting_after=N).
  bool background = false;
};

struct ParsedResponsesRequest {
  std::optional<ResponsesPlan> plan;
  ApiError error;
};

// `store`: the server's store (null: stateless). previous_response_id is looked up in it (404
// when it is not there).
ParsedResponsesRequest ParseResponsesRequest(const std::string& body, const TextCodec& codec,
                                             const ServingLimits& limits,
                                             ResponsesStore* store = nullptr);

// The Response object of a finished (non-streaming) request. `created`: seconds since the epoch.
nlohmann::ordered_json ResponsesObject(const ResponsesPlan& plan, const ChoiceResult& result,
                                       const std::string& id, int64_t created,
                                       const TextCodec& codec, const ServingLimits& limits);
std::string ResponsesBody(const ResponsesPlan& plan, const ChoiceResult& result,
                          const std::string& id, int64_t created, const TextCodec& codec,
                          const ServingLimits& limits);

// The typed events of a streaming request, numbered by sequence_number:
//   response.created, response.in_progress; then per output item (reasoning, the message, each
//   function call, in the order the model writes them) response.output_item.added (and
//   response.content_part.added for the message), its deltas (response.reasoning_text.delta,
//   response.output_text.delta, response.function_call_arguments.delta), its done events
//   (….done, response.content_part.done, response.output_item.done); at the end
//   response.completed (or response.incomplete when max_output_tokens cut it short; a failed
//   generation ends with response.failed).
// The Response object of a request not finished yet (a background one): `status` "queued",
// "in_progress" or "cancelled", no output, no usage.
nlohmann::ordered_json PendingResponse(const ResponsesPlan& plan, const std::string& id,
                                       int64_t created, const ServingLimits& limits,
                                       const char* status);

// What a finished response (plan.store) is kept as: the Response object, and the context with
// an id for each of this request's input items.
StoredResponse ResponseToStore(const ResponsesPlan& plan, const std::string& id,
                               nlohmann::ordered_json response);

// Gives the items without an id one: their kind's prefix, the owner's id, `tag` and the index
// ("msg_<owner>_in0").
nlohmann::ordered_json WithItemIds(nlohmann::ordered_json items, const std::string& owner_id,
                                   const char* tag);
// A finished response's turn added to its conversation (plan.conversation), if it has one, the
// response completed (or ran out of tokens), and the conversation is still stored.
void AppendToConversation(ResponsesStore& store, const ResponsesPlan& plan,
                          const std::string& response_id, const nlohmann::ordered_json& response);
// Input items as the Responses API reads them (messages, function calls and their outputs,
// reasoning): an error naming `where[i]` for the first it cannot read.
std::optional<ApiError> CheckInputItems(const nlohmann::ordered_json& items,
                                        const std::string& where);
// Items as they are stored: each with its type, a message's string content as its text part.
nlohmann::ordered_json NormalizedInputItems(const nlohmann::ordered_json& items);

// GET /v1/responses/{id}/input_items: the list object of the stored context, newest first unless
// order=asc, `limit` (1-100, default 20) from after the item `after`. `query`: the URL's query
// string. An empty result and *error on a bad parameter.
std::string InputItemsBody(const StoredResponse& stored, const std::string& query, ApiError* error);

class ResponsesStream {
 public:
  ResponsesStream(const ResponsesPlan& plan, std::string id, int64_t created,
                  const TextCodec& codec, const ServingLimits& limits);
  // The opening events.
  std::string Start();
  // A background response's opening events instead: response.created and response.queued
  // (status queued); InProgress() is response.in_progress, when its first token comes.
  std::string Queued();
  std::string InProgress();
  // The events for one engine event; `so_far` already includes it. An aborted request (a
  // cancelled background response) closes its open item and ends without a lifecycle event;
  // final_response() then has status "cancelled".
  std::string OnEvent(const RequestEvent& event, const ChoiceResult& so_far);
  // The generation failed: response.failed.
  std::string Failed(const std::string& message, const ChoiceResult& so_far);
  // The Response object the last event carried (completed, incomplete or failed); null before.
  const nlohmann::ordered_json& final_response() const { return final_; }
  ~ResponsesStream();

 private:
  // The output item being written: reasoning, the message (kText), or a function call.
  using Kind = OutputBlocks::Kind;
  std::string Event(const char* type, nlohmann::ordered_json body);
  // Closes the open item and opens a new one (output_item.added; content_part.added for text).
  std::string Open(Kind kind, const std::string& call_id, const std::string& name);
  // A piece of the open item's text or arguments (its delta event).
  std::string Append(const std::string& piece);
  // The open item's done events; `finished`: the last item, whose status is the response's.
  std::string Close(const ChoiceResult* finished);
  // Moves the answer's new tokens' log-probabilities to pending_logprobs_.
  void TakeLogprobs(const ChoiceResult& so_far);

  const ResponsesPlan& plan_;
  std::string id_;
  int64_t created_;
  const TextCodec& codec_;
  const ServingLimits& limits_;
  int64_t sequence_ = 0;
  // output_logprobs: the message's log-probabilities so far, and those not yet sent with a delta.
  nlohmann::ordered_json message_logprobs_ = nlohmann::ordered_json::array();
  nlohmann::ordered_json pending_logprobs_ = nlohmann::ordered_json::array();
  size_t logprobs_seen_ = 0;  // tokens whose log-probabilities have been looked at
  OutputBlocks blocks_;
  nlohmann::ordered_json items_ =
      nlohmann::ordered_json::array();  // the output so far, the open item last
  Kind open_ = Kind::kNone;
  std::string text_;  // the open item's text or arguments so far
  nlohmann::ordered_json final_;
};

}  // namespace sy::serve
