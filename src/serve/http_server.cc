#include "serve/http_server.h"

#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <boost/asio.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast.hpp>
#include <boost/beast/ssl.hpp>
#include <chrono>
#include <cstdio>
#include <deque>
#include <limits>
#include <map>
#include <optional>
#include <random>
#include <thread>
#include <type_traits>

#include "serve/access.h"
#include "serve/batches.h"
#include "serve/conversations_api.h"
#include "serve/messages_api.h"
#include "serve/metrics.h"
#include "serve/responses_api.h"
#include "serve/tls_context.h"

namespace sy::serve {

namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;

namespace {

int64_t UnixSeconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string RandomId() {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  return fmt::format("{:016x}{:016x}", rng(), rng());
}

// The answer to a submission the engine refused: 503 when full or stopping, else 400.
ApiError SubmitRefusal(const Status& status, SubmitError why) {
  if (why == SubmitError::kQueueFull) return {503, status.message(), "", "server_overloaded"};
  if (why == SubmitError::kStopping) return {503, status.message(), "", "shutting_down"};
  return {400, status.message(), "", "invalid_value"};
}

}  // namespace

class OpenAiServer::Impl {
 public:
  Impl(RequestFrontend& engine, const TextCodec& codec, ServerOptions options)
      : engine_(engine),
        codec_(codec),
        options_(std::move(options)),
        acceptor_(net::make_strand(io_)),
        signals_(io_, SIGTERM, SIGINT),
        reload_signal_(io_) {
    if (options_.files_bytes > 0) {
      if (options_.files_dir.empty()) {
        files_ = std::make_unique<FileStore>(options_.files_bytes);
      } else if (auto opened = FileStore::Open(options_.files_bytes, options_.files_dir);
                 opened.ok()) {
        files_ = std::move(opened).value();
      } else {
        files_status_ = opened.status();
      }
      if (files_) {
        batches_ = std::make_unique<BatchRunner>(engine_, codec_, options_.limits, *files_,
                                                 options_.batch_max_in_flight,
                                                 options_.batch_completion_window);
        files_status_ = batches_->restored();
      }
    }
  }

  Status Listen();
  void Run();
  void Shutdown();
  int port() const { return port_; }
  // One line per refused connection (a failed TLS handshake), at most 10 a second, so a flood
  // of them cannot flood the log.
  void LogRefused(const std::string& line);

  RequestFrontend& engine_;
  const TextCodec& codec_;
  ServerOptions options_;
  net::io_context io_;
  tcp::acceptor acceptor_;
  net::signal_set signals_;
  net::signal_set reload_signal_;          // SIGHUP: re-read the TLS files
  std::unique_ptr<ServerTlsContext> tls_;  // null: plain HTTP
  int port_ = 0;
  const int64_t started_ = UnixSeconds();  // the models' `created`
  std::atomic<int64_t> active_generations_{0};
  HttpRequestCounts http_counts_;  // http_requests_total
  std::atomic<bool> shutting_down_{false};
  std::thread drainer_;
  std::unique_ptr<FileStore> files_;  // null: no Files and Batch APIs
  Status files_status_;               // the kept files and batches read back (Listen fails)
  std::unique_ptr<BatchRunner> batches_;

  // background: true — Responses requests the server runs on its own. Their state is in the
  // store: "queued" when accepted, "in_progress" from the first token, the finished Response
  // object (or "cancelled") at the end; GET polls it.
  // Submits `plan` and stores it as queued; the queued object's body, or an error.
  std::optional<ApiError> StartBackground(ResponsesPlan plan, std::string* body, std::string* id);
  // A background response's events from the `from`-th on (one server-sent event each; the index
  // is the sequence_number), live or stored: false when `id` has none (not a background
  // response, or no longer stored). `*done`: no more will come.
  bool ReadEvents(const std::string& id, size_t from, std::vector<std::string>* out, bool* done);
  // Calls `wake` whenever the running background response `id` has more events (nothing when it
  // is not running).
  void WatchEvents(const std::string& id, std::function<void()> wake);
  // POST /v1/responses/{id}/cancel: aborts a running one and gives the cancelled object's body;
  // 404 when there is no such response, 400 when it is not a background one still running.
  std::optional<ApiError> CancelBackground(const std::string& id, std::string* body);

 private:
  void Accept();
  void WaitForReload();
  struct BackgroundRun {
    explicit BackgroundRun(net::io_context& io) : strand(net::make_strand(io)) {}
    ResponsesPlan plan;
    std::string id, request_id;
    int64_t created = 0;
    std::shared_ptr<RequestStream> stream;
    ChoiceResult result;
    bool started = false;
    std::atomic<bool> cancelled{false};
    net::strand<net::io_context::executor_type> strand;  // one pump at a time
    // Its events as streamed, for the clients that stream it (kept in the store at the end);
    // `watchers` are woken when more come, until `done`.
    std::unique_ptr<ResponsesStream> writer;
    std::mutex log_mutex;
    std::vector<std::string> log;
    bool done = false;
    std::vector<std::function<void()>> watchers;
  };
  void PumpBackground(const std::shared_ptr<BackgroundRun>& run);
  // Appends `events` (server-sent events back to back) to the run's log, and wakes its watchers.
  static void Log(BackgroundRun& run, const std::string& events, bool done);
  std::mutex background_mutex_;
  std::map<std::string, std::shared_ptr<BackgroundRun>> background_;
  std::mutex log_mutex_;
  int64_t log_second_ = 0;
  int logged_this_second_ = 0;
  int64_t not_logged_ = 0;
};

namespace {

using Response = http::response<http::string_body>;
using PlainStream = beast::tcp_stream;
using TlsStream = beast::ssl_stream<beast::tcp_stream>;

bool IsTlsError(const beast::error_code& ec) {
  return ec.category() == net::error::get_ssl_category() ||
         ec.category() == net::ssl::error::get_stream_category();
}

// One connection, plain (PlainStream) or TLS (TlsStream): the same HTTP handling over either.
template <class Stream>
class Session : public std::enable_shared_from_this<Session<Stream>> {
  static constexpr bool kTls = std::is_same_v<Stream, TlsStream>;
  using std::enable_shared_from_this<Session<Stream>>::shared_from_this;

 public:
  // `tls` (TLS only) is the context the connection was accepted with: it outlives the stream
  // even when SIGHUP installs a new one.
  Session(tcp::socket socket, OpenAiServer::Impl& server,
          std::shared_ptr<net::ssl::context> tls = nullptr)
      : tls_(std::move(tls)), stream_(MakeStream(std::move(socket), tls_.get())), server_(server) {
    beast::error_code ec;
    const auto peer = Socket().remote_endpoint(ec);
    if (!ec) {
      peer_ = fmt::format("{}:{}", peer.address().to_string(), peer.port());
      peer_loopback_ = peer.address().is_loopback();
    }
  }

  void Start() {
    net::dispatch(stream_.get_executor(), [self = shared_from_this()] {
      if constexpr (kTls) {
        self->Lowest().expires_after(std::chrono::seconds(30));
        self->stream_.async_handshake(net::ssl::stream_base::server,
                                      [self](beast::error_code ec) { self->OnHandshake(ec); });
      } else {
        self->Read();
      }
    });
  }

