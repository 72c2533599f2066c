#include "model/latent_cache.h"

#include <cstring>
#include <vector>

#include "kernels/cpu/latent_row.h"
#include "tensor/packed_matrix.h"

namespace sy {

LatentCache::LatentCache(int64_t layers, int64_t row_width, int64_t page_size, int64_t pages,
                         DType dtype, int64_t latent)
    : layers_(layers),
      page_size_(page_size),
      pages_(pages),
      latent_(latent),
      layout_(kernels::LatentRowLayout::Of(dtype, row_width, latent)) {
  const size_t layer_bytes = static_cast<size_t>(pages * page_size * layout_.row_bytes);
  // Huge pages from 2 MiB up (AllocatePanels): attention streams a long context's rows, and
  // through 4 KiB pages that is a page walk every 4 KiB. Touched now, as a vector's zeros were,
  // so resident memory is the cache's size from the start.
  for (int64_t l = 0; l < layers; ++l) {
    storage_.push_back(AllocatePanels(layer_bytes));
    std::memset(storage_.back().get(), 0, layer_bytes);
  }
  for (int64_t page = pages - 1; page >= 0; --page)
    free_.push_back(static_cast<int32_t>(page));
}

Status LatentCache::Reserve(SequenceCache& sequence, int64_t length) {
  const int64_t needed = (length + page_size_ - 1) / page_size_;
  const int64_t missing = needed - static_cast<int64_t>(sequence.pages.size());
  if (missing > free_pages())
    return Status::Errorf("latent KV cache is full: {} more pages needed, {} free of {}", missing,
                          free_pages(), pages_);
  for (int64_t i = 0; i < missing; ++i) {
    sequence.pages.push_back(free_.back());
    free_.pop_back();
  }
  if (length > sequence.length) sequence.length = length;
  return Status::Ok();
}

void LatentCache::Truncate(SequenceCache& sequence, int64_t length) {
  const size_t needed = static_cast<size_t>((length + page_size_ - 1) / page_size_);
  while (sequence.pages.size() > needed) {
    free_.push_back(sequence.pages.back());
    sequence.pages.pop_back();
  }
  if (length < sequence.length) sequence.length = length;
}

uint8_t* LatentCache::RowAddress(int64_t layer, const SequenceCache& sequence,
                                 int64_t position) const {
  const int64_t page = sequence.pages[static_cast<size_t>(position / page_size_)];
  const int64_t slot = page * page_size_ + position % page_size_;
  return const_cast<uint8_t*>(storage_[static_cast<size_t>(layer)].get()) +
         static_cast<size_t>(slot * layout_.row_bytes);
}

void LatentCache::CopyPageRows(int32_t from, int32_t to, int64_t rows) {
  const size_t page_bytes = static_cast<size_t>(page_size_ * row_bytes());
  for (int64_t l = 0; l < layers_; ++l) {
    uint8_t* base = storage_[static_cast<size_t>(l)].get();
    std::memcpy(base + static_cast<size_t>(to) * page_bytes,
                base + static_cast<size_t>(from) * page_bytes,
                static_cast<size_t>(rows * row_bytes()));
  }
}

void LatentCache::Write(int64_t layer, const SequenceCache& sequence, int64_t position,
                        const float* row) {
  if (rounding_) {
    thread_local std::vector<uint8_t> encoded;
    thread_local std::vector<float> rounded;
    encoded.resize(static_cast<size_t>(rounding_->row_bytes));
    rounded.resize(static_cast<size_t>(layout_.width));
    kernels::EncodeLatentRow(*rounding_, row, encoded.data());
    kernels::DecodeLatentRow(*rounding_, encoded.data(), 0, layout_.width, rounded.data());
    row = rounded.data();
  }
  kernels::EncodeLatentRow(layout_, row, RowAddress(layer, sequence, position));
}

void LatentCache::RoundRowsAs(DType dtype) {
  rounding_ = kernels::LatentRowLayout::Of(dtype, layout_.width, latent_);
}

void LatentCache::CopyRows(int64_t layer, const SequenceCache& sequence, int64_t first,
                           int64_t count, uint8_t* out) const {
  const size_t bytes = static_cast<size_t>(row_bytes());
  for (int64_t r = 0; r < count; ++r)
    std::memcpy(out + r * bytes, RowAddress(layer, sequence, first + r), bytes);
}

void LatentCache::WriteRows(int64_t layer, const SequenceCache& sequence, int64_t first,
                            int64_t count, const uint8_t* rows) {
  const size_t bytes = static_cast<size_t>(row_bytes());
  for (int64_t r = 0; r < count; ++r)
    std::memcpy(RowAddress(layer, sequence, first + r), rows + r * bytes, bytes);
}

void LatentCache::GatherColumns(int64_t layer, const SequenceCache& sequence, int64_t count,
                                int64_t column, int64_t width, float* out) const {
  for (int64_t position = 0; position < count; ++position)
    kernels::DecodeLatentRow(layout_, RowAddress(layer, sequence, position), column, width,
                             out + position * width);
}

}  // namespace sy
