// libFuzzer target for what a client controls: raw bytes through Beast's HTTP request parser
// (with the server's limits), and request bodies through the OpenAI request validation, the
// tokenize/detokenize handlers and the response writers. Any input must give a result or a
// clean error — no crash, no undefined behaviour, no invalid UTF-8 in a response.
#include <boost/beast/http.hpp>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "serve/openai_api.h"
#include "serve/responses_api.h"
#include "tokenizer/unicode.h"

namespace {

const sy::TextCodec& Codec() {
  static const sy::TextCodec codec = [] {
    auto c = sy::TextCodec::Load(SY_FUZZ_TOKENIZER_DIR);
    if (!c.ok()) std::abort();
    return std::move(c).value();
  }();
  return codec;
}

void CheckUtf8(const std::string& text) {
  if (sy::FindInvalidUtf8(text) != std::string_view::npos) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  namespace http = boost::beast::http;
  const std::string input(reinterpret_cast<const char*>(data) + 1, size - 1);
  sy::serve::ServingLimits limits;
  limits.model_name = "fuzz";
  limits.max_model_len = 4096;
  limits.cache_tokens = 4096;
  std::string body = input;
  if (data[0] & 1) {
    // As bytes on the wire.
    http::request_parser<http::string_body> parser;
    parser.body_limit(1 << 16);
    parser.eager(true);
    boost::beast::error_code ec;
    parser.put(boost::asio::buffer(input), ec);
    if (ec || !parser.is_done()) return 0;
    body = parser.get().body();
  }
  const sy::TextCodec& codec = Codec();
  if (data[0] & 4) {
    // The Responses API: its parser, the Response object and the typed events.
    sy::serve::ParsedResponsesRequest responses =
        sy::serve::ParseResponsesRequest(body, codec, limits);
    if (!responses.plan) {
      CheckUtf8(sy::serve::ErrorBody(responses.error));
      if (responses.error.status < 400 || responses.error.status > 599) std::abort();
      return 0;
    }
    if (responses.plan->chat.choices() != 1) std::abort();
    sy::serve::ChoiceResult result;
    result.tokens = {5, 300};
    result.text = "x\xF0\x9F";  // a partial character must not leak out raw
    result.finish_reason = (data[0] & 8) ? "length" : "stop";
    sy::RequestEvent event;
    event.text = result.text;
    event.finish_reason = result.finish_reason;
    CheckUtf8(sy::serve::ResponsesBody(*responses.plan, result, "resp_1", 0, limits));
    sy::serve::ResponsesStream stream(*responses.plan, "resp_1", 0, limits);
    CheckUtf8(stream.Start() + stream.OnEvent(event, result) + stream.Failed("x", result));
    return 0;
  }
  const auto endpoint =
      (data[0] & 2) ? sy::serve::Endpoint::kChat : sy::serve::Endpoint::kCompletions;
  sy::serve::ParsedRequest parsed =
      sy::serve::ParseGenerationRequest(endpoint, body, codec, limits);
  if (parsed.plan) {
    const auto& plan = *parsed.plan;
    if (plan.prompts.empty() || plan.choices() <= 0 || plan.choices() > 16 * 4096) std::abort();
    std::vector<sy::serve::ChoiceResult> results(plan.choices());
    sy::RequestEvent event;
    event.token_ids = {5, 300};
    event.text = "x\xF0\x9F";  // a partial character must not leak out raw
    event.logprobs = {{5, -1.0f, {{5, -1.0f}}}, {300, -2.0f, {}}};
    for (auto& r : results) {
      r.tokens = event.token_ids;
      r.text = "ok";
      r.logprobs = event.logprobs;
      r.finish_reason = "length";
      r.prompt_tokens = 3;
    }
    CheckUtf8(sy::serve::ResponseBody(plan, results, "id", 0, codec, limits));
    CheckUtf8(sy::serve::StreamChunk(plan, 0, event, results[0], true, "id", 0, codec, limits));
  } else {
    CheckUtf8(sy::serve::ErrorBody(parsed.error));
    if (parsed.error.status < 400 || parsed.error.status > 599) std::abort();
  }
  sy::serve::ApiError error;
  std::string tokenized = sy::serve::TokenizeResponse(body, codec, limits, &error);
  CheckUtf8(tokenized);
  std::string detokenized = sy::serve::DetokenizeResponse(body, codec, &error);
  CheckUtf8(detokenized);
  return 0;
}
