#include "tensor/packed_matrix.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <optional>
#include <unordered_map>

#include <sys/mman.h>

#include "base/thread_pool.h"

namespace sy {

namespace {

constexpr size_t kHugePage = 2u << 20, kSmallPage = 4096;

// `bytes` rounded up to 4 KiB pages, mapped on a 2 MiB boundary and advised into huge pages
// (anonymous memory: already zero). Only the length is rounded to 4 KiB: the tail past the last
// whole huge page stays in small pages. Sets *mapped to the length to munmap.
uint8_t* MapHugeRaw(size_t bytes, size_t* mapped) {
  const size_t size = (bytes + kSmallPage - 1) / kSmallPage * kSmallPage;
  void* mapping =
      ::mmap(nullptr, size + kHugePage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (mapping == MAP_FAILED) throw std::bad_alloc();
  const uintptr_t start = reinterpret_cast<uintptr_t>(mapping);
  const uintptr_t aligned = (start + kHugePage - 1) / kHugePage * kHugePage;
  if (aligned > start) ::munmap(mapping, aligned - start);
  const uintptr_t tail = aligned + size, end = start + size + kHugePage;
  if (end > tail) ::munmap(reinterpret_cast<void*>(tail), end - tail);
  ::madvise(reinterpret_cast<void*>(aligned), size, MADV_HUGEPAGE);
  *mapped = size;
  return reinterpret_cast<uint8_t*>(aligned);
}

// One source row into its place in a [cols][kPanelRows] panel. Typed, so each element is one
// load and one store: a memcpy of a run-time size per element made loading a model spend most of
// its time in memmove calls. The source is read through memcpy because a checkpoint's tensors
// need not be aligned to their element (safetensors offsets, a GGUF with alignment 1).
template <typename T>
void ScatterPanelRow(const uint8_t* source, int64_t cols, int64_t row_in_panel, T* panel) {
  T* out = panel + row_in_panel;
  for (int64_t c = 0; c < cols; ++c)
    std::memcpy(&out[c * kPanelRows], source + c * sizeof(T), sizeof(T));
}

std::shared_ptr<uint8_t> MapHuge(size_t bytes) {
  size_t size = 0;
  uint8_t* base = MapHugeRaw(bytes, &size);
  return std::shared_ptr<uint8_t>(base, [size](uint8_t* ptr) { ::munmap(ptr, size); });
}

// One chunk of PanelArenaScope: `mapped` bytes from `base`, in huge pages. Its tail is given
// back once the load is done with it, so it is unmapped by its final length: a full-length
// munmap would take whatever the kernel mapped into the returned tail since.
struct ArenaChunk {
  uint8_t* base = nullptr;
  size_t mapped = 0;
  ArenaChunk() = default;
  ArenaChunk(const ArenaChunk&) = delete;
  ArenaChunk& operator=(const ArenaChunk&) = delete;
  ~ArenaChunk() {
    if (mapped > 0) ::munmap(base, mapped);
  }
};

// The chunks of PanelArenaScope. Matrices are bump-allocated; each holds its chunk through an
// aliasing shared_ptr, so the chunk lives while any of them does.
struct PanelArena {
  static constexpr size_t kChunk = 32 * kHugePage;
  std::mutex mutex;
  int scopes = 0;
  std::shared_ptr<ArenaChunk> chunk;
  size_t used = 0;
  // Scale vectors taken from a chunk, each holding it (PanelAllocator has no room for a handle).
  std::unordered_map<void*, std::shared_ptr<ArenaChunk>> scales;

  // `size` (a multiple of 64) bytes from the current chunk; the caller holds the mutex.
  uint8_t* Take(size_t size) {
    if (!chunk || used + size > kChunk) NewChunk();
    uint8_t* piece = chunk->base + used;
    used += size;
    return piece;
  }

  void NewChunk() {
    ReleaseTail();
    chunk = std::make_shared<ArenaChunk>();
    chunk->base = MapHugeRaw(kChunk, &chunk->mapped);
  }

  // The chunk's whole huge pages past `used` were never touched: give them back.
  void ReleaseTail() {
    if (!chunk) return;
    const size_t keep = (used + kHugePage - 1) / kHugePage * kHugePage;
    if (keep < chunk->mapped) {
      ::munmap(chunk->base + keep, chunk->mapped - keep);
      chunk->mapped = keep;
    }
    chunk.reset();
    used = 0;
  }
};

// Never destroyed: a matrix may outlive every other static (a model held by one).
PanelArena& Arena() {
  static PanelArena* arena = new PanelArena;
  return *arena;
}

}  // namespace

PanelArenaScope::PanelArenaScope() {
  PanelArena& arena = Arena();
  std::lock_guard<std::mutex> lock(arena.mutex);
  ++arena.scopes;
}

PanelArenaScope::~PanelArenaScope() {
  PanelArena& arena = Arena();
  std::lock_guard<std::mutex> lock(arena.mutex);
  if (--arena.scopes == 0) arena.ReleaseTail();
}

std::shared_ptr<uint8_t> AllocatePanels(size_t bytes) {
  if (bytes >= kHugePage) return MapHuge(bytes);
  const size_t size = std::max<size_t>(64, (bytes + 63) / 64 * 64);
  {
    PanelArena& arena = Arena();
    std::lock_guard<std::mutex> lock(arena.mutex);
    if (arena.scopes > 0) {
      uint8_t* piece = arena.Take(size);
      return std::shared_ptr<uint8_t>(arena.chunk, piece);  // fresh mapping: already zero
    }
  }
  // Outside a load: the heap. Rounding each small matrix to a huge page of its own would hold a
  // model at twice its size.
  void* memory = std::aligned_alloc(64, size);
  if (memory == nullptr) throw std::bad_alloc();
  std::memset(memory, 0, bytes);
  return std::shared_ptr<uint8_t>(static_cast<uint8_t*>(memory),
                                  [](uint8_t* ptr) { std::free(ptr); });
}

void* AllocatePanelScales(size_t bytes) {
  const size_t size = std::max<size_t>(64, (bytes + 63) / 64 * 64);
  PanelArena& arena = Arena();
  {
    std::lock_guard<std::mutex> lock(arena.mutex);
    if (arena.scopes > 0 && size < kHugePage) {
      uint8_t* piece = arena.Take(size);
      arena.scales.emplace(piece, arena.chunk);
      return piece;
    }
  }
  return ::operator new(size, std::align_val_t(64));
}

void FreePanelScales(void* memory) {
  if (memory == nullptr) return;
  PanelArena& arena = Arena();
  {
    std::lock_guard<std::mutex> lock(arena.mutex);
    auto it = arena.scales.find(memory);
    if (it != arena.scales.end()) {
      arena.scales.erase(it);  // the chunk goes with its last piece
      return;
    }
  }
  ::operator delete(memory, std::align_val_t(64));
}

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
    case DType::kGgml:
      return !m.empty();
    case DType::kF8E4M3:
      return !m.empty() && m.first_row % m.block_rows == 0 && m.block_rows % kPanelRows == 0;
    default:
      return false;
  }
}

