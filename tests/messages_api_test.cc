// Anthropic's Messages API (serve/messages_api.h) without a model: what a request's blocks
// become (the same prompt as the chat request they amount to), what is refused and how it is
// named, the Message object and the streamed events. The wire behaviour against the official
// anthropic client is tests/serve/test_anthropic.py.
#include "serve/messages_api.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace sy::serve {
namespace {

using json = nlohmann::ordered_json;

const TextCodec& Codec() {
  static const TextCodec codec = [] {
    auto c = TextCodec::Load(std::string(SY_FIXTURES_DIR) + "/tokenizer/deepseek-v3");
    EXPECT_TRUE(c.ok()) << c.status().message();
    return std::move(c).value();
  }();
  return codec;
}

ServingLimits Limits() {
  ServingLimits limits;
  limits.model_name = "sy-test";
  limits.max_model_len = 4096;
  limits.cache_tokens = 8192;
  limits.tool_format = chat_output::ToolCallFormat::kDeepSeekV3;
  limits.auto_tool_choice = true;
  return limits;
}

const char* kCallText =
    "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n"
    "{\"city\": \"Paris\"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>";

const json kTool = json::parse(R"({"name": "get_weather", "description": "The weather.",
  "input_schema": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}})");

GenerationPlan Plan(const json& body, const ServingLimits& limits = Limits()) {
  ParsedMessagesRequest parsed = ParseMessagesRequest(body.dump(), Codec(), limits);
  EXPECT_TRUE(parsed.plan) << parsed.error.message;
  return parsed.plan ? parsed.plan->chat : GenerationPlan{};
}

ApiError Refusal(const json& body, ResponsesStore* store = nullptr) {
  ParsedMessagesRequest parsed = ParseMessagesRequest(body.dump(), Codec(), Limits(), store);
  EXPECT_FALSE(parsed.plan) << body.dump();
  return parsed.error;
}

// The events of an SSE text, in order.
std::vector<json> Events(const std::string& text) {
  std::vector<json> out;
  size_t at = 0;
  while ((at = text.find("data: ", at)) != std::string::npos) {
    const size_t end = text.find("\n\n", at);
    out.push_back(json::parse(text.substr(at + 6, end - at - 6)));
    // The event line names the same type as the data.
    const size_t line = text.rfind("event: ", at);
    EXPECT_EQ(text.substr(line + 7, text.find('\n', line) - line - 7),
              out.back()["type"].get<std::string>());
    at = end;
  }
  return out;
}

