// What the CPU has, as the kernels see it, against what Linux reports in /proc/cpuinfo; AMX's
// readiness decision (CPU, OS state, permission) on every branch; the --max-isa names.
#include <gtest/gtest.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include "kernels/cpu/isa_level.h"

namespace sy::kernels {
namespace {

// The first "flags" line of /proc/cpuinfo (empty where there is none).
std::set<std::string> CpuinfoFlags() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("flags", 0) != 0) continue;
    std::istringstream words(line.substr(line.find(':') + 1));
    std::set<std::string> flags;
    for (std::string w; words >> w;)
      flags.insert(w);
    return flags;
  }
  return {};
}

TEST(IsaLevelTest, NamesRoundTripAndABadNameIsRefused) {
  for (IsaLevel l : {IsaLevel::kPortable, IsaLevel::kAvx2, IsaLevel::kAvx512, IsaLevel::kNative})
    EXPECT_EQ(ParseIsaLevel(IsaLevelName(l)), l);
  EXPECT_EQ(ParseIsaLevel("avx-512"), std::nullopt);
  EXPECT_EQ(ParseIsaLevel(""), std::nullopt);
}

TEST(IsaLevelTest, CpuFeaturesAgreeWithProcCpuinfo) {
  const auto flags = CpuinfoFlags();
  if (flags.empty()) GTEST_SKIP() << "no flags line in /proc/cpuinfo";
  auto has = [&](const char* f) { return flags.count(f) > 0; };
#if defined(__x86_64__)
  EXPECT_EQ(CpuHasAvx2Fma(), has("avx2") && has("fma") && has("f16c"));
  EXPECT_EQ(CpuHasAvx512Vnni(),
            has("avx512f") && has("avx512bw") && has("avx512vl") && has("avx512_vnni"));
  const bool amx = has("amx_tile") && has("amx_bf16") && has("amx_int8");
  const AmxStatus status = Amx();
  if (!amx) {
    EXPECT_EQ(status.state, AmxState::kAbsent) << status.detail;
    EXPECT_FALSE(AmxAllowed());
  } else {
    // The CPU has AMX: whatever stops it (an OS without the tile state, a refused permission)
    // is said, never taken for an absent AMX.
    EXPECT_NE(status.state, AmxState::kAbsent) << status.detail;
    if (status.state == AmxState::kNoOsState) {
      EXPECT_NE(status.detail.find("XCR0"), std::string::npos) << status.detail;
    }
    if (status.state == AmxState::kRefused) {
      EXPECT_NE(status.detail.find("arch_prctl"), std::string::npos) << status.detail;
    }
  }
  EXPECT_EQ(Amx().detail, status.detail);  // asked once
#endif
}

TEST(IsaLevelTest, AmxIsReadyOnlyWithTheCpuTheOsStateAndThePermission) {
  EXPECT_EQ(DecideAmx(false, false, 0).state, AmxState::kAbsent);
  EXPECT_EQ(DecideAmx(false, true, 0).state, AmxState::kAbsent);
  const AmxStatus no_state = DecideAmx(true, false, 0);
  EXPECT_EQ(no_state.state, AmxState::kNoOsState);
  EXPECT_NE(no_state.detail.find("XCR0"), std::string::npos) << no_state.detail;
  const AmxStatus refused = DecideAmx(true, true, EPERM);
  EXPECT_EQ(refused.state, AmxState::kRefused);
  EXPECT_NE(refused.detail.find("arch_prctl"), std::string::npos) << refused.detail;
  EXPECT_NE(refused.detail.find(std::strerror(EPERM)), std::string::npos) << refused.detail;
  EXPECT_EQ(DecideAmx(true, true, EINVAL).state, AmxState::kRefused);  // a kernel before 5.16
  EXPECT_EQ(DecideAmx(true, true, 0).state, AmxState::kReady);
}

}  // namespace
}  // namespace sy::kernels
