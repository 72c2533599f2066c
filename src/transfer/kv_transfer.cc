#include "transfer/kv_transfer.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include <ucp/api/ucp.h>

#include "base/clock.h"
#include "transfer/wire.h"

namespace sy::transfer {

namespace {

constexpr ucp_tag_t kTag = 0x5359'4b56'0000'0001ull;  // "SYKV", version 1

// A received message, uninitialized until UCX writes it (no zero fill of tens of MB), shared by
// the rows handed to the engine, which point into it (no copy either).
struct Buffer {
  std::shared_ptr<uint8_t[]> bytes;
  size_t size = 0;
  uint8_t* data() const { return bytes.get(); }
};

// Message buffers come back here when their last user lets go, and are handed out again: a
// fresh allocation of tens of MB costs a page fault and a zeroed page per 4 KiB, which made the
// transfer several times slower than the wire. At most kPoolBytes are kept, by exact size (a
// prefill instance's chunks are mostly of one size).
class BufferPool : public std::enable_shared_from_this<BufferPool> {
 public:
  static constexpr size_t kPoolBytes = size_t{1} << 30;
  Buffer Get(size_t size) {
    uint8_t* raw = nullptr;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = free_.find(size);
      if (it != free_.end()) {
        raw = it->second;
        free_.erase(it);
        kept_ -= size;
      }
    }
    if (raw == nullptr) raw = new uint8_t[size];
    std::weak_ptr<BufferPool> pool = weak_from_this();
    return {std::shared_ptr<uint8_t[]>(raw,
                                       [pool, size](uint8_t* p) {
                                         if (auto alive = pool.lock()) {
                                           alive->Put(p, size);
                                         } else {
                                           delete[] p;
                                         }
                                       }),
            size};
  }
  ~BufferPool() {
    for (auto& [size, p] : free_)
      delete[] p;
  }

 private:
  void Put(uint8_t* p, size_t size) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (kept_ + size <= kPoolBytes) {
        free_.emplace(size, p);
        kept_ += size;
        return;
      }
    }
    delete[] p;
  }
  std::mutex mutex_;
  std::multimap<size_t, uint8_t*> free_;
  size_t kept_ = 0;
};

std::shared_ptr<BufferPool>& Pool() {
  static auto pool = std::make_shared<BufferPool>();
  return pool;
}

Buffer NewBuffer(size_t size) {
  return Pool()->Get(size);
}

// The test hook: SWITCHYARD_TEST_CORRUPT_TRANSFERS=N flips one payload byte of the first N rows
// messages this process sends, after their checksum (tests/serve/test_disagg.py).
std::atomic<int64_t>& CorruptionsLeft() {
  static std::atomic<int64_t> left{[] {
    const char* value = std::getenv("SWITCHYARD_TEST_CORRUPT_TRANSFERS");
    return value ? std::atoll(value) : 0;
  }()};
  return left;
}

Result<sockaddr_storage> Resolve(const std::string& address, socklen_t* length) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos)
    return Status::Errorf("transfer address '{}': expected host:port", address);
  std::string host = address.substr(0, colon);
  const std::string port = address.substr(colon + 1);
  if (host.size() > 1 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  const int rc = ::getaddrinfo(host.empty() ? nullptr : host.c_str(), port.c_str(), &hints, &found);
  if (rc != 0 || found == nullptr)
    return Status::Errorf("transfer address '{}': {}", address, ::gai_strerror(rc));
  sockaddr_storage storage{};
  std::memcpy(&storage, found->ai_addr, found->ai_addrlen);
  *length = found->ai_addrlen;
  ::freeaddrinfo(found);
  return storage;
}

std::string UcsError(const char* what, ucs_status_t status) {
  return fmt::format("UCX {}: {}", what, ucs_status_string(status));
}

// A UCP context and one worker, driven by one thread (UCS_THREAD_MODE_SINGLE).
struct Worker {
  ucp_context_h context = nullptr;
  ucp_worker_h worker = nullptr;
  int efd = -1;

