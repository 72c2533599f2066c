#include "serve/cluster.h"

#include <chrono>
#include <cstring>
#include <random>

#include <nlohmann/json.hpp>

#include "transfer/wire.h"

namespace sy::serve {
namespace {

using json = nlohmann::json;

std::string Dump(const json& value) {
  return value.dump(-1, ' ', false, json::error_handler_t::replace);
}

json ParamsToJson(const SamplingParams& p) {
  json bias = json::array();
  for (const auto& [t, b] : p.logit_bias)
    bias.push_back({t, b});
  json grammar = nullptr;  // every rank compiles it and masks the same way
  if (p.grammar)
    grammar = {{"kind", static_cast<int>(p.grammar->kind)},
               {"text", p.grammar->text},
               {"choices", p.grammar->choices},
               {"begin_after", p.grammar->begin_after}};
  return {{"grammar", grammar},
          {"temperature", p.temperature},
          {"top_p", p.top_p},
          {"top_k", p.top_k},
          {"min_p", p.min_p},
          {"seed", p.seed ? json(*p.seed) : json(nullptr)},
          {"presence_penalty", p.presence_penalty},
          {"frequency_penalty", p.frequency_penalty},
          {"repetition_penalty", p.repetition_penalty},
          {"logit_bias", bias},
          {"stop", p.stop},
          {"stop_token_ids", p.stop_token_ids},
          {"ignore_eos", p.ignore_eos},
          {"max_tokens", p.max_tokens},
          {"min_tokens", p.min_tokens},
          {"logprobs", p.logprobs ? json(*p.logprobs) : json(nullptr)},
          {"prompt_logprobs", p.prompt_logprobs ? json(*p.prompt_logprobs) : json(nullptr)},
          {"skip_special_tokens", p.skip_special_tokens},
          {"include_stop_str_in_output", p.include_stop_str_in_output},
          {"thinking_token_budget",
           p.thinking_token_budget ? json(*p.thinking_token_budget) : json(nullptr)},
          {"starts_in_thinking", p.starts_in_thinking},
          {"allowed_token_ids", p.allowed_token_ids},
          {"bad_words_token_ids", p.bad_words_token_ids}};
}

SamplingParams ParamsFromJson(const json& j) {
  SamplingParams p;
  p.temperature = j["temperature"];
  p.top_p = j["top_p"];
  p.top_k = j["top_k"];
  p.min_p = j["min_p"];
  if (!j["seed"].is_null()) p.seed = j["seed"].get<uint64_t>();
  p.presence_penalty = j["presence_penalty"];
  p.frequency_penalty = j["frequency_penalty"];
  p.repetition_penalty = j["repetition_penalty"];
  for (const auto& pair : j["logit_bias"])
    p.logit_bias[pair[0].get<int32_t>()] = pair[1].get<double>();
  p.stop = j["stop"].get<std::vector<std::string>>();
  p.stop_token_ids = j["stop_token_ids"].get<std::vector<int32_t>>();
  p.ignore_eos = j["ignore_eos"];
  p.max_tokens = j["max_tokens"];
  p.min_tokens = j["min_tokens"];
  if (!j["logprobs"].is_null()) p.logprobs = j["logprobs"].get<int64_t>();
  if (!j["prompt_logprobs"].is_null()) p.prompt_logprobs = j["prompt_logprobs"].get<int64_t>();
  p.skip_special_tokens = j["skip_special_tokens"];
  p.include_stop_str_in_output = j["include_stop_str_in_output"];
  if (!j["thinking_token_budget"].is_null())
    p.thinking_token_budget = j["thinking_token_budget"].get<int64_t>();
  p.starts_in_thinking = j["starts_in_thinking"];
  p.allowed_token_ids = j["allowed_token_ids"].get<std::vector<int32_t>>();
  p.bad_words_token_ids = j["bad_words_token_ids"].get<std::vector<std::vector<int32_t>>>();
  if (!j["grammar"].is_null())
    p.grammar = structured::GrammarSpec{
        static_cast<structured::GrammarSpec::Kind>(j["grammar"]["kind"].get<int>()),
        j["grammar"]["text"].get<std::string>(),
        j["grammar"]["choices"].get<std::vector<std::string>>(),
        j["grammar"]["begin_after"].get<std::string>()};
  return p;
}

json LogprobToJson(const TokenLogprob& l) {
  json top = json::array();
  for (const auto& [t, v] : l.top)
    top.push_back({t, v});
  return {l.token, l.logprob, top, l.rank};
}

TokenLogprob LogprobFromJson(const json& j) {
  TokenLogprob l;
  l.token = j[0];
  l.logprob = j[1];
  l.rank = j[3];
  for (const auto& pair : j[2])
    l.top.push_back({pair[0].get<int32_t>(), pair[1].get<float>()});
  return l;
}

json EventToJson(const std::string& id, const RequestEvent& e) {
  json logprobs = json::array(), prompt_logprobs = json::array();
  for (const auto& l : e.logprobs)
    logprobs.push_back(LogprobToJson(l));
  for (const auto& l : e.prompt_logprobs)
    prompt_logprobs.push_back(l ? LogprobToJson(*l) : json(nullptr));
  // The text is whole characters (the detokenizer never splits one), so JSON carries it as is.
  return {{"id", id},
          {"tokens", e.token_ids},
          {"text", e.text},
          {"logprobs", logprobs},
          {"finish", e.finish_reason ? json(*e.finish_reason) : json(nullptr)},
          {"error", e.error},
          {"stop_string", e.stop_string ? json(*e.stop_string) : json(nullptr)},
          {"stop_token", e.stop_token ? json(*e.stop_token) : json(nullptr)},
          {"first", e.first},
          {"prompt_tokens", e.prompt_tokens},
          {"cached_tokens", e.cached_tokens},
          {"prompt_logprobs", prompt_logprobs}};
}

RequestEvent EventFromJson(const json& j) {
  RequestEvent e;
  e.token_ids = j["tokens"].get<std::vector<int32_t>>();
  e.text = j["text"];
  for (const auto& l : j["logprobs"])
    e.logprobs.push_back(LogprobFromJson(l));
  if (!j["finish"].is_null()) e.finish_reason = j["finish"].get<std::string>();
  e.error = j["error"];
  if (!j["stop_string"].is_null()) e.stop_string = j["stop_string"].get<std::string>();
  if (!j["stop_token"].is_null()) e.stop_token = j["stop_token"].get<int32_t>();
  e.first = j["first"];
  e.prompt_tokens = j["prompt_tokens"];
  e.cached_tokens = j["cached_tokens"];
  for (const auto& l : j["prompt_logprobs"])
    e.prompt_logprobs.push_back(l.is_null() ? std::nullopt : std::optional(LogprobFromJson(l)));
  return e;
}

json HistogramToJson(const Histogram& h) {
  return {h.counts, h.sum, h.count};
}
void AddHistogram(Histogram& into, const json& j) {
  const auto counts = j[0].get<std::vector<int64_t>>();
  for (size_t i = 0; i < counts.size() && i < into.counts.size(); ++i)
    into.counts[i] += counts[i];
  into.sum += j[1].get<double>();
  into.count += j[2].get<int64_t>();
}

json MetricsToJson(const EngineMetrics& m) {
  json histograms = json::object();
  EngineMetrics copy = m;
  for (const EngineMetrics::NamedHistogram& h : copy.Histograms())
    histograms[h.name] = HistogramToJson(*h.histogram);
  return {{"running", m.running},
          {"waiting", m.waiting},
          {"total_pages", m.total_pages},
          {"used_pages", m.used_pages},
          {"cached_pages", m.cached_pages},
          {"free_pages", m.free_pages},
          {"queued_tokens", m.queued_tokens},
          {"queued_requests", m.queued_requests},
          {"prompt", m.prompt_tokens_total},
          {"generation", m.generation_tokens_total},
          {"preemptions", m.preemptions_total},
          {"queries", m.prefix_cache_queries_total},
          {"hits", m.prefix_cache_hits_total},
          {"steps", m.steps_total},
          {"spec", {m.spec_drafts_total, m.spec_draft_tokens_total, m.spec_accepted_tokens_total}},
          {"spec_positions", m.spec_accepted_per_position},
          {"finished", m.finished_by_reason},
          {"histograms", histograms},
          {"healthy", m.healthy},
          {"age", m.last_step_age_seconds}};
}

EngineMetrics MetricsFromJson(const json& j, const EngineMetrics& shape) {
  EngineMetrics m = shape;  // histogram bounds
  for (const EngineMetrics::NamedHistogram& h : m.Histograms()) {
    std::fill(h.histogram->counts.begin(), h.histogram->counts.end(), 0);
    h.histogram->sum = 0;
    h.histogram->count = 0;
    AddHistogram(*h.histogram, j["histograms"][h.name]);
  }
  m.running = j["running"];
  m.waiting = j["waiting"];
  m.total_pages = j["total_pages"];
  m.used_pages = j["used_pages"];
  m.cached_pages = j["cached_pages"];
  m.free_pages = j["free_pages"];
  m.queued_tokens = j["queued_tokens"];
  m.queued_requests = j["queued_requests"].get<std::vector<std::pair<std::string, int64_t>>>();
  m.prompt_tokens_total = j["prompt"];
  m.generation_tokens_total = j["generation"];
  m.preemptions_total = j["preemptions"];
  m.prefix_cache_queries_total = j["queries"];
  m.prefix_cache_hits_total = j["hits"];
  m.steps_total = j["steps"];
  m.spec_drafts_total = j["spec"][0];
  m.spec_draft_tokens_total = j["spec"][1];
  m.spec_accepted_tokens_total = j["spec"][2];
  m.spec_accepted_per_position = j["spec_positions"].get<std::vector<int64_t>>();
  m.finished_by_reason = j["finished"].get<std::map<std::string, int64_t>>();
  m.healthy = j["healthy"];
  m.last_step_age_seconds = j["age"];
  return m;
}

// A TP rank that is not its group's first: the first rank sends the rows, this one drops its
// copy (every rank of the group computes them).
class DiscardSink : public KvSink {
 public:
  void Rows(int64_t, int64_t, int64_t, int64_t, std::vector<uint8_t>) override {}
  void Done(int32_t, HandoffDrafts) override {}
  void Abandon() override {}
};

uint64_t ReadLength(const std::vector<uint8_t>& bytes, size_t at) {
  uint64_t length = 0;
  std::memcpy(&length, bytes.data() + at, 8);
  return length;
}

// A group's received rows as its first rank sends them to the group's other TP ranks: the row
// count, the chunks' count and (first, count) pairs, their rows, then the encoded MTP drafts.
std::vector<uint8_t> EncodeRowsForGroup(const ImportedRows& rows) {
  std::vector<uint8_t> out;
  auto put = [&](int64_t v) {
    const size_t at = out.size();
    out.resize(at + 8);
    std::memcpy(out.data() + at, &v, 8);
  };
  put(rows.rows);
  put(static_cast<int64_t>(rows.chunks.size()));
  for (const ImportedRows::Chunk& c : rows.chunks) {
    put(c.first);
    put(c.count);
  }
  for (const ImportedRows::Chunk& c : rows.chunks)
    out.insert(out.end(), c.rows, c.rows + c.count * rows.layers * rows.row_bytes);
  const std::vector<uint8_t> drafts = transfer::EncodeDrafts(rows.drafts);
  out.insert(out.end(), drafts.begin(), drafts.end());
  return out;
}

// The other side; null for an empty or malformed message (the first rank had no rows).
std::shared_ptr<ImportedRows> DecodeRowsFromGroup(std::shared_ptr<const std::vector<uint8_t>> bytes,
                                                  int64_t layers, int64_t row_bytes) {
  const std::vector<uint8_t>& b = *bytes;
  size_t at = 0;
  auto get = [&](int64_t* v) {
    if (at + 8 > b.size()) return false;
    std::memcpy(v, b.data() + at, 8);
    at += 8;
    return true;
  };
  auto rows = std::make_shared<ImportedRows>();
  rows->layers = layers;
  rows->row_bytes = row_bytes;
  int64_t chunks = 0;
  if (!get(&rows->rows) || !get(&chunks) || chunks < 0 ||
      static_cast<uint64_t>(chunks) > b.size() / 16)
    return nullptr;
  for (int64_t i = 0; i < chunks; ++i) {
    ImportedRows::Chunk c;
    if (!get(&c.first) || !get(&c.count) || c.count < 0) return nullptr;
    c.owner = bytes;
    rows->chunks.push_back(c);
  }
  for (ImportedRows::Chunk& c : rows->chunks) {
    const auto size = static_cast<uint64_t>(c.count) * static_cast<uint64_t>(layers * row_bytes);
    if (size > b.size() - at) return nullptr;
    c.rows = b.data() + at;
    at += size;
  }
  auto drafts = transfer::ParseDrafts(b.data() + at, b.size() - at);
  if (drafts.ok()) rows->drafts = std::move(drafts.value());
  return rows;
}

constexpr int kGroupRowsTag = 1;

}  // namespace

ClusterServing::ClusterServing(Engine& engine, Communicator& world, int tp, int64_t max_waiting)
    : engine_(engine), world_(world), tp_(tp), max_waiting_(max_waiting) {
  groups_ = world.size() / tp;
  group_ = world.rank() / tp;
  leader_ = world.rank() % tp == 0;
  group_load_.assign(groups_, 0);
  group_metrics_.assign(groups_, engine.Metrics());
  for (int g = 0; g < groups_; ++g)
    group_cache_.push_back(std::make_unique<CacheEventLog>());
}

Result<std::shared_ptr<RequestStream>> ClusterServing::Submit(EngineRequest request,
                                                              SubmitError* error) {
  return SubmitTo(-1, std::move(request), error);
}

Result<std::vector<std::shared_ptr<RequestStream>>> ClusterServing::SubmitAll(
    std::vector<EngineRequest> requests, SubmitError* error) {
  return SubmitAllTo(-1, std::move(requests), error);
}

Result<std::shared_ptr<RequestStream>> ClusterServing::SubmitTo(int chosen, EngineRequest request,
                                                                SubmitError* error) {
  std::vector<EngineRequest> one;
  one.push_back(std::move(request));
  auto streams = SubmitAllTo(chosen, std::move(one), error);
  if (!streams.ok()) return streams.status();
  return streams.value()[0];
}

Result<std::vector<std::shared_ptr<RequestStream>>> ClusterServing::SubmitAllTo(
    int chosen, std::vector<EngineRequest> requests, SubmitError* error) {
  return SubmitAllTo(chosen, std::move(requests), error, "", 0);
}

Result<std::shared_ptr<RequestStream>> ClusterServing::SubmitSendingTo(int group,
                                                                       EngineRequest request,
                                                                       const std::string& send_to,
                                                                       uint64_t token,
                                                                       SubmitError* error) {
  *error = SubmitError::kInvalid;
  if (!sends_ || group < 0 || group >= groups_)
    return Status::Error("this job does not send transfers from that group");
  std::vector<EngineRequest> one;
  one.push_back(std::move(request));
  auto streams = SubmitAllTo(group, std::move(one), error, send_to, token);
  if (!streams.ok()) return streams.status();
  return streams.value()[0];
}

Result<std::vector<std::shared_ptr<RequestStream>>> ClusterServing::SubmitAllTo(
    int chosen, std::vector<EngineRequest> requests, SubmitError* error, const std::string& send_to,
    uint64_t token) {
  *error = SubmitError::kInvalid;
  for (const EngineRequest& request : requests)
    if (request.kv_sink || request.imported)  // what SubmitSendingTo/SubmitReceivingTo set up
      return Status::Error("a job's requests take rows only through its groups' transfers");
  const int64_t count = static_cast<int64_t>(requests.size());
  if (count > max_waiting_)
    return Status::Errorf(
        "the request asks for {} sequences (prompts × n), more than the server queues at once "
        "(--max-waiting {})",
        count, max_waiting_);
  for (EngineRequest& request : requests) {
    SY_RETURN_IF_ERROR(engine_.Validate(request));  // every rank loads the same model
    // Every rank of the group must draw the same random numbers.
    if (!request.params.seed) request.params.seed = std::random_device{}() * 0x100000001ull;
  }
  std::vector<std::shared_ptr<RequestStream>> streams;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    SY_RETURN_IF_ERROR(CheckRoomLocked(count, error));
    for (EngineRequest& request : requests) {
      auto stream = std::make_shared<RequestStream>();
      const int group =
          chosen >= 0 ? chosen
                      : static_cast<int>(std::min_element(group_load_.begin(), group_load_.end()) -
                                         group_load_.begin());
      const int64_t cost = static_cast<int64_t>(request.prompt.size()) - request.resumed_tokens +
                           request.params.max_tokens;
      group_load_[group] += cost;
      tracked_[request.id] = {stream, group, cost};
      pending_.push_back({std::move(request), group, /*rows_at_leader=*/false, send_to, token});
      streams.push_back(std::move(stream));
    }
  }
  *error = SubmitError::kNone;
  wake_.notify_all();
  return streams;
}

