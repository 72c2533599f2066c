// A Hugging Face tokenizer.json of the byte-level BPE kind DeepSeek ships, loaded and run
// natively: added (special) tokens matched first, then the pre-tokenizer's splits, then BPE
// merges; decoding through the ByteLevel decoder. Ids are identical to the `tokenizers` library's
// (tests/tokenizer_test.cc checks them on a committed corpus). Anything in the file this code
// does not implement — another model type, a normalizer, an unknown pre-tokenizer — is an error
// naming it, never an approximation.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "base/status.h"
#include "tokenizer/bpe.h"
#include "tokenizer/pre_tokenizer.h"

namespace sy {

struct AddedToken {
  int32_t id = 0;
  std::string content;
  bool special = false;
  bool lstrip = false;  // the match absorbs whitespace on its left
  bool rstrip = false;  // ... and on its right
};

class Tokenizer {
 public:
  // Loads `path`: a tokenizer.json file, or a directory holding one.
  static Result<Tokenizer> Load(const std::string& path);
  // Parses tokenizer.json text; `source` names it in messages.
  static Result<Tokenizer> FromJson(std::string_view json_text, const std::string& source);
  // A tokenizer made of its parts (tiktoken vocabularies, tokenizer/tiktoken.h). Added tokens'
  // ids must lie within the vocabulary plus the added tokens plus kIdSlack.
  static Result<Tokenizer> FromParts(const std::string& source,
                                     std::unique_ptr<PreTokenizer> pre_tokenizer, BpeModel model,
                                     std::vector<AddedToken> added_tokens);

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  // Text (UTF-8) to ids, adding no special tokens of its own; added tokens written in the text
  // are recognised. Invalid UTF-8 is an error naming the byte offset.
  Result<std::vector<int32_t>> Encode(std::string_view text) const;

  // Ids to text. Ids outside the vocabulary are an error; invalid UTF-8 formed by the tokens'
  // bytes becomes U+FFFD, as the `tokenizers` library does.
  Result<std::string> Decode(std::span<const int32_t> ids, bool skip_special_tokens = false) const;
  // The raw bytes a token stands for (special tokens: their text); empty for unknown ids.
  std::string_view TokenBytes(int32_t id) const;
  bool IsSpecial(int32_t id) const;

  // One more than the largest id the tokenizer can produce.
  int64_t vocab_size() const { return static_cast<int64_t>(token_bytes_.size()); }
  // The id of a token string (vocabulary spelling or added token content), if any.
  std::optional<int32_t> TokenToId(std::string_view token) const;
  const std::vector<AddedToken>& added_tokens() const { return added_tokens_; }
  const std::string& source() const { return source_; }

 private:
  Tokenizer() = default;
  static Result<Tokenizer> FromJsonChecked(std::string_view json_text, const std::string& source);
  Status EncodeOrdinary(std::string_view text, std::vector<int32_t>* ids) const;
  // The next added token at or after `from`, leftmost then longest; npos when none.
  size_t FindAddedToken(std::string_view text, size_t from, size_t* length, int32_t* id) const;

  std::string source_;
  std::unique_ptr<PreTokenizer> pre_tokenizer_;
  std::unique_ptr<BpeModel> model_;
  std::vector<AddedToken> added_tokens_;
  // Added tokens grouped by first byte, longest first, for leftmost-longest matching.
  std::vector<std::vector<int32_t>> added_by_first_byte_;  // indexes into added_tokens_
  bool any_added_first_byte_[256] = {};
  std::vector<std::string> token_bytes_;  // decoded bytes of every id
  std::vector<uint8_t> special_;          // 1 for special added tokens
};

// A whole file's bytes; an error names the path.
Result<std::string> ReadTextFile(const std::string& path);

// What tokenizer_config.json says around the vocabulary: the chat template and the BOS/EOS
// tokens it refers to.
struct TokenizerConfig {
  std::string chat_template;  // empty when the file has none
  // A named "tool_use" template (tokenizer_config.json's list form, or
  // additional_chat_templates/tool_use.jinja): transformers renders with it when tools are given.
  std::string tool_use_chat_template;
  std::string bos_token;
  std::string eos_token;
  bool add_bos_token = false;
  bool add_eos_token = false;
  // Kimi's tokenizer class sorts the keys of the tools, recursively, before its template sees
  // them (its apply_chat_template override): prompts match only if we do the same.
  bool sort_tool_keys = false;
  std::string source;
};

// Reads `directory`/tokenizer_config.json (a missing file gives an empty config), and the chat
// templates transformers keeps beside it (chat_template.jinja, additional_chat_templates/), which
// replace the config's.
Result<TokenizerConfig> LoadTokenizerConfig(const std::string& directory);

}  // namespace sy
