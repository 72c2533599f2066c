// switchyard serve: the engine behind the OpenAI-compatible HTTP server.
#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <map>
#include <thread>

#include <nlohmann/json.hpp>

#include "cli/chat_output_options.h"
#include "cli/common.h"
#include "cli/parallel_setup.h"
#include "cli/tls_options.h"
#include "cli/verbs.h"
#include "engine/beam_search.h"
#include "engine/engine.h"
#include "kernels/cpu/latent_row.h"
#include "serve/access.h"
#include "serve/batches.h"
#include "serve/cluster.h"
#include "serve/grpc_service.h"
#include "serve/grpc_tls.h"
#include "serve/http_server.h"
#include "serve/metrics.h"
#include "transfer/kv_transfer.h"

namespace sy {
namespace {

struct ServeArgs {
  std::string model;
  std::string host = "127.0.0.1";
  int port = 8000;
  std::string served_model_name;
  int64_t max_num_seqs = 256;
  std::string grammar_masks = "beside-forward";
  std::string scheduling_policy = "fcfs";
  int64_t max_num_batched_tokens = 2048;
  int64_t kv_cache_tokens = 0;
  int64_t max_model_len = 0;
  int64_t max_waiting = 4096;
  std::string api_key;
  std::string kv_dtype = "bf16";
  int io_threads = 2;
  double step_timeout = 120;
  SpeculativeArgs speculative;
  bool batch_invariant = false;
  int grpc_port = -1;  // -1: no gRPC
  std::string grpc_host;
  serve::GrpcTlsFiles grpc_tls;
  HttpsArgs https;
  ParallelArgs parallel;
  // Prefill/decode disaggregation.
  std::string role = "both";
  std::string transfer_host;  // default: --grpc-host, else --host
  int transfer_port = 0;
  double transfer_timeout = 600;
  ChatOutputArgs chat_output;
  // `switchyard run-batch` (vLLM's `run-batch`): the requests file, and where the results go.
  std::string batch_input, batch_output;
};

// The transfer side of --role: a prefill instance sends rows, a decode instance receives them.
struct Disaggregation {
  std::unique_ptr<transfer::Sender> sender;
  std::unique_ptr<transfer::Receiver> receiver;
};

std::string TransferHost(const ServeArgs& args) {
  return !args.transfer_host.empty() ? args.transfer_host
         : !args.grpc_host.empty()   ? args.grpc_host
                                     : args.host;
}

// One process's; under mpirun each DP group's first rank has its own (StartGroupTransfers).
Status StartDisaggregation(const ServeArgs& args, Disaggregation* d) {
  if (args.role == "prefill") {
    auto sender = transfer::Sender::Start();
    if (!sender.ok()) return Status::Error("--role prefill: " + sender.status().message());
    d->sender = std::move(sender.value());
  } else if (args.role == "decode") {
    auto receiver = transfer::Receiver::Start(TransferHost(args), args.transfer_port);
    if (!receiver.ok()) return Status::Error("--role decode: " + receiver.status().message());
    d->receiver = std::move(receiver.value());
  }
  serve::PublishTransfers(d->sender.get(), d->receiver.get());
  return Status::Ok();
}

// This machine's address on the route toward `host` (a connected UDP socket's own address: no
// packet is sent), or its host name where that fails: what a group on another machine of the
// job listens on when `--transfer-host` names rank 0's.
std::string LocalAddressToward(const std::string& host) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  std::string out;
  if (::getaddrinfo(host.c_str(), "9", &hints, &found) == 0 && found != nullptr) {
    const int fd = ::socket(found->ai_family, SOCK_DGRAM, 0);
    sockaddr_storage own{};
    socklen_t length = sizeof own;
    char text[INET6_ADDRSTRLEN] = {};
    if (fd >= 0 && ::connect(fd, found->ai_addr, found->ai_addrlen) == 0 &&
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&own), &length) == 0) {
      const void* raw =
          own.ss_family == AF_INET
              ? static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(&own)->sin_addr)
              : static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(&own)->sin6_addr);
      if (::inet_ntop(own.ss_family, raw, text, sizeof text) != nullptr) out = text;
    }
    if (fd >= 0) ::close(fd);
    ::freeaddrinfo(found);
  }
  if (out.empty()) {
    char name[256] = {};
    if (::gethostname(name, sizeof name - 1) == 0) out = name;
  }
  return out;
}

