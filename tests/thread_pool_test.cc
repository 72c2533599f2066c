// The kernel thread pool: every index runs exactly once per loop, in the same chunks, whether a
// worker takes its chunk or the caller takes it because the worker is asleep or late.
#include <gtest/gtest.h>
#include <sched.h>

#include <algorithm>
#include <chrono>
#include <mutex>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include "base/thread_pool.h"

namespace sy {
namespace {

TEST(ThreadPoolTest, EveryIndexOnceInFixedChunks) {
  for (int threads : {1, 2, 3}) {
    ThreadPool pool(threads);
    std::vector<int> hits(64);
    for (int loop = 0; loop < 20000; ++loop) {
      const size_t count = 1 + static_cast<size_t>(loop) % 11;
      std::fill(hits.begin(), hits.end(), 0);
      std::mutex mutex;
      std::set<std::pair<size_t, size_t>> chunks;
      pool.ParallelFor(count, [&](size_t begin, size_t end) {
        for (size_t i = begin; i < end; ++i)
          ++hits[i];
        std::lock_guard<std::mutex> lock(mutex);
        chunks.insert({begin, end});
      });
      for (size_t i = 0; i < count; ++i)
        ASSERT_EQ(hits[i], 1) << "threads " << threads << " count " << count << " index " << i;
      // The split depends on count and the pool's size only: near-equal contiguous chunks.
      const size_t parts = std::min<size_t>(count, static_cast<size_t>(threads));
      ASSERT_EQ(chunks.size(), parts) << "threads " << threads << " count " << count;
      for (const auto& [begin, end] : chunks) {
        EXPECT_GE(end - begin, count / threads);
        EXPECT_LE(end - begin, count / threads + 1);
      }
    }
  }
}

// How many times each of `count` indices ran in one loop of the pool.
std::vector<int> HitsOfOneLoop(ThreadPool& pool, size_t count) {
  std::vector<int> hits(count, 0);
  pool.ParallelFor(count, [&](size_t begin, size_t end) {
    for (size_t i = begin; i < end; ++i)
      ++hits[i];
  });
  return hits;
}

// After a pause long enough for the workers to stop spinning and sleep, loops still complete and
// cover every index once: the caller runs a sleeping worker's chunk itself, or the worker wakes
// and runs it, never both.
TEST(ThreadPoolTest, LoopsAfterTheWorkersSleepStillRunEveryIndexOnce) {
  ThreadPool pool(2);
  for (int round = 0; round < 20; ++round) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    for (int loop = 0; loop < 50; ++loop)
      for (int h : HitsOfOneLoop(pool, 8))
        ASSERT_EQ(h, 1) << "round " << round << " loop " << loop;
  }
}

// A pool larger than its cores makes its spinning threads wait on each other: with every thread
// on one core, loops still finish and cover every index once (the spinners yield the core).
TEST(ThreadPoolTest, ThreeThreadsOnOneCoreFinishEveryLoop) {
  std::thread confined([] {
    cpu_set_t allowed;
    CPU_ZERO(&allowed);
    ASSERT_EQ(sched_getaffinity(0, sizeof(allowed), &allowed), 0);
    int first = 0;
    while (!CPU_ISSET(first, &allowed))
      ++first;
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(first, &one);
    ASSERT_EQ(sched_setaffinity(0, sizeof(one), &one), 0);
    // The default size follows the affinity mask: one core here.
    EXPECT_EQ(UsableCores(), 1);
    ThreadPool pool(3);  // its workers inherit the one-core mask
    for (int loop = 0; loop < 2000; ++loop)
      for (int h : HitsOfOneLoop(pool, 9))
        ASSERT_EQ(h, 1) << "loop " << loop;
  });
  confined.join();
}

TEST(ThreadPoolTest, UsableCoresStaysWithinTheMachine) {
  const int cores = UsableCores();
  EXPECT_GE(cores, 1);
  EXPECT_LE(cores, static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
}

TEST(ThreadPoolTest, CgroupCpuMaxGivesWholeCoresRoundedUp) {
  EXPECT_EQ(CoresFromCpuMax("max 100000\n"), 0);
  EXPECT_EQ(CoresFromCpuMax("200000 100000\n"), 2);
  EXPECT_EQ(CoresFromCpuMax("150000 100000"), 2);
  EXPECT_EQ(CoresFromCpuMax("50000 100000"), 1);
  EXPECT_EQ(CoresFromCpuMax("100000 50000 5"), 2);  // anything after the pair is ignored
  EXPECT_EQ(CoresFromCpuMax(""), 0);
  EXPECT_EQ(CoresFromCpuMax("garbage"), 0);
  EXPECT_EQ(CoresFromCpuMax("12x 100000"), 0);
  EXPECT_EQ(CoresFromCpuMax("100000 0"), 0);
  EXPECT_EQ(CoresFromCpuMax("-5 100000"), 0);
}

}  // namespace
}  // namespace sy
