// The kernel thread pool: every index runs exactly once per loop, in the same chunks, whether a
// worker takes its chunk or the caller takes it because the worker is asleep or late.
#include <gtest/gtest.h>

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

// After a pause long enough for the workers to stop spinning and sleep, loops still complete and
// cover every index once: the caller runs a sleeping worker's chunk itself, or the worker wakes
// and runs it, never both.
TEST(ThreadPoolTest, LoopsAfterTheWorkersSleepStillRunEveryIndexOnce) {
  ThreadPool pool(2);
  for (int round = 0; round < 20; ++round) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    for (int loop = 0; loop < 50; ++loop) {
      std::vector<int> hits(8, 0);
      pool.ParallelFor(hits.size(), [&](size_t begin, size_t end) {
        for (size_t i = begin; i < end; ++i)
          ++hits[i];
      });
      for (int h : hits)
        ASSERT_EQ(h, 1) << "round " << round << " loop " << loop;
    }
  }
}

}  // namespace
}  // namespace sy
