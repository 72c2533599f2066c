#include "base/thread_pool.h"

#include <pthread.h>
#include <sched.h>

#include <algorithm>

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

}  // namespace

ThreadPool::ThreadPool(int threads) {
  if (threads <= 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  for (int i = 1; i < threads; ++i) {
    workers_.emplace_back([this, i] { WorkerLoop(i); });
    PinToCore(workers_.back().native_handle(), i);
  }
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  start_.notify_all();
  for (auto& worker : workers_) worker.join();
}

static std::pair<size_t, size_t> ChunkOf(size_t count, int chunks, int index) {
  size_t base = count / chunks, extra = count % chunks;
  size_t begin = index * base + std::min<size_t>(index, extra);
  return {begin, begin + base + (static_cast<size_t>(index) < extra ? 1 : 0)};
}

void ThreadPool::ParallelFor(size_t count, const std::function<void(size_t, size_t)>& body) {
  if (count == 0) return;
  if (workers_.empty() || count == 1) {
    body(0, count);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    body_ = &body;
    count_ = count;
    pending_ = static_cast<int>(workers_.size());
    ++generation_;
  }
  start_.notify_all();
  auto [begin, end] = ChunkOf(count, size(), 0);
  if (begin < end) body(begin, end);
  std::unique_lock<std::mutex> lock(mutex_);
  done_.wait(lock, [this] { return pending_ == 0; });
  body_ = nullptr;
}

void ThreadPool::WorkerLoop(int index) {
  size_t seen_generation = 0;
  while (true) {
    const std::function<void(size_t, size_t)>* body;
    size_t count;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      start_.wait(lock, [&] { return stop_ || generation_ != seen_generation; });
      if (stop_) return;
      seen_generation = generation_;
      body = body_;
      count = count_;
    }
    auto [begin, end] = ChunkOf(count, size(), index);
    if (begin < end) (*body)(begin, end);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (--pending_ == 0) done_.notify_one();
    }
  }
}

ThreadPool& ThreadPool::Global() {
  static ThreadPool pool(g_global_threads);
  return pool;
}

void ThreadPool::ConfigureGlobal(int threads) { g_global_threads = threads; }

}  // namespace sy
