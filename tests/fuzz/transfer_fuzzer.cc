// The transfer's message parser (src/transfer/wire.cc) on any bytes: never a crash, an overread
// or an overflow; what it accepts is self-consistent.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

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
  }
  return 0;
}
