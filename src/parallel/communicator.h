// The few collectives expert parallelism needs, behind one interface: one process (size 1), or
// MPI ranks. Every call is collective over all ranks unless it says otherwise.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "base/status.h"

namespace sy {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // recv[s · per_rank + i] = what rank s put in send[rank() · per_rank + i].
  virtual void AllToAll(const int64_t* send, int64_t* recv, int64_t per_rank) = 0;

  // A started all-to-all-v of bytes; Wait() completes it. Counts and displacements in bytes,
  // one per rank. Buffers must stay valid until Wait().
  class Exchange {
   public:
    virtual ~Exchange() = default;
    virtual void Wait() = 0;
  };
  virtual std::unique_ptr<Exchange> StartAllToAllV(const void* send,
                                                   const std::vector<int64_t>& send_bytes,
                                                   const std::vector<int64_t>& send_offsets,
                                                   void* recv,
                                                   const std::vector<int64_t>& recv_bytes,
                                                   const std::vector<int64_t>& recv_offsets) = 0;

  virtual int64_t AllReduceMax(int64_t value) = 0;
  virtual int64_t AllReduceSum(int64_t value) = 0;
  // Rank 0 receives every rank's bytes, concatenated in rank order; other ranks get nothing.
  virtual std::vector<uint8_t> GatherToRoot(const std::vector<uint8_t>& bytes) = 0;
  // Rank 0's bytes on every rank.
  virtual std::vector<uint8_t> Broadcast(const std::vector<uint8_t>& bytes) = 0;
  // Sums `count` floats over the ranks, in place.
  virtual void AllReduceSumFloats(float* values, int64_t count) = 0;
  // Every rank's bytes, concatenated in rank order, on every rank.
  virtual std::vector<uint8_t> AllGather(const std::vector<uint8_t>& bytes) = 0;
  // The ranks with the same `color`, ordered by their rank here (MPI_Comm_split).
  virtual std::unique_ptr<Communicator> Split(int color) = 0;
  // The same ranks in a communicator of their own (MPI_Comm_dup): what another thread uses so
  // that its messages never meet the stepping thread's.
  virtual std::unique_ptr<Communicator> Duplicate() = 0;
  // Whether a second thread may call this communicator while the first does (MPI's
  // THREAD_MULTIPLE was granted, or one process).
  virtual bool threaded() const = 0;

  // Point to point, not collective: sends every message of `sends` to its peer and receives one
  // message for each entry of `receives` from its peer with its tag (the sender's size), and
  // returns when all are done. Sends never wait for receives, so two ranks that each send to
  // the other cannot deadlock.
  struct Message {
    int peer = 0;
    int tag = 0;
    std::vector<uint8_t> bytes;
  };
  virtual void SendReceive(const std::vector<Message>& sends, std::vector<Message>& receives) = 0;
  // Ends every rank with `code` after printing `message` (one line) on this rank.
  [[noreturn]] virtual void Abort(const std::string& message, int code) = 0;
};

struct CommunicationSettings {
  // Started exchanges are advanced by a background thread while the caller computes; off, they
  // move only inside Wait() (what OpenMPI does on its own).
  bool progress_thread = true;
};
CommunicationSettings& CommunicationOptions();

// The process's communicator: MPI when launched by mpirun (OMPI_COMM_WORLD_SIZE or PMI_SIZE set),
// otherwise a single in-process rank. Created once; MPI is finalized at exit.
Communicator& WorldCommunicator();

}  // namespace sy