Status ClusterServing::CheckRoomLocked(int64_t count, SubmitError* error) const {
  if (stop_) {
    *error = SubmitError::kStopping;
    return Status::Error("the server is shutting down");
  }
  // Requests whose rows are on their way count: each will be admitted.
  int64_t waiting = static_cast<int64_t>(pending_.size() + receiving_.size());
  for (const auto& m : group_metrics_)
    waiting += m.waiting;
  if (waiting + count > max_waiting_) {
    *error = SubmitError::kQueueFull;
    return Status::Errorf("the waiting queue is full ({} requests)", max_waiting_);
  }
  return Status::Ok();
}

void ClusterServing::Abort(const std::string& id) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    aborts_.push_back(id);
    if (auto it = receiving_.find(id); it != receiving_.end()) {
      if (it->second.announced) drops_.push_back(it->second.token);  // its first rank waits
      receiving_.erase(it);
      RequestEvent event;
      event.finish_reason = "abort";
      EndUnadmitted(id, std::move(event));
    }
  }
  wake_.notify_all();
}

void ClusterServing::EndUnadmitted(const std::string& id, RequestEvent event) {
  auto it = tracked_.find(id);
  if (it == tracked_.end()) return;
  group_load_[it->second.group] -= it->second.outstanding;
  it->second.stream->Push(std::move(event));
  tracked_.erase(it);
}