  Status Init() {
    ucp_config_t* config = nullptr;
    ucs_status_t s = ucp_config_read(nullptr, nullptr, &config);
    if (s != UCS_OK) return Status::Error(UcsError("reading its configuration", s));
    // Shared memory: UCX 1.13 leaves it out of endpoints with peer error handling (which a
    // transfer needs: a dead peer must fail its sends, not hang them) unless
    // UCX_MM_ERROR_HANDLING=y, and with that set 1.13.1 fails small messages over posix shm
    // ("Invalid am_short length: 111 (expected: <= 100)"). So between processes of one host the
    // rows go over TCP on loopback, which measured no slower here (docs/benchmarks.md).
    ucp_params_t params{};
    params.field_mask = UCP_PARAM_FIELD_FEATURES;
    params.features = UCP_FEATURE_TAG | UCP_FEATURE_WAKEUP;
    s = ucp_init(&params, config, &context);
    ucp_config_release(config);
    if (s != UCS_OK) return Status::Error(UcsError("init", s));
    ucp_worker_params_t worker_params{};
    worker_params.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    worker_params.thread_mode = UCS_THREAD_MODE_SINGLE;
    s = ucp_worker_create(context, &worker_params, &worker);
    if (s != UCS_OK) return Status::Error(UcsError("creating a worker", s));
    s = ucp_worker_get_efd(worker, &efd);
    if (s != UCS_OK) return Status::Error(UcsError("getting the worker's event fd", s));
    return Status::Ok();
  }
  ~Worker() {
    if (worker) ucp_worker_destroy(worker);
    if (context) ucp_cleanup(context);
  }
  // Progresses everything pending; true if anything moved.
  bool Progress() {
    bool any = false;
    while (ucp_worker_progress(worker) != 0)
      any = true;
    return any;
  }
  // Sleeps until the worker has events or `ms` pass.
  void Sleep(int ms) {
    if (ucp_worker_arm(worker) != UCS_OK) return;  // events pending: go on at once
    pollfd p{efd, POLLIN, 0};
    ::poll(&p, 1, ms);
  }
};

void CloseEndpoint(Worker& w, ucp_ep_h ep) {
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  param.flags = UCP_EP_CLOSE_FLAG_FORCE;
  ucs_status_ptr_t request = ucp_ep_close_nbx(ep, &param);
  if (request == nullptr || UCS_PTR_IS_ERR(request)) return;
  for (int i = 0; i < 1000 && ucp_request_check_status(request) == UCS_INPROGRESS; ++i)
    w.Progress();
  ucp_request_free(request);
}

}  // namespace

void CorruptNextMessagesForTest(int64_t n) {
  CorruptionsLeft() = n;
}

// ---------------------------------------------------------------------------------------------
// Receiver

struct Receiver::Impl {
  struct Inbound {  // a message being received
    Buffer data;
    void* request = nullptr;
    bool done = false;
    ucs_status_t status = UCS_OK;
  };
  struct Entry {  // one request's transfer
    bool announced = false;
    uint64_t token = 0;
    int64_t layers = 0, row_bytes = 0;
    std::vector<Buffer> held;          // arrived before the announcement (unchecked)
    std::map<int64_t, Buffer> chunks;  // by first row: the message, checked
    int64_t rows_received = 0;
    // The closing message came, naming `total` rows; done when they are all here too (a large
    // message may complete after a later small one).
    bool closed = false, done = false;
    int64_t total = 0;
    int32_t first_token = 0;
    HandoffDrafts drafts;
    std::string error;
    double first_arrival = 0, created = 0;
    int64_t bytes = 0;
  };
  static constexpr double kHoldSeconds = 30;
  static constexpr int64_t kHoldBytes = int64_t{1} << 30;

  Worker w;
  ucp_listener_h listener = nullptr;
  std::vector<ucp_conn_request_h> connection_requests;  // from the listener's callback
  struct Endpoint {
    ucp_ep_h ep;
    bool failed = false;
  };
  std::vector<std::unique_ptr<Endpoint>> endpoints;
  std::vector<std::unique_ptr<Inbound>> inbound;
  std::thread thread;
  std::atomic<bool> stop{false};

  mutable std::mutex mutex;  // entries and stats
  std::condition_variable changed;
  std::map<std::string, Entry> entries;
  int64_t held_bytes = 0;
  TransferStats stats;

