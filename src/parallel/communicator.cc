#include "parallel/communicator.h"

#include <mpi.h>

#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>

namespace sy {
namespace {

class SingleProcess final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  void AllToAll(const int64_t* send, int64_t* recv, int64_t per_rank) override {
    std::memcpy(recv, send, static_cast<size_t>(per_rank) * sizeof(int64_t));
  }
  class Done final : public Exchange {
   public:
    void Wait() override {}
  };
  std::unique_ptr<Exchange> StartAllToAllV(const void* send, const std::vector<int64_t>& send_bytes,
                                           const std::vector<int64_t>& send_offsets, void* recv,
                                           const std::vector<int64_t>&,
                                           const std::vector<int64_t>& recv_offsets) override {
    if (send_bytes[0] > 0)
      std::memcpy(static_cast<uint8_t*>(recv) + recv_offsets[0],
                  static_cast<const uint8_t*>(send) + send_offsets[0],
                  static_cast<size_t>(send_bytes[0]));
    return std::make_unique<Done>();
  }
  int64_t AllReduceMax(int64_t value) override { return value; }
  int64_t AllReduceSum(int64_t value) override { return value; }
  std::vector<uint8_t> GatherToRoot(const std::vector<uint8_t>& bytes) override { return bytes; }
  std::vector<uint8_t> Broadcast(const std::vector<uint8_t>& bytes) override { return bytes; }
  void AllReduceSumFloats(float*, int64_t) override {}
  std::vector<uint8_t> AllGather(const std::vector<uint8_t>& bytes) override { return bytes; }
  std::unique_ptr<Communicator> Split(int) override { return std::make_unique<SingleProcess>(); }
  std::unique_ptr<Communicator> Duplicate() override { return std::make_unique<SingleProcess>(); }
  bool threaded() const override { return true; }
  // Messages to oneself, matched by tag in order.
  void SendReceive(const std::vector<Message>& sends, std::vector<Message>& receives) override {
    std::vector<bool> taken(sends.size(), false);
    for (Message& r : receives)
      for (size_t i = 0; i < sends.size(); ++i)
        if (!taken[i] && sends[i].tag == r.tag) {
          r.bytes = sends[i].bytes;
          taken[i] = true;
          break;
        }
  }
  void Abort(const std::string& message, int code) override {
    std::fprintf(stderr, "error: %s\n", message.c_str());
    std::exit(code);
  }
};

// MPI's all-to-all-v takes int counts; rows are chunked below 2 GiB per peer by the callers'
// sizes (a step's dispatch is megabytes), and larger ones are rejected loudly.
int CheckedInt(int64_t value) {
  if (value > INT32_MAX) {
    std::fprintf(stderr, "error: an exchange of %lld bytes exceeds MPI's int counts\n",
                 static_cast<long long>(value));
    MPI_Abort(MPI_COMM_WORLD, 3);
  }
  return static_cast<int>(value);
}

// Debian's OpenMPI has no asynchronous progress of its own ("OMPI progress: no" in ompi_info):
// a started all-to-all-v only moves while some thread is inside MPI. Without help its rows sit
// in the sender's buffer until Wait(), and compute placed between start and wait hides nothing.
// This thread polls every started exchange with MPI_Test until it completes, so transfers run
// while the compute threads work. It sleeps between polls (one core of two is not spent
// spinning) and blocks while nothing is in flight.
class ProgressThread {
 public:
  struct Request {
    MPI_Request request = MPI_REQUEST_NULL;
    std::atomic<bool> done{false};
  };

  static ProgressThread& Get() {
    static ProgressThread* instance = new ProgressThread();  // lives until exit, never joined
    return *instance;
  }

  void Add(Request* request) {
    std::lock_guard<std::mutex> lock(mutex_);
    requests_.push_back(request);
    wake_.notify_one();
  }
  // Blocks until the thread saw `request` complete.
  void Wait(Request* request) {
    std::unique_lock<std::mutex> lock(mutex_);
    finished_.wait(lock, [&] { return request->done.load(); });
  }

 private:
  ProgressThread() : thread_([this] { Loop(); }) { thread_.detach(); }

  void Loop() {
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      wake_.wait(lock, [&] { return !requests_.empty(); });
      bool any_done = false;
      for (size_t i = 0; i < requests_.size();) {
        int flag = 0;
        MPI_Test(&requests_[i]->request, &flag, MPI_STATUS_IGNORE);
        if (flag) {
          requests_[i]->done = true;
          requests_[i] = requests_.back();
          requests_.pop_back();
          any_done = true;
        } else {
          ++i;
        }
      }
      if (any_done) finished_.notify_all();
      if (requests_.empty()) continue;
      lock.unlock();
      std::this_thread::sleep_for(std::chrono::microseconds(20));
      lock.lock();
    }
  }