 private:
  struct Generation {
    GenerationPlan plan;
    std::string id;
    int64_t created = 0;
    std::vector<std::string> request_ids;
    std::vector<std::shared_ptr<RequestStream>> streams;
    std::vector<ChoiceResult> results;
    std::vector<bool> done, started;
    // /v1/responses: the request as it came, and its typed event stream when streaming.
    std::optional<ResponsesPlan> responses;
    std::unique_ptr<ResponsesStream> responses_stream;
    // /v1/messages (Anthropic's shapes), and its event stream when streaming.
    std::optional<MessagesPlan> messages;
    std::unique_ptr<MessagesStream> messages_stream;
    bool keep_alive = true;
    unsigned version = 11;
  };

  static Stream MakeStream(tcp::socket socket, net::ssl::context* tls) {
    if constexpr (kTls) {
      return Stream(std::move(socket), *tls);
    } else {
      (void)tls;
      return Stream(std::move(socket));
    }
  }

  beast::tcp_stream& Lowest() { return beast::get_lowest_layer(stream_); }
  tcp::socket& Socket() { return Lowest().socket(); }

  // A plaintext request, a client that does not trust our certificate (it sends an alert), a
  // client certificate that does not verify or is missing under --ssl-cert-reqs 2: one line
  // naming the peer and OpenSSL's reason, then the connection is closed. A peer that leaves
  // before sending anything (a port probe) is not worth a line.
  void OnHandshake(beast::error_code ec) {
    if (!ec) return Read();
    const bool silent = ec == net::error::eof || ec == net::ssl::error::stream_truncated ||
                        ec == net::error::connection_reset;
    if (!silent) {
      std::string reason = ec.message();
      if (reason.find("http request") != std::string::npos)
        reason += " — a plaintext HTTP request to the HTTPS port";
      server_.LogRefused(fmt::format("switchyard: TLS connection from {} refused: {}",
                                     peer_.empty() ? "?" : peer_, reason));
    }
    CloseSocket();
  }

  void Read() {
    // A TLS read started to look for a hang-up (WatchForHangUp) owns buffer_ until it completes.
    if (probe_reading_) {
      read_after_probe_ = true;
      return;
    }
    parser_.emplace();
    // A file upload (POST /v1/files) or a message batch's requests (POST /v1/messages/batches)
    // may be as large as the files' budget (OpenAI takes batch files of up to 200 MB, Anthropic
    // batches of up to 256 MB), any other body only max_body_bytes. The parser checks a declared
    // length against its limit as it finishes the header, so the limit starts at the larger one
    // and other requests are held to theirs once the header says what they are.
    const size_t upload_limit =
        server_.files_ ? std::max(server_.options_.max_body_bytes, server_.files_->budget()) : 0;
    parser_->body_limit(std::max(server_.options_.max_body_bytes, upload_limit));
    parser_->header_limit(64 * 1024);
    Lowest().expires_after(std::chrono::minutes(10));  // idle keep-alive connections
    http::async_read_header(
        stream_, buffer_, *parser_, [self = shared_from_this()](beast::error_code ec, size_t) {
          if (ec) return self->OnRead(ec);
          const auto& header = self->parser_->get();
          if (!self->Upload(header)) {
            const size_t limit = self->server_.options_.max_body_bytes;
            const auto declared = self->parser_->content_length();
            if (declared && *declared > limit) return self->OnRead(http::error::body_limit);
            self->parser_->body_limit(limit);  // a chunked body is held to it as it comes
          }
          http::async_read(self->stream_, self->buffer_, *self->parser_,
                           [self](beast::error_code ec, size_t) { self->OnRead(ec); });
        });
  }

  // Whether a request's body goes to the file store, and so may be as large as its budget.
  bool Upload(const http::request_header<>& header) const {
    if (header.method() != http::verb::post || !server_.files_) return false;
    const std::string_view target(header.target().data(), header.target().size());
    const std::string_view path = target.substr(0, target.find('?'));
    return path.starts_with("/v1/files") || path == "/v1/messages/batches";
  }

  void OnRead(beast::error_code ec) {
    anthropic_ = false;
    route_ = "other";
    method_ = "unknown";
    if (ec == http::error::end_of_stream || ec == net::error::eof ||
        ec == net::error::connection_reset || ec == beast::error::timeout || IsTlsError(ec)) {
      return Close();
    }
    if (ec == http::error::body_limit) {
      const bool upload = Upload(parser_->get());
      anthropic_ = parser_->get().target().starts_with("/v1/messages");
      return SendError(
          {413,
           upload
               ? fmt::format("the upload exceeds the {} bytes the server keeps for files "
                             "(serve --files-mb)",
                             std::max(server_.options_.max_body_bytes, server_.files_->budget()))
               : fmt::format("the request body exceeds {} bytes", server_.options_.max_body_bytes),
           "", "request_too_large"},
          11, false);
    }
    if (ec)
      return SendError({400, "malformed HTTP request: " + ec.message(), "", "bad_request"}, 11,
                       false);
    Lowest().expires_never();
    auto request = parser_->release();
    const unsigned version = request.version();
    const bool keep_alive = request.keep_alive();
    // An exception escaping here would end the I/O thread and the server: a bug in one request
    // is answered with a 500 and the server goes on.
    try {
      Handle(std::move(request));
    } catch (const std::exception& e) {
      SendError({500, std::string("internal error: ") + e.what(), "", "internal_error"}, version,
                keep_alive);
    }
  }