  void Loop() {
    while (!stop) {
      bool moved = w.Progress();
      for (ucp_conn_request_h request : connection_requests)
        Accept(request);
      connection_requests.clear();
      ucp_tag_recv_info_t info;
      ucp_tag_message_h message = ucp_tag_probe_nb(w.worker, kTag, ~ucp_tag_t{0}, 1, &info);
      if (message != nullptr) {
        moved = true;
        auto in = std::make_unique<Inbound>();
        in->data = NewBuffer(info.length);
        ucp_request_param_t param{};
        param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
        param.cb.recv = [](void*, ucs_status_t status, const ucp_tag_recv_info_t*, void* user) {
          auto* in = static_cast<Inbound*>(user);
          in->done = true;
          in->status = status;
        };
        param.user_data = in.get();
        ucs_status_ptr_t request =
            ucp_tag_msg_recv_nbx(w.worker, in->data.data(), info.length, message, &param);
        if (UCS_PTR_IS_ERR(request)) {
          std::fprintf(stderr, "switchyard transfer: %s\n",
                       UcsError("receiving", UCS_PTR_STATUS(request)).c_str());
        } else if (request == nullptr) {
          Handle(std::move(in->data));
        } else {
          in->request = request;
          inbound.push_back(std::move(in));
        }
      }
      for (auto it = inbound.begin(); it != inbound.end();) {
        Inbound& in = **it;
        if (!in.done) {
          ++it;
          continue;
        }
        ucp_request_free(in.request);
        if (in.status == UCS_OK) Handle(std::move(in.data));
        it = inbound.erase(it);
        moved = true;
      }
      for (auto it = endpoints.begin(); it != endpoints.end();) {
        if ((*it)->failed) {
          CloseEndpoint(w, (*it)->ep);
          it = endpoints.erase(it);
        } else {
          ++it;
        }
      }
      if (!moved) w.Sleep(inbound.empty() ? 50 : 1);
    }
    // Receives still in flight end here, before their Inbound goes (their callbacks write it).
    for (auto& in : inbound)
      ucp_request_cancel(w.worker, in->request);
    for (int i = 0; i < 10000 && std::any_of(inbound.begin(), inbound.end(),
                                             [](const auto& in) { return !in->done; });
         ++i)
      w.Progress();
    for (auto& in : inbound)
      if (in->done) ucp_request_free(in->request);
    inbound.clear();
    for (auto& e : endpoints)
      CloseEndpoint(w, e->ep);
    endpoints.clear();
  }

  void Accept(ucp_conn_request_h request) {
    auto endpoint = std::make_unique<Endpoint>();
    ucp_ep_params_t params{};
    params.field_mask = UCP_EP_PARAM_FIELD_CONN_REQUEST | UCP_EP_PARAM_FIELD_ERR_HANDLER |
                        UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
    params.conn_request = request;
    params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    params.err_handler.cb = [](void* arg, ucp_ep_h, ucs_status_t) {
      static_cast<Endpoint*>(arg)->failed = true;  // a prefill instance went away
    };
    params.err_handler.arg = endpoint.get();
    ucs_status_t s = ucp_ep_create(w.worker, &params, &endpoint->ep);
    if (s != UCS_OK) {
      std::fprintf(stderr, "switchyard transfer: %s\n",
                   UcsError("accepting a connection", s).c_str());
      return;
    }
    endpoints.push_back(std::move(endpoint));
  }

  // A whole message arrived (on the worker's thread).
  void Handle(Buffer message) {
    const double now = NowSeconds();
    auto parsed = ParseMessage(message.data(), message.size, /*verify=*/false);
    std::lock_guard<std::mutex> lock(mutex);
    if (!parsed.ok()) {
      ++stats.refused;
      std::fprintf(stderr, "switchyard transfer: refused a message: %s\n",
                   parsed.status().message().c_str());
      return;
    }
    const std::string id(parsed->id);
    // Forget what nobody announced in time.
    for (auto it = entries.begin(); it != entries.end();) {
      if (!it->second.announced && now - it->second.created > kHoldSeconds) {
        for (const auto& m : it->second.held)
          held_bytes -= static_cast<int64_t>(m.size);
        it = entries.erase(it);
      } else {
        ++it;
      }
    }
    auto [it, created] = entries.try_emplace(id);
    Entry& entry = it->second;
    if (created) entry.created = now;
    if (entry.first_arrival == 0) entry.first_arrival = now;
    if (!entry.announced) {
      if (held_bytes + static_cast<int64_t>(message.size) > kHoldBytes) {
        ++stats.refused;
        return;
      }
      held_bytes += static_cast<int64_t>(message.size);
      entry.held.push_back(std::move(message));
      return;
    }
    Accept(id, entry, std::move(message));
    changed.notify_all();
  }

