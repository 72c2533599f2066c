// libFuzzer target for what a client controls: raw bytes through Beast's HTTP request parser
// (with the server's limits), and request bodies through the OpenAI request validation (tools and
// tool_choice included), the tokenize/detokenize handlers and the response writers. Any input
// must give a result or a clean error — no crash, no undefined behaviour, no invalid UTF-8 in a
// response. Inputs whose first byte has bit 2 set are also model output for the chat output
// parsers (tool calls in both formats, reasoning): split at points the input picks, the streamed
// deltas must add up to the same result as one chunk. With bit 5 the Responses API runs with a
// store holding "resp_1" (previous_response_id, the stored response written back), and the input
// is also an input-items query string, and the body goes through the Conversations API. With bit 6
// the body goes to Anthropic's Messages API (the request, count_tokens, the Message object and its
// events, the error body); with bit 5 as well, a thread reply "msg_1" is stored to continue. With
// bit 7 the input is a Content-Type line and a body for the Files API's multipart upload; with
// bits 7 and 6 it is the body of an Anthropic message batch's create call.
#include <boost/beast/http.hpp>
#include <cstdint>
#include <cstdlib>
#include <set>
#include <string>

#include "chat_output/chat_output.h"
#include "serve/batches.h"
#include "serve/conversations_api.h"
#include "serve/files_api.h"
#include "serve/messages_api.h"
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

// A store with one response in it, "resp_1": a user message and the assistant's answer.
sy::serve::ResponsesStore& Store() {
  static sy::serve::ResponsesStore* store = [] {
    auto* s = new sy::serve::ResponsesStore(1 << 20);
    sy::serve::StoredResponse stored;
    stored.context = nlohmann::ordered_json::parse(
        R"([{"id": "msg_1_in0", "type": "message", "role": "user",
             "content": [{"type": "input_text", "text": "hi"}]}])");
    stored.response = nlohmann::ordered_json::parse(
        R"({"id": "resp_1", "object": "response", "output": [{"id": "msg_1_0", "type": "message",
            "role": "assistant", "status": "completed",
            "content": [{"type": "output_text", "text": "hello", "annotations": []}]},
           {"id": "fc_1_1", "type": "function_call", "call_id": "call_1", "name": "f",
            "arguments": "{}", "status": "completed"}]})");
    s->Put("resp_1", std::move(stored));
    // An Anthropic thread's reply, "msg_1": the thread's system, tools and messages.
    sy::serve::StoredResponse thread;
    thread.context = nlohmann::ordered_json::parse(
        R"({"system": "s", "tools": [{"name": "f", "input_schema": {"type": "object"}}],
            "messages": [{"role": "user", "content": "hi"}]})");
    thread.response = nlohmann::ordered_json::parse(
        R"({"id": "msg_1", "type": "message", "role": "assistant", "content": [
            {"type": "text", "text": "hello"},
            {"type": "tool_use", "id": "call_1", "name": "f", "input": {}}]})");
    s->Put("msg_1", std::move(thread));
    // A conversation, "conv_1", with one item.
    sy::serve::StoredResponse conversation;
    conversation.response = nlohmann::ordered_json::parse(
        R"({"id": "conv_1", "object": "conversation", "created_at": 0, "metadata": {}})");
    conversation.context = nlohmann::ordered_json::parse(
        R"([{"id": "msg_1_in0", "type": "message", "role": "user",
             "content": [{"type": "input_text", "text": "hi"}]}])");
    s->Put("conv_1", std::move(conversation));
    return s;
  }();
  return *store;
}

struct Assembled {
  std::string reasoning, content, calls;
  bool operator==(const Assembled&) const = default;
};

Assembled Stream(const sy::chat_output::ChatOutputOptions& options, std::string_view text,
                 uint8_t seed, bool budget_cut) {
  sy::chat_output::ChatOutputParser parser(options);
  Assembled a;
  auto add = [&](const sy::chat_output::OutputDelta& d) {
    a.reasoning += d.reasoning;
    a.content += d.content;
    for (const auto& t : d.tool_calls)
      a.calls += std::to_string(t.index) + (t.name ? "name:" + *t.name : "") + t.arguments + "|";
  };
  size_t at = 0, step = seed % 7;
  while (at < text.size()) {
    const size_t n = seed == 0 ? text.size() : 1 + (at * 31 + step) % 9;
    add(parser.Feed(text.substr(at, n)));
    at += n;
  }
  add(parser.Finish(budget_cut));
  // Call boundaries differ between splits; compare per-call text only.
  return a;
}

