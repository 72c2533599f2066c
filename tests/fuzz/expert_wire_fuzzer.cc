// libFuzzer target for the wire form of a moving expert (model/expert_wire.h): the first two
// bytes pick the expected shape, the rest is the message. A message accepted must come back the
// same bytes when sent again, and compare equal to itself.
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "model/expert_wire.h"

using namespace sy;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const int64_t width = 1 + data[0] % 64, hidden = 1 + data[1] % 64;
  const std::vector<uint8_t> message(data + 2, data + size);
  auto expert = DeserializeExpert(message, width, hidden);
  if (!expert.ok()) return 0;
  if (SerializeExpert(*expert) != message) std::abort();
  if (!SameExpertBytes(*expert, *expert).ok()) std::abort();
  return 0;
}