  // Checks a message against its announced request (caller holds the mutex).
  void Accept(const std::string& id, Entry& entry, Buffer message) {
    if (entry.done || !entry.error.empty()) return;
    // Well formed (checked at arrival); now its checksum.
    auto parsed = ParseMessage(message.data(), message.size, /*verify=*/true);
    const Header& h = parsed->header;
    if (!parsed->checksum_ok) {
      ++stats.refused;
      entry.error = fmt::format(
          "a transfer message of request {} (rows from {}) failed its checksum: refused", id,
          h.first);
      std::fprintf(stderr, "switchyard transfer: %s\n", entry.error.c_str());
      return;
    }
    if (h.token != entry.token) {  // not from the prefill instance the router chose
      ++stats.refused;
      std::fprintf(stderr,
                   "switchyard transfer: refused a message for request %s with another token\n",
                   id.c_str());
      return;
    }
    entry.bytes += static_cast<int64_t>(message.size);
    if (h.kind == kDone) {
      auto drafts = ParseDrafts(parsed->payload, h.payload_bytes);
      if (!drafts.ok()) {
        entry.error = fmt::format("request {}: {}", id, drafts.status().message());
        return;
      }
      entry.drafts = std::move(drafts.value());
      entry.first_token = h.first_token;
      entry.closed = true;
      entry.total = h.count;
      entry.done = entry.rows_received == entry.total;
      return;
    }
    if (h.layers != entry.layers || h.row_bytes != entry.row_bytes) {
      entry.error = fmt::format(
          "request {}: the rows sent ({} layers of {} bytes) do not fit this instance's cache ({} "
          "layers of {} bytes): prefill and decode must serve the same model, cache dtype and MTP "
          "setting",
          id, h.layers, h.row_bytes, entry.layers, entry.row_bytes);
      return;
    }
    if (entry.chunks.count(h.first)) return;  // a duplicate
    entry.rows_received += h.count;
    entry.chunks[h.first] = std::move(message);
    entry.done = entry.closed && entry.rows_received == entry.total;
  }

  // The chunks as the engine takes them, pointing into the messages; an error if they do not
  // cover [0, n).
  Result<std::shared_ptr<ImportedRows>> Assemble(const std::string& id, Entry& entry) {
    auto rows = std::make_shared<ImportedRows>();
    rows->layers = entry.layers;
    rows->row_bytes = entry.row_bytes;
    int64_t next = 0;
    for (const auto& [first, message] : entry.chunks) {
      Header h;
      std::memcpy(&h, message.data(), sizeof(h));
      if (first != next)
        return Status::Errorf("request {}: the transfer is missing rows [{}, {})", id, next, first);
      rows->chunks.push_back(
          {first, h.count, message.data() + sizeof(Header) + h.id_length, message.bytes});
      next += h.count;
    }
    rows->rows = next;
    return rows;
  }
};

