#include "cli/tls_options.h"

#include <cstdio>

#include "cli/verbs.h"

namespace sy {

serve::TlsFiles HttpsArgs::Files() const {
  return {certfile, keyfile, ca_certs, static_cast<serve::ClientCertificates>(cert_reqs)};
}

void AddHttpsOptions(CLI::App* verb, HttpsArgs& args, std::string& api_key) {
  verb->add_option("--api-key", api_key, "Require Authorization: Bearer KEY")
      ->envname("SWITCHYARD_API_KEY");
  verb->add_option("--ssl-certfile", args.certfile,
                   "Serve HTTPS with this PEM certificate chain (SIGHUP reloads it)");
  verb->add_option("--ssl-keyfile", args.keyfile, "The certificate's PEM private key");
  verb->add_option("--ssl-ca-certs", args.ca_certs,
                   "PEM CAs whose client certificates are accepted");
  verb->add_option("--ssl-cert-reqs", args.cert_reqs,
                   "Client certificates: 0 not asked for, 1 verified when given, 2 required")
      ->check(CLI::Range(0, 2));
}

void CheckHttpsOrFail(const HttpsArgs& args) {
  if (Status s = serve::CheckTlsFlags(args.Files()); !s.ok()) FailVerb(s.message());
}

void WarnIfExposed(const std::string& warning) {
  if (warning.empty()) return;
  std::fprintf(stderr, "switchyard: %s\n", warning.c_str());
  std::fflush(stderr);
}

}  // namespace sy
