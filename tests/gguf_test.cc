// The GGUF reader on hand-built files: a valid one read back, and every kind of damage (truncation
// at every byte, bad counts, types, shapes, offsets, overlaps) refused with a message naming it.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "model/gguf.h"

namespace sy {
namespace {

// Appends GGUF's little-endian encodings.
struct Writer {
  std::vector<uint8_t> bytes;
  template <typename T>
  Writer& Put(T value) {
    const auto* raw = reinterpret_cast<const uint8_t*>(&value);
    bytes.insert(bytes.end(), raw, raw + sizeof(T));
    return *this;
  }
  Writer& U32(uint32_t value) { return Put(value); }
  Writer& U64(uint64_t value) { return Put(value); }
  Writer& Str(std::string_view text) {
    U64(text.size());
    bytes.insert(bytes.end(), text.begin(), text.end());
    return *this;
  }
  Writer& Header(uint64_t tensors, uint64_t pairs, uint32_t version = 3) {
    bytes.insert(bytes.end(), {'G', 'G', 'U', 'F'});
    return U32(version).U64(tensors).U64(pairs);
  }
  Writer& TensorInfo(std::string_view name, std::vector<uint64_t> dims, uint32_t type,
                     uint64_t offset) {
    Str(name).U32(static_cast<uint32_t>(dims.size()));
    for (uint64_t d : dims)
      U64(d);
    return U32(type).U64(offset);
  }
  Writer& PadTo(uint64_t alignment) {
    while (bytes.size() % alignment != 0)
      bytes.push_back(0);
    return *this;
  }
  Writer& Zeros(size_t count) {
    bytes.resize(bytes.size() + count, 0);
    return *this;
  }
};

constexpr uint32_t kF32 = 0, kQ8_0 = 8, kQ4_K = 12;
constexpr uint32_t kTypeU32 = 4, kTypeString = 8, kTypeArray = 9, kTypeBool = 7;

// Two tensors: "a" F32 [3, 2] at 0 and "b" Q8_0 [64] (2 blocks of 34 bytes) at 32.
std::vector<uint8_t> ValidFile() {
  Writer w;
  w.Header(2, 3);
  w.Str("general.architecture").U32(kTypeString).Str("deepseek2");
  w.Str("general.alignment").U32(kTypeU32).U32(32);
  w.Str("list").U32(kTypeArray).U32(kTypeArray).U64(2);  // [[7], ["x", "y"]]
  w.U32(kTypeU32).U64(1).U32(7);
  w.U32(kTypeString).U64(2).Str("x").Str("y");
  w.TensorInfo("a", {3, 2}, kF32, 0);
  w.TensorInfo("b", {64}, kQ8_0, 32);
  w.PadTo(32);
  for (int i = 0; i < 6; ++i)
    w.Put(static_cast<float>(i) + 0.5f);
  w.Zeros(8).Zeros(68);
  return w.bytes;
}

Result<GgufFile> Parse(const std::vector<uint8_t>& bytes) {
  return GgufFile::Parse(bytes.data(), bytes.size(), "test.gguf");
}

void ExpectError(const std::vector<uint8_t>& bytes, const std::vector<std::string>& fragments) {
  auto file = Parse(bytes);
  ASSERT_FALSE(file.ok()) << "parsed a broken file";
  for (const auto& fragment : fragments)
    EXPECT_NE(file.status().message().find(fragment), std::string::npos)
        << "'" << fragment << "' not in: " << file.status().message();
}

TEST(GgufTest, ReadsAValidFile) {
  const auto bytes = ValidFile();
  auto parsed = Parse(bytes);
  ASSERT_TRUE(parsed.ok()) << parsed.status().message();
  const GgufFile& file = parsed.value();
  EXPECT_EQ(file.version(), 3u);
  EXPECT_EQ(file.alignment(), 32u);
  EXPECT_EQ(file.data_offset() % 32, 0u);
  EXPECT_EQ(file.Find("general.architecture")->AsString(), "deepseek2");
  const GgufValue* list = file.Find("list");
  ASSERT_EQ(list->elements.size(), 2u);
  EXPECT_EQ(list->elements[0].elements[0].AsInt(), 7);
  EXPECT_EQ(list->elements[1].elements[1].AsString(), "y");
  ASSERT_EQ(file.tensors().size(), 2u);
  const GgufTensorInfo* a = file.FindTensor("a");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->dims, (std::vector<int64_t>{3, 2}));
  EXPECT_EQ(a->elements, 6);
  EXPECT_EQ(a->byte_size, 24u);
  float third;
  std::memcpy(&third, file.TensorData(*a) + 8, 4);
  EXPECT_EQ(third, 2.5f);
  const GgufTensorInfo* b = file.FindTensor("b");
  EXPECT_EQ(b->type, GgmlType::kQ8_0);
  EXPECT_EQ(b->byte_size, 68u);
}

TEST(GgufTest, VersionTwoIsRead) {
  auto bytes = ValidFile();
  bytes[4] = 2;
  EXPECT_TRUE(Parse(bytes).ok());
}

TEST(GgufTest, EveryTruncationIsAnError) {
  const auto bytes = ValidFile();
  for (size_t size = 0; size < bytes.size(); ++size) {
    auto file = GgufFile::Parse(bytes.data(), size, "cut.gguf");
    EXPECT_FALSE(file.ok()) << "a file cut at " << size << " bytes parsed";
  }
}

TEST(GgufTest, HeaderErrors) {
  auto bytes = ValidFile();
  bytes[0] = 'X';
  ExpectError(bytes, {"test.gguf", "bad magic"});
  bytes = ValidFile();
  bytes[4] = 1;
  ExpectError(bytes, {"version 1"});
  bytes = ValidFile();
  bytes[4] = 0, bytes[7] = 3;
  ExpectError(bytes, {"big-endian"});
  Writer absurd_tensors;
  absurd_tensors.Header(uint64_t{1} << 60, 0).Zeros(64);
  ExpectError(absurd_tensors.bytes, {"tensor count", "cannot fit"});
  Writer absurd_pairs;
  absurd_pairs.Header(0, uint64_t{1} << 62).Zeros(64);
  ExpectError(absurd_pairs.bytes, {"metadata count", "cannot fit"});
}

TEST(GgufTest, MetadataErrors) {
  Writer unknown_type;
  unknown_type.Header(0, 1).Str("k").U32(13).U32(0);
  ExpectError(unknown_type.bytes, {"'k'", "unknown value type 13"});
  Writer absurd_array;
  absurd_array.Header(0, 1).Str("tokens").U32(kTypeArray).U32(kTypeString).U64(uint64_t{1} << 59);
  ExpectError(absurd_array.bytes, {"'tokens'", "cannot fit"});
  Writer long_string;
  long_string.Header(0, 1).Str("k").U32(kTypeString).U64(1000).Zeros(10);
  ExpectError(long_string.bytes, {"'k'", "claims 1000 bytes"});
  Writer bad_bool;
  bad_bool.Header(0, 1).Str("flag").U32(kTypeBool).Put<uint8_t>(2);
  ExpectError(bad_bool.bytes, {"'flag'", "bool value 2"});
  Writer twice;
  twice.Header(0, 2).Str("k").U32(kTypeU32).U32(1).Str("k").U32(kTypeU32).U32(2);
  ExpectError(twice.bytes, {"'k' appears twice"});
  Writer deep;
  deep.Header(0, 1).Str("deep").U32(kTypeArray);
  for (int i = 0; i < 20; ++i)
    deep.U32(kTypeArray).U64(1);
  deep.U32(kTypeU32).U64(1).U32(0);
  ExpectError(deep.bytes, {"'deep'", "nested deeper"});
  Writer alignment;
  alignment.Header(0, 1).Str("general.alignment").U32(kTypeU32).U32(24);
  ExpectError(alignment.bytes, {"general.alignment 24"});
  Writer alignment_type;
  alignment_type.Header(0, 1).Str("general.alignment").U32(kTypeString).Str("32");
  ExpectError(alignment_type.bytes, {"general.alignment is a string"});
}

// A file with one tensor info as given and `data` bytes of data.
std::vector<uint8_t> OneTensor(std::vector<uint64_t> dims, uint32_t type, uint64_t offset,
                               size_t data) {
  Writer w;
  w.Header(1, 0).TensorInfo("blk.0.ffn_down_exps.weight", std::move(dims), type, offset);
  return w.PadTo(32).Zeros(data).bytes;
}

TEST(GgufTest, TensorErrors) {
  const std::string name = "'blk.0.ffn_down_exps.weight'";
  EXPECT_TRUE(Parse(OneTensor({256, 2}, kQ4_K, 0, 288)).ok());
  ExpectError(OneTensor({256, 2}, 4, 0, 288), {name, "unknown GGML type id 4"});
  ExpectError(OneTensor({100, 2}, kQ4_K, 0, 288), {name, "row length 100", "block size 256"});
  ExpectError(OneTensor({256, 2}, kQ4_K, 0, 287), {name, "run past its end"});
  ExpectError(OneTensor({256, 2}, kQ4_K, 64, 288), {name, "run past its end"});
  ExpectError(OneTensor({256, 2}, kQ4_K, 16, 400), {name, "not a multiple of the alignment 32"});
  ExpectError(OneTensor({256, 0}, kQ4_K, 0, 288), {name, "dimension 1 is 0"});
  ExpectError(OneTensor({uint64_t{1} << 40, uint64_t{1} << 40}, kF32, 0, 64), {name, "overflows"});
  ExpectError(OneTensor({uint64_t{1} << 63}, kF32, 0, 64), {name, "dimension 0"});
  ExpectError(OneTensor({1, 1, 1, 1, 1}, kF32, 0, 64), {name, "5 dimensions"});
  // A byte size past 2^64 even though the element count fits.
  ExpectError(OneTensor({uint64_t{1} << 62}, kF32, 0, 64), {name, "overflows"});
}

TEST(GgufTest, OverlapsAndDuplicatesAreErrors) {
  Writer overlap;
  overlap.Header(2, 0).TensorInfo("x", {16}, kF32, 0).TensorInfo("y", {16}, kF32, 32);
  overlap.PadTo(32).Zeros(128);
  ExpectError(overlap.bytes, {"'x' and 'y' overlap"});
  Writer twice;
  twice.Header(2, 0).TensorInfo("x", {8}, kF32, 0).TensorInfo("x", {8}, kF32, 32);
  twice.PadTo(32).Zeros(64);
  ExpectError(twice.bytes, {"'x' appears twice"});
}

TEST(GgufTest, OpenNamesTheFile) {
  auto missing = GgufFile::Open("/nonexistent/model.gguf");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("/nonexistent/model.gguf"), std::string::npos);
}

}  // namespace
}  // namespace sy