Receiver::Receiver(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Receiver::~Receiver() {
  impl_->stop = true;
  if (impl_->thread.joinable()) impl_->thread.join();
  if (impl_->listener) ucp_listener_destroy(impl_->listener);
}

Result<std::unique_ptr<Receiver>> Receiver::Start(const std::string& host, int port) {
  auto impl = std::make_unique<Impl>();
  SY_RETURN_IF_ERROR(impl->w.Init());
  socklen_t length = 0;
  auto address = Resolve(host + ":" + std::to_string(port), &length);
  if (!address.ok()) return address.status();
  ucp_listener_params_t params{};
  params.field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | UCP_LISTENER_PARAM_FIELD_CONN_HANDLER;
  params.sockaddr.addr = reinterpret_cast<const sockaddr*>(&address.value());
  params.sockaddr.addrlen = length;
  params.conn_handler.cb = [](ucp_conn_request_h request, void* arg) {
    static_cast<Impl*>(arg)->connection_requests.push_back(request);
  };
  params.conn_handler.arg = impl.get();
  ucs_status_t s = ucp_listener_create(impl->w.worker, &params, &impl->listener);
  if (s != UCS_OK)
    return Status::Errorf("cannot receive transfers on {}:{}: {}", host, port,
                          ucs_status_string(s));
  ucp_listener_attr_t attr{};
  attr.field_mask = UCP_LISTENER_ATTR_FIELD_SOCKADDR;
  s = ucp_listener_query(impl->listener, &attr);
  if (s != UCS_OK) return Status::Error(UcsError("querying the listener", s));
  int bound = 0;
  if (attr.sockaddr.ss_family == AF_INET)
    bound = ntohs(reinterpret_cast<const sockaddr_in*>(&attr.sockaddr)->sin_port);
  else
    bound = ntohs(reinterpret_cast<const sockaddr_in6*>(&attr.sockaddr)->sin6_port);
  std::unique_ptr<Receiver> receiver(new Receiver(std::move(impl)));
  const bool v6 = host.find(':') != std::string::npos && host.front() != '[';
  receiver->address_ = (v6 ? "[" + host + "]" : host) + ":" + std::to_string(bound);
  Impl* raw = receiver->impl_.get();
  raw->thread = std::thread([raw] { raw->Loop(); });
  return receiver;
}

Result<Received> Receiver::Wait(const std::string& id, uint64_t token, int64_t layers,
                                int64_t row_bytes, double timeout_seconds,
                                const std::function<bool()>& cancelled) {
  Impl& impl = *impl_;
  std::unique_lock<std::mutex> lock(impl.mutex);
  auto [it, created] = impl.entries.try_emplace(id);
  Impl::Entry& entry = it->second;
  if (created) entry.created = NowSeconds();
  if (entry.announced) return Status::Errorf("request {} is already being received", id);
  entry.announced = true;
  entry.token = token;
  entry.layers = layers;
  entry.row_bytes = row_bytes;
  for (auto& message : entry.held) {
    impl.held_bytes -= static_cast<int64_t>(message.size);
    impl.Accept(id, entry, std::move(message));
  }
  entry.held.clear();
  const double deadline = NowSeconds() + timeout_seconds;
  Result<Received> result = Status::Error("");
  while (true) {
    if (!entry.error.empty()) {
      result = Status::Error(entry.error);
      break;
    }
    if (entry.done) {
      auto rows = impl.Assemble(id, entry);
      if (!rows.ok()) {
        result = rows.status();
        break;
      }
      ++impl.stats.transfers;
      impl.stats.bytes += entry.bytes;
      impl.stats.seconds += NowSeconds() - entry.first_arrival;
      rows.value()->drafts = std::move(entry.drafts);
      result = Received{rows.value(), entry.first_token};
      break;
    }
    if (NowSeconds() > deadline) {
      result = Status::Errorf("request {}: no transfer within {:.0f} s", id, timeout_seconds);
      break;
    }
    if (cancelled && cancelled()) {
      result = Status::Errorf("request {}: cancelled while waiting for its transfer", id);
      break;
    }
    impl.changed.wait_for(lock, std::chrono::milliseconds(50));
  }
  if (!result.ok()) ++impl.stats.refused;
  impl.entries.erase(id);
  return result;
}

TransferStats Receiver::stats() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  TransferStats stats = impl_->stats;
  for (const auto& [id, entry] : impl_->entries)
    stats.awaited += entry.announced;
  return stats;
}

// ---------------------------------------------------------------------------------------------
// Sender

struct Sender::Impl {
  struct Outbound {
    std::shared_ptr<Outgoing> owner;
    // Header, request id and rows in one buffer: UCX 1.13 crashes replaying an iov send queued
    // before its endpoint's wireup completed, so the rows are copied once, into memory that is
    // not zero-filled first.
    // Made on the sender's thread (checksum, copy), not the engine's.
    std::vector<uint8_t> head, payload;
    Buffer message;
    size_t size() const { return message.size; }
    void Build() {
      Header h;
      std::memcpy(&h, head.data(), sizeof(h));
      h.checksum = Checksum(h, {{head.data() + sizeof(h), head.size() - sizeof(h)},
                                {payload.data(), payload.size()}});
      std::memcpy(head.data(), &h, sizeof(h));
      message = NewBuffer(head.size() + payload.size());
      std::memcpy(message.data(), head.data(), head.size());
      if (!payload.empty()) {
        std::memcpy(message.data() + head.size(), payload.data(), payload.size());
        if (h.kind == kRows && CorruptionsLeft().load() > 0 && CorruptionsLeft().fetch_sub(1) > 0)
          message.data()[message.size - 1] ^= 0x40;  // the test hook: after the checksum
      }
      head.clear();
      payload = {};
    }
    std::string peer;
    void* request = nullptr;
    bool done = false;
    ucs_status_t status = UCS_OK;
  };
  struct Endpoint {
    ucp_ep_h ep = nullptr;
    bool failed = false;
    ucs_status_t why = UCS_OK;
  };
  Worker w;
  std::map<std::string, std::unique_ptr<Endpoint>> endpoints;  // by peer
  std::vector<std::unique_ptr<Outbound>> inflight;
  std::thread thread;

