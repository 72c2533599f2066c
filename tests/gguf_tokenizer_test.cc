// The tokenizer a GGUF carries against the tokenizer.json it was made from: the default model's
// tokenizer written the way llama.cpp's converter writes it (tests/fixtures/gguf/
// default-tokenizer.gguf, by tools/gguf/make_default_gguf.py --tokenizer-only) must give the same
// ids as models/default/tokenizer.json on the whole committed corpus, and the same config.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/gguf.h"
#include "tokenizer/gguf_tokenizer.h"
#include "tokenizer/text_codec.h"
#include "tokenizer/tokenizer.h"

namespace sy {
namespace {

const std::string kGguf = std::string(SY_FIXTURES_DIR) + "/gguf/default-tokenizer.gguf";
const std::string kModelDir = std::string(SY_SOURCE_DIR) + "/models/default";

std::vector<std::string> CorpusTexts() {
  std::ifstream in(std::string(SY_FIXTURES_DIR) + "/tokenizer/corpus.jsonl");
  std::vector<std::string> texts;
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) texts.push_back(nlohmann::json::parse(line)["text"].get<std::string>());
  return texts;
}

TEST(GgufTokenizerTest, SameIdsAsTokenizerJsonOnTheCorpus) {
  auto from_gguf = Tokenizer::Load(kGguf);
  ASSERT_TRUE(from_gguf.ok()) << from_gguf.status().message();
  auto from_json = Tokenizer::Load(kModelDir);
  ASSERT_TRUE(from_json.ok()) << from_json.status().message();
  const auto texts = CorpusTexts();
  ASSERT_GE(texts.size(), 100u);
  for (size_t i = 0; i < texts.size(); ++i) {
    auto want = from_json->Encode(texts[i]);
    auto got = from_gguf->Encode(texts[i]);
    ASSERT_EQ(want.ok(), got.ok()) << "corpus line " << i;
    if (!want.ok()) continue;  // invalid UTF-8 lines fail in both
    EXPECT_EQ(got.value(), want.value()) << "corpus line " << i;
    auto decoded = from_gguf->Decode(got.value());
    ASSERT_TRUE(decoded.ok());
    EXPECT_EQ(decoded.value(), from_json->Decode(want.value()).value()) << "corpus line " << i;
  }
  // Special tokens are recognised in text and flagged special.
  auto special = from_gguf->Encode("<｜User｜>hi<｜Assistant｜>");
  ASSERT_TRUE(special.ok());
  EXPECT_EQ(special.value().front(), 3);
  EXPECT_TRUE(from_gguf->IsSpecial(3));
}

TEST(GgufTokenizerTest, ConfigMatchesTokenizerConfigJson) {
  auto gguf = TextCodec::Load(kGguf);
  ASSERT_TRUE(gguf.ok()) << gguf.status().message();
  auto json = TextCodec::Load(kModelDir);
  ASSERT_TRUE(json.ok()) << json.status().message();
  EXPECT_EQ(gguf->config.bos_token, json->config.bos_token);
  EXPECT_EQ(gguf->config.eos_token, json->config.eos_token);
  EXPECT_EQ(gguf->config.add_bos_token, json->config.add_bos_token);
  EXPECT_EQ(gguf->config.chat_template, json->config.chat_template);
  EXPECT_EQ(gguf->bos_id, json->bos_id);
  EXPECT_TRUE(gguf->chat.has_value()) << gguf->chat_status.message();
  auto prompt = gguf->EncodeChat("Hello there");
  ASSERT_TRUE(prompt.ok());
  EXPECT_EQ(prompt.value(), json->EncodeChat("Hello there").value());
}

TEST(GgufTokenizerTest, UnsupportedNamesAreErrors) {
  auto qwen = GgufPreTokenizerRegexes("qwen2");
  ASSERT_FALSE(qwen.ok());
  EXPECT_NE(qwen.status().message().find("\"qwen2\""), std::string::npos);
  for (const char* name : {"deepseek-v3", "deepseek-llm", "deepseek-coder", "gpt-2", "default"})
    EXPECT_TRUE(GgufPreTokenizerRegexes(name).ok()) << name;

  // A file whose tokenizer is SentencePiece ("llama") is refused by name.
  auto file = GgufFile::Open(kGguf);
  ASSERT_TRUE(file.ok());
  std::vector<uint8_t> bytes;
  auto put = [&](const void* p, size_t n) {
    bytes.insert(bytes.end(), static_cast<const uint8_t*>(p), static_cast<const uint8_t*>(p) + n);
  };
  auto put_string = [&](std::string_view s) {
    const uint64_t n = s.size();
    put(&n, 8);
    put(s.data(), s.size());
  };
  const uint32_t version = 3, string_type = 8;
  const uint64_t tensors = 0, pairs = 1;
  put("GGUF", 4), put(&version, 4), put(&tensors, 8), put(&pairs, 8);
  put_string("tokenizer.ggml.model"), put(&string_type, 4), put_string("llama");
  auto llama = GgufFile::Parse(bytes.data(), bytes.size(), "spm.gguf");
  ASSERT_TRUE(llama.ok()) << llama.status().message();
  auto refused = GgufTokenizerJson(llama.value());
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("\"llama\""), std::string::npos)
      << refused.status().message();
}

