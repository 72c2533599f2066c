// Intel AMX's tile machine as the kernels in amx_kernels.h see it, and an emulator of it.
//
// The kernels are written once against a "Tiles" interface — configure, load, store, zero, and
// the two multiplies they use (TDPBUSD, TDPBF16PS), with tile numbers as template arguments as
// the intrinsics want them — and compiled twice: against the hardware (amx_hardware.cc, the
// intrinsics) and against EmulatedTiles below. The emulator follows the Intel SDM: the 64-byte
// palette-1 configuration is parsed and checked as LDTILECFG checks it, every operation checks
// the shapes its instruction requires (a #UD on hardware is an exception here), and the
// arithmetic is the SDM's pseudocode. It is what lets the kernels' tiling, packing and
// configuration be tested on every CPU, most of which have no AMX, and TDPBUSD's integer sums
// make the emulated int8 kernel's bits the hardware's.
#pragma once

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>

namespace sy::kernels {

inline constexpr int kAmxTiles = 8;          // palette 1: tmm0..tmm7
inline constexpr int kAmxMaxRows = 16;       // rows per tile
inline constexpr int kAmxMaxColsBytes = 64;  // bytes per tile row

// LDTILECFG's operand: palette 1, no restart row, rows and bytes per row for each tile used.
struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved0[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};

  void Set(int tile, int tile_rows, int bytes_per_row) {
    rows[tile] = static_cast<uint8_t>(tile_rows);
    colsb[tile] = static_cast<uint16_t>(bytes_per_row);
  }
};
static_assert(sizeof(TileConfig) == 64);

// The tile machine in software, one per thread as on hardware. Slow (scalar loops): for tests,
// and for running the AMX kernels' logic where the CPU has none (SWITCHYARD_AMX_EMULATE).
class EmulatedTiles {
 public:
  static void Configure(const TileConfig& config) {
    State& s = state();
    if (config.palette != 1) Fail("LDTILECFG: palette " + std::to_string(config.palette));
    if (config.start_row != 0) Fail("LDTILECFG: start_row must be 0");
    for (uint8_t b : config.reserved0)
      if (b != 0) Fail("LDTILECFG: reserved bytes must be 0");
    for (int t = 0; t < 16; ++t) {
      const int r = config.rows[t], c = config.colsb[t];
      if (t >= kAmxTiles && (r != 0 || c != 0)) Fail("LDTILECFG: palette 1 has 8 tiles");
      if (t < kAmxTiles && ((r == 0) != (c == 0) || r > kAmxMaxRows || c > kAmxMaxColsBytes))
        Fail("LDTILECFG: tile " + std::to_string(t) + " of " + std::to_string(r) + " rows x " +
             std::to_string(c) + " bytes");
    }
    s.config = config;
    s.configured = true;
    std::memset(s.tiles, 0, sizeof(s.tiles));
  }
  static void Release() { state() = State{}; }

  template <int T>
  static void Zero() {
    Tile& t = Configured<T>();
    std::memset(t.bytes, 0, sizeof(t.bytes));
  }
  // TILELOADD: the tile's rows from base + row · stride, the rest of the tile zeroed.
  template <int T>
  static void Load(const void* base, int64_t stride) {
    Tile& t = Configured<T>();
    std::memset(t.bytes, 0, sizeof(t.bytes));
    for (int r = 0; r < Rows(T); ++r)
      std::memcpy(t.bytes[r], static_cast<const uint8_t*>(base) + r * stride, ColsBytes(T));
  }
  template <int T>
  static void Store(void* base, int64_t stride) {
    Tile& t = Configured<T>();
    for (int r = 0; r < Rows(T); ++r)
      std::memcpy(static_cast<uint8_t*>(base) + r * stride, t.bytes[r], ColsBytes(T));
  }

  // TDPBUSD: C[m][n] += Σ_k Σ_i u8(A[m][4k + i]) · s8(B[k][4n + i]), int32, wrapping.
  template <int C, int A, int B>
  static void DotUnsignedSigned() {
    DotBytes<C, A, B, uint8_t, int8_t>("TDPBUSD");
  }
  // TDPBSUD: the same with A signed and B unsigned.
  template <int C, int A, int B>
  static void DotSignedUnsigned() {
    DotBytes<C, A, B, int8_t, uint8_t>("TDPBSUD");
  }

