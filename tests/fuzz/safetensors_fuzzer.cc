// libFuzzer target: the safetensors header parser must reject any byte string cleanly — no
// crash, no out-of-bounds read, no entry pointing outside the buffer.
#include <cstdint>
#include <cstdlib>

#include "model/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto parsed = sy::ParseSafetensorsHeader(data, size, "fuzz");
  if (parsed.ok()) {
    for (const auto& entry : parsed.value()) {
      if (entry.data_begin > entry.data_end || entry.data_end > size) std::abort();
      volatile uint8_t sink = 0;
      if (entry.data_end > entry.data_begin) sink = data[entry.data_end - 1];  // must be readable
      (void)sink;
    }
  }
  return 0;
}
