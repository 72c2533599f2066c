#include "serve/grpc_service.h"

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <random>

#include <grpcpp/grpcpp.h>

#include "switchyard/v1/engine.grpc.pb.h"
#include "transfer/kv_transfer.h"

namespace sy::serve {

namespace pb = switchyard::v1;

namespace {

void ToProto(const TokenLogprob& from, pb::TokenLogprob* to) {
  to->set_token(from.token);
  to->set_logprob(from.logprob);
  to->set_rank(from.rank);
  for (const auto& [token, logprob] : from.top) {
    pb::TopLogprob* top = to->add_top();
    top->set_token(token);
    top->set_logprob(logprob);
  }
}

TokenLogprob FromProto(const pb::TokenLogprob& from) {
  TokenLogprob to;
  to.token = from.token();
  to.logprob = from.logprob();
  to.rank = from.rank();
  for (const auto& top : from.top())
    to.top.push_back({top.token(), top.logprob()});
  return to;
}

pb::FinishReason ReasonToProto(const std::optional<std::string>& reason) {
  if (!reason) return pb::FINISH_NONE;
  if (*reason == "stop") return pb::FINISH_STOP;
  if (*reason == "length") return pb::FINISH_LENGTH;
  if (*reason == "abort") return pb::FINISH_ABORT;
  if (*reason == "transferred") return pb::FINISH_TRANSFERRED;
  return pb::FINISH_ERROR;
}

std::optional<std::string> ReasonFromProto(pb::FinishReason reason) {
  switch (reason) {
    case pb::FINISH_STOP:
      return "stop";
    case pb::FINISH_LENGTH:
      return "length";
    case pb::FINISH_ABORT:
      return "abort";
    case pb::FINISH_ERROR:
      return "error";
    case pb::FINISH_TRANSFERRED:
      return "transferred";
    default:
      return std::nullopt;
  }
}

}  // namespace

EngineRequest RequestFromProto(const pb::GenerateRequest& request) {
  EngineRequest out;
  out.id = request.request_id();
  out.prompt.assign(request.prompt().begin(), request.prompt().end());
  out.resumed_tokens = request.resumed_tokens();
  out.priority = request.priority();
  out.background = request.background();
  const pb::SamplingParams& p = request.params();
  SamplingParams& s = out.params;
  if (p.has_temperature()) s.temperature = p.temperature();
  if (p.has_top_p()) s.top_p = p.top_p();
  s.top_k = p.top_k();
  s.min_p = p.min_p();
  if (p.has_seed()) s.seed = p.seed();
  s.presence_penalty = p.presence_penalty();
  s.frequency_penalty = p.frequency_penalty();
  if (p.has_repetition_penalty()) s.repetition_penalty = p.repetition_penalty();
  for (const auto& [token, bias] : p.logit_bias())
    s.logit_bias[token] = bias;
  s.stop.assign(p.stop().begin(), p.stop().end());
  s.stop_token_ids.assign(p.stop_token_ids().begin(), p.stop_token_ids().end());
  s.ignore_eos = p.ignore_eos();
  if (p.has_max_tokens()) s.max_tokens = p.max_tokens();
  s.min_tokens = p.min_tokens();
  if (p.has_logprobs()) s.logprobs = p.logprobs();
  if (p.has_prompt_logprobs()) s.prompt_logprobs = p.prompt_logprobs();
  if (p.has_skip_special_tokens()) s.skip_special_tokens = p.skip_special_tokens();
  s.include_stop_str_in_output = p.include_stop_str_in_output();
  if (p.has_thinking_token_budget()) s.thinking_token_budget = p.thinking_token_budget();
  s.starts_in_thinking = p.starts_in_thinking();
  s.allowed_token_ids.assign(p.allowed_token_ids().begin(), p.allowed_token_ids().end());
  for (const pb::TokenIds& word : p.bad_words())
    s.bad_words_token_ids.emplace_back(word.ids().begin(), word.ids().end());
  if (p.has_grammar()) {
    structured::GrammarSpec spec;
    spec.kind = static_cast<structured::GrammarSpec::Kind>(p.grammar().kind());
    spec.text = p.grammar().text();
    spec.choices.assign(p.grammar().choices().begin(), p.grammar().choices().end());
    spec.begin_after = p.grammar().begin_after();
    s.grammar = std::move(spec);
  }
  return out;
}

pb::GenerateRequest RequestToProto(const EngineRequest& request) {
  pb::GenerateRequest out;
  out.set_request_id(request.id);
  out.mutable_prompt()->Add(request.prompt.begin(), request.prompt.end());
  out.set_resumed_tokens(request.resumed_tokens);
  out.set_priority(request.priority);
  out.set_background(request.background);
  const SamplingParams& s = request.params;
  pb::SamplingParams* p = out.mutable_params();
  p->set_temperature(s.temperature);
  p->set_top_p(s.top_p);
  p->set_top_k(s.top_k);
  p->set_min_p(s.min_p);
  if (s.seed) p->set_seed(*s.seed);
  p->set_presence_penalty(s.presence_penalty);
  p->set_frequency_penalty(s.frequency_penalty);
  p->set_repetition_penalty(s.repetition_penalty);
  for (const auto& [token, bias] : s.logit_bias)
    (*p->mutable_logit_bias())[token] = bias;
  for (const auto& stop : s.stop)
    p->add_stop(stop);
  p->mutable_stop_token_ids()->Add(s.stop_token_ids.begin(), s.stop_token_ids.end());
  p->set_ignore_eos(s.ignore_eos);
  p->set_max_tokens(s.max_tokens);
  p->set_min_tokens(s.min_tokens);
  if (s.logprobs) p->set_logprobs(*s.logprobs);
  if (s.prompt_logprobs) p->set_prompt_logprobs(*s.prompt_logprobs);
  p->set_skip_special_tokens(s.skip_special_tokens);
  p->set_include_stop_str_in_output(s.include_stop_str_in_output);
  if (s.thinking_token_budget) p->set_thinking_token_budget(*s.thinking_token_budget);
  p->set_starts_in_thinking(s.starts_in_thinking);
  p->mutable_allowed_token_ids()->Add(s.allowed_token_ids.begin(), s.allowed_token_ids.end());
  for (const auto& word : s.bad_words_token_ids)
    p->add_bad_words()->mutable_ids()->Add(word.begin(), word.end());
  if (s.grammar) {
    pb::Grammar* g = p->mutable_grammar();
    g->set_kind(static_cast<pb::Grammar::Kind>(s.grammar->kind));
    g->set_text(s.grammar->text);
    g->set_begin_after(s.grammar->begin_after);
    for (const auto& c : s.grammar->choices)
      g->add_choices(c);
  }
  return out;
}

pb::GenerateResponse EventToProto(const RequestEvent& event) {
  pb::GenerateResponse out;
  out.mutable_token_ids()->Add(event.token_ids.begin(), event.token_ids.end());
  out.set_text(event.text);
  for (const auto& l : event.logprobs)
    ToProto(l, out.add_logprobs());
  if (event.first) {
    pb::PromptInfo* prompt = out.mutable_prompt();
    prompt->set_prompt_tokens(event.prompt_tokens);
    prompt->set_cached_tokens(event.cached_tokens);
    for (const auto& l : event.prompt_logprobs) {
      if (l) {
        ToProto(*l, prompt->add_prompt_logprobs());
      } else {
        prompt->add_prompt_logprobs()->set_token(-1);
      }
    }
  }
  out.set_finish_reason(ReasonToProto(event.finish_reason));
  out.set_error(event.error);
  if (event.stop_string) out.set_stop_string(*event.stop_string);
  if (event.stop_token) out.set_stop_token(*event.stop_token);
  return out;
}

RequestEvent EventFromProto(const pb::GenerateResponse& response) {
  RequestEvent out;
  out.token_ids.assign(response.token_ids().begin(), response.token_ids().end());
  out.text = response.text();
  for (const auto& l : response.logprobs())
    out.logprobs.push_back(FromProto(l));
  if (response.has_prompt()) {
    out.first = true;
    out.prompt_tokens = response.prompt().prompt_tokens();
    out.cached_tokens = response.prompt().cached_tokens();
    for (const auto& l : response.prompt().prompt_logprobs())
      out.prompt_logprobs.push_back(l.token() < 0 ? std::nullopt
                                                  : std::optional<TokenLogprob>(FromProto(l)));
  }
  out.finish_reason = ReasonFromProto(response.finish_reason());
  out.error = response.error();
  if (response.has_stop_string()) out.stop_string = response.stop_string();
  if (response.has_stop_token()) out.stop_token = response.stop_token();
  return out;
}

// The synchronous API: each open stream holds one of gRPC's handler threads, which sleeps on its
// request's events. Plain and robust; a callback-API reactor is the step up when a router keeps
// thousands of streams open on one instance.
class GrpcEngineServer::Service final : public pb::Engine::Service {
 public:
  Service(RequestFrontend& frontend, InstanceInfo info)
      : frontend_(frontend),
        info_(std::move(info)),
        epoch_(std::random_device{}() * 0x100000001ull) {}