void ClusterServing::ReceiveOnGroupLeaders(transfer::Receiver* own, int64_t layers,
                                           int64_t row_bytes, double timeout_seconds) {
  receives_ = true;
  receiver_ = leader_ ? own : nullptr;
  layers_ = layers;
  row_bytes_ = row_bytes;
  transfer_timeout_ = timeout_seconds;
  group_transfers_.assign(static_cast<size_t>(groups_), {});
  if (tp_ > 1) rows_comm_ = world_.Duplicate();  // collective
}

void ClusterServing::SendFromGroupLeaders(transfer::Sender* own, double timeout_seconds) {
  sends_ = true;
  sender_ = leader_ ? own : nullptr;
  transfer_timeout_ = timeout_seconds;
  group_transfers_.assign(static_cast<size_t>(groups_), {});
}

void ClusterServing::FinishTransfer(const std::string& id, RequestEvent* finish) {
  auto it = outgoing_.find(id);
  if (it == outgoing_.end()) return;
  std::shared_ptr<transfer::Outgoing> outgoing = std::move(it->second);
  outgoing_.erase(it);
  if (*finish->finish_reason != "transferred") return;  // the engine abandoned the transfer
  if (Status sent = outgoing->Wait(transfer_timeout_); !sent.ok()) {
    finish->finish_reason = kTransferFailedReason;
    finish->error = "the transfer failed: " + sent.message();
  }
}