// A disaggregated job under mpirun (collective): each DP group's first rank moves its group's
// rows itself, so they go straight between the instance that computes them and the group that
// decodes them. A decode group's first rank listens on --transfer-host where this machine has
// that address, else on its own address toward that host (a group on another machine), on
// --transfer-port + g when a port is given; a prefill group's first rank starts a sender.
// Returns every group's listening address (empty for prefill), on every rank.
std::vector<std::string> StartGroupTransfers(const ServeArgs& args, Communicator& comm, int tp,
                                             Disaggregation* own) {
  std::string line;  // this rank's address, or "!" and why it has none
  if (comm.rank() % tp == 0) {
    const int group = comm.rank() / tp;
    Status started = Status::Ok();
    if (args.role == "prefill") {
      auto sender = transfer::Sender::Start();
      if (sender.ok())
        own->sender = std::move(sender.value());
      else
        started = sender.status();
    } else {
      const int port = args.transfer_port > 0 ? args.transfer_port + group : 0;
      auto receiver = transfer::Receiver::Start(TransferHost(args), port);
      if (!receiver.ok() && comm.rank() != 0) {
        const std::string here = LocalAddressToward(TransferHost(args));
        if (!here.empty()) {
          auto again = transfer::Receiver::Start(here, port);
          if (again.ok()) receiver = std::move(again);
        }
      }
      if (receiver.ok()) {
        own->receiver = std::move(receiver.value());
        line = own->receiver->address();
      } else {
        started = receiver.status();
      }
    }
    if (!started.ok())
      line = fmt::format("!--role {}, DP group {} (rank {}): {}", args.role, group, comm.rank(),
                         started.message());
  }
  std::vector<uint8_t> bytes(line.begin(), line.end());
  bytes.push_back(0);
  const std::vector<uint8_t> all = comm.AllGather(bytes);
  std::vector<std::string> addresses;
  for (size_t at = 0, rank = 0; at < all.size(); ++rank) {
    const std::string entry(reinterpret_cast<const char*>(all.data() + at));
    at += entry.size() + 1;
    if (rank % static_cast<size_t>(tp) != 0) continue;
    if (!entry.empty() && entry[0] == '!') FailEverywhere(comm, entry.substr(1));
    addresses.push_back(entry);
  }
  return addresses;
}

std::string RoleNote(const ServeArgs& args, const Disaggregation& d,
                     const std::vector<std::string>& group_receivers = {}) {
  if (!group_receivers.empty() && !group_receivers[0].empty()) {
    std::string note = " as a decode job receiving each DP group's rows on";
    for (size_t g = 0; g < group_receivers.size(); ++g)
      note += fmt::format("{} ucx://{} (group {})", g > 0 ? "," : "", group_receivers[g], g);
    return note;
  }
  if (args.role == "both") return "";
  if (d.receiver)
    return fmt::format(" as a decode instance receiving on ucx://{}", d.receiver->address());
  return " as a prefill instance";
}