  void Handle(http::request<http::string_body> request) {
    const std::string target(request.target());
    const std::string path = target.substr(0, target.find('?'));
    const bool keep_alive = request.keep_alive();
    const unsigned version = request.version();
    const bool get = request.method() == http::verb::get;
    const bool post = request.method() == http::verb::post;
    // Anthropic's API answers errors in its own shape.
    anthropic_ = path == "/v1/messages" || path.starts_with("/v1/messages/");
    route_ = HttpRequestCounts::Route(path);
    method_ = std::string(request.method_string());
    if (path == "/health" && get) {
      const bool healthy = server_.engine_.Metrics().healthy && !server_.shutting_down_;
      return Send(MakeResponse(healthy ? http::status::ok : http::status::service_unavailable, "",
                               "text/plain", version, keep_alive));
    }
    if (path == "/metrics" && get) {
      const BatchGauges batch_gauges =
          server_.batches_ ? server_.batches_->Gauges() : BatchGauges{};
      return Send(
          MakeResponse(http::status::ok,
                       PrometheusText(server_.engine_.Metrics(), server_.options_.limits.model_name,
                                      server_.options_.responses_store.get(), &server_.http_counts_,
                                      server_.batches_ ? &batch_gauges : nullptr),
                       "text/plain; version=0.0.4; charset=utf-8", version, keep_alive));
    }
    if (!server_.options_.api_key.empty()) {
      // OpenAI's clients send "Authorization: Bearer KEY"; Anthropic's API takes "x-api-key: KEY"
      // (Claude Code and older anthropic SDKs send that).
      const auto auth = request[http::field::authorization];
      const auto x_api_key = request["x-api-key"];
      const std::string bearer =
          auth.empty() ? "Bearer " + std::string(x_api_key) : std::string(auth);
      if (!ApiKeyMatches(bearer, server_.options_.api_key))
        return SendError({401, "missing or wrong API key (Authorization: Bearer KEY, or x-api-key)",
                          "", "invalid_api_key"},
                         version, keep_alive);
    }
    ApiError error;
    if (server_.options_.admin && path.rfind("/admin/", 0) == 0) {
      // Without a key, administration is for this host only.
      if (server_.options_.api_key.empty() && !peer_loopback_)
        return SendError({403,
                          "the admin endpoints answer only clients on this host unless the "
                          "server has an API key (--api-key)",
                          "", "forbidden"},
                         version, keep_alive);
      auto [status, body] =
          server_.options_.admin(std::string(request.method_string()), path, request.body());
      return Send(MakeResponse(static_cast<http::status>(status), body, "application/json", version,
                               keep_alive));
    }
    if (path == "/v1/models" && get)
      return Send(MakeResponse(http::status::ok,
                               ModelsResponse(server_.options_.limits, server_.started_),
                               "application/json", version, keep_alive));
    if (path.starts_with("/v1/models/") && get) {
      std::string body = ModelResponse(server_.options_.limits, server_.started_,
                                       path.substr(std::string_view("/v1/models/").size()), &error);
      if (body.empty()) return SendError(error, version, keep_alive);
      return Send(MakeResponse(http::status::ok, body, "application/json", version, keep_alive));
    }
    if (path == "/tokenize" && post) {
      std::string body =
          TokenizeResponse(request.body(), server_.codec_, server_.options_.limits, &error);
      if (body.empty()) return SendError(error, version, keep_alive);
      return Send(MakeResponse(http::status::ok, body, "application/json", version, keep_alive));
    }
    if (path == "/detokenize" && post) {
      std::string body = DetokenizeResponse(request.body(), server_.codec_, &error);
      if (body.empty()) return SendError(error, version, keep_alive);
      return Send(MakeResponse(http::status::ok, body, "application/json", version, keep_alive));
    }
    if ((path == "/v1/completions" || path == "/v1/chat/completions") && post) {
      const Endpoint endpoint =
          path == "/v1/completions" ? Endpoint::kCompletions : Endpoint::kChat;
      ParsedRequest parsed =
          ParseGenerationRequest(endpoint, request.body(), server_.codec_, server_.options_.limits);
      if (!parsed.plan) return SendError(parsed.error, version, keep_alive);
      return StartGeneration(std::move(*parsed.plan), version, keep_alive);
    }
    if (path == "/v1/responses" && post) {
      ParsedResponsesRequest parsed =
          ParseResponsesRequest(request.body(), server_.codec_, server_.options_.limits,
                                server_.options_.responses_store.get());
      if (!parsed.plan) return SendError(parsed.error, version, keep_alive);
      if (parsed.plan->background) {
        const bool stream = parsed.plan->chat.stream;
        std::string body, id;
        if (auto refused = server_.StartBackground(std::move(*parsed.plan), &body, &id))
          return SendError(*refused, version, keep_alive);
        if (stream) return StartFollow(std::move(id), 0, version, keep_alive);
        return Send(MakeResponse(http::status::ok, std::move(body), "application/json", version,
                                 keep_alive));
      }
      GenerationPlan plan = parsed.plan->chat;
      return StartGeneration(std::move(plan), version, keep_alive, std::move(parsed.plan));
    }
    if (path.starts_with("/v1/responses/")) return StoredResponseRequest(request, path, target);
    if (path == "/v1/conversations" || path.starts_with("/v1/conversations/")) {
      ResponsesStore* store = server_.options_.responses_store.get();
      if (!store)
        return SendError({404,
                          "this server keeps no conversations (--responses-store-mb 0): send "
                          "the whole conversation as input",
                          "", "not_found"},
                         version, keep_alive);
      const size_t q = target.find('?');
      ConversationsReply reply =
          ConversationsRequest(*store, std::string(request.method_string()),
                               path.substr(std::string_view("/v1/conversations").size()),
                               q == std::string::npos ? "" : target.substr(q + 1), request.body(),
                               "conv_" + RandomId(), UnixSeconds());
      if (reply.status != 200) return SendError(reply.error, version, keep_alive);
      return Send(MakeResponse(http::status::ok, std::move(reply.body), "application/json", version,
                               keep_alive));
    }
    for (const char* prefix : {"/v1/files", "/v1/batches"}) {
      const std::string_view base(prefix);
      if (path != base && !(path.starts_with(base) && path[base.size()] == '/')) continue;
      if (!server_.files_)
        return SendError(
            {404, "this server runs no batches and keeps no files (--files-mb 0)", "", "not_found"},
            version, keep_alive);
      const size_t q = target.find('?');
      const std::string query = q == std::string::npos ? "" : target.substr(q + 1);
      const std::string method(request.method_string());
      ApiReply reply = base == "/v1/files"
                           ? FilesRequest(*server_.files_, method, path.substr(base.size()), query,
                                          std::string(request[http::field::content_type]),
                                          request.body(), UnixSeconds())
                           : server_.batches_->Request(method, path.substr(base.size()), query,
                                                       request.body(), UnixSeconds());
      if (!reply.ok()) return SendError(reply.error, version, keep_alive);
      return Send(MakeResponse(http::status::ok, std::move(reply.body), reply.content_type.c_str(),
                               version, keep_alive));
    }
    if (path == "/v1/messages/batches" || path.starts_with("/v1/messages/batches/")) {
      if (!server_.files_)
        return SendError(
            {404, "this server runs no batches and keeps no files (--files-mb 0)", "", "not_found"},
            version, keep_alive);
      const size_t q = target.find('?');
      // results_url is absolute, as Anthropic's is, on the host and scheme the client used.
      const auto host = request[http::field::host];
      const std::string origin =
          host.empty() ? "" : fmt::format("{}://{}", kTls ? "https" : "http", std::string(host));
      ApiReply reply = server_.batches_->MessageBatchesRequest(
          std::string(request.method_string()),
          path.substr(std::string_view("/v1/messages/batches").size()),
          q == std::string::npos ? "" : target.substr(q + 1), request.body(), UnixSeconds(),
          origin);
      if (!reply.ok()) return SendError(reply.error, version, keep_alive);
      return Send(MakeResponse(http::status::ok, std::move(reply.body), reply.content_type.c_str(),
                               version, keep_alive));
    }
    if (path == "/v1/messages" && post) {
      ResponsesStore* store = server_.options_.responses_store.get();
      ParsedMessagesRequest parsed =
          ParseMessagesRequest(request.body(), server_.codec_, server_.options_.limits, store);
      if (!parsed.plan) return SendError(parsed.error, version, keep_alive);
      if (!parsed.plan->continues.empty())
        if (auto refused = ClaimThread(*store, parsed.plan->continues))
          return SendError(*refused, version, keep_alive);
      GenerationPlan plan = parsed.plan->chat;
      return StartGeneration(std::move(plan), version, keep_alive, std::nullopt,
                             std::move(parsed.plan));
    }
    if (path == "/v1/messages/count_tokens" && post) {
      std::string body =
          CountTokensBody(request.body(), server_.codec_, server_.options_.limits, &error);
      if (body.empty()) return SendError(error, version, keep_alive);
      return Send(MakeResponse(http::status::ok, body, "application/json", version, keep_alive));
    }
    const bool known = path == "/health" || path == "/metrics" || path == "/v1/models" ||
                       path == "/tokenize" || path == "/detokenize" || path == "/v1/completions" ||
                       path == "/v1/chat/completions" || path == "/v1/responses" || anthropic_;
    if (known)
      return SendError(
          {405, fmt::format("{} does not accept {}", path, std::string(request.method_string())),
           "", "method_not_allowed"},
          version, keep_alive);
    SendError({404, fmt::format("no such endpoint: {}", path), "", "not_found"}, version,
              keep_alive);
  }

