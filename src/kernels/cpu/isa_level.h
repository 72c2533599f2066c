// How much of the CPU's instruction set the kernels may use: all it has (the default), or only
// what a lesser CPU has — to get another machine's kernels and arithmetic on this one (a bug
// report from a Zen 3 reproduced on a Xeon), and so the test suite runs every path the machine
// can run. `--max-isa` on the command line; SWITCHYARD_MAX_ISA in the environment (the same
// values) for programs without one, the test binaries included.
//
//   native    everything this CPU has (AMX tiles included, for oneDNN)
//   avx512    AVX-512 with BF16, VBMI and VNNI where present, no AMX
//   avx2      AVX2 + FMA: no AVX-512 kernel (bf16 dot, bf16 MLA, VNNI), Highway's AVX2 target
//   portable  no hand-written SIMD kernel: the portable int8 twin, Highway's SSE4 target
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace sy::kernels {

enum class IsaLevel : uint8_t { kPortable, kAvx2, kAvx512, kNative };

// The level in force: SetMaxIsaLevel's, else SWITCHYARD_MAX_ISA's (read on first use, a bad value
// warned about on stderr and ignored), else kNative.
IsaLevel MaxIsaLevel();
// Whether kernels needing `level` may run (the CPU must also have them: each kernel checks).
inline bool IsaAllows(IsaLevel level) {
  return MaxIsaLevel() >= level;
}
// Sets the level for the process and applies it to Highway's dispatch and to oneDNN. Call it
// before the first product: kernels chosen once (oneDNN's primitives) keep their choice.
void SetMaxIsaLevel(IsaLevel level);

std::optional<IsaLevel> ParseIsaLevel(std::string_view name);
const char* IsaLevelName(IsaLevel level);

}  // namespace sy::kernels