void CheckChatOutput(std::string_view text, uint8_t seed) {
  using namespace sy::chat_output;
  constexpr ToolCallFormat kFormats[] = {ToolCallFormat::kDeepSeekV3, ToolCallFormat::kDeepSeekV31,
                                         ToolCallFormat::kKimiK2, ToolCallFormat::kDeepSeekV32};
  for (int variant = 0; variant < 16; ++variant) {
    ChatOutputOptions options;
    options.tool_format = kFormats[variant & 3];
    options.reasoning = variant & 4;
    options.starts_in_reasoning = variant & 4;
    const bool budget_cut = variant & 8;  // finish_reason "length"
    const Assembled whole = Stream(options, text, 0, budget_cut);
    const Assembled split = Stream(options, text, seed | 1, budget_cut);
    if (whole.reasoning != split.reasoning || whole.content != split.content) std::abort();
    (void)ParseChatOutput(options, text, budget_cut);
  }
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
  limits.tool_format = sy::chat_output::ToolCallFormat::kDeepSeekV3;
  limits.auto_tool_choice = true;
  limits.exclude_tools_when_tool_choice_none = data[0] & 16;
  if (data[0] & 8) limits.reasoning = sy::chat_output::ReasoningFormat::kDeepSeekR1;
  if (data[0] & 4) CheckChatOutput(input, data[0]);
  if ((data[0] & 128) && (data[0] & 64)) {
    // A message batch's requests: refused with a 400, or kept as lines of {"custom_id",
    // "params"} with each custom_id once.
    sy::serve::ApiError error;
    auto lines = sy::serve::MessageBatchRequestLines(input, &error);
    if (!lines) {
      if (error.status != 400) std::abort();
      CheckUtf8(sy::serve::MessagesErrorBody(error));
      return 0;
    }
    CheckUtf8(*lines);
    std::set<std::string> ids;
    for (size_t at = 0; at < lines->size();) {
      const size_t end = lines->find('\n', at);
      if (end == std::string::npos) std::abort();  // every line ends
      const auto line = nlohmann::json::parse(lines->substr(at, end - at), nullptr, false);
      if (!line.is_object() || line.size() != 2 || !line["params"].is_object() ||
          !ids.insert(line["custom_id"].get<std::string>()).second)
        std::abort();
      at = end + 1;
    }
    if (ids.empty()) std::abort();
    return 0;
  }
  if (data[0] & 128) {
    // A multipart upload: the parts lie inside the body, and the Files API answers with a file
    // or a clean error.
    const size_t line = input.find('\n');
    const std::string type = input.substr(0, line);
    const std::string upload = line == std::string::npos ? "" : input.substr(line + 1);
    auto parts = sy::serve::ParseMultipart(type, upload);
    if (parts.ok())
      for (const auto& part : *parts)
        if (part.data.size() > upload.size()) std::abort();
    static sy::serve::FileStore files(1 << 16);
    sy::serve::ApiReply reply = sy::serve::FilesRequest(files, "POST", "", "", type, upload, 0);
    if (!reply.ok() && (reply.error.status < 400 || reply.error.status > 599)) std::abort();
    if (reply.ok()) {
      const auto object = nlohmann::ordered_json::parse(reply.body);
      sy::serve::FilesRequest(files, "DELETE", "/" + object["id"].get<std::string>(), "", "", "",
                              0);
    }
    return 0;
  }
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
  if (data[0] & 64) {
    sy::serve::ApiError error;
    CheckUtf8(sy::serve::CountTokensBody(body, codec, limits, &error));
    sy::serve::ParsedMessagesRequest messages =
        sy::serve::ParseMessagesRequest(body, codec, limits, (data[0] & 32) ? &Store() : nullptr);
    if (!messages.plan) {
      CheckUtf8(sy::serve::MessagesErrorBody(messages.error));
      if (messages.error.status < 400 || messages.error.status > 599) std::abort();
      return 0;
    }
    if (messages.plan->chat.choices() != 1) std::abort();
    sy::serve::ChoiceResult result;
    result.tokens = {5, 300};
    result.text =
        "ok</"
        "think>x<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{"
        "\xF0\x9F";
    result.finish_reason = (data[0] & 8) ? "length" : "stop";
    result.prompt_tokens = 3;
    CheckUtf8(sy::serve::DumpJson(
        sy::serve::MessageObject(messages.plan->chat, result, "msg_1", limits)));
    if (messages.plan->thread)
      CheckUtf8(
          sy::serve::MessageToStore(*messages.plan, nlohmann::ordered_json::object())
              .context.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace));
    sy::serve::MessagesStream stream(messages.plan->chat, "msg_1", limits);
    sy::RequestEvent event;
    event.text = result.text;
    event.first = true;
    event.finish_reason = result.finish_reason;
    CheckUtf8(stream.OnEvent(event, result) + stream.Failed("x"));
    return 0;
  }
  if (data[0] & 4) {
    // The Responses API: its parser, the Response object and the typed events.
    sy::serve::ResponsesStore* store = (data[0] & 32) ? &Store() : nullptr;
    if (store) {
      sy::serve::ApiError error;
      CheckUtf8(sy::serve::InputItemsBody(*store->Get("resp_1"), input, &error));
      // The Conversations API: the body as a create, an items create and an update, the input
      // as an items query. Each answers or refuses with a 4xx.
      for (const auto& [method, path] : {std::pair<const char*, const char*>{"POST", ""},
                                         {"POST", "/conv_1/items"},
                                         {"POST", "/conv_1"},
                                         {"GET", "/conv_1/items"},
                                         {"GET", "/conv_1/items/msg_1_in0"}}) {
        const sy::serve::ConversationsReply reply =
            sy::serve::ConversationsRequest(*store, method, path, input, body, "conv_2", 0);
        if (reply.status != 200 && (reply.status < 400 || reply.status > 499)) std::abort();
        CheckUtf8(reply.status == 200 ? reply.body : sy::serve::ErrorBody(reply.error));
      }
    }
    sy::serve::ParsedResponsesRequest responses =
        sy::serve::ParseResponsesRequest(body, codec, limits, store);
    if (!responses.plan) {
      CheckUtf8(sy::serve::ErrorBody(responses.error));
      if (responses.error.status < 400 || responses.error.status > 599) std::abort();
      return 0;
    }
    if (responses.plan->chat.choices() != 1) std::abort();
    sy::serve::ChoiceResult result;
    result.tokens = {5, 300};
    result.logprobs = {{5, -1.0f, {{5, -1.0f}}}, {300, -2.0f, {}}};
    result.text = "x\xF0\x9F";  // a partial character must not leak out raw
    result.finish_reason = (data[0] & 8) ? "length" : "stop";
    sy::RequestEvent event;
    event.text = result.text;
    event.finish_reason = result.finish_reason;
    CheckUtf8(sy::serve::ResponsesBody(*responses.plan, result, "resp_2", 0, codec, limits));
    if (responses.plan->store)
      CheckUtf8(
          sy::serve::ResponseToStore(
              *responses.plan, "resp_2",
              sy::serve::ResponsesObject(*responses.plan, result, "resp_2", 0, codec, limits))
              .context.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace));
    sy::serve::ResponsesStream stream(*responses.plan, "resp_1", 0, codec, limits);
    CheckUtf8(stream.Start() + stream.Queued() + stream.InProgress() +
              stream.OnEvent(event, result) + stream.Failed("x", result));
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
      r.text =
          "ok</"
          "think><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{}";
      r.logprobs = event.logprobs;
      r.finish_reason = "length";
      r.prompt_tokens = 3;
    }
    CheckUtf8(sy::serve::ResponseBody(plan, results, "id", 0, codec, limits));
    CheckUtf8(sy::serve::StreamChunk(plan, 0, event, results[0], true, "id", 0, codec, limits));
    event.finish_reason = "stop";
    CheckUtf8(sy::serve::StreamChunk(plan, 0, event, results[0], false, "id", 0, codec, limits));
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
