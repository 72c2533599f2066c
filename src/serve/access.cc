#include "serve/access.h"

#include <fmt/format.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>

#include <array>
#include <boost/asio/ip/address.hpp>

namespace sy::serve {

namespace {

std::array<unsigned char, 32> Sha256(std::string_view text) {
  std::array<unsigned char, 32> digest{};
  unsigned int size = 0;
  EVP_Digest(text.data(), text.size(), digest.data(), &size, EVP_sha256(), nullptr);
  return digest;
}

}  // namespace

bool ApiKeyMatches(std::string_view authorization, std::string_view api_key) {
  const auto expected = Sha256(std::string("Bearer ") + std::string(api_key));
  const auto given = Sha256(authorization);
  return CRYPTO_memcmp(expected.data(), given.data(), expected.size()) == 0;
}

bool IsLoopbackHost(std::string host) {
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  if (host == "localhost") return true;
  boost::system::error_code ec;
  const auto address = boost::asio::ip::make_address(host, ec);
  return !ec && address.is_loopback();
}

std::string HttpExposureWarning(const std::string& host, int port, bool tls, bool api_key) {
  if (IsLoopbackHost(host) || tls) return "";
  if (!api_key)
    return fmt::format(
        "warning: {}:{} is reachable from other hosts with neither TLS (--ssl-certfile, "
        "--ssl-keyfile) nor an API key (--api-key): anyone who can reach it can run requests on "
        "it, and prompts and outputs cross the network in clear text",
        host, port);
  return fmt::format(
      "warning: {}:{} is reachable from other hosts without TLS (--ssl-certfile, --ssl-keyfile): "
      "the API key, prompts and outputs cross the network in clear text",
      host, port);
}

std::string GrpcExposureWarning(const std::string& host, int port, bool tls, bool client_ca) {
  if (IsLoopbackHost(host) || (tls && client_ca)) return "";
  return fmt::format(
      "warning: the gRPC instance API on {}:{} is reachable from other hosts without {}: anyone "
      "who can reach it can submit requests, read other clients' tokens and abort their "
      "requests{}",
      host, port,
      tls ? "a client CA (--grpc-tls-client-ca)"
          : "mutual TLS (--grpc-tls-cert, --grpc-tls-key, --grpc-tls-client-ca)",
      tls ? "" : ", all in clear text");
}

}  // namespace sy::serve