  grpc::Status Generate(grpc::ServerContext* context, const pb::GenerateRequest* request,
                        grpc::ServerWriter<pb::GenerateResponse>* writer) override {
    EngineRequest engine_request = RequestFromProto(*request);
    if (engine_request.id.empty())
      return {grpc::StatusCode::INVALID_ARGUMENT, "request_id: must not be empty"};
    // Disaggregation: rows go out as computed (prefill), or come in before the request starts
    // (decode). A failed transfer is ABORTED: the router redoes it, the instance stays in use.
    std::shared_ptr<transfer::Outgoing> outgoing;
    std::optional<uint64_t> receive_token, send_token;
    if (request->has_handoff()) {
      const pb::Handoff& handoff = request->handoff();
      if (!handoff.send_to().empty() && info_.submit_sending) {
        send_token = handoff.token();  // the group's first rank sends the rows
      } else if (!handoff.send_to().empty()) {
        if (info_.sender == nullptr)
          return {grpc::StatusCode::FAILED_PRECONDITION,
                  "handoff.send_to: this instance does not prefill for others (serve --role "
                  "prefill)"};
        outgoing = info_.sender->Open(handoff.send_to(), engine_request.id, handoff.token());
        engine_request.kv_sink = outgoing;
      } else if (handoff.receive() && info_.submit_receiving) {
        receive_token = handoff.token();  // the group's first rank waits for the rows
      } else if (handoff.receive()) {
        if (info_.receiver == nullptr)
          return {grpc::StatusCode::FAILED_PRECONDITION,
                  "handoff.receive: this instance does not decode for others (serve --role "
                  "decode)"};
        auto received = info_.receiver->Wait(engine_request.id, handoff.token(), info_.cache_layers,
                                             info_.cache_row_bytes, info_.transfer_timeout_seconds,
                                             [&] { return context->IsCancelled(); });
        if (!received.ok()) return {grpc::StatusCode::ABORTED, received.status().message()};
        engine_request.prompt.push_back(received->first_token);
        engine_request.resumed_tokens += 1;
        engine_request.imported = received->rows;
      }
    }
    SubmitError why;
    auto stream = receive_token ? info_.submit_receiving(engine_request, *receive_token, &why)
                  : send_token  ? info_.submit_sending(engine_request, request->handoff().send_to(),
                                                       *send_token, &why)
                                : frontend_.Submit(engine_request, &why);
    if (!stream.ok()) {
      const grpc::StatusCode code =
          why == SubmitError::kQueueFull  ? grpc::StatusCode::RESOURCE_EXHAUSTED
          : why == SubmitError::kStopping ? grpc::StatusCode::UNAVAILABLE
                                          : grpc::StatusCode::INVALID_ARGUMENT;
      return {code, stream.status().message()};
    }
    std::mutex mutex;
    std::condition_variable arrived;
    bool ready = false;
    stream.value()->SetNotifier([&] {
      std::lock_guard<std::mutex> lock(mutex);
      ready = true;
      arrived.notify_one();
    });
    std::vector<RequestEvent> events;
    while (true) {
      {
        std::unique_lock<std::mutex> lock(mutex);
        arrived.wait_for(lock, std::chrono::milliseconds(100), [&] { return ready; });
        ready = false;
      }
      events.clear();
      const bool finished = stream.value()->Drain(&events);
      for (const RequestEvent& event : events) {
        if (event.finish_reason == kTransferFailedReason) {
          stream.value()->SetNotifier(nullptr);
          return {grpc::StatusCode::ABORTED, event.error};
        }
        if (outgoing && event.finish_reason == "transferred") {
          // Handed on only once every row has left.
          Status sent = outgoing->Wait(info_.transfer_timeout_seconds);
          if (!sent.ok()) {
            stream.value()->SetNotifier(nullptr);
            return {grpc::StatusCode::ABORTED, "the transfer failed: " + sent.message()};
          }
        }
        if (!writer->Write(EventToProto(event))) {  // the client went away
          frontend_.Abort(engine_request.id);
          stream.value()->SetNotifier(nullptr);
          return {grpc::StatusCode::CANCELLED, "the client went away"};
        }
      }
      if (finished) break;
      if (context->IsCancelled()) {
        frontend_.Abort(engine_request.id);
        stream.value()->SetNotifier(nullptr);
        return {grpc::StatusCode::CANCELLED, "cancelled by the client"};
      }
    }
    stream.value()->SetNotifier(nullptr);
    return grpc::Status::OK;
  }