  // GET /v1/responses/{id}, DELETE /v1/responses/{id}, GET /v1/responses/{id}/input_items.
  void StoredResponseRequest(const http::request<http::string_body>& request,
                             const std::string& path, const std::string& target) {
    const unsigned version = request.version();
    const bool keep_alive = request.keep_alive();
    ResponsesStore* store = server_.options_.responses_store.get();
    std::string id = path.substr(std::string_view("/v1/responses/").size());
    const bool input_items = id.ends_with("/input_items");
    if (input_items) id.resize(id.size() - std::string_view("/input_items").size());
    const auto method = request.method();
    if (id.ends_with("/cancel") && method == http::verb::post) {
      id.resize(id.size() - std::string_view("/cancel").size());
      std::string body;
      if (auto refused = server_.CancelBackground(id, &body))
        return SendError(*refused, version, keep_alive);
      return Send(
          MakeResponse(http::status::ok, std::move(body), "application/json", version, keep_alive));
    }
    const bool allowed =
        method == http::verb::get || (method == http::verb::delete_ && !input_items);
    if (id.empty() || id.find('/') != std::string::npos)
      return SendError({404, fmt::format("no such endpoint: {}", path), "", "not_found"}, version,
                       keep_alive);
    if (!allowed)
      return SendError(
          {405, fmt::format("{} does not accept {}", path, std::string(request.method_string())),
           "", "method_not_allowed"},
          version, keep_alive);
    if (!store)
      return SendError({404,
                        "this server keeps no responses (--responses-store-mb 0): nothing to "
                        "retrieve",
                        "", "not_found"},
                       version, keep_alive);
    const ApiError missing{404,
                           fmt::format("no stored response '{}' (never stored, deleted, or evicted "
                                       "from the store)",
                                       id),
                           "response_id", "not_found"};
    if (method == http::verb::delete_) {
      if (!store->Erase(id)) return SendError(missing, version, keep_alive);
      const nlohmann::ordered_json deleted = {
          {"id", id}, {"object", "response"}, {"deleted", true}};
      return Send(
          MakeResponse(http::status::ok, deleted.dump(), "application/json", version, keep_alive));
    }
    const size_t q = target.find('?');
    const std::string query = q == std::string::npos ? "" : target.substr(q + 1);
    if (!input_items && QueryValue(query, "stream") == "true") {
      // A background response's events again, after `starting_after` (a sequence_number).
      size_t from = 0;
      if (auto after = QueryValue(query, "starting_after")) {
        char* rest = nullptr;
        const long long n = std::strtoll(after->c_str(), &rest, 10);
        if (after->empty() || *rest != '\0' || n < -1)
          return SendError({400, "starting_after: must be an event's sequence_number",
                            "starting_after", "invalid_value"},
                           version, keep_alive);
        from = static_cast<size_t>(n + 1);
      }
      // Whether it has events at all (reading from past the end copies none).
      std::vector<std::string> none;
      bool done = false;
      if (!server_.ReadEvents(id, std::numeric_limits<size_t>::max(), &none, &done)) {
        if (!store->Get(id)) return SendError(missing, version, keep_alive);
        return SendError({400,
                          fmt::format("response '{}' did not run in the background: only "
                                      "background responses are streamed again",
                                      id),
                          "stream", "invalid_value"},
                         version, keep_alive);
      }
      return StartFollow(id, from, version, keep_alive);
    }
    auto stored = store->Get(id);
    if (!stored) return SendError(missing, version, keep_alive);
    if (!input_items)
      return Send(MakeResponse(http::status::ok, DumpJson(stored->response), "application/json",
                               version, keep_alive));
    ApiError error;
    std::string body = InputItemsBody(*stored, query, &error);
    if (body.empty()) return SendError(error, version, keep_alive);
    Send(MakeResponse(http::status::ok, std::move(body), "application/json", version, keep_alive));
  }

  static Response MakeResponse(http::status status, std::string body, const char* type,
                               unsigned version, bool keep_alive) {
    Response response{status, version};
    response.set(http::field::server, "switchyard");
    response.set(http::field::content_type, type);
    response.keep_alive(keep_alive);
    response.body() = std::move(body);
    response.prepare_payload();
    return response;
  }

  void SendError(const ApiError& error, unsigned version, bool keep_alive) {
    Response response = MakeResponse(static_cast<http::status>(error.status),
                                     anthropic_ ? MessagesErrorBody(error) : ErrorBody(error),
                                     "application/json", version, keep_alive);
    if (error.status == 503 || error.status == 429) response.set(http::field::retry_after, "1");
    Send(std::move(response));
  }

  void Send(Response response) {
    server_.http_counts_.Count(route_, method_, response.result_int());
    auto shared = std::make_shared<Response>(std::move(response));
    const bool linger = shared->result() == http::status::payload_too_large;
    http::async_write(stream_, *shared,
                      [self = shared_from_this(), shared, linger](beast::error_code ec, size_t) {
                        if (!ec && linger) return self->DrainAndClose(0);
                        if (ec || !shared->keep_alive()) return self->Close();
                        self->Read();
                      });
  }

  // After refusing a body that is too large, read and drop what the client is still sending
  // (up to a bound) so it can finish writing and read the refusal, then close.
  void DrainAndClose(size_t drained) {
    if (drained > (256u << 20)) return Close();
    if (!drain_buffer_) drain_buffer_ = std::make_unique<std::array<char, 65536>>();
    Lowest().expires_after(std::chrono::seconds(10));
    stream_.async_read_some(net::buffer(*drain_buffer_),
                            [self = shared_from_this(), drained](beast::error_code ec, size_t n) {
                              if (ec) return self->Close();
                              self->DrainAndClose(drained + n);
                            });
  }

