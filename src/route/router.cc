#include "route/router.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <unordered_map>
#include <unordered_set>

#include <grpcpp/grpcpp.h>

#include "base/clock.h"
#include "engine/page_pool.h"
#include "route/pending_pages.h"
#include "route/queue_estimate.h"
#include "serve/grpc_service.h"
#include "switchyard/v1/engine.grpc.pb.h"

namespace sy::route {

namespace pb = switchyard::v1;

Result<Policy> ParsePolicy(const std::string& name) {
  if (name == "cache_aware") return Policy::kCacheAware;
  if (name == "least_load") return Policy::kLeastLoad;
  if (name == "round_robin") return Policy::kRoundRobin;
  if (name == "power_of_two") return Policy::kPowerOfTwo;
  return Status::Errorf(
      "--policy: '{}' is not one of cache_aware, least_load, round_robin, power_of_two", name);
}

const char* PolicyName(Policy policy) {
  switch (policy) {
    case Policy::kCacheAware:
      return "cache_aware";
    case Policy::kLeastLoad:
      return "least_load";
    case Policy::kRoundRobin:
      return "round_robin";
    case Policy::kPowerOfTwo:
      return "power_of_two";
  }
  return "?";
}

struct Router::Target {
  std::string address;
  std::string pool;  // "", "prefill" or "decode"
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<pb::Engine::Stub> stub;
  std::thread prober, mirror;
  // Guarded by the router's mutex:
  bool healthy = false;
  double ejected_until = 0;
  pb::HealthResponse health;
  pb::LoadResponse load;
  // Work queued here as the router sees it: the last Load, corrected request by request.
  QueueEstimate queue;
  std::unordered_set<uint64_t> cached;  // the mirror of its prefix cache
  PendingPages pending;  // pages of requests routed here that the mirror does not hold yet
  grpc::ClientContext* mirror_context = nullptr;
  int64_t in_flight = 0, routed_total = 0, failovers_from = 0;
  bool draining = false;        // by the admin
  int64_t last_steps = -1;      // Load.steps_total, for forward progress
  double steps_changed_at = 0;  // when it last moved
  int missed_probes = 0;        // in a row, while serving
  // Why its probes failed since it last served, each reason logged once (at most 8 kept).
  std::vector<std::string> refusals;
};

struct Router::Flight {
  EngineRequest request;  // as the client asked
  std::shared_ptr<RequestStream> client;
  std::vector<int32_t> generated;  // streamed to the client so far
  bool sent_first = false;
  std::atomic<bool> aborted{false};
  grpc::ClientContext* context = nullptr;  // the attempt in flight (guarded by the mutex)
  int target = -1;
  // Disaggregation: the attempt's decode call (its prefill call is `context` and `target`).
  grpc::ClientContext* decode_context = nullptr;
  int decode_target = -1;
  std::thread thread;
};

Router::Router(RouterOptions options) : options_(std::move(options)) {
  latency_.time_to_first_token = Histogram(LatencyBucketBounds());
  latency_.inter_token_latency = Histogram(LatencyBucketBounds());
  latency_.e2e_request_latency = Histogram(LatencyBucketBounds());
  prefill_ttft_ = Histogram(LatencyBucketBounds());
  decode_itl_ = Histogram(LatencyBucketBounds());
  handoff_ = Histogram(LatencyBucketBounds());
  std::vector<std::pair<std::string, std::string>> all;  // address, pool
  for (const std::string& address : options_.engines)
    all.push_back({address, ""});
  for (const std::string& address : options_.prefill_engines)
    all.push_back({address, "prefill"});
  for (const std::string& address : options_.decode_engines)
    all.push_back({address, "decode"});
  for (const auto& [address, pool] : all) {
    auto target = std::make_unique<Target>();
    target->address = address;
    target->pool = pool;
    grpc::ChannelArguments args;
    // Reconnect quickly after an instance comes back (gRPC's default backoff grows to 2 min).
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
    args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
    target->channel = grpc::CreateCustomChannel(
        address, options_.credentials ? options_.credentials : grpc::InsecureChannelCredentials(),
        args);
    target->stub = pb::Engine::NewStub(target->channel);
    targets_.push_back(std::move(target));
  }
}

Router::~Router() {
  Stop(false);
}

Status Router::Start(double seconds) {
  if (targets_.empty()) return Status::Error("--engines: no instances given");
  if (disaggregated() && (options_.decode_engines.empty() || !options_.engines.empty()))
    return Status::Error(
        "--prefill-engines needs --decode-engines, and neither goes with --engines");
  if (!disaggregated() && !options_.decode_engines.empty())
    return Status::Error("--decode-engines needs --prefill-engines");
  for (auto& target : targets_) {
    Target* t = target.get();
    t->prober = std::thread([this, t] { Probe(*t); });
    // The decode pool is chosen by load alone: no mirror of its caches.
    if (t->pool != "decode") t->mirror = std::thread([this, t] { Mirror(*t); });
  }
  std::unique_lock<std::mutex> lock(mutex_);
  auto pool_healthy = [&](const std::string& pool) {
    return std::any_of(targets_.begin(), targets_.end(),
                       [&](const auto& t) { return t->healthy && t->pool == pool; });
  };
  auto ready = [&] {
    return disaggregated() ? pool_healthy("prefill") && pool_healthy("decode") : pool_healthy("");
  };
  changed_.wait_for(lock, std::chrono::duration<double>(seconds), ready);
  const Target* first = nullptr;
  for (const auto& t : targets_) {
    if (!t->healthy) continue;
    if (first == nullptr) {
      first = t.get();
    } else if (t->health.vocab_size() != first->health.vocab_size() ||
               t->health.page_size() != first->health.page_size()) {
      return Status::Errorf(
          "instances {} and {} serve different models (vocabulary {} and {}, "
          "page size {} and {})",
          first->address, t->address, first->health.vocab_size(), t->health.vocab_size(),
          first->health.page_size(), t->health.page_size());
    }
  }
  if (first == nullptr || !ready()) {
    std::string reasons;
    for (const auto& t : targets_)
      for (const std::string& why : t->refusals)
        reasons += fmt::format("; {}: {}", t->address, why);
    if (first != nullptr)
      return Status::Errorf("no {} instance answered within {:.0f} s{}",
                            pool_healthy("prefill") ? "decode" : "prefill", seconds, reasons);
    return Status::Errorf("none of the {} instances answered within {:.0f} s{}", targets_.size(),
                          seconds, reasons);
  }
  page_size_ = first->health.page_size();
  return Status::Ok();
}

RequestLimits Router::limits() const {
  std::lock_guard<std::mutex> lock(mutex_);
  RequestLimits limits;
  bool answered = false;
  limits.priority_scheduling = true;  // where every instance that answered schedules by it
  for (const auto& t : targets_) {
    if (t->health.vocab_size() == 0) continue;  // never answered
    answered = true;
    limits.priority_scheduling = limits.priority_scheduling && t->health.priority_scheduling();
    limits.vocab_size = t->health.vocab_size();
    if (t->health.has_eos_token_id()) limits.eos_token_id = t->health.eos_token_id();
    limits.more_eos_token_ids.assign(t->health.more_eos_token_ids().begin(),
                                     t->health.more_eos_token_ids().end());
    limits.max_model_len = limits.max_model_len == 0
                               ? t->health.max_model_len()
                               : std::min(limits.max_model_len, t->health.max_model_len());
    limits.cache_tokens =
        std::max(limits.cache_tokens, t->health.total_pages() * t->health.page_size());
  }
  limits.priority_scheduling = limits.priority_scheduling && answered;
  return limits;
}

void Router::MarkFailed(Target& target, const std::string& why) {
  // Caller holds the mutex.
  if (target.healthy)
    std::fprintf(stderr, "switchyard route: %s ejected: %s\n", target.address.c_str(), why.c_str());
  if (target.refusals.size() < 8) target.refusals.push_back(why);
  target.healthy = false;
  target.missed_probes = 0;
  target.ejected_until = NowSeconds() + std::max(1.0, 4 * options_.probe_interval_seconds);
  target.cached.clear();
  target.pending.Clear();
  target.queue.Clear();
  // Requests in flight there fail over now rather than wait for their streams to time out.
  for (auto& [id, flight] : flights_) {
    if (flight->target >= 0 && targets_[flight->target].get() == &target && flight->context)
      flight->context->TryCancel();
    if (flight->decode_target >= 0 && targets_[flight->decode_target].get() == &target &&
        flight->decode_context)
      flight->decode_context->TryCancel();
  }
  changed_.notify_all();
}

void Router::Probe(Target& target) {
  const auto interval = std::chrono::duration<double>(options_.probe_interval_seconds);
  while (!stopping_) {
    pb::HealthResponse health;
    pb::LoadResponse load;
    grpc::ClientContext health_context, load_context;
    const auto deadline = std::chrono::system_clock::now() +
                          std::chrono::duration_cast<std::chrono::system_clock::duration>(
                              std::chrono::duration<double>(options_.probe_timeout_seconds));
    health_context.set_deadline(deadline);
    load_context.set_deadline(deadline);
    grpc::Status h = target.stub->Health(&health_context, {}, &health);
    // A pool takes only instances serving its role (and a decode instance says where to send).
    const std::string role = health.role().empty() ? "both" : health.role();
    const std::string wanted = target.pool.empty() ? "both" : target.pool;
    if (h.ok() && role != wanted)
      h = grpc::Status(
          grpc::StatusCode::FAILED_PRECONDITION,
          fmt::format("serves --role {}; {} takes --role {}", role,
                      target.pool.empty() ? "--engines" : "--" + wanted + "-engines", wanted));
    else if (h.ok() && target.pool == "decode" && health.transfer_address().empty())
      h = grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "gives no transfer address");
    uint64_t probe = 0;
    if (h.ok()) {
      std::lock_guard<std::mutex> lock(mutex_);
      probe = target.queue.Asked();
    }
    grpc::Status l = h.ok() ? target.stub->Load(&load_context, {}, &load) : h;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (h.ok() && l.ok()) target.missed_probes = 0;
      if (!h.ok() || !l.ok()) {
        const std::string why = (h.ok() ? l : h).error_message();
        if (target.healthy) {
          // A serving instance is ejected, and its streams moved, only after several probes
          // missed in a row: on a loaded machine one probe can miss its deadline while the
          // instance still streams (the streams themselves break at once if it dies).
          if (++target.missed_probes >= options_.probe_failures) {
            MarkFailed(target, fmt::format("{} ({} probes in a row)", why, target.missed_probes));
          } else if (target.missed_probes == 1) {
            std::fprintf(stderr,
                         "switchyard route: %s missed a probe (%s); no new requests while "
                         "others serve\n",
                         target.address.c_str(), why.c_str());
          }
        } else if (target.refusals.size() < 8 &&
                   std::find(target.refusals.begin(), target.refusals.end(), why) ==
                       target.refusals.end()) {
          // Never admitted, or down since: a new reason (a certificate that does not verify, a
          // client certificate refused) is worth a line; the same one every probe is not.
          std::fprintf(stderr, "switchyard route: %s not usable: %s\n", target.address.c_str(),
                       why.c_str());
          target.refusals.push_back(why);
        }
      } else if (health.state() == pb::HealthResponse::UNHEALTHY ||
                 load.last_step_age_seconds() > options_.stall_timeout_seconds) {
        if (target.healthy)
          MarkFailed(target, fmt::format("a step has run {:.1f} s", load.last_step_age_seconds()));
      } else if (load.steps_total() == target.last_steps && load.running() + load.waiting() > 0 &&
                 NowSeconds() - target.steps_changed_at > options_.stall_timeout_seconds) {
        // Work to do and no step completed for the stall timeout: stuck between steps.
        if (target.healthy)
          MarkFailed(target, fmt::format("no step for {:.1f} s with {} requests",
                                         NowSeconds() - target.steps_changed_at,
                                         load.running() + load.waiting()));
      } else if (health.state() == pb::HealthResponse::DRAINING) {
        target.healthy = false;  // finishes what it has; gets nothing new
      } else if (NowSeconds() >= target.ejected_until) {
        if (!target.healthy) {
          if (target.health.instance_epoch() != 0 &&
              target.health.instance_epoch() != health.instance_epoch()) {
            target.cached.clear();  // a restarted instance starts with an empty cache
            target.queue.Clear();
          }
          std::fprintf(stderr, "switchyard route: %s serving\n", target.address.c_str());
        }
        target.healthy = true;
        target.refusals.clear();
        changed_.notify_all();
      }
      if (h.ok()) target.health = health;
      if (h.ok() && l.ok()) {
        target.load = load;
        std::vector<std::pair<std::string, int64_t>> requests;
        requests.reserve(static_cast<size_t>(load.requests_size()));
        for (const pb::QueuedRequest& r : load.requests())
          requests.emplace_back(r.request_id(), r.queued_tokens());
        target.queue.Answered(probe, load.queued_tokens(), requests);
      }
      if (l.ok()) {
        if (load.steps_total() != target.last_steps || load.running() + load.waiting() == 0) {
          target.last_steps = load.steps_total();
          target.steps_changed_at = NowSeconds();
        }
      }
    }
    std::this_thread::sleep_for(interval);
  }
}

