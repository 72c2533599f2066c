#include "serve/grpc_tls.h"

#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/security/tls_certificate_provider.h>
#include <grpcpp/security/tls_certificate_verifier.h>
#include <grpcpp/security/tls_credentials_options.h>

#include "serve/tls_context.h"

namespace sy::serve {

namespace tls = grpc::experimental;

namespace {

// The certificate, key and CA files through OpenSSL, as the HTTPS front checks its own.
Status CheckFiles(const GrpcTlsFiles& files) {
  TlsFiles check{files.cert_file, files.key_file, files.ca_file, ClientCertificates::kNone};
  if (!files.cert_file.empty()) return MakeServerContext(check).status();
  boost::asio::ssl::context context(boost::asio::ssl::context::tls_client);
  boost::system::error_code ec;
  context.load_verify_file(files.ca_file, ec);
  if (ec)
    return Status::Errorf("CA file {}: not a readable PEM certificate list ({})", files.ca_file,
                          ec.message());
  return Status::Ok();
}

}  // namespace

Status CheckGrpcServerTls(const GrpcTlsFiles& files) {
  if (files.cert_file.empty() != files.key_file.empty())
    return Status::Error(files.cert_file.empty() ? "--grpc-tls-key needs --grpc-tls-cert"
                                                 : "--grpc-tls-cert needs --grpc-tls-key");
  if (files.cert_file.empty() && !files.ca_file.empty())
    return Status::Error("--grpc-tls-client-ca needs --grpc-tls-cert and --grpc-tls-key");
  return files.enabled() ? CheckFiles(files) : Status::Ok();
}

Status CheckGrpcClientTls(const GrpcTlsFiles& files) {
  if (files.cert_file.empty() != files.key_file.empty())
    return Status::Error(files.cert_file.empty() ? "--engine-tls-key needs --engine-tls-cert"
                                                 : "--engine-tls-cert needs --engine-tls-key");
  if (!files.cert_file.empty() && files.ca_file.empty())
    return Status::Error(
        "--engine-tls-cert needs --engine-tls-ca: the CA that signed the instances' certificates");
  return files.enabled() ? CheckFiles(files) : Status::Ok();
}

std::shared_ptr<grpc::ServerCredentials> GrpcServerCredentials(const GrpcTlsFiles& files) {
  if (!files.enabled()) return grpc::InsecureServerCredentials();
  auto provider = std::make_shared<tls::FileWatcherCertificateProvider>(
      files.key_file, files.cert_file, files.ca_file, kGrpcTlsRefreshSeconds);
  tls::TlsServerCredentialsOptions options(provider);
  options.watch_identity_key_cert_pairs();
  if (!files.ca_file.empty()) {
    options.watch_root_certs();
    options.set_cert_request_type(GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  }
  return grpc::experimental::TlsServerCredentials(options);
}

std::shared_ptr<grpc::ChannelCredentials> GrpcChannelCredentials(const GrpcTlsFiles& files) {
  if (!files.enabled()) return grpc::InsecureChannelCredentials();
  auto provider = std::make_shared<tls::FileWatcherCertificateProvider>(
      files.key_file, files.cert_file, files.ca_file, kGrpcTlsRefreshSeconds);
  tls::TlsChannelCredentialsOptions options;
  options.set_certificate_provider(provider);
  options.watch_root_certs();
  if (!files.cert_file.empty()) options.watch_identity_key_cert_pairs();
  options.set_verify_server_certs(true);
  // The instance's certificate must name the host the router dials (IP or DNS SAN).
  options.set_certificate_verifier(std::make_shared<tls::HostNameCertificateVerifier>());
  return grpc::experimental::TlsCredentials(options);
}

}  // namespace sy::serve