  std::mutex mutex_;
  std::condition_variable wake_, finished_;
  std::vector<Request*> requests_;
  std::thread thread_;
};

class Mpi final : public Communicator {
 public:
  // The world: initializes MPI. THREAD_MULTIPLE because the progress thread tests requests
  // while the main thread calls collectives.
  Mpi() {
    int provided = 0;
    MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
    threaded_ = provided >= MPI_THREAD_MULTIPLE;
    // A failing call or a peer that died ends the job, never a hang.
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_ARE_FATAL);
    comm_ = MPI_COMM_WORLD;
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    std::atexit([] {
      int finalized = 0;
      MPI_Finalized(&finalized);
      if (!finalized) MPI_Finalize();
    });
  }
  // A sub-communicator (a TP group).
  Mpi(MPI_Comm comm, bool threaded) : comm_(comm), threaded_(threaded) {
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void AllToAll(const int64_t* send, int64_t* recv, int64_t per_rank) override {
    MPI_Alltoall(send, static_cast<int>(per_rank), MPI_INT64_T, recv, static_cast<int>(per_rank),
                 MPI_INT64_T, comm_);
  }
  class Pending final : public Exchange {
   public:
    ProgressThread::Request slot;
    bool progressed = false;  // handed to the progress thread
    std::vector<int> counts[4];
    void Wait() override {
      if (progressed) {
        ProgressThread::Get().Wait(&slot);
      } else if (slot.request != MPI_REQUEST_NULL) {
        MPI_Wait(&slot.request, MPI_STATUS_IGNORE);
      }
    }
    ~Pending() override { Wait(); }
  };
  std::unique_ptr<Exchange> StartAllToAllV(const void* send, const std::vector<int64_t>& send_bytes,
                                           const std::vector<int64_t>& send_offsets, void* recv,
                                           const std::vector<int64_t>& recv_bytes,
                                           const std::vector<int64_t>& recv_offsets) override {
    auto pending = std::make_unique<Pending>();
    const std::vector<int64_t>* sources[4] = {&send_bytes, &send_offsets, &recv_bytes,
                                              &recv_offsets};
    for (int i = 0; i < 4; ++i)
      for (int64_t v : *sources[i])
        pending->counts[i].push_back(CheckedInt(v));
    MPI_Ialltoallv(send, pending->counts[0].data(), pending->counts[1].data(), MPI_BYTE, recv,
                   pending->counts[2].data(), pending->counts[3].data(), MPI_BYTE, comm_,
                   &pending->slot.request);
    if (threaded_ && CommunicationOptions().progress_thread) {
      pending->progressed = true;
      ProgressThread::Get().Add(&pending->slot);
    }
    return pending;
  }
  int64_t AllReduceMax(int64_t value) override {
    int64_t result = 0;
    MPI_Allreduce(&value, &result, 1, MPI_INT64_T, MPI_MAX, comm_);
    return result;
  }
  int64_t AllReduceSum(int64_t value) override {
    int64_t result = 0;
    MPI_Allreduce(&value, &result, 1, MPI_INT64_T, MPI_SUM, comm_);
    return result;
  }
  std::vector<uint8_t> GatherToRoot(const std::vector<uint8_t>& bytes) override {
    int count = CheckedInt(static_cast<int64_t>(bytes.size()));
    std::vector<int> counts(rank_ == 0 ? size_ : 0), offsets(rank_ == 0 ? size_ : 0);
    MPI_Gather(&count, 1, MPI_INT, counts.data(), 1, MPI_INT, 0, comm_);
    std::vector<uint8_t> all;
    if (rank_ == 0) {
      int64_t total = 0;
      for (int r = 0; r < size_; ++r) {
        offsets[r] = CheckedInt(total);
        total += counts[r];
      }
      all.resize(static_cast<size_t>(total));
    }
    MPI_Gatherv(bytes.data(), count, MPI_BYTE, all.data(), counts.data(), offsets.data(), MPI_BYTE,
                0, comm_);
    return all;
  }
  void AllReduceSumFloats(float* values, int64_t count) override {
    MPI_Allreduce(MPI_IN_PLACE, values, static_cast<int>(count), MPI_FLOAT, MPI_SUM, comm_);
  }
  std::vector<uint8_t> AllGather(const std::vector<uint8_t>& bytes) override {
    int count = CheckedInt(static_cast<int64_t>(bytes.size()));
    std::vector<int> counts(static_cast<size_t>(size_)), offsets(static_cast<size_t>(size_));
    MPI_Allgather(&count, 1, MPI_INT, counts.data(), 1, MPI_INT, comm_);
    int64_t total = 0;
    for (int r = 0; r < size_; ++r) {
      offsets[r] = CheckedInt(total);
      total += counts[r];
    }
    std::vector<uint8_t> all(static_cast<size_t>(total));
    MPI_Allgatherv(bytes.data(), count, MPI_BYTE, all.data(), counts.data(), offsets.data(),
                   MPI_BYTE, comm_);
    return all;
  }
  std::unique_ptr<Communicator> Split(int color) override {
    MPI_Comm sub;
    MPI_Comm_split(comm_, color, rank_, &sub);
    return std::make_unique<Mpi>(sub, threaded_);
  }
  std::unique_ptr<Communicator> Duplicate() override {
    MPI_Comm copy;
    MPI_Comm_dup(comm_, &copy);
    return std::make_unique<Mpi>(copy, threaded_);
  }
  bool threaded() const override { return threaded_; }
  void SendReceive(const std::vector<Message>& sends, std::vector<Message>& receives) override {
    // Polled, not blocking: MPI's blocking calls spin, and this runs on a thread beside the
    // stepping one (an online expert move), whose cores it must not take. Between polls it
    // sleeps 20 µs, up to 100 µs while nothing arrives: each poll is also what advances the
    // transfers (a 1 ms pause measured no slower on emulated hosts, so the bound is loose).
    std::vector<MPI_Request> requests(sends.size() + receives.size(), MPI_REQUEST_NULL);
    for (size_t i = 0; i < sends.size(); ++i)
      MPI_Isend(sends[i].bytes.data(), CheckedInt(static_cast<int64_t>(sends[i].bytes.size())),
                MPI_BYTE, sends[i].peer, sends[i].tag, comm_, &requests[i]);
    std::vector<bool> matched(receives.size(), false);
    size_t unmatched = receives.size();
    auto pause = std::chrono::microseconds(20);
    for (;;) {
      bool moved = false;
      for (size_t i = 0; i < receives.size(); ++i) {
        if (matched[i]) continue;
        int flag = 0;
        MPI_Message message;
        MPI_Status status;
        MPI_Improbe(receives[i].peer, receives[i].tag, comm_, &flag, &message, &status);
        if (!flag) continue;
        int count = 0;
        MPI_Get_count(&status, MPI_BYTE, &count);
        receives[i].bytes.resize(static_cast<size_t>(count));
        MPI_Imrecv(receives[i].bytes.data(), count, MPI_BYTE, &message,
                   &requests[sends.size() + i]);
        matched[i] = true;
        --unmatched;
        moved = true;
      }
      int done = 0;
      MPI_Testall(static_cast<int>(requests.size()), requests.data(), &done, MPI_STATUSES_IGNORE);
      if (done && unmatched == 0) return;
      if (moved) {
        pause = std::chrono::microseconds(20);
        continue;
      }
      std::this_thread::sleep_for(pause);
      pause = std::min<std::chrono::microseconds>(2 * pause, std::chrono::microseconds(100));
    }
  }
  std::vector<uint8_t> Broadcast(const std::vector<uint8_t>& bytes) override {
    int64_t size = static_cast<int64_t>(bytes.size());
    MPI_Bcast(&size, 1, MPI_INT64_T, 0, comm_);
    std::vector<uint8_t> out = rank_ == 0 ? bytes : std::vector<uint8_t>(static_cast<size_t>(size));
    MPI_Bcast(out.data(), CheckedInt(size), MPI_BYTE, 0, comm_);
    return out;
  }
  void Abort(const std::string& message, int code) override {
    std::fprintf(stderr, "error: rank %d: %s\n", rank_, message.c_str());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, code);
    std::exit(code);
  }

 private:
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
  bool threaded_ = false;
};

bool LaunchedByMpi() {
  return std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr || std::getenv("PMI_SIZE") != nullptr ||
         std::getenv("PMIX_RANK") != nullptr;
}

}  // namespace

CommunicationSettings& CommunicationOptions() {
  static CommunicationSettings settings;
  return settings;
}

Communicator& WorldCommunicator() {
  static std::unique_ptr<Communicator> world =
      LaunchedByMpi() ? std::unique_ptr<Communicator>(new Mpi())
                      : std::unique_ptr<Communicator>(new SingleProcess());
  return *world;
}

}  // namespace sy
