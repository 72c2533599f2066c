#include "engine/page_pool.h"

#include <xxhash.h>

#include <algorithm>

namespace sy {

PagePool::PagePool(LatentCache& cache) : cache_(cache), pages_(cache.total_pages()) {}

int32_t PagePool::Allocate() {
  int32_t page = cache_.TakePage();
  if (page < 0) {
    if (lru_.empty()) return -1;
    page = lru_.front();
    Evict(page);
  }
  pages_[page].refs = 1;
  return page;
}

void PagePool::Evict(int32_t page) {
  Page& p = pages_[page];
  lru_.erase(p.lru_entry);
  if (p.tail) {
    auto [first, last] = tails_.equal_range(p.hash);
    for (auto it = first; it != last; ++it)
      if (it->second == page) {
        tails_.erase(it);
        break;
      }
    p.tail = false;
  } else {
    by_hash_.erase(p.hash);
    if (events_ != nullptr) events_->Record(p.hash, false);
  }
  p.cached = false;
  p.tokens.clear();
}

void PagePool::Release(int32_t page) {
  Page& p = pages_[page];
  if (--p.refs > 0) return;
  if (p.cached) {
    p.lru_entry = lru_.insert(lru_.end(), page);
  } else {
    cache_.ReturnPage(page);
  }
}

uint64_t PagePool::ChainHash(uint64_t previous, std::span<const int32_t> tokens) {
  // The previous page's hash seeds this one: the chain covers every earlier token.
  return XXH3_64bits_withSeed(tokens.data(), tokens.size_bytes(), previous);
}

uint64_t PagePool::PageHash(uint64_t previous, std::span<const int32_t> tokens, int64_t index,
                            int64_t generated_from) {
  const uint64_t hash = ChainHash(previous, tokens);
  const int64_t end = (index + 1) * static_cast<int64_t>(tokens.size());
  if (end <= generated_from) return hash;
  return XXH3_64bits_withSeed(&generated_from, sizeof(generated_from), hash);
}

std::vector<int32_t> PagePool::Match(std::span<const int32_t> tokens, int64_t max_pages,
                                     int64_t generated_from, std::vector<uint64_t>* hashes) {
  std::vector<int32_t> found;
  const int64_t size = page_size();
  uint64_t hash = 0;
  for (int64_t i = 0; i < max_pages && (i + 1) * size <= static_cast<int64_t>(tokens.size()); ++i) {
    const auto page_tokens = tokens.subspan(i * size, size);
    hash = PageHash(hash, page_tokens, i, generated_from);
    auto it = by_hash_.find(hash);
    if (it == by_hash_.end()) break;
    Page& p = pages_[it->second];
    if (!std::equal(p.tokens.begin(), p.tokens.end(), page_tokens.begin(), page_tokens.end()))
      break;
    if (p.refs++ == 0) lru_.erase(p.lru_entry);
    found.push_back(it->second);
    hashes->push_back(hash);
  }
  return found;
}

void PagePool::Register(int32_t page, uint64_t hash, std::span<const int32_t> tokens) {
  Page& p = pages_[page];
  if (p.cached || by_hash_.count(hash)) return;
  p.cached = true;
  p.hash = hash;
  p.tokens.assign(tokens.begin(), tokens.end());
  by_hash_[hash] = page;
  if (events_ != nullptr) events_->Record(hash, true);
}

void PagePool::RegisterTail(int32_t page, uint64_t previous, std::span<const int32_t> tokens) {
  Page& p = pages_[page];
  if (p.cached || tokens.empty()) return;
  auto [first, last] = tails_.equal_range(previous);
  for (auto it = first; it != last; ++it) {
    const Page& kept = pages_[it->second];
    if (std::equal(kept.tokens.begin(), kept.tokens.end(), tokens.begin(), tokens.end())) return;
  }
  p.cached = true;
  p.tail = true;
  p.hash = previous;
  p.tokens.assign(tokens.begin(), tokens.end());
  tails_.emplace(previous, page);
}

std::pair<int32_t, int64_t> PagePool::MatchTail(uint64_t previous, std::span<const int32_t> tokens,
                                                int64_t max_rows) {
  int32_t best = -1;
  int64_t best_rows = 0;
  auto [first, last] = tails_.equal_range(previous);
  for (auto it = first; it != last; ++it) {
    const Page& p = pages_[it->second];
    const auto rows = static_cast<int64_t>(p.tokens.size());
    if (rows > max_rows || rows > static_cast<int64_t>(tokens.size()) || rows <= best_rows ||
        !std::equal(p.tokens.begin(), p.tokens.end(), tokens.begin()))
      continue;
    best = it->second;
    best_rows = rows;
  }
  if (best < 0) return {-1, 0};
  if (pages_[best].refs++ == 0) lru_.erase(pages_[best].lru_entry);
  return {best, best_rows};
}

}  // namespace sy
