// The gRPC instance API against the engine in the same process: a real channel over TCP, the
// generated stub, the trained default model. Streams carry the same tokens and text as the
// engine gives directly; a resumed request continues; errors name the field; a client that
// cancels has its request aborted.
#include <gtest/gtest.h>

#include <grpcpp/grpcpp.h>

#include "engine/engine.h"
#include "kernels/cpu/fast_linear.h"
#include "serve/grpc_service.h"
#include "switchyard/v1/engine.grpc.pb.h"
#include "test_support.h"

namespace sy {
namespace {

namespace pb = switchyard::v1;

// A resumed request recomputes its tokens as a prompt (expanded attention) where the
// uninterrupted one decoded them (absorbed): in f32 the two agree to ~1e-6, while bf16
// activations (the dot kernel) can flip a near-tie of this random model. Routed failover runs
// with --batch-invariant, one attention form, on either kernel (tests/serve/test_route.py).
const bool kF32Products = [] {
  kernels::GlobalKernelOptions().bf16_dot = false;
  return true;
}();

struct Instance {
  std::unique_ptr<Model> model;
  std::unique_ptr<Tokenizer> tokenizer;
  std::unique_ptr<LatentCache> cache;
  std::unique_ptr<Engine> engine;
  std::unique_ptr<serve::GrpcEngineServer> server;
  std::unique_ptr<pb::Engine::Stub> stub;

  Instance() {
    const std::string dir = std::string(SY_SOURCE_DIR) + "/models/default";
    auto loaded = Model::Load(dir);
    EXPECT_TRUE(loaded.ok()) << loaded.status().message();
    model = std::move(loaded).value();
    auto tok = Tokenizer::Load(dir);
    EXPECT_TRUE(tok.ok());
    tokenizer = std::make_unique<Tokenizer>(std::move(tok).value());
    cache = std::make_unique<LatentCache>(model->NewCache(4096, 1, DType::kF32));
    engine = std::make_unique<Engine>(*model, *cache, *tokenizer, ForwardOptions{}, EngineConfig{});
    engine->Start();
    serve::InstanceInfo info;
    info.served_model_name = "sy-test";
    info.vocab_size = model->config().vocab_size;
    info.max_model_len = engine->max_model_len();
    info.eos_token_id = static_cast<int32_t>(model->config().eos_token_id);
    server = std::make_unique<serve::GrpcEngineServer>(*engine, info);
    EXPECT_TRUE(server->Start("127.0.0.1", 0).ok());
    stub = pb::Engine::NewStub(grpc::CreateChannel("127.0.0.1:" + std::to_string(server->port()),
                                                   grpc::InsecureChannelCredentials()));
  }
  ~Instance() {
    server->Shutdown();
    engine->Stop(false);
  }

