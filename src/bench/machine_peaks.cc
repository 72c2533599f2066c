#include "bench/machine_peaks.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "base/clock.h"
#include "base/thread_pool.h"
#include "kernels/cpu/amx_kernels.h"
#include "kernels/cpu/bf16_gemm.h"
#include "kernels/cpu/int8_gemm.h"
#include "tensor/packed_matrix.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "bench/machine_peaks.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

HWY_BEFORE_NAMESPACE();
namespace sy::bench::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Sums `count` floats with four accumulators (reads only).
float ReadSumImpl(const float* data, size_t count) {
  const hn::ScalableTag<float> df;
  const size_t N = hn::Lanes(df);
  auto a0 = hn::Zero(df), a1 = a0, a2 = a0, a3 = a0;
  size_t i = 0;
  for (; i + 4 * N <= count; i += 4 * N) {
    a0 = hn::Add(a0, hn::Load(df, data + i));
    a1 = hn::Add(a1, hn::Load(df, data + i + N));
    a2 = hn::Add(a2, hn::Load(df, data + i + 2 * N));
    a3 = hn::Add(a3, hn::Load(df, data + i + 3 * N));
  }
  return hn::GetLane(hn::SumOfLanes(df, hn::Add(hn::Add(a0, a1), hn::Add(a2, a3))));
}

// a = b + s·c (STREAM triad).
void TriadImpl(float* a, const float* b, const float* c, float s, size_t count) {
  const hn::ScalableTag<float> df;
  const size_t N = hn::Lanes(df);
  const auto scale = hn::Set(df, s);
  for (size_t i = 0; i + N <= count; i += N)
    hn::Stream(hn::MulAdd(scale, hn::Load(df, c + i), hn::Load(df, b + i)), df, a + i);
}

// Independent FMA chains: enough to hide the latency (4–5 cycles × 2 pipes), and few enough to
// stay in registers next to the two constants: x86 below AVX-512 has 16 vector registers, and 16
// chains there would spill and measure loads and stores instead of the FMA peak.
#if HWY_ARCH_X86 && HWY_TARGET > HWY_AVX3
constexpr int kFmaChains = 12;
#else
constexpr int kFmaChains = 16;
#endif

int FmaChainsImpl() {
  return kFmaChains;
}

// `iterations` × kFmaChains independent FMA chains; returns a value so the work is not discarded.
float FmaLoopImpl(int64_t iterations) {
  const hn::ScalableTag<float> df;
  hn::Vec<decltype(df)> acc[kFmaChains];
  for (int i = 0; i < kFmaChains; ++i)
    acc[i] = hn::Set(df, 1.0f + i * 1e-3f);
  const auto m = hn::Set(df, 0.999999f), a = hn::Set(df, 1e-7f);
  for (int64_t it = 0; it < iterations; ++it)
#pragma GCC unroll 16
    for (int i = 0; i < kFmaChains; ++i)
      acc[i] = hn::MulAdd(acc[i], m, a);
  auto total = acc[0];
  for (int i = 1; i < kFmaChains; ++i)
    total = hn::Add(total, acc[i]);
  return hn::GetLane(total);
}

size_t FloatLanesImpl() {
  return hn::Lanes(hn::ScalableTag<float>());
}

}  // namespace sy::bench::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace sy::bench {
namespace {

HWY_EXPORT(ReadSumImpl);
HWY_EXPORT(TriadImpl);
HWY_EXPORT(FmaLoopImpl);
HWY_EXPORT(FmaChainsImpl);
HWY_EXPORT(FloatLanesImpl);

#if defined(__x86_64__)
// 16 independent VDPBF16PS chains: 16 lanes × 2 products × 2 flops = 64 flops each.
__attribute__((target("avx512f,avx512bf16"))) float Bf16LoopAvx512(int64_t iterations) {
  __m512 acc[16];
  for (int i = 0; i < 16; ++i)
    acc[i] = _mm512_set1_ps(static_cast<float>(i));
  const __m512bh a = reinterpret_cast<__m512bh>(_mm512_set1_epi32(0x3f803f80));  // (1, 1) in bf16
  const __m512bh b = reinterpret_cast<__m512bh>(_mm512_set1_epi32(0x33803380));  // tiny
  for (int64_t it = 0; it < iterations; ++it)
    for (int i = 0; i < 16; ++i)
      acc[i] = _mm512_dpbf16_ps(acc[i], a, b);
  __m512 total = acc[0];
  for (int i = 1; i < 16; ++i)
    total = _mm512_add_ps(total, acc[i]);
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, total);
  return lanes[0];  // one lane keeps the work alive (GCC 12's reduce warns in its own header)
}