Result<std::shared_ptr<RequestStream>> ClusterServing::SubmitReceivingTo(int group,
                                                                         EngineRequest request,
                                                                         uint64_t token,
                                                                         SubmitError* error) {
  *error = SubmitError::kInvalid;
  if (!receives_ || group < 0 || group >= groups_)
    return Status::Error("this job does not receive transfers for that group");
  {
    // Checked as it will be admitted: with the first token the transfer brings (any id will
    // do for the lengths); its rows are checked where they arrive.
    EngineRequest probe = request;
    probe.prompt.push_back(0);
    probe.resumed_tokens += 1;
    SY_RETURN_IF_ERROR(engine_.Validate(probe));
  }
  if (!request.params.seed) request.params.seed = std::random_device{}() * 0x100000001ull;
  auto stream = std::make_shared<RequestStream>();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    SY_RETURN_IF_ERROR(CheckRoomLocked(1, error));
    if (tracked_.count(request.id) > 0)
      return Status::Errorf("request {} is already running here", request.id);
    const int64_t cost = static_cast<int64_t>(request.prompt.size()) + 1 -
                         (request.resumed_tokens + 1) + request.params.max_tokens;
    group_load_[group] += cost;
    tracked_[request.id] = {stream, group, cost};
    const std::string id = request.id;
    receiving_[id] = {std::move(request), group, token, false};
  }
  *error = SubmitError::kNone;
  wake_.notify_all();
  return stream;
}

