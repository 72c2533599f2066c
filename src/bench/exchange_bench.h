// `switchyard bench exchange`: dispatch and combine alone (no compute) between the ranks of an
// mpirun job, against the all-to-all bandwidth the same ranks reach in the same run with large
// uniform blocks — the seed's "communication kernels in isolation reached about half of the
// link". DeepSeek-V3 rows (7,168 values), top-8 of 256 experts chosen at random per token.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace sy::bench {

struct ExchangeBenchOptions {
  std::vector<int64_t> tokens = {8, 32, 128, 512};  // tokens per rank
  std::vector<std::string> wires = {"bf16", "fp8"};
  int repetitions = 5;
  int64_t peak_block_bytes = 16 << 20;  // per pair of ranks, for the uniform all-to-all
};

struct ExchangeResult {
  std::string wire;
  int64_t tokens = 0;
  double dispatch_seconds = 0, combine_seconds = 0;  // medians
  double dispatch_bytes = 0, combine_bytes = 0;      // sent to other ranks, per rank
};

struct ExchangeReport {
  int ranks = 1;
  double peak_bytes_per_second = 0;  // per rank, sent to others, uniform all-to-all
  std::vector<ExchangeResult> results;
};

ExchangeReport BenchExchange(const ExchangeBenchOptions& options);
std::string ExchangeReportTable(const ExchangeReport& report);

}  // namespace sy::bench
