// Stored responses for the Responses API (store, previous_response_id, GET/DELETE
// /v1/responses/{id}, GET /v1/responses/{id}/input_items): each finished response that asked to
// be stored, with the input items the model saw, kept in memory under a byte budget; the least
// recently used go first. Anthropic's message threads (serve/messages_api.h) keep their replies
// here too, under their msg_ ids, and each of those is continued at most once (the claims below).
// Written here because it is a map and a list: no library's cache fits better than the thirty lines
// below.
//
// The store belongs to the HTTP front (serve, or route in front of its instances): a follow-up
// turn works whichever instance ran the one before. Kept in a directory (Open), it outlives the
// process: every change is appended to a journal there as it is made and read back at the next
// start. Several fronts do not share one (a client with more than one front keeps sending whole
// inputs).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/status.h"

namespace sy::serve {

struct StoredResponse {
  nlohmann::ordered_json response;  // the Response object as it was returned (finished)
  // The input items the model saw, without the instructions (which a follow-up does not carry
  // over): the earlier turns of a previous_response_id chain, then this request's input, each
  // with an id. A follow-up turn's context is this, then response["output"].
  nlohmann::ordered_json context;
  // A background response's events as streamed (one server-sent event each, sequence_number its
  // index), so GET ?stream=true replays them; null for the others.
  std::shared_ptr<const std::vector<std::string>> events;
};

class ResponsesStore {
 public:
  explicit ResponsesStore(size_t max_bytes) : max_bytes_(max_bytes) {}
  // A store kept in `directory` as well (created if need be): its journal, responses.jsonl, is
  // read back (what an earlier process stored, deleted and continued, within the budget), then
  // every change is appended as it is made (flushed to the OS: it survives the process, not a
  // power cut) and the journal is rewritten when it holds over twice what is live. One process
  // at a time: a directory another process holds is an error naming it, as is a journal damaged
  // before its last line; a last line cut short (a crash mid-write) is dropped with a warning.
  // A write that fails is reported once and the store goes on in memory.
  static Result<std::shared_ptr<ResponsesStore>> Open(size_t max_bytes,
                                                      const std::string& directory);
  ~ResponsesStore();
  ResponsesStore(const ResponsesStore&) = delete;
  ResponsesStore& operator=(const ResponsesStore&) = delete;

  // Keeps `entry` under `id`, evicting the least recently used entries beyond the budget. An
  // entry larger than the whole budget is not kept (Get then finds nothing).
  void Put(const std::string& id, StoredResponse entry);
  // The entry, now the most recently used; null when never stored, evicted or deleted.
  std::shared_ptr<const StoredResponse> Get(const std::string& id);
  // Whether there was one to delete.
  bool Erase(const std::string& id);
  // Replaces the entry with `change` applied to a copy of it, at once for concurrent callers (a
  // conversation's items appended by two responses); false when there is no such entry.
  bool Update(const std::string& id, const std::function<void(StoredResponse&)>& change);

  // A thread's reply is continued once: the first request to continue it claims it until it
  // finishes (kInFlight for others meanwhile); a finished continuation leaves it kContinued, a
  // failed one unclaimed. An id not stored (or evicted) is kNotFound.
  enum class Claim { kClaimed, kNotFound, kInFlight, kContinued };
  Claim ClaimContinuation(const std::string& id);
  void ReleaseContinuation(const std::string& id, bool continued);

  size_t bytes() const;
  size_t size() const;
  int64_t evictions() const;  // entries dropped for the budget, since the start
  size_t max_bytes() const { return max_bytes_; }

 private:
  void EvictBeyondBudget();  // least recently used first; with mutex_ held
  // With mutex_ held: `id`'s entry out of the map and the budget (false: there was none); an
  // entry in as the most recently used, then the budget kept.
  bool Remove(const std::string& id);
  void Keep(const std::string& id, StoredResponse entry, size_t bytes);
  // The journal (Open), with mutex_ held: one record appended; the live entries rewritten.
  void Journal(const nlohmann::ordered_json& record);
  void JournalFailed(const char* doing);  // reported once; the store goes on in memory
  void Compact();
  Status Replay(const std::string& path);
  Status ReplayLine(const std::string& path, const std::string& line, size_t number, bool last);
  struct Entry {
    std::string id;
    std::shared_ptr<const StoredResponse> value;
    size_t bytes = 0;
  };
  const size_t max_bytes_;
  mutable std::mutex mutex_;
  std::list<Entry> order_;  // most recently used first
  std::unordered_map<std::string, std::list<Entry>::iterator> by_id_;
  size_t bytes_ = 0;
  int64_t evictions_ = 0;
  // Claimed ids: false while the continuation runs, true once it finished.
  std::unordered_map<std::string, bool> continued_;
  std::string journal_path_;  // empty: in memory only
  int journal_fd_ = -1, lock_fd_ = -1;
  size_t journal_bytes_ = 0;
  bool journal_failed_ = false;
};

}  // namespace sy::serve