  // Over TLS, a connection closed after a whole response says so first (close_notify) when no
  // other operation is in flight; one that failed or was abandoned is just closed.
  void Close() {
    if constexpr (kTls) {
      if (!writing_ && !probe_reading_ && !client_gone_ && !closing_) {
        closing_ = true;
        Lowest().expires_after(std::chrono::seconds(2));
        stream_.async_shutdown(
            [self = shared_from_this()](beast::error_code) { self->CloseSocket(); });
        return;
      }
    }
    CloseSocket();
  }

  void CloseSocket() {
    beast::error_code ignored;
    Socket().shutdown(tcp::socket::shutdown_send, ignored);
    Socket().close(ignored);
  }

  // ---- generation ----

  // A thread's reply is continued by one request at a time, and once.
  static std::optional<ApiError> ClaimThread(ResponsesStore& store, const std::string& id) {
    switch (store.ClaimContinuation(id)) {
      case ResponsesStore::Claim::kClaimed:
        return std::nullopt;
      case ResponsesStore::Claim::kNotFound:
        return ApiError{404,
                        fmt::format("thread.previous_message_id: '{}' is no longer stored: "
                                    "replay the conversation with thread {{\"type\": \"create\"}}",
                                    id),
                        "thread.previous_message_id", "thread_not_found"};
      case ResponsesStore::Claim::kInFlight:
        return ApiError{400,
                        fmt::format("thread.previous_message_id: another request is continuing "
                                    "'{}': continue from its reply when it ends",
                                    id),
                        "thread.previous_message_id", "thread_continue_in_flight"};
      case ResponsesStore::Claim::kContinued:
        break;
    }
    return ApiError{400,
                    fmt::format("thread.previous_message_id: '{}' has been continued already (a "
                                "reply is continued once): continue from the thread's latest reply",
                                id),
                    "thread.previous_message_id", "thread_already_continued"};
  }

  // At a Messages request's end: a thread keeps its finished reply (`ok`), and the reply it
  // continued is marked continued, or released for another try when this one failed.
  void FinishThread(const Generation& g, bool ok) {
    if (!g.messages || !g.messages->thread) return;
    ResponsesStore* store = server_.options_.responses_store.get();
    if (ok)
      store->Put(g.id, MessageToStore(*g.messages, MessageObject(g.plan, g.results[0], g.id,
                                                                 server_.options_.limits)));
    if (!g.messages->continues.empty()) store->ReleaseContinuation(g.messages->continues, ok);
  }

  // `responses`: a Responses API request; `messages`: a Messages API one.
  void StartGeneration(GenerationPlan plan, unsigned version, bool keep_alive,
                       std::optional<ResponsesPlan> responses = std::nullopt,
                       std::optional<MessagesPlan> messages = std::nullopt) {
    auto g = std::make_shared<Generation>();
    g->plan = std::move(plan);
    g->responses = std::move(responses);
    g->messages = std::move(messages);
    g->id = g->responses ? "resp_" + RandomId()
            : g->messages
                ? "msg_" + RandomId()
                : (g->plan.endpoint == Endpoint::kCompletions ? "cmpl-" : "chatcmpl-") + RandomId();
    g->created = UnixSeconds();
    g->keep_alive = keep_alive;
    g->version = version;
    const int64_t choices = g->plan.choices();
    g->results.resize(choices);
    g->done.assign(choices, false);
    g->started.assign(choices, false);
    std::vector<EngineRequest> requests = ChoiceRequests(g->plan, g->id);
    for (const EngineRequest& request : requests)
      g->request_ids.push_back(request.id);
    // All of the request's sequences or none: a refusal leaves nothing running.
    SubmitError why;
    auto streams = server_.engine_.SubmitAll(std::move(requests), &why);
    if (!streams.ok()) {
      FinishThread(*g, false);
      return SendError(SubmitRefusal(streams.status(), why), version, keep_alive);
    }
    g->streams = std::move(streams.value());
    generation_ = g;
    ++server_.active_generations_;
    std::weak_ptr<Session> weak = shared_from_this();
    for (auto& stream : g->streams)
      stream->SetNotifier([weak] {
        if (auto self = weak.lock()) self->SchedulePump();
      });
    if (g->plan.stream) {
      if (g->responses) {
        g->responses_stream = std::make_unique<ResponsesStream>(
            *g->responses, g->id, g->created, server_.codec_, server_.options_.limits);
        Queue(g->responses_stream->Start());
      }
      if (g->messages)
        g->messages_stream =
            std::make_unique<MessagesStream>(g->plan, g->id, server_.options_.limits);
      WriteEventStreamHeader(version, keep_alive);
    }
    WatchForHangUp();
    SchedulePump();
  }

  // The header of a server-sent-event response (chunked); what is queued follows it.
  void WriteEventStreamHeader(unsigned version, bool keep_alive) {
    server_.http_counts_.Count(route_, method_, 200);
    header_ = std::make_unique<http::response<http::empty_body>>(http::status::ok, version);
    header_->set(http::field::server, "switchyard");
    header_->set(http::field::content_type, "text/event-stream");
    header_->set(http::field::cache_control, "no-cache");
    header_->keep_alive(keep_alive);
    header_->chunked(true);
    serializer_ = std::make_unique<http::response_serializer<http::empty_body>>(*header_);
    writing_ = true;
    event_stream_ = true;
    last_stream_write_ = std::chrono::steady_clock::now();
    http::async_write_header(stream_, *serializer_,
                             [self = shared_from_this()](beast::error_code ec, size_t) {
                               self->writing_ = false;
                               if (ec) return self->ClientGone();
                               self->FlushWrites();
                             });
  }

  // Streams a background response's events from the `from`-th to its end (POST with background
  // and stream, or GET /v1/responses/{id}?stream=true): the response runs on if the client goes.
  void StartFollow(std::string id, size_t from, unsigned version, bool keep_alive) {
    follow_ = std::make_unique<Follow>(Follow{std::move(id), from, keep_alive});
    WriteEventStreamHeader(version, keep_alive);
    std::weak_ptr<Session> weak = shared_from_this();
    server_.WatchEvents(follow_->id, [weak] {
      if (auto self = weak.lock()) self->SchedulePump();
    });
    WatchForHangUp();
    SchedulePump();
  }

  void PumpFollow() {
    if (client_gone_) {
      follow_.reset();
      return Close();
    }
    std::vector<std::string> events;
    bool done = false;
    // A log no longer stored (evicted meanwhile) ends the stream.
    if (!server_.ReadEvents(follow_->id, follow_->next, &events, &done)) done = true;
    follow_->next += events.size();
    for (std::string& event : events)
      Queue(std::move(event));
    if (done) {
      keep_alive_after_stream_ = follow_->keep_alive;
      follow_.reset();
      finishing_ = true;
    }
    FlushWrites();
  }

  void SchedulePump() {
    if (pump_pending_.exchange(true)) return;
    net::post(stream_.get_executor(), [self = shared_from_this()] {
      self->pump_pending_ = false;
      self->Pump();
    });
  }