// The gRPC instance API beside HTTP, when --grpc-port is given; fails the verb if it cannot bind.
std::unique_ptr<serve::GrpcEngineServer> StartGrpc(
    const ServeArgs& args, RequestFrontend& frontend, const serve::ServerOptions& options,
    const EngineConfig& engine_config, const Engine& engine, Status* status,
    const Disaggregation* disaggregation = nullptr, const LatentCache* cache = nullptr,
    serve::ClusterServing* cluster = nullptr, int group = 0,
    const std::string& group_receiver = "") {
  if (args.grpc_port < 0) return nullptr;
  serve::InstanceInfo info;
  if (disaggregation != nullptr) {
    info.role = args.role;
    info.sender = disaggregation->sender.get();
    info.receiver = disaggregation->receiver.get();
    info.cache_layers = cache->layers();
    info.cache_row_bytes = cache->row_bytes();
    info.transfer_timeout_seconds = args.transfer_timeout;
  }
  if (cluster != nullptr && args.role == "decode") {
    info.transfer_address = group_receiver;
    info.submit_receiving = [cluster, group](EngineRequest request, uint64_t token,
                                             SubmitError* error) {
      return cluster->SubmitReceivingTo(group, std::move(request), token, error);
    };
  }
  if (cluster != nullptr && args.role == "prefill")
    info.submit_sending = [cluster, group](EngineRequest request, const std::string& send_to,
                                           uint64_t token, SubmitError* error) {
      return cluster->SubmitSendingTo(group, std::move(request), send_to, token, error);
    };
  info.served_model_name = options.limits.model_name;
  info.page_size = engine.page_size();
  info.vocab_size = engine.model_config().vocab_size;
  info.eos_token_id = static_cast<int32_t>(engine.model_config().eos_token_id);
  for (int64_t id : engine.model_config().generation_eos_token_ids)
    info.more_eos_token_ids.push_back(static_cast<int32_t>(id));
  info.max_model_len = engine_config.max_model_len;
  info.num_speculative_tokens = engine_config.num_speculative_tokens;
  info.priority_scheduling =
      engine_config.scheduling_policy == EngineConfig::SchedulingPolicy::kPriority;
  auto server = std::make_unique<serve::GrpcEngineServer>(frontend, info);
  const std::string host = args.grpc_host.empty() ? args.host : args.grpc_host;
  *status = server->Start(host, args.grpc_port, serve::GrpcServerCredentials(args.grpc_tls));
  if (status->ok())
    WarnIfExposed(serve::GrpcExposureWarning(host, server->port(), args.grpc_tls.enabled(),
                                             !args.grpc_tls.ca_file.empty()));
  return server;
}

std::string GrpcNote(const serve::GrpcEngineServer* grpc, const ServeArgs& args) {
  if (grpc == nullptr) return "";
  return fmt::format(" and grpc://{}:{}{}", args.grpc_host.empty() ? args.host : args.grpc_host,
                     grpc->port(),
                     !args.grpc_tls.enabled()        ? ""
                     : args.grpc_tls.ca_file.empty() ? " (TLS)"
                                                     : " (mutual TLS)");
}

const char* Scheme(const ServeArgs& args) {
  return args.https.certfile.empty() ? "http" : "https";
}

// Flags that cannot work together fail before the model loads.
void CheckSecurityFlagsOrFail(const ServeArgs& args) {
  CheckHttpsOrFail(args.https);
  if (Status s = serve::CheckGrpcServerTls(args.grpc_tls); !s.ok()) FailVerb(s.message());
}

serve::ServerOptions ServerOptionsFrom(const ServeArgs& args, int64_t cache_tokens,
                                       const EngineConfig& engine_config) {
  serve::ServerOptions options;
  options.host = args.host;
  options.port = args.port;
  options.api_key = args.api_key;
  options.tls = args.https.Files();
  options.io_threads = args.io_threads;
  options.limits.model_name = args.served_model_name.empty()
                                  ? (args.model.empty() ? std::string("default") : args.model)
                                  : args.served_model_name;
  options.limits.max_model_len = engine_config.max_model_len;
  options.limits.cache_tokens = cache_tokens;
  options.limits.priority_scheduling =
      engine_config.scheduling_policy == EngineConfig::SchedulingPolicy::kPriority;
  // Batches fill the running batch at most: live requests queue behind no more than that.
  options.batch_max_in_flight = engine_config.max_num_seqs;
  return options;
}