TEST(MessagesApiTest, BlocksBecomeTheChatConversationTheyAmountTo) {
  // System blocks, text blocks, an earlier tool call and its result: the prompt is the one the
  // equivalent chat request renders.
  const json body = {
      {"model", "sy-test"},
      {"max_tokens", 64},
      {"system", json::array({{{"type", "text"}, {"text", "Be brief. "}},
                              {{"type", "text"},
                               {"text", "Use tools."},
                               {"cache_control", {{"type", "ephemeral"}}}}})},
      {"tools", json::array({kTool})},
      {"messages",
       json::array(
           {{{"role", "user"},
             {"content", json::array({{{"type", "text"}, {"text", "Weather in"}},
                                      {{"type", "text"}, {"text", "Paris?"}}})}},
            {{"role", "assistant"},
             {"content",
              json::array({{{"type", "thinking"}, {"thinking", "hmm"}, {"signature", "s"}},
                           {{"type", "tool_use"},
                            {"id", "toolu_1"},
                            {"name", "get_weather"},
                            {"input", {{"city", "Paris"}}}}})}},
            {{"role", "user"},
             {"content",
              json::array({{{"type", "tool_result"},
                            {"tool_use_id", "toolu_1"},
                            {"content", json::array({{{"type", "text"}, {"text", "Sunny"}}})}},
                           {{"type", "text"}, {"text", "Thanks."}}})}}})}};
  const GenerationPlan plan = Plan(body);
  const json messages = json::parse(R"([
    {"role": "system", "content": "Be brief. Use tools."},
    {"role": "user", "content": "Weather in\nParis?"},
    {"role": "assistant", "content": null, "tool_calls": [{"id": "toolu_1", "type": "function",
      "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}]},
    {"role": "tool", "tool_call_id": "toolu_1", "content": "Sunny"},
    {"role": "user", "content": "Thanks."}])");
  const json tools = json::array({{{"type", "function"},
                                   {"function",
                                    {{"name", "get_weather"},
                                     {"description", "The weather."},
                                     {"parameters", kTool["input_schema"]}}}}});
  ChatOptions options;
  options.tools = &tools;
  auto expected = Codec().EncodeChat(messages, options);
  ASSERT_TRUE(expected.ok()) << expected.status().message();
  ASSERT_EQ(plan.prompts.size(), 1u);
  EXPECT_EQ(plan.prompts[0], expected.value());
  EXPECT_EQ(plan.params.max_tokens, 64);
  EXPECT_TRUE(plan.parse_output);  // tool calls are split out of the output
  // count_tokens counts that prompt, without max_tokens.
  json count = body;
  count.erase("max_tokens");
  ApiError error;
  const std::string counted = CountTokensBody(count.dump(), Codec(), Limits(), &error);
  ASSERT_FALSE(counted.empty()) << error.message;
  EXPECT_EQ(json::parse(counted)["input_tokens"], expected.value().size());
}

TEST(MessagesApiTest, AFinalAssistantMessageIsContinued) {
  // Anthropic's prefill: the prompt ends where the assistant's text does (transformers'
  // continue_final_message), with no end of turn and no new assistant tag.
  const json body = {
      {"model", "sy-test"},
      {"max_tokens", 8},
      {"messages",
       json::array(
           {{{"role", "user"}, {"content", "Pick (A) or (B)"}},
            {{"role", "assistant"},
             {"content", json::array({{{"type", "text"}, {"text", "The answer is ("}}})}}})}};
  const GenerationPlan plan = Plan(body);
  ChatOptions options;
  options.add_generation_prompt = false;
  options.continue_final_message = true;
  const json messages = {{{"role", "user"}, {"content", "Pick (A) or (B)"}},
                         {{"role", "assistant"}, {"content", "The answer is ("}}};
  auto rendered = Codec().RenderChat(messages, options);
  ASSERT_TRUE(rendered.ok()) << rendered.status().message();
  EXPECT_TRUE(rendered->ends_with("<｜Assistant｜>The answer is (")) << *rendered;
  EXPECT_EQ(plan.prompts[0], Codec().tokenizer->Encode(*rendered).value());
  // With a reasoning parser, a prefill that opened a think block continues inside it.
  ServingLimits limits = Limits();
  limits.reasoning = chat_output::ReasoningFormat::kDeepSeekR1;
  json thinking = body;
  thinking["messages"][1]["content"] = "<think>Let me see";
  EXPECT_TRUE(Plan(thinking, limits).output.starts_in_reasoning);
  EXPECT_FALSE(Plan(body, limits).output.starts_in_reasoning);
}

TEST(MessagesApiTest, ToolChoiceAndSamplingMapToTheChatPath) {
  json body = {{"model", "sy-test"},
               {"max_tokens", 8},
               {"tools", json::array({kTool})},
               {"stop_sequences", {"END"}},
               {"temperature", 0},
               {"top_k", 5},
               {"messages", json::array({{{"role", "user"}, {"content", "hi"}}})}};
  GenerationPlan plan = Plan(body);
  EXPECT_EQ(plan.params.temperature, 0.0f);
  EXPECT_EQ(plan.params.top_k, 5);
  ASSERT_EQ(plan.params.stop.size(), 1u);
  EXPECT_EQ(plan.params.stop[0], "END");
  EXPECT_FALSE(plan.params.grammar);  // auto: the model decides
  // any and tool force a call (a grammar); disable_parallel_tool_use allows one.
  body["tool_choice"] = {{"type", "any"}, {"disable_parallel_tool_use", true}};
  plan = Plan(body);
  ASSERT_TRUE(plan.params.grammar);
  ASSERT_TRUE(plan.tools);
  EXPECT_EQ(plan.tools->max_calls(), 1);
  body["tool_choice"] = {{"type", "tool"}, {"name", "get_weather"}};
  EXPECT_TRUE(Plan(body).params.grammar);
  body["tool_choice"] = {{"type", "none"}};
  EXPECT_FALSE(Plan(body).params.grammar);
  // output_config.format is a JSON-schema constraint.
  body.erase("tools");
  body.erase("tool_choice");
  body["output_config"] = {{"format", {{"type", "json_schema"}, {"schema", {{"type", "object"}}}}}};
  plan = Plan(body);
  ASSERT_TRUE(plan.params.grammar);
  EXPECT_EQ(plan.params.grammar->kind, structured::GrammarSpec::Kind::kJsonSchema);
}

// thinking.budget_tokens is the reasoning budget the engine enforces (vLLM maps it the same way).
TEST(MessagesApiTest, ThinkingBudgetBecomesTheReasoningBudget) {
  json body = {{"model", "sy-test"},
               {"max_tokens", 2000},
               {"messages", json::array({{{"role", "user"}, {"content", "hi"}}})},
               {"thinking", {{"type", "enabled"}, {"budget_tokens", 1500}}}};
  EXPECT_EQ(Plan(body).params.thinking_token_budget, 1500);
  body["thinking"] = {{"type", "adaptive"}};
  EXPECT_FALSE(Plan(body).params.thinking_token_budget.has_value());
  // output_config.effort is the chat path's reasoning_effort; budget_tokens rules over it.
  ServingLimits limits = Limits();
  limits.effort_budgets["low"] = 300;
  body["output_config"] = {{"effort", "low"}};
  EXPECT_EQ(Plan(body, limits).params.thinking_token_budget, 300);
  body["thinking"] = {{"type", "enabled"}, {"budget_tokens", 1500}};
  EXPECT_EQ(Plan(body, limits).params.thinking_token_budget, 1500);
}

TEST(MessagesApiTest, RefusalsNameTheFieldInAnthropicsShape) {
  const json base = {{"model", "sy-test"},
                     {"max_tokens", 8},
                     {"messages", json::array({{{"role", "user"}, {"content", "hi"}}})}};
  auto with = [&](const char* key, json value) {
    json body = base;
    body[key] = std::move(value);
    return body;
  };
  json body = base;
  body.erase("max_tokens");
  EXPECT_EQ(Refusal(body).param, "max_tokens");
  EXPECT_EQ(Refusal(with("max_tokens", 0)).param, "max_tokens");
  EXPECT_EQ(Refusal(with("frequency_penalty", 1)).param, "frequency_penalty");
  EXPECT_EQ(Refusal(with("mcp_servers", json::array())).param, "mcp_servers");
  EXPECT_EQ(Refusal(with("output_config", {{"effort", "extreme"}})).param, "output_config.effort");
  EXPECT_EQ(Refusal(with("stop_sequences", "END")).param, "stop_sequences");
  EXPECT_EQ(Refusal(with("thinking", {{"type", "enabled"}, {"budget_tokens", 100}})).param,
            "thinking.budget_tokens");
  EXPECT_EQ(Refusal(with("thinking", {{"type", "enabled"}, {"budget_tokens", 2048}})).message,
            "thinking.budget_tokens: must be less than max_tokens");
  EXPECT_EQ(Refusal(with("tools",
                         json::array({{{"type", "web_search_20250305"}, {"name", "web_search"}}})))
                .param,
            "tools[0].type");
  json bad_schema = kTool;
  bad_schema["input_schema"] = "not a schema";
  EXPECT_EQ(Refusal(with("tools", json::array({bad_schema}))).param.rfind("tools[0]", 0), 0u);
  EXPECT_EQ(Refusal(with("model", "claude-sonnet")).status, 404);
  // Content the model cannot read, and a prefill, are refused where they are.
  const ApiError image = Refusal(with(
      "messages",
      json::array({{{"role", "user"},
                    {"content", json::array({{{"type", "image"},
                                              {"source", {{"type", "url"}, {"url", "x"}}}}})}}})));
  EXPECT_EQ(image.param, "messages[0].content[0].type");
  EXPECT_NE(image.message.find("text only"), std::string::npos);
  const ApiError prefilled_call = Refusal(
      with("messages", json::array({{{"role", "user"}, {"content", "hi"}},
                                    {{"role", "assistant"},
                                     {"content", json::array({{{"type", "tool_use"},
                                                               {"id", "t"},
                                                               {"name", "f"},
                                                               {"input", json::object()}}})}}})));
  EXPECT_EQ(prefilled_call.param, "messages[1].content");
  EXPECT_EQ(Refusal(with("messages", json::array({{{"role", "robot"}, {"content", "hi"}}}))).param,
            "messages[0].role");
  EXPECT_EQ(ParseMessagesRequest("{", Codec(), Limits()).error.status, 400);
  EXPECT_EQ(ParseMessagesRequest("[1]", Codec(), Limits()).error.status, 400);
  // Anthropic's error shape; the type follows the status.
  const json error = json::parse(MessagesErrorBody({400, "x: bad", "x", "invalid_value"}));
  EXPECT_EQ(error, json::parse(R"({"type": "error", "error": {"type": "invalid_request_error",
                                   "message": "x: bad"}})"));
  EXPECT_EQ(json::parse(MessagesErrorBody({404, "m", "", ""}))["error"]["type"], "not_found_error");
  EXPECT_EQ(json::parse(MessagesErrorBody({401, "m", "", ""}))["error"]["type"],
            "authentication_error");
  EXPECT_EQ(json::parse(MessagesErrorBody({503, "m", "", ""}))["error"]["type"],
            "overloaded_error");
  EXPECT_EQ(json::parse(MessagesErrorBody({500, "m", "", ""}))["error"]["type"], "api_error");
}

TEST(MessagesApiTest, MessageObjectSaysWhyItStopped) {
  const json body = {{"model", "sy-test"},
                     {"max_tokens", 64},
                     {"tools", json::array({kTool})},
                     {"messages", json::array({{{"role", "user"}, {"content", "hi"}}})}};
  const GenerationPlan plan = Plan(body);
  ChoiceResult r;
  r.text = std::string("Let me look.") + kCallText;
  r.tokens = {1, 2, 3};
  r.finish_reason = "stop";
  r.prompt_tokens = 40;
  r.cached_tokens = 32;
  json m = MessageObject(plan, r, "msg_1", Limits());
  EXPECT_EQ(m["id"], "msg_1");
  EXPECT_EQ(m["type"], "message");
  EXPECT_EQ(m["role"], "assistant");
  EXPECT_EQ(m["model"], "sy-test");
  ASSERT_EQ(m["content"].size(), 2u) << m.dump();
  EXPECT_EQ(m["content"][0], json::parse(R"({"type": "text", "text": "Let me look."})"));
  EXPECT_EQ(m["content"][1]["type"], "tool_use");
  EXPECT_EQ(m["content"][1]["name"], "get_weather");
  EXPECT_EQ(m["content"][1]["input"], json::parse(R"({"city": "Paris"})"));
  EXPECT_EQ(m["stop_reason"], "tool_use");
  EXPECT_EQ(m["usage"], json::parse(R"({"input_tokens": 8, "cache_creation_input_tokens": 0,
                                        "cache_read_input_tokens": 32, "output_tokens": 3})"));
  // A stop string; the budget.
  r.text = "Sunny";
  r.stop_string = "END";
  m = MessageObject(plan, r, "msg_1", Limits());
  EXPECT_EQ(m["stop_reason"], "stop_sequence");
  EXPECT_EQ(m["stop_sequence"], "END");
  r.stop_string.reset();
  m = MessageObject(plan, r, "msg_1", Limits());
  EXPECT_EQ(m["stop_reason"], "end_turn");
  EXPECT_TRUE(m["stop_sequence"].is_null());
  r.finish_reason = "length";
  EXPECT_EQ(MessageObject(plan, r, "msg_1", Limits())["stop_reason"], "max_tokens");
  // A call the budget cut: still a tool_use block, its input what can be read (nothing yet).
  r.text = std::string(kCallText).substr(0, std::string(kCallText).find("\"Paris\""));
  m = MessageObject(plan, r, "msg_1", Limits());
  EXPECT_EQ(m["stop_reason"], "max_tokens");
  ASSERT_EQ(m["content"].size(), 1u) << m.dump();
  EXPECT_EQ(m["content"][0]["type"], "tool_use");
  EXPECT_EQ(m["content"][0]["input"], json::object());
}

// Streams `text` in pieces of `step` bytes and checks the events against the Message object of
// the same output.
void CheckStream(const GenerationPlan& plan, const std::string& text, size_t step,
                 const char* finish) {
  MessagesStream stream(plan, "msg_1", Limits());
  ChoiceResult so_far;
  std::string sse;
  for (size_t at = 0; at < text.size(); at += step) {
    RequestEvent e;
    e.text = text.substr(at, step);
    e.token_ids = {7};
    e.first = at == 0;
    e.prompt_tokens = 20;
    e.cached_tokens = 16;
    if (at + step >= text.size()) e.finish_reason = finish;
    so_far.text += e.text;
    so_far.tokens.push_back(7);
    if (e.first) {
      so_far.prompt_tokens = 20;
      so_far.cached_tokens = 16;
    }
    if (e.finish_reason) so_far.finish_reason = *e.finish_reason;
    sse += stream.OnEvent(e, so_far);
  }
  const std::vector<json> events = Events(sse);
  ASSERT_GE(events.size(), 4u);
  EXPECT_EQ(events[0]["type"], "message_start");
  EXPECT_EQ(events[0]["message"]["usage"]["input_tokens"], 4);
  EXPECT_EQ(events[0]["message"]["usage"]["cache_read_input_tokens"], 16);
  EXPECT_EQ(events[1]["type"], "ping");
  EXPECT_EQ(events[events.size() - 2]["type"], "message_delta");
  EXPECT_EQ(events.back()["type"], "message_stop");
  // Rebuild the content from the block events, as the SDK does.
  json content = json::array();
  std::vector<std::string> json_text;
  int open = -1;
  for (size_t i = 2; i + 2 < events.size(); ++i) {
    const json& e = events[i];
    if (e["type"] == "content_block_start") {
      ASSERT_EQ(open, -1) << "a block opened inside another";
      open = e["index"];
      ASSERT_EQ(open, static_cast<int>(content.size()));
      content.push_back(e["content_block"]);
      json_text.emplace_back();
    } else if (e["type"] == "content_block_delta") {
      ASSERT_EQ(e["index"], open);
      json& block = content[open];
      const json& d = e["delta"];
      if (d["type"] == "text_delta")
        block["text"] = block["text"].get<std::string>() + d["text"].get<std::string>();
      if (d["type"] == "thinking_delta")
        block["thinking"] = block["thinking"].get<std::string>() + d["thinking"].get<std::string>();
      if (d["type"] == "signature_delta") block["signature"] = d["signature"];
      if (d["type"] == "input_json_delta") json_text[open] += d["partial_json"].get<std::string>();
    } else {
      ASSERT_EQ(e["type"], "content_block_stop");
      ASSERT_EQ(e["index"], open);
      if (content[open]["type"] == "tool_use")
        content[open]["input"] = json::parse(json_text[open], nullptr, false).is_object()
                                     ? json::parse(json_text[open])
                                     : json::object();
      open = -1;
    }
  }
  EXPECT_EQ(open, -1) << "a block left open";
  json whole = MessageObject(plan, so_far, "msg_1", Limits());
  // Call ids are drawn at random: each is checked for a prefix, then left out.
  for (json* blocks : {&content, &whole["content"]})
    for (json& block : *blocks)
      if (block["type"] == "tool_use") {
        EXPECT_EQ(block["id"].get<std::string>().rfind("call_", 0), 0u);
        block.erase("id");
      }
  EXPECT_EQ(content, whole["content"]) << "step " << step;
  const json& delta = events[events.size() - 2];
  EXPECT_EQ(delta["delta"]["stop_reason"], whole["stop_reason"]);
  EXPECT_EQ(delta["usage"], whole["usage"]);
}

TEST(MessagesApiTest, StreamedEventsAddUpToTheMessage) {
  const json body = {{"model", "sy-test"},
                     {"max_tokens", 64},
                     {"tools", json::array({kTool})},
                     {"messages", json::array({{{"role", "user"}, {"content", "hi"}}})}};
  const GenerationPlan plan = Plan(body);
  const std::string text = std::string("Let me look.") + kCallText;
  for (size_t step : {1, 3, 7, 1000})
    CheckStream(plan, text, step, "stop");
  // Reasoning comes back as a thinking block, signed, before the answer.
  ServingLimits limits = Limits();
  limits.reasoning = chat_output::ReasoningFormat::kDeepSeekR1;
  ParsedMessagesRequest parsed = ParseMessagesRequest(body.dump(), Codec(), limits);
  ASSERT_TRUE(parsed.plan) << parsed.error.message;
  const std::string reasoned = "Cities have weather.</think>" + text;
  for (size_t step : {2, 5, 1000})
    CheckStream(parsed.plan->chat, reasoned, step, "stop");
  ChoiceResult reasoned_result;
  reasoned_result.text = reasoned;
  reasoned_result.finish_reason = "stop";
  const json whole = MessageObject(parsed.plan->chat, reasoned_result, "msg_1", limits);
  ASSERT_EQ(whole["content"].size(), 3u) << whole.dump();
  EXPECT_EQ(whole["content"][0]["type"], "thinking");
  EXPECT_EQ(whole["content"][0]["thinking"], "Cities have weather.");
  EXPECT_FALSE(whole["content"][0]["signature"].get<std::string>().empty());
  // A budget cut mid-call.
  CheckStream(plan, text.substr(0, text.size() - 30), 4, "length");
  // A failed generation ends in an error event.
  MessagesStream stream(plan, "msg_1", Limits());
  const std::vector<json> failed = Events(stream.Failed("generation failed: x"));
  ASSERT_EQ(failed.size(), 1u);
  EXPECT_EQ(failed[0], json::parse(R"({"type": "error", "error": {"type": "api_error",
                                        "message": "generation failed: x"}})"));
}