// 12 independent chains of the int8 kernel's step (32 byte products each), written as the
// kernel writes it (one asm block per chain step, the ones vector from memory).
alignas(32) const int16_t kOnes[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1};
__attribute__((target("avx2"))) int Int8LoopAvx2(int64_t iterations) {
  // Named accumulators: GCC keeps an array of vectors on the stack, and the loop then measures
  // stores and loads.
#define SY_CHAINS(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)
#define SY_DECLARE(i) __m256i acc##i = _mm256_set1_epi32(i);
  SY_CHAINS(SY_DECLARE)
  const __m256i x = _mm256_set1_epi8(3), w = _mm256_set1_epi8(-2);
  for (int64_t it = 0; it < iterations; ++it) {
#define SY_STEP(i)                                    \
  {                                                   \
    __m256i t;                                        \
    asm("vpmaddubsw %[w], %[x], %[t]\n\t"             \
        "vpmaddwd %[ones], %[t], %[t]\n\t"            \
        "vpaddd %[t], %[a], %[a]"                     \
        : [a] "+x"(acc##i), [t] "=&x"(t)              \
        : [x] "x"(x), [w] "x"(w), [ones] "m"(kOnes)); \
  }
    SY_CHAINS(SY_STEP)
  }
  __m256i total = _mm256_setzero_si256();
#define SY_SUM(i) total = _mm256_add_epi32(total, acc##i);
  SY_CHAINS(SY_SUM)
#undef SY_SUM
#undef SY_STEP
#undef SY_DECLARE
#undef SY_CHAINS
  return _mm256_extract_epi32(total, 0);
}

// The AVX-512 VNNI kernel's step: VPDPBUSD on 512-bit vectors (64 byte products) in 16 chains,
// enough to cover its latency (4–5 cycles) at up to two per cycle; asm as in the kernel (through
// the intrinsic GCC copies each accumulator to a scratch register and back).
__attribute__((target("avx512f,avx512bw,avx512vnni"))) int Int8LoopVnni(int64_t iterations) {
#define SY_CHAINS(X) \
  X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11) X(12) X(13) X(14) X(15)
#define SY_DECLARE(i) __m512i acc##i = _mm512_set1_epi32(i);
  SY_CHAINS(SY_DECLARE)
  const __m512i x = _mm512_set1_epi8(3), w = _mm512_set1_epi8(-2);
  for (int64_t it = 0; it < iterations; ++it) {
#define SY_STEP(i) asm("vpdpbusd %[w], %[x], %[a]" : [a] "+v"(acc##i) : [x] "v"(x), [w] "v"(w));
    SY_CHAINS(SY_STEP)
  }
  __m512i total = _mm512_setzero_si512();
#define SY_SUM(i) total = _mm512_add_epi32(total, acc##i);
  SY_CHAINS(SY_SUM)
#undef SY_SUM
#undef SY_STEP
#undef SY_DECLARE
#undef SY_CHAINS
  alignas(64) int32_t lanes[16];
  _mm512_store_si512(lanes, total);
  return lanes[0];  // one lane keeps the work alive
}
#endif

volatile int g_int_sink;

double Median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

// Runs body(thread index) on every thread of the pool at once; returns the wall time.
double TimeOnAllThreads(const std::function<void(int)>& body) {
  ThreadPool& pool = ThreadPool::Global();
  const double start = NowSeconds();
  pool.ParallelFor(static_cast<size_t>(pool.size()), [&](size_t begin, size_t end) {
    for (size_t t = begin; t < end; ++t)
      body(static_cast<int>(t));
  });
  return NowSeconds() - start;
}

