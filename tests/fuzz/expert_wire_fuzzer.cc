// libFuzzer target for the wire form of a moving expert (model/expert_wire.h): the first two
// bytes pick the expected shape, the rest is the message. A message accepted must come back the
// same bytes when sent again, and compare equal to itself — except that bf16 panels laid out as
// AMX tiles (pairs) arrive re-laid out as this process packs (columns): then what is sent again
// has the same length, and comes back itself.
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
  const std::vector<uint8_t> again = SerializeExpert(*expert);
  if (again != message) {
    if (again.size() != message.size()) std::abort();
    auto second = DeserializeExpert(again, width, hidden);
    if (!second.ok() || SerializeExpert(*second) != again) std::abort();
    if (!SameExpertBytes(*second, *expert).ok()) std::abort();
  }
  if (!SameExpertBytes(*expert, *expert).ok()) std::abort();
  return 0;
}
