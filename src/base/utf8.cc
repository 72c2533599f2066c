#include "base/utf8.h"

namespace sy {

void AppendUtf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

bool DecodeUtf8(std::string_view text, size_t* pos, uint32_t* code_point) {
  size_t i = *pos;
  if (i >= text.size()) return false;
  const auto b0 = static_cast<unsigned char>(text[i]);
  int len;
  uint32_t value;
  if (b0 < 0x80) {
    len = 1, value = b0;
  } else if ((b0 & 0xE0) == 0xC0) {
    len = 2, value = b0 & 0x1F;
  } else if ((b0 & 0xF0) == 0xE0) {
    len = 3, value = b0 & 0x0F;
  } else if ((b0 & 0xF8) == 0xF0) {
    len = 4, value = b0 & 0x07;
  } else {
    return false;
  }
  if (i + len > text.size()) return false;
  for (int k = 1; k < len; ++k) {
    const auto b = static_cast<unsigned char>(text[i + k]);
    if ((b & 0xC0) != 0x80) return false;
    value = (value << 6) | (b & 0x3F);
  }
  static constexpr uint32_t kMinForLength[5] = {0, 0, 0x80, 0x800, 0x10000};
  if (value < kMinForLength[len] || value > 0x10FFFF || (value >= 0xD800 && value <= 0xDFFF)) {
    return false;
  }
  *code_point = value;
  *pos = i + len;
  return true;
}

}  // namespace sy
