#include "tokenizer/unicode.h"

namespace sy {

uint32_t NextCodePoint(std::string_view text, size_t* pos) {
  const auto* s = reinterpret_cast<const uint8_t*>(text.data()) + *pos;
  if (s[0] < 0x80) {
    *pos += 1;
    return s[0];
  }
  if (s[0] < 0xE0) {
    *pos += 2;
    return (uint32_t{s[0]} & 0x1F) << 6 | (s[1] & 0x3F);
  }
  if (s[0] < 0xF0) {
    *pos += 3;
    return (uint32_t{s[0]} & 0x0F) << 12 | (uint32_t{s[1]} & 0x3F) << 6 | (s[2] & 0x3F);
  }
  *pos += 4;
  return (uint32_t{s[0]} & 0x07) << 18 | (uint32_t{s[1]} & 0x3F) << 12 |
         (uint32_t{s[2]} & 0x3F) << 6 | (s[3] & 0x3F);
}

namespace {

// Length of the well-formed sequence starting at `s` (Unicode table 3-7), or 0 with
// `*maximal_subpart` set to how many bytes form the ill-formed sequence's maximal subpart.
size_t WellFormedLength(const uint8_t* s, size_t available, size_t* maximal_subpart) {
  const uint8_t b0 = s[0];
  if (b0 < 0x80) return 1;
  uint8_t lo = 0x80, hi = 0xBF;
  size_t need;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 3;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 4;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    *maximal_subpart = 1;
    return 0;
  }
  size_t i = 1;
  for (; i < need; ++i) {
    if (i >= available) break;
    const uint8_t b = s[i];
    const bool ok = i == 1 ? (b >= lo && b <= hi) : (b >= 0x80 && b <= 0xBF);
    if (!ok) break;
  }
  if (i == need) return need;
  *maximal_subpart = i;
  return 0;
}

}  // namespace

size_t FindInvalidUtf8(std::string_view bytes) {
  const auto* s = reinterpret_cast<const uint8_t*>(bytes.data());
  size_t pos = 0, subpart = 0;
  while (pos < bytes.size()) {
    if (s[pos] < 0x80) {
      ++pos;
      continue;
    }
    const size_t length = WellFormedLength(s + pos, bytes.size() - pos, &subpart);
    if (length == 0) return pos;
    pos += length;
  }
  return std::string_view::npos;
}

std::string Utf8Lossy(std::string_view bytes) {
  const auto* s = reinterpret_cast<const uint8_t*>(bytes.data());
  std::string out;
  out.reserve(bytes.size());
  size_t pos = 0, subpart = 0;
  while (pos < bytes.size()) {
    const size_t length = WellFormedLength(s + pos, bytes.size() - pos, &subpart);
    if (length > 0) {
      out.append(bytes.data() + pos, length);
      pos += length;
    } else {
      out += "\xEF\xBF\xBD";
      pos += subpart;
    }
  }
  return out;
}

size_t CompleteUtf8Prefix(std::string_view bytes) {
  // Look back at most three bytes for the start of a sequence that runs past the end.
  const auto* s = reinterpret_cast<const uint8_t*>(bytes.data());
  const size_t n = bytes.size();
  for (size_t back = 1; back <= 3 && back <= n; ++back) {
    const uint8_t b = s[n - back];
    if ((b & 0xC0) == 0x80) continue;  // continuation byte: keep looking for the lead
    size_t subpart = 0;
    const size_t length = WellFormedLength(s + n - back, back, &subpart);
    // Incomplete (not ill-formed) when every byte so far fits and more are still needed.
    if (length == 0 && subpart == back && b >= 0xC2 && b <= 0xF4) return n - back;
    return n;
  }
  return n;
}

bool IsUnicodeWhitespace(uint32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000;
}

const ByteLevelAlphabet& ByteLevelAlphabet::Get() {
  static const ByteLevelAlphabet alphabet;
  return alphabet;
}

ByteLevelAlphabet::ByteLevelAlphabet() {
  code_point_to_byte_.fill(-1);
  uint32_t next_extra = 256;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
    const uint32_t cp = printable ? static_cast<uint32_t>(b) : next_extra++;
    byte_to_code_point_[b] = cp;
    code_point_to_byte_[cp] = static_cast<int16_t>(b);
  }
}

std::string ByteLevelAlphabet::Encode(std::string_view bytes) const {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char b : bytes)
    AppendUtf8(byte_to_code_point_[b], &out);
  return out;
}

bool ByteLevelAlphabet::Decode(std::string_view token, std::string* bytes) const {
  std::string out;
  size_t pos = 0;
  while (pos < token.size()) {
    const int b = ByteOf(NextCodePoint(token, &pos));
    if (b < 0) return false;
    out.push_back(static_cast<char>(b));
  }
  *bytes = std::move(out);
  return true;
}

}  // namespace sy
