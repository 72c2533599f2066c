// The transfer's message parser (src/transfer/wire.cc) on any bytes: never a crash, an overread
// or an overflow; what it accepts is self-consistent.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "transfer/wire.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto parsed = sy::transfer::ParseMessage(data, size, /*verify=*/true);
  if (!parsed.ok()) return 0;
  const auto& h = parsed->header;
  const size_t id_end = sizeof(sy::transfer::Header) + parsed->id.size();
  if (id_end > size || h.payload_bytes != size - id_end) std::abort();
  if (h.kind == sy::transfer::kRows) {
    volatile uint8_t sum = 0;
    if (h.payload_bytes > 0) sum ^= parsed->payload[h.payload_bytes - 1];  // in bounds
    (void)sum;
  } else if (h.kind == sy::transfer::kDone) {
    // The closing message's MTP drafts: parsed ones encode back to the same bytes.
    auto drafts = sy::transfer::ParseDrafts(parsed->payload, h.payload_bytes);
    if (drafts.ok()) {
      if (drafts->tokens.size() != drafts->distributions.size()) std::abort();
      const std::vector<uint8_t> again = sy::transfer::EncodeDrafts(drafts.value());
      const bool empty = drafts->tokens.empty();
      if (!empty && (again.size() != h.payload_bytes ||
                     std::memcmp(again.data(), parsed->payload, again.size()) != 0))
        std::abort();
    }
  }
  return 0;
}
