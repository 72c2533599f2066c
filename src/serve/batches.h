// OpenAI's Batch API (/v1/batches), as the official SDK's `client.batches.create(...)` uses it: a
// JSONL file of requests uploaded through the Files API (serve/files_api.h) runs line by line
// through the same planning and engine as the live endpoints — beside live traffic, a bounded
// number of requests in flight — and writes an output file (the successful lines' responses)
// and an error file (the rest), each line naming its custom_id. Batches live in memory and, where
// the file store is kept on disk (`serve --files-dir`), beside it: each batch's state as it
// changes and each line's result as it is recorded, so that a restart finds every batch and
// runs on those it interrupted from their first line without a result (a line in flight at the
// crash runs again).
//
// Anthropic's Message Batches API (/v1/messages/batches, `client.messages.batches`) runs on the
// same runner: its requests come in the create call's body rather than a file (they are kept as
// a file of the store all the same, one the Files API does not show, so that they count against
// the same budget and outlive a restart the same way), each line is a Messages request, and the
// results — succeeded, errored or, for lines a cancel stopped, canceled — go to one results file
// read back at the batch's results_url.
//
// A batch that has not finished when its completion window (24 hours) runs out expires: what is
// in flight is stopped, and every line without a result is reported expired — in the error file
// (OpenAI's batch_expired) or the results (Anthropic's "expired") — beside the results so far.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/status.h"
#include "engine/engine.h"
#include "serve/files_api.h"
#include "serve/metrics.h"
#include "serve/openai_api.h"

namespace sy::serve {

// Runs batches on a thread of its own.
class BatchRunner {
 public:
  // `max_in_flight`: the batches' requests submitted at once, over all batches (the engine's
  // running batch size is a good value: live requests queue behind at most that many).
  // Batches are kept in files.batches_directory() where the store has one, and read back here.
  // `completion_window`: seconds a batch may run; what it has not run by then is reported
  // expired and the batch ends (OpenAI's status "expired", Anthropic's "expired" results). 0:
  // batches never expire (an offline run-batch).
  BatchRunner(RequestFrontend& engine, const TextCodec& codec, const ServingLimits& limits,
              FileStore& files, int64_t max_in_flight,
              int64_t completion_window = kDefaultCompletionWindow);
  static constexpr int64_t kDefaultCompletionWindow = 24 * 3600;  // both APIs' 24 h
  ~BatchRunner();
  // Whether the batches kept on disk were read back (an error names the file and what is wrong;
  // the server refuses to start on it rather than lose them).
  const Status& restored() const { return restored_; }
  // /v1/batches: POST (create), GET (list), /{id} GET, /{id}/cancel POST. `path` is what follows
  // "/v1/batches".
  ApiReply Request(const std::string& method, const std::string& path, const std::string& query,
                   const std::string& body, int64_t now);
  // /v1/messages/batches: POST (create), GET (list), /{id} GET and DELETE, /{id}/cancel POST,
  // /{id}/results GET (JSONL). `path` is what follows "/v1/messages/batches"; `origin`
  // ("http://host:port", or "" for none) makes the absolute results_url Anthropic's clients
  // fetch (a relative one where it is empty).
  ApiReply MessageBatchesRequest(const std::string& method, const std::string& path,
                                 const std::string& query, const std::string& body, int64_t now,
                                 const std::string& origin);
  // Stops the thread, aborting what is in flight (server shutdown).
  void Stop();
  // For /metrics.
  BatchGauges Gauges();