void Router::Mirror(Target& target) {
  // Snapshot, then numbered events; anything out of order or a broken stream: start over.
  while (!stopping_) {
    {
      std::unique_lock<std::mutex> lock(mutex_);
      if (!target.healthy) {
        changed_.wait_for(lock, std::chrono::milliseconds(100));
        continue;
      }
    }
    grpc::ClientContext context;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (stopping_) break;
      target.mirror_context = &context;
    }
    auto reader = target.stub->CacheEvents(&context, {});
    pb::CacheEventsResponse response;
    uint64_t seq = 0;
    bool have_snapshot = false;
    while (reader->Read(&response)) {
      std::lock_guard<std::mutex> lock(mutex_);
      if (response.has_snapshot()) {
        target.cached.clear();
        target.cached.insert(response.snapshot().hashes().begin(),
                             response.snapshot().hashes().end());
        seq = response.snapshot().seq();
        have_snapshot = true;
      } else if (have_snapshot && response.batch().first_seq() == seq + 1) {
        for (const auto& e : response.batch().events()) {
          if (e.evicted()) {
            target.cached.erase(e.hash());
          } else {
            target.cached.insert(e.hash());
          }
        }
        seq += response.batch().events_size();
      } else {
        target.cached.clear();  // a gap: subscribe again
        context.TryCancel();
      }
    }
    reader->Finish();
    {
      std::lock_guard<std::mutex> lock(mutex_);
      target.mirror_context = nullptr;
      target.cached.clear();  // until the next snapshot
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
}

namespace {

// The leading pages of a request the target holds or is about to hold, in tokens.
template <typename T>
int64_t CachedPrefix(const T& t, const std::vector<uint64_t>& page_hashes) {
  const double now = NowSeconds();
  int64_t hits = 0;
  while (hits < static_cast<int64_t>(page_hashes.size())) {
    const uint64_t h = page_hashes[static_cast<size_t>(hits)];
    if (!t.cached.count(h)) {
      if (!t.pending.Holds(h, now)) break;
    }
    ++hits;
  }
  return hits * std::max<int64_t>(1, t.health.page_size());
}

}  // namespace

int64_t Router::CachedTokens(const Target& target, const std::vector<uint64_t>& page_hashes) {
  return CachedPrefix(target, page_hashes);
}

bool Router::AnyUsable(const std::string& pool) const {
  // Caller holds the mutex.
  return std::any_of(targets_.begin(), targets_.end(),
                     [&](const auto& t) { return t->healthy && !t->draining && t->pool == pool; });
}

int Router::Pick(const std::vector<uint64_t>& page_hashes, int64_t tokens, int avoid,
                 const std::string& pool) {
  // Caller holds the mutex.
  std::vector<int> healthy;
  auto usable = [&](size_t i) {
    return targets_[i]->healthy && !targets_[i]->draining && targets_[i]->pool == pool;
  };
  // In order of preference: neither avoided nor missing probes; not avoided; any usable.
  for (int pass = 0; pass < 3 && healthy.empty(); ++pass)
    for (size_t i = 0; i < targets_.size(); ++i)
      if (usable(i) && (pass == 2 || static_cast<int>(i) != avoid) &&
          (pass >= 1 || targets_[i]->missed_probes == 0))
        healthy.push_back(static_cast<int>(i));
  if (healthy.empty()) return -1;
  auto queued = [&](int i) { return targets_[i]->queue.Queued(); };
  const uint64_t turn = rotation_[pool]++;
  switch (pool == "decode" ? Policy::kLeastLoad : options_.policy) {
    case Policy::kRoundRobin:
      return healthy[turn % healthy.size()];
    case Policy::kPowerOfTwo: {
      static thread_local std::mt19937_64 rng(std::random_device{}());
      const int a = healthy[rng() % healthy.size()], b = healthy[rng() % healthy.size()];
      return queued(a) <= queued(b) ? a : b;
    }
    case Policy::kLeastLoad:
    case Policy::kCacheAware: {
      // Work ahead of the request, in tokens: what the instance has queued (prompt tokens to
      // compute, tokens to generate), plus — cache_aware — the request's prompt tokens it does
      // not hold. A cached prefix draws requests until the queue on its holder outweighs it.
      int best = -1;
      int64_t best_cost = 0;
      for (size_t k = 0; k < healthy.size(); ++k) {
        const int i = healthy[(k + turn) % healthy.size()];  // ties rotate
        int64_t cost = queued(i);
        if (options_.policy == Policy::kCacheAware) {
          const Target& t = *targets_[i];
          cost += tokens - CachedTokens(t, page_hashes);
        }
        if (best < 0 || cost < best_cost) {
          best = i;
          best_cost = cost;
        }
      }
      return best;
    }
  }
  return healthy.front();
}

Result<std::shared_ptr<RequestStream>> Router::Submit(EngineRequest request, SubmitError* error) {
  *error = SubmitError::kInvalid;
  SY_RETURN_IF_ERROR(ValidateRequest(request, limits()));
  // Failover replays the sampler from the same seed: every request has one.
  if (!request.params.seed) request.params.seed = std::random_device{}() * 0x100000001ull;
  auto flight = std::make_unique<Flight>();
  flight->client = std::make_shared<RequestStream>();
  auto stream = flight->client;
  std::vector<std::unique_ptr<Flight>> to_join;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopping_) {
      *error = SubmitError::kStopping;
      return Status::Error("the router is shutting down");
    }
    if (flights_.count(request.id)) return Status::Errorf("request id {} is in use", request.id);
    if (static_cast<int64_t>(flights_.size()) >= options_.max_requests) {
      *error = SubmitError::kQueueFull;
      return Status::Errorf("the router holds {} requests, its limit", flights_.size());
    }
    if (disaggregated() ? !AnyUsable("prefill") || !AnyUsable("decode") : !AnyUsable("")) {
      *error = SubmitError::kQueueFull;  // 503 with Retry-After: instances may come back
      return Status::Error("no instance is healthy now");
    }
    to_join.swap(finished_);
    flight->request = std::move(request);
    Flight* raw = flight.get();
    flights_[raw->request.id] = std::move(flight);
    raw->thread = std::thread([this, raw] { Fly(*raw); });
  }
  for (auto& f : to_join)
    if (f->thread.joinable()) f->thread.join();
  *error = SubmitError::kNone;
  return stream;
}

