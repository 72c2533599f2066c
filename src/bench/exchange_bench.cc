#include "bench/exchange_bench.h"

#include <fmt/format.h>

#include <algorithm>
#include <random>

#include "base/clock.h"
#include "model/feed_forward.h"
#include "parallel/communicator.h"
#include "parallel/expert_parallel.h"

namespace sy::bench {
namespace {

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

constexpr int64_t kHidden = 7168, kExperts = 256, kTopK = 8;

}  // namespace

ExchangeReport BenchExchange(const ExchangeBenchOptions& options) {
  Communicator& comm = WorldCommunicator();
  const int ranks = comm.size();
  ExchangeReport report;
  report.ranks = ranks;

  // The peak: every rank sends peak_block_bytes to every other rank at once.
  {
    const int64_t block = options.peak_block_bytes;
    std::vector<uint8_t> send(static_cast<size_t>(block * ranks), 1),
        recv(static_cast<size_t>(block * ranks));
    std::vector<int64_t> bytes(static_cast<size_t>(ranks), block), offsets(bytes.size());
    for (int r = 0; r < ranks; ++r)
      offsets[r] = r * block;
    bytes[comm.rank()] = 0;  // nothing to self: only the link is measured
    std::vector<double> rates;
    for (int i = 0; i <= options.repetitions; ++i) {
      comm.AllReduceMax(0);
      const double start = NowSeconds();
      comm.StartAllToAllV(send.data(), bytes, offsets, recv.data(), bytes, offsets)->Wait();
      const double seconds = comm.AllReduceMax(static_cast<int64_t>((NowSeconds() - start) * 1e9)) /
                             1e9;  // the slowest rank: the exchange is done when all are
      if (i > 0) rates.push_back(static_cast<double>(block * (ranks - 1)) / seconds);
    }
    report.peak_bytes_per_second = Median(rates);
  }

  ModelConfig config;
  config.hidden_size = kHidden;
  config.n_routed_experts = kExperts;
  std::mt19937 rng(11 + comm.rank());
  for (const std::string& wire_name : options.wires) {
    const DType wire = wire_name == "f32"   ? DType::kF32
                       : wire_name == "fp8" ? DType::kF8E4M3
                                            : DType::kBF16;
    for (int64_t tokens : options.tokens) {
      ExpertDispatcher dispatcher(comm, kExperts, kHidden, wire);
      ExpertRouting routing;
      routing.tokens = tokens;
      routing.top_k = kTopK;
      std::uniform_int_distribution<int32_t> pick(0, kExperts - 1);
      for (int64_t t = 0; t < tokens; ++t) {
        std::vector<int32_t> chosen;
        while (static_cast<int64_t>(chosen.size()) < kTopK) {
          const int32_t e = pick(rng);
          if (std::find(chosen.begin(), chosen.end(), e) == chosen.end()) chosen.push_back(e);
        }
        for (int32_t e : chosen) {
          routing.expert_ids.push_back(e);
          routing.weights.push_back(1.0f / kTopK);
        }
      }
      SortByExpert(routing, kExperts);
      std::vector<float> x(static_cast<size_t>(tokens * kHidden));
      std::normal_distribution<float> normal(0, 1);
      for (float& v : x)
        v = normal(rng);
      std::vector<float> back(static_cast<size_t>(tokens * kTopK * kHidden));
      std::vector<double> dispatch, combine;
      int64_t bytes_before = 0, dispatch_bytes = 0, combine_bytes = 0;
      for (int i = 0; i <= options.repetitions; ++i) {
        comm.AllReduceMax(0);
        double start = NowSeconds();
        bytes_before = dispatcher.remote_bytes_sent();
        dispatcher.DispatchSend(routing, x.data());
        std::vector<int64_t> offsets;
        const std::vector<float>& rows = dispatcher.DispatchRecv(&offsets);
        const double dispatch_time =
            comm.AllReduceMax(static_cast<int64_t>((NowSeconds() - start) * 1e9)) / 1e9;
        dispatch_bytes = dispatcher.remote_bytes_sent() - bytes_before;
        comm.AllReduceMax(0);
        start = NowSeconds();
        bytes_before = dispatcher.remote_bytes_sent();
        dispatcher.CombineSend(rows.data());  // the identity expert
        dispatcher.CombineRecv(back.data());
        const double combine_time =
            comm.AllReduceMax(static_cast<int64_t>((NowSeconds() - start) * 1e9)) / 1e9;
        combine_bytes = dispatcher.remote_bytes_sent() - bytes_before;
        if (i > 0) {
          dispatch.push_back(dispatch_time);
          combine.push_back(combine_time);
        }
      }
      ExchangeResult result;
      result.wire = wire_name;
      result.tokens = tokens;
      result.dispatch_seconds = Median(dispatch);
      result.combine_seconds = Median(combine);
      result.dispatch_bytes = static_cast<double>(dispatch_bytes);
      result.combine_bytes = static_cast<double>(combine_bytes);
      report.results.push_back(result);
    }
  }
  return report;
}

std::string ExchangeReportTable(const ExchangeReport& report) {
  std::string out = fmt::format(
      "{} ranks; peak: uniform all-to-all of large blocks, {:.1f} MB/s sent to others per rank "
      "(median)\n",
      report.ranks, report.peak_bytes_per_second / 1e6);
  out +=
      "dispatch/combine: V3 rows (7,168 values), random top-8 of 256 experts per token; times "
      "of the slowest rank, medians; MB/s = bytes a rank sent to others / time\n";
  out += fmt::format("{:>5} {:>7} {:>12} {:>10} {:>8} {:>12} {:>10} {:>8}\n", "wire", "tokens",
                     "dispatch µs", "MB/s", "of peak", "combine µs", "MB/s", "of peak");
  for (const auto& r : report.results) {
    const double d_rate = r.dispatch_bytes / r.dispatch_seconds,
                 c_rate = r.combine_bytes / r.combine_seconds;
    out += fmt::format("{:>5} {:>7} {:>12.0f} {:>10.1f} {:>8.2f} {:>12.0f} {:>10.1f} {:>8.2f}\n",
                       r.wire, r.tokens, r.dispatch_seconds * 1e6, d_rate / 1e6,
                       d_rate / report.peak_bytes_per_second, r.combine_seconds * 1e6, c_rate / 1e6,
                       c_rate / report.peak_bytes_per_second);
  }
  return out;
}

}  // namespace sy::bench