  std::mutex mutex;  // queue, stop, stats
  std::condition_variable wake;
  std::deque<std::unique_ptr<Outbound>> queue;
  bool stop = false;
  TransferStats stats;

  Result<Endpoint*> Connect(const std::string& peer) {
    auto it = endpoints.find(peer);
    if (it != endpoints.end() && !it->second->failed) return it->second.get();
    if (it != endpoints.end()) {
      CloseEndpoint(w, it->second->ep);
      endpoints.erase(it);
    }
    socklen_t length = 0;
    auto address = Resolve(peer, &length);
    if (!address.ok()) return address.status();
    auto endpoint = std::make_unique<Endpoint>();
    ucp_ep_params_t params{};
    params.field_mask = UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR |
                        UCP_EP_PARAM_FIELD_ERR_HANDLER | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
    params.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
    params.sockaddr.addr = reinterpret_cast<const sockaddr*>(&address.value());
    params.sockaddr.addrlen = length;
    params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    params.err_handler.cb = [](void* arg, ucp_ep_h, ucs_status_t status) {
      auto* e = static_cast<Endpoint*>(arg);
      e->failed = true;
      e->why = status;
    };
    params.err_handler.arg = endpoint.get();
    ucs_status_t s = ucp_ep_create(w.worker, &params, &endpoint->ep);
    if (s != UCS_OK)
      return Status::Errorf("cannot connect to the decode instance's transfer port {}: {}", peer,
                            ucs_status_string(s));
    Endpoint* raw = endpoint.get();
    endpoints[peer] = std::move(endpoint);
    return raw;
  }

  void Loop() {
    while (true) {
      std::deque<std::unique_ptr<Outbound>> taken;
      {
        std::unique_lock<std::mutex> lock(mutex);
        if (queue.empty() && inflight.empty()) {
          if (stop) break;
          wake.wait_for(lock, std::chrono::milliseconds(100));
        }
        taken.swap(queue);
      }
      bool moved = !taken.empty();
      for (auto& out : taken) {
        out->Build();
        auto endpoint = Connect(out->peer);
        if (!endpoint.ok()) {
          out->owner->Completed(endpoint.status(), 0);
          continue;
        }
        ucp_request_param_t param{};
        param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
        param.cb.send = [](void*, ucs_status_t status, void* user) {
          auto* out = static_cast<Outbound*>(user);
          out->done = true;
          out->status = status;
        };
        param.user_data = out.get();
        ucs_status_ptr_t request = ucp_tag_send_nbx(endpoint.value()->ep, out->message.data(),
                                                    out->message.size, kTag, &param);
        if (request == nullptr) {
          out->owner->Completed(Status::Ok(), static_cast<int64_t>(out->size()));
        } else if (UCS_PTR_IS_ERR(request)) {
          out->owner->Completed(Status::Errorf("sending to {}: {}", out->peer,
                                               ucs_status_string(UCS_PTR_STATUS(request))),
                                0);
        } else {
          out->request = request;
          inflight.push_back(std::move(out));
        }
      }
      moved |= w.Progress();
      for (auto it = inflight.begin(); it != inflight.end();) {
        Outbound& out = **it;
        if (!out.done) {
          ++it;
          continue;
        }
        ucp_request_free(out.request);
        out.owner->Completed(out.status == UCS_OK ? Status::Ok()
                                                  : Status::Errorf("sending to {}: {}", out.peer,
                                                                   ucs_status_string(out.status)),
                             static_cast<int64_t>(out.size()));
        it = inflight.erase(it);
        moved = true;
      }
      if (!moved && !inflight.empty()) w.Sleep(1);
    }
    for (auto& [peer, e] : endpoints)
      CloseEndpoint(w, e->ep);
    endpoints.clear();
  }
};

