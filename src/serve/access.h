// Who may use a server, and saying so when anyone can: the API key check (constant time) and the
// warnings printed when a port is reachable from other hosts without TLS or a key.
#pragma once

#include <string>
#include <string_view>

namespace sy::serve {

// An Authorization header against "Bearer KEY". Both sides are hashed (SHA-256) and the digests
// compared with CRYPTO_memcmp, so the time taken tells neither the key's length nor how many of
// its leading bytes a guess got right.
bool ApiKeyMatches(std::string_view authorization, std::string_view api_key);

// A loopback address (127.0.0.0/8, ::1, "localhost"); anything else, unspecified addresses
// (0.0.0.0, ::) and names included, is reachable from other hosts. Brackets around IPv6 are
// allowed.
bool IsLoopbackHost(std::string host);

// The warning for the OpenAI front at `host` (empty: none needed): from other hosts, without TLS
// and without an API key anyone can use it; with a key but no TLS, the key and the traffic
// cross the network in clear text.
std::string HttpExposureWarning(const std::string& host, int port, bool tls, bool api_key);

// The warning for a gRPC instance port (empty: none needed). The instance API has no key: its
// only protection is mutual TLS (a client certificate required), so a reachable port without a
// client CA lets anyone submit work, read others' tokens and abort their requests.
std::string GrpcExposureWarning(const std::string& host, int port, bool tls, bool client_ca);

}  // namespace sy::serve
