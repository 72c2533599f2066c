#include "serve/metrics.h"

#include <fmt/format.h>

#include <mutex>
#include <optional>

#include "kernels/cpu/latent_row.h"
#include "transfer/kv_transfer.h"

namespace sy::serve {
namespace {

struct ExpertImbalanceGauge {
  std::mutex mutex;
  std::optional<double> total;
  std::vector<std::pair<int64_t, double>> per_layer;
};

struct PublishedTransfers {
  std::mutex mutex;
  const transfer::Sender* sender = nullptr;
  const transfer::Receiver* receiver = nullptr;
  std::string job_side;
  std::function<transfer::TransferStats()> job;
};

PublishedTransfers& Transfers() {
  static PublishedTransfers transfers;
  return transfers;
}

ExpertImbalanceGauge& PublishedImbalance() {
  static ExpertImbalanceGauge gauge;
  return gauge;
}

void Metric(std::string& out, const char* name, const char* type, const char* help,
            const std::string& labels, double value) {
  out += fmt::format("# HELP switchyard:{} {}\n# TYPE switchyard:{} {}\nswitchyard:{}{{{}}} {}\n",
                     name, help, name, type, name, labels, value);
}

void HistogramText(std::string& out, const char* name, const char* help, const std::string& labels,
                   const Histogram& h) {
  out += fmt::format("# HELP switchyard:{} {}\n# TYPE switchyard:{} histogram\n", name, help, name);
  int64_t cumulative = 0;
  for (size_t i = 0; i < h.bounds.size(); ++i) {
    cumulative += h.counts[i];
    out += fmt::format("switchyard:{}_bucket{{{},le=\"{}\"}} {}\n", name, labels, h.bounds[i],
                       cumulative);
  }
  cumulative += h.counts.back();
  out += fmt::format("switchyard:{}_bucket{{{},le=\"+Inf\"}} {}\n", name, labels, cumulative);
  out += fmt::format("switchyard:{}_sum{{{}}} {}\nswitchyard:{}_count{{{}}} {}\n", name, labels,
                     h.sum, name, labels, h.count);
}

}  // namespace

std::string HttpRequestCounts::Route(const std::string& path) {
  static const char* const kExact[] = {"/health",
                                       "/metrics",
                                       "/tokenize",
                                       "/detokenize",
                                       "/v1/models",
                                       "/v1/completions",
                                       "/v1/chat/completions",
                                       "/v1/responses",
                                       "/v1/messages",
                                       "/v1/messages/count_tokens"};
  for (const char* route : kExact)
    if (path == route) return route;
  if (path.starts_with("/v1/models/")) return "/v1/models/{id}";
  if (path.starts_with("/v1/responses/")) {
    for (const char* tail : {"/input_items", "/cancel"})
      if (path.ends_with(tail)) return std::string("/v1/responses/{id}") + tail;
    return "/v1/responses/{id}";
  }
  if (path == "/v1/conversations") return path;
  if (path.starts_with("/v1/conversations/")) {
    const size_t items = path.find("/items");
    if (items == std::string::npos) return "/v1/conversations/{id}";
    return path.size() > items + 6 ? "/v1/conversations/{id}/items/{item_id}"
                                   : "/v1/conversations/{id}/items";
  }
  for (const char* base : {"/v1/files", "/v1/batches", "/v1/messages/batches"}) {
    const std::string prefix = std::string(base) + "/";
    if (path == base) return base;
    if (!path.starts_with(prefix)) continue;
    for (const char* tail : {"/content", "/cancel", "/results"})
      if (path.ends_with(tail)) return std::string(base) + "/{id}" + tail;
    return std::string(base) + "/{id}";
  }
  if (path.starts_with("/admin/")) return "/admin";
  return "other";
}

void HttpRequestCounts::Count(const std::string& route, const std::string& method, int status) {
  const std::string status_class = fmt::format("{}xx", status / 100);
  std::lock_guard lock(mutex_);
  ++counts_[{route, method, status_class}];
}

std::vector<HttpRequestCounts::Row> HttpRequestCounts::Rows() const {
  std::lock_guard lock(mutex_);
  std::vector<Row> rows;
  for (const auto& [key, count] : counts_)
    rows.push_back({std::get<0>(key), std::get<1>(key), std::get<2>(key), count});
  return rows;
}

std::string PrometheusText(const EngineMetrics& m, const std::string& model_name,
                           const ResponsesStore* responses, const HttpRequestCounts* http,
                           const BatchGauges* batches) {
  std::string escaped;
  for (char c : model_name) {
    if (c == '\\' || c == '"') escaped += '\\';
    if (c == '\n') {
      escaped += "\\n";
      continue;
    }
    escaped += c;
  }
  const std::string labels = fmt::format("model_name=\"{}\"", escaped);
  std::string out;
  Metric(out, "num_requests_running", "gauge", "Requests in the running batch.", labels,
         static_cast<double>(m.running));
  Metric(out, "num_requests_waiting", "gauge", "Requests waiting to be admitted.", labels,
         static_cast<double>(m.waiting));
  Metric(out, "kv_cache_usage_perc", "gauge",
         "Fraction of latent-cache pages held by requests (1 = full).", labels,
         m.total_pages > 0 ? static_cast<double>(m.used_pages) / m.total_pages : 0.0);
  // vLLM's cache_config_info: the configuration as labels of a constant 1.
  Metric(out, "cache_config_info", "gauge",
         "The latent cache's configuration (block_size in tokens, cache_dtype, num_blocks, "
         "bytes_per_token over all layers).",
         fmt::format("{},block_size=\"{}\",cache_dtype=\"{}\",num_blocks=\"{}\","
                     "bytes_per_token=\"{}\"",
                     labels, m.page_size, kernels::LatentCacheDTypeName(m.cache_dtype),
                     m.total_pages, m.cache_bytes_per_token),
         1.0);
  Metric(out, "prompt_tokens_total", "counter", "Prompt tokens admitted.", labels,
         static_cast<double>(m.prompt_tokens_total));
  Metric(out, "generation_tokens_total", "counter", "Tokens generated.", labels,
         static_cast<double>(m.generation_tokens_total));
  out +=
      "# HELP switchyard:request_success_total Requests finished, by reason.\n"
      "# TYPE switchyard:request_success_total counter\n";
  for (const char* reason : {"stop", "length", "abort", "error"}) {
    auto it = m.finished_by_reason.find(reason);
    out += fmt::format("switchyard:request_success_total{{{},finished_reason=\"{}\"}} {}\n", labels,
                       reason, it == m.finished_by_reason.end() ? 0 : it->second);
  }
  Metric(out, "num_preemptions_total", "counter",
         "Requests preempted (for want of cache pages, or for a more urgent request).", labels,
         static_cast<double>(m.preemptions_total));
  Metric(out, "prefix_cache_queries_total", "counter",
         "Prompt tokens looked up in the prefix cache.", labels,
         static_cast<double>(m.prefix_cache_queries_total));
  Metric(out, "prefix_cache_hits_total", "counter", "Prompt tokens found in the prefix cache.",
         labels, static_cast<double>(m.prefix_cache_hits_total));
  Metric(out, "spec_decode_num_drafts_total", "counter",
         "Verification steps of sequences with drafts (MTP or n-gram).", labels,
         static_cast<double>(m.spec_drafts_total));
  Metric(out, "spec_decode_num_draft_tokens_total", "counter", "Draft tokens proposed.", labels,
         static_cast<double>(m.spec_draft_tokens_total));
  Metric(out, "spec_decode_num_accepted_tokens_total", "counter", "Draft tokens accepted.", labels,
         static_cast<double>(m.spec_accepted_tokens_total));
  out +=
      "# HELP switchyard:spec_decode_num_accepted_tokens_per_pos_total Draft tokens accepted, "
      "by draft position.\n"
      "# TYPE switchyard:spec_decode_num_accepted_tokens_per_pos_total counter\n";
  for (size_t i = 0; i < m.spec_accepted_per_position.size(); ++i)
    out += fmt::format(
        "switchyard:spec_decode_num_accepted_tokens_per_pos_total{{{},position=\"{}\"}} {}\n",
        labels, i, m.spec_accepted_per_position[i]);
  // vLLM's request histograms; one a frontend does not keep (no bounds: the router's token
  // counts) is left out.
  EngineMetrics histograms = m;
  for (const EngineMetrics::NamedHistogram& h : histograms.Histograms())
    if (!h.histogram->bounds.empty()) HistogramText(out, h.name, h.help, labels, *h.histogram);
  auto with = [&](const std::string& more) { return more.empty() ? labels : labels + "," + more; };
  for (const LabeledHistogram& h : m.extra_histograms)
    HistogramText(out, h.name.c_str(), h.help.c_str(), with(h.labels), h.histogram);
  for (const LabeledValue& v : m.extra_values)
    Metric(out, v.name.c_str(), v.type.c_str(), v.help.c_str(), with(v.labels), v.value);
  {
    PublishedTransfers& t = Transfers();
    std::lock_guard<std::mutex> lock(t.mutex);
    std::vector<std::pair<const char*, transfer::TransferStats>> sides;
    if (t.sender) sides.push_back({"send", t.sender->stats()});
    if (t.receiver) sides.push_back({"receive", t.receiver->stats()});
    if (t.job) sides.push_back({t.job_side.c_str(), t.job()});
    for (const auto& [side, stats] : sides) {
      const std::string l = labels + fmt::format(",side=\"{}\"", side);
      Metric(out, "kv_transfers_total", "counter",
             "Requests whose latent rows were all sent or received.", l,
             static_cast<double>(stats.transfers));
      Metric(out, "kv_transfer_bytes_total", "counter", "Bytes of latent-row transfers.", l,
             static_cast<double>(stats.bytes));
      Metric(out, "kv_transfer_seconds_total", "counter",
             "Seconds from a transfer's first message to its last, summed.", l, stats.seconds);
      Metric(out, "kv_transfers_refused_total", "counter",
             "Transfer messages refused (checksum, token) and transfers that failed.", l,
             static_cast<double>(stats.refused));
      if (std::string(side) == "receive")
        Metric(out, "kv_transfers_awaited", "gauge",
               "Requests admitted for decoding whose latent rows have not all arrived.", l,
               static_cast<double>(stats.awaited));
    }
  }
  if (http) {
    out +=
        "# HELP switchyard:http_requests_total HTTP requests answered, by endpoint, method and "
        "status class.\n# TYPE switchyard:http_requests_total counter\n";
    for (const auto& row : http->Rows())
      out += fmt::format(
          "switchyard:http_requests_total{{{},handler=\"{}\",method=\"{}\",status=\"{}\"}} {}\n",
          labels, row.route, row.method, row.status_class, row.count);
  }
  if (batches) {
    Metric(out, "batches_running", "gauge",
           "Batches (OpenAI's and Anthropic's message batches) not yet ended.", labels,
           static_cast<double>(batches->batches_running));
    Metric(out, "batch_requests_waiting", "gauge",
           "Lines of running batches not yet submitted (they run behind live requests).", labels,
           static_cast<double>(batches->requests_waiting));
    Metric(out, "batch_requests_running", "gauge", "Batch lines in the engine.", labels,
           static_cast<double>(batches->requests_running));
    out +=
        "# HELP switchyard:batch_requests_total Batch lines ended by this process, by outcome.\n"
        "# TYPE switchyard:batch_requests_total counter\n";
    for (const auto& [outcome, count] : {std::pair{"succeeded", batches->succeeded_total},
                                         std::pair{"errored", batches->errored_total},
                                         std::pair{"canceled", batches->canceled_total},
                                         std::pair{"expired", batches->expired_total}})
      out += fmt::format("switchyard:batch_requests_total{{{},outcome=\"{}\"}} {}\n", labels,
                         outcome, count);
  }
  if (responses) {
    Metric(out, "responses_stored", "gauge",
           "Responses API responses and Anthropic thread replies kept in the store.", labels,
           static_cast<double>(responses->size()));
    Metric(out, "responses_store_bytes", "gauge",
           "Bytes the stored responses take (their JSON), against --responses-store-mb.", labels,
           static_cast<double>(responses->bytes()));
    Metric(out, "responses_store_evictions_total", "counter",
           "Stored responses dropped, least recently used first, to keep the store's budget.",
           labels, static_cast<double>(responses->evictions()));
  }
  ExpertImbalanceGauge& gauge = PublishedImbalance();
  std::lock_guard<std::mutex> lock(gauge.mutex);
  if (gauge.total) {
    Metric(out, "expert_imbalance", "gauge",
           "Busiest expert-parallel rank's routed tokens over the mean rank's, summed over MoE "
           "layers and steps of the last expert-load window.",
           labels, *gauge.total);
    out +=
        "# HELP switchyard:expert_imbalance_layer The same for one MoE layer.\n"
        "# TYPE switchyard:expert_imbalance_layer gauge\n";
    for (const auto& [layer, value] : gauge.per_layer)
      out += fmt::format("switchyard:expert_imbalance_layer{{{},layer=\"{}\"}} {}\n", labels, layer,
                         value);
  }
  return out;
}

void PublishTransfers(const transfer::Sender* sender, const transfer::Receiver* receiver) {
  PublishedTransfers& t = Transfers();
  std::lock_guard<std::mutex> lock(t.mutex);
  t.sender = sender;
  t.receiver = receiver;
}

void PublishJobTransfers(const std::string& side, std::function<transfer::TransferStats()> stats) {
  PublishedTransfers& t = Transfers();
  std::lock_guard<std::mutex> lock(t.mutex);
  t.job_side = side;
  t.job = std::move(stats);
}

void PublishExpertImbalance(double imbalance, std::vector<std::pair<int64_t, double>> per_layer) {
  ExpertImbalanceGauge& gauge = PublishedImbalance();
  std::lock_guard<std::mutex> lock(gauge.mutex);
  gauge.total = imbalance;
  gauge.per_layer = std::move(per_layer);
}

}  // namespace sy::serve
