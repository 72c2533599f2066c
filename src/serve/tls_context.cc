#include "serve/tls_context.h"

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace sy::serve {

namespace ssl = boost::asio::ssl;

namespace {

// A missing or unreadable file gets the system's reason rather than OpenSSL's "system lib".
Status Readable(const std::string& what, const std::string& path) {
  if (::access(path.c_str(), R_OK) != 0)
    return Status::Errorf("{} {}: {}", what, path, std::strerror(errno));
  return Status::Ok();
}

}  // namespace

Status CheckTlsFlags(const TlsFiles& files) {
  if (files.cert_file.empty() != files.key_file.empty())
    return Status::Error(files.cert_file.empty() ? "--ssl-keyfile needs --ssl-certfile"
                                                 : "--ssl-certfile needs --ssl-keyfile");
  if (!files.enabled() && !files.ca_file.empty())
    return Status::Error("--ssl-ca-certs needs --ssl-certfile and --ssl-keyfile");
  if (!files.enabled() && files.client_certificates != ClientCertificates::kNone)
    return Status::Error("--ssl-cert-reqs needs --ssl-certfile and --ssl-keyfile");
  if (files.client_certificates != ClientCertificates::kNone && files.ca_file.empty())
    return Status::Error(
        "--ssl-cert-reqs 1 or 2 needs --ssl-ca-certs: the CAs whose client certificates to accept");
  return Status::Ok();
}

Result<std::shared_ptr<ssl::context>> MakeServerContext(const TlsFiles& files) {
  SY_RETURN_IF_ERROR(Readable("certificate file", files.cert_file));
  SY_RETURN_IF_ERROR(Readable("private key file", files.key_file));
  if (!files.ca_file.empty()) SY_RETURN_IF_ERROR(Readable("CA file", files.ca_file));
  auto context = std::make_shared<ssl::context>(ssl::context::tls_server);
  boost::system::error_code ec;
  context->set_options(ssl::context::default_workarounds | ssl::context::no_sslv2 |
                           ssl::context::no_sslv3 | ssl::context::no_tlsv1 |
                           ssl::context::no_tlsv1_1 | ssl::context::single_dh_use,
                       ec);
  // An encrypted key must fail with an error, not stop the server at a terminal prompt.
  context->set_password_callback([](size_t, ssl::context::password_purpose) { return ""; }, ec);
  context->use_certificate_chain_file(files.cert_file, ec);
  if (ec)
    return Status::Errorf("certificate file {}: not a usable PEM certificate chain ({})",
                          files.cert_file, ec.message());
  context->use_private_key_file(files.key_file, ssl::context::pem, ec);
  if (ec && ERR_GET_REASON(static_cast<unsigned long>(ec.value())) == X509_R_KEY_VALUES_MISMATCH)
    return Status::Errorf("private key file {} does not match the certificate in {}",
                          files.key_file, files.cert_file);
  if (ec)
    return Status::Errorf("private key file {}: not a usable unencrypted PEM key ({})",
                          files.key_file, ec.message());
  if (SSL_CTX_check_private_key(context->native_handle()) != 1)
    return Status::Errorf("private key file {} does not match the certificate in {}",
                          files.key_file, files.cert_file);
  if (!files.ca_file.empty()) {
    context->load_verify_file(files.ca_file, ec);
    if (ec)
      return Status::Errorf("CA file {}: not a usable PEM certificate list ({})", files.ca_file,
                            ec.message());
    // Tell clients which CAs we accept, so one holding several certificates picks the right one.
    if (STACK_OF(X509_NAME)* names = SSL_load_client_CA_file(files.ca_file.c_str()))
      SSL_CTX_set_client_CA_list(context->native_handle(), names);
  }
  switch (files.client_certificates) {
    case ClientCertificates::kNone:
      context->set_verify_mode(ssl::verify_none, ec);
      break;
    case ClientCertificates::kOptional:
      context->set_verify_mode(ssl::verify_peer, ec);
      break;
    case ClientCertificates::kRequired:
      context->set_verify_mode(ssl::verify_peer | ssl::verify_fail_if_no_peer_cert, ec);
      break;
  }
  if (ec) return Status::Errorf("TLS setup: {}", ec.message());
  return context;
}

Result<std::unique_ptr<ServerTlsContext>> ServerTlsContext::Load(TlsFiles files) {
  SY_RETURN_IF_ERROR(CheckTlsFlags(files));
  std::unique_ptr<ServerTlsContext> holder(new ServerTlsContext(std::move(files)));
  SY_RETURN_IF_ERROR(holder->Reload());
  return holder;
}

std::shared_ptr<ssl::context> ServerTlsContext::Current() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return current_;
}

Status ServerTlsContext::Reload() {
  SY_ASSIGN_OR_RETURN(auto context, MakeServerContext(files_));
  std::lock_guard<std::mutex> lock(mutex_);
  current_ = std::move(context);
  return Status::Ok();
}

}  // namespace sy::serve
