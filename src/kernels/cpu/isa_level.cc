#include "kernels/cpu/isa_level.h"

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

#if defined(__x86_64__) && defined(__linux__)
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include <hwy/targets.h>
#include <oneapi/dnnl/dnnl.hpp>

namespace sy::kernels {
namespace {

std::atomic<int> level{-1};  // -1: not yet read from the environment
std::once_flag from_environment;

// Highway's targets above the level (none below avx2: Highway has no AMX target), and oneDNN's
// ceiling. oneDNN refuses a new ceiling once it has made a primitive; nothing to do then.
void Apply(IsaLevel l) {
  int64_t disabled = 0;
  if (l <= IsaLevel::kAvx2) disabled |= HWY_AVX3 | HWY_AVX3_DL;
  if (l <= IsaLevel::kPortable) disabled |= HWY_AVX2;
  hwy::DisableTargets(disabled);
  const dnnl::cpu_isa ceiling = l == IsaLevel::kNative   ? dnnl::cpu_isa::all
                                : l == IsaLevel::kAvx512 ? dnnl::cpu_isa::avx512_core_bf16
                                : l == IsaLevel::kAvx2   ? dnnl::cpu_isa::avx2
                                                         : dnnl::cpu_isa::sse41;
  (void)dnnl::set_max_cpu_isa(ceiling);
}

}  // namespace

IsaLevel MaxIsaLevel() {
  std::call_once(from_environment, [] {
    if (level.load() >= 0) return;  // set before first use
    IsaLevel chosen = IsaLevel::kNative;
    if (const char* value = std::getenv("SWITCHYARD_MAX_ISA"); value != nullptr && *value) {
      if (auto parsed = ParseIsaLevel(value))
        chosen = *parsed;
      else
        std::fprintf(stderr,
                     "switchyard: warning: SWITCHYARD_MAX_ISA=%s is not one of native, avx512, "
                     "avx2, portable; using native\n",
                     value);
    }
    level.store(static_cast<int>(chosen));
    if (chosen != IsaLevel::kNative) Apply(chosen);
  });
  return static_cast<IsaLevel>(level.load(std::memory_order_relaxed));
}

void SetMaxIsaLevel(IsaLevel l) {
  level.store(static_cast<int>(l));
  std::call_once(from_environment, [] {});  // the environment no longer applies
  Apply(l);
}

std::optional<IsaLevel> ParseIsaLevel(std::string_view name) {
  if (name == "native") return IsaLevel::kNative;
  if (name == "avx512") return IsaLevel::kAvx512;
  if (name == "avx2") return IsaLevel::kAvx2;
  if (name == "portable") return IsaLevel::kPortable;
  return std::nullopt;
}

bool CpuHasAvx2Fma() {
#if defined(__x86_64__)
  static const bool has = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                          __builtin_cpu_supports("f16c");
  return has;
#else
  return false;
#endif
}

bool CpuHasAvx512Vnni() {
#if defined(__x86_64__)
  static const bool has = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("avx512vl") &&
                          __builtin_cpu_supports("avx512vnni");
  return has;
#else
  return false;
#endif
}

AmxStatus DecideAmx(bool cpu_has_amx, bool os_has_tile_state, int permission_errno) {
  if (!cpu_has_amx)
    return {AmxState::kAbsent, "this CPU has no AMX (amx_tile, amx_bf16, amx_int8)"};
  if (!os_has_tile_state)
    return {AmxState::kNoOsState, "the OS does not enable the AMX tile state (XCR0 bits 17, 18)"};
  if (permission_errno != 0)
    return {AmxState::kRefused, std::string("Linux refused the AMX tile data (arch_prctl "
                                            "ARCH_REQ_XCOMP_PERM): ") +
                                    std::strerror(permission_errno)};
  return {AmxState::kReady, "permitted"};
}

AmxStatus Amx() {
  static const AmxStatus status = [] {
#if defined(__x86_64__) && defined(__linux__)
    // CPUID leaf 7: EDX bit 22 AMX-BF16, 24 AMX-TILE, 25 AMX-INT8. GCC's __builtin_cpu_supports
    // knows them only from GCC 13; Debian 12 has GCC 12.
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    const bool leaf7 = __get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) != 0;
    const bool cpu = leaf7 && (edx >> 22 & 1) && (edx >> 24 & 1) && (edx >> 25 & 1);
    // XCR0 (XGETBV, valid where CPUID.1:ECX.OSXSAVE): bit 17 XTILECFG, 18 XTILEDATA.
    bool os = false;
    if (cpu) {
      unsigned a = 0, b = 0, c = 0, d = 0;
      if (__get_cpuid(1, &a, &b, &c, &d) && (c >> 27 & 1)) {
        unsigned lo = 0, hi = 0;
        __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
        os = (lo >> 17 & 3) == 3;
      }
    }
    int error = 0;
    if (cpu && os) {
      constexpr long kArchGetXcompPerm = 0x1022, kArchReqXcompPerm = 0x1023;
      constexpr long kXfeatureXtiledata = 18;
      if (syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) != 0) {
        error = errno;
      } else {
        // Granted: the process's permitted features now include the tile data.
        unsigned long long permitted = 0;
        if (syscall(SYS_arch_prctl, kArchGetXcompPerm, &permitted) != 0)
          error = errno;
        else if (!(permitted >> kXfeatureXtiledata & 1))
          error = EPERM;
      }
    }
    return DecideAmx(cpu, os, error);
#else
    return DecideAmx(false, false, 0);
#endif
  }();
  return status;
}

bool AmxAllowed() {
  return IsaAllows(IsaLevel::kNative) && Amx().state == AmxState::kReady;
}

const char* IsaLevelName(IsaLevel l) {
  switch (l) {
    case IsaLevel::kNative:
      return "native";
    case IsaLevel::kAvx512:
      return "avx512";
    case IsaLevel::kAvx2:
      return "avx2";
    case IsaLevel::kPortable:
      return "portable";
  }
  return "native";
}

}  // namespace sy::kernels
