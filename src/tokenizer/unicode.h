// UTF-8 and the GPT-2 byte-level alphabet: the small pieces of Unicode handling the tokenizer
// needs, written here because each must match Hugging Face tokenizers (Rust) byte for byte.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

#include "base/utf8.h"  // AppendUtf8

namespace sy {

// Decodes the code point at `text[*pos]` and advances `*pos`; the text must be valid UTF-8.
uint32_t NextCodePoint(std::string_view text, size_t* pos);

// Offset of the first byte that does not begin a well-formed UTF-8 sequence, or npos.
size_t FindInvalidUtf8(std::string_view bytes);

// Rust's String::from_utf8_lossy: each maximal ill-formed subpart becomes U+FFFD.
std::string Utf8Lossy(std::string_view bytes);

// Length of the longest prefix of `bytes` that ends on a character boundary, treating an
// incomplete sequence at the very end as "not yet complete" (streaming detokenization).
size_t CompleteUtf8Prefix(std::string_view bytes);

// Rust's char::is_whitespace (the Unicode White_Space property).
bool IsUnicodeWhitespace(uint32_t code_point);

// GPT-2's reversible map between bytes and printable code points: printable Latin-1 bytes map
// to themselves, the other 68 to U+0100 upwards, in byte order.
class ByteLevelAlphabet {
 public:
  static const ByteLevelAlphabet& Get();
  uint32_t CodePointOf(uint8_t byte) const { return byte_to_code_point_[byte]; }
  // The byte a code point stands for, or -1 when it is not in the alphabet.
  int ByteOf(uint32_t code_point) const {
    return code_point < 512 ? code_point_to_byte_[code_point] : -1;
  }
  // The alphabet's spelling of raw bytes (how BPE vocabularies store tokens).
  std::string Encode(std::string_view bytes) const;
  // Raw bytes of a vocabulary string when every character is in the alphabet; otherwise false
  // (Hugging Face's ByteLevel decoder then keeps the string's own bytes).
  bool Decode(std::string_view token, std::string* bytes) const;

 private:
  ByteLevelAlphabet();
  std::array<uint32_t, 256> byte_to_code_point_{};
  std::array<int16_t, 512> code_point_to_byte_{};
};

}  // namespace sy