// Under mpirun: every rank runs the lockstep loop; rank 0 also serves HTTP on its I/O threads.
// SIGTERM reaches every rank (mpirun forwards it); rank 0 turns it into a broadcast stop, the
// others ignore it and stop with the loop.
void RunCluster(const ServeArgs& args, ParallelRun& run, Engine& engine, const TextCodec& codec,
                const LatentCache& cache, int64_t cache_tokens, const EngineConfig& engine_config) {
  Communicator& comm = *run.comm;
  Disaggregation disaggregation;
  serve::ClusterServing cluster(engine, comm, run.tp, engine_config.max_waiting);
  BeamSearchFrontend beams(cluster, *codec.tokenizer, engine.limits());
  serve::ServerOptions options = ServerOptionsFrom(args, cache_tokens, engine_config);
  ApplyChatOutputOrFail(args.chat_output, codec, &options);
  std::unique_ptr<serve::OpenAiServer> server;
  // gRPC: DP group g on --grpc-port + g (each port 0 when it is 0), so a router chooses the group.
  std::vector<std::unique_ptr<serve::GroupFrontend>> groups;
  std::vector<std::unique_ptr<serve::GrpcEngineServer>> grpc;
  // Each group's first rank moves its own rows (rank 0 only relays the calls).
  Disaggregation group_transfers;
  std::vector<std::string> group_receivers;
  if (args.role != "both") {
    group_receivers = StartGroupTransfers(args, comm, run.tp, &group_transfers);
    if (args.role == "decode")
      cluster.ReceiveOnGroupLeaders(group_transfers.receiver.get(), cache.layers(),
                                    cache.row_bytes(), args.transfer_timeout);
    else
      cluster.SendFromGroupLeaders(group_transfers.sender.get(), args.transfer_timeout);
    if (comm.rank() == 0)
      serve::PublishJobTransfers(args.role == "decode" ? "receive" : "send",
                                 [&cluster] { return cluster.Transfers(); });
  }
  Status listening = Status::Ok();
  if (comm.rank() == 0) {
    server = std::make_unique<serve::OpenAiServer>(beams, codec, options);
    if (listening.ok()) listening = server->Listen();
    if (listening.ok())
      WarnIfExposed(serve::HttpExposureWarning(args.host, server->port(), options.tls.enabled(),
                                               !args.api_key.empty()));
    for (int g = 0; g < cluster.groups() && listening.ok() && args.grpc_port >= 0; ++g) {
      groups.push_back(std::make_unique<serve::GroupFrontend>(cluster, g));
      ServeArgs group_args = args;
      if (args.grpc_port > 0) group_args.grpc_port = args.grpc_port + g;
      grpc.push_back(StartGrpc(group_args, *groups.back(), options, engine_config, engine,
                               &listening, &disaggregation, &cache, &cluster, g,
                               group_receivers.empty() ? "" : group_receivers[g]));
    }
  }
  // Every rank learns whether rank 0 could listen, so none is left waiting.
  if (comm.AllReduceMax(listening.ok() ? 0 : 1) > 0)
    FailEverywhere(comm, listening.ok() ? "rank 0 could not listen" : listening.message());
  if (comm.rank() != 0) {
    std::signal(SIGTERM, SIG_IGN);
    std::signal(SIGINT, SIG_IGN);
    cluster.Run();
    return;
  }
  std::printf(
      "switchyard: serving %s on %s://%s:%d%s%s (pid %d; %d ranks, %d DP groups of TP %d; "
      "cache %lld tokens per group in %s, chat template %s)\n",
      options.limits.model_name.c_str(), Scheme(args), args.host.c_str(), server->port(),
      [&] {
        std::string note;
        for (const auto& g : grpc)
          note += GrpcNote(g.get(), args);
        return note;
      }()
          .c_str(),
      RoleNote(args, disaggregation, group_receivers).c_str(), static_cast<int>(::getpid()),
      comm.size(), run.dp(), run.tp, static_cast<long long>(cache_tokens),
      kernels::LatentCacheDTypeName(KvDTypeOrFail(args.kv_dtype)),
      codec.chat ? std::string(codec.chat->name()).c_str() : "none");
  std::fflush(stdout);
  std::thread http([&] {
    server->Run();
    for (auto& g : grpc)
      g->Shutdown();
  });
  cluster.Run();
  http.join();
  serve::PublishJobTransfers("", nullptr);
  std::printf("switchyard: stopped\n");
}