  // A client that closes its connection mid-request has its requests aborted. The check polls
  // (a peek every 100 ms) rather than waiting for readability: edge-triggered readiness can wake
  // a wait with nothing to read. The pending timer also keeps the session alive while the
  // engine works on its requests. Over TLS a client may say goodbye (close_notify) before its
  // FIN, and the unread alert would make every later peek see data: bytes waiting there are read
  // through TLS (ProbeRead), which tells a goodbye from a pipelined request.
  void WatchForHangUp() {
    if (!hang_up_timer_)
      hang_up_timer_ = std::make_unique<net::steady_timer>(stream_.get_executor());
    hang_up_timer_->expires_after(std::chrono::milliseconds(100));
    hang_up_timer_->async_wait([self = shared_from_this()](beast::error_code ec) {
      if (ec || (!self->generation_ && !self->follow_) || self->client_gone_) return;
      char byte;
      const ssize_t n = ::recv(self->Socket().native_handle(), &byte, 1, MSG_PEEK | MSG_DONTWAIT);
      if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) return self->ClientGone();
      if (kTls && n > 0) self->ProbeRead();
      self->KeepStreamAlive();
      self->WatchForHangUp();
    });
  }

  // An event stream idle for --sse-keepalive-seconds gets a comment line (ServerOptions).
  void KeepStreamAlive() {
    const double interval = server_.options_.sse_keepalive_seconds;
    if (!event_stream_ || finishing_ || writing_ || !pending_.empty() || interval <= 0) return;
    const std::chrono::duration<double> idle =
        std::chrono::steady_clock::now() - last_stream_write_;
    if (idle.count() < interval) return;
    Queue(": keep-alive\n\n");
    FlushWrites();
  }

  // Reads what the client sent during a generation into the request buffer (a pipelined request
  // stays there for the next Read); an error or close_notify means the client has gone.
  void ProbeRead() {
    if (probe_reading_ || buffer_.size() > 65536) return;
    probe_reading_ = true;
    stream_.async_read_some(buffer_.prepare(4096),
                            [self = shared_from_this()](beast::error_code ec, size_t n) {
                              self->probe_reading_ = false;
                              if (ec) {
                                if (ec == net::error::operation_aborted) return;
                                if (self->generation_ || self->follow_) return self->ClientGone();
                                return self->CloseSocket();
                              }
                              self->buffer_.commit(n);
                              if (self->read_after_probe_) {
                                self->read_after_probe_ = false;
                                self->Read();
                              }
                            });
  }

  void ClientGone() {
    client_gone_ = true;
    if (generation_)
      for (size_t i = 0; i < generation_->request_ids.size(); ++i)
        if (!generation_->done[i]) server_.engine_.Abort(generation_->request_ids[i]);
    SchedulePump();
  }

  void Pump() {
    if (follow_) return PumpFollow();
    auto g = generation_;
    if (!g) return;
    std::vector<RequestEvent> events;
    bool all_done = true;
    for (size_t i = 0; i < g->streams.size(); ++i) {
      events.clear();
      g->streams[i]->Drain(&events);
      ChoiceResult& r = g->results[i];
      for (RequestEvent& e : events) {
        if (AddChoiceEvent(r, e)) g->done[i] = true;
        const bool failed = e.finish_reason && *e.finish_reason == "error";
        if (g->messages_stream && !client_gone_) {
          Queue(failed ? g->messages_stream->Failed("generation failed: " + e.error)
                       : g->messages_stream->OnEvent(e, r));
        } else if (g->responses_stream && !client_gone_) {
          Queue(failed ? g->responses_stream->Failed("generation failed: " + e.error, r)
                       : g->responses_stream->OnEvent(e, r));
        } else if (g->plan.stream && !client_gone_) {
          if (failed) {
            Queue(StreamError({500, "generation failed: " + e.error, "", "internal_error"}));
          } else {
            Queue(StreamChunk(g->plan, static_cast<int64_t>(i), e, r, !g->started[i], g->id,
                              g->created, server_.codec_, server_.options_.limits));
            g->started[i] = true;
          }
        }
      }
      all_done = all_done && g->done[i];
    }
    if (!all_done) {
      if (g->plan.stream) FlushWrites();
      return;
    }
    // Every choice has finished.
    generation_.reset();
    --server_.active_generations_;
    bool failed = client_gone_;
    for (const ChoiceResult& r : g->results)
      failed = failed || r.finish_reason == "error" || r.finish_reason == "abort";
    FinishThread(*g, !failed);
    if (client_gone_) return Close();
    ResponsesStore* store = server_.options_.responses_store.get();
    if (g->responses_stream && store && !g->responses_stream->final_response().is_null()) {
      const nlohmann::ordered_json& final = g->responses_stream->final_response();
      AppendToConversation(*store, *g->responses, g->id, final);
      if (g->responses->store) store->Put(g->id, ResponseToStore(*g->responses, g->id, final));
    }
    if (g->plan.stream) {
      if (g->plan.include_usage)
        Queue(StreamUsageChunk(g->plan, g->results, g->id, g->created, server_.codec_,
                               server_.options_.limits));
      // The Responses and Messages APIs end with their last event.
      if (!g->responses && !g->messages) Queue(kStreamDone);
      finishing_ = true;
      keep_alive_after_stream_ = g->keep_alive;
      return FlushWrites();
    }
    for (const ChoiceResult& r : g->results)
      if (r.finish_reason == "error")
        return SendError(r.error == kNothingAllowedError
                             ? ApiError{400, r.error, "", "invalid_value"}
                             : ApiError{500, "generation failed: " + r.error, "", "internal_error"},
                         g->version, g->keep_alive);
    if (g->messages)
      return Send(MakeResponse(
          http::status::ok,
          DumpJson(MessageObject(g->plan, g->results[0], g->id, server_.options_.limits)),
          "application/json", g->version, g->keep_alive));
    if (g->responses) {
      nlohmann::ordered_json object = ResponsesObject(
          *g->responses, g->results[0], g->id, g->created, server_.codec_, server_.options_.limits);
      std::string body = DumpJson(object);
      if (store) AppendToConversation(*store, *g->responses, g->id, object);
      if (g->responses->store && store)
        store->Put(g->id, ResponseToStore(*g->responses, g->id, std::move(object)));
      return Send(MakeResponse(http::status::ok, std::move(body), "application/json", g->version,
                               g->keep_alive));
    }
    Send(MakeResponse(http::status::ok,
                      ResponseBody(g->plan, g->results, g->id, g->created, server_.codec_,
                                   server_.options_.limits),
                      "application/json", g->version, g->keep_alive));
  }

  void Queue(std::string chunk) {
    if (chunk.empty()) return;  // an empty HTTP chunk would end the response
    pending_.push_back(std::make_shared<std::string>(std::move(chunk)));
  }

