// The OpenAI-compatible HTTP front of an engine: /v1/completions and /v1/chat/completions
// (JSON or server-sent events), /v1/responses (stored, background, streamed again),
// /v1/conversations, /v1/files and /v1/batches (serve/batches.h), /v1/models, /tokenize,
// /detokenize, /health, /metrics; and Anthropic's /v1/messages (serve/messages_api.h).
// Boost.Beast over Asio (Debian's Boost): asynchronous connections on a small fixed pool of I/O
// threads, so hundreds of open streams cost sockets and buffers, not threads; the engine's step
// loop hands events over without waiting for any reader.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "base/status.h"
#include "engine/engine.h"
#include "serve/openai_api.h"
#include "serve/responses_store.h"
#include "serve/tls_context.h"
#include "tokenizer/text_codec.h"

namespace sy::serve {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8000;  // 0: any free port
  std::string api_key;
  // HTTPS when tls.cert_file is set (serve/tls_context.h); SIGHUP re-reads the files.
  TlsFiles tls;
  int io_threads = 2;
  size_t max_body_bytes = 32u << 20;
  // An event stream that has sent nothing for this long (a request queued, or a long prompt
  // prefilling on a CPU) gets an SSE comment line, which clients skip and which keeps proxies
  // and client read timeouts from cutting it; 0: never.
  double sse_keepalive_seconds = 15;
  ServingLimits limits;
  // The front's store: stored and background responses, conversations, Anthropic message
  // threads; null: all of them are refused (the APIs are stateless).
  std::shared_ptr<ResponsesStore> responses_store;
  // OpenAI's Files and Batch APIs (serve/batches.h): memory for uploaded and written files; 0:
  // both APIs are off (404). A batch's requests in flight at once, over all batches.
  size_t files_bytes = 0;
  // Where the files and batches are kept as well, so that they outlive the process ("": memory
  // only). Listen fails on a directory that cannot be read back.
  std::string files_dir;
  int64_t batch_max_in_flight = 64;
  // Seconds a batch may run before what it has not run expires (serve/batches.h); 0: never.
  int64_t batch_completion_window = 24 * 3600;
  // Answers /admin/* (after the API key check) when set: (method, path, body) → (HTTP status,
  // JSON body). The router's drain and resume live here.
  std::function<std::pair<int, std::string>(const std::string&, const std::string&,
                                            const std::string&)>
      admin;
};

class OpenAiServer {
 public:
  OpenAiServer(RequestFrontend& engine, const TextCodec& codec, ServerOptions options);
  ~OpenAiServer();

  // Binds and listens; an address in use, or TLS files that do not load, is an error naming it.
  Status Listen();
  int port() const;
  // Serves until SIGTERM or SIGINT (or Shutdown): then stops admitting, lets running requests
  // finish, and returns. With TLS, SIGHUP reloads the certificate, key and CAs.
  void Run();
  void Shutdown();

  class Impl;  // the listener and its connections (http_server.cc)

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace sy::serve
