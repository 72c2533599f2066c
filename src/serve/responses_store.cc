#include "serve/responses_store.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

namespace sy::serve {
namespace {

using json = nlohmann::ordered_json;  // the objects keep their key order through a restart

// A journal record that keeps an entry.
json PutRecord(const std::string& id, const StoredResponse& entry) {
  return {{"op", "put"},
          {"id", id},
          {"response", entry.response},
          {"context", entry.context},
          {"events", entry.events ? json(*entry.events) : json(nullptr)}};
}

// One journal line: the record's JSON (invalid UTF-8 replaced) and a newline.
std::string JournalLine(const json& record) {
  return record.dump(-1, ' ', false, json::error_handler_t::replace) + '\n';
}

bool WriteAll(int fd, const std::string& text) {
  for (size_t done = 0; done < text.size();) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    done += static_cast<size_t>(n);
  }
  return true;
}

// The size of an entry's JSON text (and events): what it costs to keep, near enough.
size_t EntryBytes(const std::string& id, const StoredResponse& entry) {
  size_t bytes = id.size() + entry.response.dump().size() + entry.context.dump().size();
  if (entry.events)
    for (const std::string& event : *entry.events)
      bytes += event.size();
  return bytes;
}

}  // namespace

void ResponsesStore::EvictBeyondBudget() {
  while (bytes_ > max_bytes_ && !order_.empty()) {
    const Entry& last = order_.back();
    Journal({{"op", "erase"}, {"id", last.id}});  // so a restart finds what this process had
    bytes_ -= last.bytes;
    by_id_.erase(last.id);
    continued_.erase(last.id);
    order_.pop_back();
    ++evictions_;
  }
}

bool ResponsesStore::Remove(const std::string& id) {
  auto it = by_id_.find(id);
  if (it == by_id_.end()) return false;
  bytes_ -= it->second->bytes;
  order_.erase(it->second);
  by_id_.erase(it);
  return true;
}

void ResponsesStore::Keep(const std::string& id, StoredResponse entry, size_t bytes) {
  order_.push_front({id, std::make_shared<const StoredResponse>(std::move(entry)), bytes});
  by_id_[id] = order_.begin();
  bytes_ += bytes;
  EvictBeyondBudget();
}

void ResponsesStore::Put(const std::string& id, StoredResponse entry) {
  const size_t bytes = EntryBytes(id, entry);
  std::lock_guard lock(mutex_);
  Remove(id);
  if (bytes > max_bytes_) {
    Journal({{"op", "erase"}, {"id", id}});
    return;
  }
  Journal(PutRecord(id, entry));
  Keep(id, std::move(entry), bytes);
  Compact();
}

std::shared_ptr<const StoredResponse> ResponsesStore::Get(const std::string& id) {
  std::lock_guard lock(mutex_);
  auto it = by_id_.find(id);
  if (it == by_id_.end()) return nullptr;
  order_.splice(order_.begin(), order_, it->second);
  return it->second->value;
}

bool ResponsesStore::Erase(const std::string& id) {
  std::lock_guard lock(mutex_);
  if (!Remove(id)) return false;
  continued_.erase(id);
  Journal({{"op", "erase"}, {"id", id}});
  return true;
}

bool ResponsesStore::Update(const std::string& id,
                            const std::function<void(StoredResponse&)>& change) {
  std::lock_guard lock(mutex_);
  auto it = by_id_.find(id);
  if (it == by_id_.end()) return false;
  StoredResponse copy = *it->second->value;
  change(copy);
  Journal(PutRecord(id, copy));
  const size_t bytes = EntryBytes(id, copy);
  bytes_ = bytes_ - it->second->bytes + bytes;
  it->second->value = std::make_shared<const StoredResponse>(std::move(copy));
  it->second->bytes = bytes;
  order_.splice(order_.begin(), order_, it->second);
  EvictBeyondBudget();  // the entry grown past the whole budget goes too, as Put would not keep it
  Compact();
  return true;
}

ResponsesStore::Claim ResponsesStore::ClaimContinuation(const std::string& id) {
  std::lock_guard lock(mutex_);
  if (!by_id_.contains(id)) return Claim::kNotFound;
  auto [it, inserted] = continued_.try_emplace(id, false);
  if (inserted) return Claim::kClaimed;
  return it->second ? Claim::kContinued : Claim::kInFlight;
}

void ResponsesStore::ReleaseContinuation(const std::string& id, bool continued) {
  std::lock_guard lock(mutex_);
  auto it = continued_.find(id);
  if (it == continued_.end()) return;
  if (continued && by_id_.contains(id)) {
    it->second = true;
    Journal({{"op", "continued"}, {"id", id}});
  } else {
    continued_.erase(it);
  }
}

Result<std::shared_ptr<ResponsesStore>> ResponsesStore::Open(size_t max_bytes,
                                                             const std::string& directory) {
  std::error_code ec;
  std::filesystem::create_directories(directory, ec);
  if (ec)
    return Status::Errorf("--responses-store-dir {}: cannot create it ({})", directory,
                          ec.message());
  auto store = std::make_shared<ResponsesStore>(max_bytes);
  const std::string lock_path = directory + "/lock";
  store->lock_fd_ = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (store->lock_fd_ < 0)
    return Status::Errorf("--responses-store-dir {}: cannot open {} ({})", directory, lock_path,
                          std::strerror(errno));
  if (::flock(store->lock_fd_, LOCK_EX | LOCK_NB) != 0)
    return Status::Errorf(
        "--responses-store-dir {}: another process keeps its store there (one at a time)",
        directory);
  const std::string path = directory + "/responses.jsonl";
  {
    std::lock_guard lock(store->mutex_);
    SY_RETURN_IF_ERROR(store->Replay(path));
    store->journal_path_ = path;
    store->journal_bytes_ = SIZE_MAX;  // rewrite now: the history and any cut line go
    store->Compact();
  }
  if (store->journal_failed_)
    return Status::Errorf("--responses-store-dir {}: cannot write {}", directory, path);
  return store;
}

