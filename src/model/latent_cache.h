// The paged latent KV cache of absorbed MLA. Per token and layer it holds one row of
// [c (kv_lora_rank, normalized) | k_pe (qk_rope_head_dim, rotated)] — 576 values for
// DeepSeek-V3, 70,272 bytes per token over 61 layers in bf16, 39,284 in fp8. Rows live in
// fixed-size pages shared by all layers; a sequence owns a list of pages, so sequences of any
// length share one pool and continuous batching needs no copying.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "base/status.h"
#include "kernels/cpu/mla_decode.h"
#include "tensor/dtype.h"

namespace sy {

// One sequence's view of the cache: its pages, in position order, and how many rows are filled.
struct SequenceCache {
  std::vector<int32_t> pages;
  int64_t length = 0;
  // Where the sequence's own output starts: positions from here on were generated (decode
  // steps), those before it are its prompt. Attention picks its form by this role and the
  // position (model/mla.h), never by how the tokens were batched or chunked, so a recomputed or
  // partly cached sequence gets the rows it had. -1: unknown, a slice of at most
  // kAbsorbedMaxQueries new tokens is taken for decode steps and a longer one for prompt.
  int64_t prompt_end = -1;
};

class LatentCache {
 public:
  // dtype: kBF16 (as deployed), kF32 (exact, for conformance checks) or kF8E4M3 (the first
  // `latent` columns of each row as scaled e4m3 codes, the rest bf16: kernels/cpu/latent_row.h).
  LatentCache(int64_t layers, int64_t row_width, int64_t page_size, int64_t pages, DType dtype,
              int64_t latent = 0);
  LatentCache(LatentCache&&) = default;
  LatentCache& operator=(LatentCache&&) = default;
  LatentCache(const LatentCache&) = delete;
  LatentCache& operator=(const LatentCache&) = delete;

  int64_t layers() const { return layers_; }
  int64_t page_size() const { return page_size_; }
  int64_t row_width() const { return layout_.width; }
  int64_t free_pages() const { return static_cast<int64_t>(free_.size()); }
  DType dtype() const { return layout_.dtype; }
  const kernels::LatentRowLayout& layout() const { return layout_; }
  // For conformance checks: rows written from now on hold exactly the values a `dtype` cache's
  // would (an f32 cache rounding as an fp8 one does), so the two must give the same answers.
  void RoundRowsAs(DType dtype);
  // Bytes one token occupies over all layers.
  int64_t BytesPerToken() const { return layers_ * layout_.row_bytes; }

  // Makes room for `length` rows in total; fails without side effects if the pool is full.
  Status Reserve(SequenceCache& sequence, int64_t length);
  // Drops rows from `length` on (speculative rollback), returning whole pages to the pool.
  void Truncate(SequenceCache& sequence, int64_t length);
  void Release(SequenceCache& sequence) { Truncate(sequence, 0); }

  // Page-level use for an owner that shares pages between sequences (the serving engine's
  // prefix cache): it takes pages itself and hands them back when no sequence uses them.
  // TakePage returns -1 when the pool is empty.
  int32_t TakePage() {
    if (free_.empty()) return -1;
    const int32_t page = free_.back();
    free_.pop_back();
    return page;
  }
  void ReturnPage(int32_t page) { free_.push_back(page); }
  int64_t total_pages() const { return pages_; }

  // Stores the row for `position` (which must be reserved) in `layer`.
  void Write(int64_t layer, const SequenceCache& sequence, int64_t position, const float* row);
  // The sequence's rows of `layer` as the attention kernels read them, in place.
  kernels::LatentPages Pages(int64_t layer, const SequenceCache& sequence) const {
    return {storage_[static_cast<size_t>(layer)].get(), layout_, page_size_, sequence.pages.data()};
  }
  // Bytes of one row of one layer.
  int64_t row_bytes() const { return layout_.row_bytes; }
  // Rows [first, first + count) of `layer` as stored (the cache's dtype), to and from a buffer
  // of count · row_bytes(): how a prefill instance hands rows to a decode instance.
  void CopyRows(int64_t layer, const SequenceCache& sequence, int64_t first, int64_t count,
                uint8_t* out) const;
  void WriteRows(int64_t layer, const SequenceCache& sequence, int64_t first, int64_t count,
                 const uint8_t* rows);
  // Copies rows [0, count) of `layer` into out[count, row_width] as f32.
  void Gather(int64_t layer, const SequenceCache& sequence, int64_t count, float* out) const {
    GatherColumns(layer, sequence, count, 0, layout_.width, out);
  }
  // Columns [column, column + width) of rows [0, count) of `layer` into out[count, width] as
  // f32: the MLA latents (from column 0), or a DSA model's indexer keys (after them).
  void GatherColumns(int64_t layer, const SequenceCache& sequence, int64_t count, int64_t column,
                     int64_t width, float* out) const;
  // The first `rows` rows of page `from` copied into page `to`, in every layer (the engine's
  // reuse of a kept partial page).
  void CopyPageRows(int32_t from, int32_t to, int64_t rows);

 private:
  uint8_t* RowAddress(int64_t layer, const SequenceCache& sequence, int64_t position) const;

  int64_t layers_, page_size_, pages_;
  int64_t latent_;  // the latent columns (what an fp8 layout quantizes)
  kernels::LatentRowLayout layout_;
  std::optional<kernels::LatentRowLayout> rounding_;  // RoundRowsAs
  // [layer][page · page_size · row_width], each layer's own: a copy of the cache would share
  // them, hence move-only.
  std::vector<std::shared_ptr<uint8_t>> storage_;
  std::vector<int32_t> free_;
};

}  // namespace sy