void Router::Fly(Flight& flight) {
  const EngineRequest& request = flight.request;
  int avoid = -1, avoid_decode = -1;
  int failovers = 0;
  std::string last_error;
  const double arrival = NowSeconds();
  double last_token = 0;
  // The client's view of latency, recorded as the router forwards: TTFT, between tokens, whole.
  auto deliver = [&](RequestEvent event) {
    const double now = NowSeconds();
    std::lock_guard<std::mutex> lock(mutex_);
    if (!event.token_ids.empty()) {
      if (last_token == 0) {
        latency_.time_to_first_token.Observe(now - arrival);
      } else {
        latency_.inter_token_latency.Observe(now - last_token);
      }
      last_token = now;
    }
    if (event.finish_reason) {
      latency_.e2e_request_latency.Observe(now - arrival);
      ++latency_.finished_by_reason[*event.finish_reason];
    }
    flight.client->Push(std::move(event));
  };
  auto finish = [&](RequestEvent event) {
    if (!flight.sent_first) {
      event.first = true;
      event.prompt_tokens = static_cast<int64_t>(request.prompt.size());
    }
    deliver(std::move(event));
  };
  // Reads one call's stream to its end, forwarding its tokens to the client (a prefill
  // instance's closing "transferred" is not the client's). Returns the call's status, with
  // DATA_LOSS when the instance's answer could not be trusted.
  struct StreamEnd {
    bool finished = false, transferred = false;
    grpc::Status status;
  };
  auto read = [&](grpc::ClientReader<pb::GenerateResponse>& reader, grpc::ClientContext& context,
                  Target& target, const std::function<void()>& on_tokens) {
    StreamEnd end;
    pb::GenerateResponse response;
    std::string garbage;  // what made the instance's answer untrustworthy
    const int64_t vocab = target.health.vocab_size();
    while (reader.Read(&response)) {
      if (end.finished || end.transferred || !garbage.empty()) continue;  // to the stream's end
      RequestEvent event = serve::EventFromProto(response);
      for (int32_t id : event.token_ids)
        if (id < 0 || id >= vocab)
          garbage = fmt::format("sent token id {} (vocabulary {})", id, vocab);
      if (request.params.logprobs && event.logprobs.size() != event.token_ids.size())
        garbage = "sent tokens without their log-probabilities";
      if (flight.generated.size() + event.token_ids.size() >
          static_cast<size_t>(request.params.max_tokens))
        garbage = "sent more tokens than max_tokens";
      if (!garbage.empty()) {
        context.TryCancel();
        continue;
      }
      if (!event.token_ids.empty() && on_tokens) on_tokens();
      flight.generated.insert(flight.generated.end(), event.token_ids.begin(),
                              event.token_ids.end());
      if (event.first && flight.sent_first) {  // a resumed attempt: the client has these facts
        event.first = false;
        event.prompt_logprobs.clear();
      }
      if (event.first) flight.sent_first = true;
      if (event.finish_reason && *event.finish_reason == "transferred") {
        end.transferred = true;
        event.finish_reason.reset();
        if (event.token_ids.empty() && !event.first) continue;
      }
      end.finished = event.finish_reason.has_value();
      if (end.finished || end.transferred) {
        // The instance is done with it: off its queue before the client hears, or the client's
        // next request could be routed while this one still weighs there.
        std::lock_guard<std::mutex> lock(mutex_);
        target.queue.Ended(request.id);
      }
      deliver(std::move(event));
    }
    end.status = reader.Finish();
    if (!garbage.empty()) end.status = grpc::Status(grpc::StatusCode::DATA_LOSS, garbage);
    return end;
  };
  // After an attempt that did not finish the request: whether it may go on (the failover count).
  auto give_up = [&](bool counts) {
    if (!counts) return false;
    ++failovers_total_;
    if (++failovers > options_.max_failovers || stopping_) {
      RequestEvent event;
      event.finish_reason = "error";
      event.error =
          "gave up after " + std::to_string(failovers - 1) + " failovers (" + last_error + ")";
      finish(std::move(event));
      return true;
    }
    return false;
  };
  auto refuse = [&](const grpc::Status& status) {
    RequestEvent event;
    event.finish_reason = "error";
    event.error = status.error_message();
    finish(std::move(event));
  };
  while (true) {
    if (flight.aborted) {
      RequestEvent event;
      event.finish_reason = "abort";
      finish(std::move(event));
      break;
    }
    // Where to: the page hashes of the prompt as sent (the engine's cap: the last token is
    // always computed), then the policy.
    EngineRequest attempt = request;
    attempt.prompt.insert(attempt.prompt.end(), flight.generated.begin(), flight.generated.end());
    attempt.resumed_tokens = static_cast<int64_t>(flight.generated.size());
    grpc::ClientContext context, decode_context;
    int chosen = -1, decode = -1;
    // The tokens this attempt adds to each instance's queue, as far as the router can tell.
    int64_t queued = 0, decode_queued = 0;
    // The prompt's page hashes, outside the lock.
    std::vector<uint64_t> hashes;
    uint64_t hash = 0;
    const int64_t n = static_cast<int64_t>(attempt.prompt.size());
    for (int64_t p = 0; (p + 1) * page_size_ <= n - 1; ++p) {
      hash = PagePool::ChainHash(
          hash, std::span<const int32_t>(attempt.prompt.data() + p * page_size_, page_size_));
      hashes.push_back(hash);
    }
    const std::string pool = disaggregated() ? "prefill" : "";
    std::string send_to;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      const double deadline = NowSeconds() + options_.failover_wait_seconds;
      auto pick = [&] {
        chosen = Pick(hashes, n, avoid, pool);
        if (chosen >= 0 && disaggregated()) {
          decode = Pick({}, n, avoid_decode, "decode");
          if (decode < 0) chosen = -1;
        }
        return chosen >= 0;
      };
      while (!pick() && !stopping_ && !flight.aborted && NowSeconds() < deadline)
        changed_.wait_for(lock, std::chrono::milliseconds(100));
      if (chosen >= 0) {
        Target& t = *targets_[chosen];
        ++t.in_flight;
        ++t.routed_total;
        // The work it adds before the next Load says so: its uncached prompt and its output
        // (a prefill instance's: one token).
        const int64_t output =
            disaggregated() ? 1 : request.params.max_tokens - attempt.resumed_tokens;
        queued = n - CachedTokens(t, hashes) + output;
        t.queue.Routed(request.id, queued);
        t.pending.Hold(hashes, NowSeconds());
        flight.context = &context;
        flight.target = chosen;
        if (decode >= 0) {
          Target& d = *targets_[decode];
          ++d.in_flight;
          ++d.routed_total;
          decode_queued = request.params.max_tokens - attempt.resumed_tokens;
          d.queue.Routed(request.id, decode_queued);
          send_to = d.health.transfer_address();
          flight.decode_context = &decode_context;
          flight.decode_target = decode;
        }
      }
    }
    if (chosen < 0) {
      RequestEvent event;
      event.finish_reason.emplace(flight.aborted ? "abort" : "error");
      if (!flight.aborted)
        event.error = last_error.empty()
                          ? "no healthy instance to serve the request"
                          : "no healthy instance to continue the request (" + last_error + ")";
      finish(std::move(event));
      break;
    }
    Target& target = *targets_[chosen];
    // Marks an instance failed after a call that broke (not a refusal of the request, not a
    // transfer refused), so its requests move on.
    auto after_call = [&](Target& t, const StreamEnd& end, bool was_decode) {
      std::lock_guard<std::mutex> lock(mutex_);
      --t.in_flight;
      t.queue.Ended(request.id);
      if (!was_decode) t.pending.Release(hashes, NowSeconds());
      if (was_decode) {
        flight.decode_context = nullptr;
        flight.decode_target = -1;
      } else {
        flight.context = nullptr;
        flight.target = -1;
      }
      const grpc::StatusCode code = end.status.error_code();
      if (!end.finished && !end.transferred && !flight.aborted && !stopping_ &&
          code != grpc::StatusCode::INVALID_ARGUMENT &&
          code != grpc::StatusCode::RESOURCE_EXHAUSTED && code != grpc::StatusCode::ABORTED &&
          code != grpc::StatusCode::CANCELLED) {
        ++t.failovers_from;
        if (t.healthy) MarkFailed(t, end.status.error_message());
      }
    };

    if (!disaggregated()) {
      auto reader = target.stub->Generate(&context, serve::RequestToProto(attempt));
      StreamEnd end = read(*reader, context, target, nullptr);
      {
        std::lock_guard<std::mutex> lock(mutex_);
        --target.in_flight;
        target.queue.Ended(request.id);
        target.pending.Release(hashes, NowSeconds());
        flight.context = nullptr;
        flight.target = -1;
        if (!end.finished && !flight.aborted && !stopping_ &&
            end.status.error_code() != grpc::StatusCode::INVALID_ARGUMENT &&
            end.status.error_code() != grpc::StatusCode::RESOURCE_EXHAUSTED) {
          ++target.failovers_from;
          if (target.healthy) MarkFailed(target, end.status.error_message());
        }
      }
      if (end.finished) break;
      if (flight.aborted) continue;  // reported at the top
      if (end.status.error_code() == grpc::StatusCode::INVALID_ARGUMENT) {
        refuse(end.status);
        break;
      }
      // The instance failed (or was full): the request moves on with its output so far.
      last_error = target.address + ": " + end.status.error_message();
      avoid = chosen;
      if (give_up(end.status.error_code() != grpc::StatusCode::RESOURCE_EXHAUSTED)) break;
      continue;
    }

    // Disaggregated: the decode call first (it announces the transfer), then the prefill call,
    // read to its end (the first token, then "transferred"), then the decode call's stream.
    Target& decoder = *targets_[decode];
    const uint64_t token = [] {
      static thread_local std::mt19937_64 rng(std::random_device{}());
      return rng() | 1;
    }();
    pb::GenerateRequest to_decode = serve::RequestToProto(attempt);
    to_decode.mutable_handoff()->set_receive(true);
    to_decode.mutable_handoff()->set_token(token);
    to_decode.mutable_params()->clear_prompt_logprobs();  // the prefill instance sends them
    pb::GenerateRequest to_prefill = serve::RequestToProto(attempt);
    to_prefill.mutable_handoff()->set_send_to(send_to);
    to_prefill.mutable_handoff()->set_token(token);
    auto decode_reader = decoder.stub->Generate(&decode_context, to_decode);
    const double attempt_start = NowSeconds();
    const bool first_attempt = flight.generated.empty();
    double handed_at = 0, last_decode = 0;
    auto prefill_reader = target.stub->Generate(&context, to_prefill);
    StreamEnd prefilled = read(*prefill_reader, context, target, [&] {
      const double now = NowSeconds();
      std::lock_guard<std::mutex> lock(mutex_);
      if (first_attempt) prefill_ttft_.Observe(now - attempt_start);
      handed_at = now;
    });
    after_call(target, prefilled, false);
    StreamEnd decoded;
    if (prefilled.transferred) {
      decoded = read(*decode_reader, decode_context, decoder, [&] {
        const double now = NowSeconds();
        std::lock_guard<std::mutex> lock(mutex_);
        if (last_decode == 0 && handed_at > 0) handoff_.Observe(now - handed_at);
        if (last_decode > 0) decode_itl_.Observe(now - last_decode);
        last_decode = now;
      });
    } else {
      decode_context.TryCancel();  // nothing comes: the prefill call ended otherwise
      decoded.status = decode_reader->Finish();
      decoded.status = grpc::Status(grpc::StatusCode::CANCELLED, "");
    }
    after_call(decoder, decoded, true);
    if (prefilled.finished || decoded.finished) break;
    if (flight.aborted) continue;  // reported at the top
    const StreamEnd& failed = prefilled.transferred ? decoded : prefilled;
    Target& where = prefilled.transferred ? decoder : target;
    if (failed.status.error_code() == grpc::StatusCode::INVALID_ARGUMENT) {
      refuse(failed.status);
      break;
    }
    last_error = where.address + ": " + failed.status.error_message();
    if (failed.status.error_code() == grpc::StatusCode::ABORTED) {
      // A transfer refused (checksum) or failed: redone with a new token, the same instances
      // preferred (the prefill's cache now holds the prompt) — but not a decode instance the
      // prefill could not reach.
      if (!prefilled.transferred) avoid_decode = decode;
      ++transfers_redone_total_;
      std::fprintf(stderr, "switchyard route: request %s: transfer redone (%s)\n",
                   request.id.c_str(), last_error.c_str());
      if (give_up(true)) break;
      continue;
    }
    if (prefilled.transferred)
      avoid_decode = decode;
    else
      avoid = chosen;
    if (give_up(failed.status.error_code() != grpc::StatusCode::RESOURCE_EXHAUSTED)) break;
  }
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = flights_.find(request.id);
  if (it != flights_.end()) {
    finished_.push_back(std::move(it->second));
    flights_.erase(it);
  }
  changed_.notify_all();
}