Sender::Sender(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Sender::~Sender() {
  {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    impl_->stop = true;
  }
  impl_->wake.notify_all();
  if (impl_->thread.joinable()) impl_->thread.join();
}

Result<std::unique_ptr<Sender>> Sender::Start() {
  auto impl = std::make_unique<Impl>();
  SY_RETURN_IF_ERROR(impl->w.Init());
  std::unique_ptr<Sender> sender(new Sender(std::move(impl)));
  Impl* raw = sender->impl_.get();
  raw->thread = std::thread([raw] { raw->Loop(); });
  return sender;
}

std::shared_ptr<Outgoing> Sender::Open(const std::string& peer, const std::string& id,
                                       uint64_t token) {
  return std::shared_ptr<Outgoing>(new Outgoing(*this, peer, id, token));
}

void Sender::Queue(std::shared_ptr<Outgoing> owner, std::vector<uint8_t> head,
                   std::vector<uint8_t> payload) {
  auto out = std::make_unique<Impl::Outbound>();
  out->peer = owner->peer_;
  out->owner = std::move(owner);
  out->head = std::move(head);
  out->payload = std::move(payload);
  {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    impl_->queue.push_back(std::move(out));
  }
  impl_->wake.notify_all();
}

TransferStats Sender::stats() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return impl_->stats;
}

// ---------------------------------------------------------------------------------------------
// Outgoing

std::vector<uint8_t> Outgoing::Head(int kind, int64_t first, int64_t count, int64_t layers,
                                    int64_t row_bytes, int32_t first_token,
                                    const std::vector<uint8_t>& payload) const {
  Header h;
  h.kind = static_cast<uint32_t>(kind);
  h.token = token_;
  h.first = first;
  h.count = count;
  h.layers = static_cast<int32_t>(layers);
  h.row_bytes = static_cast<int32_t>(row_bytes);
  h.first_token = first_token;
  h.id_length = static_cast<uint32_t>(id_.size());
  h.payload_bytes = payload.size();  // the checksum is made on the sender's thread
  std::vector<uint8_t> head(sizeof(Header) + id_.size());
  std::memcpy(head.data(), &h, sizeof(h));
  std::memcpy(head.data() + sizeof(h), id_.data(), id_.size());
  return head;
}

void Outgoing::Rows(int64_t first, int64_t count, int64_t layers, int64_t row_bytes,
                    std::vector<uint8_t> data) {
  std::vector<uint8_t> head = Head(kRows, first, count, layers, row_bytes, 0, data);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (started_ == 0) started_ = NowSeconds();
    ++pending_;
    rows_ = std::max(rows_, first + count);
  }
  sender_.Queue(shared_from_this(), std::move(head), std::move(data));
}

void Outgoing::Done(int32_t first_token, HandoffDrafts drafts) {
  int64_t rows = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    rows = rows_;
  }
  std::vector<uint8_t> payload = EncodeDrafts(drafts);
  std::vector<uint8_t> head = Head(kDone, 0, rows, 0, 0, first_token, payload);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (started_ == 0) started_ = NowSeconds();
    ++pending_;
    closed_ = true;
  }
  sender_.Queue(shared_from_this(), std::move(head), std::move(payload));
}

void Outgoing::Abandon() {
  std::lock_guard<std::mutex> lock(mutex_);
  closed_ = true;
  changed_.notify_all();
}

void Outgoing::Completed(const Status& status, int64_t bytes) {
  bool finished = false, ok = true;
  double seconds = 0;
  int64_t total = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    --pending_;
    bytes_ += bytes;
    if (!status.ok() && failed_.ok()) failed_ = status;
    finished = pending_ == 0 && closed_;
    ok = failed_.ok();
    total = bytes_;
    seconds = NowSeconds() - started_;
    changed_.notify_all();
  }
  if (finished) {
    std::lock_guard<std::mutex> lock(sender_.impl_->mutex);
    TransferStats& s = sender_.impl_->stats;
    if (ok) {
      ++s.transfers;
      s.bytes += total;
      s.seconds += seconds;
    } else {
      ++s.refused;
    }
  }
}

Status Outgoing::Wait(double timeout_seconds) {
  std::unique_lock<std::mutex> lock(mutex_);
  const bool done = changed_.wait_for(lock, std::chrono::duration<double>(timeout_seconds),
                                      [&] { return (closed_ && pending_ == 0) || !failed_.ok(); });
  if (!failed_.ok()) return failed_;
  if (!done)
    return Status::Errorf("request {}: the transfer to {} did not complete within {:.0f} s", id_,
                          peer_, timeout_seconds);
  return Status::Ok();
}

}  // namespace sy::transfer