  grpc::Status Abort(grpc::ServerContext*, const pb::AbortRequest* request,
                     pb::AbortResponse*) override {
    frontend_.Abort(request->request_id());
    return grpc::Status::OK;
  }

  grpc::Status Health(grpc::ServerContext*, const pb::HealthRequest*,
                      pb::HealthResponse* response) override {
    const EngineMetrics m = frontend_.Metrics();
    response->set_state(!m.healthy  ? pb::HealthResponse::UNHEALTHY
                        : draining_ ? pb::HealthResponse::DRAINING
                                    : pb::HealthResponse::SERVING);
    response->set_instance_epoch(epoch_);
    response->set_served_model_name(info_.served_model_name);
    response->set_page_size(info_.page_size);
    response->set_total_pages(m.total_pages);
    response->set_vocab_size(info_.vocab_size);
    response->set_max_model_len(info_.max_model_len);
    if (info_.eos_token_id >= 0) response->set_eos_token_id(info_.eos_token_id);
    for (int32_t id : info_.more_eos_token_ids)
      response->add_more_eos_token_ids(id);
    response->set_num_speculative_tokens(info_.num_speculative_tokens);
    response->set_priority_scheduling(info_.priority_scheduling);
    response->set_role(info_.role);
    if (info_.receiver != nullptr) response->set_transfer_address(info_.receiver->address());
    if (!info_.transfer_address.empty()) response->set_transfer_address(info_.transfer_address);
    return grpc::Status::OK;
  }