TEST(MessagesApiTest, AThreadContinuedIsTheConversationSentWhole) {
  ResponsesStore store(1 << 20);
  const json system = "Be brief.";
  const json first = {{"model", "sy-test"},
                      {"max_tokens", 8},
                      {"system", system},
                      {"tools", json::array({kTool})},
                      {"thread", {{"type", "create"}}},
                      {"messages", json::array({{{"role", "user"}, {"content", "Weather?"}}})}};
  ParsedMessagesRequest created = ParseMessagesRequest(first.dump(), Codec(), Limits(), &store);
  ASSERT_TRUE(created.plan) << created.error.message;
  EXPECT_TRUE(created.plan->thread);
  EXPECT_TRUE(created.plan->continues.empty());
  ChoiceResult r;
  r.text = std::string("Checking.") + kCallText;
  r.finish_reason = "stop";
  const json reply = MessageObject(created.plan->chat, r, "msg_a", Limits());
  store.Put("msg_a", MessageToStore(*created.plan, reply));
  // The next turn sends only its new message; system and tools come from the thread.
  const json result = {{"role", "user"},
                       {"content", json::array({{{"type", "tool_result"},
                                                 {"tool_use_id", reply["content"][1]["id"]},
                                                 {"content", "Sunny"}}})}};
  json next = {{"model", "sy-test"},
               {"max_tokens", 8},
               {"thread", {{"type", "continue"}, {"previous_message_id", "msg_a"}}},
               {"messages", json::array({result})}};
  ParsedMessagesRequest continued = ParseMessagesRequest(next.dump(), Codec(), Limits(), &store);
  ASSERT_TRUE(continued.plan) << continued.error.message;
  EXPECT_EQ(continued.plan->continues, "msg_a");
  json whole = first;
  whole.erase("thread");
  whole["messages"].push_back({{"role", "assistant"}, {"content", reply["content"]}});
  whole["messages"].push_back(result);
  EXPECT_EQ(continued.plan->chat.prompts, Plan(whole).prompts);
  EXPECT_EQ(continued.plan->context["messages"], whole["messages"]);
  EXPECT_EQ(continued.plan->context["system"], system);
  // Repeating system and tools is allowed; changing them is not.
  next["system"] = system;
  EXPECT_TRUE(ParseMessagesRequest(next.dump(), Codec(), Limits(), &store).plan);
  next["system"] = "Be verbose.";
  ApiError changed = Refusal(next, &store);
  EXPECT_EQ(changed.code, "thread_fingerprint_mismatch");
  EXPECT_EQ(json::parse(MessagesErrorBody(changed))["error"]["details"]["error_code"],
            "thread_fingerprint_mismatch");
  next.erase("system");
  next["thread"]["previous_message_id"] = "msg_gone";
  const ApiError missing = Refusal(next, &store);
  EXPECT_EQ(missing.status, 404);
  EXPECT_EQ(missing.code, "thread_not_found");
  // Without a store the client is told to go on without threads.
  const json unsupported = json::parse(MessagesErrorBody(Refusal(first)));
  EXPECT_EQ(unsupported["error"]["details"],
            json::parse(R"({"error_code": "thread_unsupported_request", "unsupported": []})"));
}

