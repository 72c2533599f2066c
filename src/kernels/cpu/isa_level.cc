#include "kernels/cpu/isa_level.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <mutex>

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
