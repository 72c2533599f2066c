#include "bench/serve_bench.h"

#include <algorithm>
#include <boost/asio.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast.hpp>
#include <boost/beast/ssl.hpp>
#include <chrono>
#include <cmath>
#include <ctime>
#include <fstream>
#include <limits>
#include <mutex>
#include <numeric>
#include <optional>
#include <random>
#include <sstream>
#include <thread>
#include <type_traits>

#include <nlohmann/json.hpp>

#include "base/clock.h"

namespace sy::bench {
namespace {

namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;
using json = nlohmann::json;

using TlsStream = beast::ssl_stream<beast::tcp_stream>;

struct Endpoint {
  std::string host, port;
  std::shared_ptr<net::ssl::context> tls;  // https: the client context (null: http)
};

Result<Endpoint> ParseUrl(const std::string& url) {
  std::string rest = url;
  bool https = false;
  if (rest.rfind("http://", 0) == 0) {
    rest = rest.substr(7);
  } else if (rest.rfind("https://", 0) == 0) {
    rest = rest.substr(8);
    https = true;
  } else if (rest.find("://") != std::string::npos) {
    return Status::Errorf("--url {}: only http:// and https:// are supported", url);
  }
  rest = rest.substr(0, rest.find('/'));
  const size_t colon = rest.rfind(':');
  Endpoint endpoint{rest, https ? "443" : "80", nullptr};
  if (colon != std::string::npos && rest.back() != ']') {
    endpoint.host = rest.substr(0, colon);
    endpoint.port = rest.substr(colon + 1);
  }
  if (endpoint.host.size() >= 2 && endpoint.host.front() == '[')
    endpoint.host = endpoint.host.substr(1, endpoint.host.size() - 2);
  return endpoint;
}

// The client side of https://: the server's certificate verified against --ssl-ca-certs (or
// the system's CAs) and its name against the URL's host, unless --insecure.
Result<std::shared_ptr<net::ssl::context>> ClientTlsContext(const ServeBenchOptions& o) {
  auto context = std::make_shared<net::ssl::context>(net::ssl::context::tls_client);
  beast::error_code ec;
  if (o.insecure) {
    context->set_verify_mode(net::ssl::verify_none, ec);
    return context;
  }
  context->set_verify_mode(net::ssl::verify_peer, ec);
  if (o.ssl_ca_certs.empty()) {
    context->set_default_verify_paths(ec);
  } else {
    context->load_verify_file(o.ssl_ca_certs, ec);
  }
  if (ec)
    return Status::Errorf("--ssl-ca-certs {}: not a readable PEM certificate list ({})",
                          o.ssl_ca_certs, ec.message());
  return context;
}

// Connects `stream` (plain, or TLS with the handshake done) to the endpoint.
beast::error_code Connect(net::io_context& io, const Endpoint& endpoint,
                          beast::tcp_stream& stream) {
  beast::error_code ec;
  tcp::resolver resolver(io);
  auto results = resolver.resolve(endpoint.host, endpoint.port, ec);
  if (!ec) stream.connect(results, ec);
  if (!ec) stream.socket().set_option(tcp::no_delay(true), ec);
  return ec;
}

beast::error_code Connect(net::io_context& io, const Endpoint& endpoint, TlsStream& stream) {
  beast::error_code ec = Connect(io, endpoint, beast::get_lowest_layer(stream));
  if (ec) return ec;
  beast::error_code not_ip;
  net::ip::make_address(endpoint.host, not_ip);
  if (not_ip)  // SNI carries names, never addresses
    SSL_set_tlsext_host_name(stream.native_handle(), endpoint.host.c_str());
  stream.set_verify_callback(net::ssl::host_name_verification(endpoint.host));
  stream.handshake(net::ssl::stream_base::client, ec);
  return ec;
}

struct RequestRecord {
  bool success = false;
  std::string error;
  int64_t prompt_len = 0;
  int64_t output_tokens = 0;
  double ttft = 0, latency = 0;
  std::vector<double> itl;
  std::string text;
};

// One keep-alive connection issuing streaming completions one after another, over a plain
// (beast::tcp_stream) or a TLS stream (TlsStream).
template <class Stream>
class Client {
 public:
  Client(const Endpoint& endpoint, std::string api_key)
      : endpoint_(endpoint), api_key_(std::move(api_key)) {}

