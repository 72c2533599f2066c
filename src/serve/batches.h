// OpenAI's Batch API (/v1/batches), as the official SDK's `client.batches.create(...)` uses it: a
// JSONL file of requests uploaded through the Files API (serve/files_api.h) runs line by line
// through the same planning and engine as the live endpoints — beside live traffic, a bounded
// number of requests in flight — and writes an output file (the successful lines' responses)
// and an error file (the rest), each line naming its custom_id. Batches live in memory and, where
// the file store is kept on disk (`serve --files-dir`), beside it: each batch's state as it
// changes and each line's result as it is recorded, so that a restart finds every batch and
// runs on those it interrupted from their first line without a result (a line in flight at the
// crash runs again).
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
#include "serve/openai_api.h"

namespace sy::serve {

// Runs batches on a thread of its own.
class BatchRunner {
 public:
  // `max_in_flight`: the batches' requests submitted at once, over all batches (the engine's
  // running batch size is a good value: live requests queue behind at most that many).
  // Batches are kept in files.batches_directory() where the store has one, and read back here.
  BatchRunner(RequestFrontend& engine, const TextCodec& codec, const ServingLimits& limits,
              FileStore& files, int64_t max_in_flight);
  ~BatchRunner();
  // Whether the batches kept on disk were read back (an error names the file and what is wrong;
  // the server refuses to start on it rather than lose them).
  const Status& restored() const { return restored_; }
  // /v1/batches: POST (create), GET (list), /{id} GET, /{id}/cancel POST. `path` is what follows
  // "/v1/batches".
  ApiReply Request(const std::string& method, const std::string& path, const std::string& query,
                   const std::string& body, int64_t now);
  // Stops the thread, aborting what is in flight (server shutdown).
  void Stop();

 private:
  struct Line {
    int64_t number = 0;  // 1-based, in the input file
    std::string custom_id;
    nlohmann::ordered_json body;
  };
  struct InFlight;
  struct Batch {
    std::string id, endpoint, input_file_id, completion_window;
    nlohmann::ordered_json metadata, errors;  // errors: null, or OpenAI's list of line errors
    std::string status;  // validating, failed, in_progress, finalizing, completed, cancelling,
                         // cancelled
    std::map<std::string, int64_t> times;  // created_at, in_progress_at, … where set
    std::vector<Line> lines;               // released once the batch ends
    int64_t total = 0;                     // lines
    size_t next = 0;                       // the first line not yet submitted
    int64_t completed = 0, failed = 0;
    std::string output, error_output;  // JSONL so far
    std::optional<std::string> output_file_id, error_file_id;
    int64_t in_flight = 0;
  };
  nlohmann::ordered_json BatchObject(const Batch& batch) const;
  ApiReply Create(const std::string& body, int64_t now);
  // The file's lines as requests to `endpoint`, checked as OpenAI checks them; `errors` gets
  // OpenAI's line errors (at most 100).
  static void ParseLines(const std::string& content, const std::string& endpoint,
                         std::vector<Line>* lines, nlohmann::ordered_json* errors);
  // On disk (directory_ not empty): the batch's state, written whole; a line's result, appended.
  void Save(const Batch& batch);
  void Journal(const Batch& batch, int64_t line, const nlohmann::ordered_json& record);
  void DiskFailed(const std::string& what);
  Status Restore();
  void Loop();
  // Under mutex_: submits what fits, takes finished requests, closes finished batches.
  void Advance(const std::shared_ptr<Batch>& batch);
  void Collect();
  void Close(Batch& batch);
  // One output line: `status` 200 with the response body, else the error's.
  void Record(Batch& batch, int64_t line, const std::string& custom_id, int status,
              const std::string& request_id, const nlohmann::ordered_json& body);

  RequestFrontend& engine_;
  const TextCodec& codec_;
  const ServingLimits limits_;
  FileStore& files_;
  const int64_t max_in_flight_;
  const std::string directory_;  // "": batches in memory only
  Status restored_;
  bool disk_failed_ = false;  // reported once

  std::mutex mutex_;
  std::condition_variable wake_;
  bool stopping_ = false;
  std::atomic<bool> woken_{false};
  std::deque<std::shared_ptr<Batch>> batches_;  // creation order
  std::vector<std::shared_ptr<InFlight>> in_flight_;
  std::thread thread_;
};

}  // namespace sy::serve