ResponsesStore::~ResponsesStore() {
  if (journal_fd_ >= 0) ::close(journal_fd_);
  if (lock_fd_ >= 0) ::close(lock_fd_);  // the lock goes with it
}

Status ResponsesStore::Replay(const std::string& path) {
  std::ifstream in(path);
  if (!in) return Status::Ok();  // nothing stored yet
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);)
    lines.push_back(std::move(line));
  for (size_t i = 0; i < lines.size(); ++i) {
    if (lines[i].empty()) continue;
    try {
      SY_RETURN_IF_ERROR(ReplayLine(path, lines[i], i + 1, i + 1 == lines.size()));
    } catch (const json::exception& e) {  // a field of the wrong type
      return Status::Errorf("{} line {}: not a journal record ({})", path, i + 1, e.what());
    }
  }
  evictions_ = 0;  // replaying is not evicting
  return Status::Ok();
}

Status ResponsesStore::ReplayLine(const std::string& path, const std::string& line, size_t number,
                                  bool last) {
  const json record = json::parse(line, nullptr, false);
  const bool valid = !record.is_discarded() && record.is_object() && record.contains("op") &&
                     record["op"].is_string() && record.contains("id") && record["id"].is_string();
  if (!valid) {
    if (last) {  // cut short by a crash mid-write: the change never was
      std::fprintf(stderr, "switchyard: %s: dropped a last line cut short (%zu bytes)\n",
                   path.c_str(), line.size());
      return Status::Ok();
    }
    return Status::Errorf("{} line {}: not a journal record; the store cannot be read back", path,
                          number);
  }
  const std::string id = record["id"];
  const std::string op = record["op"];
  if (op == "put") {
    StoredResponse entry;
    entry.response = record.value("response", json());
    entry.context = record.value("context", json());
    if (record.contains("events") && record["events"].is_array())
      entry.events = std::make_shared<const std::vector<std::string>>(
          record["events"].get<std::vector<std::string>>());
    const size_t bytes = EntryBytes(id, entry);
    Remove(id);
    if (bytes <= max_bytes_) Keep(id, std::move(entry), bytes);  // as Put: larger is not kept
  } else if (op == "erase") {
    Remove(id);
    continued_.erase(id);
  } else if (op == "continued") {
    if (by_id_.contains(id)) continued_[id] = true;
  } else {
    return Status::Errorf("{} line {}: unknown journal operation '{}'", path, number, op);
  }
  return Status::Ok();
}

void ResponsesStore::JournalFailed(const char* doing) {
  journal_failed_ = true;
  std::fprintf(stderr,
               "switchyard: cannot %s %s (%s): stored responses are kept in memory only from now "
               "on\n",
               doing, journal_path_.c_str(), std::strerror(errno));
}

void ResponsesStore::Journal(const json& record) {
  if (journal_fd_ < 0 || journal_failed_) return;
  const std::string line = JournalLine(record);
  if (!WriteAll(journal_fd_, line)) return JournalFailed("append to");
  journal_bytes_ += line.size();
}

void ResponsesStore::Compact() {
  // Rewritten when over twice what is live (and 1 MB): oldest first, so reading it back puts
  // the most recently used first again; threads' finished continuations after their replies.
  if (journal_path_.empty() || journal_failed_) return;
  if (journal_bytes_ != SIZE_MAX && journal_bytes_ <= std::max<size_t>(2 * bytes_, 1 << 20)) return;
  const std::string temporary = journal_path_ + ".new";
  const int fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  bool ok = fd >= 0;
  size_t written = 0;
  auto write = [&](const json& record) {
    const std::string line = JournalLine(record);
    ok = ok && WriteAll(fd, line);
    written += line.size();
  };
  for (auto it = order_.rbegin(); ok && it != order_.rend(); ++it)
    write(PutRecord(it->id, *it->value));
  for (const auto& [id, done] : continued_)
    if (done) write({{"op", "continued"}, {"id", id}});
  ok = ok && ::fsync(fd) == 0;
  if (fd >= 0) ::close(fd);
  ok = ok && std::rename(temporary.c_str(), journal_path_.c_str()) == 0;
  if (!ok) return JournalFailed("rewrite");
  if (journal_fd_ >= 0) ::close(journal_fd_);
  journal_fd_ = ::open(journal_path_.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC);
  if (journal_fd_ < 0) return JournalFailed("append to");
  journal_bytes_ = written;
}

size_t ResponsesStore::bytes() const {
  std::lock_guard lock(mutex_);
  return bytes_;
}

int64_t ResponsesStore::evictions() const {
  std::lock_guard lock(mutex_);
  return evictions_;
}

size_t ResponsesStore::size() const {
  std::lock_guard lock(mutex_);
  return order_.size();
}

}  // namespace sy::serve