// `switchyard run-batch -i IN -o OUT`: the Batch API's runner on a file, without a server (as
// vLLM's run-batch). Lines go to the endpoint their url names (a batch per endpoint, run one
// after the other); every line's result goes to OUT in the input's order — the responses and, in
// the same shape, the errors — with a summary on stderr. The exit code is 0 when every line
// succeeded, 1 otherwise; a malformed file fails naming its lines and writes nothing.
void RunBatchFile(const ServeArgs& args, Engine& engine, const TextCodec& codec,
                  const serve::ServerOptions& options) {
  std::ifstream in(args.batch_input, std::ios::binary);
  if (!in) FailVerb(fmt::format("--input-file {}: cannot open it", args.batch_input));
  const std::string content((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  // The lines by endpoint, each with its number in the input (a line the batch refuses is named
  // by it); custom_id → input position, to write the results back in order.
  struct Group {
    std::string content;
    std::vector<int64_t> numbers;
  };
  std::map<std::string, Group> groups;
  std::map<std::string, int64_t> order;
  int64_t number = 0;
  for (size_t at = 0; at < content.size();) {
    const size_t end = std::min(content.find('\n', at), content.size());
    const std::string line = content.substr(at, end - at);
    at = end + 1;
    ++number;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const auto entry = nlohmann::json::parse(line, nullptr, false);
    std::string url = "/v1/chat/completions";  // a line without one fails in that batch
    if (entry.is_object() && entry.contains("url") &&
        (entry["url"] == "/v1/completions" || entry["url"] == "/v1/responses"))
      url = entry["url"].get<std::string>();
    if (entry.is_object() && entry.contains("custom_id") && entry["custom_id"].is_string())
      order.emplace(entry["custom_id"].get<std::string>(), number);
    groups[url].content += line + "\n";
    groups[url].numbers.push_back(number);
  }
  if (groups.empty()) FailVerb(fmt::format("--input-file {}: no requests", args.batch_input));
  serve::FileStore files(content.size() * 4 + (size_t{256} << 20));
  engine.Start();
  BeamSearchFrontend beams(engine, *codec.tokenizer, engine.limits());
  // Offline: nothing expires (vLLM's run_batch has no window either).
  serve::BatchRunner runner(beams, codec, options.limits, files, options.batch_max_in_flight,
                            /*completion_window=*/0);
  std::vector<std::pair<int64_t, std::string>> results;
  int64_t total = 0, completed = 0, failed = 0;
  for (auto& [url, group] : groups) {
    auto input = files.Add(args.batch_input, "batch", std::move(group.content), 0);
    if (!input.ok()) FailVerb(input.status().message());
    const nlohmann::json create = {
        {"input_file_id", (*input)->id}, {"endpoint", url}, {"completion_window", "24h"}};
    serve::ApiReply reply = runner.Request("POST", "", "", create.dump(), 0);
    if (!reply.ok())
      FailVerb(fmt::format("--input-file {}: {}", args.batch_input, reply.error.message));
    nlohmann::json batch = nlohmann::json::parse(reply.body);
    const std::string id = batch["id"];
    while (batch["status"] == "in_progress" || batch["status"] == "validating" ||
           batch["status"] == "finalizing") {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      batch = nlohmann::json::parse(runner.Request("GET", "/" + id, "", "", 0).body);
    }
    if (batch["status"] == "failed") {
      std::string why;
      for (const auto& e : batch["errors"]["data"]) {
        const std::string where =
            e["line"].is_number()
                ? fmt::format("line {}", group.numbers[e["line"].get<size_t>() - 1])
                : std::string("the file");
        why += fmt::format("\n  {}: {}", where, e["message"].get<std::string>());
      }
      FailVerb(fmt::format("--input-file {}: the batch failed:{}", args.batch_input, why));
    }
    for (const char* key : {"output_file_id", "error_file_id"}) {
      if (batch[key].is_null()) continue;
      const std::string& text = files.Get(batch[key].get<std::string>())->content;
      for (size_t at = 0; at < text.size();) {
        const size_t end = std::min(text.find('\n', at), text.size());
        std::string line = text.substr(at, end - at);
        at = end + 1;
        const int64_t position = order[nlohmann::json::parse(line)["custom_id"].get<std::string>()];
        results.push_back({position, std::move(line)});
      }
    }
    total += batch["request_counts"]["total"].get<int64_t>();
    completed += batch["request_counts"]["completed"].get<int64_t>();
    failed += batch["request_counts"]["failed"].get<int64_t>();
  }
  runner.Stop();
  beams.Stop(/*drain=*/false);
  std::sort(results.begin(), results.end());
  std::ofstream out(args.batch_output, std::ios::binary);
  for (const auto& [position, line] : results)
    out << line << '\n';
  out.flush();
  if (!out) FailVerb(fmt::format("--output-file {}: cannot write it", args.batch_output));
  std::fprintf(stderr, "switchyard: run-batch: %lld requests, %lld completed, %lld failed -> %s\n",
               static_cast<long long>(total), static_cast<long long>(completed),
               static_cast<long long>(failed), args.batch_output.c_str());
  if (failed > 0) throw CLI::RuntimeError(1);
}

void RunServe(const ServeArgs& args) {
  CheckSecurityFlagsOrFail(args);
  if (args.role != "both" && args.grpc_port < 0)
    FailVerb(
        fmt::format("--role {}: needs --grpc-port (a router sends it its requests)", args.role));
  const std::string directory = ResolveModelDirectory(args.model);
  TextCodec codec = LoadTextCodecOrFail(directory);
  ApplyChatTemplateOrFail(args.chat_output.chat_template, &codec);
  ParallelRun run = LoadParallel(directory, args.parallel);
  Communicator& comm = *run.comm;
  const Model& model = *run.model;
  const ModelConfig& config = model.config();
  if (codec.tokenizer->vocab_size() > config.vocab_size)
    FailVerb(fmt::format("{}: the tokenizer has {} ids but the model's vocabulary is {}",
                         codec.tokenizer->source(), codec.tokenizer->vocab_size(),
                         config.vocab_size));
  const DType kv_dtype = KvDTypeOrFail(args.kv_dtype);
  // The cache: as asked, or 64 Ki tokens kept under 4 GiB.
  const Speculation speculation = SpeculationOrFail(args.speculative, model);
  const bool mtp_layer = speculation.tokens > 0 && speculation.drafter == Drafter::kMtp;
  int64_t cache_tokens = args.kv_cache_tokens;
  const int64_t bytes_per_token =
      model.CacheLayers(mtp_layer) *
      kernels::LatentRowLayout::Of(kv_dtype, config.cache_row_width(), config.kv_lora_rank)
          .row_bytes;
  if (cache_tokens == 0) cache_tokens = std::min<int64_t>(65536, (4ll << 30) / bytes_per_token);
  LatentCache cache = model.NewCache(cache_tokens, 1, kv_dtype, 16, mtp_layer);
  cache_tokens = cache.total_pages() * cache.page_size();

  EngineConfig engine_config;
  engine_config.max_num_seqs = args.max_num_seqs;
  engine_config.max_num_batched_tokens = args.max_num_batched_tokens;
  engine_config.max_waiting = args.max_waiting;
  engine_config.step_timeout_seconds = args.step_timeout;
  engine_config.num_speculative_tokens = speculation.tokens;
  engine_config.drafter = speculation.drafter;
  engine_config.ngram = speculation.ngram;
  engine_config.masks_beside_forward = args.grammar_masks == "beside-forward";
  engine_config.scheduling_policy = args.scheduling_policy == "priority"
                                        ? EngineConfig::SchedulingPolicy::kPriority
                                        : EngineConfig::SchedulingPolicy::kFcfs;
  engine_config.max_model_len =
      args.max_model_len > 0 ? args.max_model_len : config.max_position_embeddings;
  if (engine_config.max_model_len > config.max_position_embeddings)
    FailVerb(fmt::format("--max-model-len {} exceeds the model's {} positions", args.max_model_len,
                         config.max_position_embeddings));
  ForwardOptions forward_options = run.Options();
  ApplyBatchInvariant(args.batch_invariant, forward_options);
  Engine engine(model, cache, *codec.tokenizer, forward_options, engine_config);
  if (comm.size() > 1) {
    if (!args.batch_input.empty()) FailEverywhere(comm, "run-batch: run it in one process");
    return RunCluster(args, run, engine, codec, cache, cache_tokens, engine_config);
  }
  serve::ServerOptions options = ServerOptionsFrom(args, cache_tokens, engine_config);
  ApplyChatOutputOrFail(args.chat_output, codec, &options);
  if (!args.batch_input.empty()) return RunBatchFile(args, engine, codec, options);
  Disaggregation disaggregation;
  if (Status s = StartDisaggregation(args, &disaggregation); !s.ok()) FailVerb(s.message());
  BeamSearchFrontend beams(engine, *codec.tokenizer, engine.limits());
  serve::OpenAiServer server(beams, codec, options);
  if (Status s = server.Listen(); !s.ok()) FailVerb(s.message());
  WarnIfExposed(serve::HttpExposureWarning(args.host, server.port(), options.tls.enabled(),
                                           !args.api_key.empty()));
  Status grpc_status = Status::Ok();
  auto grpc = StartGrpc(args, engine, options, engine_config, engine, &grpc_status, &disaggregation,
                        &cache);
  if (!grpc_status.ok()) FailVerb(grpc_status.message());
  engine.Start();
  std::printf(
      "switchyard: serving %s on %s://%s:%d%s%s (pid %d; cache %lld tokens in %s, chat "
      "template %s)\n",
      options.limits.model_name.c_str(), Scheme(args), args.host.c_str(), server.port(),
      GrpcNote(grpc.get(), args).c_str(), RoleNote(args, disaggregation).c_str(),
      static_cast<int>(::getpid()), static_cast<long long>(cache_tokens),
      kernels::LatentCacheDTypeName(KvDTypeOrFail(args.kv_dtype)),
      codec.chat ? std::string(codec.chat->name()).c_str() : "none");
  std::fflush(stdout);
  server.Run();
  if (grpc) grpc->Shutdown();
  std::printf("switchyard: stopped\n");
}

}  // namespace

namespace {

// The options serve and run-batch share.
void AddServeOptions(CLI::App* verb, const std::shared_ptr<ServeArgs>& args) {
  verb->add_option("--model", args->model,
                   "Checkpoint directory (default: the default model, models/default)");
  verb->add_option("--host", args->host, "Address to bind (default 127.0.0.1)");
  verb->add_option("--port", args->port, "Port (0: any free port)")->check(CLI::Range(0, 65535));
  verb->add_option("--served-model-name", args->served_model_name,
                   "The model name clients use (default: the --model argument)");
  AddChatOutputOptions(verb, args->chat_output);
  verb->add_option("--max-num-seqs", args->max_num_seqs, "Requests in the running batch at most")
      ->check(CLI::Range(1, 4096));
  verb->add_option("--scheduling-policy", args->scheduling_policy,
                   "fcfs: requests run in arrival order (default); priority: by each request's "
                   "priority (lower first; vLLM's), a more urgent request taking the place of "
                   "less urgent running ones")
      ->check(CLI::IsMember({"fcfs", "priority"}));
  verb->add_option("--max-num-batched-tokens", args->max_num_batched_tokens,
                   "Tokens one step computes at most (decode tokens + prefill chunks)")
      ->check(CLI::Range(1, 1 << 20));
  verb->add_option("--kv-cache-tokens", args->kv_cache_tokens,
                   "Latent cache size in tokens (default: 65,536, at most 4 GiB)")
      ->check(CLI::Range(int64_t{16}, int64_t{1} << 32));
  verb->add_option("--max-model-len", args->max_model_len,
                   "Longest prompt + output (default: the model's positions)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 32));
  verb->add_option("--max-waiting", args->max_waiting,
                   "Queued requests before new ones get 503 (Retry-After)")
      ->check(CLI::Range(1, 1 << 20));
  AddHttpsOptions(verb, args->https, args->api_key);
  // vLLM's spelling too (--kv-cache-dtype auto|fp8|fp8_e4m3), so its command lines carry over.
  verb->add_option("--kv-dtype,--kv-cache-dtype", args->kv_dtype,
                   "Latent cache dtype: bf16 (auto), f32, or fp8 (the latent as e4m3 with a "
                   "power-of-two scale per 128 values, rope bf16: 1.79x the tokens)")
      ->check(CLI::IsMember(KvDTypeNamesWithAuto()));
  verb->add_option("--io-threads", args->io_threads, "HTTP I/O threads")->check(CLI::Range(1, 64));
  verb->add_option("--step-timeout", args->step_timeout,
                   "Seconds one step may take before /health reports unhealthy")
      ->check(CLI::Range(1.0, 1e6));
  AddBatchInvariantOption(verb, args->batch_invariant);
  verb->add_option("--grammar-masks", args->grammar_masks,
                   "Structured output: make token masks on a thread beside the model's forward "
                   "(beside-forward, the default) or after it (after-forward; same masks, for "
                   "measuring)")
      ->check(CLI::IsMember({"beside-forward", "after-forward"}));
  verb->add_option("--grpc-port", args->grpc_port,
                   "Also serve the gRPC instance API (proto/switchyard/v1/engine.proto) on this "
                   "port (0: any free port)")
      ->check(CLI::Range(0, 65535));
  verb->add_option("--grpc-host", args->grpc_host, "Address for gRPC (default: --host)");
  verb->add_option("--grpc-tls-cert", args->grpc_tls.cert_file,
                   "gRPC over TLS with this PEM certificate chain (re-read when it changes)");
  verb->add_option("--grpc-tls-key", args->grpc_tls.key_file, "Its PEM private key");
  verb->add_option("--grpc-tls-client-ca", args->grpc_tls.ca_file,
                   "Require gRPC clients (the router) to present a certificate from these CAs");
  verb->add_option("--role", args->role,
                   "Prefill/decode disaggregation behind `switchyard route --prefill-engines "
                   "--decode-engines`: prefill (run prompts, send their latent rows on), decode "
                   "(receive them and generate), or both (default: everything here)")
      ->check(CLI::IsMember({"both", "prefill", "decode"}));
  verb->add_option("--transfer-host", args->transfer_host,
                   "--role decode: address to receive rows on over UCX (default: --grpc-host, "
                   "else --host; under mpirun a group on a machine without it: that machine's "
                   "address toward it)");
  verb->add_option("--transfer-port", args->transfer_port,
                   "--role decode: port to receive rows on (0: any free one, told to the router "
                   "through Health; under mpirun DP group g's first rank listens on P + g)")
      ->check(CLI::Range(0, 65535));
  verb->add_option("--transfer-timeout", args->transfer_timeout,
                   "Seconds a decode instance waits for a request's rows, and a prefill instance "
                   "for their sending, before the attempt is redone (a safety net: the router "
                   "cancels a decode call whose prefill call ended; default 600)")
      ->check(CLI::Range(0.1, 1e6));
  AddSpeculativeOptions(verb, args->speculative);
  AddParallelOptions(verb, args->parallel);
}

}  // namespace

void AddServeVerb(CLI::App& app) {
  auto args = std::make_shared<ServeArgs>();
  CLI::App* verb = app.add_subcommand("serve", "OpenAI-compatible server with continuous batching");
  AddServeOptions(verb, args);
  verb->callback([args] { RunServe(*args); });
}

void AddRunBatchVerb(CLI::App& app) {
  auto args = std::make_shared<ServeArgs>();
  CLI::App* verb = app.add_subcommand(
      "run-batch",
      "Run a file of OpenAI batch requests (one JSON object a line: custom_id, method POST, url "
      "/v1/chat/completions, /v1/completions or /v1/responses, body) and write every line's "
      "result, in order (vLLM's run-batch; the Batch API's format)");
  verb->add_option("-i,--input-file", args->batch_input, "The requests, JSON Lines")->required();
  verb->add_option("-o,--output-file", args->batch_output, "Where the results go, JSON Lines")
      ->required();
  AddServeOptions(verb, args);
  verb->callback([args] { RunServe(*args); });
}

}  // namespace sy
