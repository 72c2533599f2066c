#include "tensor/packed_matrix.h"

#include <cstdlib>
#include <cstring>

#include <sys/mman.h>

#include "base/thread_pool.h"

namespace sy {

PackedMatrix ColumnRange(const PackedMatrix& m, int64_t begin, int64_t end) {
  PackedMatrix view = m;
  view.panel_stride = m.panel_stride ? m.panel_stride : m.cols;
  view.cols = end - begin;
  view.data = std::shared_ptr<uint8_t>(
      m.data, m.data.get() + static_cast<size_t>(begin * kPanelRows) * m.ElementBytes());
  if (m.dtype == DType::kF8E4M3) view.scale_col_offset = m.scale_col_offset + begin / m.block_cols;
  return view;
}

bool CanPack(const Matrix& m) {
  switch (m.dtype) {
    case DType::kF32:
    case DType::kBF16:
    case DType::kF16:
      return !m.empty();
    case DType::kF8E4M3:
      return !m.empty() && m.first_row % m.block_rows == 0 && m.block_rows % kPanelRows == 0;
    default:
      return false;
  }
}

std::shared_ptr<const PackedMatrix> Pack(const Matrix& m) {
  auto packed = std::make_shared<PackedMatrix>();
  PackedMatrix& p = *packed;
  p.dtype = m.dtype == DType::kF16 ? DType::kF32 : m.dtype;
  p.rows = m.rows;
  p.cols = m.cols;
  p.panels = (m.rows + kPanelRows - 1) / kPanelRows;
  const size_t bytes = p.Bytes();
  // 2 MiB alignment and huge pages where the kernel allows: a panel stream then crosses a TLB
  // entry every 2 MiB instead of every 4 KiB.
  constexpr size_t kHuge = 2u << 20;
  void* memory = std::aligned_alloc(kHuge, (bytes + kHuge - 1) / kHuge * kHuge);
  ::madvise(memory, (bytes + kHuge - 1) / kHuge * kHuge, MADV_HUGEPAGE);
  std::memset(memory, 0, bytes);
  p.data =
      std::shared_ptr<uint8_t>(static_cast<uint8_t*>(memory), [](uint8_t* ptr) { std::free(ptr); });
  if (m.dtype == DType::kF8E4M3) {
    p.block_rows = m.block_rows;
    p.block_cols = m.block_cols;
    p.scale_cols = m.scale_cols;
    const int64_t row_blocks = (m.rows + m.block_rows - 1) / m.block_rows;
    const float* first = m.block_scales + (m.first_row / m.block_rows) * m.scale_cols;
    p.scales.assign(first, first + row_blocks * m.scale_cols);
  }
  const size_t element = p.ElementBytes();
  ThreadPool::Global().ParallelFor(static_cast<size_t>(p.panels), [&](size_t begin, size_t end) {
    std::vector<float> row(static_cast<size_t>(m.cols));
    for (size_t panel = begin; panel < end; ++panel) {
      uint8_t* target = p.data.get() + panel * static_cast<size_t>(m.cols * kPanelRows) * element;
      for (int64_t r = 0; r < kPanelRows; ++r) {
        const int64_t source_row = static_cast<int64_t>(panel) * kPanelRows + r;
        if (source_row >= m.rows) break;
        const uint8_t* source = m.data + static_cast<size_t>(source_row) * m.RowBytes();
        if (m.dtype == DType::kF16) {
          m.DecodeRow(source_row, row.data());
          for (int64_t c = 0; c < m.cols; ++c)
            std::memcpy(target + (c * kPanelRows + r) * element, &row[c], element);
        } else {
          for (int64_t c = 0; c < m.cols; ++c)
            std::memcpy(target + (c * kPanelRows + r) * element, source + c * element, element);
        }
      }
    }
  });
  return packed;
}

}  // namespace sy