  void FlushWrites() {
    if (writing_ || client_gone_) return;
    if (pending_.empty()) {
      if (finishing_) {
        finishing_ = false;
        writing_ = true;
        event_stream_ = false;
        net::async_write(stream_, http::make_chunk_last(),
                         [self = shared_from_this()](beast::error_code ec, size_t) {
                           self->writing_ = false;
                           if (ec || !self->keep_alive_after_stream_) return self->Close();
                           self->serializer_.reset();
                           self->header_.reset();
                           self->Read();
                         });
      }
      return;
    }
    // Everything queued goes out as one chunk.
    auto data = std::make_shared<std::string>();
    for (auto& piece : pending_)
      *data += *piece;
    pending_.clear();
    writing_ = true;
    last_stream_write_ = std::chrono::steady_clock::now();
    net::async_write(stream_, http::make_chunk(net::buffer(*data)),
                     [self = shared_from_this(), data](beast::error_code ec, size_t) {
                       self->writing_ = false;
                       if (ec) return self->ClientGone();
                       self->FlushWrites();
                     });
  }

  std::shared_ptr<net::ssl::context> tls_;
  Stream stream_;
  OpenAiServer::Impl& server_;
  std::string peer_;  // address:port, for logs
  bool peer_loopback_ = false;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  std::shared_ptr<Generation> generation_;
  // A background response being streamed: its id, the next event to send.
  struct Follow {
    std::string id;
    size_t next = 0;
    bool keep_alive = true;
  };
  std::unique_ptr<Follow> follow_;
  // An event stream is open (its header written, its last chunk not): when it last sent.
  bool event_stream_ = false;
  std::chrono::steady_clock::time_point last_stream_write_;
  bool anthropic_ = false;  // the request being answered is Anthropic's (its error shape)
  // The request being answered, as http_requests_total counts it.
  std::string route_ = "other", method_ = "unknown";
  std::unique_ptr<http::response<http::empty_body>> header_;
  std::unique_ptr<http::response_serializer<http::empty_body>> serializer_;
  std::deque<std::shared_ptr<std::string>> pending_;
  std::atomic<bool> pump_pending_{false};
  bool writing_ = false;
  bool finishing_ = false;
  bool keep_alive_after_stream_ = true;
  bool client_gone_ = false;
  bool probe_reading_ = false;     // TLS: a ProbeRead in flight
  bool read_after_probe_ = false;  // a Read waits for it
  bool closing_ = false;           // TLS: close_notify sent
  std::unique_ptr<std::array<char, 65536>> drain_buffer_;
  std::unique_ptr<net::steady_timer> hang_up_timer_;
};

}  // namespace

Status OpenAiServer::Impl::Listen() {
  SY_RETURN_IF_ERROR(files_status_);
  beast::error_code ec;
  const auto address = net::ip::make_address(options_.host, ec);
  if (ec) return Status::Errorf("--host {}: not an IP address ({})", options_.host, ec.message());
  const tcp::endpoint endpoint{address, static_cast<unsigned short>(options_.port)};
  acceptor_.open(endpoint.protocol(), ec);
  if (!ec) acceptor_.set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) acceptor_.bind(endpoint, ec);
  if (!ec) acceptor_.listen(net::socket_base::max_listen_connections, ec);
  if (ec)
    return Status::Errorf("cannot listen on {}:{}: {}", options_.host, options_.port, ec.message());
  port_ = acceptor_.local_endpoint().port();
  if (options_.tls.enabled()) {
    auto tls = ServerTlsContext::Load(options_.tls);
    if (!tls.ok()) return tls.status();
    tls_ = std::move(tls).value();
  }
  return Status::Ok();
}

void OpenAiServer::Impl::LogRefused(const std::string& line) {
  const int64_t second = UnixSeconds();
  std::lock_guard<std::mutex> lock(log_mutex_);
  if (second != log_second_) {
    if (not_logged_ > 0)
      std::fprintf(stderr, "switchyard: %lld more refused connections not logged\n",
                   static_cast<long long>(not_logged_));
    log_second_ = second;
    logged_this_second_ = 0;
    not_logged_ = 0;
  }
  if (logged_this_second_++ < 10) {
    std::fprintf(stderr, "%s\n", line.c_str());
  } else {
    ++not_logged_;
  }
}

// SIGHUP: new connections get the certificate, key and CAs read now; open ones keep theirs. A
// file that does not load leaves the previous context in use.
void OpenAiServer::Impl::WaitForReload() {
  reload_signal_.async_wait([this](beast::error_code ec, int) {
    if (ec) return;
    Status s = tls_->Reload();
    if (s.ok()) {
      std::fprintf(stderr, "switchyard: SIGHUP: TLS certificate reloaded from %s\n",
                   options_.tls.cert_file.c_str());
    } else {
      std::fprintf(stderr, "switchyard: SIGHUP: kept the previous TLS certificate: %s\n",
                   s.message().c_str());
    }
    WaitForReload();
  });
}

void OpenAiServer::Impl::Accept() {
  acceptor_.async_accept(net::make_strand(io_), [this](beast::error_code ec, tcp::socket socket) {
    if (ec) {
      if (ec == net::error::operation_aborted || !acceptor_.is_open()) return;
    } else {
      // Tokens go out as small writes: without TCP_NODELAY, Nagle holds each one back until the
      // client acknowledges the last, which its delayed ACK postpones by up to 40 ms.
      beast::error_code ignored;
      socket.set_option(tcp::no_delay(true), ignored);
      if (tls_) {
        std::make_shared<Session<TlsStream>>(std::move(socket), *this, tls_->Current())->Start();
      } else {
        std::make_shared<Session<PlainStream>>(std::move(socket), *this)->Start();
      }
    }
    Accept();
  });
}

std::optional<ApiError> OpenAiServer::Impl::StartBackground(ResponsesPlan plan, std::string* body,
                                                            std::string* id) {
  auto run = std::make_shared<BackgroundRun>(io_);
  run->id = "resp_" + RandomId();
  run->request_id = run->id + "-0";
  run->created = UnixSeconds();
  run->plan = std::move(plan);
  EngineRequest request;
  request.id = run->request_id;
  request.prompt = run->plan.chat.prompts[0];
  request.params = run->plan.chat.params;
  request.priority = run->plan.chat.priority;
  SubmitError why;
  std::vector<EngineRequest> requests;
  requests.push_back(std::move(request));
  auto streams = engine_.SubmitAll(std::move(requests), &why);
  if (!streams.ok()) return SubmitRefusal(streams.status(), why);
  run->stream = std::move(streams.value()[0]);
  const nlohmann::ordered_json queued =
      PendingResponse(run->plan, run->id, run->created, options_.limits, "queued");
  options_.responses_store->Put(run->id, ResponseToStore(run->plan, run->id, queued));
  *body = DumpJson(queued);
  *id = run->id;
  run->writer =
      std::make_unique<ResponsesStream>(run->plan, run->id, run->created, codec_, options_.limits);
  Log(*run, run->writer->Queued(), false);
  ++active_generations_;
  {
    std::lock_guard lock(background_mutex_);
    background_[run->id] = run;
  }
  std::weak_ptr<BackgroundRun> weak = run;
  run->stream->SetNotifier([this, weak] {
    if (auto r = weak.lock()) net::post(r->strand, [this, r] { PumpBackground(r); });
  });
  net::post(run->strand, [this, run] { PumpBackground(run); });  // events before the notifier
  return std::nullopt;
}