bool& GlobalBf16Pairs() {
  static bool pairs = false;
  return pairs;
}

bool& GlobalBf16DotPairs() {
  static bool pairs = false;
  return pairs;
}

bool Bf16PairsWanted(DType dtype, int64_t cols) {
  return (GlobalBf16Pairs() || GlobalBf16DotPairs()) && dtype == DType::kBF16 && cols > 0 &&
         cols % 32 == 0;
}

void SetBf16Pairs(PackedMatrix& p, bool pairs) {
  if (p.bf16_pairs == pairs || p.dtype != DType::kBF16) return;
  const int64_t stride = p.panel_stride ? p.panel_stride : p.cols;
  std::vector<uint16_t> panel(static_cast<size_t>(stride * kPanelRows));
  for (int64_t q = 0; q < p.panels; ++q) {
    auto* target = reinterpret_cast<uint16_t*>(p.data.get()) + q * stride * kPanelRows;
    std::copy_n(target, panel.size(), panel.begin());
    for (int64_t c = 0; c < stride; ++c)
      for (int64_t r = 0; r < kPanelRows; ++r) {
        const int64_t columns = c * kPanelRows + r, paired = Bf16PairIndex(r, c);
        if (pairs) {
          target[paired] = panel[static_cast<size_t>(columns)];
        } else {
          target[columns] = panel[static_cast<size_t>(paired)];
        }
      }
  }
  p.bf16_pairs = pairs;
}