volatile float g_sink;

}  // namespace

int64_t LastLevelCacheBytes() {
  namespace fs = std::filesystem;
  int best_level = 0;
  int64_t total = 0;
  std::set<std::string> seen;  // one entry per cache instance: its shared_cpu_list
  std::error_code ec;
  for (const auto& cpu : fs::directory_iterator("/sys/devices/system/cpu", ec)) {
    const std::string name = cpu.path().filename().string();
    if (name.rfind("cpu", 0) != 0 || name.size() < 4 || !std::isdigit(name[3])) continue;
    for (const auto& index : fs::directory_iterator(cpu.path() / "cache", ec)) {
      auto read = [&](const char* file) {
        std::ifstream in(index.path() / file);
        std::string value;
        std::getline(in, value);
        return value;
      };
      const int level = std::atoi(read("level").c_str());
      const std::string type = read("type"), size = read("size"), shared = read("shared_cpu_list");
      if (type == "Instruction" || size.empty()) continue;
      int64_t bytes = std::atoll(size.c_str());
      if (size.back() == 'K') bytes <<= 10;
      if (size.back() == 'M') bytes <<= 20;
      if (level > best_level) {
        best_level = level;
        total = 0;
        seen.clear();
      }
      if (level == best_level && seen.insert(shared).second) total += bytes;
    }
  }
  if (total > 0) return total;
  const long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
  return l3 > 0 ? l3 : 0;
}

int64_t StreamingBytes(int64_t at_least) {
  const int64_t twice_and_more = LastLevelCacheBytes() * 5 / 2;
  const int64_t mib = 1ll << 20;
  return (std::max(at_least, twice_and_more) + mib - 1) / mib * mib;
}

namespace {

size_t FloatsIn(int64_t buffer_bytes) {
  return static_cast<size_t>(buffer_bytes) / sizeof(float) / 64 * 64;
}

// `floats` floats, first touched on every thread's own slice (NUMA-friendly), non-zero; in huge
// pages, as the packed weights are (AllocatePanels): a peak read through 4 KiB pages measures
// page walks as much as memory (on a VM, 25-26 GB/s through 4 KiB pages where huge pages give
// 39-49, AMD EPYC Zen 4, 2 threads).
struct Touched {
  std::shared_ptr<uint8_t> owner;
  float* data;
};
Touched AllocateTouched(size_t floats) {
  Touched t{AllocatePanels(floats * sizeof(float)), nullptr};
  t.data = reinterpret_cast<float*>(t.owner.get());
  float* p = t.data;
  ThreadPool::Global().ParallelFor(floats, [&](size_t begin, size_t end) {
    for (size_t i = begin; i < end; ++i)
      p[i] = 1.0f;
  });
  return t;
}

// Thread t's slice of a buffer of `floats`: (offset, count).
std::pair<size_t, size_t> Slice(size_t floats, int t) {
  const size_t per = floats / ThreadPool::Global().size() / 64 * 64;
  return {t * per, per};
}

// One streaming read of the buffer on all threads, GB/s.
double ReadOnce(const float* a, size_t floats) {
  const double seconds = TimeOnAllThreads([&](int t) {
    auto [offset, count] = Slice(floats, t);
    g_sink = HWY_DYNAMIC_DISPATCH(ReadSumImpl)(a + offset, count);
  });
  return static_cast<double>(Slice(floats, 0).second) * ThreadPool::Global().size() * 4 / seconds /
         1e9;
}

}  // namespace

ReadBandwidthProbe::ReadBandwidthProbe(int64_t buffer_bytes)
    : data_(AllocateTouched(FloatsIn(buffer_bytes)).owner), floats_(FloatsIn(buffer_bytes)) {}

ReadBandwidthProbe::~ReadBandwidthProbe() = default;

double ReadBandwidthProbe::MeasureGbps(int repetitions) {
  std::vector<double> read;
  for (int r = 0; r < repetitions; ++r)
    read.push_back(ReadOnce(reinterpret_cast<const float*>(data_.get()), floats_));
  return Median(read);
}

