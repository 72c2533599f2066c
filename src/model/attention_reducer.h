// Tensor parallelism inside a DP group splits attention by heads; each rank's o_proj then holds
// a partial sum that the group adds up. Model::Forward calls this after every attention block.
#pragma once

#include <cstdint>

namespace sy {

class AttentionReducer {
 public:
  virtual ~AttentionReducer() = default;
  // values[count]: this rank's partial sum in, the group's total out.
  virtual void Sum(float* values, int64_t count) = 0;
};

}  // namespace sy
