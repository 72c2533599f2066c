// tiktoken vocabularies, as Moonshot's Kimi K2 (a DeepSeek-V3 architecture) ships its tokenizer:
// no tokenizer.json, but tiktoken.model (one "base64-of-the-token-bytes rank" line per token,
// ranks 0..N-1) and, in tokenizer_config.json, the tokenizer class whose Python code holds the
// pre-tokenizer pattern and places the special tokens. Classes known here:
//
//   tokenization_kimi.TikTokenTokenizer (Kimi K2, K2-Instruct, K2-Thinking): Kimi's pattern; 258
//     special ids after the N ranks, named by added_tokens_decoder, the others
//     "<|reserved_token_ID|>"; text cut into chunks of 400,000 characters and runs of at most
//     25,000 (white)space or non-space characters before tiktoken sees it.
//
// The result is a Tokenizer like any other; its ids equal tiktoken's for the same file and
// pattern (tests/tiktoken_test.cc checks them on the committed corpus). A class not known here is
// an error naming it: its pattern lives in code this cannot read.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "base/status.h"
#include "tokenizer/tokenizer.h"

namespace sy {

// Kimi K2's pre-tokenizer pattern (tokenization_kimi.py's pat_str), in the syntax the
// pre-tokenizer compiles: its class intersections "[X&&[^\p{Han}]]" written as a look-ahead,
// "(?!\p{sc:Han})[X]", and \p{Han} as the Han script (Rust's meaning; PCRE2's bare \p{Han} would
// take script extensions, such as the ideographic comma).
inline constexpr std::string_view kKimiK2Pattern =
    "[\\p{sc:Han}]+"
    "|[^\\r\\n\\p{L}\\p{N}]?(?:(?!\\p{sc:Han})[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}])*"
    "(?:(?!\\p{sc:Han})[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}])+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    "|[^\\r\\n\\p{L}\\p{N}]?(?:(?!\\p{sc:Han})[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}])+"
    "(?:(?!\\p{sc:Han})[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}])*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    "|\\p{N}{1,3}"
    "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"
    "|\\s*[\\r\\n]+"
    "|\\s+(?!\\S)"
    "|\\s+";

// tokenizer_config.json's tokenizer class as "module.Class": auto_map.AutoTokenizer[0] (without
// a repository prefix "org/repo--"), or tokenizer_class alone ("TikTokenTokenizer" is Kimi's);
// empty when it names none.
std::string TokenizerClassName(const nlohmann::json& config);
inline constexpr std::string_view kKimiTokenizerClass = "tokenization_kimi.TikTokenTokenizer";

// Whether `directory` holds tiktoken.model (and no tokenizer.json, which would come first).
bool HasTiktokenModel(const std::string& directory);

// Parses tiktoken.model text: raw token bytes indexed by rank. Each line is checked: base64,
// a rank, every rank 0..N-1 once, no token twice; an error names the line.
Result<std::vector<std::string>> ParseTiktokenRanks(std::string_view text,
                                                    const std::string& source);

// Loads `directory`/tiktoken.model with the class tokenizer_config.json names.
Result<Tokenizer> LoadTiktokenTokenizer(const std::string& directory);

}  // namespace sy
