// The AMX kernels of amx_kernels.h, written once against a Tiles type (amx_tiles.h's interface;
// the bf16 products also take a ConvertPairs function: a panel's columns as weight rows). Included
// only by amx_emulated.cc and amx_hardware.cc, each after defining SY_AMX_KERNEL: the target
// attribute its kernels compile for (empty for the emulator). Per function, not per file: the
// library templates they instantiate (std::vector's) stay compiled for every CPU, where a file
// compiled for AMX could hand the linker an AVX-512 copy of them for the whole program.
// Everything here has internal linkage, so the two copies never merge either.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "base/allocator.h"
#include "kernels/cpu/amx_kernels.h"
#include "kernels/cpu/amx_tiles.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/ggml_gemm.h"
#include "kernels/cpu/mla_decode.h"
#include "kernels/cpu/row_tiles.h"
#include "kernels/cpu/weighted_sum.h"
#include "tensor/dtype.h"
#include "tensor/ggml_quants.h"
#include "tensor/packed_matrix.h"

namespace sy::kernels {
namespace {

// Tile roles. Rows split into near-equal tiles of at most 16 (row_tiles.h), so a product has at
// most two tile heights: C and A tiles for each, and one weight tile B. A multiply reads 64 bytes
// of each A row (64 int8 columns or 32 bf16; a GGML sub-block's 16 or 32) against a B row per 4
// of those bytes (quads of int8 columns, pairs of bf16 ones), 64 bytes each: 16 outputs of a
// panel.
constexpr int kC0 = 0, kA0 = 1, kB = 2, kC1 = 3, kA1 = 4;
constexpr int kTileBytes = kAmxMaxColsBytes;
constexpr int64_t kTileCols8 = 64;   // int8 columns per tile multiply
constexpr int64_t kTileCols16 = 32;  // bf16 columns per tile multiply
static_assert(kPanelRows * 4 == kTileBytes, "a panel's 16 outputs are one tile row of f32/int32");

struct RowTile {
  int64_t row, count;
};

// A panel's outputs from the kernels' [m][16] state into y [m][w.rows] (a last, partial panel:
// its valid rows only).
SY_AMX_KERNEL inline void WritePanelOutputs(const float* state, int64_t m, const PackedMatrix& w,
                                            int64_t panel, float* y) {
  const int64_t valid = std::min(kPanelRows, w.rows - panel * kPanelRows);
  for (int64_t r = 0; r < m; ++r) {
    float* out = y + r * w.rows + panel * kPanelRows;
    if (valid == kPanelRows) {  // a fixed-size copy: one cache line, not a call to memmove
      std::memcpy(out, state + r * kPanelRows, kPanelRows * sizeof(float));
    } else {
      std::copy_n(state + r * kPanelRows, valid, out);
    }
  }
}

// Splits m rows into tiles and configures the tiles for their heights; returns the first
// height (tiles of another height use kC1 and kA1).
template <class Tiles>
SY_AMX_KERNEL int64_t ConfigureRowTiles(int64_t m, std::vector<RowTile>& tiles,
                                        int a_bytes = kTileBytes) {
  tiles.clear();
  ForEachRowTile(m, kAmxMaxRows, [&](int64_t, int64_t row, int64_t count) {
    tiles.push_back({row, count});
  });
  const int64_t first = tiles.front().count;
  TileConfig config;
  config.Set(kC0, static_cast<int>(first), kTileBytes);
  config.Set(kA0, static_cast<int>(first), a_bytes);
  config.Set(kB, a_bytes / 4, kTileBytes);
  for (const RowTile& t : tiles) {
    if (t.count != first) {
      config.Set(kC1, static_cast<int>(t.count), kTileBytes);
      config.Set(kA1, static_cast<int>(t.count), a_bytes);
    }
  }
  Tiles::Configure(config);
  return first;
}

// The tile multiplies the kernels use: unsigned × signed bytes (TDPBUSD), signed × unsigned
// (TDPBSUD), bf16 pairs (TDPBF16PS).
enum class TileDot : uint8_t { kUnsignedSigned, kSignedUnsigned, kBf16 };

template <class Tiles, TileDot kDot, int C, int A>
SY_AMX_KERNEL inline void TileSums(const void* a, int64_t a_stride, const void* b, int64_t steps,
                                   void* out) {
  Tiles::template Zero<C>();
  for (int64_t s = 0; s < steps; ++s) {
    Tiles::template Load<A>(static_cast<const uint8_t*>(a) + s * kTileBytes, a_stride);
    Tiles::template Load<kB>(static_cast<const uint8_t*>(b) + s * kAmxMaxRows * kTileBytes,
                             kTileBytes);
    if constexpr (kDot == TileDot::kUnsignedSigned) {
      Tiles::template DotUnsignedSigned<C, A, kB>();
    } else if constexpr (kDot == TileDot::kSignedUnsigned) {
      Tiles::template DotSignedUnsigned<C, A, kB>();
    } else {
      Tiles::template DotBf16<C, A, kB>();
    }
  }
  Tiles::template Store<C>(out, kTileBytes);
}

// One row tile's sums over `steps` multiplies: A from `a` (rows a_stride bytes apart, 64 bytes
// further each step), B the 1 KiB tiles one after another from `b`; stored [row][16] (int32 or
// f32) at `out`. The tile's height picks its C and A tiles (ConfigureRowTiles).
template <class Tiles, TileDot kDot>
SY_AMX_KERNEL inline void RowTileSums(bool first_height, const void* a, int64_t a_stride,
                                      const void* b, int64_t steps, void* out) {
  if (first_height) {
    TileSums<Tiles, kDot, kC0, kA0>(a, a_stride, b, steps, out);
  } else {
    TileSums<Tiles, kDot, kC1, kA1>(a, a_stride, b, steps, out);
  }
}

template <class Tiles>
SY_AMX_KERNEL void Int8PanelsBody(const uint8_t* codes, int64_t stride, const float* scales,
                                  int64_t m, const PackedMatrix& w, int64_t panel_begin,
                                  int64_t panel_end, float* y) {
  if (m <= 0 || panel_begin >= panel_end) return;
  thread_local std::vector<RowTile> tiles;
  thread_local std::vector<float> state;
  const int64_t first = ConfigureRowTiles<Tiles>(m, tiles);
  state.resize(static_cast<size_t>(m * kPanelRows));
  alignas(64) int32_t sums[kAmxMaxRows * kPanelRows];
  const int64_t per_panel = w.groups * kPanelRows;
  for (int64_t p = panel_begin; p < panel_end; ++p) {
    std::fill(state.begin(), state.end(), 0.0f);
    const auto* panel = reinterpret_cast<const int8_t*>(w.Panel(p));
    for (int64_t g = 0; g < w.groups; ++g) {
      const int64_t c0 = g * kInt8GroupCols;
      const int64_t steps = (std::min(w.cols, c0 + kInt8GroupCols) - c0) / kTileCols8;
      const float* w_scale = w.row_scales.data() + p * per_panel + g * kPanelRows;
      const int32_t* w_offset = w.row_offsets.data() + p * per_panel + g * kPanelRows;
      for (const RowTile& t : tiles) {
        const uint8_t* x = codes + t.row * stride + c0;
        // 64 columns of a panel, [16 quads][16 rows][4], are a B tile as it lies in memory.
        RowTileSums<Tiles, TileDot::kUnsignedSigned>(t.count == first, x, stride,
                                                     panel + c0 * kPanelRows, steps, sums);
        // The group's term, as int8_gemm.cc's portable kernel adds it.
        for (int64_t r = 0; r < t.count; ++r) {
          const float xs = scales[(t.row + r) * w.groups + g];
          float* out = state.data() + (t.row + r) * kPanelRows;
          for (int64_t i = 0; i < kPanelRows; ++i) {
            const float term =
                static_cast<float>(sums[r * kPanelRows + i] - w_offset[i]) * w_scale[i];
            out[i] = __builtin_fmaf(term, xs, out[i]);
          }
        }
      }
    }
    WritePanelOutputs(state.data(), m, w, p, y);
  }
  Tiles::Release();
}

// Columns [c0, c0 + count) of a GGML panel (count a multiple of 4) as TDPBSUD B rows: per quad
// of columns, 16 rows × 4 unsigned codes, each code a byte (ggml_gemm.cc's CodeAt, 64 at once).
SY_AMX_KERNEL inline void UnpackGgmlQuads(const PackedMatrix& w, const uint8_t* codes, int64_t c0,
                                          int64_t count, uint8_t* out) {
  for (int64_t q = 0; q < count / 4; ++q) {
    const int64_t quad = c0 / 4 + q;
    uint8_t* row = out + q * kTileBytes;
    if (w.code_bits == 8) {  // int8's layout: the quad's row as it lies
      std::copy_n(codes + quad * kTileBytes, kTileBytes, row);
      continue;
    }
    const uint8_t* nibbles = codes + GgmlNibbleUnitOffset(w, quad / 2);
    const int shift = quad % 2 ? 4 : 0;
    for (int i = 0; i < kTileBytes; ++i)
      row[i] = static_cast<uint8_t>((nibbles[i] >> shift) & 15);
    if (w.code_bits == 6) {
      const uint8_t* top = codes + GgmlTopBitsOffset(quad / 4);
      const int top_shift = 2 * static_cast<int>(quad % 4);
      for (int i = 0; i < kTileBytes; ++i)
        row[i] = static_cast<uint8_t>(row[i] | ((top[i] >> top_shift) & 3) << 4);
    }
  }
}

// ggml_gemm.cc's RowPortable for every row at once: the same integer sums per sub-block, the
// same float steps per block, so the same bits.
template <class Tiles>
SY_AMX_KERNEL void GgmlPanelsBody(const Q8Rows& x, int64_t first, int64_t m, const PackedMatrix& w,
                                  int64_t panel_begin, int64_t panel_end, float* y) {
  if (m <= 0 || panel_begin >= panel_end) return;
  thread_local std::vector<RowTile> tiles;
  thread_local std::vector<float> state;
  thread_local std::vector<int32_t> acc, mins;
  thread_local CacheLineVector<uint8_t> quads;
  const int64_t sub = w.sub_cols;
  const int64_t step = std::min<int64_t>(sub, kTileCols8), steps = sub / step;
  const int64_t first_height = ConfigureRowTiles<Tiles>(m, tiles, static_cast<int>(step));
  state.resize(static_cast<size_t>(m * kPanelRows));
  acc.resize(state.size());
  mins.resize(state.size());
  quads.resize(static_cast<size_t>(sub / 4 * kTileBytes));
  alignas(64) int32_t sums[kAmxMaxRows * kPanelRows];
  const int64_t subs = w.cols / sub, blocks = w.cols / w.super_cols;
  const int64_t per_block = w.super_cols / sub;
  for (int64_t p = panel_begin; p < panel_end; ++p) {
    std::fill(state.begin(), state.end(), 0.0f);
    const uint8_t* codes = w.Panel(p);
    for (int64_t b = 0; b < blocks; ++b) {
      std::fill(acc.begin(), acc.end(), 0);
      std::fill(mins.begin(), mins.end(), 0);
      for (int64_t j = b * per_block; j < (b + 1) * per_block; ++j) {
        UnpackGgmlQuads(w, codes, j * sub, sub, quads.data());
        const size_t at = static_cast<size_t>((p * subs + j) * kPanelRows);
        for (const RowTile& t : tiles) {
          const int8_t* xr = x.Codes(first + t.row) + j * sub;
          RowTileSums<Tiles, TileDot::kSignedUnsigned>(t.count == first_height, xr, x.stride,
                                                       quads.data(), steps, sums);
          for (int64_t r = 0; r < t.count; ++r) {
            const int64_t row = t.row + r;
            const int32_t x_sum = x.Sums(first + row)[j];
            int32_t* a = acc.data() + row * kPanelRows;
            int32_t* mn = mins.data() + row * kPanelRows;
            for (int64_t i = 0; i < kPanelRows; ++i) {
              const int32_t sc = w.unit_scales ? 1 : w.sub_scales[at + i];
              const int32_t s = sums[r * kPanelRows + i];
              if (w.shared_d) {
                a[i] += sc * (s - x_sum);
              } else {
                a[i] += sc * s;
                mn[i] += (w.unit_scales ? 1 : w.sub_mins[at + i]) * x_sum;
              }
            }
          }
        }
      }
      const size_t at = static_cast<size_t>((p * blocks + b) * kPanelRows);
      for (int64_t row = 0; row < m; ++row) {
        const float xs = x.Scales(first + row)[b];
        float* out = state.data() + row * kPanelRows;
        for (int64_t i = 0; i < kPanelRows; ++i) {
          const float d = GgmlHalfToF32(w.super_d[at + i]);
          const float a = static_cast<float>(acc[row * kPanelRows + i]);
          float t;
          if (w.shared_d) {
            t = d * a;
          } else {
            const float dmin = GgmlHalfToF32(w.super_dmin[at + i]);
            t = __builtin_fmaf(d, a, -(dmin * static_cast<float>(mins[row * kPanelRows + i])));
          }
          out[i] = __builtin_fmaf(t, xs, out[i]);
        }
      }
    }
    WritePanelOutputs(state.data(), m, w, p, y);
  }
  Tiles::Release();
}

// --- fp8 and bf16 products (AmxBf16Panels) ---
//
// A blocked GEMM on 16-row tiles: every tile is 16 rows × 64 bytes, tiles 0-3 accumulate a 2 × 2
// block of outputs (two 16-row tiles of x by two panels), 4-5 hold x, 6-7 the panels' weights.
// Each A tile loaded serves two multiplies and each B tile two, four independent accumulation
// chains hide TDPBF16PS's latency, and the loops are blocked so that what is reused stays close:
// a panel pair's columns [k0, k0 + kBf16ChunkCols) are converted to bf16 pairs once (in L1) for
// all rows of a row chunk (panels of bf16 pairs, PackedMatrix::bf16_pairs, are the tiles as they
// lie: nothing to convert, and their units are kBf16PairsChunkCols long), and that chunk's x
// columns (≤ kBf16ChunkRows rows) are read from L2 by every panel of the thread's range. A row's
// arithmetic does not depend on any of it:
// - fp8: per scale block, a zeroed tile row sums the block 32 columns at a time, and the row's
//   result is fma(block sum, block scale, result so far), blocks in column order;
// - bf16: one chain of tile multiplies from zero over all columns in order, stored between units
//   and loaded back (exact), so the bits are the same in either panel layout.
// x comes zero-padded to a whole tile of rows (AmxBf16Elements); the padding rows are computed
// and dropped. Below 16 rows the tiles are m rows high.
constexpr int kBf16C = 0, kBf16A = 4, kBf16B = 6;
constexpr int64_t kBf16ChunkCols = 512;  // columns of weights converted at a time, per panel
// Columns of a unit on panels of bf16 pairs, which need no conversion buffer in L1. Each unit
// ends with its four tiles of sums stored (and the next begins by loading them), which waits for
// the multiplies in flight to drain: measured on 256 × 2048 × 1536 (Xeon with AMX, one core),
// units of 512 columns ran at 0.94 TFLOP/s, of 2048 at 1.18 while x sat 16 bytes off a line;
// once on lines (CacheLineVector), 1.27 and 1.31.
constexpr int64_t kBf16PairsChunkCols = 2048;
// ... except where a unit is walked by a whole chunk of rows (kBf16ChunkRows: 8 blocks) and the
// walk is one matrix: then units of 256 columns, whose panel pair (16 KiB) stays in L1 for all
// the unit's blocks, and only x's tiles come from L2. Measured (Xeon with AMX, 2 threads, bf16
// pairs, medians of 7, 3 alternated runs): 2048 rows × 2048 outputs at 768, 1024 and 2048
// columns 1.09-1.19×, 1.05-1.10× and 1.03-1.07× the rate of 2048-column units; an expert's
// 512 rows of down (2048 × 768) 1.10-1.16×; at 512 columns and below 256 rows, no better. The
// fused gate and up walk (two matrices' panels a unit) ran no faster, and keeps long units.
constexpr int64_t kBf16PairsShortChunkCols = 256;
constexpr int64_t kBf16ChunkRows = 256;  // rows of x walked by every panel before the next ones
constexpr int64_t kBf16RowsInL2Bytes = 1 << 20;  // x up to this size is read again per panel pair
constexpr int64_t kBf16TileElems = kAmxMaxRows * kTileCols16;  // bf16 per A or B tile

// A unit of the walk: its panels [p, p + 2) (or the last one) against columns [k0, k0 + 512).
struct Bf16Unit {
  int64_t p, k0;
};

// Tile multiplies ahead of which Bf16Block asks for the weights (prefetcht2, into L2) when they
// stream from memory: at 16 and 32 rows the tile loads alone kept the stream at 24 and 21 GB/s
// of the 29 measured on two cores; 4 steps (4 KiB a panel) ahead, 27 and 23.5 (Xeon with AMX).
// Since a unit of one block asks on into the next unit's weights (Bf16Prefetch::then), so that
// the stream has no gap at each unit's start, 2 steps ahead ran a 64-token prompt's prefill and
// one- and 32-sequence decode ~2% faster than 4 (0.0774 against 0.0794 s, 6 alternated rounds).
constexpr int64_t kBf16PrefetchSteps = 2;

// What a block asks memory for (prefetcht2) while it multiplies, per panel j of a pair: own[j],
// its own weights kBf16PrefetchSteps ahead, a tile a step (a walk's first unit, and every unit of
// one block); next[j], next_bytes a step of its share of the next unit's weights, spread evenly
// over the unit's blocks, so that memory streams while the row tiles that read the unit's weights
// from L2 multiply too. Measured (Xeon with AMX, bf16 pairs, 2 threads): 128 × 1536 × 2048 and
// bench kernels' o_proj at 128 rows 12-16% faster, 256 rows 10-15%; up to 32 rows (one block a
// unit) asking ahead inside the block stays as fast as before.
struct Bf16Prefetch {
  const char* own[2] = {nullptr, nullptr};
  // Where own goes on past the block's last step: the next unit's panels from their first
  // step (a unit of one block), so that memory streams across units without a gap at each
  // unit's start. Null: own runs on past the panels' end.
  const char* then[2] = {nullptr, nullptr};
  const char* next[2] = {nullptr, nullptr};
  int64_t next_bytes = 0;
};

// NR tiles of x rows (a[0], a[1]) by NP panels' weight pairs (b[0], b[1]) over `steps` multiplies
// of 32 columns, tile (r, p)'s sums at c[2r + p] ([rows][16] f32, 64 bytes a row): from zero, or
// (kGoOn) continuing the sums stored there — a tile store and load are exact, so a chain may
// stop and go on without its bits moving. `prefetch`: what to ask memory for meanwhile (kNext:
// it has a next unit's stream).
template <class Tiles, int NR, int NP, bool kGoOn, bool kNext>
SY_AMX_KERNEL inline void Bf16Block(const uint16_t* const* a, int64_t a_stride,
                                    const uint16_t* const* b, int64_t steps, float* const* c,
                                    const Bf16Prefetch& prefetch) {
  auto start = [&](auto tile, int i) {
    constexpr int kTile = decltype(tile)::value;
    if constexpr (kGoOn) {
      Tiles::template Load<kTile>(c[i], kTileBytes);
    } else {
      Tiles::template Zero<kTile>();
    }
  };
  start(std::integral_constant<int, kBf16C + 0>(), 0);
  if constexpr (NP == 2) start(std::integral_constant<int, kBf16C + 1>(), 1);
  if constexpr (NR == 2) start(std::integral_constant<int, kBf16C + 2>(), 2);
  if constexpr (NR == 2 && NP == 2) start(std::integral_constant<int, kBf16C + 3>(), 3);
  // In registers: the tile instructions' memory clobbers would have them reloaded every step.
  const uint16_t *a0 = a[0], *a1 = NR == 2 ? a[1] : nullptr;
  const uint16_t *b0 = b[0], *b1 = NP == 2 ? b[1] : nullptr;
  // A missing second panel asks for the first's lines again: no branch in the loop.
  constexpr int64_t kStepBytes = kTileBytes * kAmxMaxRows;
  const char *own0 = prefetch.own[0], *own1 = prefetch.own[1] ? prefetch.own[1] : own0;
  // own[j] is kBf16PrefetchSteps ahead of the block's weights; past their last step it
  // continues at then[j], offset so that step s still finds its lines at + s · kStepBytes.
  const int64_t then_offset = (kBf16PrefetchSteps - steps) * kStepBytes;
  const char* then0 = prefetch.then[0] != nullptr ? prefetch.then[0] + then_offset : own0;
  const char* then1 = prefetch.then[1] != nullptr   ? prefetch.then[1] + then_offset
                      : prefetch.then[0] != nullptr ? then0
                                                    : own1;
  const char *next0 = prefetch.next[0], *next1 = prefetch.next[1] ? prefetch.next[1] : next0;
  const int64_t next_bytes = kNext ? prefetch.next_bytes : 0;
  for (int64_t s = 0; s < steps; ++s) {
    if (own0 != nullptr) {
      const bool past = s + kBf16PrefetchSteps >= steps;
      const char* ahead0 = (past ? then0 : own0) + s * kStepBytes;
      const char* ahead1 = (past ? then1 : own1) + s * kStepBytes;
      for (int64_t line = 0; line < kStepBytes; line += 64) {
        __builtin_prefetch(ahead0 + line, 0, 1);
        __builtin_prefetch(ahead1 + line, 0, 1);
      }
    }
    if constexpr (kNext)
      for (int64_t line = 0; line < next_bytes; line += 64) {
        __builtin_prefetch(next0 + s * next_bytes + line, 0, 1);
        __builtin_prefetch(next1 + s * next_bytes + line, 0, 1);
      }
    Tiles::template Load<kBf16B + 0>(b0 + s * kBf16TileElems, kTileBytes);
    if constexpr (NP == 2) Tiles::template Load<kBf16B + 1>(b1 + s * kBf16TileElems, kTileBytes);
    Tiles::template Load<kBf16A + 0>(a0 + s * kTileCols16, a_stride);
    Tiles::template DotBf16<kBf16C + 0, kBf16A + 0, kBf16B + 0>();
    if constexpr (NP == 2) Tiles::template DotBf16<kBf16C + 1, kBf16A + 0, kBf16B + 1>();
    if constexpr (NR == 2) {
      Tiles::template Load<kBf16A + 1>(a1 + s * kTileCols16, a_stride);
      Tiles::template DotBf16<kBf16C + 2, kBf16A + 1, kBf16B + 0>();
      if constexpr (NP == 2) Tiles::template DotBf16<kBf16C + 3, kBf16A + 1, kBf16B + 1>();
    }
  }
  Tiles::template Store<kBf16C + 0>(c[0], kTileBytes);
  if constexpr (NP == 2) Tiles::template Store<kBf16C + 1>(c[1], kTileBytes);
  if constexpr (NR == 2) Tiles::template Store<kBf16C + 2>(c[2], kTileBytes);
  if constexpr (NR == 2 && NP == 2) Tiles::template Store<kBf16C + 3>(c[3], kTileBytes);
}

template <class Tiles, bool kGoOn, bool kNext>
SY_AMX_KERNEL inline void Bf16BlocksOf(int64_t nr, int64_t np, const uint16_t* const* a,
                                       int64_t a_stride, const uint16_t* const* b, int64_t steps,
                                       float* const* c, const Bf16Prefetch& prefetch) {
  if (nr == 2 && np == 2) {
    Bf16Block<Tiles, 2, 2, kGoOn, kNext>(a, a_stride, b, steps, c, prefetch);
  } else if (nr == 2) {
    Bf16Block<Tiles, 2, 1, kGoOn, kNext>(a, a_stride, b, steps, c, prefetch);
  } else if (np == 2) {
    Bf16Block<Tiles, 1, 2, kGoOn, kNext>(a, a_stride, b, steps, c, prefetch);
  } else {
    Bf16Block<Tiles, 1, 1, kGoOn, kNext>(a, a_stride, b, steps, c, prefetch);
  }
}

// The loop without the next unit's stream is its own copy: where there is none to ask for (a
// unit of one block, up to 32 rows), a loop that tested for it ran ~5% slower.
template <class Tiles, bool kGoOn>
SY_AMX_KERNEL inline void Bf16Blocks(int64_t nr, int64_t np, const uint16_t* const* a,
                                     int64_t a_stride, const uint16_t* const* b, int64_t steps,
                                     float* const* c, const Bf16Prefetch& prefetch = {}) {
  if (prefetch.next[0] != nullptr) {
    Bf16BlocksOf<Tiles, kGoOn, true>(nr, np, a, a_stride, b, steps, c, prefetch);
  } else {
    Bf16BlocksOf<Tiles, kGoOn, false>(nr, np, a, a_stride, b, steps, c, prefetch);
  }
}

// Bf16PanelsBody's fused gate and up (AmxBf16GateUpPanels): w is gate, and the walk takes gate's
// panel j and up's panel j as one pair of panels (its panels 2j and 2j + 1), so each tile of x
// loaded serves both. Each row's SiLU(gate)·up (SiluMul) is rounded by to_bf16, the backend's
// AmxToBf16Rows rounding, into `out`'s rows (AmxBf16RowStride(w.rows) apart) from column
// 16 · panel_begin.
struct Bf16GateUp {
  const PackedMatrix* up = nullptr;
  uint16_t* out = nullptr;
  void (*to_bf16)(const float* x, int64_t m, int64_t cols, uint16_t* out) = nullptr;
};

// ConvertPairs(w, panel, count, c0, c1, out, out_stride): columns [c0, c1) of panels [panel,
// panel + count) as (c1 - c0) / 2 rows of 16 bf16 pairs each: for panel j, out[j · out_stride +
// (c - c0) / 2 · 32 + 2r + c % 2] = w[r][c].
template <class Tiles, typename ConvertPairs>
SY_AMX_KERNEL void Bf16PanelsBody(const uint16_t* x_bf16, int64_t m, const PackedMatrix& w,
                                  int64_t panel_begin, int64_t panel_end, float* y,
                                  ConvertPairs convert, const Bf16GateUp* gate_up = nullptr,
                                  const AmxRoutedRows* routed = nullptr) {
  if (m <= 0 || panel_begin >= panel_end) return;
  thread_local CacheLineVector<float> state;
  thread_local CacheLineVector<uint16_t> pairs;  // tile loads read it: on 64-byte lines
  thread_local std::vector<Bf16Unit> units;
  thread_local std::vector<float> row_gate, row_up;
  // Tiles of x rows (and of sums) are 16 high, or m high where m < 16.
  const int64_t height = std::min<int64_t>(m, kAmxMaxRows);
  TileConfig config;
  for (int t = 0; t < kAmxTiles; ++t)
    config.Set(t, t >= kBf16B ? kAmxMaxRows : static_cast<int>(height), kTileBytes);
  Tiles::Configure(config);
  const bool fp8 = w.dtype == DType::kF8E4M3;
  // fp8: the scale block ends a tile's chain of sums. bf16 weights have no scale: one chain.
  const int64_t block = fp8 ? w.block_cols : kBf16ChunkCols;
  const int64_t pairs_chunk_cols =
      gate_up == nullptr && m >= kBf16ChunkRows ? kBf16PairsShortChunkCols : kBf16PairsChunkCols;
  const int64_t chunk_cols =
      w.bf16_pairs ? pairs_chunk_cols : block * std::max<int64_t>(1, kBf16ChunkCols / block);
  // The walk's panels, v in [0, walked): w's panel panel_begin + v, or (fused) gate's and up's
  // panel panel_begin + v / 2 in turn (both of one layout and, for fp8, one block size).
  const int64_t panels = panel_end - panel_begin;
  const int64_t walked = gate_up != nullptr ? 2 * panels : panels;
  auto matrix_of = [&](int64_t v) -> const PackedMatrix& {
    return gate_up != nullptr && v % 2 == 1 ? *gate_up->up : w;
  };
  auto panel_index = [&](int64_t v) { return panel_begin + (gate_up != nullptr ? v / 2 : v); };
  if (!w.bf16_pairs)  // two units' panel pairs, converted
    pairs.resize(static_cast<size_t>(2 * 2 * chunk_cols * kPanelRows));
  const int64_t row_stride = AmxBf16RowStride(w.cols), x_stride = row_stride * 2;
  constexpr int64_t kTileFloats = kAmxMaxRows * kPanelRows;
  alignas(64) float sums[4 * kTileFloats];
  for (int64_t r0 = 0; r0 < m; r0 += kBf16ChunkRows) {
    const int64_t rows = std::min(kBf16ChunkRows, m - r0);
    const int64_t row_tiles = (rows + height - 1) / height;
    const int64_t padded = row_tiles * height;
    auto tile_rows = [&](int64_t t) { return x_bf16 + (r0 + t * height) * row_stride; };
    // fp8 adds each block into its rows' state; bf16's chains start from zero tiles.
    const size_t state_size = static_cast<size_t>(walked * padded * kPanelRows);
    if (fp8) {
      state.assign(state_size, 0.0f);
    } else {
      state.resize(std::max(state.size(), state_size));
    }
    auto buffer = [&](int64_t i) -> uint16_t* {
      if (w.bf16_pairs) return nullptr;  // the panels are the tiles
      return pairs.data() + (i % 2) * 2 * chunk_cols * kPanelRows;
    };
    auto convert_unit = [&](const Bf16Unit& u, uint16_t* b) {
      if (w.bf16_pairs) return;  // the panels are the tiles
      const int64_t k1 = std::min(w.cols, u.k0 + chunk_cols);
      if (gate_up == nullptr) {
        convert(w, panel_begin + u.p, std::min<int64_t>(2, walked - u.p), u.k0, k1, b,
                chunk_cols * kPanelRows);
        return;
      }
      for (int64_t j = 0; j < 2; ++j)  // gate's panel, then up's
        convert(matrix_of(u.p + j), panel_index(u.p + j), 1, u.k0, k1,
                b + j * chunk_cols * kPanelRows, chunk_cols * kPanelRows);
    };
    // The walk's panel v from column k0 on, where panels are bf16 pairs (the tiles as they lie).
    auto pairs_from = [&](int64_t v, int64_t k0) {
      return reinterpret_cast<const uint16_t*>(matrix_of(v).Panel(panel_index(v))) +
             k0 * kPanelRows;
    };
    // Unit u: the walk's panels [u.p, u.p + 2) against columns [u.k0, u.k0 + chunk_cols).
    // (`next`: the unit after this one, whose weights it asks memory for; `first`: the walk's
    // first unit, which asks for its own.)
    auto compute_unit = [&](const Bf16Unit& u, const uint16_t* b0_pairs, const Bf16Unit* next,
                            bool first) {
      const int64_t v = u.p, k0 = u.k0, k1 = std::min(w.cols, k0 + chunk_cols);
      const int64_t np = std::min<int64_t>(2, walked - v);
      const uint16_t* b[2] = {b0_pairs, nullptr};
      if (!w.bf16_pairs) b[1] = b0_pairs + chunk_cols * kPanelRows;
      if (w.bf16_pairs)
        for (int64_t j = 0; j < np; ++j)
          b[j] = pairs_from(v + j, k0);
      auto state_tile = [&](int64_t t, int64_t j) {
        return state.data() + ((v + j) * padded + t * height) * kPanelRows;
      };
      if (!fp8) {  // one chain per row over all columns: the sums go on from the state
        const int64_t steps = (k1 - k0) / kTileCols16;
        // Panels of bf16 pairs stream from memory: each block asks for its share of the next
        // unit's weights, a whole number of lines a step.
        // (Scalars here, and each block's Bf16Prefetch written field by field: copying a struct
        // the compiler had zeroed in part with a 16-byte store read it back with a 32-byte load,
        // which cannot be forwarded and so waited for the last block's tile stores to drain.)
        const char* next_base[2] = {nullptr, nullptr};
        int64_t next_bytes = 0;
        const int64_t blocks = (row_tiles + 1) / 2;
        if (w.bf16_pairs && next != nullptr && blocks > 1) {
          const int64_t next_k1 = std::min(w.cols, next->k0 + chunk_cols);
          const int64_t slice = (next_k1 - next->k0) * kPanelRows * 2;  // bytes of each panel
          next_bytes = ((slice + blocks * steps - 1) / (blocks * steps) + 63) / 64 * 64;
          for (int64_t j = 0; j < std::min<int64_t>(2, walked - next->p); ++j)
            next_base[j] = reinterpret_cast<const char*>(pairs_from(next->p + j, next->k0));
        }
        for (int64_t t = 0; t < row_tiles; t += 2) {
          const int64_t nr = std::min<int64_t>(2, row_tiles - t);
          const uint16_t* a[2] = {tile_rows(t) + k0, nr == 2 ? tile_rows(t + 1) + k0 : nullptr};
          float* const c[4] = {state_tile(t, 0), np == 2 ? state_tile(t, 1) : nullptr,
                               nr == 2 ? state_tile(t + 1, 0) : nullptr,
                               nr == 2 && np == 2 ? state_tile(t + 1, 1) : nullptr};
          // The unit's first row tiles read its weights from memory; the rest, from L2.
          Bf16Prefetch prefetch;
          prefetch.next_bytes = next_bytes;
          for (int64_t j = 0; j < 2; ++j)
            prefetch.next[j] =
                next_base[j] != nullptr ? next_base[j] + t / 2 * steps * next_bytes : nullptr;
          if (w.bf16_pairs && (first || blocks == 1) && t == 0) {
            for (int64_t j = 0; j < np; ++j)
              prefetch.own[j] =
                  reinterpret_cast<const char*>(b[j] + kBf16PrefetchSteps * kBf16TileElems);
            if (blocks == 1 && next != nullptr)
              for (int64_t j = 0; j < std::min<int64_t>(2, walked - next->p); ++j)
                prefetch.then[j] = reinterpret_cast<const char*>(pairs_from(next->p + j, next->k0));
          }
          if (k0 == 0) {
            Bf16Blocks<Tiles, false>(nr, np, a, x_stride, b, steps, c, prefetch);
          } else {
            Bf16Blocks<Tiles, true>(nr, np, a, x_stride, b, steps, c, prefetch);
          }
        }
        return;
      }
      float* const c[4] = {sums, sums + kTileFloats, sums + 2 * kTileFloats,
                           sums + 3 * kTileFloats};
      for (int64_t b0 = k0; b0 < k1; b0 += block) {
        const int64_t steps = (std::min(k1, b0 + block) - b0) / kTileCols16;
        float scale[2] = {1.0f, 1.0f};
        for (int64_t j = 0; j < np; ++j)
          scale[j] = matrix_of(v + j).PanelScales(panel_index(v + j))[b0 / w.block_cols];
        const uint16_t* bb[2] = {b[0] + (b0 - k0) * kPanelRows, b[1] + (b0 - k0) * kPanelRows};
        for (int64_t t = 0; t < row_tiles; t += 2) {
          const int64_t nr = std::min<int64_t>(2, row_tiles - t);
          const uint16_t* a[2] = {tile_rows(t) + b0, nr == 2 ? tile_rows(t + 1) + b0 : nullptr};
          Bf16Blocks<Tiles, false>(nr, np, a, x_stride, bb, steps, c);
          for (int64_t r = 0; r < nr; ++r)
            for (int64_t j = 0; j < np; ++j) {
              const float* in = c[2 * r + j];
              float* out = state_tile(t + r, j);
              for (int64_t i = 0; i < height * kPanelRows; ++i)
                out[i] = __builtin_fmaf(in[i], scale[j], out[i]);
            }
        }
      }
    };
    // Where the chunk's rows of x fit in L2 (decode batches), each panel pair walks all its
    // columns before the next, so its weights stream from memory in long runs; else the columns
    // are the outer loop, so that a slice of x stays in L2 for every panel.
    units.clear();
    if (rows * x_stride <= kBf16RowsInL2Bytes) {
      for (int64_t v = 0; v < walked; v += 2)
        for (int64_t k0 = 0; k0 < w.cols; k0 += chunk_cols)
          units.push_back({v, k0});
    } else {
      for (int64_t k0 = 0; k0 < w.cols; k0 += chunk_cols)
        for (int64_t v = 0; v < walked; v += 2)
          units.push_back({v, k0});
    }
    // Converted one unit ahead into the other buffer: a unit's tile loads read weights stored a
    // unit earlier, not the stores just issued, which they would have to wait for.
    convert_unit(units[0], buffer(0));
    for (size_t i = 0; i < units.size(); ++i) {
      if (i + 1 < units.size()) convert_unit(units[i + 1], buffer(static_cast<int64_t>(i) + 1));
      compute_unit(units[i], buffer(static_cast<int64_t>(i)),
                   i + 1 < units.size() ? &units[i + 1] : nullptr, i == 0);
    }
    // Row by row, so that each row's outputs are one forward run of stores: panel by panel they
    // went to a new line of y per row, each a read for ownership the copy waited on (at 256 rows,
    // a third of the kernel's time). (Tiles stored straight into y instead were slower still.)
    const int64_t last_valid = std::min(kPanelRows, w.rows - (panel_end - 1) * kPanelRows);
    const int64_t valid = (panels - 1) * kPanelRows + last_valid;
    // Row r's outputs of the walk's panels first, first + step, ... into one contiguous row.
    auto gather_row = [&](int64_t r, int64_t first, int64_t step, std::vector<float>& to) {
      to.resize(static_cast<size_t>(panels * kPanelRows));
      const float* in = state.data() + r * kPanelRows;
      for (int64_t p = 0; p < panels; ++p)
        std::memcpy(to.data() + p * kPanelRows, in + (first + step * p) * padded * kPanelRows,
                    kPanelRows * sizeof(float));
    };
    if (gate_up != nullptr) {  // SiLU(gate)·up, rounded to bf16: down's input
      const int64_t out_stride = AmxBf16RowStride(w.rows);
      for (int64_t r = 0; r < rows; ++r) {
        gather_row(r, 0, 2, row_gate);
        gather_row(r, 1, 2, row_up);
        SiluMul(row_gate.data(), row_up.data(), valid);
        gate_up->to_bf16(row_gate.data(), 1, valid,
                         gate_up->out + (r0 + r) * out_stride + panel_begin * kPanelRows);
      }
      continue;
    }
    if (routed != nullptr) {         // each row weighted into its token's sum
      constexpr int64_t kAhead = 2;  // rows whose sums are fetched ahead of their turn
      auto fetch = [&](int64_t row) {
        const float* sums =
            routed->out + routed->token[row] * routed->out_stride + panel_begin * kPanelRows;
        for (int64_t i = 0; i < valid; i += kPanelRows)
          __builtin_prefetch(sums + i, 1);
      };
      for (int64_t r = 0; r < std::min(kAhead, rows); ++r)
        fetch(r0 + r);
      for (int64_t r = 0; r < rows; ++r) {
        if (r + kAhead < rows) fetch(r0 + r + kAhead);
        gather_row(r, 0, 1, row_gate);
        const int64_t row = r0 + r;
        AddWeightedRow(
            routed->out + routed->token[row] * routed->out_stride + panel_begin * kPanelRows,
            row_gate.data(), routed->weight[row], valid, routed->first[row] != 0);
      }
      continue;
    }
    for (int64_t r = 0; r < rows; ++r) {
      float* out = y + (r0 + r) * w.rows + panel_begin * kPanelRows;
      const float* in = state.data() + r * kPanelRows;
      for (int64_t p = 0; p < panels; ++p) {
        const float* from = in + p * padded * kPanelRows;
        if (p + 1 < panels || last_valid == kPanelRows) {
          std::memcpy(out + p * kPanelRows, from, kPanelRows * sizeof(float));
        } else {
          std::copy_n(from, last_valid, out + p * kPanelRows);
        }
      }
    }
  }
  Tiles::Release();
}

// --- Absorbed MLA attention on the latent cache (AmxMlaDecode) ---

constexpr int64_t kMlaChunk = 128;                            // keys per online-softmax step
constexpr int64_t kMlaKeyTiles = kMlaChunk / kAmxMaxRows;     // score tiles of 16 keys
constexpr int64_t kMlaKeySteps = kMlaChunk / kTileCols16;     // P·V multiplies of 32 keys
constexpr int64_t kMlaTileElems = kAmxMaxRows * kTileCols16;  // bf16 per A or B tile

// e^x for x ≤ 0, as mla_decode_bf16.cc's ExpNonPositive (2^n · p(r), the degree-7 Taylor
// polynomial), written for any compiler to vectorize: n rounded to nearest by adding and taking
// away 1.5 · 2^23, 2^n made from its bits.
SY_AMX_KERNEL inline float ExpNonPositive(float x) {
  x = std::max(x, -87.0f);
  // One fma, spelled out: a compiler free to contract would round differently per target.
  const float n = __builtin_fmaf(x, 1.44269504f, 12582912.0f) - 12582912.0f;
  float r = __builtin_fmaf(-n, 0.693145752f, x);
  r = __builtin_fmaf(-n, 1.42860677e-6f, r);
  float p = __builtin_fmaf(1.0f / 5040, r, 1.0f / 720);  // unrolled: a loop kept it scalar
  p = __builtin_fmaf(p, r, 1.0f / 120);
  p = __builtin_fmaf(p, r, 1.0f / 24);
  p = __builtin_fmaf(p, r, 1.0f / 6);
  p = __builtin_fmaf(p, r, 0.5f);
  p = __builtin_fmaf(p, r, 1.0f);
  p = __builtin_fmaf(p, r, 1.0f);
  const uint32_t bits = static_cast<uint32_t>(static_cast<int32_t>(n) + 127) << 23;
  float two_n;
  std::memcpy(&two_n, &bits, 4);
  return p * two_n;
}

// The softmax's passes over a chunk's scores, rows of 16 heads, each a loop over the 16 lanes
// for a compiler to vectorize (no aliasing, constant trip count).
// Scores of keys [0, used) scaled in place, and each head's maximum.
SY_AMX_KERNEL inline void MlaChunkMax(float* __restrict scores, int64_t used, float scale,
                                      float* __restrict chunk_max) {
  for (int64_t n = 0; n < kPanelRows; ++n)
    chunk_max[n] = -std::numeric_limits<float>::infinity();
  for (int64_t j = 0; j < used; ++j)
    for (int64_t n = 0; n < kPanelRows; ++n) {
      const float v = scores[j * kPanelRows + n] * scale;
      scores[j * kPanelRows + n] = v;
      chunk_max[n] = std::max(chunk_max[n], v);
    }
}
// Scores of keys [0, keys) replaced by their probabilities e^(s − max) (0 from `used` on), and
// each head's sum of them in key order.
SY_AMX_KERNEL inline void MlaChunkProbabilities(float* __restrict scores, int64_t used,
                                                int64_t keys, const float* __restrict max,
                                                float* __restrict sum) {
  for (int64_t n = 0; n < kPanelRows; ++n)
    sum[n] = 0.0f;
  for (int64_t j = 0; j < keys; ++j)
    for (int64_t n = 0; n < kPanelRows; ++n) {
      const float p = j < used ? ExpNonPositive(scores[j * kPanelRows + n] - max[n]) : 0.0f;
      scores[j * kPanelRows + n] = p;
      sum[n] += p;
    }
}
// o = fma(o, c, in) over 16 dims.
SY_AMX_KERNEL inline void MlaScaleAdd(float* __restrict o, float c, const float* __restrict in) {
  for (int64_t n = 0; n < kPanelRows; ++n)
    o[n] = __builtin_fmaf(o[n], c, in[n]);
}

// PairRows(r0, r1, latent, out, tile_stride): keys r0 and r1 (bf16 cache rows; r1 may be null:
// zeros) as one row of P·V's weight tiles: out[dt · tile_stride + 2n + h] = (h ? r1 : r0)[16dt + n]
// for each dim tile dt < latent / 16.
//
// MlaDecodeAttention's contract (mla_decode.h) on a bf16 or fp8 cache, latent a multiple of 16: the
// flash-decoding walk over chunks of kMlaChunk keys, on tiles both ways.
// - Scores transposed, Sᵀ = K·Qᵀ: the A tiles are 16 cache rows as they lie (32 dims each), so
//   the keys are never re-laid; the B tile is a head group's queries in dim pairs (16 heads),
//   made once per token. Each output is one key's 16 heads: heads in lanes for the softmax.
// - Online softmax per head in f32, in key order; probabilities rounded to bf16 as P's A tiles
//   (16 heads × 32 keys).
// - P·V against the chunk's values in key pairs (PairRows, once per chunk for every token and
//   head), a chain over the chunk per 16 latent dims; o = fma(o, correction, P·V) per chunk.
// A head's outputs meet no other head's or token's, and the chunks start at fixed keys, so its
// result depends on nothing beside it.
template <class Tiles, typename PairRows>
SY_AMX_KERNEL void MlaDecodeBody(
    const float* q_latent, const float* q_pe, int64_t tokens, const int64_t* positions,
    const LatentPages& cache, int64_t keys, int64_t heads, int64_t head_begin, int64_t head_end,
    int64_t latent, int64_t rope, float scale, float* o_latent, PairRows pair_rows,
    void (*to_bf16)(const float* x, int64_t m, int64_t cols, uint16_t* out)) {
  const int64_t count_heads = head_end - head_begin;
  if (tokens <= 0 || count_heads <= 0) return;
  const int64_t width = latent + rope;
  const int64_t padded = (width + kTileCols16 - 1) / kTileCols16 * kTileCols16;
  const int64_t steps = padded / kTileCols16, dim_tiles = latent / kPanelRows;
  const int64_t groups = (count_heads + kPanelRows - 1) / kPanelRows;
  const int64_t row_bytes = cache.layout.row_bytes;
  thread_local CacheLineVector<uint16_t> q_tiles, staged, values, probs;  // tile loads read them
  thread_local CacheLineVector<float> scores, pv;
  thread_local std::vector<uint16_t> q_bf16;
  thread_local std::vector<float> q_row, run_max, run_sum;
  TileConfig config;
  for (int t = 0; t < kAmxTiles; ++t)
    config.Set(t, kAmxMaxRows, kTileBytes);
  Tiles::Configure(config);
  // Queries as the scores' B tiles, per token and group of 16 heads: tile s row i = dims
  // (32s + 2i, 32s + 2i + 1) of each head; zero past the width and the heads. A head's row is
  // rounded in one pass (to_bf16), then its pairs are placed.
  q_tiles.assign(static_cast<size_t>(tokens * groups * steps * kMlaTileElems), 0);
  q_row.resize(static_cast<size_t>(padded));
  q_bf16.assign(static_cast<size_t>(padded), 0);
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t h = 0; h < count_heads; ++h) {
      const int64_t at = t * heads + head_begin + h;
      std::copy_n(q_latent + at * latent, latent, q_row.begin());
      std::copy_n(q_pe + at * rope, rope, q_row.begin() + latent);
      to_bf16(q_row.data(), 1, width, q_bf16.data());
      uint16_t* group = q_tiles.data() + (t * groups + h / kPanelRows) * steps * kMlaTileElems +
                        2 * (h % kPanelRows);
      for (int64_t i = 0; i < padded / 2; ++i)  // pair i: tile i / 16, row i % 16
        std::memcpy(group + (i / kPanelRows) * kMlaTileElems + (i % kPanelRows) * 2 * kPanelRows,
                    q_bf16.data() + 2 * i, 4);
    }
  staged.resize(static_cast<size_t>(kMlaKeyTiles * kAmxMaxRows * padded));
  values.resize(static_cast<size_t>(kMlaKeySteps * dim_tiles * kMlaTileElems));
  probs.resize(static_cast<size_t>(kMlaKeySteps * kMlaTileElems));
  scores.resize(static_cast<size_t>(kMlaChunk * kPanelRows));
  pv.resize(static_cast<size_t>(kAmxMaxRows * kPanelRows));
  run_max.assign(static_cast<size_t>(tokens * groups * kPanelRows),
                 -std::numeric_limits<float>::infinity());
  run_sum.assign(run_max.size(), 0.0f);
  const int64_t last_visible =
      BeginMlaDecode(positions, tokens, keys, heads, head_begin, head_end, latent, o_latent);