  // `response_format`: null, or structured output (the request then ends when complete).
  RequestRecord Complete(const std::string& model, const std::vector<int32_t>& prompt,
                         int64_t output_len, const json& response_format) {
    RequestRecord record;
    record.prompt_len = static_cast<int64_t>(prompt.size());
    json body = {{"model", model},           {"prompt", prompt},
                 {"max_tokens", output_len}, {"temperature", 0},
                 {"stream", true},           {"stream_options", {{"include_usage", true}}}};
    if (response_format.is_null()) {
      body["ignore_eos"] = true;
    } else {
      body["response_format"] = response_format;
    }
    http::request<http::string_body> request{http::verb::post, "/v1/completions", 11};
    request.set(http::field::host, endpoint_.host);
    request.set(http::field::content_type, "application/json");
    if (!api_key_.empty()) request.set(http::field::authorization, "Bearer " + api_key_);
    request.keep_alive(true);
    request.body() = body.dump();
    request.prepare_payload();
    beast::error_code ec;
    for (int attempt = 0; attempt < 2; ++attempt) {
      if (!connected_) {
        if constexpr (std::is_same_v<Stream, TlsStream>) {
          stream_.emplace(io_, *endpoint_.tls);
        } else {
          stream_.emplace(io_);
        }
        ec = Connect(io_, endpoint_, *stream_);
        if (ec) {
          record.error = "connect: " + ec.message();
          return record;
        }
        connected_ = true;
      }
      const double start = NowSeconds();
      http::write(*stream_, request, ec);
      if (ec) {  // the server closed an idle keep-alive connection: reconnect once
        Reset();
        continue;
      }
      Receive(start, record);
      return record;
    }
    record.error = "write: " + ec.message();
    return record;
  }

 private:
  void Reset() {
    beast::error_code ignored;
    if (stream_) beast::get_lowest_layer(*stream_).socket().close(ignored);
    stream_.reset();  // a TLS stream is not reused after its connection ends
    connected_ = false;
    buffer_.clear();
  }

  void Receive(double start, RequestRecord& record) {
    http::response_parser<http::buffer_body> parser;
    // No limit, spelled as the largest: Boost 1.81's parser compares a Content-Length against
    // an empty optional as greater, so body_limit(boost::none) refuses every error reply (which
    // has one) with "body limit exceeded" and hides the server's message.
    parser.body_limit(std::numeric_limits<std::uint64_t>::max());
    beast::error_code ec;
    http::read_header(*stream_, buffer_, parser, ec);
    if (ec) {
      record.error = "read: " + ec.message();
      return Reset();
    }
    const bool ok = parser.get().result() == http::status::ok;
    std::string pending, error_body;
    double last = start;
    bool first = true;
    char chunk[16384];
    while (!parser.is_done()) {
      parser.get().body().data = chunk;
      parser.get().body().size = sizeof(chunk);
      http::read_some(*stream_, buffer_, parser, ec);  // returns as soon as some body arrived
      if (ec == http::error::need_buffer) ec = {};
      if (ec) {
        record.error = "read: " + ec.message();
        return Reset();
      }
      const size_t got = sizeof(chunk) - parser.get().body().size;
      const double now = NowSeconds();
      if (!ok) {
        error_body.append(chunk, got);
        continue;
      }
      pending.append(chunk, got);
      size_t end;
      while ((end = pending.find("\n\n")) != std::string::npos) {
        const std::string event = pending.substr(0, end);
        pending.erase(0, end + 2);
        if (event.rfind("data: ", 0) != 0) continue;
        const std::string data = event.substr(6);
        if (data == "[DONE]") continue;
        json value = json::parse(data, nullptr, false);
        if (!value.is_object()) continue;
        if (value.contains("error")) {
          record.error = value["error"].value("message", "error event");
          continue;
        }
        if (value.contains("usage") && value["usage"].is_object())
          record.output_tokens = value["usage"].value("completion_tokens", int64_t{0});
        if (!value.contains("choices") || value["choices"].empty()) continue;
        const std::string text = value["choices"][0].value("text", std::string());
        if (text.empty() && value["choices"][0]["finish_reason"].is_null()) continue;
        if (first) {
          record.ttft = now - start;
          first = false;
        } else {
          record.itl.push_back(now - last);
        }
        last = now;
        record.text += text;
      }
    }
    record.latency = NowSeconds() - start;
    if (!ok) {
      record.error =
          fmt::format("HTTP {}: {}", static_cast<int>(parser.get().result()), error_body);
      return;
    }
    if (!parser.get().keep_alive()) Reset();
    record.success = record.error.empty() && !first;
  }

