// Pre-tokenization as Hugging Face tokenizers does it: a sequence of steps, each splitting every
// current piece of the text further. Pieces are byte ranges of one working buffer.
//
// Supported steps: Split (regex or literal pattern, every delimiter behaviour, invert) and
// ByteLevel (its GPT-2 regex and prefix space). Regexes are Oniguruma syntax in tokenizer.json;
// they run on PCRE2 (JIT) after translating the escapes whose meaning differs (\s, \S, \w, \W).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "base/status.h"

namespace sy {

struct TextPiece {
  uint32_t begin = 0;
  uint32_t end = 0;
};

class CompiledRegex;

// How a Split step keeps the delimiters it finds (tokenizers' SplitDelimiterBehavior).
enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

class PreTokenizer {
 public:
  // Parses the "pre_tokenizer" object of tokenizer.json (null: the whole text is one piece).
  static Result<std::unique_ptr<PreTokenizer>> FromJson(const nlohmann::json& spec);
  // tiktoken's: the pieces are the matches of `pattern` (Rust regex syntax, whose \s is
  // Oniguruma's), and text no match covers is dropped, as tiktoken drops it. First, where
  // `max_chunk` is not 0, the text is cut into chunks of at most `max_chunk` code points, and
  // each chunk wherever a run of whitespace or of non-whitespace (Python's str.isspace) would
  // pass `max_run` code points: Kimi's tokenizer does both before tiktoken sees the text.
  static Result<std::unique_ptr<PreTokenizer>> Tiktoken(const std::string& pattern,
                                                        size_t max_chunk, size_t max_run);
  ~PreTokenizer();

  // Splits `*text` into pieces. A step that must add characters (ByteLevel's prefix space)
  // rewrites `*text`; pieces always index the final buffer.
  Status Split(std::string* text, std::vector<TextPiece>* pieces) const;

 private:
  struct Step {
    enum Kind { kSplit, kByteLevelPrefixSpace, kRunLimit } kind = kSplit;
    std::shared_ptr<CompiledRegex> regex;
    SplitBehavior behavior = SplitBehavior::kIsolated;
    bool invert = false;
    size_t max_chunk = 0, max_run = 0;  // kRunLimit
  };
  static Status AddSteps(const nlohmann::json& spec, const std::string& where,
                         std::vector<Step>* steps);
  std::vector<Step> steps_;
};

// Translates an Oniguruma pattern to PCRE2 syntax with the same meaning under Unicode rules.
// Exposed for tests.
Result<std::string> OnigurumaToPcre2(std::string_view pattern);

}  // namespace sy