transfer::TransferStats ClusterServing::Transfers() const {
  std::lock_guard<std::mutex> lock(mutex_);
  transfer::TransferStats total;
  for (const transfer::TransferStats& s : group_transfers_) {
    total.transfers += s.transfers;
    total.bytes += s.bytes;
    total.seconds += s.seconds;
    total.refused += s.refused;
  }
  // Rank 0 knows which requests still wait for rows (each group's receiver only its own).
  total.awaited = static_cast<int64_t>(receiving_.size());
  return total;
}

std::shared_ptr<ImportedRows> ClusterServing::RowsFromLeader(uint64_t token) {
  const int first = group_ * tp_;
  std::vector<Communicator::Message> none;
  if (leader_) {
    std::shared_ptr<ImportedRows> rows = TakeArrival(token);
    if (tp_ > 1) {
      const std::vector<uint8_t> bytes = rows ? EncodeRowsForGroup(*rows) : std::vector<uint8_t>{};
      std::vector<Communicator::Message> sends;
      for (int r = 1; r < tp_; ++r)
        sends.push_back({first + r, kGroupRowsTag, bytes});
      rows_comm_->SendReceive(sends, none);
    }
    return rows;
  }
  std::vector<Communicator::Message> receives{{first, kGroupRowsTag, {}}};
  rows_comm_->SendReceive(none, receives);
  return DecodeRowsFromGroup(
      std::make_shared<const std::vector<uint8_t>>(std::move(receives[0].bytes)), layers_,
      row_bytes_);
}

void ClusterServing::StartReceiving(const std::string& id, uint64_t token) {
  std::lock_guard<std::mutex> lock(arrivals_mutex_);
  if (receiver_ == nullptr || arrivals_.count(token) > 0) return;
  Arrival& arrival = arrivals_[token];
  arrival.id = id;
  arrival.sequence = ++arrivals_started_;
  auto cancelled = arrival.cancelled;
  arrival.waiter = std::thread([this, id, token, cancelled, sequence = arrival.sequence] {
    {
      // The receiver knows a request by its id: an earlier attempt of it (cancelled, its
      // waiter polling) must end first.
      std::unique_lock<std::mutex> lock(arrivals_mutex_);
      arrival_ended_.wait(lock, [&] {
        for (const auto& [t, a] : arrivals_)
          if (a.sequence < sequence && a.id == id && !a.done) return false;
        return true;
      });
    }
    auto received = receiver_->Wait(id, token, layers_, row_bytes_, transfer_timeout_,
                                    [cancelled] { return cancelled->load(); });
    std::lock_guard<std::mutex> lock(arrivals_mutex_);
    Arrival& a = arrivals_[token];
    a.received = std::move(received);
    a.done = true;
    arrival_ended_.notify_all();
    if (world_.rank() == 0) wake_.notify_all();  // rank 0 reports it in its next step
  });
}

std::vector<ClusterServing::ArrivalReport> ClusterServing::FinishedArrivals() {
  std::vector<ArrivalReport> out;
  std::vector<std::thread> finished;
  {
    std::lock_guard<std::mutex> lock(arrivals_mutex_);
    for (auto it = arrivals_.begin(); it != arrivals_.end();) {
      Arrival& a = it->second;
      if (!a.done || a.reported) {
        ++it;
        continue;
      }
      a.reported = true;
      finished.push_back(std::move(a.waiter));
      if (a.received.ok() && !a.cancelled->load()) {
        out.push_back({a.id, it->first, true, a.received->first_token, ""});
        ++it;  // held until its request is admitted (or dropped)
      } else {
        out.push_back({a.id, it->first, false, 0,
                       a.received.ok() ? "cancelled" : a.received.status().message()});
        it = arrivals_.erase(it);
      }
    }
  }
  for (std::thread& t : finished)
    if (t.joinable()) t.join();
  return out;
}