void Router::Abort(const std::string& id) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = flights_.find(id);
  if (it == flights_.end()) return;
  it->second->aborted = true;
  if (it->second->context) it->second->context->TryCancel();
  if (it->second->decode_context) it->second->decode_context->TryCancel();
  changed_.notify_all();
}

EngineMetrics Router::Metrics() const {
  std::lock_guard<std::mutex> lock(mutex_);
  EngineMetrics m;
  m.time_to_first_token = latency_.time_to_first_token;
  m.inter_token_latency = latency_.inter_token_latency;
  m.e2e_request_latency = latency_.e2e_request_latency;
  m.finished_by_reason = latency_.finished_by_reason;
  if (disaggregated()) {
    m.extra_histograms.push_back({"router_time_to_first_token_seconds",
                                  "Time to the first token, by pool: the prefill instance's "
                                  "first attempt.",
                                  "pool=\"prefill\"", prefill_ttft_});
    m.extra_histograms.push_back({"router_inter_token_latency_seconds",
                                  "Time between tokens, by pool: a decode instance's stream.",
                                  "pool=\"decode\"", decode_itl_});
    m.extra_histograms.push_back({"router_handoff_seconds",
                                  "From the prefill instance's first token to the decode "
                                  "instance's first.",
                                  "pool=\"decode\"", handoff_});
    m.extra_values.push_back({"router_kv_transfers_redone_total", "counter",
                              "Attempts redone because their transfer was refused or failed.",
                              "pool=\"decode\"",
                              static_cast<double>(transfers_redone_total_.load())});
  }
  m.healthy = false;
  for (const auto& t : targets_) {
    if (!t->healthy) continue;
    m.healthy = true;
    const pb::LoadResponse& l = t->load;
    m.running += l.running();
    m.waiting += l.waiting();
    m.queued_tokens += l.queued_tokens();
    m.total_pages += l.total_pages();
    m.used_pages += l.used_pages();
    m.cached_pages += l.cached_pages();
    m.free_pages += l.free_pages();
    m.steps_total += l.steps_total();
    m.prompt_tokens_total += l.prompt_tokens_total();
    m.generation_tokens_total += l.generation_tokens_total();
    m.prefix_cache_hits_total += l.prefix_cache_hits_total();
    m.last_step_age_seconds = std::max(m.last_step_age_seconds, l.last_step_age_seconds());
  }
  return m;
}