std::shared_ptr<const PackedMatrix> Pack(const Matrix& m, bool allow_pairs) {
  auto packed = std::make_shared<PackedMatrix>();
  PackedMatrix& p = *packed;
  const bool decode = m.dtype == DType::kF16 || m.dtype == DType::kGgml;
  p.dtype = decode ? DType::kF32 : m.dtype;
  p.rows = m.rows;
  p.cols = m.cols;
  p.panels = (m.rows + kPanelRows - 1) / kPanelRows;
  const size_t bytes = p.Bytes();
  p.data = AllocatePanels(bytes);
  if (m.dtype == DType::kF8E4M3) {
    p.block_rows = m.block_rows;
    p.block_cols = m.block_cols;
    p.scale_cols = m.scale_cols;
    const int64_t row_blocks = (m.rows + m.block_rows - 1) / m.block_rows;
    const float* first = m.block_scales + (m.first_row / m.block_rows) * m.scale_cols;
    p.scales.assign(first, first + row_blocks * m.scale_cols);
  }
  p.bf16_pairs = allow_pairs && Bf16PairsWanted(p.dtype, p.cols);
  const size_t element = p.ElementBytes();
  ThreadPool::Global().ParallelFor(static_cast<size_t>(p.panels), [&](size_t begin, size_t end) {
    std::vector<float> row(static_cast<size_t>(m.cols));
    for (size_t panel = begin; panel < end; ++panel) {
      uint8_t* target = p.data.get() + panel * static_cast<size_t>(m.cols * kPanelRows) * element;
      for (int64_t r = 0; r < kPanelRows; ++r) {
        const int64_t source_row = static_cast<int64_t>(panel) * kPanelRows + r;
        if (source_row >= m.rows) break;
        if (decode) {
          m.DecodeRow(source_row, row.data());
          ScatterPanelRow(reinterpret_cast<const uint8_t*>(row.data()), m.cols, r,
                          reinterpret_cast<float*>(target));
          continue;
        }
        const uint8_t* source = m.data + static_cast<size_t>(source_row) * m.RowBytes();
        switch (element) {
          case 1:
            ScatterPanelRow(source, m.cols, r, target);
            break;
          case 2:
            if (p.bf16_pairs) {
              auto* out = reinterpret_cast<uint16_t*>(target);
              for (int64_t c = 0; c < m.cols; ++c)
                std::memcpy(&out[Bf16PairIndex(r, c)], source + 2 * c, 2);
            } else {
              ScatterPanelRow(source, m.cols, r, reinterpret_cast<uint16_t*>(target));
            }
            break;
          default:
            ScatterPanelRow(source, m.cols, r, reinterpret_cast<uint32_t*>(target));
        }
      }
    }
  });
  return packed;
}

WeightPacking& GlobalWeightPacking() {
  static WeightPacking packing = WeightPacking::kExact;
  return packing;
}

bool CanPackInt8(const Matrix& m) {
  return CanPack(m) && (m.dtype == DType::kF8E4M3 || m.dtype == DType::kBF16) &&
         m.cols % kInt8QuadCols == 0;
}

