// Parsing of token-id lists given on the command line: "1,2,3;4,5" is two sequences.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"

namespace sy {

// `flag` names the option in messages. Rejects empty sequences and anything but non-negative
// integers; the model checks ids against its vocabulary.
Result<std::vector<std::vector<int32_t>>> ParseTokenLists(const std::string& text,
                                                          const std::string& flag);

}  // namespace sy