std::vector<TargetState> Router::Targets() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<TargetState> out;
  for (const auto& t : targets_)
    out.push_back({t->address, t->pool, t->healthy, t->in_flight, t->routed_total,
                   static_cast<int64_t>(t->cached.size()), t->failovers_from, t->missed_probes,
                   t->draining, t->health.transfer_address()});
  return out;
}

bool Router::SetDraining(const std::string& address, bool draining) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto& t : targets_) {
    if (t->address != address) continue;
    t->draining = draining;
    std::fprintf(stderr, "switchyard route: %s %s\n", address.c_str(),
                 draining ? "draining (no new requests)" : "resumed");
    changed_.notify_all();
    return true;
  }
  return false;
}

void Router::Stop(bool drain) {
  if (drain) {
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait(lock, [&] { return flights_.empty(); });
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopped_) return;
    stopped_ = true;
    stopping_ = true;
    for (auto& [id, flight] : flights_) {
      flight->aborted = true;
      if (flight->context) flight->context->TryCancel();
      if (flight->decode_context) flight->decode_context->TryCancel();
    }
    for (auto& t : targets_)
      if (t->mirror_context) t->mirror_context->TryCancel();
    changed_.notify_all();
  }
  // Flights end on their own once cancelled; join them, then the probers and mirrors.
  while (true) {
    std::vector<std::unique_ptr<Flight>> to_join;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      to_join.swap(finished_);
      if (to_join.empty() && flights_.empty()) break;
    }
    for (auto& f : to_join)
      if (f->thread.joinable()) f->thread.join();
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  for (auto& t : targets_) {
    if (t->prober.joinable()) t->prober.join();
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (t->mirror_context) t->mirror_context->TryCancel();
    }
    if (t->mirror.joinable()) t->mirror.join();
  }
}

}  // namespace sy::route
