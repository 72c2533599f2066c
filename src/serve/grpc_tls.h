// Mutual TLS for the gRPC instance API: the instance's server credentials (serve --grpc-tls-*)
// and the router's channel credentials (route --engine-tls-*). Both read their files through
// gRPC's FileWatcherCertificateProvider, which re-reads them every kGrpcTlsRefreshSeconds: a
// renewed certificate is picked up by new connections without a restart or a signal.
#pragma once

#include <memory>
#include <string>

#include "base/status.h"

namespace grpc {
class ServerCredentials;
class ChannelCredentials;
}  // namespace grpc

namespace sy::serve {

constexpr unsigned kGrpcTlsRefreshSeconds = 5;

struct GrpcTlsFiles {
  std::string cert_file;  // PEM chain: the instance's (server) or the router's (client)
  std::string key_file;   // its PEM private key
  std::string ca_file;    // instance: CAs of accepted clients; router: CAs of trusted instances
  bool enabled() const { return !cert_file.empty() || !ca_file.empty(); }
};

// Checks flags and files (readable PEM, key matching certificate) before gRPC sees them: its
// provider would only log a failure and refuse every handshake. Messages name the flags of
// serve (--grpc-tls-*) and route (--engine-tls-*).
Status CheckGrpcServerTls(const GrpcTlsFiles& files);
Status CheckGrpcClientTls(const GrpcTlsFiles& files);

// Insecure credentials when !files.enabled(). Server: its certificate and key; with a CA, a
// client certificate is required and verified against it. Client: instances verified against
// the CA (and their certificate's names against the address dialled); its own certificate and
// key presented when given.
std::shared_ptr<grpc::ServerCredentials> GrpcServerCredentials(const GrpcTlsFiles& files);
std::shared_ptr<grpc::ChannelCredentials> GrpcChannelCredentials(const GrpcTlsFiles& files);

}  // namespace sy::serve
