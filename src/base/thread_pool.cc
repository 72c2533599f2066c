#include "base/thread_pool.h"

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <sstream>

namespace sy {
namespace {

int g_global_threads = 0;

void PinToCore(std::thread::native_handle_type handle, int core) {
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  if (sched_getaffinity(0, sizeof(allowed), &allowed) != 0) return;
  int count = CPU_COUNT(&allowed);
  if (count <= 1) return;
  int seen = 0;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (!CPU_ISSET(cpu, &allowed)) continue;
    if (seen++ == core % count) {
      cpu_set_t one;
      CPU_ZERO(&one);
      CPU_SET(cpu, &one);
      pthread_setaffinity_np(handle, sizeof(one), &one);  // best effort
      return;
    }
  }
}

// The text of a small file, or "" when it cannot be read.
std::string ReadSmallFile(const char* path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return in ? text.str() : std::string();
}

}  // namespace

int CoresFromCpuMax(const std::string& cpu_max) {
  std::istringstream in(cpu_max);
  std::string quota;
  long long period = 0;
  if (!(in >> quota >> period) || period <= 0 || quota == "max") return 0;
  char* end = nullptr;
  const long long limit = std::strtoll(quota.c_str(), &end, 10);
  if (end == quota.c_str() || *end != '\0' || limit <= 0) return 0;
  return static_cast<int>(std::min<long long>((limit + period - 1) / period, 1 << 20));
}

int UsableCores() {
  int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  if (sched_getaffinity(0, sizeof(allowed), &allowed) == 0 && CPU_COUNT(&allowed) > 0)
    cores = std::min(cores, CPU_COUNT(&allowed));
  // cgroup v2 (the unified hierarchy at /sys/fs/cgroup inside a container), then v1.
  int quota = CoresFromCpuMax(ReadSmallFile("/sys/fs/cgroup/cpu.max"));
  if (quota == 0) {
    const std::string v1 = ReadSmallFile("/sys/fs/cgroup/cpu/cpu.cfs_quota_us") + " " +
                           ReadSmallFile("/sys/fs/cgroup/cpu/cpu.cfs_period_us");
    quota = CoresFromCpuMax(v1.rfind("-1", 0) == 0 ? std::string() : v1);
  }
  if (quota > 0) cores = std::min(cores, quota);
  return std::max(1, cores);
}

ThreadPool::ThreadPool(int threads) {
  if (threads <= 0) threads = UsableCores();
  claimed_ = std::make_unique<std::atomic<size_t>[]>(static_cast<size_t>(threads));
  for (int i = 0; i < threads; ++i)
    claimed_[i].store(0, std::memory_order_relaxed);
  for (int i = 1; i < threads; ++i) {
    workers_.emplace_back([this, i] { WorkerLoop(i); });
    PinToCore(workers_.back().native_handle(), i);
  }
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_.store(true);
  }
  start_.notify_all();
  for (auto& worker : workers_)
    worker.join();
}

static std::pair<size_t, size_t> ChunkOf(size_t count, int chunks, int index) {
  size_t base = count / chunks, extra = count % chunks;
  size_t begin = index * base + std::min<size_t>(index, extra);
  return {begin, begin + base + (static_cast<size_t>(index) < extra ? 1 : 0)};
}

static inline void CpuRelax() {
#if defined(__x86_64__)
  __builtin_ia32_pause();
#endif
}

// Polls between yields: tens of microseconds, long past the wait of a loop whose threads all run
// (so a pool with its cores to itself almost never yields), short against a time slice.
constexpr int kSpinsPerYield = 1024;

// One poll of a spin-wait: a pause, and now and then the rest of the time slice to whatever else
// waits for this core (with nothing else runnable sched_yield returns at once).
static inline void SpinOnce(int spin) {
  CpuRelax();
  if (spin % kSpinsPerYield == kSpinsPerYield - 1) sched_yield();
}

void ThreadPool::ParallelFor(size_t count, const std::function<void(size_t, size_t)>& body) {
  if (count == 0) return;
  if (workers_.empty() || count == 1) {
    body(0, count);
    return;
  }
  body_ = &body;
  count_ = count;
  pending_.store(static_cast<int>(workers_.size()), std::memory_order_relaxed);
  size_t generation;
  {
    // Publish under the lock so a worker about to sleep cannot miss the new generation.
    std::lock_guard<std::mutex> lock(mutex_);
    generation = generation_.fetch_add(1, std::memory_order_release) + 1;
  }
  if (sleeping_.load(std::memory_order_acquire) > 0) start_.notify_all();
  auto [begin, end] = ChunkOf(count, size(), 0);
  if (begin < end) body(begin, end);
  // Chunks no worker has taken yet: run them here instead of waiting for a worker to wake.
  for (int index = 1; index < size(); ++index)
    if (Claim(index, generation)) RunChunk(index);
  for (int spin = 0; pending_.load(std::memory_order_acquire) != 0; ++spin)
    SpinOnce(spin);
  body_ = nullptr;
}

bool ThreadPool::Claim(int index, size_t generation) {
  size_t last = claimed_[index].load(std::memory_order_acquire);
  // Generations only grow, and the caller does not start generation g + 1 before every chunk of
  // g is done: a successful claim for g means g is the loop in progress.
  return last < generation &&
         claimed_[index].compare_exchange_strong(last, generation, std::memory_order_acq_rel);
}

void ThreadPool::RunChunk(int index) {
  auto [begin, end] = ChunkOf(count_, size(), index);
  if (begin < end) (*body_)(begin, end);
  pending_.fetch_sub(1, std::memory_order_acq_rel);
}

void ThreadPool::WorkerLoop(int index) {
  size_t seen = 0;
  constexpr int kSpins = 200000;  // roughly 1-5 ms of polling before sleeping
  while (true) {
    size_t current = generation_.load(std::memory_order_acquire);
    for (int spin = 0; current == seen && spin < kSpins && !stop_.load(std::memory_order_relaxed);
         ++spin) {
      SpinOnce(spin);
      current = generation_.load(std::memory_order_acquire);
    }
    if (current == seen) {
      std::unique_lock<std::mutex> lock(mutex_);
      sleeping_.fetch_add(1, std::memory_order_acq_rel);
      start_.wait(lock, [&] { return stop_.load() || generation_.load() != seen; });
      sleeping_.fetch_sub(1, std::memory_order_acq_rel);
      if (stop_.load()) return;
      current = generation_.load(std::memory_order_acquire);
    }
    if (stop_.load()) return;
    seen = current;
    if (Claim(index, current)) RunChunk(index);  // else the caller took it (or is past it)
  }
}

ThreadPool& ThreadPool::Global() {
  static ThreadPool pool(g_global_threads);
  return pool;
}

void ThreadPool::ConfigureGlobal(int threads) {
  g_global_threads = threads;
}

}  // namespace sy
