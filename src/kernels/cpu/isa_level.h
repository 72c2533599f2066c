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
#include <string>
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

// What the CPU has, asked once (the kernels' own checks: each also asks IsaAllows).
bool CpuHasAvx2Fma();     // AVX2, FMA and F16C
bool CpuHasAvx512Vnni();  // AVX-512 F/BW/VL and VNNI

// AMX (Intel since Sapphire Rapids): the CPU's tile instructions, the OS's tile state in XCR0,
// and Linux's permission for this process to use the tiles' 8 KiB of data. A process must ask
// for it (arch_prctl ARCH_REQ_XCOMP_PERM, Linux 5.16 and later) before its first tile
// instruction, or that instruction kills it with SIGILL; a kernel or sandbox may refuse. Where
// AMX is not ready, its kernels are not used and the AVX-512 or AVX2 ones run instead.
enum class AmxState : uint8_t {
  kAbsent,     // the CPU has no AMX tiles with BF16 and INT8
  kNoOsState,  // the CPU has them; the OS does not enable their state (XCR0 bits 17, 18)
  kRefused,    // the OS has the state; the permission request failed
  kReady,      // permitted for this process
};
struct AmxStatus {
  AmxState state = AmxState::kAbsent;
  std::string detail;  // why, in words ("permitted", "arch_prctl: Invalid argument", ...)
};
// The CPU, the OS and the permission, asked once per process (the permission is the process's
// and is never given back).
AmxStatus Amx();
// Whether AMX kernels may run: Amx() ready and --max-isa native.
bool AmxAllowed();
// The decision from its inputs (tests): CPUID's amx_tile, amx_bf16 and amx_int8 together, XCR0's
// tile bits, and the permission request's errno (0: granted; not asked unless the rest hold).
AmxStatus DecideAmx(bool cpu_has_amx, bool os_has_tile_state, int permission_errno);

}  // namespace sy::kernels
