// The instance API (proto/switchyard/v1/engine.proto) over gRPC: Generate streams a request's
// events from any RequestFrontend (one engine, or an mpirun job's DP groups), Abort, Health and
// Load. `switchyard serve --grpc-port P` runs it; the router (issue 11) is its client.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "base/status.h"
#include "engine/engine.h"
#include "switchyard/v1/engine.pb.h"

namespace grpc {
class Server;
class ServerCredentials;
}  // namespace grpc

namespace sy::transfer {
class Sender;
class Receiver;
}  // namespace sy::transfer

namespace sy::serve {

// What Health reports besides the frontend's own state.
struct InstanceInfo {
  std::string served_model_name;
  int64_t page_size = 16;
  int64_t vocab_size = 0;
  int64_t max_model_len = 0;
  int64_t num_speculative_tokens = 0;
  bool priority_scheduling = false;         // serve --scheduling-policy priority
  int32_t eos_token_id = -1;                // the model's end of sequence
  std::vector<int32_t> more_eos_token_ids;  // generation_config.json's others
  // Disaggregation (serve --role): "both", "prefill" (sends rows: `sender`) or "decode"
  // (receives them: `receiver`, into a cache of `cache_layers` rows of `cache_row_bytes`).
  std::string role = "both";
  transfer::Sender* sender = nullptr;
  transfer::Receiver* receiver = nullptr;
  // A job under mpirun instead moves rows on each DP group's first rank: a decode group's
  // address, and how a request is submitted to wait there for its rows under a token (decode),
  // or to have its rows sent from there to a receiver under a token (prefill).
  std::string transfer_address;
  std::function<Result<std::shared_ptr<RequestStream>>(EngineRequest, uint64_t, SubmitError*)>
      submit_receiving;
  std::function<Result<std::shared_ptr<RequestStream>>(EngineRequest, const std::string&, uint64_t,
                                                       SubmitError*)>
      submit_sending;
  int64_t cache_layers = 0, cache_row_bytes = 0;
  double transfer_timeout_seconds = 600;
};

// Conversions, both ways (the service and its clients).
EngineRequest RequestFromProto(const switchyard::v1::GenerateRequest& request);
switchyard::v1::GenerateRequest RequestToProto(const EngineRequest& request);
switchyard::v1::GenerateResponse EventToProto(const RequestEvent& event);
RequestEvent EventFromProto(const switchyard::v1::GenerateResponse& response);

class GrpcEngineServer {
 public:
  GrpcEngineServer(RequestFrontend& frontend, InstanceInfo info);
  ~GrpcEngineServer();
  // Binds host:port (port 0: any free one) and starts serving on gRPC's own threads, in clear
  // text or with `credentials` (serve/grpc_tls.h: mutual TLS).
  Status Start(const std::string& host, int port,
               std::shared_ptr<grpc::ServerCredentials> credentials = nullptr);
  int port() const { return port_; }
  // Stops accepting calls; open streams end with CANCELLED.
  void Shutdown();

 private:
  class Service;
  std::unique_ptr<Service> service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
};

}  // namespace sy::serve
