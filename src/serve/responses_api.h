// OpenAI's Responses API (/v1/responses), stateless: a request is planned as the chat request it
// amounts to (instructions and input items become messages; text.format becomes response_format)
// and run by the chat path; results are written back as a Response object or as the API's typed
// server-sent events. Nothing is stored: previous_response_id and store: true are refused, as is
// every field this server does not implement (named, never ignored). Pure functions and a small
// stream writer — the HTTP layer and the fuzzer both call them.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "serve/openai_api.h"

namespace sy::serve {

struct ResponsesPlan {
  GenerationPlan chat;   // what the engine runs (one choice)
  nlohmann::json echo;   // the request fields a Response object repeats (instructions, text, ...)
};

struct ParsedResponsesRequest {
  std::optional<ResponsesPlan> plan;
  ApiError error;
};

ParsedResponsesRequest ParseResponsesRequest(const std::string& body, const TextCodec& codec,
                                             const ServingLimits& limits);

// The Response object of a finished (non-streaming) request. `created`: seconds since the epoch.
std::string ResponsesBody(const ResponsesPlan& plan, const ChoiceResult& result,
                          const std::string& id, int64_t created, const ServingLimits& limits);

// The typed events of a streaming request, numbered by sequence_number:
//   response.created, response.in_progress, response.output_item.added,
//   response.content_part.added, then response.output_text.delta per piece of text, and at the
//   end response.output_text.done, response.content_part.done, response.output_item.done and
//   response.completed (or response.incomplete when max_output_tokens cut it short; a failed
//   generation ends with response.failed).
class ResponsesStream {
 public:
  ResponsesStream(const ResponsesPlan& plan, std::string id, int64_t created,
                  const ServingLimits& limits);
  // The opening events.
  std::string Start();
  // The events for one engine event; `so_far` already includes it.
  std::string OnEvent(const RequestEvent& event, const ChoiceResult& so_far);
  // The generation failed: response.failed.
  std::string Failed(const std::string& message, const ChoiceResult& so_far);

 private:
  std::string Event(const char* type, nlohmann::json body);

  const ResponsesPlan& plan_;
  std::string id_;
  int64_t created_;
  const ServingLimits& limits_;
  int64_t sequence_ = 0;
};

}  // namespace sy::serve
