#include "tokenizer/gguf_tokenizer.h"

#include <nlohmann/json.hpp>

#include "tokenizer/tiktoken.h"

namespace sy {
namespace {

// llama_token_type (llama.h): how llama.cpp's converter classifies each id.
enum TokenType : int64_t {
  kNormal = 1,
  kUnknown = 2,
  kControl = 3,
  kUserDefined = 4,
  kUnused = 5,
  kByte = 6,
};

// llama-vocab.cpp's regex lists (llama.cpp as vendored by llama-cpp-python 0.3.36), by the names
// tokenizer.ggml.pre uses for them, code points written as escapes so no editor can normalize
// them (the DeepSeek LLM class holds U+1FD3, U+2126, U+212A, whose NFC forms differ).
// "deepseek-v3"'s are DeepSeek-V3's tokenizer.json Split patterns verbatim.
struct PreTokenizerRegexes {
  std::string_view name;
  std::vector<std::string> regexes;
};

const std::vector<PreTokenizerRegexes>& KnownPreTokenizers() {
  static const std::vector<PreTokenizerRegexes> known = {
      {"deepseek-v3",
       {"\\p{N}{1,3}", "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
        "[!\"#$%&'()*+,\\-./"
        ":;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| "
        "?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+"}},
      {"deepseek-llm",
       {"[\r\n]",
        "\\s?[A-Za-z\u00b5\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u01ba\u01bc-\u01bf\u01c4-\u0293\u0295-"
        "\u02af\u0370-\u0373\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c\u038e-"
        "\u03a1\u03a3-\u03f5\u03f7-\u0481\u048a-\u052f\u0531-\u0556\u10a0-\u10c5\u13a0-"
        "\u13f5\u13f8-\u13fd\u1c90-\u1cba\u1cbd-\u1cbf\u1d00-\u1d2b\u1d6b-\u1d77\u1d79-"
        "\u1d9a\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45\u1f48-\u1f4d\u1f50-"
        "\u1f57\u1f59\u1f5b\u1f5d\u1f5f-\u1f7d\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe\u1fc2-\u1fc4\u1fc6-"
        "\u1fcc\u1fd0-\u1fd3\u1fd6-\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4\u1ff6-\u1ffc\u2102\u2107\u210a-"
        "\u2113\u2115\u2119-\u211d\u2124\u2126\u2128\u212a-\u212d\u212f-\u2134\u2139\u213c-"
        "\u213f\u2145-\u2149\u214e\u2183\u2184\u2c00-\u2c7b\u2c7e-\u2ce4\u2ceb-"
        "\u2cee\u2cf2\u2cf3\ua640-\ua66d\ua680-\ua69b\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e\uab70-"
        "\uabbf\ufb00-\ufb06\ufb13-\ufb17\uff21-\uff3a\uff41-\uff5a\U00010400-\U0001044f\U000104b0-"
        "\U000104d3\U000104d8-\U000104fb\U00010c80-\U00010cb2\U00010cc0-\U00010cf2\U000118a0-"
        "\U000118df\U0001e900-\U0001e943]+",
        "\\s?[!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002]+", "\\s+$",
        "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+", "\\p{N}+"}},
      {"deepseek-coder",
       {"[\r\n]", "\\s?\\p{L}+", "\\s?\\p{P}+", "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+",
        "\\p{N}"}},
      // Kimi K2's tiktoken pattern (llama.cpp splits with its own code written to match it).
      {"kimi-k2", {std::string(kKimiK2Pattern)}},
      {"gpt-2", {"'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)"}},
      // What llama.cpp uses when `pre` is absent or "default".
      {"default",
       {"[\\p{P}\\$\\+<=>\\^~\\|]+",
        "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)", "\\p{N}+",
        "[0-9][0-9][0-9]"}},
  };
  return known;
}

Result<std::string_view> RequireString(const GgufFile& file, std::string_view key) {
  const GgufValue* value = file.Find(key);
  if (value == nullptr) return Status::Errorf("{}: no {}", file.source(), key);
  auto text = value->AsString();
  if (!text)
    return Status::Errorf("{}: {} is a {}, not a string", file.source(), key,
                          GgufValueTypeName(value->type));
  return *text;
}

Result<const GgufValue*> RequireArray(const GgufFile& file, std::string_view key,
                                      GgufValueType element_type) {
  const GgufValue* value = file.Find(key);
  if (value == nullptr) return Status::Errorf("{}: no {}", file.source(), key);
  if (value->type != GgufValueType::kArray || value->element_type != element_type)
    return Status::Errorf("{}: {} must be an array of {}", file.source(), key,
                          GgufValueTypeName(element_type));
  return value;
}

// An optional token id (bos/eos/padding); must name an existing token.
Result<std::optional<int64_t>> OptionalTokenId(const GgufFile& file, std::string_view key,
                                               size_t vocab_size) {
  const GgufValue* value = file.Find(key);
  if (value == nullptr) return std::optional<int64_t>();
  auto id = value->AsInt();
  if (!id || *id < 0 || static_cast<size_t>(*id) >= vocab_size)
    return Status::Errorf("{}: {} does not name one of the {} tokens", file.source(), key,
                          vocab_size);
  return std::optional<int64_t>(*id);
}

Result<bool> OptionalBool(const GgufFile& file, std::string_view key, bool fallback) {
  const GgufValue* value = file.Find(key);
  if (value == nullptr) return fallback;
  if (value->type != GgufValueType::kBool)
    return Status::Errorf("{}: {} must be a bool", file.source(), key);
  return value->unsigned_value != 0;
}

}  // namespace

Result<std::vector<std::string>> GgufPreTokenizerRegexes(std::string_view pre) {
  for (const auto& known : KnownPreTokenizers())
    if (known.name == pre) return known.regexes;
  std::string names;
  for (const auto& known : KnownPreTokenizers())
    names += (names.empty() ? "" : ", ") + std::string(known.name);
  return Status::Errorf("pre-tokenizer \"{}\" is not supported (known: {})", pre, names);
}

Result<std::string> GgufTokenizerJson(const GgufFile& file) {
  SY_ASSIGN_OR_RETURN(std::string_view model, RequireString(file, "tokenizer.ggml.model"));
  if (model != "gpt2")
    return Status::Errorf("{}: tokenizer.ggml.model \"{}\" is not supported (gpt2, byte-level BPE)",
                          file.source(), model);
  std::string_view pre = "default";
  if (file.Find("tokenizer.ggml.pre") != nullptr) {
    SY_ASSIGN_OR_RETURN(pre, RequireString(file, "tokenizer.ggml.pre"));
  }
  auto regexes = GgufPreTokenizerRegexes(pre);
  if (!regexes.ok()) return regexes.status().WithContext(file.source() + ": tokenizer.ggml.pre");
  SY_ASSIGN_OR_RETURN(const GgufValue* tokens,
                      RequireArray(file, "tokenizer.ggml.tokens", GgufValueType::kString));
  SY_ASSIGN_OR_RETURN(const GgufValue* merges,
                      RequireArray(file, "tokenizer.ggml.merges", GgufValueType::kString));
  const GgufValue* types = file.Find("tokenizer.ggml.token_type");
  if (types != nullptr &&
      (types->type != GgufValueType::kArray || types->elements.size() != tokens->elements.size()))
    return Status::Errorf("{}: tokenizer.ggml.token_type must be an array of {} integers",
                          file.source(), tokens->elements.size());

  nlohmann::json vocab = nlohmann::json::object();
  nlohmann::json added = nlohmann::json::array();
  for (size_t id = 0; id < tokens->elements.size(); ++id) {
    const std::string token(tokens->elements[id].string_value);
    if (token.empty())
      return Status::Errorf("{}: tokenizer.ggml.tokens[{}] is empty", file.source(), id);
    int64_t type = kNormal;
    if (types != nullptr) {
      auto value = types->elements[id].AsInt();
      if (!value || *value < kNormal || *value > kByte)
        return Status::Errorf("{}: tokenizer.ggml.token_type[{}] is not a llama.cpp token type",
                              file.source(), id);
      type = *value;
    }
    // Every id keeps its spelling in the vocabulary (so ids leave no gaps); control and
    // user-defined tokens are also added tokens, matched in the text before BPE runs.
    vocab[token] = id;
    if (type == kControl || type == kUserDefined)
      added.push_back({{"id", id},
                       {"content", token},
                       {"single_word", false},
                       {"lstrip", false},
                       {"rstrip", false},
                       {"normalized", false},
                       {"special", type == kControl}});
  }
  nlohmann::json merge_list = nlohmann::json::array();
  for (const auto& merge : merges->elements)
    merge_list.push_back(std::string(merge.string_value));

  nlohmann::json steps = nlohmann::json::array();
  for (const auto& regex : regexes.value())
    steps.push_back({{"type", "Split"},
                     {"pattern", {{"Regex", regex}}},
                     {"behavior", "Isolated"},
                     {"invert", false}});
  steps.push_back({{"type", "ByteLevel"},
                   {"add_prefix_space", false},
                   {"trim_offsets", true},
                   {"use_regex", false}});
  nlohmann::json root = {{"version", "1.0"},
                         {"added_tokens", added},
                         {"normalizer", nullptr},
                         {"pre_tokenizer", {{"type", "Sequence"}, {"pretokenizers", steps}}},
                         {"post_processor", nullptr},
                         {"decoder",
                          {{"type", "ByteLevel"},
                           {"add_prefix_space", true},
                           {"trim_offsets", true},
                           {"use_regex", true}}},
                         {"model",
                          {{"type", "BPE"},
                           {"dropout", nullptr},
                           {"unk_token", nullptr},
                           {"continuing_subword_prefix", nullptr},
                           {"end_of_word_suffix", nullptr},
                           {"fuse_unk", false},
                           {"byte_fallback", false},
                           {"vocab", std::move(vocab)},
                           {"merges", std::move(merge_list)}}}};
  // Token strings come from the file and need not be valid UTF-8; the dump replaces bad bytes
  // rather than throwing (such a token then cannot match, as in llama.cpp).
  return root.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

Result<TokenizerConfig> GgufTokenizerConfig(const GgufFile& file) {
  TokenizerConfig config;
  config.source = file.source();
  SY_ASSIGN_OR_RETURN(const GgufValue* tokens,
                      RequireArray(file, "tokenizer.ggml.tokens", GgufValueType::kString));
  const size_t count = tokens->elements.size();
  SY_ASSIGN_OR_RETURN(auto bos, OptionalTokenId(file, "tokenizer.ggml.bos_token_id", count));
  SY_ASSIGN_OR_RETURN(auto eos, OptionalTokenId(file, "tokenizer.ggml.eos_token_id", count));
  SY_ASSIGN_OR_RETURN(auto padding,
                      OptionalTokenId(file, "tokenizer.ggml.padding_token_id", count));
  (void)padding;  // checked; nothing downstream pads
  if (bos) config.bos_token = std::string(tokens->elements[*bos].string_value);
  if (eos) config.eos_token = std::string(tokens->elements[*eos].string_value);
  SY_ASSIGN_OR_RETURN(config.add_bos_token,
                      OptionalBool(file, "tokenizer.ggml.add_bos_token", false));
  SY_ASSIGN_OR_RETURN(config.add_eos_token,
                      OptionalBool(file, "tokenizer.ggml.add_eos_token", false));
  if (file.Find("tokenizer.chat_template") != nullptr) {
    SY_ASSIGN_OR_RETURN(std::string_view chat, RequireString(file, "tokenizer.chat_template"));
    config.chat_template = std::string(chat);
  }
  // llama.cpp's converter (gguf-py) writes a checkpoint's named templates as
  // tokenizer.chat_template.NAME; "tool_use" is the one transformers renders requests with tools
  // by, as it is from tokenizer_config.json.
  if (file.Find("tokenizer.chat_template.tool_use") != nullptr) {
    SY_ASSIGN_OR_RETURN(std::string_view tool_use,
                        RequireString(file, "tokenizer.chat_template.tool_use"));
    config.tool_use_chat_template = std::string(tool_use);
  }
  return config;
}

}  // namespace sy
