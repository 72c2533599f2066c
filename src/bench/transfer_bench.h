// `switchyard bench transfer`: the disaggregation transport (src/transfer) alone, between two
// processes — one receiving (--listen), one sending (--to) — with DeepSeek-V3's rows by default
// (61 layers of 1,152 bytes: 70,272 bytes per token), sent in chunks as a prefill instance sends
// them. The sender reports each transfer's time (first chunk queued to the last send complete)
// and the rate in bytes per second.
#pragma once

#include <cstdint>
#include <string>

#include "base/status.h"

namespace sy::bench {

struct TransferBenchOptions {
  std::string listen;     // host:port to receive on
  std::string to;         // host:port to send to
  int64_t tokens = 4096;  // rows per transfer
  int64_t chunk = 512;    // rows per message
  int64_t layers = 61;
  int64_t row_bytes = 1152;
  int64_t transfers = 10;
};

// Receives `transfers` transfers (ids t0, t1, …) and prints what arrived; returns when done.
Status RunTransferReceiver(const TransferBenchOptions& options);
// Sends them; prints the median time and rate as JSON.
Status RunTransferSender(const TransferBenchOptions& options);

}  // namespace sy::bench
