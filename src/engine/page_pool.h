// The serving engine's view of the latent cache's pages: reference counts so that requests share
// the pages of a common prefix, and the prefix cache itself — every full page keyed by a hash
// chain over the token ids it and all earlier pages hold (the page's content is a function of
// exactly those tokens). Unreferenced cached pages stay until space is needed and are then
// evicted least recently used first. A lookup compares the stored token ids too, so a hash
// collision can never hand out the wrong rows.
#pragma once

#include <cstdint>
#include <list>
#include <span>
#include <unordered_map>
#include <utility>
#include <vector>

#include "engine/cache_events.h"
#include "model/latent_cache.h"

namespace sy {

class PagePool {
 public:
  explicit PagePool(LatentCache& cache);

  int64_t page_size() const { return cache_.page_size(); }
  int64_t total_pages() const { return cache_.total_pages(); }
  // Pages a new allocation can get: free, or cached and unreferenced (evictable).
  int64_t available_pages() const {
    return cache_.free_pages() + static_cast<int64_t>(lru_.size());
  }
  // Pages some request holds.
  int64_t used_pages() const { return total_pages() - available_pages(); }
  int64_t cached_pages() const { return static_cast<int64_t>(by_hash_.size()); }

  // A fresh page with one reference, or -1 when none is available.
  int32_t Allocate();
  // Drops one reference; a page nobody holds goes back (to the LRU if cached, else free).
  void Release(int32_t page);

  // The hash of a page given the previous page's hash (0 for the first) and its token ids.
  static uint64_t ChainHash(uint64_t previous, std::span<const int32_t> tokens);
  // The hash of page `index` of a sequence whose positions from `generated_from` on are its own
  // output: ChainHash for pages wholly inside the prompt, and one that also names
  // generated_from for the pages after. Where prompt and output rows are computed in different
  // attention forms (the default), a page holding output rows then serves only a sequence with
  // the same output there (its own recomputation, a resumed request), never one that has those
  // tokens as prompt and would compute them differently.
  static uint64_t PageHash(uint64_t previous, std::span<const int32_t> tokens, int64_t index,
                           int64_t generated_from);

  // Leading full pages of `tokens` found in the cache, each with a reference taken; at most
  // `max_pages`. hashes: the page hashes of those pages (for registering later pages).
  // generated_from: as for PageHash (INT64_MAX: the roles do not matter).
  std::vector<int32_t> Match(std::span<const int32_t> tokens, int64_t max_pages,
                             int64_t generated_from, std::vector<uint64_t>* hashes);
  // Records a now-full page under `hash` (no-op if that content is cached already).
  void Register(int32_t page, uint64_t hash, std::span<const int32_t> tokens);

  // Tails: the last, partly filled page of a sequence that is done with it, kept (evictable
  // like a cached page) so that a later sequence whose tokens after the same full pages begin
  // with these gets its rows by copying instead of recomputing them — a beam search's next step
  // extends each beam by one token. A tail is never shared: its rows are copied into the new
  // sequence's own page. `previous`: the hash of the full page before it (0: none). No-op where
  // the same tail is kept already.
  void RegisterTail(int32_t page, uint64_t previous, std::span<const int32_t> tokens);
  // The longest kept tail after `previous` whose tokens all begin `tokens` (at most `max_rows`
  // of them): its page, with a reference taken (Release it after copying), and its row count;
  // {-1, 0} when none does. Only a request that extends a tail takes it: one that merely shares
  // its first tokens (the BOS every prompt starts with) would save next to nothing.
  std::pair<int32_t, int64_t> MatchTail(uint64_t previous, std::span<const int32_t> tokens,
                                        int64_t max_rows);
  int64_t tail_pages() const { return static_cast<int64_t>(tails_.size()); }

  // Where pages entering and leaving the prefix cache are reported (none by default).
  void SetEventLog(CacheEventLog* log) { events_ = log; }

 private:
  struct Page {
    int32_t refs = 0;
    bool cached = false;
    bool tail = false;  // cached as a tail (under tails_, hash = the previous page's)
    uint64_t hash = 0;
    std::vector<int32_t> tokens;  // the page's token ids, when cached
    std::list<int32_t>::iterator lru_entry;
  };
  void Evict(int32_t page);

  LatentCache& cache_;
  std::vector<Page> pages_;
  std::unordered_map<uint64_t, int32_t> by_hash_;
  std::unordered_multimap<uint64_t, int32_t> tails_;  // previous page's hash → tail pages
  std::list<int32_t> lru_;  // unreferenced cached pages, least recently used first
  CacheEventLog* events_ = nullptr;
};

}  // namespace sy
