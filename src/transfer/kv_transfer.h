// Moving a request's latent rows from a prefill instance to a decode instance over UCX (UCP tag
// messages: shared memory between processes of one host, TCP between hosts, RDMA where there is
// some; connections set up from a host:port through UCX's sockaddr listener).
//
// Each message is one chunk of rows (every cache layer's rows for a range of positions), or the
// closing message with the first token, and carries the request id, the token the router handed
// to both sides for that request, and an XXH3-64 checksum of the whole message. A receiver keeps
// what arrives for a request nobody announced yet (briefly, within a byte bound) and accepts it
// only when its decode call announces the request with the same token; a message that fails its
// checksum fails the request's transfer (the router redoes it), one with another token is
// dropped and counted.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "base/status.h"
#include "engine/handoff.h"

namespace sy::transfer {

// What one side has moved (for /metrics).
struct TransferStats {
  int64_t transfers = 0;  // requests whose rows were all sent / received
  int64_t bytes = 0;      // message bytes
  double seconds = 0;     // first chunk to last, summed over transfers
  int64_t refused = 0;    // messages refused (checksum, token) or transfers failed
  int64_t awaited = 0;    // receiving: requests announced whose rows have not all come (now)
};

// The closing message's content.
struct Received {
  std::shared_ptr<ImportedRows> rows;
  int32_t first_token = 0;
};

// The test hook: one payload byte of each of the next `n` rows messages this process sends is
// flipped after its checksum (also SWITCHYARD_TEST_CORRUPT_TRANSFERS=n in the environment).
void CorruptNextMessagesForTest(int64_t n);

class Receiver {
 public:
  // Listens on host:port (port 0: any free one) for prefill instances' connections.
  static Result<std::unique_ptr<Receiver>> Start(const std::string& host, int port);
  ~Receiver();
  // host:port to give prefill instances.
  const std::string& address() const { return address_; }
  // Announces request `id` with its token and waits for its whole transfer (the closing
  // message), at most `timeout_seconds`, or until `cancelled` says so (polled). The rows' shape
  // is checked against `layers` and `row_bytes`.
  Result<Received> Wait(const std::string& id, uint64_t token, int64_t layers, int64_t row_bytes,
                        double timeout_seconds, const std::function<bool()>& cancelled);
  TransferStats stats() const;

 private:
  struct Impl;
  explicit Receiver(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
  std::string address_;
};

class Sender;

// One request's outgoing rows: a KvSink the engine feeds; each call queues one message.
class Outgoing : public KvSink, public std::enable_shared_from_this<Outgoing> {
 public:
  void Rows(int64_t first, int64_t count, int64_t layers, int64_t row_bytes,
            std::vector<uint8_t> data) override;
  void Done(int32_t first_token, HandoffDrafts drafts) override;
  void Abandon() override;
  // Waits until every message queued was sent (delivered to UCX and completed) or one failed.
  Status Wait(double timeout_seconds);

 private:
  friend class Sender;
  Outgoing(Sender& sender, std::string peer, std::string id, uint64_t token)
      : sender_(sender), peer_(std::move(peer)), id_(std::move(id)), token_(token) {}
  void Completed(const Status& status, int64_t bytes);
  // A message's header (its checksum still zero) and request id.
  std::vector<uint8_t> Head(int kind, int64_t first, int64_t count, int64_t layers,
                            int64_t row_bytes, int32_t first_token,
                            const std::vector<uint8_t>& payload) const;

  Sender& sender_;
  std::string peer_, id_;
  uint64_t token_;
  std::mutex mutex_;
  std::condition_variable changed_;
  int64_t pending_ = 0;
  bool closed_ = false;  // Done or Abandon given
  Status failed_;
  double started_ = 0;
  int64_t bytes_ = 0;
  int64_t rows_ = 0;  // rows given so far (the closing message names them)
};

class Sender {
 public:
  static Result<std::unique_ptr<Sender>> Start();
  ~Sender();
  // A transfer of request `id` to the receiver at `peer` (host:port) under `token`.
  std::shared_ptr<Outgoing> Open(const std::string& peer, const std::string& id, uint64_t token);
  TransferStats stats() const;

 private:
  friend class Outgoing;
  struct Impl;
  explicit Sender(std::unique_ptr<Impl> impl);
  void Queue(std::shared_ptr<Outgoing> owner, std::vector<uint8_t> head,
             std::vector<uint8_t> payload);
  std::unique_ptr<Impl> impl_;
};

}  // namespace sy::transfer
