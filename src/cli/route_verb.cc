// switchyard route: the OpenAI-compatible front over several engine instances (src/route).
#include <unistd.h>

#include <cstdio>

#include <nlohmann/json.hpp>

#include "cli/chat_output_options.h"
#include "cli/common.h"
#include "cli/tls_options.h"
#include "cli/verbs.h"
#include "engine/beam_search.h"
#include "route/router.h"
#include "serve/access.h"
#include "serve/grpc_tls.h"
#include "serve/http_server.h"

namespace sy {
namespace {

struct RouteArgs {
  std::vector<std::string> engines;
  std::vector<std::string> prefill_engines, decode_engines;
  std::string host = "127.0.0.1";
  int port = 8000;
  std::string policy = "cache_aware";
  std::string api_key;
  std::string model;  // the tokenizer and chat template
  std::string served_model_name;
  int io_threads = 2;
  double wait = 60;
  double probe_interval = 0.25;
  double probe_timeout = 2;
  int probe_failures = 3;
  double stall_timeout = 10;
  int64_t max_requests = 4096;
  HttpsArgs https;
  serve::GrpcTlsFiles engine_tls;  // the instances' CA; the router's client certificate
  ChatOutputArgs chat_output;
};

// An instance on another host reached in clear text: its traffic is readable on the way, and
// whoever answers at that address gets the prompts.
void WarnIfEnginesInClearText(const RouteArgs& args) {
  if (args.engine_tls.enabled()) return;
  std::vector<std::string> all = args.engines;
  all.insert(all.end(), args.prefill_engines.begin(), args.prefill_engines.end());
  all.insert(all.end(), args.decode_engines.begin(), args.decode_engines.end());
  for (const std::string& engine : all) {
    const std::string host = engine.substr(0, engine.rfind(':'));
    if (!serve::IsLoopbackHost(host))
      WarnIfExposed(
          fmt::format("warning: instance {} is reached in clear text without checking who answers "
                      "(--engine-tls-ca, --engine-tls-cert, --engine-tls-key for mutual TLS)",
                      engine));
  }
}

void RunRoute(const RouteArgs& args) {
  auto policy = route::ParsePolicy(args.policy);
  if (!policy.ok()) FailVerb(policy.status().message());
  CheckHttpsOrFail(args.https);
  if (Status s = serve::CheckGrpcClientTls(args.engine_tls); !s.ok()) FailVerb(s.message());
  WarnIfEnginesInClearText(args);
  const std::string directory = ResolveModelDirectory(args.model);
  TextCodec codec = LoadTextCodecOrFail(directory);
  ApplyChatTemplateOrFail(args.chat_output.chat_template, &codec);
  route::RouterOptions options;
  options.engines = args.engines;
  options.prefill_engines = args.prefill_engines;
  options.decode_engines = args.decode_engines;
  if (args.engines.empty() && args.prefill_engines.empty())
    FailVerb("route: give --engines, or --prefill-engines and --decode-engines");
  options.policy = policy.value();
  options.probe_interval_seconds = args.probe_interval;
  options.probe_timeout_seconds = args.probe_timeout;
  options.probe_failures = args.probe_failures;
  options.stall_timeout_seconds = args.stall_timeout;
  options.max_requests = args.max_requests;
  options.credentials = serve::GrpcChannelCredentials(args.engine_tls);
  route::Router router(options);
  if (Status s = router.Start(args.wait); !s.ok()) FailVerb(s.message());
  const RequestLimits limits = router.limits();
  if (codec.tokenizer->vocab_size() > limits.vocab_size)
    FailVerb(fmt::format("{}: the tokenizer has {} ids but the instances' vocabulary is {}",
                         codec.tokenizer->source(), codec.tokenizer->vocab_size(),
                         limits.vocab_size));
  serve::ServerOptions server_options;
  server_options.host = args.host;
  server_options.port = args.port;
  server_options.api_key = args.api_key;
  server_options.tls = args.https.Files();
  server_options.io_threads = args.io_threads;
  server_options.limits.model_name =
      args.served_model_name.empty() ? std::string("default") : args.served_model_name;
  server_options.limits.max_model_len = limits.max_model_len;
  server_options.limits.cache_tokens = limits.cache_tokens;
  server_options.limits.priority_scheduling = limits.priority_scheduling;
  ApplyChatOutputOrFail(args.chat_output, codec, &server_options);
  // Admin: GET /admin/engines; POST /admin/drain and /admin/resume with {"engine": "host:port"}.
  server_options.admin = [&router](const std::string& method, const std::string& path,
                                   const std::string& body) -> std::pair<int, std::string> {
    auto error = [](int status, const std::string& message) {
      return std::pair<int, std::string>(
          status, nlohmann::json({{"error", {{"message", message}, {"code", status}}}}).dump());
    };
    if (path == "/admin/engines" && method == "GET") {
      nlohmann::json engines = nlohmann::json::array();
      for (const auto& t : router.Targets()) {
        engines.push_back({{"engine", t.address},
                           {"pool", t.pool.empty() ? "both" : t.pool},
                           {"healthy", t.healthy},
                           {"draining", t.draining},
                           {"in_flight", t.in_flight},
                           {"routed_total", t.routed_total},
                           {"cached_pages", t.cached_pages},
                           {"failovers_from", t.failovers_from},
                           {"missed_probes", t.missed_probes}});
        if (!t.transfer_address.empty()) engines.back()["transfer_address"] = t.transfer_address;
      }
      return {200, nlohmann::json({{"engines", engines}}).dump()};
    }
    if ((path == "/admin/drain" || path == "/admin/resume") && method == "POST") {
      auto parsed = nlohmann::json::parse(body, nullptr, false);
      if (parsed.is_discarded() || !parsed.is_object() || !parsed.contains("engine") ||
          !parsed["engine"].is_string())
        return error(400, "expected {\"engine\": \"host:port\"}");
      const std::string engine = parsed["engine"];
      if (!router.SetDraining(engine, path == "/admin/drain"))
        return error(404, "no instance " + engine + " behind this router");
      return {200,
              nlohmann::json({{"engine", engine}, {"draining", path == "/admin/drain"}}).dump()};
    }
    return error(404, "no such admin endpoint: " + method + " " + path);
  };
  BeamSearchFrontend beams(router, *codec.tokenizer, limits);
  serve::OpenAiServer server(beams, codec, server_options);
  if (Status s = server.Listen(); !s.ok()) FailVerb(s.message());
  WarnIfExposed(serve::HttpExposureWarning(args.host, server.port(), server_options.tls.enabled(),
                                           !args.api_key.empty()));
  std::printf(
      "switchyard: serving %s on %s://%s:%d (pid %d; router over %zu instances%s, policy "
      "%s)\n",
      server_options.limits.model_name.c_str(), server_options.tls.enabled() ? "https" : "http",
      args.host.c_str(), server.port(), static_cast<int>(::getpid()), router.Targets().size(),
      args.engine_tls.cert_file.empty() ? (args.engine_tls.enabled() ? " over TLS" : "")
                                        : " over mutual TLS",
      route::PolicyName(options.policy));
  std::fflush(stdout);
  server.Run();
  std::printf("switchyard: stopped (%lld failovers)\n",
              static_cast<long long>(router.failovers_total()));
}

}  // namespace

void AddRouteVerb(CLI::App& app) {
  auto args = std::make_shared<RouteArgs>();
  CLI::App* verb = app.add_subcommand(
      "route", "OpenAI-compatible front over several instances: prefix-aware routing, failover");
  verb->add_option("--engines", args->engines, "Instances' gRPC addresses, host:port,host:port")
      ->delimiter(',');
  verb->add_option("--prefill-engines", args->prefill_engines,
                   "Disaggregation: the prefill pool (serve --role prefill), host:port,...; "
                   "chosen by --policy")
      ->delimiter(',');
  verb->add_option("--decode-engines", args->decode_engines,
                   "Disaggregation: the decode pool (serve --role decode), host:port,...; "
                   "chosen by queued tokens")
      ->delimiter(',');
  verb->add_option("--host", args->host, "Address to bind (default 127.0.0.1)");
  verb->add_option("--port", args->port, "Port (0: any free port)")->check(CLI::Range(0, 65535));
  verb->add_option("--policy", args->policy,
                   "cache_aware (default), least_load, round_robin or power_of_two");
  AddHttpsOptions(verb, args->https, args->api_key);
  verb->add_option("--engine-tls-ca", args->engine_tls.ca_file,
                   "Reach the instances over TLS, trusting certificates from these PEM CAs");
  verb->add_option("--engine-tls-cert", args->engine_tls.cert_file,
                   "The router's PEM client certificate for instances that require one");
  verb->add_option("--engine-tls-key", args->engine_tls.key_file, "Its PEM private key");
  verb->add_option("--model", args->model,
                   "Checkpoint directory whose tokenizer and chat template to use (default: "
                   "models/default)");
  AddChatOutputOptions(verb, args->chat_output);
  verb->add_option("--served-model-name", args->served_model_name,
                   "The model name clients use (default: default)");
  verb->add_option("--io-threads", args->io_threads, "HTTP I/O threads")->check(CLI::Range(1, 64));
  verb->add_option("--wait", args->wait, "Seconds to wait for a first healthy instance")
      ->check(CLI::Range(0.0, 3600.0));
  verb->add_option("--probe-interval", args->probe_interval, "Seconds between health probes")
      ->check(CLI::Range(0.01, 60.0));
  verb->add_option("--probe-timeout", args->probe_timeout,
                   "Seconds a health probe may take before it counts as missed")
      ->check(CLI::Range(0.05, 600.0));
  verb->add_option("--probe-failures", args->probe_failures,
                   "Probes missed in a row that eject a serving instance (its streams fail "
                   "over; one missed probe only keeps new requests away while others serve)")
      ->check(CLI::Range(1, 1000));
  verb->add_option("--stall-timeout", args->stall_timeout,
                   "Seconds a step may run before its instance counts as stalled")
      ->check(CLI::Range(0.1, 3600.0));
  verb->add_option("--max-requests", args->max_requests,
                   "Requests the router holds at once; more get 503 with Retry-After")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 24));
  verb->callback([args] { RunRoute(*args); });
}

}  // namespace sy