std::shared_ptr<ImportedRows> ClusterServing::TakeArrival(uint64_t token) {
  std::thread waiter;
  std::shared_ptr<ImportedRows> rows;
  {
    std::lock_guard<std::mutex> lock(arrivals_mutex_);
    auto it = arrivals_.find(token);
    if (it == arrivals_.end() || !it->second.done || !it->second.received.ok()) return nullptr;
    rows = it->second.received->rows;
    waiter = std::move(it->second.waiter);
    arrivals_.erase(it);
  }
  if (waiter.joinable()) waiter.join();  // done: it has returned or is returning
  return rows;
}

void ClusterServing::DropArrival(uint64_t token) {
  std::thread waiter;
  {
    std::lock_guard<std::mutex> lock(arrivals_mutex_);
    auto it = arrivals_.find(token);
    if (it == arrivals_.end()) return;
    it->second.cancelled->store(true);
    if (!it->second.done) return;  // its waiter returns soon; reported as failed, then erased
    waiter = std::move(it->second.waiter);
    arrivals_.erase(it);
  }
  if (waiter.joinable()) waiter.join();
}

void ClusterServing::StopReceiving() {
  {
    std::lock_guard<std::mutex> lock(arrivals_mutex_);
    for (auto& [token, a] : arrivals_)
      a.cancelled->store(true);
  }
  // The waiters poll their cancellation; each takes the lock once more to finish.
  while (true) {
    std::vector<std::thread> waiters;
    {
      std::lock_guard<std::mutex> lock(arrivals_mutex_);
      for (auto& [token, a] : arrivals_)
        if (a.waiter.joinable()) waiters.push_back(std::move(a.waiter));
      if (waiters.empty()) {
        arrivals_.clear();
        return;
      }
    }
    for (std::thread& t : waiters)
      t.join();
  }
}

EngineMetrics ClusterServing::Metrics() const {
  std::lock_guard<std::mutex> lock(mutex_);
  EngineMetrics total = group_metrics_[0];
  for (size_t g = 1; g < group_metrics_.size(); ++g) {
    EngineMetrics m = group_metrics_[g];  // Histograms() names its members
    total.running += m.running;
    total.waiting += m.waiting;
    total.total_pages += m.total_pages;
    total.used_pages += m.used_pages;
    total.cached_pages += m.cached_pages;
    total.free_pages += m.free_pages;
    total.queued_tokens += m.queued_tokens;
    total.queued_requests.insert(total.queued_requests.end(), m.queued_requests.begin(),
                                 m.queued_requests.end());
    total.prompt_tokens_total += m.prompt_tokens_total;
    total.generation_tokens_total += m.generation_tokens_total;
    total.preemptions_total += m.preemptions_total;
    total.prefix_cache_queries_total += m.prefix_cache_queries_total;
    total.prefix_cache_hits_total += m.prefix_cache_hits_total;
    total.spec_drafts_total += m.spec_drafts_total;
    total.spec_draft_tokens_total += m.spec_draft_tokens_total;
    total.spec_accepted_tokens_total += m.spec_accepted_tokens_total;
    if (total.spec_accepted_per_position.size() < m.spec_accepted_per_position.size())
      total.spec_accepted_per_position.resize(m.spec_accepted_per_position.size(), 0);
    for (size_t i = 0; i < m.spec_accepted_per_position.size(); ++i)
      total.spec_accepted_per_position[i] += m.spec_accepted_per_position[i];
    for (const auto& [reason, count] : m.finished_by_reason)
      total.finished_by_reason[reason] += count;
    const auto totals = total.Histograms();
    const auto parts = m.Histograms();
    for (size_t h = 0; h < totals.size(); ++h) {
      Histogram& into = *totals[h].histogram;
      const Histogram& from = *parts[h].histogram;
      for (size_t i = 0; i < into.counts.size() && i < from.counts.size(); ++i)
        into.counts[i] += from.counts[i];
      into.sum += from.sum;
      into.count += from.count;
    }
    total.healthy = total.healthy && m.healthy;
    total.last_step_age_seconds = std::max(total.last_step_age_seconds, m.last_step_age_seconds);
  }
  total.waiting += static_cast<int64_t>(pending_.size());
  return total;
}

EngineMetrics ClusterServing::GroupMetrics(int group) const {
  std::lock_guard<std::mutex> lock(mutex_);
  EngineMetrics m = group_metrics_[static_cast<size_t>(group)];
  for (const Pending& p : pending_)
    m.waiting += p.group == group;
  return m;
}

void ClusterServing::Stop(bool drain) {
  std::unique_lock<std::mutex> lock(mutex_);
  stop_ = true;
  drain_ = drain;
  wake_.notify_all();
  stopped_cv_.wait(lock, [&] { return stopped_; });
}

