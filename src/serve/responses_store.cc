#include "serve/responses_store.h"

namespace sy::serve {
namespace {

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
    bytes_ -= last.bytes;
    by_id_.erase(last.id);
    continued_.erase(last.id);
    order_.pop_back();
    ++evictions_;
  }
}

void ResponsesStore::Put(const std::string& id, StoredResponse entry) {
  const size_t bytes = EntryBytes(id, entry);
  std::lock_guard lock(mutex_);
  if (auto it = by_id_.find(id); it != by_id_.end()) {
    bytes_ -= it->second->bytes;
    order_.erase(it->second);
    by_id_.erase(it);
  }
  if (bytes > max_bytes_) return;
  order_.push_front({id, std::make_shared<const StoredResponse>(std::move(entry)), bytes});
  by_id_[id] = order_.begin();
  bytes_ += bytes;
  EvictBeyondBudget();
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
  auto it = by_id_.find(id);
  if (it == by_id_.end()) return false;
  bytes_ -= it->second->bytes;
  order_.erase(it->second);
  by_id_.erase(it);
  continued_.erase(id);
  return true;
}

bool ResponsesStore::Update(const std::string& id,
                            const std::function<void(StoredResponse&)>& change) {
  std::lock_guard lock(mutex_);
  auto it = by_id_.find(id);
  if (it == by_id_.end()) return false;
  StoredResponse copy = *it->second->value;
  change(copy);
  const size_t bytes = EntryBytes(id, copy);
  bytes_ = bytes_ - it->second->bytes + bytes;
  it->second->value = std::make_shared<const StoredResponse>(std::move(copy));
  it->second->bytes = bytes;
  order_.splice(order_.begin(), order_, it->second);
  EvictBeyondBudget();  // the entry grown past the whole budget goes too, as Put would not keep it
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
  } else {
    continued_.erase(it);
  }
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