  grpc::Status Load(grpc::ServerContext*, const pb::LoadRequest*,
                    pb::LoadResponse* response) override {
    const EngineMetrics m = frontend_.Metrics();
    response->set_instance_epoch(epoch_);
    response->set_running(m.running);
    response->set_waiting(m.waiting);
    response->set_queued_tokens(m.queued_tokens);
    response->set_free_pages(m.free_pages);
    response->set_cached_pages(m.cached_pages);
    response->set_used_pages(m.used_pages);
    response->set_total_pages(m.total_pages);
    response->set_last_step_age_seconds(m.last_step_age_seconds);
    response->set_steps_total(m.steps_total);
    response->set_prompt_tokens_total(m.prompt_tokens_total);
    response->set_generation_tokens_total(m.generation_tokens_total);
    response->set_prefix_cache_hits_total(m.prefix_cache_hits_total);
    for (const auto& [id, tokens] : m.queued_requests) {
      pb::QueuedRequest* r = response->add_requests();
      r->set_request_id(id);
      r->set_queued_tokens(tokens);
    }
    return grpc::Status::OK;
  }

  grpc::Status CacheEvents(grpc::ServerContext* context, const pb::CacheEventsRequest*,
                           grpc::ServerWriter<pb::CacheEventsResponse>* writer) override {
    const CacheEventLog* log = frontend_.cache_events();
    if (log == nullptr)
      return {grpc::StatusCode::UNIMPLEMENTED, "this instance does not publish its cache"};
    auto [seq, hashes] = log->Snapshot();
    pb::CacheEventsResponse snapshot;
    snapshot.set_instance_epoch(epoch_);
    snapshot.mutable_snapshot()->set_seq(seq);
    snapshot.mutable_snapshot()->set_page_size(info_.page_size);
    snapshot.mutable_snapshot()->mutable_hashes()->Add(hashes.begin(), hashes.end());
    if (!writer->Write(snapshot)) return grpc::Status::OK;
    while (!context->IsCancelled() && !stopping_) {
      bool lost = false;
      const auto events = log->Since(seq, 200, &lost);
      if (lost) return {grpc::StatusCode::DATA_LOSS, "fell behind the cache events; resubscribe"};
      if (events.empty()) continue;
      pb::CacheEventsResponse batch;
      batch.set_instance_epoch(epoch_);
      batch.mutable_batch()->set_first_seq(seq + 1);
      for (const auto& e : events) {
        pb::CacheEvent* event = batch.mutable_batch()->add_events();
        event->set_hash(e.hash);
        event->set_evicted(!e.stored);
      }
      seq += events.size();
      if (!writer->Write(batch)) break;
    }
    return grpc::Status::OK;
  }

  void SetDraining() {
    draining_ = true;
    stopping_ = true;
  }

 private:
  RequestFrontend& frontend_;
  InstanceInfo info_;
  uint64_t epoch_;
  std::atomic<bool> draining_{false};
  std::atomic<bool> stopping_{false};  // ends the open CacheEvents streams
};

GrpcEngineServer::GrpcEngineServer(RequestFrontend& frontend, InstanceInfo info)
    : service_(std::make_unique<Service>(frontend, std::move(info))) {}

GrpcEngineServer::~GrpcEngineServer() {
  Shutdown();
}

Status GrpcEngineServer::Start(const std::string& host, int port,
                               std::shared_ptr<grpc::ServerCredentials> credentials) {
  grpc::ServerBuilder builder;
  builder.AddListeningPort(host + ":" + std::to_string(port),
                           credentials ? credentials : grpc::InsecureServerCredentials(), &port_);
  builder.RegisterService(service_.get());
  server_ = builder.BuildAndStart();
  if (server_ == nullptr || port_ == 0)
    return Status::Errorf("cannot serve gRPC on {}:{} (in use, or not an address here)", host,
                          port);
  return Status::Ok();
}

void GrpcEngineServer::Shutdown() {
  if (server_ == nullptr) return;
  service_->SetDraining();
  // Open streams get a moment to finish, then are cancelled.
  server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
  server_->Wait();
  server_.reset();
}

}  // namespace sy::serve