MachinePeaks MeasureMachine(int64_t buffer_bytes, int repetitions) {
  MachinePeaks peaks;
  ThreadPool& pool = ThreadPool::Global();
  peaks.threads = pool.size();
  peaks.llc_bytes = LastLevelCacheBytes();
  peaks.stream_bytes = buffer_bytes;
  const size_t floats = FloatsIn(buffer_bytes);
  const Touched buffers[3] = {AllocateTouched(floats), AllocateTouched(floats),
                              AllocateTouched(floats)};
  float *a = buffers[0].data, *b = buffers[1].data, *c = buffers[2].data;
  const int threads = pool.size();
  auto slice = [&](int t) { return Slice(floats, t); };

  std::vector<double> read, triad, f32, bf16, int8, amx_bf16, amx_int8;
  for (int r = 0; r < repetitions; ++r) {
    read.push_back(ReadOnce(a, floats));
    double seconds = TimeOnAllThreads([&](int t) {
      auto [offset, count] = slice(t);
      HWY_DYNAMIC_DISPATCH(TriadImpl)(a + offset, b + offset, c + offset, 0.5f, count);
    });
    triad.push_back(static_cast<double>(slice(0).second) * threads * 12 / seconds / 1e9);
  }
  const int64_t iterations = 20'000'000;
  const double lanes = static_cast<double>(HWY_DYNAMIC_DISPATCH(FloatLanesImpl)());
  const double chains = HWY_DYNAMIC_DISPATCH(FmaChainsImpl)();
  for (int r = 0; r < repetitions; ++r) {
    double seconds =
        TimeOnAllThreads([&](int) { g_sink = HWY_DYNAMIC_DISPATCH(FmaLoopImpl)(iterations); });
    f32.push_back(iterations * chains * lanes * 2 * threads / seconds / 1e9);
#if defined(__x86_64__)
    if (kernels::HasAvx512Bf16()) {
      seconds = TimeOnAllThreads([&](int) { g_sink = Bf16LoopAvx512(iterations); });
      bf16.push_back(iterations * 16.0 * 64 * threads / seconds / 1e9);
    }
    // The instruction the int8 kernel in use runs.
    if (kernels::ActiveInt8Kernel() == kernels::Int8Kernel::kAvx512Vnni) {
      seconds = TimeOnAllThreads([&](int) { g_int_sink = Int8LoopVnni(iterations); });
      int8.push_back(iterations * 16.0 * 128 * threads / seconds / 1e9);
    } else if (kernels::ActiveInt8Kernel() == kernels::Int8Kernel::kAvx2) {
      seconds = TimeOnAllThreads([&](int) { g_int_sink = Int8LoopAvx2(iterations); });
      int8.push_back(iterations * 12.0 * 64 * threads / seconds / 1e9);
    }
#endif
    if (kernels::ActiveAmxBackend() == kernels::AmxBackend::kHardware) {
      constexpr int64_t kRounds = 1'000'000;  // 4 tile multiplies of 16 cycles each a round
      for (bool tile_bf16 : {true, false}) {
        seconds = TimeOnAllThreads([&](int) {
          g_sink = static_cast<float>(
              kernels::AmxPeakLoop(kernels::AmxBackend::kHardware, tile_bf16, kRounds));
        });
        (tile_bf16 ? amx_bf16 : amx_int8)
            .push_back(kRounds * kernels::AmxOpsPerRound(tile_bf16) * threads / seconds / 1e9);
      }
    }
  }
  peaks.read_gbps = Median(read);
  peaks.triad_gbps = Median(triad);
  peaks.f32_gflops = Median(f32);
  peaks.bf16_gflops = bf16.empty() ? peaks.f32_gflops : Median(bf16);
  peaks.int8_gops = int8.empty() ? 0 : Median(int8);
  peaks.amx_bf16_gflops = amx_bf16.empty() ? 0 : Median(amx_bf16);
  peaks.amx_int8_gops = amx_int8.empty() ? 0 : Median(amx_int8);
  return peaks;
}

}  // namespace sy::bench
#endif
