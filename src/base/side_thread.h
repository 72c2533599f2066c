// One job at a time on a thread of its own, beside whatever the caller does meanwhile: Start(job)
// hands it over and returns at once, Wait() returns when it is done (and orders its writes before
// what the caller does next). The thread is made on the first Start, so an owner that never
// starts a job costs nothing.
#pragma once

#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>

namespace sy {

class SideThread {
 public:
  SideThread() = default;
  ~SideThread();
  SideThread(const SideThread&) = delete;
  SideThread& operator=(const SideThread&) = delete;

  // The previous job must have been waited for.
  void Start(std::function<void()> job);
  void Wait();

 private:
  void Loop();

  std::mutex mu_;
  std::condition_variable cv_;
  std::function<void()> job_;
  bool busy_ = false, stop_ = false;
  std::thread thread_;
};

}  // namespace sy