 private:
  // A line waiting to run: where its text lies in the batch's input. Its request is parsed again
  // when it is submitted rather than held parsed — a parsed line takes several times its text,
  // and a batch may hold a hundred thousand.
  struct Line {
    int64_t number = 0;  // 1-based, in the input file
    std::string custom_id;
    size_t offset = 0, length = 0;  // in the input's content
  };
  struct InFlight;
  // Which API a batch belongs to: its objects, its lines and its results take that API's shapes.
  enum class Api { kOpenAI, kAnthropic };
  struct Batch {
    Api api = Api::kOpenAI;
    // An Anthropic batch: endpoint "/v1/messages"; input_file_id names the store's hidden file
    // of its requests (gone once the batch ends) and output_file_id its results.
    std::string id, endpoint, input_file_id, completion_window;
    nlohmann::ordered_json metadata, errors;  // errors: null, or OpenAI's list of line errors
    std::string status;  // validating, failed, in_progress, finalizing, completed, cancelling,
                         // cancelled
    std::map<std::string, int64_t> times;     // created_at, in_progress_at, … where set
    std::vector<Line> lines;                  // released once the batch ends
    std::shared_ptr<const StoredFile> input;  // what `lines` point into, held while they run
    int64_t total = 0;                        // lines
    size_t next = 0;                          // the first line not yet submitted
    int64_t completed = 0, failed = 0;
    int64_t canceled = 0;              // Anthropic's: lines a cancel stopped
    int64_t expired = 0;               // lines the completion window ran out on
    bool expiring = false;             // past expires_at: running lines aborted, no more start
    std::string output, error_output;  // JSONL so far (an Anthropic batch's all in output)
    std::string journal_pending;       // results not yet in ID.lines.jsonl
    std::optional<std::string> output_file_id, error_file_id;
    int64_t in_flight = 0;
  };
  // Whether a batch has ended (completed, failed, cancelled, expired), and the key of `times`
  // its end is kept under.
  static bool Ended(const Batch& batch);
  static const char* EndedAtKey(const Batch& batch);
  nlohmann::ordered_json BatchObject(const Batch& batch) const;
  // Anthropic's MessageBatch object; `origin` as MessageBatchesRequest's.
  nlohmann::ordered_json MessageBatchObject(const Batch& batch, const std::string& origin) const;
  // What an Anthropic batch keeps on disk: its state in this runner's terms.
  nlohmann::ordered_json MessageBatchState(const Batch& batch) const;
  ApiReply Create(const std::string& body, int64_t now);
  ApiReply CreateMessageBatch(const std::string& body, int64_t now, const std::string& origin);
  // Under mutex_: the batch of `api` whose id is `id`, or null.
  std::shared_ptr<Batch> Find(Api api, const std::string& id);
  // Under mutex_: aborts the batch's requests in flight (they end as "abort").
  void AbortInFlight(const Batch& batch);
  // Under mutex_: marks a running batch cancelling and aborts its requests in flight.
  void Cancel(Batch& batch, int64_t now);
  // Under mutex_: a running batch past its expires_at: nothing more starts, its requests in
  // flight are aborted and recorded expired, and the batch then closes as expired.
  void Expire(Batch& batch);
  // The file's lines as requests to `endpoint`, checked as OpenAI checks them; `errors` gets
  // OpenAI's line errors (at most 100). An Anthropic batch's kept requests are lines of
  // {"custom_id", "params"}, checked when the batch was created.
  static void ParseLines(Api api, const std::string& content, const std::string& endpoint,
                         std::vector<Line>* lines, nlohmann::ordered_json* errors);
  // On disk (directory_ not empty): the batch's state, written whole; a line's result, appended.
  void Save(const Batch& batch);
  // A line's result goes to the batch's journal_pending; FlushJournals puts every batch's on the
  // disk (one write and one fdatasync a batch) at the end of each pass of the loop, before it
  // waits or stops — a group commit: a fast model's many lines a pass cost one sync, not one
  // each.
  void Journal(Batch& batch, int64_t line, int status, const nlohmann::ordered_json& record);
  void FlushJournals();
  void DiskFailed(const std::string& what);
  Status Restore();
  void Loop();
  // Under mutex_: submits what fits, takes finished requests, closes finished batches.
  void Advance(const std::shared_ptr<Batch>& batch);
  void Collect();
  void Close(Batch& batch);
  // One result line, in the batch's API's shape: a response body (200), an error, or (Anthropic's
  // batches) a line the batch's cancel stopped.
  void RecordResponse(Batch& batch, int64_t line, const std::string& custom_id,
                      const std::string& request_id, const nlohmann::ordered_json& body);
  void RecordError(Batch& batch, int64_t line, const std::string& custom_id,
                   const std::string& request_id, const ApiError& error);
  void RecordCanceled(Batch& batch, int64_t line, const std::string& custom_id);
  // A line the completion window ran out on: OpenAI's batch_expired error, Anthropic's
  // "expired" result.
  void RecordExpired(Batch& batch, int64_t line, const std::string& custom_id);
  // A result's journal status: 200, an error's HTTP status, or one of these.
  static constexpr int kCanceledStatus = 0, kExpiredStatus = -1;
  // Appends a result line and journals it; `status` as above.
  void Append(Batch& batch, int64_t line, int status, const nlohmann::ordered_json& record);
  // Under Restore: a running batch's files that a Close interrupted before its state was saved
  // left (named after the batch), and an ended Anthropic batch's requests, whose removal a
  // crash prevented.
  void RemoveLeftovers(const Batch& batch, bool running);

  RequestFrontend& engine_;
  const TextCodec& codec_;
  const ServingLimits limits_;
  FileStore& files_;
  const int64_t max_in_flight_;
  const int64_t completion_window_;  // seconds; 0: never
  const std::string directory_;      // "": batches in memory only
  Status restored_;
  bool disk_failed_ = false;                                              // reported once
  int64_t succeeded_total_ = 0, errored_total_ = 0, canceled_total_ = 0;  // this process's
  int64_t expired_total_ = 0;

  std::mutex mutex_;
  std::condition_variable wake_;
  bool stopping_ = false;
  std::atomic<bool> woken_{false};
  std::deque<std::shared_ptr<Batch>> batches_;  // creation order
  std::vector<std::shared_ptr<InFlight>> in_flight_;
  std::thread thread_;
};

}  // namespace sy::serve
