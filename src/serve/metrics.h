// /metrics in Prometheus' text format, with vLLM's metric names under a "switchyard:" prefix.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "engine/engine.h"
#include "serve/responses_store.h"

namespace sy::transfer {
class Sender;
struct TransferStats;
class Receiver;
}  // namespace sy::transfer

namespace sy::serve {

// The HTTP front's answers: how many, by endpoint (its route, ids left out: "/v1/responses/{id}"),
// method and status class ("2xx", "4xx", ...), as http_requests_total. Thread-safe.
class HttpRequestCounts {
 public:
  // The route `path` is counted under: a known endpoint, its template, or "other" (so unknown
  // paths cannot grow the label set).
  static std::string Route(const std::string& path);
  void Count(const std::string& route, const std::string& method, int status);
  struct Row {
    std::string route, method, status_class;
    int64_t count = 0;
  };
  std::vector<Row> Rows() const;

 private:
  mutable std::mutex mutex_;
  std::map<std::tuple<std::string, std::string, std::string>, int64_t> counts_;
};

// The Batch APIs' work (serve/batches.h: OpenAI's batches and Anthropic's message batches
// together), for /metrics: how much is queued behind live traffic, and how it ended.
struct BatchGauges {
  int64_t batches_running = 0;   // not yet ended
  int64_t requests_waiting = 0;  // running batches' lines not yet submitted
  int64_t requests_running = 0;  // lines in the engine
  // Lines this process ended, by outcome: a response, an error, stopped by a cancel, or left
  // when the batch's completion window ran out.
  int64_t succeeded_total = 0, errored_total = 0, canceled_total = 0, expired_total = 0;
};

// `responses`: the Responses API's store, when the server keeps one (responses_stored,
// responses_store_bytes, responses_store_evictions_total); `http`: the front's answers;
// `batches`: the Batch APIs' work, where the server runs them.
std::string PrometheusText(const EngineMetrics& metrics, const std::string& model_name,
                           const ResponsesStore* responses = nullptr,
                           const HttpRequestCounts* http = nullptr,
                           const BatchGauges* batches = nullptr);

// The expert-parallel imbalance over the last completed window of `serve --record-expert-load`
// (busiest rank's routed rows over the mean rank's, summed over layers and steps), and per MoE
// layer: published by the step loop at each window's end, shown by every /metrics from then on.
// Process-wide, as there is one server per process.
void PublishExpertImbalance(double imbalance, std::vector<std::pair<int64_t, double>> per_layer);

// Disaggregation: the transfers of a prefill instance (sent) or a decode instance (received),
// shown by every /metrics of this process (kv_transfers_total, kv_transfer_bytes_total,
// kv_transfer_seconds_total, kv_transfers_refused_total, by side). Either may be null.
void PublishTransfers(const transfer::Sender* sender, const transfer::Receiver* receiver);
// A disaggregated job under mpirun: what its groups' senders or receivers moved
// (ClusterServing::Transfers), shown as `side` ("send" or "receive"); null stats: none.
void PublishJobTransfers(const std::string& side, std::function<transfer::TransferStats()> stats);

}  // namespace sy::serve