TEST(MessagesApiTest, MessageBatchRequestsAreCheckedAsAnthropicChecksThem) {
  ApiError error;
  const json params = {{"model", "m"}, {"max_tokens", 4}, {"messages", json::array()}};
  const json body = {{"requests",
                      {{{"custom_id", "a-1"}, {"params", params}},
                       {{"params", json::object()}, {"custom_id", "B_2"}}}}};
  auto lines = MessageBatchRequestLines(body.dump(), &error);
  ASSERT_TRUE(lines) << error.message;
  // Kept as JSONL, custom_id first; params whole (whether they are valid is each line's result).
  EXPECT_EQ(*lines, "{\"custom_id\":\"a-1\",\"params\":" + params.dump() +
                        "}\n{\"custom_id\":\"B_2\",\"params\":{}}\n");
  auto refused = [&](const json& b) {
    ApiError e;
    EXPECT_FALSE(MessageBatchRequestLines(b.dump(), &e)) << b.dump();
    EXPECT_EQ(e.status, 400);
    return e.message;
  };
  auto with = [&](json request) { return json{{"requests", {body["requests"][0], request}}}; };
  EXPECT_EQ(refused(json{{"requests", json::array()}}).rfind("requests:", 0), 0u);
  EXPECT_EQ(refused(json{{"requests", body["requests"]}, {"batch", 1}}).rfind("batch:", 0), 0u);
  EXPECT_EQ(refused(with({{"custom_id", "a-1"}, {"params", params}}))
                .rfind("requests.1.custom_id: \"a-1\" is used by an earlier request", 0),
            0u);
  for (const json& id : {json("a b"), json(std::string(65, 'x')), json(""), json(7), json("é")})
    EXPECT_EQ(
        refused(with({{"custom_id", id}, {"params", params}})).rfind("requests.1.custom_id:", 0),
        0u)
        << id;
  EXPECT_TRUE(MessageBatchRequestLines(
      with({{"custom_id", std::string(64, 'x')}, {"params", params}}).dump(), &error));
  EXPECT_EQ(refused(with({{"custom_id", "c"}, {"params", "hi"}})).rfind("requests.1.params:", 0),
            0u);
  EXPECT_EQ(refused(with({{"custom_id", "c"}, {"params", params}, {"x", 1}}))
                .rfind("requests.1.x: Extra inputs are not permitted", 0),
            0u);
  EXPECT_EQ(refused(json{{"requests", {1}}}).rfind("requests.0: each request must be an object", 0),
            0u);
  ApiError e;
  EXPECT_FALSE(MessageBatchRequestLines("{not json", &e));
  EXPECT_EQ(e.status, 400);
}

}  // namespace
}  // namespace sy::serve