std::shared_ptr<const PackedMatrix> PackInt8(const Matrix& m) {
  auto packed = std::make_shared<PackedMatrix>();
  PackedMatrix& p = *packed;
  p.dtype = DType::kI8;
  p.rows = m.rows;
  p.cols = m.cols;
  p.panels = (m.rows + kPanelRows - 1) / kPanelRows;
  p.groups = (m.cols + kInt8GroupCols - 1) / kInt8GroupCols;
  p.block_cols = kInt8GroupCols;
  p.data = AllocatePanels(p.Bytes());
  const size_t per_panel = static_cast<size_t>(p.groups * kPanelRows);
  p.row_scales.assign(static_cast<size_t>(p.panels) * per_panel, 0.0f);
  p.row_offsets.assign(static_cast<size_t>(p.panels) * per_panel, 0);
  ThreadPool::Global().ParallelFor(static_cast<size_t>(p.panels), [&](size_t begin, size_t end) {
    std::vector<float> row(static_cast<size_t>(m.cols));
    for (size_t panel = begin; panel < end; ++panel) {
      auto* target = reinterpret_cast<int8_t*>(p.data.get()) +
                     panel * static_cast<size_t>(m.cols * kPanelRows);
      for (int64_t r = 0; r < kPanelRows; ++r) {
        const int64_t source_row = static_cast<int64_t>(panel) * kPanelRows + r;
        if (source_row >= m.rows) break;
        m.DecodeRow(source_row, row.data());
        for (int64_t g = 0; g < p.groups; ++g) {
          const int64_t c0 = g * kInt8GroupCols, c1 = std::min(m.cols, c0 + kInt8GroupCols);
          float largest = 0;
          bool finite = true;
          for (int64_t c = c0; c < c1; ++c) {
            largest = std::max(largest, std::fabs(row[c]));
            finite = finite && std::isfinite(row[c]);
          }
          const size_t at = panel * per_panel + static_cast<size_t>(g * kPanelRows + r);
          if (!finite) {  // codes stay 0; the NaN scale shows in every output the row feeds
            p.row_scales[at] = NAN;
            continue;
          }
          const float inverse = largest > 0 ? kInt8WeightMax / largest : 0.0f;
          int32_t sum = 0;
          for (int64_t c = c0; c < c1; ++c) {
            const int q = static_cast<int>(std::clamp(
                RoundEven(row[c] * inverse), -1.0f * kInt8WeightMax, 1.0f * kInt8WeightMax));
            target[((c / kInt8QuadCols) * kPanelRows + r) * kInt8QuadCols + c % kInt8QuadCols] =
                static_cast<int8_t>(q);
            sum += q;
          }
          p.row_scales[at] = largest / kInt8WeightMax;
          p.row_offsets[at] = 128 * sum;
        }
      }
    }
  });
  return packed;
}

bool CanPackGgml(const Matrix& m) {
  return m.dtype == DType::kGgml && !m.empty() && GgmlIntegerForm(m.ggml_type).has_value();
}

bool SetGgmlPanelLayout(GgmlType type, PackedMatrix& p) {
  const std::optional<GgmlIntegerLayout> layout = GgmlIntegerForm(type);
  const std::optional<GgmlTypeTraits> traits = GgmlTypeInfo(type);
  if (!layout || !traits) return false;
  p.ggml_type = type;
  p.code_bits = layout->code_bits <= 4 ? 4 : layout->code_bits <= 6 ? 6 : 8;
  p.sub_cols = layout->sub_size;
  p.super_cols = traits->block_size;
  p.shared_d = layout->shared_d;
  p.unit_scales = layout->unit_scales;
  p.ggml_offset = layout->offset;
  return true;
}