  Endpoint endpoint_;
  std::string api_key_;
  net::io_context io_;
  std::optional<Stream> stream_;
  beast::flat_buffer buffer_;
  bool connected_ = false;
};

template <class Stream>
Result<std::string> FirstModel(const Endpoint& endpoint, const std::string& api_key) {
  try {
    net::io_context io;
    std::optional<Stream> holder;
    if constexpr (std::is_same_v<Stream, TlsStream>) {
      holder.emplace(io, *endpoint.tls);
    } else {
      holder.emplace(io);
    }
    Stream& stream = *holder;
    if (beast::error_code ec = Connect(io, endpoint, stream)) throw beast::system_error(ec);
    http::request<http::empty_body> request{http::verb::get, "/v1/models", 11};
    request.set(http::field::host, endpoint.host);
    if (!api_key.empty()) request.set(http::field::authorization, "Bearer " + api_key);
    http::write(stream, request);
    beast::flat_buffer buffer;
    http::response<http::string_body> response;
    http::read(stream, buffer, response);
    json value = json::parse(response.body(), nullptr, false);
    if (!value.is_object() || !value.contains("data") || value["data"].empty())
      return Status::Errorf("/v1/models gave no model: {}", response.body());
    return value["data"][0]["id"].get<std::string>();
  } catch (const std::exception& e) {
    return Status::Errorf("cannot reach {}:{}: {}", endpoint.host, endpoint.port, e.what());
  }
}

struct Stats {
  double mean = 0, median = 0, std = 0, p99 = 0;
};

Stats Summarize(std::vector<double> values) {
  Stats s;
  if (values.empty()) return s;
  std::sort(values.begin(), values.end());
  const double n = static_cast<double>(values.size());
  s.mean = std::accumulate(values.begin(), values.end(), 0.0) / n;
  s.median = values.size() % 2 ? values[values.size() / 2]
                               : (values[values.size() / 2 - 1] + values[values.size() / 2]) / 2;
  double var = 0;
  for (double v : values)
    var += (v - s.mean) * (v - s.mean);
  s.std = std::sqrt(var / n);
  // numpy.percentile's linear interpolation, as vLLM computes it.
  const double rank = 0.99 * (n - 1);
  const size_t lo = static_cast<size_t>(std::floor(rank));
  const size_t hi = std::min(values.size() - 1, lo + 1);
  s.p99 = values[lo] + (values[hi] - values[lo]) * (rank - static_cast<double>(lo));
  return s;
}

}  // namespace

Result<ServeBenchResult> BenchServe(const ServeBenchOptions& o) {
  SY_ASSIGN_OR_RETURN(Endpoint endpoint, ParseUrl(o.url));
  const bool https = o.url.rfind("https://", 0) == 0;
  if (https) {
    SY_ASSIGN_OR_RETURN(endpoint.tls, ClientTlsContext(o));
  }
  std::string model = o.model;
  if (model.empty()) {
    SY_ASSIGN_OR_RETURN(model, https ? FirstModel<TlsStream>(endpoint, o.api_key)
                                     : FirstModel<beast::tcp_stream>(endpoint, o.api_key));
  }
  if (o.num_prompts <= 0 || o.input_len <= 0 || o.output_len <= 0)
    return Status::Error("--num-prompts, --input-len and --output-len must be positive");

  // The prompts: random ids, or groups sharing a prefix (documents with several questions),
  // shuffled so a group's prompts are spread over the run.
  std::mt19937_64 rng(o.seed);
  const int64_t vocab = o.vocab_size > 0 ? o.vocab_size : 4096;
  std::uniform_int_distribution<int32_t> token(16, static_cast<int32_t>(vocab - 1));
  auto length = [&](int64_t base) {
    const int64_t lo = std::max<int64_t>(1, static_cast<int64_t>(base * (1 - o.range_ratio)));
    const int64_t hi = std::max(lo, static_cast<int64_t>(base * (1 + o.range_ratio)));
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  std::vector<std::vector<int32_t>> prompts;
  std::vector<int64_t> output_lens;
  if (o.dataset == "random") {
    for (int64_t i = 0; i < o.num_prompts; ++i) {
      std::vector<int32_t> p(static_cast<size_t>(length(o.input_len)));
      for (auto& t : p)
        t = token(rng);
      prompts.push_back(std::move(p));
    }
  } else if (o.dataset == "shared-prefix") {
    const int64_t groups =
        o.num_prefixes > 0 ? o.num_prefixes : std::max<int64_t>(1, o.num_prompts / 8);
    const int64_t prefix = o.prefix_len > 0 ? o.prefix_len : o.input_len * 3 / 4;
    std::vector<std::vector<int32_t>> prefixes(groups);
    for (auto& p : prefixes) {
      p.resize(static_cast<size_t>(prefix));
      for (auto& t : p)
        t = token(rng);
    }
    for (int64_t i = 0; i < o.num_prompts; ++i) {
      std::vector<int32_t> p = prefixes[i % groups];
      const int64_t suffix = std::max<int64_t>(1, length(o.input_len) - prefix);
      for (int64_t k = 0; k < suffix; ++k)
        p.push_back(token(rng));
      prompts.push_back(std::move(p));
    }
    std::shuffle(prompts.begin(), prompts.end(), rng);
  } else {
    return Status::Errorf("--dataset {}: random or shared-prefix", o.dataset);
  }
  for (int64_t i = 0; i < o.num_prompts; ++i)
    output_lens.push_back(length(o.output_len));
  std::vector<json> formats(static_cast<size_t>(o.num_prompts));
  if (!o.response_format_file.empty()) {
    std::ifstream file(o.response_format_file);
    std::stringstream text;
    text << file.rdbuf();
    const json format = json::parse(text.str(), nullptr, false);
    if (!file || !format.is_object() || !format.contains("type"))
      return Status::Errorf("--response-format {}: not a readable JSON object with a \"type\"",
                            o.response_format_file);
    const bool schema = format["type"] == "json_schema" && format.contains("json_schema") &&
                        format["json_schema"].is_object() &&
                        format["json_schema"].contains("schema") &&
                        format["json_schema"]["schema"].is_object();
    if (o.cold_grammar && !schema)
      return Status::Error("--cold-grammar needs a json_schema --response-format");
    const std::string run = fmt::format("{:x}", std::random_device{}());
    for (int64_t i = 0; i < o.num_prompts; ++i) {
      formats[i] = format;
      if (o.cold_grammar)
        formats[i]["json_schema"]["schema"]["$comment"] = fmt::format("run {} request {}", run, i);
    }
  } else if (o.cold_grammar) {
    return Status::Error("--cold-grammar needs --response-format");
  }

  // Arrival times: all at once, or a Poisson process at --request-rate.
  std::vector<double> arrivals(static_cast<size_t>(o.num_prompts), 0.0);
  if (o.request_rate > 0) {
    std::exponential_distribution<double> gap(o.request_rate);
    double t = 0;
    for (auto& a : arrivals) {
      a = t;
      t += gap(rng);
    }
  }
  std::vector<RequestRecord> records(static_cast<size_t>(o.num_prompts));
  const int64_t workers =
      o.concurrency > 0 ? std::min(o.concurrency, o.num_prompts) : o.num_prompts;
  std::atomic<int64_t> next{0};
  const double start = NowSeconds();
  std::vector<std::thread> threads;
  for (int64_t w = 0; w < workers; ++w) {
    threads.emplace_back([&] {
      auto run = [&](auto& client) {
        for (int64_t i; (i = next.fetch_add(1)) < o.num_prompts;) {
          const double wait = start + arrivals[i] - NowSeconds();
          if (wait > 0) std::this_thread::sleep_for(std::chrono::duration<double>(wait));
          records[i] = client.Complete(model, prompts[i], output_lens[i], formats[i]);
        }
      };
      if (https) {
        Client<TlsStream> client(endpoint, o.api_key);
        run(client);
      } else {
        Client<beast::tcp_stream> client(endpoint, o.api_key);
        run(client);
      }
    });
  }
  for (auto& t : threads)
    t.join();
  const double duration = NowSeconds() - start;

  // vLLM's metrics.
  int64_t completed = 0, input_tokens = 0, output_tokens = 0, good = 0;
  std::vector<double> ttfts, tpots, itls, e2els;
  json errors = json::array(), input_lens = json::array(), out_lens = json::array(),
       ttft_list = json::array(), itl_list = json::array();
  for (const RequestRecord& r : records) {
    input_lens.push_back(r.prompt_len);
    out_lens.push_back(r.output_tokens);
    ttft_list.push_back(r.ttft);
    itl_list.push_back(r.itl);
    errors.push_back(r.error);
    if (!r.success) continue;
    ++completed;
    input_tokens += r.prompt_len;
    output_tokens += r.output_tokens;
    ttfts.push_back(r.ttft);
    e2els.push_back(r.latency);
    double tpot = 0;
    if (r.output_tokens > 1) {
      tpot = (r.latency - r.ttft) / static_cast<double>(r.output_tokens - 1);
      tpots.push_back(tpot);
    }
    itls.insert(itls.end(), r.itl.begin(), r.itl.end());
    const bool meets = (o.goodput_ttft_ms <= 0 || r.ttft * 1e3 <= o.goodput_ttft_ms) &&
                       (o.goodput_tpot_ms <= 0 || tpot * 1e3 <= o.goodput_tpot_ms) &&
                       (o.goodput_e2el_ms <= 0 || r.latency * 1e3 <= o.goodput_e2el_ms);
    if (meets) ++good;
  }
  json out = {
      {"date", ""},
      {"backend", "openai"},
      {"model_id", model},
      {"num_prompts", o.num_prompts},
      {"request_rate", o.request_rate > 0 ? json(o.request_rate) : json("inf")},
      {"burstiness", 1.0},
      {"max_concurrency", o.concurrency > 0 ? json(o.concurrency) : json(nullptr)},
      {"duration", duration},
      {"completed", completed},
      {"total_input_tokens", input_tokens},
      {"total_output_tokens", output_tokens},
      {"request_throughput", completed / duration},
      {"request_goodput", (o.goodput_ttft_ms > 0 || o.goodput_tpot_ms > 0 || o.goodput_e2el_ms > 0)
                              ? json(good / duration)
                              : json(nullptr)},
      {"output_throughput", output_tokens / duration},
      {"total_token_throughput", (input_tokens + output_tokens) / duration},
      {"input_lens", input_lens},
      {"output_lens", out_lens},
      {"ttfts", ttft_list},
      {"itls", itl_list},
      {"errors", errors}};
  std::string table = fmt::format(
      "============ Serving Benchmark Result ============\n"
      "{:<40}{:>10}\n{:<40}{:>10.2f}\n{:<40}{:>10}\n{:<40}{:>10}\n"
      "{:<40}{:>10.2f}\n{:<40}{:>10.2f}\n{:<40}{:>10.2f}\n",
      "Successful requests:", completed, "Benchmark duration (s):", duration,
      "Total input tokens:", input_tokens, "Total generated tokens:", output_tokens,
      "Request throughput (req/s):", completed / duration,
      "Output token throughput (tok/s):", output_tokens / duration,
      "Total Token throughput (tok/s):", (input_tokens + output_tokens) / duration);
  for (const auto& [name, label, values] :
       {std::tuple{"ttft", "Time to First Token", &ttfts},
        std::tuple{"tpot", "Time per Output Token (excl. 1st token)", &tpots},
        std::tuple{"itl", "Inter-token Latency", &itls},
        std::tuple{"e2el", "End-to-end Latency", &e2els}}) {
    const Stats s = Summarize(*values);
    out[fmt::format("mean_{}_ms", name)] = s.mean * 1e3;
    out[fmt::format("median_{}_ms", name)] = s.median * 1e3;
    out[fmt::format("std_{}_ms", name)] = s.std * 1e3;
    out[fmt::format("p99_{}_ms", name)] = s.p99 * 1e3;
    table += fmt::format("{:-^50}\n{:<40}{:>10.2f}\n{:<40}{:>10.2f}\n{:<40}{:>10.2f}\n",
                         fmt::format("{}", label), fmt::format("Mean {} (ms):", name), s.mean * 1e3,
                         fmt::format("Median {} (ms):", name), s.median * 1e3,
                         fmt::format("P99 {} (ms):", name), s.p99 * 1e3);
  }
  if (completed < o.num_prompts) {
    for (const RequestRecord& r : records)
      if (!r.success) {
        table += fmt::format("failed requests: {} (first error: {})\n", o.num_prompts - completed,
                             r.error);
        break;
      }
  }
  table += "==================================================\n";
  return ServeBenchResult{out.dump(2), table};
}

}  // namespace sy::bench
