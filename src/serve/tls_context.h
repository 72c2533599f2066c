// HTTPS for the OpenAI front (serve and route): vLLM's flags (--ssl-certfile, --ssl-keyfile,
// --ssl-ca-certs, --ssl-cert-reqs) turned into an OpenSSL context through Boost.Asio, and the
// context swapped on SIGHUP (ServerTlsContext::Reload) so new connections get the new
// certificate while those already open keep theirs.
#pragma once

#include <boost/asio/ssl/context.hpp>
#include <memory>
#include <mutex>
#include <string>

#include "base/status.h"

namespace sy::serve {

// What --ssl-cert-reqs means, as uvicorn (and so vLLM) uses Python's ssl constants.
enum class ClientCertificates { kNone = 0, kOptional = 1, kRequired = 2 };

struct TlsFiles {
  std::string cert_file;  // PEM certificate chain, the server's first
  std::string key_file;   // PEM private key (unencrypted: there is no passphrase prompt)
  std::string ca_file;    // PEM CAs whose client certificates are accepted
  ClientCertificates client_certificates = ClientCertificates::kNone;
  bool enabled() const { return !cert_file.empty(); }
};

// The flags' combinations that cannot work, named by flag: a key without a certificate, a CA
// or --ssl-cert-reqs without TLS, client certificates required with no CA to verify them.
Status CheckTlsFlags(const TlsFiles& files);

// A server context from the files (TLS 1.2 and later); the error names the file at fault and
// never quotes its contents.
Result<std::shared_ptr<boost::asio::ssl::context>> MakeServerContext(const TlsFiles& files);

// The current context, replaced by Reload. Each connection keeps the shared_ptr it started with.
class ServerTlsContext {
 public:
  static Result<std::unique_ptr<ServerTlsContext>> Load(TlsFiles files);
  std::shared_ptr<boost::asio::ssl::context> Current() const;
  // Re-reads the files; on error the previous context stays in use and the error says why.
  Status Reload();
  const TlsFiles& files() const { return files_; }

 private:
  explicit ServerTlsContext(TlsFiles files) : files_(std::move(files)) {}
  TlsFiles files_;
  mutable std::mutex mutex_;
  std::shared_ptr<boost::asio::ssl::context> current_;
};

}  // namespace sy::serve
