// A fixed pool of worker threads for data-parallel loops. The caller's thread takes part, so a
// pool of N threads keeps N cores busy. Workers are pinned to cores when the OS allows it, so
// each keeps its caches warm across the many short loops of a forward step.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace sy {

// The cores this process may run on: the CPUs of its affinity mask (taskset, an MPI launcher's
// binding), capped by its cgroup's CPU quota (a container's --cpus), at least 1. The default
// size of a pool: a pool larger than this only makes its threads wait for each other's cores.
int UsableCores();
// Cores a cgroup v2 `cpu.max` line allows ("QUOTA PERIOD", rounded up), or 0 for no limit
// ("max PERIOD") or text that is not such a line.
int CoresFromCpuMax(const std::string& cpu_max);

class ThreadPool {
 public:
  // threads = 0 means one per usable core (UsableCores).
  explicit ThreadPool(int threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return static_cast<int>(workers_.size()) + 1; }

  // Runs body(begin, end) over [0, count) split into at most size() contiguous chunks of
  // near-equal length, and returns when all are done. Not reentrant. The split never changes;
  // which thread runs a chunk may: the caller, done with its own, runs any chunk whose worker has
  // not started it yet (asleep, or its core taken by another guest), rather than wait for it.
  void ParallelFor(size_t count, const std::function<void(size_t, size_t)>& body);
  // ParallelFor where the loop is worth waking the pool for; else body(0, count) on the caller.
  void ParallelForIf(bool worth_it, size_t count, const std::function<void(size_t, size_t)>& body) {
    if (worth_it)
      ParallelFor(count, body);
    else
      body(0, count);
  }

  // The process-wide pool used by the kernels.
  static ThreadPool& Global();
  // Sets the size of the global pool; must be called before its first use.
  static void ConfigureGlobal(int threads);

 private:
  void WorkerLoop(int index);
  // Takes chunk `index` of loop `generation` if nobody has; RunChunk runs it and counts it done.
  bool Claim(int index, size_t generation);
  void RunChunk(int index);

  // A forward step issues a hundred short loops; waking sleeping workers through the kernel for
  // each costs tens of microseconds on a VM. Workers therefore spin on `generation_` for a while
  // after each loop before sleeping on `start_`, and the caller spins on `pending_`. Both yield
  // the core every kSpinsPerYield polls: where threads outnumber the cores they get (a cgroup
  // quota, taskset, another busy process), a spinner would otherwise keep the thread it waits
  // for off its core until the scheduler's time slice ends, milliseconds per loop.
  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable start_;
  const std::function<void(size_t, size_t)>* body_ = nullptr;
  size_t count_ = 0;
  std::atomic<size_t> generation_{0};
  std::atomic<int> pending_{0};  // chunks of the current loop not finished yet
  // claimed_[i]: the last generation whose chunk i someone took (worker i, or the caller).
  std::unique_ptr<std::atomic<size_t>[]> claimed_;
  std::atomic<int> sleeping_{0};
  std::atomic<bool> stop_{false};
};

// body(i) for each i in [0, count) over the global pool when there are at least 64, else on the
// caller: for loops whose iterations each write their own output (packing a matrix row by row),
// so the bytes are the serial loop's.
inline void ParallelRows(int64_t count, const std::function<void(int64_t)>& body) {
  ThreadPool::Global().ParallelForIf(count >= 64, static_cast<size_t>(count),
                                     [&](size_t begin, size_t end) {
                                       for (size_t i = begin; i < end; ++i)
                                         body(static_cast<int64_t>(i));
                                     });
}

}  // namespace sy
