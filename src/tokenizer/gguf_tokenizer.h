// The tokenizer a GGUF file carries (tokenizer.ggml.*), as llama.cpp's converter writes it:
// `model` (gpt2: byte-level BPE), `tokens` (every id's vocabulary spelling), `token_type` (normal,
// control = special added token, user-defined = added token, unused = padding), `merges`, `pre`
// (the name of llama.cpp's pre-tokenizer regex list), the BOS/EOS ids and add_bos/add_eos flags,
// and tokenizer.chat_template.
//
// It becomes the equivalent Hugging Face tokenizer.json, which the Tokenizer loads like any other,
// so a GGUF model's ids are the same as its original tokenizer.json's (tests/gguf_tokenizer_test.cc
// checks the default model on the committed corpus). Each `pre` name maps to the regexes
// llama.cpp's llm_tokenizer_bpe splits with, in order, as Split steps that keep both matches and
// the text between them (tokenizers' "Isolated"), then ByteLevel without its own regex. A model,
// pre-tokenizer or field this code does not know is an error naming it.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "model/gguf.h"
#include "tokenizer/tokenizer.h"

namespace sy {

// The regexes of a llama.cpp pre-tokenizer name ("deepseek-v3", ...); an error names an unknown
// one.
Result<std::vector<std::string>> GgufPreTokenizerRegexes(std::string_view pre);

// tokenizer.json text equivalent to the GGUF's tokenizer.ggml.* metadata.
Result<std::string> GgufTokenizerJson(const GgufFile& file);

// The tokenizer_config.json fields: chat template, BOS/EOS token texts, add_bos/add_eos.
Result<TokenizerConfig> GgufTokenizerConfig(const GgufFile& file);

}  // namespace sy