  // TDPBF16PS as the SDM writes it: per output, the even and the odd products of the pairs
  // summed in two f32 chains from 0 (each step an FMA of an exact bf16 product, nearest even),
  // the two chains added, and that added to C. Input denormals are read as 0 and denormal
  // results flushed to 0; MXCSR plays no part.
  template <int C, int A, int B>
  static void DotBf16() {
    CheckDotShapes<C, A, B>("TDPBF16PS");
    Tile &c = state().tiles[C], &a = state().tiles[A], &b = state().tiles[B];
    for (int m = 0; m < Rows(C); ++m) {
      for (int n = 0; n < ColsBytes(C) / 4; ++n) {
        float even = 0, odd = 0;
        for (int k = 0; k < ColsBytes(A) / 4; ++k) {
          even = Flush(__builtin_fmaf(Bf16(a.bytes[m], 2 * k), Bf16(b.bytes[k], 2 * n), even));
          odd =
              Flush(__builtin_fmaf(Bf16(a.bytes[m], 2 * k + 1), Bf16(b.bytes[k], 2 * n + 1), odd));
        }
        float acc;
        std::memcpy(&acc, c.bytes[m] + 4 * n, 4);
        acc = Flush(Flush(acc) + Flush(even + odd));
        std::memcpy(c.bytes[m] + 4 * n, &acc, 4);
      }
    }
  }

 private:
  struct Tile {
    uint8_t bytes[kAmxMaxRows][kAmxMaxColsBytes];
  };
  struct State {
    TileConfig config;
    bool configured = false;
    Tile tiles[kAmxTiles] = {};
  };
  static State& state() {
    thread_local State s;
    return s;
  }
  [[noreturn]] static void Fail(const std::string& what) {
    throw std::logic_error("AMX (emulated): " + what);
  }
  static int Rows(int t) { return state().config.rows[t]; }
  static int ColsBytes(int t) { return state().config.colsb[t]; }
  template <int T>
  static Tile& Configured() {
    static_assert(T >= 0 && T < kAmxTiles);
    if (!state().configured || Rows(T) == 0)
      Fail("tile " + std::to_string(T) + " used while not configured");
    return state().tiles[T];
  }
  template <int C, int A, int B>
  static void CheckDotShapes(const char* name) {
    static_assert(C != A && C != B && A != B, "the three tiles must differ");
    Configured<C>(), Configured<A>(), Configured<B>();
    // The SDM's #UD conditions for the dot products.
    if (Rows(C) != Rows(A) || ColsBytes(C) != ColsBytes(B) || ColsBytes(A) / 4 != Rows(B))
      Fail(std::string(name) + ": shapes C " + std::to_string(Rows(C)) + "x" +
           std::to_string(ColsBytes(C)) + ", A " + std::to_string(Rows(A)) + "x" +
           std::to_string(ColsBytes(A)) + ", B " + std::to_string(Rows(B)) + "x" +
           std::to_string(ColsBytes(B)));
  }
  template <int C, int A, int B, typename AByte, typename BByte>
  static void DotBytes(const char* name) {
    CheckDotShapes<C, A, B>(name);
    Tile &c = state().tiles[C], &a = state().tiles[A], &b = state().tiles[B];
    for (int m = 0; m < Rows(C); ++m) {
      for (int n = 0; n < ColsBytes(C) / 4; ++n) {
        uint32_t sum;
        std::memcpy(&sum, c.bytes[m] + 4 * n, 4);
        for (int k = 0; k < ColsBytes(A) / 4; ++k)
          for (int i = 0; i < 4; ++i)
            sum += static_cast<uint32_t>(
                static_cast<int32_t>(static_cast<AByte>(a.bytes[m][4 * k + i])) *
                static_cast<BByte>(b.bytes[k][4 * n + i]));
        std::memcpy(c.bytes[m] + 4 * n, &sum, 4);
      }
    }
  }
  static float Bf16(const uint8_t* row, int index) {
    uint16_t bits;
    std::memcpy(&bits, row + 2 * index, 2);
    if ((bits & 0x7f80) == 0) bits &= 0x8000;  // denormal (or zero) read as zero
    const uint32_t wide = static_cast<uint32_t>(bits) << 16;
    float value;
    std::memcpy(&value, &wide, 4);
    return value;
  }
  static float Flush(float value) {
    uint32_t bits;
    std::memcpy(&bits, &value, 4);
    if ((bits & 0x7f800000u) == 0) bits &= 0x80000000u;
    std::memcpy(&value, &bits, 4);
    return value;
  }
};

}  // namespace sy::kernels