void OpenAiServer::Impl::Log(BackgroundRun& run, const std::string& events, bool done) {
  std::vector<std::function<void()>> wake;
  {
    std::lock_guard lock(run.log_mutex);
    // One entry per event: an event ends with a blank line, and its JSON holds no raw newline.
    for (size_t at = 0; at < events.size();) {
      size_t end = events.find("\n\n", at);
      end = end == std::string::npos ? events.size() : end + 2;
      run.log.push_back(events.substr(at, end - at));
      at = end;
    }
    run.done = done;
    wake = done ? std::move(run.watchers) : run.watchers;
  }
  for (auto& w : wake)
    w();
}

bool OpenAiServer::Impl::ReadEvents(const std::string& id, size_t from,
                                    std::vector<std::string>* out, bool* done) {
  std::shared_ptr<BackgroundRun> run;
  {
    std::lock_guard lock(background_mutex_);
    if (auto it = background_.find(id); it != background_.end()) run = it->second;
  }
  if (run) {
    std::lock_guard lock(run->log_mutex);
    for (size_t i = from; i < run->log.size(); ++i)
      out->push_back(run->log[i]);
    *done = run->done;
    return true;
  }
  auto stored = options_.responses_store ? options_.responses_store->Get(id) : nullptr;
  if (!stored || !stored->events) return false;
  for (size_t i = from; i < stored->events->size(); ++i)
    out->push_back((*stored->events)[i]);
  *done = true;
  return true;
}

void OpenAiServer::Impl::WatchEvents(const std::string& id, std::function<void()> wake) {
  std::shared_ptr<BackgroundRun> run;
  {
    std::lock_guard lock(background_mutex_);
    if (auto it = background_.find(id); it != background_.end()) run = it->second;
  }
  if (!run) return;
  std::lock_guard lock(run->log_mutex);
  if (!run->done) run->watchers.push_back(std::move(wake));
}

void OpenAiServer::Impl::PumpBackground(const std::shared_ptr<BackgroundRun>& run) {
  std::vector<RequestEvent> events;
  run->stream->Drain(&events);
  if (events.empty()) return;
  bool finished = false;
  std::string streamed;
  const bool first = !run->started;
  if (first) {
    run->started = true;
    streamed += run->writer->InProgress();
  }
  for (const RequestEvent& e : events) {
    finished = AddChoiceEvent(run->result, e) || finished;
    streamed += e.finish_reason && *e.finish_reason == "error"
                    ? run->writer->Failed("generation failed: " + e.error, run->result)
                    : run->writer->OnEvent(e, run->result);
  }
  ResponsesStore& store = *options_.responses_store;
  if (!finished) {
    Log(*run, streamed, false);
    if (first && !run->cancelled)
      store.Put(run->id, ResponseToStore(run->plan, run->id,
                                         PendingResponse(run->plan, run->id, run->created,
                                                         options_.limits, "in_progress")));
    return;
  }
  nlohmann::ordered_json done;
  if (run->result.finish_reason == "error") {
    done = PendingResponse(run->plan, run->id, run->created, options_.limits, "failed");
    done["error"] = {{"code", "server_error"},
                     {"message", "generation failed: " + run->result.error}};
  } else {
    done = ResponsesObject(run->plan, run->result, run->id, run->created, codec_, options_.limits);
    if (run->cancelled) done["status"] = "cancelled";
  }
  AppendToConversation(store, run->plan, run->id, done);
  StoredResponse kept = ResponseToStore(run->plan, run->id, std::move(done));
  Log(*run, streamed, true);
  {
    std::lock_guard lock(run->log_mutex);
    kept.events = std::make_shared<const std::vector<std::string>>(run->log);
  }
  store.Put(run->id, std::move(kept));
  {
    std::lock_guard lock(background_mutex_);
    background_.erase(run->id);
  }
  run->stream->SetNotifier(nullptr);
  --active_generations_;
}

std::optional<ApiError> OpenAiServer::Impl::CancelBackground(const std::string& id,
                                                             std::string* body) {
  std::shared_ptr<BackgroundRun> run;
  {
    std::lock_guard lock(background_mutex_);
    if (auto it = background_.find(id); it != background_.end()) run = it->second;
  }
  ResponsesStore* store = options_.responses_store.get();
  if (!run) {
    if (store && store->Get(id))
      return ApiError{400,
                      fmt::format("response '{}' is not a background response in progress", id),
                      "response_id", "invalid_value"};
    return ApiError{404, fmt::format("no stored response '{}'", id), "response_id", "not_found"};
  }
  run->cancelled = true;
  engine_.Abort(run->request_id);
  const nlohmann::ordered_json cancelled =
      PendingResponse(run->plan, run->id, run->created, options_.limits, "cancelled");
  store->Put(id, ResponseToStore(run->plan, id, cancelled));
  *body = DumpJson(cancelled);
  return std::nullopt;
}

void OpenAiServer::Impl::Shutdown() {
  if (shutting_down_.exchange(true)) return;
  net::post(io_, [this] {
    beast::error_code ignored;
    acceptor_.close(ignored);
    signals_.cancel(ignored);
    reload_signal_.cancel(ignored);
  });
  // Running requests finish (their streams keep flowing), then the I/O threads stop; Run()
  // joins this thread.
  drainer_ = std::thread([this] {
    // Batches do not outlive the process: theirs stop now, live requests drain.
    if (batches_) batches_->Stop();
    engine_.Stop(/*drain=*/true);
    for (int i = 0; i < 500 && active_generations_ > 0; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    std::this_thread::sleep_for(std::chrono::milliseconds(100));  // last writes drain
    io_.stop();
  });
}

void OpenAiServer::Impl::Run() {
  signals_.async_wait([this](beast::error_code ec, int) {
    if (!ec) Shutdown();
  });
  if (tls_) {
    reload_signal_.add(SIGHUP);
    WaitForReload();
  }
  Accept();
  // The step loop and the kernel pool keep every core busy while requests run; I/O threads at a
  // higher priority get the CPU as soon as a token is ready instead of after the scheduler's
  // slice (tens of milliseconds of TTFT otherwise). Best effort: without CAP_SYS_NICE it stays.
  auto io_thread = [this] {
    setpriority(PRIO_PROCESS, static_cast<id_t>(::gettid()), -10);
    io_.run();
  };
  std::vector<std::thread> threads;
  for (int i = 1; i < std::max(1, options_.io_threads); ++i)
    threads.emplace_back(io_thread);
  io_thread();
  for (auto& t : threads)
    t.join();
  if (drainer_.joinable()) drainer_.join();
}

OpenAiServer::OpenAiServer(RequestFrontend& engine, const TextCodec& codec, ServerOptions options)
    : impl_(std::make_unique<Impl>(engine, codec, std::move(options))) {}
OpenAiServer::~OpenAiServer() = default;
Status OpenAiServer::Listen() {
  return impl_->Listen();
}
int OpenAiServer::port() const {
  return impl_->port();
}
void OpenAiServer::Run() {
  impl_->Run();
}
void OpenAiServer::Shutdown() {
  impl_->Shutdown();
}

}  // namespace sy::serve
