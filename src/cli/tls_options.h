// The security flags serve and route share: HTTPS with vLLM's names (--ssl-certfile,
// --ssl-keyfile, --ssl-ca-certs, --ssl-cert-reqs), --api-key (also from SWITCHYARD_API_KEY, so
// the key need not appear in the process list), and the warnings for ports left open.
#pragma once

#include <string>

#include "serve/tls_context.h"

namespace CLI {
class App;
}

namespace sy {

struct HttpsArgs {
  std::string certfile, keyfile, ca_certs;
  int cert_reqs = 0;  // 0 none, 1 optional, 2 required client certificates
  serve::TlsFiles Files() const;
};
void AddHttpsOptions(CLI::App* verb, HttpsArgs& args, std::string& api_key);
// Fails the verb when the flags cannot work together (before a model is loaded).
void CheckHttpsOrFail(const HttpsArgs& args);

// Prints a warning (serve/access.h) to stderr when there is one.
void WarnIfExposed(const std::string& warning);

}  // namespace sy