  // An fp8 cache's rows are widened to bf16 a chunk at a time (exactly: latent_row.h), into rows
  // of `padded` values that stay zero past the width, and read from there as a bf16 cache's.
  const bool fp8 = cache.layout.dtype == DType::kF8E4M3;
  thread_local CacheLineVector<uint16_t> widened;
  if (fp8) widened.assign(static_cast<size_t>(kMlaChunk * padded), 0);
  const int64_t stride = fp8 ? padded * 2 : row_bytes;

  for (int64_t start = 0; start < last_visible; start += kMlaChunk) {
    const int64_t count = std::min(kMlaChunk, last_visible - start);
    const int64_t key_tiles = (count + kAmxMaxRows - 1) / kAmxMaxRows;
    const int64_t key_steps = (count + kTileCols16 - 1) / kTileCols16;
    if (fp8)
      for (int64_t r = 0; r < count; ++r)
        StageLatentRowBf16(cache.layout, cache.Row(start + r), width, widened.data() + r * padded);
    const auto row = [&](int64_t position) {
      return fp8 ? reinterpret_cast<const uint8_t*>(widened.data() + (position - start) * padded)
                 : cache.Row(position);
    };
    // The scores' A tiles: 16 keys in place where they lie one row apart (one page, or pages
    // side by side, or widened) and a row is whole tiles; else copied, zero past the keys and
    // the width.
    const uint16_t* key_tile[kMlaKeyTiles];
    int64_t key_stride[kMlaKeyTiles];
    for (int64_t kt = 0; kt < key_tiles; ++kt) {
      const int64_t first = start + kt * kAmxMaxRows;
      const int64_t n = std::min<int64_t>(kAmxMaxRows, count - kt * kAmxMaxRows);
      const uint8_t* row0 = row(first);
      if (n == kAmxMaxRows && (fp8 || width == padded) &&
          row(first + n - 1) == row0 + (n - 1) * stride) {
        key_tile[kt] = reinterpret_cast<const uint16_t*>(row0);
        key_stride[kt] = stride;
        continue;
      }
      uint16_t* to = staged.data() + kt * kAmxMaxRows * padded;
      std::fill(to, to + kAmxMaxRows * padded, uint16_t{0});
      for (int64_t r = 0; r < n; ++r)
        std::memcpy(to + r * padded, row(first + r), static_cast<size_t>(width) * 2);
      key_tile[kt] = to;
      key_stride[kt] = padded * 2;
    }
    // P·V's B tiles: tile (ks, dt) row jj = keys 32ks + 2jj and + 1 over dims 16dt...16dt + 15.
    for (int64_t pair = 0; pair < key_steps * kAmxMaxRows; ++pair) {
      const int64_t k0 = 2 * pair, k1 = k0 + 1;
      uint16_t* out = values.data() + (pair / kAmxMaxRows) * dim_tiles * kMlaTileElems +
                      (pair % kAmxMaxRows) * 2 * kPanelRows;
      if (k0 >= count) {
        for (int64_t dt = 0; dt < dim_tiles; ++dt)
          std::fill_n(out + dt * kMlaTileElems, 2 * kPanelRows, uint16_t{0});
        continue;
      }
      pair_rows(row(start + k0), k1 < count ? row(start + k1) : nullptr, latent, out,
                kMlaTileElems);
    }
    for (int64_t t = 0; t < tokens; ++t) {
      const int64_t visible = std::min(keys, positions[t] + 1) - start;
      if (visible <= 0) continue;
      const int64_t used = std::min(count, visible);
      const int64_t used_tiles = (used + kAmxMaxRows - 1) / kAmxMaxRows;
      const int64_t used_steps = (used + kTileCols16 - 1) / kTileCols16;
      for (int64_t g = 0; g < groups; ++g) {
        const uint16_t* q = q_tiles.data() + (t * groups + g) * steps * kMlaTileElems;
        // Sᵀ, two tiles of 16 keys at a time: tiles 0-1 sum, 4-5 hold keys, 6 the queries.
        for (int64_t kt = 0; kt < used_tiles; kt += 2) {
          const bool two = kt + 1 < used_tiles;
          Tiles::template Zero<0>();
          if (two) Tiles::template Zero<1>();
          for (int64_t s = 0; s < steps; ++s) {
            Tiles::template Load<6>(q + s * kMlaTileElems, kTileBytes);
            Tiles::template Load<4>(key_tile[kt] + s * kTileCols16, key_stride[kt]);
            Tiles::template DotBf16<0, 4, 6>();
            if (two) {
              Tiles::template Load<5>(key_tile[kt + 1] + s * kTileCols16, key_stride[kt + 1]);
              Tiles::template DotBf16<1, 5, 6>();
            }
          }
          Tiles::template Store<0>(scores.data() + kt * kAmxMaxRows * kPanelRows, kTileBytes);
          if (two)
            Tiles::template Store<1>(scores.data() + (kt + 1) * kAmxMaxRows * kPanelRows,
                                     kTileBytes);
        }
        // Online softmax, a key's 16 heads in a row; keys past `used` get probability 0.
        float* run_mx = run_max.data() + (t * groups + g) * kPanelRows;
        float* run_sm = run_sum.data() + (t * groups + g) * kPanelRows;
        alignas(64) float chunk_max[kPanelRows], correction[kPanelRows], sum[kPanelRows];
        MlaChunkMax(scores.data(), used, scale, chunk_max);
        for (int64_t n = 0; n < kPanelRows; ++n) {
          const float new_max = std::max(run_mx[n], chunk_max[n]);
          correction[n] = ExpNonPositive(run_mx[n] - new_max);
          run_mx[n] = new_max;
        }
        MlaChunkProbabilities(scores.data(), used, used_steps * kTileCols16, run_mx, sum);
        for (int64_t n = 0; n < kPanelRows; ++n)
          run_sm[n] = __builtin_fmaf(run_sm[n], correction[n], sum[n]);
        // P's A tiles, 16 heads × 32 keys each, rounded to bf16.
        for (int64_t ks = 0; ks < used_steps; ++ks)
          for (int64_t n = 0; n < kPanelRows; ++n) {
            const float* column = scores.data() + ks * kTileCols16 * kPanelRows + n;
            uint16_t* row = probs.data() + ks * kMlaTileElems + n * kTileCols16;
            for (int64_t j = 0; j < kTileCols16; ++j)
              row[j] = F32ToBF16(column[j * kPanelRows]);
          }
        // P·V: tiles 0-3 hold P's key steps; per 16 latent dims, tile 4 sums them from zero.
        Tiles::template Load<0>(probs.data(), kTileBytes);
        if (used_steps > 1) Tiles::template Load<1>(probs.data() + kMlaTileElems, kTileBytes);
        if (used_steps > 2) Tiles::template Load<2>(probs.data() + 2 * kMlaTileElems, kTileBytes);
        if (used_steps > 3) Tiles::template Load<3>(probs.data() + 3 * kMlaTileElems, kTileBytes);
        const int64_t group_heads = std::min<int64_t>(kPanelRows, count_heads - g * kPanelRows);
        for (int64_t dt = 0; dt < dim_tiles; ++dt) {
          const uint16_t* v = values.data() + dt * kMlaTileElems;
          const int64_t vs = dim_tiles * kMlaTileElems;  // from one key step to the next
          Tiles::template Zero<4>();
          Tiles::template Load<6>(v, kTileBytes);
          Tiles::template DotBf16<4, 0, 6>();
          if (used_steps > 1) {
            Tiles::template Load<7>(v + vs, kTileBytes);
            Tiles::template DotBf16<4, 1, 7>();
          }
          if (used_steps > 2) {
            Tiles::template Load<6>(v + 2 * vs, kTileBytes);
            Tiles::template DotBf16<4, 2, 6>();
          }
          if (used_steps > 3) {
            Tiles::template Load<7>(v + 3 * vs, kTileBytes);
            Tiles::template DotBf16<4, 3, 7>();
          }
          Tiles::template Store<4>(pv.data(), kTileBytes);
          for (int64_t r = 0; r < group_heads; ++r) {
            float* o =
                o_latent + (t * heads + head_begin + g * kPanelRows + r) * latent + dt * kPanelRows;
            MlaScaleAdd(o, correction[r], pv.data() + r * kPanelRows);
          }
        }
      }
    }
  }
  Tiles::Release();
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t h = 0; h < count_heads; ++h) {
      const float total = run_sum[(t * groups + h / kPanelRows) * kPanelRows + h % kPanelRows];
      const float inverse = total > 0 ? 1.0f / total : 0.0f;
      float* o = o_latent + (t * heads + head_begin + h) * latent;
      for (int64_t d = 0; d < latent; ++d)
        o[d] *= inverse;
    }
}

