// The GGML dequantizers against gguf-py's numpy ones, bit for bit: tests/fixtures/gguf/quants.gguf
// (tools/gguf/make_quant_fixture.py) holds random blocks of every supported type beside the
// float32 values gguf.quants.dequantize gives for them. It also checks that the reader reads every
// metadata value type gguf-py writes.
#include <gtest/gtest.h>

#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "model/gguf.h"
#include "tensor/dtype.h"
#include "tensor/ggml_quants.h"

namespace sy {
namespace {

const std::string kFixture = std::string(SY_FIXTURES_DIR) + "/gguf/quants.gguf";

GgufFile OpenFixture() {
  auto file = GgufFile::Open(kFixture);
  EXPECT_TRUE(file.ok()) << file.status().message();
  return std::move(file).value();
}

TEST(GgmlQuantsTest, EveryTypeMatchesGgufPyBitForBit) {
  GgufFile file = OpenFixture();
  std::set<std::string> types_seen;
  for (const auto& tensor : file.tensors()) {
    const std::string name(tensor.name);
    if (name.ends_with(".expected")) continue;
    SCOPED_TRACE(name);
    const GgufTensorInfo* expected = file.FindTensor(name + ".expected");
    ASSERT_NE(expected, nullptr);
    ASSERT_EQ(expected->type, GgmlType::kF32);
    ASSERT_EQ(expected->dims, tensor.dims);
    std::vector<float> decoded(tensor.elements);
    Status status =
        DequantizeGgml(tensor.type, file.TensorData(tensor), tensor.elements, decoded.data());
    ASSERT_TRUE(status.ok()) << status.message();
    const uint8_t* reference = file.TensorData(*expected);
    int64_t mismatches = 0;
    for (int64_t i = 0; i < tensor.elements; ++i) {
      uint32_t want;
      std::memcpy(&want, reference + 4 * i, 4);
      const uint32_t got = BitsFromF32(decoded[i]);
      if (got != want && ++mismatches <= 5)
        ADD_FAILURE() << "element " << i << ": got bits " << std::hex << got << ", gguf-py "
                      << want;
    }
    EXPECT_EQ(mismatches, 0);
    types_seen.insert(std::string(GgmlTypeInfo(tensor.type)->name));
  }
  const std::set<std::string> supported = {"F32",  "F16",  "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1",
                                           "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"};
  EXPECT_EQ(types_seen, supported);
}

TEST(GgmlQuantsTest, UnsupportedTypesAndPartialBlocksAreErrors) {
  std::vector<uint8_t> bytes(1024);
  std::vector<float> out(256);
  Status iq = DequantizeGgml(GgmlType::kIQ2_XXS, bytes.data(), 256, out.data());
  ASSERT_FALSE(iq.ok());
  EXPECT_NE(iq.message().find("IQ2_XXS"), std::string::npos) << iq.message();
  Status partial = DequantizeGgml(GgmlType::kQ4_K, bytes.data(), 100, out.data());
  ASSERT_FALSE(partial.ok());
  EXPECT_NE(partial.message().find("Q4_K"), std::string::npos) << partial.message();
  EXPECT_FALSE(DequantizeGgml(static_cast<GgmlType>(4), bytes.data(), 32, out.data()).ok());
  EXPECT_FALSE(GgmlTypeInfo(4).has_value());  // Q4_2, retired upstream
}

TEST(GgmlQuantsTest, HalfConversionKeepsNaNPayloadsAndSubnormals) {
  EXPECT_EQ(BitsFromF32(GgmlHalfToF32(0x7e01)), 0x7fc02000u);
  EXPECT_EQ(GgmlHalfToF32(0x0001), 5.9604644775390625e-8f);
  EXPECT_EQ(BitsFromF32(GgmlHalfToF32(0x8000)), 0x80000000u);
  EXPECT_EQ(GgmlHalfToF32(0x7bff), 65504.0f);
  EXPECT_EQ(GgmlHalfToF32(0xfc00), -INFINITY);
}

TEST(GgmlQuantsTest, ReaderReadsEveryValueTypeGgufPyWrites) {
  GgufFile file = OpenFixture();
  EXPECT_EQ(file.version(), 3u);
  EXPECT_EQ(file.Find("general.architecture")->AsString(), "fixture");
  EXPECT_EQ(file.Find("test.u8")->AsInt(), 200);
  EXPECT_EQ(file.Find("test.i8")->AsInt(), -100);
  EXPECT_EQ(file.Find("test.u16")->AsInt(), 60000);
  EXPECT_EQ(file.Find("test.i16")->AsInt(), -30000);
  EXPECT_EQ(file.Find("test.u32")->AsInt(), 4000000000);
  EXPECT_EQ(file.Find("test.i32")->AsInt(), -2000000000);
  EXPECT_EQ(file.Find("test.f32")->AsFloat(), static_cast<double>(0.1f));
  EXPECT_EQ(file.Find("test.bool")->unsigned_value, 1u);
  EXPECT_EQ(file.Find("test.string")->AsString(), "h\xc3\xa9llo");
  const GgufValue* u64 = file.Find("test.u64");
  EXPECT_EQ(u64->unsigned_value, (uint64_t{1} << 63) + 5);
  EXPECT_FALSE(u64->AsInt().has_value());  // does not fit in int64
  EXPECT_EQ(file.Find("test.i64")->AsInt(), -(int64_t{1} << 62));
  EXPECT_EQ(file.Find("test.f64")->AsFloat(), 0.1);
  const GgufValue* strings = file.Find("test.strings");
  ASSERT_EQ(strings->element_type, GgufValueType::kString);
  ASSERT_EQ(strings->elements.size(), 3u);
  EXPECT_EQ(strings->elements[1].AsString(), "");
  EXPECT_EQ(strings->elements[2].AsString(), "\xc4\xa0\xc4\x8a");
  const GgufValue* nested = file.Find("test.nested");
  ASSERT_EQ(nested->element_type, GgufValueType::kArray);
  ASSERT_EQ(nested->elements.size(), 3u);
  ASSERT_EQ(nested->elements[2].elements.size(), 2u);
  EXPECT_EQ(nested->elements[2].elements[1].AsInt(), 6);
  EXPECT_EQ(file.FindTensor("q4_k.1")->dims, (std::vector<int64_t>{256, 2, 2}));
  EXPECT_EQ(file.FindTensor("nope"), nullptr);
}

}  // namespace
}  // namespace sy
