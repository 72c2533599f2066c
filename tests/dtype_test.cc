#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "tensor/dtype.h"

namespace sy {
namespace {

TEST(DTypeTest, Fp8DecodesTheSpecValues) {
  EXPECT_EQ(F8E4M3ToF32(0x00), 0.0f);
  EXPECT_EQ(F8E4M3ToF32(0x38), 1.0f);                  // e=7, m=0
  EXPECT_EQ(F8E4M3ToF32(0x7e), 448.0f);                // largest finite
  EXPECT_EQ(F8E4M3ToF32(0x01), std::ldexp(1.0f, -9));  // smallest subnormal
  EXPECT_EQ(F8E4M3ToF32(0xb8), -1.0f);
  EXPECT_TRUE(std::isnan(F8E4M3ToF32(0x7f)));
  EXPECT_TRUE(std::isnan(F8E4M3ToF32(0xff)));
}

TEST(DTypeTest, Fp8EncodeRoundTripsEveryCode) {
  for (int code = 0; code < 256; ++code) {
    if ((code & 0x7f) == 0x7f) continue;  // NaN
    float value = F8E4M3ToF32(static_cast<uint8_t>(code));
    uint8_t back = F32ToF8E4M3(value);
    if (value == 0.0f) {
      EXPECT_EQ(F8E4M3ToF32(back), 0.0f);
    } else {
      EXPECT_EQ(back, code) << "value " << value;
    }
  }
}

TEST(DTypeTest, Fp8EncodeRoundsToNearestEvenAndSaturates) {
  EXPECT_EQ(F8E4M3ToF32(F32ToF8E4M3(1.0625f)), 1.0f);   // halfway between 1 and 1.125: even
  EXPECT_EQ(F8E4M3ToF32(F32ToF8E4M3(1.1875f)), 1.25f);  // halfway between 1.125 and 1.25: even
  EXPECT_EQ(F8E4M3ToF32(F32ToF8E4M3(1000.0f)), 448.0f);
  EXPECT_EQ(F8E4M3ToF32(F32ToF8E4M3(-1000.0f)), -448.0f);
  EXPECT_EQ(F8E4M3ToF32(F32ToF8E4M3(15.5f)), 16.0f);  // rounds up into the next binade
}

// The encoder against a brute-force search of all 254 finite codes: the nearest value, ties to
// the even code, saturating at ±448 — for every midpoint between neighbouring codes and their
// neighbours, and a sweep of magnitudes across every binade.
TEST(DTypeTest, Fp8EncodeEqualsTheNearestCode) {
  auto nearest = [](float x) {
    int best = -1;
    double best_distance = 0;
    for (int code = 0; code < 256; ++code) {
      if ((code & 0x7f) == 0x7f) continue;
      const double v = F8E4M3ToF32(static_cast<uint8_t>(code));
      if ((v < 0) != std::signbit(x) && v != 0) continue;
      const double d = std::fabs(v - std::min<double>(std::fabs(x), 448.0) * (x < 0 ? -1 : 1));
      const bool tie = best >= 0 && d == best_distance;
      if (best < 0 || d < best_distance || (tie && (code & 1) == 0 && (best & 1) == 1)) {
        best = code;
        best_distance = d;
      }
    }
    return F8E4M3ToF32(static_cast<uint8_t>(best));
  };
  std::vector<float> probes;
  for (int code = 0; code < 0x7e; ++code) {
    const float a = F8E4M3ToF32(static_cast<uint8_t>(code)),
                b = F8E4M3ToF32(static_cast<uint8_t>(code + 1));
    const float mid = (a + b) / 2;
    probes.insert(probes.end(), {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1e9f)});
  }
  for (float x = 1e-4f; x < 600.0f; x *= 1.0137f)
    probes.push_back(x);
  for (float x : probes) {
    EXPECT_EQ(F8E4M3ToF32(F32ToF8E4M3(x)), nearest(x)) << x;
    EXPECT_EQ(F8E4M3ToF32(F32ToF8E4M3(-x)), -nearest(x)) << -x;
  }
}

TEST(DTypeTest, BF16RoundsToNearestEven) {
  EXPECT_EQ(BF16ToF32(F32ToBF16(1.0f)), 1.0f);
  EXPECT_EQ(BF16ToF32(F32ToBF16(1.00390625f)), 1.0f);       // halfway, to even
  EXPECT_EQ(BF16ToF32(F32ToBF16(1.01171875f)), 1.015625f);  // halfway, to even (up)
  EXPECT_TRUE(std::isnan(BF16ToF32(F32ToBF16(NAN))));
}

TEST(DTypeTest, F16RoundTrips) {
  for (float v : {0.0f, 1.0f, -2.5f, 65504.0f, 6.1035156e-05f, 5.9604645e-08f, 0.333251953125f})
    EXPECT_EQ(F16ToF32(F32ToF16(v)), v) << v;
  EXPECT_TRUE(std::isinf(F16ToF32(F32ToF16(1e6f))));
}

TEST(DTypeTest, ParsesSafetensorsNames) {
  EXPECT_EQ(ParseDType("F8_E4M3"), DType::kF8E4M3);
  EXPECT_EQ(ParseDType("BF16"), DType::kBF16);
  EXPECT_FALSE(ParseDType("F4").has_value());
  EXPECT_EQ(DTypeSize(DType::kF8E4M3), 1u);
}

}  // namespace
}  // namespace sy