TEST(GgufTokenizerTest, EveryKnownPreTokenizerCompilesAndSplits) {
  for (const char* name : {"deepseek-v3", "deepseek-llm", "deepseek-coder", "gpt-2", "default"}) {
    SCOPED_TRACE(name);
    nlohmann::json steps = nlohmann::json::array();
    const auto regexes = GgufPreTokenizerRegexes(name);
    ASSERT_TRUE(regexes.ok());
    for (const auto& regex : regexes.value())
      steps.push_back({{"type", "Split"},
                       {"pattern", {{"Regex", regex}}},
                       {"behavior", "Isolated"},
                       {"invert", false}});
    auto pre = PreTokenizer::FromJson({{"type", "Sequence"}, {"pretokenizers", steps}});
    ASSERT_TRUE(pre.ok()) << pre.status().message();
    std::string text = "Hello, wörld 12345\n\n  中文テキスト 𐐀x!";
    std::vector<TextPiece> pieces;
    ASSERT_TRUE(pre.value()->Split(&text, &pieces).ok());
    ASSERT_GT(pieces.size(), 4u);
    // Isolated splitting loses nothing: the pieces cover the text end to end.
    EXPECT_EQ(pieces.front().begin, 0u);
    EXPECT_EQ(pieces.back().end, text.size());
    for (size_t i = 1; i < pieces.size(); ++i)
      EXPECT_EQ(pieces[i].begin, pieces[i - 1].end);
  }
}

// A named "tool_use" template (tokenizer.chat_template.tool_use, as gguf-py writes a
// checkpoint's list of named templates) is the one requests with tools are rendered by.
TEST(GgufTokenizerTest, ANamedToolUseTemplateIsRead) {
  std::ifstream in(kGguf, std::ios::binary);
  std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)),
                             std::istreambuf_iterator<char>());
  ASSERT_GT(bytes.size(), 24u);
  uint64_t tensors = 0, pairs = 0;
  std::memcpy(&tensors, bytes.data() + 8, 8);
  std::memcpy(&pairs, bytes.data() + 16, 8);
  ASSERT_EQ(tensors, 0u);
  // The two pairs go first, right after the header; a Jinja comment pads them to the file's
  // 32-byte alignment, so the (empty) data section still starts where the file ends.
  auto pairs_bytes = [](const std::string& tool_use) {
    std::vector<uint8_t> out;
    auto put = [&](const void* p, size_t n) {
      out.insert(out.end(), static_cast<const uint8_t*>(p), static_cast<const uint8_t*>(p) + n);
    };
    auto put_string = [&](std::string_view s) {
      const uint64_t n = s.size();
      put(&n, 8);
      put(s.data(), s.size());
    };
    const uint32_t string_type = 8, array_type = 9;
    const uint64_t names = 1;
    put_string("tokenizer.chat_template.tool_use"), put(&string_type, 4), put_string(tool_use);
    put_string("tokenizer.chat_templates"), put(&array_type, 4), put(&string_type, 4);
    put(&names, 8), put_string("tool_use");
    return out;
  };
  const std::string base = "{{ bos_token }}TOOLS{% for m in messages %}{{ m.content }}{% endfor %}";
  const size_t unpadded = pairs_bytes(base + "{##}").size();
  const std::string tool_use = base + "{#" + std::string((32 - unpadded % 32) % 32, ' ') + "#}";
  const std::vector<uint8_t> added = pairs_bytes(tool_use);
  ASSERT_EQ(added.size() % 32, 0u);
  bytes.insert(bytes.begin() + 24, added.begin(), added.end());
  pairs += 2;
  std::memcpy(bytes.data() + 16, &pairs, 8);
  const std::string path = testing::TempDir() + "/tool-use-template.gguf";
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(bytes.data()),
             static_cast<std::streamsize>(bytes.size()));
  auto codec = TextCodec::Load(path);
  ASSERT_TRUE(codec.ok()) << codec.status().message();
  EXPECT_EQ(codec->config.tool_use_chat_template, tool_use);
  ASSERT_TRUE(codec->tool_use_chat.has_value());
  auto plain = TextCodec::Load(kGguf);
  ASSERT_TRUE(plain.ok());
  EXPECT_FALSE(plain->tool_use_chat.has_value());
}

TEST(GgufTokenizerTest, RecognisesGgufFilesByMagic) {
  EXPECT_TRUE(IsGgufFile(kGguf));
  EXPECT_FALSE(IsGgufFile(kModelDir + "/tokenizer.json"));
  EXPECT_FALSE(IsGgufFile(kModelDir));
}

}  // namespace
}  // namespace sy