std::shared_ptr<const PackedMatrix> PackGgml(const Matrix& m) {
  const GgmlTypeTraits traits = *GgmlTypeInfo(m.ggml_type);
  auto packed = std::make_shared<PackedMatrix>();
  PackedMatrix& p = *packed;
  p.dtype = DType::kGgml;
  SetGgmlPanelLayout(m.ggml_type, p);  // CanPackGgml held
  p.rows = m.rows;
  p.cols = m.cols;
  p.panels = (m.rows + kPanelRows - 1) / kPanelRows;
  p.data = AllocatePanels(p.Bytes());
  const int64_t subs = m.cols / p.sub_cols, supers = m.cols / p.super_cols;
  const int64_t subs_per_block = p.super_cols / p.sub_cols;
  if (!p.unit_scales) {
    p.sub_scales.assign(static_cast<size_t>(p.panels * subs * kPanelRows), 0);
    if (!p.shared_d) p.sub_mins.assign(p.sub_scales.size(), 0);
  }
  p.super_d.assign(static_cast<size_t>(p.panels * supers * kPanelRows), 0);
  if (!p.shared_d) p.super_dmin.assign(p.super_d.size(), 0);
  const size_t panel_bytes = static_cast<size_t>(m.cols) * p.PanelColumnBytes();
  // Each row's blocks decoded into one row of codes, then written to the panel in whole units
  // (a byte per 4-, 6- or 8-bit code's low part, a byte of top bits per four 6-bit codes).
  ThreadPool::Global().ParallelFor(static_cast<size_t>(p.panels), [&](size_t begin, size_t end) {
    GgmlIntegerBlock block;
    std::vector<uint8_t> q(static_cast<size_t>(m.cols));
    for (size_t panel = begin; panel < end; ++panel) {
      uint8_t* target = p.data.get() + panel * panel_bytes;
      for (int64_t r = 0; r < kPanelRows; ++r) {
        const int64_t source_row = static_cast<int64_t>(panel) * kPanelRows + r;
        if (source_row >= m.rows) break;  // padding rows: codes, scales and d stay 0
        const uint8_t* source = m.data + static_cast<size_t>(source_row) * m.RowBytes();
        for (int64_t b = 0; b < supers; ++b) {
          DecodeGgmlIntegerBlock(m.ggml_type, source + b * traits.block_bytes, &block);
          const size_t at = (panel * supers + b) * kPanelRows + r;
          p.super_d[at] = block.d;
          if (!p.shared_d) p.super_dmin[at] = block.dmin;
          for (int64_t j = 0; j < subs_per_block && !p.unit_scales; ++j) {
            const size_t sub = (panel * subs + b * subs_per_block + j) * kPanelRows + r;
            p.sub_scales[sub] = block.sc[j];
            if (!p.shared_d) p.sub_mins[sub] = static_cast<int8_t>(block.mn[j]);
          }
          std::memcpy(q.data() + b * p.super_cols, block.q, static_cast<size_t>(p.super_cols));
        }
        if (p.code_bits == 8) {
          for (int64_t c = 0; c < m.cols; c += 4)
            std::memcpy(target + ((c / 4) * kPanelRows + r) * 4, q.data() + c, 4);
          continue;
        }
        for (int64_t k = 0; k < m.cols / 8; ++k) {
          uint8_t* out = target + GgmlNibbleUnitOffset(p, k) + r * 4;
          const uint8_t* in = q.data() + 8 * k;
          for (int b = 0; b < 4; ++b)
            out[b] = static_cast<uint8_t>((in[b] & 15) | (in[b + 4] & 15) << 4);
        }
        if (p.code_bits == 6)
          for (int64_t k = 0; k < m.cols / 16; ++k) {
            uint8_t* out = target + GgmlTopBitsOffset(k) + r * 4;
            const uint8_t* in = q.data() + 16 * k;
            for (int b = 0; b < 4; ++b)
              out[b] = static_cast<uint8_t>((in[b] >> 4) | (in[b + 4] >> 4) << 2 |
                                            (in[b + 8] >> 4) << 4 | (in[b + 12] >> 4) << 6);
          }
      }
    }
  });
  return packed;
}

std::shared_ptr<const PackedMatrix> PackForF32Products(const Matrix& m) {
  return Pack(m, /*allow_pairs=*/GlobalBf16Pairs());
}

std::shared_ptr<const PackedMatrix> PackForLoad(const Matrix& m) {
  if (CanPackGgml(m)) return PackGgml(m);
  if (GlobalWeightPacking() == WeightPacking::kInt8 && CanPackInt8(m)) return PackInt8(m);
  return Pack(m);
}

}  // namespace sy