std::vector<uint8_t> ClusterServing::TakeControl(bool any_work) {
  std::unique_lock<std::mutex> lock(mutex_);
  // Idle: wait for something to do (bounded, so a stop is seen; other ranks wait in the
  // broadcast meanwhile).
  // While rows are on their way, sooner: a group's first rank reports an arrival only in a step.
  if (!any_work)
    wake_.wait_for(lock, std::chrono::milliseconds(receiving_.empty() ? 20 : 2), [&] {
      if (!pending_.empty() || !aborts_.empty() || stop_) return true;
      for (const auto& [id, r] : receiving_)
        if (!r.announced) return true;
      return false;
    });
  // A stopping job takes no more rows: the router redoes those requests elsewhere.
  if (stop_) {
    for (auto& [id, r] : receiving_) {
      RequestEvent event;
      event.finish_reason = kTransferFailedReason;
      event.error = "the decode job is stopping";
      EndUnadmitted(id, std::move(event));
    }
    receiving_.clear();
  }
  json receive = json::array();
  for (auto& [id, r] : receiving_) {
    if (r.announced) continue;
    receive.push_back({id, r.group, r.token});
    r.announced = true;
  }
  json control = {{"submit", json::array()}, {"receive", std::move(receive)},
                  {"drop", drops_},          {"abort", aborts_},
                  {"stop", stop_},           {"drain", drain_}};
  for (const Pending& p : pending_) {
    json submit = {{"id", p.request.id},
                   {"group", p.group},
                   {"prompt", p.request.prompt},
                   {"resumed", p.request.resumed_tokens},
                   {"priority", p.request.priority},
                   {"background", p.request.background},
                   {"params", ParamsToJson(p.request.params)}};
    if (!p.send_to.empty()) submit["send"] = {p.send_to, p.token};
    if (p.rows_at_leader) submit["rows_at_leader"] = p.token;
    control["submit"].push_back(std::move(submit));
  }
  pending_.clear();
  aborts_.clear();
  drops_.clear();
  const std::string text = Dump(control);
  return std::vector<uint8_t>(text.begin(), text.end());
}

void ClusterServing::DeliverEvents(const std::vector<uint8_t>& gathered) {
  // Each rank's part: the 8-byte length of a JSON {"group", "events", "metrics", "cache", and
  // on a disaggregated job's group leaders "received" and "transfers"}, then the JSON (a length
  // of 0 from the other TP ranks).
  size_t at = 0;
  std::lock_guard<std::mutex> lock(mutex_);
  while (at + 8 <= gathered.size()) {
    const uint64_t length = ReadLength(gathered, at);
    at += 8;
    if (length == 0) continue;
    const json part = json::parse(gathered.begin() + at, gathered.begin() + at + length);
    at += length;
    const int group = part["group"];
    // Rows that reached the group's first rank: the request is admitted in the next step.
    for (const auto& r : part.value("received", json::array())) {
      const std::string id = r[0].get<std::string>();
      const auto token = r[1].get<uint64_t>();
      const bool ok = r[2].get<bool>();
      auto it = receiving_.find(id);
      if (it == receiving_.end() || it->second.token != token) {
        if (ok) drops_.push_back(token);  // ended meanwhile: the rows are dropped
        continue;
      }
      if (ok) {
        EngineRequest request = std::move(it->second.request);
        request.prompt.push_back(r[3].get<int32_t>());
        request.resumed_tokens += 1;
        pending_.push_back({std::move(request), group, /*rows_at_leader=*/true, "", token});
      } else {
        RequestEvent event;
        event.finish_reason = kTransferFailedReason;
        event.error = r[4].get<std::string>();
        EndUnadmitted(id, std::move(event));
      }
      receiving_.erase(it);
    }
    if (part.contains("transfers") && static_cast<size_t>(group) < group_transfers_.size()) {
      const json& t = part["transfers"];
      group_transfers_[static_cast<size_t>(group)] = {t[0].get<int64_t>(), t[1].get<int64_t>(),
                                                      t[2].get<double>(), t[3].get<int64_t>()};
    }
    group_metrics_[group] = MetricsFromJson(part["metrics"], group_metrics_[group]);
    // The group's prefix-cache events, replayed into rank 0's copy of its log.
    CacheEventLog& log = *group_cache_[static_cast<size_t>(group)];
    if (part.contains("cache_snapshot"))
      log.Replace(part["cache_snapshot"].get<std::vector<uint64_t>>());
    for (const auto& e : part["cache"])
      log.Record(e[0].get<uint64_t>(), e[1].get<bool>());
    for (const auto& j : part["events"]) {
      auto it = tracked_.find(j["id"].get<std::string>());
      if (it == tracked_.end()) continue;
      RequestEvent event = EventFromJson(j);
      const bool finished = event.finish_reason.has_value();
      it->second.stream->Push(std::move(event));
      if (finished) {
        group_load_[it->second.group] -= it->second.outstanding;
        tracked_.erase(it);
      }
    }
  }
}