  std::vector<int32_t> Prompt(const std::string& text) const {
    auto ids = tokenizer->Encode(text);
    std::vector<int32_t> out = {0};
    out.insert(out.end(), ids->begin(), ids->end());
    return out;
  }
};

Instance& TheInstance() {
  static Instance* instance = new Instance();  // lives for the whole test program
  return *instance;
}

struct Streamed {
  std::vector<int32_t> tokens;
  std::string text;
  std::string finish;
  std::optional<std::string> stop_string;
  std::optional<int32_t> stop_token;
  int64_t prompt_tokens = -1;
  int messages = 0;
  grpc::Status status;
};

Streamed Generate(const EngineRequest& request) {
  grpc::ClientContext context;
  auto reader = TheInstance().stub->Generate(&context, serve::RequestToProto(request));
  Streamed out;
  pb::GenerateResponse response;
  while (reader->Read(&response)) {
    RequestEvent event = serve::EventFromProto(response);
    out.tokens.insert(out.tokens.end(), event.token_ids.begin(), event.token_ids.end());
    out.text += event.text;
    if (event.first) out.prompt_tokens = event.prompt_tokens;
    if (event.finish_reason) out.finish = *event.finish_reason;
    if (event.stop_string) out.stop_string = event.stop_string;
    if (event.stop_token) out.stop_token = event.stop_token;
    ++out.messages;
  }
  out.status = reader->Finish();
  return out;
}

Streamed Direct(const EngineRequest& request) {
  SubmitError why;
  auto stream = TheInstance().engine->Submit(request, &why);
  EXPECT_TRUE(stream.ok());
  Streamed out;
  std::vector<RequestEvent> events;
  while (true) {
    const bool done = stream.value()->Drain(&events);
    if (done) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  for (const auto& e : events) {
    out.tokens.insert(out.tokens.end(), e.token_ids.begin(), e.token_ids.end());
    out.text += e.text;
    if (e.finish_reason) out.finish = *e.finish_reason;
  }
  return out;
}

TEST(GrpcTest, WhatStoppedARequestCrossesTheWire) {
  EngineRequest request{"reason", TheInstance().Prompt("ROMEO: But soft, what light"), {}};
  request.params.temperature = 0;
  request.params.max_tokens = 16;
  request.params.ignore_eos = true;
  const Streamed full = Generate(request);
  ASSERT_TRUE(full.status.ok()) << full.status.error_message();
  ASSERT_GE(full.text.size(), 6u);
  EXPECT_FALSE(full.stop_string || full.stop_token);

  request.id = "reason-string";
  request.params.stop = {full.text.substr(3, 3)};
  const Streamed by_string = Generate(request);
  EXPECT_EQ(by_string.finish, "stop");
  EXPECT_EQ(by_string.stop_string, full.text.substr(3, 3));
  EXPECT_FALSE(by_string.stop_token.has_value());

  request.id = "reason-token";
  request.params.stop.clear();
  request.params.stop_token_ids = {full.tokens[2]};
  const Streamed by_token = Generate(request);
  EXPECT_EQ(by_token.finish, "stop");
  EXPECT_EQ(by_token.stop_token, full.tokens[2]);
  EXPECT_FALSE(by_token.stop_string.has_value());
}

// A grammar crosses the wire whole: kind, text, choices, and the token it begins after (a
// reasoning model's forced tool call).
TEST(GrpcTest, GrammarsCrossTheWire) {
  EngineRequest request{"grammar", {1, 2, 3}, {}};
  request.params.grammar =
      structured::GrammarSpec(structured::GrammarSpec::Kind::kStructural,
                              R"({"type": "text", "text": "x"})", {"a", "b"}, "</think>");
  const EngineRequest back = serve::RequestFromProto(serve::RequestToProto(request));
  ASSERT_TRUE(back.params.grammar.has_value());
  EXPECT_EQ(back.params.grammar->kind, structured::GrammarSpec::Kind::kStructural);
  EXPECT_EQ(back.params.grammar->text, request.params.grammar->text);
  EXPECT_EQ(back.params.grammar->choices, request.params.grammar->choices);
  EXPECT_EQ(back.params.grammar->begin_after, "</think>");
}

// The reasoning budget crosses the wire, unset staying unset (0 is a budget).
TEST(GrpcTest, ReasoningBudgetsCrossTheWire) {
  EngineRequest request{"budget", {1, 2, 3}, {}};
  EXPECT_FALSE(serve::RequestFromProto(serve::RequestToProto(request))
                   .params.thinking_token_budget.has_value());
  request.params.thinking_token_budget = 0;
  request.params.starts_in_thinking = true;
  const EngineRequest back = serve::RequestFromProto(serve::RequestToProto(request));
  EXPECT_EQ(back.params.thinking_token_budget, 0);
  EXPECT_TRUE(back.params.starts_in_thinking);
}

// Token constraints cross the wire: the allowed ids and each bad word's token sequence.
TEST(GrpcTest, TokenConstraintsCrossTheWire) {
  EngineRequest request{"constraints", {1, 2, 3}, {}};
  request.params.allowed_token_ids = {5, 9, 11};
  request.params.bad_words_token_ids = {{7}, {8, 9, 10}, {12, 13}};
  const EngineRequest back = serve::RequestFromProto(serve::RequestToProto(request));
  EXPECT_EQ(back.params.allowed_token_ids, request.params.allowed_token_ids);
  EXPECT_EQ(back.params.bad_words_token_ids, request.params.bad_words_token_ids);
}

// A batch line's place behind live traffic crosses the wire with its priority.
TEST(GrpcTest, BackgroundAndPriorityCrossTheWire) {
  EngineRequest request{"line", {1, 2, 3}, {}};
  EXPECT_FALSE(serve::RequestFromProto(serve::RequestToProto(request)).background);
  request.background = true;
  request.priority = 2;
  const EngineRequest back = serve::RequestFromProto(serve::RequestToProto(request));
  EXPECT_TRUE(back.background);
  EXPECT_EQ(back.priority, 2);
}

TEST(GrpcTest, GenerateStreamsWhatTheEngineGives) {
  for (double temperature : {0.0, 0.8}) {
    EngineRequest request{
        "g" + std::to_string(temperature), TheInstance().Prompt("ROMEO: But soft, what light"), {}};
    request.params.temperature = temperature;
    request.params.seed = 7;
    request.params.max_tokens = 24;
    request.params.ignore_eos = true;
    request.params.stop = {"zzz"};  // held-back text crosses the wire intact
    Streamed remote = Generate(request);
    ASSERT_TRUE(remote.status.ok()) << remote.status.error_message();
    request.id += "-direct";
    Streamed local = Direct(request);
    EXPECT_EQ(remote.tokens, local.tokens);
    EXPECT_EQ(remote.text, local.text);
    EXPECT_EQ(remote.finish, "length");
    EXPECT_EQ(remote.tokens.size(), 24u);
    EXPECT_EQ(remote.prompt_tokens, static_cast<int64_t>(request.prompt.size()));
    EXPECT_GT(remote.messages, 1);  // streamed, not all at the end
  }
}

TEST(GrpcTest, AResumedRequestContinuesTheSameStream) {
  EngineRequest request{"whole", TheInstance().Prompt("KING HENRY: Now, lords"), {}};
  request.params.temperature = 0.8;
  request.params.seed = 99;
  request.params.max_tokens = 16;
  request.params.ignore_eos = true;
  Streamed whole = Generate(request);
  ASSERT_EQ(whole.tokens.size(), 16u);
  EngineRequest resumed = request;
  resumed.id = "resumed";
  resumed.prompt.insert(resumed.prompt.end(), whole.tokens.begin(), whole.tokens.begin() + 5);
  resumed.resumed_tokens = 5;
  Streamed rest = Generate(resumed);
  ASSERT_TRUE(rest.status.ok()) << rest.status.error_message();
  EXPECT_EQ(rest.tokens, std::vector<int32_t>(whole.tokens.begin() + 5, whole.tokens.end()));
  EXPECT_EQ(rest.prompt_tokens, static_cast<int64_t>(request.prompt.size()));
}

TEST(GrpcTest, BadRequestsAreInvalidArgumentsNamingTheField) {
  EngineRequest bad{"bad", {0, 5, 99999}, {}};
  Streamed out = Generate(bad);
  EXPECT_EQ(out.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(out.status.error_message().find("position 2"), std::string::npos)
      << out.status.error_message();
  EngineRequest no_id{"", {0, 5}, {}};
  EXPECT_EQ(Generate(no_id).status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EngineRequest top_p{"top_p", {0, 5}, {}};
  top_p.params.top_p = 0;
  Streamed refused = Generate(top_p);
  EXPECT_NE(refused.status.error_message().find("top_p"), std::string::npos);
}

TEST(GrpcTest, HealthLoadAndCancellation) {
  grpc::ClientContext health_context;
  pb::HealthResponse health;
  ASSERT_TRUE(TheInstance().stub->Health(&health_context, {}, &health).ok());
  EXPECT_EQ(health.state(), pb::HealthResponse::SERVING);
  EXPECT_EQ(health.served_model_name(), "sy-test");
  EXPECT_EQ(health.page_size(), 16);
  EXPECT_EQ(health.vocab_size(), 4096);
  // A router's beam searches end a beam on it.
  ASSERT_TRUE(health.has_eos_token_id());
  EXPECT_EQ(health.eos_token_id(), TheInstance().model->config().eos_token_id);
  EXPECT_GT(health.total_pages(), 0);
  EXPECT_NE(health.instance_epoch(), 0u);

  // A long request, cancelled by its client after the first message: the engine aborts it and
  // its pages come back.
  EngineRequest request{"long", TheInstance().Prompt("To be, or not to be"), {}};
  request.params.max_tokens = 1500;
  request.params.ignore_eos = true;
  {
    grpc::ClientContext context;
    auto reader = TheInstance().stub->Generate(&context, serve::RequestToProto(request));
    pb::GenerateResponse response;
    ASSERT_TRUE(reader->Read(&response));
    // Load lists the request by its id with its share of the queue (what a router tells its
    // own requests by): the tokens it has still to generate, and they make up the whole.
    pb::LoadResponse running;
    for (int i = 0; i < 200 && running.requests_size() == 0; ++i) {
      grpc::ClientContext load_context;
      ASSERT_TRUE(TheInstance().stub->Load(&load_context, {}, &running).ok());
      if (running.requests_size() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    ASSERT_EQ(running.requests_size(), 1);
    EXPECT_EQ(running.requests(0).request_id(), "long");
    EXPECT_GT(running.requests(0).queued_tokens(), 0);
    EXPECT_LE(running.requests(0).queued_tokens(), 1500);
    EXPECT_EQ(running.requests(0).queued_tokens(), running.queued_tokens());
    context.TryCancel();
    while (reader->Read(&response)) {
    }
    EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
  }
  pb::LoadResponse load;
  for (int i = 0; i < 200; ++i) {
    grpc::ClientContext context;
    ASSERT_TRUE(TheInstance().stub->Load(&context, {}, &load).ok());
    // The step that streamed the first token counts itself only when it ends, which can be
    // after the cancelled request has already left and freed its pages.
    if (load.running() == 0 && load.used_pages() == 0 && load.steps_total() > 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(load.running(), 0);
  EXPECT_EQ(load.used_pages(), 0);
  EXPECT_EQ(load.requests_size(), 0);
  EXPECT_EQ(load.instance_epoch(), health.instance_epoch());
  EXPECT_GT(load.steps_total(), 0);
  EXPECT_LT(load.generation_tokens_total(), 1500 + 100);  // stopped well before its end
}

}  // namespace
}  // namespace sy
