// OpenAI's Files API (/v1/files): uploads (multipart/form-data, as the official SDK's
// `client.files.create(file=..., purpose="batch")` sends them) and the files batches write, kept
// in memory under a byte budget (`serve --files-mb`) and, with `serve --files-dir`, on disk as
// well, so that they outlive the process. The Batch API (serve/batches.h) reads and writes them.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/status.h"
#include "serve/openai_api.h"

namespace sy::serve {

// One part of a multipart/form-data body (RFC 7578).
struct FormPart {
  std::string name, filename, content_type, data;
};
// The parts of `body` under `content_type` ("multipart/form-data; boundary=..."); an error says
// what is malformed. Written here: Boost.Beast parses HTTP but not multipart bodies, and the one
// Debian library that does (GMime) brings a MIME stack for four header fields. Fuzzed.
Result<std::vector<FormPart>> ParseMultipart(std::string_view content_type, std::string_view body);

struct StoredFile {
  std::string id, filename, purpose;
  int64_t created_at = 0;
  std::string content;
};
nlohmann::ordered_json FileObject(const StoredFile& file);

// The purposes of the files an Anthropic message batch keeps in the store (serve/batches.h): its
// requests and its results. They count against the store's budget and live on its disk, but
// the Files API neither lists nor serves them (they are the Message Batches API's).
inline constexpr const char* kMessageBatchRequestsPurpose = "message_batch_requests";
inline constexpr const char* kMessageBatchResultsPurpose = "message_batch_results";
bool HiddenFromFilesApi(const StoredFile& file);

// Uploaded files and the files batches write, under a byte budget (a file that does not fit is
// refused; nothing is evicted: a batch's files are its results).
class FileStore {
 public:
  explicit FileStore(size_t budget_bytes) : budget_(budget_bytes) {}
  // A store kept in `directory` as well (created if need be; one process at a time, by a lock
  // file there): the files an earlier process kept are read back (more than the budget is an
  // error naming both), each file added is on disk before Add answers (its content, then its
  // description: a crash between leaves no half file), each removed is deleted. The batches'
  // state lives beside them (batches_directory()).
  static Result<std::unique_ptr<FileStore>> Open(size_t budget_bytes, const std::string& directory);
  ~FileStore();
  FileStore(const FileStore&) = delete;
  FileStore& operator=(const FileStore&) = delete;

  // The stored file, or an error (413) where the budget has no room for it or the disk refuses
  // it.
  Result<std::shared_ptr<const StoredFile>> Add(std::string filename, std::string purpose,
                                                std::string content, int64_t now);
  std::shared_ptr<const StoredFile> Get(const std::string& id) const;
  bool Remove(const std::string& id);
  // Newest first (OpenAI's default order), after the file `after` when given.
  std::vector<std::shared_ptr<const StoredFile>> List(const std::string& purpose) const;
  size_t budget() const { return budget_; }
  // Where a batch runner keeps its batches: DIRECTORY/batches; "" for a store in memory.
  std::string batches_directory() const;

 private:
  Status Load();  // under Open
  std::string FilePath(const std::string& id, const char* suffix) const;

  mutable std::mutex mutex_;
  size_t budget_, used_ = 0;
  std::vector<std::shared_ptr<const StoredFile>> files_;  // in upload order
  std::string directory_;                                 // "": in memory only
  int lock_fd_ = -1;
};

// What an API call answers: a JSON body (200), raw content, or an error.
struct ApiReply {
  ApiError error{0, "", "", ""};  // status 0: no error
  std::string body;
  std::string content_type = "application/json";
  bool ok() const { return error.status == 0; }
};

// /v1/files: POST (multipart upload), GET (list), /{id} GET and DELETE, /{id}/content GET.
// `path` is what follows "/v1/files".
ApiReply FilesRequest(FileStore& files, const std::string& method, const std::string& path,
                      const std::string& query, std::string_view content_type,
                      std::string_view body, int64_t now);

// An id for a new object: `prefix` and 24 random hex digits.
std::string RandomObjectId(const char* prefix);
ApiReply ErrorReply(int status, std::string message, std::string param, std::string code);
ApiReply JsonReply(const nlohmann::ordered_json& body);
// Query parameters of a list call (limit, after, purpose): the value, or "" where absent.
std::string QueryParameter(const std::string& query, const std::string& key);
// A list call's `limit`: 20 where absent, or an integer in [1, most]; nullopt when it is not.
std::optional<int64_t> LimitParameter(const std::string& query, int64_t most);
// A list in OpenAI's shape ({"object": "list", "data", "first_id", "last_id", "has_more"}): at
// most `limit` (default 20) objects after the one whose id is `after`.
ApiReply ListPage(const std::vector<nlohmann::ordered_json>& objects, const std::string& query);

}  // namespace sy::serve