void ClusterServing::Run() {
  const bool root = world_.rank() == 0;
  bool any_work = false;
  while (true) {
    // 1. What arrived, from rank 0.
    const std::vector<uint8_t> bytes =
        world_.Broadcast(root ? TakeControl(any_work) : std::vector<uint8_t>{});
    const json control = json::parse(bytes.begin(), bytes.end());
    // 2. Transfers for this rank's group to wait for, and requests for it.
    for (const auto& r : control["receive"])
      if (r[1].get<int>() == group_ && leader_) StartReceiving(r[0], r[2].get<uint64_t>());
    for (const auto& s : control["submit"]) {
      if (s["group"].get<int>() != group_) continue;
      EngineRequest request;
      request.id = s["id"];
      request.prompt = s["prompt"].get<std::vector<int32_t>>();
      request.params = ParamsFromJson(s["params"]);
      request.resumed_tokens = s["resumed"];
      request.priority = s["priority"];
      request.background = s["background"];
      // Prefill: the group's first rank sends the rows it computes (its TP ranks compute the
      // same ones and drop theirs). Decode: the rows its first rank received.
      if (s.contains("send")) {
        if (leader_ && sender_ != nullptr) {
          auto outgoing = sender_->Open(s["send"][0], request.id, s["send"][1].get<uint64_t>());
          outgoing_[request.id] = outgoing;
          request.kv_sink = std::move(outgoing);
        } else {
          request.kv_sink = std::make_shared<DiscardSink>();
        }
      }
      if (s.contains("rows_at_leader"))
        request.imported = RowsFromLeader(s["rows_at_leader"].get<uint64_t>());
      SubmitError why;
      auto stream = engine_.Submit(request, &why);
      if (stream.ok()) {
        local_[request.id] = stream.value();
      } else {
        // Checked on rank 0 already; report anything else as this request's error.
        auto failed = std::make_shared<RequestStream>();
        RequestEvent event;
        event.finish_reason = "error";
        event.error = stream.status().message();
        failed->Push(std::move(event));
        local_[request.id] = failed;
      }
    }
    for (const auto& id : control["abort"])
      engine_.Abort(id.get<std::string>());
    if (receiver_ != nullptr)
      for (const auto& token : control["drop"])
        DropArrival(token.get<uint64_t>());
    // 3. One step everywhere if any rank has work.
    any_work = world_.AllReduceMax(engine_.HasWork() ? 1 : 0) > 0;
    if (any_work) engine_.StepOnce(/*must_step=*/true);
    // 4. Events to rank 0: every rank drains its streams, the group's first rank reports them
    // (the other TP ranks computed the same ones). A prefilled request is reported handed on
    // only once its last rows have left (or as a failed transfer): the step waits for them, as
    // it would wait to gather them.
    std::vector<uint8_t> payload(8, 0);
    json events = json::array();
    std::vector<RequestEvent> drained;
    for (auto it = local_.begin(); it != local_.end();) {
      drained.clear();
      const bool finished = it->second->Drain(&drained);
      if (leader_)
        for (RequestEvent& e : drained) {
          if (e.finish_reason) FinishTransfer(it->first, &e);
          events.push_back(EventToJson(it->first, e));
        }
      it = finished ? local_.erase(it) : std::next(it);
    }
    if (leader_) {
      json report = {
          {"group", group_}, {"events", events}, {"metrics", MetricsToJson(engine_.Metrics())}};
      // The prefix cache's changes since the last report (a snapshot if the log moved on).
      json cache = json::array();
      bool lost = false;
      const CacheEventLog& log = *engine_.cache_events();
      for (const auto& e : log.Since(cache_reported_, 0, &lost))
        cache.push_back({e.hash, e.stored});
      if (lost) {
        auto [seq, hashes] = log.Snapshot();
        report["cache_snapshot"] = hashes;
        cache_reported_ = seq;
      } else {
        cache_reported_ += cache.size();
      }
      report["cache"] = std::move(cache);
      if (receiver_ != nullptr) {
        json received = json::array();
        for (const ArrivalReport& a : FinishedArrivals())
          received.push_back({a.id, a.token, a.ok, a.first_token, a.error});
        report["received"] = std::move(received);
      }
      if (receiver_ != nullptr || sender_ != nullptr) {
        const transfer::TransferStats t = receiver_ ? receiver_->stats() : sender_->stats();
        report["transfers"] = {t.transfers, t.bytes, t.seconds, t.refused};
      }
      const std::string text = Dump(report);
      const uint64_t length = text.size();
      std::memcpy(payload.data(), &length, 8);
      payload.insert(payload.end(), text.begin(), text.end());
    }
    const std::vector<uint8_t> gathered = world_.GatherToRoot(payload);
    if (root) DeliverEvents(gathered);
    if (control["stop"].get<bool>()) {
      if (!control["drain"].get<bool>())
        for (const auto& [id, stream] : local_)
          engine_.Abort(id);
      if (!any_work) break;
    }
  }
  StopReceiving();
  std::lock_guard<std::mutex> lock(mutex_);
  stopped_ = true;
  stopped_cv_.notify_all();
}

}  // namespace sy::serve
