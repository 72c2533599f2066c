#include "serve/batches.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <set>
#include <sstream>

#include <unistd.h>

#include <fmt/chrono.h>
#include <fmt/format.h>

#include "base/partial_file.h"
#include "tokenizer/tokenizer.h"  // ReadTextFile

#include "serve/messages_api.h"
#include "serve/responses_api.h"

namespace sy::serve {

using json = nlohmann::ordered_json;

namespace {

int64_t UnixNow() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// Anthropic's times: RFC 3339, UTC.
json Rfc3339(int64_t seconds) {
  const std::time_t t = static_cast<std::time_t>(seconds);
  return fmt::format("{:%Y-%m-%dT%H:%M:%SZ}", fmt::gmtime(t));
}

// A list page in Anthropic's shape ({"data", "has_more", "first_id", "last_id"}), newest first:
// at most `limit` (1 to 1000, default 20) objects after the one whose id is `after_id`, or the
// `limit` just before `before_id`.
ApiReply AnthropicListPage(const std::vector<json>& objects, const std::string& query) {
  const std::optional<int64_t> given = LimitParameter(query, 1000);
  if (!given)
    return ErrorReply(400, "limit must be an integer in [1, 1000]", "limit", "invalid_value");
  const size_t limit = static_cast<size_t>(*given);
  const std::string after = QueryParameter(query, "after_id"),
                    before = QueryParameter(query, "before_id");
  if (!after.empty() && !before.empty())
    return ErrorReply(400, "give after_id or before_id, not both", "before_id", "invalid_value");
  auto position = [&](const std::string& id) -> std::optional<size_t> {
    auto it = std::find_if(objects.begin(), objects.end(),
                           [&](const json& object) { return object["id"] == id; });
    if (it == objects.end()) return std::nullopt;
    return static_cast<size_t>(it - objects.begin());
  };
  size_t from = 0, to = objects.size();
  if (!after.empty()) {
    auto at = position(after);
    if (!at) return ErrorReply(400, fmt::format("after_id: no batch '{}'", after), "after_id", "");
    from = *at + 1;
    to = std::min(objects.size(), from + limit);
  } else if (!before.empty()) {
    auto at = position(before);
    if (!at)
      return ErrorReply(400, fmt::format("before_id: no batch '{}'", before), "before_id", "");
    to = *at;
    from = to > limit ? to - limit : 0;
  } else {
    to = std::min(objects.size(), limit);
  }
  json data = json::array();
  for (size_t i = from; i < to; ++i)
    data.push_back(objects[i]);
  json page = {{"data", data}};
  // has_more: whether a page lies on in the direction asked (older, or newer for before_id).
  page["has_more"] = before.empty() ? to < objects.size() : from > 0;
  page["first_id"] = data.empty() ? json(nullptr) : data.front()["id"];
  page["last_id"] = data.empty() ? json(nullptr) : data.back()["id"];
  return JsonReply(page);
}

}  // namespace

// One request of a batch line: the plan, its engine requests' streams, what they gave.
struct BatchRunner::InFlight {
  std::shared_ptr<Batch> batch;
  int64_t line = 0;  // in the input file
  std::string custom_id, response_id;
  int64_t created = 0;
  GenerationPlan plan;
  std::optional<ResponsesPlan> responses;  // a /v1/responses line: its Response object's plan
  bool message = false;                    // an Anthropic batch's line: a Message object
  std::vector<std::string> request_ids;
  std::vector<std::shared_ptr<RequestStream>> streams;
  std::vector<ChoiceResult> results;
  std::vector<bool> done;
};

BatchRunner::BatchRunner(RequestFrontend& engine, const TextCodec& codec,
                         const ServingLimits& limits, FileStore& files, int64_t max_in_flight,
                         int64_t completion_window)
    : engine_(engine),
      codec_(codec),
      limits_(limits),
      files_(files),
      max_in_flight_(std::max<int64_t>(1, max_in_flight)),
      completion_window_(std::max<int64_t>(0, completion_window)),
      directory_(files.batches_directory()) {
  if (!directory_.empty()) restored_ = Restore();
  thread_ = std::thread([this] { Loop(); });
}

BatchRunner::~BatchRunner() {
  Stop();
}

void BatchRunner::Stop() {
  {
    std::lock_guard lock(mutex_);
    if (stopping_) return;
    stopping_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
  // The streams outlive this runner in the engine: their notifiers must not call it any more.
  for (const auto& flight : in_flight_) {
    for (const auto& stream : flight->streams)
      stream->SetNotifier(nullptr);
    for (const auto& id : flight->request_ids)
      engine_.Abort(id);
  }
  in_flight_.clear();
}

BatchGauges BatchRunner::Gauges() {
  std::lock_guard lock(mutex_);
  BatchGauges gauges;
  for (const auto& batch : batches_) {
    if (Ended(*batch)) continue;
    ++gauges.batches_running;
    if (batch->status == "in_progress")
      gauges.requests_waiting += static_cast<int64_t>(batch->lines.size() - batch->next);
  }
  gauges.requests_running = static_cast<int64_t>(in_flight_.size());
  gauges.succeeded_total = succeeded_total_;
  gauges.errored_total = errored_total_;
  gauges.canceled_total = canceled_total_;
  gauges.expired_total = expired_total_;
  return gauges;
}

bool BatchRunner::Ended(const Batch& batch) {
  return batch.status == "completed" || batch.status == "failed" || batch.status == "cancelled" ||
         batch.status == "expired";
}

const char* BatchRunner::EndedAtKey(const Batch& batch) {
  return batch.status == "failed"      ? "failed_at"
         : batch.status == "cancelled" ? "cancelled_at"
         : batch.status == "expired"   ? "expired_at"
                                       : "completed_at";
}

json BatchRunner::BatchObject(const Batch& batch) const {
  auto time = [&](const char* key) {
    auto it = batch.times.find(key);
    return it == batch.times.end() ? json(nullptr) : json(it->second);
  };
  json object = {{"id", batch.id},
                 {"object", "batch"},
                 {"endpoint", batch.endpoint},
                 {"errors", batch.errors},
                 {"input_file_id", batch.input_file_id},
                 {"completion_window", batch.completion_window},
                 {"status", batch.status},
                 {"output_file_id", batch.output_file_id ? json(*batch.output_file_id) : json()},
                 {"error_file_id", batch.error_file_id ? json(*batch.error_file_id) : json()}};
  for (const char* key :
       {"created_at", "in_progress_at", "expires_at", "finalizing_at", "completed_at", "failed_at",
        "expired_at", "cancelling_at", "cancelled_at"})
    object[key] = time(key);
  // OpenAI's counts have no "expired": a line the window ran out on is a failed one (its
  // batch_expired error is in the error file).
  object["request_counts"] = {{"total", batch.total},
                              {"completed", batch.completed},
                              {"failed", batch.failed + batch.expired}};
  object["metadata"] = batch.metadata;
  return object;
}

ApiReply BatchRunner::Request(const std::string& method, const std::string& path,
                              const std::string& query, const std::string& body, int64_t now) {
  if (path.empty() || path == "/") {
    if (method == "POST") return Create(body, now);
    if (method != "GET")
      return ErrorReply(405, "use GET or POST on /v1/batches", "", "invalid_method");
    std::lock_guard lock(mutex_);
    std::vector<json> newest_first;
    for (auto it = batches_.rbegin(); it != batches_.rend(); ++it)
      if ((*it)->api == Api::kOpenAI) newest_first.push_back(BatchObject(**it));
    return ListPage(newest_first, query);
  }
  std::string id = path.substr(1);
  const bool cancel = id.ends_with("/cancel");
  if (cancel) id.resize(id.size() - std::string_view("/cancel").size());
  std::lock_guard lock(mutex_);
  auto found = Find(Api::kOpenAI, id);
  if (!found) return ErrorReply(404, fmt::format("no batch '{}'", id), "batch_id", "not_found");
  Batch& batch = *found;
  if (!cancel) {
    if (method != "GET") return ErrorReply(405, "use GET on a batch", "", "invalid_method");
    return JsonReply(BatchObject(batch));
  }
  if (method != "POST") return ErrorReply(405, "use POST to cancel a batch", "", "invalid_method");
  if (batch.status != "in_progress" && batch.status != "validating")
    return ErrorReply(
        409,
        fmt::format("batch '{}' is {}: only a running batch can be cancelled", id, batch.status),
        "batch_id", "invalid_state");
  Cancel(batch, now);
  return JsonReply(BatchObject(batch));
}

std::shared_ptr<BatchRunner::Batch> BatchRunner::Find(Api api, const std::string& id) {
  for (const auto& batch : batches_)
    if (batch->api == api && batch->id == id) return batch;
  return nullptr;
}

void BatchRunner::AbortInFlight(const Batch& batch) {
  for (const auto& flight : in_flight_)
    if (flight->batch.get() == &batch)
      for (const auto& request_id : flight->request_ids)
        engine_.Abort(request_id);
}

void BatchRunner::Cancel(Batch& batch, int64_t now) {
  batch.status = "cancelling";
  batch.times["cancelling_at"] = now;
  Save(batch);
  AbortInFlight(batch);
  woken_ = true;
  wake_.notify_all();
}

void BatchRunner::Expire(Batch& batch) {
  batch.expiring = true;
  AbortInFlight(batch);
}

json BatchRunner::MessageBatchObject(const Batch& batch, const std::string& origin) const {
  auto time = [&](const char* key) {
    auto it = batch.times.find(key);
    return it == batch.times.end() ? json(nullptr) : Rfc3339(it->second);
  };
  const bool ended = Ended(batch);
  // Progress is shown as it comes (Anthropic's own counts move only at the end); the counts sum
  // to the batch's requests either way.
  const int64_t processing =
      ended ? 0
            : std::max<int64_t>(
                  0, batch.total - batch.completed - batch.failed - batch.canceled - batch.expired);
  json object = {{"id", batch.id},
                 {"type", "message_batch"},
                 {"processing_status", ended                          ? "ended"
                                       : batch.status == "cancelling" ? "canceling"
                                                                      : "in_progress"},
                 {"request_counts",
                  {{"processing", processing},
                   {"succeeded", batch.completed},
                   {"errored", batch.failed},
                   {"canceled", batch.canceled},
                   {"expired", batch.expired}}},
                 {"ended_at", ended ? time(EndedAtKey(batch)) : json(nullptr)},
                 {"created_at", time("created_at")},
                 {"expires_at", time("expires_at")},
                 {"archived_at", nullptr},
                 {"cancel_initiated_at", time("cancelling_at")},
                 {"results_url", nullptr}};
  if (ended && batch.output_file_id)
    object["results_url"] = fmt::format("{}/v1/messages/batches/{}/results", origin, batch.id);
  return object;
}

ApiReply BatchRunner::MessageBatchesRequest(const std::string& method, const std::string& path,
                                            const std::string& query, const std::string& body,
                                            int64_t now, const std::string& origin) {
  if (path.empty() || path == "/") {
    if (method == "POST") return CreateMessageBatch(body, now, origin);
    if (method != "GET")
      return ErrorReply(405, "use GET or POST on /v1/messages/batches", "", "invalid_method");
    std::lock_guard lock(mutex_);
    std::vector<json> newest_first;
    for (auto it = batches_.rbegin(); it != batches_.rend(); ++it)
      if ((*it)->api == Api::kAnthropic) newest_first.push_back(MessageBatchObject(**it, origin));
    return AnthropicListPage(newest_first, query);
  }
  std::string id = path.substr(1), action;
  if (const size_t slash = id.find('/'); slash != std::string::npos) {
    action = id.substr(slash + 1);
    id.resize(slash);
  }
  std::lock_guard lock(mutex_);
  auto found = Find(Api::kAnthropic, id);
  if (!found) return ErrorReply(404, fmt::format("no message batch '{}'", id), "", "not_found");
  Batch& batch = *found;
  const bool ended = Ended(batch);
  if (action.empty()) {
    if (method == "GET") return JsonReply(MessageBatchObject(batch, origin));
    if (method != "DELETE")
      return ErrorReply(405, "use GET or DELETE on a message batch", "", "invalid_method");
    if (!ended)
      return ErrorReply(400,
                        fmt::format("message batch '{}' is still processing: cancel it, and "
                                    "delete it once it has ended",
                                    id),
                        "", "invalid_state");
    for (const auto& file : {batch.output_file_id, std::optional(batch.input_file_id)})
      if (file) files_.Remove(*file);
    if (!directory_.empty()) std::remove((directory_ + "/" + batch.id + ".json").c_str());
    std::erase_if(batches_, [&](const auto& b) { return b.get() == &batch; });
    return JsonReply(json{{"id", id}, {"type", "message_batch_deleted"}});
  }
  if (action == "cancel") {
    if (method != "POST")
      return ErrorReply(405, "use POST to cancel a message batch", "", "invalid_method");
    if (batch.status == "in_progress") Cancel(batch, now);
    // Cancelling one that is cancelling or ended changes nothing: the batch as it is.
    return JsonReply(MessageBatchObject(batch, origin));
  }
  if (action == "results") {
    if (method != "GET")
      return ErrorReply(405, "use GET on a message batch's results", "", "invalid_method");
    if (!ended)
      return ErrorReply(400,
                        fmt::format("message batch '{}' is still processing: its results come "
                                    "once it has ended",
                                    id),
                        "", "invalid_state");
    auto results = batch.output_file_id ? files_.Get(*batch.output_file_id) : nullptr;
    if (!results) {
      std::string why = "its results were not kept";
      if (batch.errors.is_object() && !batch.errors["data"].empty())
        why = batch.errors["data"][0]["message"].get<std::string>();
      return ErrorReply(500, fmt::format("message batch '{}' has no results: {}", id, why), "",
                        "internal_error");
    }
    ApiReply reply;
    reply.body = results->content;
    reply.content_type = "application/x-jsonl";
    return reply;
  }
  return ErrorReply(404, fmt::format("no such message batch resource: {}", path), "", "not_found");
}

ApiReply BatchRunner::CreateMessageBatch(const std::string& body, int64_t now,
                                         const std::string& origin) {
  ApiError error;
  std::optional<std::string> kept = MessageBatchRequestLines(body, &error);
  if (!kept) return ErrorReply(error.status, error.message, error.param, error.code);
  auto batch = std::make_shared<Batch>();
  batch->api = Api::kAnthropic;
  batch->id = RandomObjectId("msgbatch_");
  batch->endpoint = "/v1/messages";
  // The requests are kept as a file of the store: counted in its budget, and on disk with it.
  auto input = files_.Add(batch->id + "_requests.jsonl", kMessageBatchRequestsPurpose,
                          std::move(*kept), now);
  if (!input.ok()) return ErrorReply(413, input.status().message(), "requests", "");
  batch->input_file_id = (*input)->id;
  batch->completion_window = "24h";
  batch->times["created_at"] = now;
  if (completion_window_ > 0) batch->times["expires_at"] = now + completion_window_;
  json unused = json::array();
  batch->input = *input;
  ParseLines(Api::kAnthropic, batch->input->content, batch->endpoint, &batch->lines, &unused);
  batch->total = static_cast<int64_t>(batch->lines.size());
  batch->status = "in_progress";
  batch->times["in_progress_at"] = now;
  std::lock_guard lock(mutex_);
  batches_.push_back(batch);
  Save(*batch);
  woken_ = true;
  wake_.notify_all();
  return JsonReply(MessageBatchObject(*batch, origin));
}

void BatchRunner::ParseLines(Api api, const std::string& content, const std::string& endpoint,
                             std::vector<Line>* lines, json* errors) {
  std::map<std::string, int64_t> seen;
  int64_t number = 0;
  for (size_t at = 0; at < content.size();) {
    size_t end = content.find('\n', at);
    if (end == std::string::npos) end = content.size();
    std::string_view line(content.data() + at, end - at);
    at = end + 1;
    ++number;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.find_first_not_of(" \t") == std::string_view::npos) continue;
    auto fail = [&](const std::string& message, const char* param) {
      if (errors->size() < 100)
        errors->push_back({{"code", "invalid_request"},
                           {"message", message},
                           {"param", param ? json(param) : json(nullptr)},
                           {"line", number}});
    };
    json entry = json::parse(line, nullptr, false);
    if (!entry.is_object()) {
      fail("the line is not a JSON object", nullptr);
      continue;
    }
    auto custom = entry.find("custom_id");
    if (custom == entry.end() || !custom->is_string() || custom->get<std::string>().empty()) {
      fail("custom_id must be a non-empty string", "custom_id");
      continue;
    }
    const std::string custom_id = custom->get<std::string>();
    if (api == Api::kAnthropic) {  // written by CreateMessageBatch, which checked it
      auto params = entry.find("params");
      if (params == entry.end() || !params->is_object()) {
        fail("params must be a JSON object", "params");
        continue;
      }
      lines->push_back(
          {number, custom_id, static_cast<size_t>(line.data() - content.data()), line.size()});
      continue;
    }
    if (auto [it, fresh] = seen.emplace(custom_id, number); !fresh) {
      fail(fmt::format("custom_id \"{}\" is also on line {}", custom_id, it->second), "custom_id");
      continue;
    }
    if (auto m = entry.find("method"); m == entry.end() || *m != "POST") {
      fail("method must be \"POST\"", "method");
      continue;
    }
    if (auto u = entry.find("url"); u == entry.end() || *u != endpoint) {
      fail(fmt::format("url must be the batch's endpoint, \"{}\"", endpoint), "url");
      continue;
    }
    auto b = entry.find("body");
    if (b == entry.end() || !b->is_object()) {
      fail("body must be a JSON object", "body");
      continue;
    }
    lines->push_back(
        {number, custom_id, static_cast<size_t>(line.data() - content.data()), line.size()});
  }
}

ApiReply BatchRunner::Create(const std::string& body, int64_t now) {
  const json request = json::parse(body, nullptr, false);
  if (!request.is_object())
    return ErrorReply(400, "the body must be a JSON object", "", "invalid_json");
  auto text = [&](const char* key) -> std::optional<std::string> {
    auto it = request.find(key);
    if (it == request.end() || !it->is_string()) return std::nullopt;
    return it->get<std::string>();
  };
  const auto input = text("input_file_id"), endpoint = text("endpoint"),
             window = text("completion_window");
  if (!input)
    return ErrorReply(400, "input_file_id must be a string", "input_file_id", "invalid_value");
  if (!endpoint || (*endpoint != "/v1/chat/completions" && *endpoint != "/v1/completions" &&
                    *endpoint != "/v1/responses"))
    return ErrorReply(400,
                      "endpoint must be \"/v1/chat/completions\", \"/v1/completions\" or "
                      "\"/v1/responses\"",
                      "endpoint", "invalid_value");
  if (!window || *window != "24h")
    return ErrorReply(400, "completion_window must be \"24h\"", "completion_window",
                      "invalid_value");
  json metadata = nullptr;
  if (auto it = request.find("metadata"); it != request.end() && !it->is_null()) {
    if (!it->is_object() || it->size() > 16)
      return ErrorReply(400, "metadata must be an object of at most 16 string values", "metadata",
                        "invalid_value");
    for (const auto& [key, value] : it->items())
      if (!value.is_string() || key.size() > 64 || value.get<std::string>().size() > 512)
        return ErrorReply(400,
                          "metadata: keys of at most 64 characters, string values of at most 512",
                          "metadata", "invalid_value");
    metadata = *it;
  }
  for (const auto& [key, value] : request.items())
    if (key != "input_file_id" && key != "endpoint" && key != "completion_window" &&
        key != "metadata" && key != "output_expires_after")
      return ErrorReply(400, fmt::format("\"{}\" is not supported", key), key, "invalid_value");
  auto file = files_.Get(*input);
  if (!file)
    return ErrorReply(404, fmt::format("no file '{}'", *input), "input_file_id", "not_found");
  if (file->purpose != "batch")
    return ErrorReply(
        400, fmt::format("file '{}' was uploaded for \"{}\", not \"batch\"", *input, file->purpose),
        "input_file_id", "invalid_value");

  auto batch = std::make_shared<Batch>();
  batch->id = RandomObjectId("batch_");
  batch->endpoint = *endpoint;
  batch->input_file_id = *input;
  batch->completion_window = *window;
  batch->metadata = metadata;
  batch->times["created_at"] = now;
  if (completion_window_ > 0) batch->times["expires_at"] = now + completion_window_;
  // The file's lines, checked as OpenAI checks them: each a request to this batch's endpoint
  // with a custom_id of its own. Any bad line fails the batch before anything runs.
  json errors = json::array();
  batch->input = file;
  ParseLines(Api::kOpenAI, file->content, *endpoint, &batch->lines, &errors);
  batch->total = static_cast<int64_t>(batch->lines.size());
  if (batch->lines.empty() && errors.empty())
    errors.push_back({{"code", "empty_file"},
                      {"message", "the input file has no requests"},
                      {"param", nullptr},
                      {"line", nullptr}});
  std::lock_guard lock(mutex_);
  if (!errors.empty()) {
    batch->status = "failed";
    batch->times["failed_at"] = now;
    batch->errors = {{"object", "list"}, {"data", errors}};
    batch->lines.clear();
    batch->input.reset();
    batch->total = 0;
  } else {
    batch->status = "in_progress";
    batch->times["in_progress_at"] = now;
  }
  batches_.push_back(batch);
  Save(*batch);
  woken_ = true;
  wake_.notify_all();
  return JsonReply(BatchObject(*batch));
}

void BatchRunner::RecordResponse(Batch& batch, int64_t line, const std::string& custom_id,
                                 const std::string& request_id, const json& body) {
  if (batch.api == Api::kAnthropic)
    return Append(
        batch, line, 200,
        {{"custom_id", custom_id}, {"result", {{"type", "succeeded"}, {"message", body}}}});
  Append(batch, line, 200,
         {{"id", RandomObjectId("batch_req_")},
          {"custom_id", custom_id},
          {"response", {{"status_code", 200}, {"request_id", request_id}, {"body", body}}},
          {"error", nullptr}});
}

void BatchRunner::RecordError(Batch& batch, int64_t line, const std::string& custom_id,
                              const std::string& request_id, const ApiError& error) {
  if (batch.api == Api::kAnthropic)
    return Append(
        batch, line, error.status,
        {{"custom_id", custom_id},
         {"result", {{"type", "errored"}, {"error", json::parse(MessagesErrorBody(error))}}}});
  Append(batch, line, error.status,
         {{"id", RandomObjectId("batch_req_")},
          {"custom_id", custom_id},
          {"response",
           {{"status_code", error.status},
            {"request_id", request_id},
            {"body", json::parse(ErrorBody(error))}}},
          {"error", nullptr}});
}

void BatchRunner::RecordCanceled(Batch& batch, int64_t line, const std::string& custom_id) {
  Append(batch, line, kCanceledStatus,
         {{"custom_id", custom_id}, {"result", {{"type", "canceled"}}}});
}

void BatchRunner::RecordExpired(Batch& batch, int64_t line, const std::string& custom_id) {
  if (batch.api == Api::kAnthropic)
    return Append(batch, line, kExpiredStatus,
                  {{"custom_id", custom_id}, {"result", {{"type", "expired"}}}});
  // As OpenAI writes a line the window ran out on: no response, the error on the line itself.
  Append(batch, line, kExpiredStatus,
         {{"id", RandomObjectId("batch_req_")},
          {"custom_id", custom_id},
          {"response", nullptr},
          {"error",
           {{"code", "batch_expired"},
            {"message",
             "This request could not be executed before the completion window expired."}}}});
}

void BatchRunner::Append(Batch& batch, int64_t line, int status, const json& record) {
  const bool ok = status == 200;
  std::string& out = ok || batch.api == Api::kAnthropic ? batch.output : batch.error_output;
  out += record.dump(-1, ' ', false, json::error_handler_t::replace);
  out += '\n';
  ++(ok                          ? batch.completed
     : status == kCanceledStatus ? batch.canceled
     : status == kExpiredStatus  ? batch.expired
                                 : batch.failed);
  ++(ok                          ? succeeded_total_
     : status == kCanceledStatus ? canceled_total_
     : status == kExpiredStatus  ? expired_total_
                                 : errored_total_);
  Journal(batch, line, status, record);
}

void BatchRunner::Advance(const std::shared_ptr<Batch>& owner) {
  Batch& batch = *owner;
  const int64_t now = UnixNow();
  while (batch.status == "in_progress" && !batch.expiring && batch.next < batch.lines.size() &&
         static_cast<int64_t>(in_flight_.size()) < max_in_flight_) {
    const Line& line = batch.lines[batch.next];
    // The line's request again (checked when the batch was created, from the same bytes).
    const json entry = json::parse(
        std::string_view(batch.input->content).substr(line.offset, line.length), nullptr, false);
    const char* key = batch.api == Api::kAnthropic ? "params" : "body";
    if (!entry.is_object() || !entry.contains(key) || !entry[key].is_object()) {
      RecordError(
          batch, line.number, line.custom_id, "",
          {500, "the line could not be read again from the batch's input", "", "internal_error"});
      ++batch.next;
      continue;
    }
    const json& body = entry[key];
    ParsedRequest parsed;
    std::optional<ResponsesPlan> responses;
    if (batch.api == Api::kAnthropic) {
      // Threads are refused (no store: thread_unsupported_request), as a batch has no turns.
      ParsedMessagesRequest m = ParseMessagesRequest(body.dump(), codec_, limits_, nullptr);
      if (m.plan)
        parsed.plan = std::move(m.plan->chat);
      else if (m.error.code == "thread_unsupported_request")
        parsed.error = {400, "thread is not available in a batch: send each request whole",
                        "thread", "thread_unsupported_request"};
      else
        parsed.error = m.error;
    } else if (batch.endpoint == "/v1/responses") {
      // Stateless: a batch's responses are not stored (store: true and previous_response_id are
      // refused by the parser without a store), and none runs in the background.
      ParsedResponsesRequest r = ParseResponsesRequest(body.dump(), codec_, limits_, nullptr);
      if (r.plan && r.plan->background)
        r = {std::nullopt,
             {400, "background: true is not available in a batch", "background", "invalid_value"}};
      if (r.plan) {
        parsed.plan = r.plan->chat;
        responses = std::move(r.plan);
      } else {
        parsed.error = r.error;
      }
    } else {
      parsed = PlanGenerationRequest(
          batch.endpoint == "/v1/completions" ? Endpoint::kCompletions : Endpoint::kChat, body,
          codec_, limits_);
    }
    if (parsed.plan && parsed.plan->stream)
      parsed = {std::nullopt,
                {400, "stream: true is not available in a batch", "stream", "invalid_value"}};
    if (!parsed.plan) {
      RecordError(batch, line.number, line.custom_id, "", parsed.error);
      ++batch.next;
      continue;
    }
    auto flight = std::make_shared<InFlight>();
    flight->response_id =
        RandomObjectId(batch.api == Api::kAnthropic                      ? "msg_"
                       : responses                                       ? "resp_"
                       : parsed.plan->endpoint == Endpoint::kCompletions ? "cmpl-"
                                                                         : "chatcmpl-");
    flight->message = batch.api == Api::kAnthropic;
    flight->created = now;
    flight->plan = std::move(*parsed.plan);
    flight->responses = std::move(responses);
    std::vector<EngineRequest> requests = ChoiceRequests(flight->plan, flight->response_id);
    for (auto& r : requests) {
      r.background = true;  // behind live traffic (engine/request.h)
      flight->request_ids.push_back(r.id);
    }
    SubmitError why;
    auto streams = engine_.SubmitAll(std::move(requests), &why);
    if (!streams.ok()) {
      // A full queue or a stopping engine: the line waits for the next round.
      if (why == SubmitError::kQueueFull || why == SubmitError::kStopping) return;
      RecordError(batch, line.number, line.custom_id, flight->response_id,
                  {400, streams.status().message(), "", "invalid_value"});
      ++batch.next;
      continue;
    }
    flight->batch = owner;
    flight->line = line.number;
    flight->custom_id = line.custom_id;
    flight->streams = std::move(streams.value());
    flight->results.resize(flight->streams.size());
    flight->done.assign(flight->streams.size(), false);
    for (auto& stream : flight->streams)
      // Without the lock: SubmitAll runs under it, and a frontend may call notifiers from
      // threads it waits on. A wake lost between the loop's check and its wait costs at most
      // the wait's timeout.
      stream->SetNotifier([this] {
        woken_ = true;
        wake_.notify_all();
      });
    ++batch.in_flight;
    ++batch.next;
    in_flight_.push_back(std::move(flight));
  }
}

void BatchRunner::Collect() {
  for (auto it = in_flight_.begin(); it != in_flight_.end();) {
    InFlight& flight = **it;
    bool all = true;
    for (size_t i = 0; i < flight.streams.size(); ++i) {
      if (flight.done[i]) continue;
      std::vector<RequestEvent> events;
      flight.streams[i]->Drain(&events);
      for (const RequestEvent& e : events)
        if (AddChoiceEvent(flight.results[i], e)) flight.done[i] = true;
      all = all && flight.done[i];
    }
    if (!all) {
      ++it;
      continue;
    }
    Batch& batch = *flight.batch;
    bool failed = false;
    std::string error;
    for (const ChoiceResult& r : flight.results)
      if (r.finish_reason == "error" || r.finish_reason == "abort") {
        failed = true;
        error = r.finish_reason == "abort" ? "the batch was cancelled" : r.error;
      }
    if (!failed) {
      RecordResponse(batch, flight.line, flight.custom_id, flight.response_id,
                     flight.message ? MessageObject(flight.plan, flight.results[0],
                                                    flight.response_id, limits_)
                     : flight.responses
                         ? ResponsesObject(*flight.responses, flight.results[0], flight.response_id,
                                           flight.created, codec_, limits_)
                         : json::parse(ResponseBody(flight.plan, flight.results, flight.response_id,
                                                    flight.created, codec_, limits_)));
    } else if (batch.expiring && error == "the batch was cancelled") {
      RecordExpired(batch, flight.line, flight.custom_id);
    } else if (batch.status == "in_progress" || error != "the batch was cancelled") {
      const bool ours = error == kNothingAllowedError;
      RecordError(batch, flight.line, flight.custom_id, flight.response_id,
                  {ours ? 400 : 500, ours ? error : "generation failed: " + error, "",
                   ours ? "invalid_value" : "internal_error"});
    } else if (batch.api == Api::kAnthropic) {
      RecordCanceled(batch, flight.line, flight.custom_id);
    }
    for (auto& stream : flight.streams)
      stream->SetNotifier(nullptr);
    --batch.in_flight;
    it = in_flight_.erase(it);
  }
}

void BatchRunner::Close(Batch& batch) {
  const int64_t now = UnixNow();
  const bool cancelled = batch.status == "cancelling";
  const bool anthropic = batch.api == Api::kAnthropic;
  // The lines that never ran: expired when the window ran out (in either API's results), or —
  // Anthropic's results name every request — canceled when a cancel kept them from running.
  for (size_t i = batch.next; i < batch.lines.size(); ++i) {
    if (batch.expiring && !cancelled)
      RecordExpired(batch, batch.lines[i].number, batch.lines[i].custom_id);
    else if (anthropic)
      RecordCanceled(batch, batch.lines[i].number, batch.lines[i].custom_id);
  }
  batch.times["finalizing_at"] = now;
  std::vector<Line>().swap(batch.lines);  // the requests are not needed any more
  batch.input.reset();
  batch.next = 0;
  batch.status = cancelled ? "cancelled" : batch.expiring ? "expired" : "completed";
  // Results go to files; where the file budget is full the batch fails saying so (its lines'
  // results would otherwise be lost without a word). The files are named after the batch, so
  // that a restart finds those a crash before the state's save left (RemoveLeftovers).
  for (auto [content, target] : {std::pair{&batch.output, &batch.output_file_id},
                                 std::pair{&batch.error_output, &batch.error_file_id}}) {
    if (content->empty()) continue;
    auto file = files_.Add(fmt::format("{}_{}.jsonl", batch.id,
                                       anthropic                         ? "results"
                                       : target == &batch.output_file_id ? "output"
                                                                         : "error"),
                           anthropic ? kMessageBatchResultsPurpose : "batch_output",
                           std::move(*content), now);
    content->clear();
    if (!file.ok()) {
      batch.status = "failed";
      batch.errors = {{"object", "list"},
                      {"data", json::array({{{"code", "file_too_large"},
                                             {"message", file.status().message()},
                                             {"param", nullptr},
                                             {"line", nullptr}}})}};
      break;
    }
    *target = (*file)->id;
  }
  batch.output.clear();
  batch.error_output.clear();
  batch.times[EndedAtKey(batch)] = now;
  Save(batch);
  // An Anthropic batch's requests go once its end is saved: nothing reads them after.
  if (anthropic) files_.Remove(batch.input_file_id);
}

// On disk, per batch: ID.json, the Batch object as the API would return it (an Anthropic batch's
// state as MessageBatchState writes it; written whole at each change of state), and ID.lines.jsonl,
// one {"line", "status", "record"} a line as its result is recorded (appended; the counts and
// output of a running batch are rebuilt from it). A finished batch's results are in its files; its
// log goes.
json BatchRunner::MessageBatchState(const Batch& batch) const {
  json times = json::object();
  for (const auto& [key, value] : batch.times)
    times[key] = value;
  return {{"id", batch.id},
          {"type", "message_batch"},
          {"status", batch.status},
          {"input_file_id", batch.input_file_id},
          {"results_file_id", batch.output_file_id ? json(*batch.output_file_id) : json()},
          {"errors", batch.errors},
          {"times", times},
          {"request_counts",
           {{"total", batch.total},
            {"succeeded", batch.completed},
            {"errored", batch.failed},
            {"canceled", batch.canceled},
            {"expired", batch.expired}}}};
}

void BatchRunner::Save(const Batch& batch) {
  if (directory_.empty()) return;
  const std::string text =
      (batch.api == Api::kAnthropic ? MessageBatchState(batch) : BatchObject(batch)).dump();
  auto out = PartialFile::Create(directory_ + "/" + batch.id + ".json");
  Status status = out.ok() ? out.value().Put(text.data(), text.size()) : out.status();
  if (status.ok()) status = out.value().Commit(/*durable=*/true);
  if (!status.ok()) return DiskFailed(status.message());
  if (Ended(batch)) std::remove((directory_ + "/" + batch.id + ".lines.jsonl").c_str());
}

void BatchRunner::Journal(Batch& batch, int64_t line, int status, const json& record) {
  if (directory_.empty()) return;
  const json entry = {{"line", line}, {"status", status}, {"record", record}};
  batch.journal_pending += entry.dump(-1, ' ', false, json::error_handler_t::replace);
  batch.journal_pending += '\n';
}

void BatchRunner::FlushJournals() {
  for (const auto& owner : batches_) {
    Batch& batch = *owner;
    if (batch.journal_pending.empty()) continue;
    const std::string text = std::move(batch.journal_pending);
    batch.journal_pending.clear();
    if (Ended(batch)) continue;  // its results are in its files, its journal gone
    // On the disk before the loop waits: a power cut loses at most the pass in progress, whose
    // lines run again (a line cut mid-write is dropped at the restart). The batch thread waits
    // for the disk, not the engine.
    const std::string path = directory_ + "/" + batch.id + ".lines.jsonl";
    std::error_code ec;
    const bool fresh = !std::filesystem::exists(path, ec);
    std::FILE* file = std::fopen(path.c_str(), "ab");
    const bool ok = file != nullptr &&
                    std::fwrite(text.data(), 1, text.size(), file) == text.size() &&
                    std::fflush(file) == 0 && ::fdatasync(::fileno(file)) == 0 &&
                    (!fresh || SyncDirectoryOf(path).ok());
    if (file != nullptr && std::fclose(file) != 0) DiskFailed("cannot write " + path);
    if (!ok) DiskFailed("cannot write " + path);
  }
}

void BatchRunner::DiskFailed(const std::string& what) {
  if (disk_failed_) return;
  disk_failed_ = true;
  std::fprintf(stderr,
               "switchyard: --files-dir: %s; batches go on in memory and a restart may not find "
               "them as they are\n",
               what.c_str());
}

Status BatchRunner::Restore() {
  namespace fs = std::filesystem;
  std::vector<std::shared_ptr<Batch>> restored;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(directory_, ec)) {
    const fs::path path = entry.path();
    if (path.extension() != ".json") continue;
    SY_ASSIGN_OR_RETURN(const std::string text, ReadTextFile(path.string()));
    const json object = json::parse(text, nullptr, false);
    if (!object.is_object())
      return Status::Errorf("{}: not a batch (a JSON object)", path.string());
    auto batch = std::make_shared<Batch>();
    try {
      if (object.value("type", "") == "message_batch") {
        batch->api = Api::kAnthropic;
        batch->id = object.at("id").get<std::string>();
        batch->endpoint = "/v1/messages";
        batch->completion_window = "24h";
        batch->status = object.at("status").get<std::string>();
        batch->input_file_id = object.at("input_file_id").get<std::string>();
        if (!object.at("results_file_id").is_null())
          batch->output_file_id = object["results_file_id"].get<std::string>();
        batch->errors = object.at("errors");
        for (const auto& [key, value] : object.at("times").items())
          batch->times[key] = value.get<int64_t>();
        const json& counts = object.at("request_counts");
        batch->total = counts.at("total").get<int64_t>();
        batch->completed = counts.at("succeeded").get<int64_t>();
        batch->failed = counts.at("errored").get<int64_t>();
        batch->canceled = counts.at("canceled").get<int64_t>();
        batch->expired = counts.value("expired", int64_t{0});  // absent from older states
      } else {
        batch->id = object.at("id").get<std::string>();
        batch->endpoint = object.at("endpoint").get<std::string>();
        batch->input_file_id = object.at("input_file_id").get<std::string>();
        batch->completion_window = object.at("completion_window").get<std::string>();
        batch->status = object.at("status").get<std::string>();
        batch->errors = object.at("errors");
        batch->metadata = object.at("metadata");
        for (const char* key :
             {"created_at", "in_progress_at", "expires_at", "finalizing_at", "completed_at",
              "failed_at", "expired_at", "cancelling_at", "cancelled_at"})
          if (object.contains(key) && !object[key].is_null())
            batch->times[key] = object[key].get<int64_t>();
        for (auto [key, target] : {std::pair{"output_file_id", &batch->output_file_id},
                                   std::pair{"error_file_id", &batch->error_file_id}})
          if (object.contains(key) && !object[key].is_null())
            *target = object[key].get<std::string>();
        const json& counts = object.at("request_counts");
        batch->total = counts.at("total").get<int64_t>();
        batch->completed = counts.at("completed").get<int64_t>();
        batch->failed = counts.at("failed").get<int64_t>();
      }
    } catch (const json::exception& e) {
      return Status::Errorf("{}: not a batch ({})", path.string(), e.what());
    }
    if (path.stem().string() != batch->id)
      return Status::Errorf("{}: describes batch '{}'", path.string(), batch->id);
    const bool running = batch->status == "in_progress" || batch->status == "validating" ||
                         batch->status == "finalizing" || batch->status == "cancelling";
    RemoveLeftovers(*batch, running);
    if (running) {
      // Interrupted: its lines again from the input file, less those with a result in its log.
      auto input = files_.Get(batch->input_file_id);
      if (!input) {  // deleted while the batch ran: what finished is in the log, not worth a guess
        batch->status = "failed";
        batch->times["failed_at"] = UnixNow();
        batch->errors = {
            {"object", "list"},
            {"data", json::array({{{"code", "input_file_gone"},
                                   {"message", fmt::format("the batch was interrupted and its "
                                                           "input file '{}' is gone",
                                                           batch->input_file_id)},
                                   {"param", "input_file_id"},
                                   {"line", nullptr}}})}};
        Save(*batch);
        restored.push_back(std::move(batch));
        continue;
      }
      json errors = json::array();
      batch->input = input;
      ParseLines(batch->api, input->content, batch->endpoint, &batch->lines, &errors);
      batch->completed = batch->failed = batch->canceled = batch->expired = 0;
      std::set<int64_t> done;
      const fs::path log = fs::path(directory_) / (batch->id + ".lines.jsonl");
      // No log yet: no line had a result.
      Result<std::string> logged_text = std::string();
      if (fs::exists(log)) logged_text = ReadTextFile(log.string());
      if (!logged_text.ok()) return logged_text.status();
      std::istringstream lines(logged_text.value());
      std::vector<std::string> texts;
      for (std::string text; std::getline(lines, text);)
        texts.push_back(std::move(text));
      for (size_t i = 0; i < texts.size(); ++i) {
        const json logged = json::parse(texts[i], nullptr, false);
        const bool valid = logged.is_object() && logged.contains("line") &&
                           logged["line"].is_number_integer() && logged.contains("status") &&
                           logged["status"].is_number_integer() && logged.contains("record") &&
                           logged["record"].is_object();
        if (!valid) {
          if (i + 1 == texts.size()) {  // cut short by a crash mid-write: that line runs again
            std::fprintf(stderr, "switchyard: %s: dropped a last line cut short (%zu bytes)\n",
                         log.string().c_str(), texts[i].size());
            continue;
          }
          return Status::Errorf("{} line {}: not a line's result", log.string(), i + 1);
        }
        if (!done.insert(logged["line"].get<int64_t>()).second) continue;
        const int status = logged["status"].get<int>();
        std::string& out =
            status == 200 || batch->api == Api::kAnthropic ? batch->output : batch->error_output;
        out += logged["record"].dump(-1, ' ', false, json::error_handler_t::replace);
        out += '\n';
        ++(status == 200               ? batch->completed
           : status == kCanceledStatus ? batch->canceled
           : status == kExpiredStatus  ? batch->expired
                                       : batch->failed);
      }
      std::erase_if(batch->lines, [&](const Line& line) { return done.contains(line.number); });
      if (batch->status != "cancelling") batch->status = "in_progress";
    }
    restored.push_back(std::move(batch));
  }
  if (ec) return Status::Errorf("--files-dir {}: cannot list it ({})", directory_, ec.message());
  std::sort(restored.begin(), restored.end(), [](const auto& a, const auto& b) {
    const int64_t ta = a->times["created_at"], tb = b->times["created_at"];
    return ta != tb ? ta < tb : a->id < b->id;
  });
  batches_.assign(restored.begin(), restored.end());
  return Status::Ok();
}

