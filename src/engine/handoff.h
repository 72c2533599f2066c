// Prefill/decode disaggregation as the engine sees it (docs/architecture.md, "Disaggregation"):
// a prefill instance hands a request's latent rows to a sink as they are computed and stops
// after the first token; a decode instance takes a request whose rows came with it and
// continues it as if it had prefilled it. The engine knows no transport (src/transfer does).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "engine/sampling.h"

namespace sy {

// The MTP drafts a prefill instance made after its first token, each with the distribution q it
// was drawn from: the decode instance verifies them in its first step, as the colocated engine's
// step after the prefill does, so seeded sampling with MTP draws what colocated draws.
struct HandoffDrafts {
  std::vector<int32_t> tokens;
  std::vector<TokenDistribution> distributions;  // one per token
};

// Where a prefilling request's rows go. Called from the step loop: must not block.
class KvSink {
 public:
  virtual ~KvSink() = default;
  // Rows [first, first + count) of every cache layer (the MTP module's last when it has one),
  // layer-major: layer l's rows start at l · count · row_bytes.
  virtual void Rows(int64_t first, int64_t count, int64_t layers, int64_t row_bytes,
                    std::vector<uint8_t> data) = 0;
  // Every row was given; `first_token` is the token the request sampled after them, `drafts`
  // the MTP drafts for the step after it (none without MTP).
  virtual void Done(int32_t first_token, HandoffDrafts drafts) = 0;
  // The request ended here (its first token finished it, an abort, an error): nothing follows.
  virtual void Abandon() = 0;
};

// A decode instance's received rows: positions [0, rows) of a request whose prompt (with any
// resumed output) they were computed for, in chunks as KvSink::Rows gave them (each layer-major:
// layer l's rows at l · count · row_bytes), in order, pointing into what `owner` keeps alive
// (the received messages: no copy between the wire and the cache pages).
struct ImportedRows {
  struct Chunk {
    int64_t first = 0, count = 0;
    const uint8_t* rows = nullptr;
    std::shared_ptr<const void> owner;
  };
  int64_t rows = 0;
  int64_t layers = 0;
  int64_t row_bytes = 0;
  std::vector<Chunk> chunks;
  HandoffDrafts drafts;  // the prefill instance's MTP drafts (KvSink::Done)
};

}  // namespace sy
