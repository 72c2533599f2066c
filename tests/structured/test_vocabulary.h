// The tokenizers the structured tests run on, as the grammar engine's Vocabulary: each id's
// bytes (the ByteLevel mapping already decoded by Tokenizer::TokenBytes), special tokens marked,
// <｜end▁of▁sentence｜> as EOS.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "structured/compiler.h"
#include "tokenizer/tokenizer.h"

namespace sy::structured {

inline std::string DefaultTokenizerPath() {
  return std::string(SY_SOURCE_DIR) + "/configs/tokenizer/default/tokenizer.json";
}
inline std::string DeepSeekTokenizerPath() {
  return std::string(SY_FIXTURES_DIR) + "/tokenizer/deepseek-v3/tokenizer.json";
}

inline Vocabulary LoadVocabulary(const std::string& path) {
  auto tokenizer = Tokenizer::Load(path);
  EXPECT_TRUE(tokenizer.ok()) << tokenizer.status().message();
  Vocabulary vocab;
  if (!tokenizer.ok()) return vocab;
  for (int32_t id = 0; id < tokenizer->vocab_size(); ++id) {
    vocab.token_bytes.emplace_back(tokenizer->TokenBytes(id));
    vocab.special.push_back(tokenizer->IsSpecial(id) ? 1 : 0);
  }
  if (auto eos = tokenizer->TokenToId("<｜end▁of▁sentence｜>")) vocab.eos_ids.push_back(*eos);
  return vocab;
}

}  // namespace sy::structured
