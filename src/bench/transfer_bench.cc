#include "bench/transfer_bench.h"

#include <algorithm>
#include <cstdio>
#include <vector>

#include "base/clock.h"
#include "transfer/kv_transfer.h"

namespace sy::bench {

Status RunTransferReceiver(const TransferBenchOptions& o) {
  const size_t colon = o.listen.rfind(':');
  if (colon == std::string::npos) return Status::Error("--listen: expected host:port");
  auto receiver =
      transfer::Receiver::Start(o.listen.substr(0, colon), std::stoi(o.listen.substr(colon + 1)));
  if (!receiver.ok()) return receiver.status();
  std::printf("listening on %s\n", receiver.value()->address().c_str());
  std::fflush(stdout);
  for (int64_t k = 0; k < o.transfers; ++k) {
    auto got = receiver.value()->Wait(fmt::format("t{}", k), static_cast<uint64_t>(k + 1), o.layers,
                                      o.row_bytes, 600, nullptr);
    if (!got.ok()) return got.status();
    if (got->rows->rows != o.tokens)
      return Status::Errorf("transfer {}: {} rows arrived, {} sent", k, got->rows->rows, o.tokens);
  }
  const transfer::TransferStats s = receiver.value()->stats();
  std::printf("{\"received\": %lld, \"bytes\": %lld, \"refused\": %lld}\n",
              static_cast<long long>(s.transfers), static_cast<long long>(s.bytes),
              static_cast<long long>(s.refused));
  return Status::Ok();
}

Status RunTransferSender(const TransferBenchOptions& o) {
  auto sender = transfer::Sender::Start();
  if (!sender.ok()) return sender.status();
  std::vector<std::vector<uint8_t>> chunks;  // made before timing: the rows are not the cost
  for (int64_t first = 0; first < o.tokens; first += o.chunk) {
    const int64_t count = std::min(o.chunk, o.tokens - first);
    chunks.emplace_back(static_cast<size_t>(count * o.layers * o.row_bytes),
                        static_cast<uint8_t>(first));
  }
  std::vector<double> seconds;
  for (int64_t k = 0; k < o.transfers; ++k) {
    auto out = sender.value()->Open(o.to, fmt::format("t{}", k), static_cast<uint64_t>(k + 1));
    const double start = NowSeconds();
    int64_t first = 0;
    for (const auto& chunk : chunks) {
      const int64_t count = static_cast<int64_t>(chunk.size()) / (o.layers * o.row_bytes);
      out->Rows(first, count, o.layers, o.row_bytes, chunk);
      first += count;
    }
    out->Done(0, {});
    SY_RETURN_IF_ERROR(out->Wait(600));
    seconds.push_back(NowSeconds() - start);
  }
  std::sort(seconds.begin(), seconds.end());
  const double median = seconds[seconds.size() / 2];
  const double bytes = static_cast<double>(o.tokens * o.layers * o.row_bytes);
  std::printf(
      "{\"tokens\": %lld, \"bytes_per_token\": %lld, \"chunk\": %lld, \"transfers\": %lld, "
      "\"median_seconds\": %.6f, \"median_gbit_per_s\": %.3f, \"median_tokens_per_s\": %.0f}\n",
      static_cast<long long>(o.tokens), static_cast<long long>(o.layers * o.row_bytes),
      static_cast<long long>(o.chunk), static_cast<long long>(o.transfers), median,
      bytes * 8 / median / 1e9, static_cast<double>(o.tokens) / median);
  return Status::Ok();
}

}  // namespace sy::bench