// AmxPeakLoop: tiles 0-3 accumulate, 4-5 are A (16 rows), 6-7 B.
template <class Tiles>
SY_AMX_KERNEL double PeakLoopBody(bool bf16, int64_t iterations) {
  TileConfig config;
  for (int t = 0; t < kAmxTiles; ++t)
    config.Set(t, kAmxMaxRows, kTileBytes);
  Tiles::Configure(config);
  alignas(64) uint8_t ones[kAmxMaxRows * kTileBytes];
  for (int i = 0; i < kAmxMaxRows * kTileBytes; i += 2) {
    ones[i] = bf16 ? 0x80 : 1;  // bf16 1.0 is 0x3f80; int8 pairs of bytes 1
    ones[i + 1] = bf16 ? 0x3f : 1;
  }
  Tiles::template Zero<0>(), Tiles::template Zero<1>(), Tiles::template Zero<2>(),
      Tiles::template Zero<3>();
  Tiles::template Load<4>(ones, kTileBytes), Tiles::template Load<5>(ones, kTileBytes);
  Tiles::template Load<6>(ones, kTileBytes), Tiles::template Load<7>(ones, kTileBytes);
  for (int64_t i = 0; i < iterations; ++i) {
    if (bf16) {
      Tiles::template DotBf16<0, 4, 6>(), Tiles::template DotBf16<1, 4, 7>();
      Tiles::template DotBf16<2, 5, 6>(), Tiles::template DotBf16<3, 5, 7>();
    } else {
      Tiles::template DotUnsignedSigned<0, 4, 6>(), Tiles::template DotUnsignedSigned<1, 4, 7>();
      Tiles::template DotUnsignedSigned<2, 5, 6>(), Tiles::template DotUnsignedSigned<3, 5, 7>();
    }
  }
  alignas(64) uint8_t out[kAmxMaxRows * kTileBytes];
  Tiles::template Store<0>(out, kTileBytes);
  Tiles::Release();
  if (bf16) {
    float v;
    std::memcpy(&v, out, 4);
    return v;
  }
  int32_t v;
  std::memcpy(&v, out, 4);
  return v;
}

}  // namespace
}  // namespace sy::kernels
