// switchyard route: one OpenAI-compatible front over several engine instances reached through
// their gRPC instance API (proto/switchyard/v1/engine.proto). The router is a RequestFrontend,
// so the HTTP server of `serve` runs unchanged in front of it; it tokenizes once and routes ids.
//
//   Placement: cache_aware (default) mirrors every instance's prefix cache exactly from its
//   CacheEvents stream and sends a request where the work ahead of it — the instance's queued
//   tokens plus the prompt tokens it would have to compute — is least; least_load (queued
//   tokens), round_robin, power_of_two (the less loaded of two at random).
//   Health: Health and Load probed every --probe-interval, each within --probe-timeout. An
//   instance whose stream breaks, or whose step has run past --stall-timeout, is ejected at once;
//   one that misses --probe-failures probes in a row is ejected then (one missed probe is a busy
//   machine as often as a dead instance: it gets no new requests while another can take them,
//   and its streams go on). Ejected instances are readmitted when their probes pass again.
//   Failover: the router keeps each request's prompt and the tokens already streamed; when its
//   instance fails, the request goes to another with prompt + output as the new prompt
//   (resumed_tokens), and the client's stream continues where it was.
//   Disaggregation (--prefill-engines, --decode-engines): each attempt runs on a pair — the
//   prefill instance chosen by the policy over its pool (its cache mirror), the decode instance
//   with the fewest queued tokens — joined by a token the router makes for the attempt; the
//   prefill streams the first token and sends the rows, the decode instance the rest. A failed
//   or refused transfer is redone; a failed instance of either pool fails over as above.
#pragma once

#include <atomic>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "base/status.h"
#include "engine/engine.h"

namespace grpc {
class ChannelCredentials;
}

namespace sy::route {

enum class Policy { kCacheAware, kLeastLoad, kRoundRobin, kPowerOfTwo };
Result<Policy> ParsePolicy(const std::string& name);
const char* PolicyName(Policy policy);

struct RouterOptions {
  std::vector<std::string> engines;  // host:port of each instance's gRPC port
  // Disaggregation: serve --role prefill and --role decode instances (instead of `engines`).
  std::vector<std::string> prefill_engines, decode_engines;
  Policy policy = Policy::kCacheAware;
  double probe_interval_seconds = 0.25;
  double probe_timeout_seconds = 2;   // a probe's deadline (Health and Load together)
  int probe_failures = 3;             // missed in a row that eject a serving instance
  double stall_timeout_seconds = 10;  // a step running longer marks its instance stalled
  double failover_wait_seconds = 60;  // how long a request waits for a healthy instance
  int max_failovers = 4;
  int64_t max_requests = 4096;  // in the router at once; more get 503 with Retry-After
  // The instances' channels: mutual TLS (serve/grpc_tls.h) or, when null, clear text.
  std::shared_ptr<grpc::ChannelCredentials> credentials;
};

// What the router knows of the instances, for logs and tests.
struct TargetState {
  std::string address;
  std::string pool;  // "", "prefill" or "decode"
  bool healthy = false;
  int64_t in_flight = 0;         // the router's requests there now
  int64_t routed_total = 0;      // requests sent there
  int64_t cached_pages = 0;      // in the mirror
  int64_t failovers_from = 0;    // requests moved away after it failed
  int64_t missed_probes = 0;     // in a row, now (ejected at RouterOptions::probe_failures)
  bool draining = false;         // by the admin: no new requests
  std::string transfer_address;  // a decode instance's, where prefill instances send rows
};

class Router : public RequestFrontend {
 public:
  explicit Router(RouterOptions options);
  ~Router() override;

  // Connects to every instance and waits up to `seconds` for one to be healthy; errors if none
  // is, or if healthy instances disagree on the vocabulary or page size.
  Status Start(double seconds);

  Result<std::shared_ptr<RequestStream>> Submit(EngineRequest request, SubmitError* error) override;
  void Abort(const std::string& id) override;
  EngineMetrics Metrics() const override;
  void Stop(bool drain) override;

  RequestLimits limits() const;
  std::vector<TargetState> Targets() const;
  // Graceful drain of one instance (host:port): it gets no new requests; those it runs finish
  // there. Resume undoes it. False: no such instance.
  bool SetDraining(const std::string& address, bool draining);
  int64_t failovers_total() const { return failovers_total_; }
  int64_t transfers_redone_total() const { return transfers_redone_total_; }
  bool disaggregated() const { return !options_.prefill_engines.empty(); }

 private:
  struct Target;
  struct Flight;
  void Probe(Target& target);
  void Mirror(Target& target);
  void Fly(Flight& flight);
  // The target for a request (-1: none healthy); `avoid`, and targets that missed their last
  // probe, are skipped while others are healthy. Only targets of `pool` ("" when not
  // disaggregated); the decode pool by queued tokens alone.
  int Pick(const std::vector<uint64_t>& page_hashes, int64_t tokens, int avoid,
           const std::string& pool = "");
  bool AnyUsable(const std::string& pool) const;
  void MarkFailed(Target& target, const std::string& why);
  // Tokens of the request's leading pages the target holds or will soon hold (mirror + pending).
  static int64_t CachedTokens(const Target& target, const std::vector<uint64_t>& page_hashes);
  bool Stopping() const { return stopping_; }

  RouterOptions options_;
  std::vector<std::unique_ptr<Target>> targets_;
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::map<std::string, std::unique_ptr<Flight>> flights_;
  std::vector<std::unique_ptr<Flight>> finished_;  // joined at the next Submit or at Stop
  std::atomic<bool> stopping_{false};
  std::atomic<int64_t> failovers_total_{0};
  std::atomic<int64_t> transfers_redone_total_{0};
  // Round-robin turns, one count per pool: a shared count, taken by each request's prefill and
  // decode picks in turn, sent every request to the same prefill instance of an even pool.
  std::map<std::string, uint64_t> rotation_;
  int64_t page_size_ = 16;  // the instances' (checked alike at Start), for prompt page hashes
  EngineMetrics latency_;   // the router's own histograms and finish counts (guarded by mutex_)
  // Disaggregation, per pool: TTFT on the prefill pool, between tokens on the decode pool, and
  // the handoff (the first token to the decode instance's first).
  Histogram prefill_ttft_, decode_itl_, handoff_;
  bool stopped_ = false;
};

}  // namespace sy::route
