// UTF-8 encoding and strict decoding of one scalar value: shared by the tokenizer
// (tokenizer/unicode.h) and the grammar engine (structured/), which do not depend on each other.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace sy {

// Appends the UTF-8 encoding of a code point (assumed a valid scalar value).
void AppendUtf8(uint32_t code_point, std::string* out);

// Decodes one UTF-8 scalar value at text[*pos] and advances *pos; false (nothing advanced) on
// ill-formed UTF-8: a bad lead or continuation byte, a truncated or overlong sequence, a
// surrogate, or a value past U+10FFFF.
bool DecodeUtf8(std::string_view text, size_t* pos, uint32_t* code_point);

}  // namespace sy