void BatchRunner::RemoveLeftovers(const Batch& batch, bool running) {
  if (!running) {
    if (batch.api == Api::kAnthropic) files_.Remove(batch.input_file_id);
    return;
  }
  const std::string prefix = batch.id + "_";
  for (const auto& file : files_.List(""))
    if ((file->purpose == "batch_output" || file->purpose == kMessageBatchResultsPurpose) &&
        file->filename.starts_with(prefix)) {
      std::fprintf(stderr,
                   "switchyard: --files-dir: removed %s (%s), written by an interrupted "
                   "end of batch %s\n",
                   file->id.c_str(), file->filename.c_str(), batch.id.c_str());
      files_.Remove(file->id);
    }
}

void BatchRunner::Loop() {
  std::unique_lock lock(mutex_);
  while (!stopping_) {
    woken_ = false;
    Collect();
    const int64_t now = UnixNow();
    for (const auto& batch : batches_) {
      if (batch->status == "in_progress" && !batch->expiring) {
        auto expires = batch->times.find("expires_at");
        if (expires != batch->times.end() && now >= expires->second) Expire(*batch);
      }
      Advance(batch);
      const bool ended = batch->status == "cancelling" ||
                         (batch->status == "in_progress" &&
                          (batch->expiring || batch->next >= batch->lines.size()));
      if (ended && batch->in_flight == 0) Close(*batch);
    }
    FlushJournals();
    wake_.wait_for(lock, std::chrono::milliseconds(50), [&] { return woken_ || stopping_; });
  }
}

}  // namespace sy::serve
