#include "jinja/lexer.h"

#include <fmt/format.h>

#include <cstring>

#include "base/utf8.h"
#include "jinja/syntax.h"

namespace sy::jinja {
namespace {

bool IsSpace(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}
bool IsNameStart(char c) {
  return std::isalpha(static_cast<unsigned char>(c)) || c == '_';
}
bool IsNameChar(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '_';
}
class Lexer {
 public:
  explicit Lexer(std::string_view source) {
    // Jinja turns every newline into "\n" and drops one trailing newline (keep_trailing_newline
    // is off in transformers' environment).
    for (size_t i = 0; i < source.size(); ++i) {
      if (source[i] == '\r') {
        if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
        src_ += '\n';
      } else {
        src_ += source[i];
      }
    }
    if (!src_.empty() && src_.back() == '\n') src_.pop_back();
  }

  std::vector<Token> Run() {
    bool strip_next = false;    // the previous tag ended with "-": drop leading whitespace
    bool trim_newline = false;  // trim_blocks: drop one newline after a block or comment tag
    while (pos_ < src_.size()) {
      size_t at = FindTagStart(pos_);
      std::string text = src_.substr(pos_, (at == std::string::npos ? src_.size() : at) - pos_);
      if (strip_next) {
        size_t k = 0;
        while (k < text.size() && IsSpace(text[k]))
          ++k;
        text.erase(0, k);
      } else if (trim_newline && !text.empty() && text[0] == '\n') {
        text.erase(0, 1);
      }
      strip_next = trim_newline = false;
      if (at == std::string::npos) {
        EmitText(text, src_.size());
        break;
      }
      const char opener = src_[at + 1];
      size_t after = at + 2;
      const char modifier = after < src_.size() ? src_[after] : '\0';
      if (modifier == '-') {
        while (!text.empty() && IsSpace(text.back()))
          text.pop_back();
      } else if (opener != '{' && modifier != '+') {
        LstripBlock(&text, at);
      }
      EmitText(text, at);
      if (modifier == '-' || modifier == '+') ++after;
      pos_ = after;
      if (opener == '#') {
        const size_t end = src_.find("#}", pos_);
        if (end == std::string::npos) Fail("missing end of comment tag");
        CountLines(pos_, end + 2);
        strip_next = end > pos_ && src_[end - 1] == '-';
        trim_newline = !strip_next;
        pos_ = end + 2;
        continue;
      }
      const bool block = opener == '%';
      const size_t first_token = tokens_.size();
      tokens_.push_back({block ? Token::Type::kBlockBegin : Token::Type::kVarBegin, "", line_, {}});
      const char close_modifier = LexTag(block);
      tokens_.push_back({block ? Token::Type::kBlockEnd : Token::Type::kVarEnd, "", line_, {}});
      strip_next = close_modifier == '-';
      trim_newline = block && close_modifier == '\0';
      if (block && tokens_.size() == first_token + 3 &&
          tokens_[first_token + 1].type == Token::Type::kName &&
          tokens_[first_token + 1].text == "raw") {
        tokens_.resize(first_token);
        LexRaw(strip_next, &strip_next, &trim_newline);
      }
    }
    tokens_.push_back({Token::Type::kEnd, "", line_, {}});
    return std::move(tokens_);
  }

 private:
  [[noreturn]] void Fail(const std::string& message) { throw TemplateError(line_, message); }

  size_t FindTagStart(size_t from) const {
    for (size_t i = src_.find('{', from); i != std::string::npos; i = src_.find('{', i + 1))
      if (i + 1 < src_.size() && (src_[i + 1] == '{' || src_[i + 1] == '%' || src_[i + 1] == '#'))
        return i;
    return std::string::npos;
  }

  // lstrip_blocks: spaces and tabs between a line's start and a block or comment tag go. The
  // line start is the source's (a newline trim_blocks removed still starts the line).
  void LstripBlock(std::string* text, size_t tag_at) const {
    size_t k = tag_at;
    while (k > 0 && (src_[k - 1] == ' ' || src_[k - 1] == '\t'))
      --k;
    if (k > 0 && src_[k - 1] != '\n') return;
    size_t strip = tag_at - k;
    while (strip > 0 && !text->empty() && (text->back() == ' ' || text->back() == '\t')) {
      text->pop_back();
      --strip;
    }
  }

  void CountLines(size_t from, size_t to) {
    for (size_t i = from; i < to; ++i)
      if (src_[i] == '\n') ++line_;
  }

  void EmitText(const std::string& text, size_t end) {
    const int line = line_;
    CountLines(pos_, end);
    if (!text.empty()) tokens_.push_back({Token::Type::kText, text, line, {}});
  }

  // The tokens of one {{ … }} or {% … %}; returns the closing modifier ('-', '+' or none).
  char LexTag(bool block) {
    const char closer = block ? '%' : '}';
    int depth = 0;  // brackets open: "}}" inside {{ {'a': {'b': 1}} }} does not close the tag
    while (true) {
      while (pos_ < src_.size() && IsSpace(src_[pos_])) {
        if (src_[pos_] == '\n') ++line_;
        ++pos_;
      }
      if (pos_ >= src_.size())
        Fail(block ? "unexpected end of template, expected '%}'"
                   : "unexpected end of template, expected '}}'");
      if (depth == 0) {
        for (char modifier : {'-', '+', '\0'}) {
          size_t p = pos_ + (modifier ? 1 : 0);
          if (modifier && (pos_ >= src_.size() || src_[pos_] != modifier)) continue;
          if (p + 1 < src_.size() && src_[p] == closer && src_[p + 1] == '}') {
            if (modifier == '+' && !block) continue;
            pos_ = p + 2;
            return modifier;
          }
        }
      }
      const char c = src_[pos_];
      if (IsNameStart(c)) {
        size_t end = pos_;
        while (end < src_.size() && IsNameChar(src_[end]))
          ++end;
        tokens_.push_back({Token::Type::kName, src_.substr(pos_, end - pos_), line_, {}});
        pos_ = end;
      } else if (std::isdigit(static_cast<unsigned char>(c))) {
        LexNumber();
      } else if (c == '\'' || c == '"') {
        LexString(c);
      } else {
        static constexpr const char* kOps[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "*",
                                               "/",  "%",  "~",  "(",  ")",  "[",  "]", "{", "}",
                                               ",",  ".",  ":",  "|",  "=",  "<",  ">"};
        const char* op = nullptr;
        for (const char* candidate : kOps)
          if (src_.compare(pos_, std::strlen(candidate), candidate) == 0) {
            op = candidate;
            break;
          }
        if (!op) Fail(fmt::format("unexpected char '{}'", c));
        if (*op == '(' || *op == '[' || *op == '{') ++depth;
        if (*op == ')' || *op == ']' || *op == '}') {
          if (depth == 0) Fail(fmt::format("unexpected '{}'", op));
          --depth;
        }
        tokens_.push_back({Token::Type::kOp, op, line_, {}});
        pos_ += std::strlen(op);
      }
    }
  }

  void LexNumber() {
    size_t end = pos_;
    auto digits = [&] {
      while (end < src_.size() && (std::isdigit(static_cast<unsigned char>(src_[end])) ||
                                   (src_[end] == '_' && end + 1 < src_.size() &&
                                    std::isdigit(static_cast<unsigned char>(src_[end + 1])))))
        ++end;
    };
    digits();
    bool is_float = false;
    if (end + 1 < src_.size() && src_[end] == '.' &&
        std::isdigit(static_cast<unsigned char>(src_[end + 1]))) {
      is_float = true;
      ++end;
      digits();
    }
    if (end < src_.size() && (src_[end] == 'e' || src_[end] == 'E')) {
      size_t e = end + 1;
      if (e < src_.size() && (src_[e] == '+' || src_[e] == '-')) ++e;
      if (e < src_.size() && std::isdigit(static_cast<unsigned char>(src_[e]))) {
        is_float = true;
        end = e;
        digits();
      }
    }
    std::string text;
    for (size_t i = pos_; i < end; ++i)
      if (src_[i] != '_') text += src_[i];
    Token token{is_float ? Token::Type::kFloat : Token::Type::kInt, text, line_, {}};
    if (is_float) {
      token.literal = Value::Float(std::strtod(text.c_str(), nullptr));
    } else {
      errno = 0;
      const long long v = std::strtoll(text.c_str(), nullptr, 10);
      if (errno == ERANGE) Fail(fmt::format("integer {} is too large", text));
      token.literal = Value::Int(v);
    }
    tokens_.push_back(std::move(token));
    pos_ = end;
  }

  // A string literal, its escapes decoded as Python's unicode-escape codec does (Jinja's way).
  void LexString(char quote) {
    const int line = line_;
    std::string out;
    size_t i = pos_ + 1;
    while (true) {
      if (i >= src_.size()) Fail("unexpected end of string");
      const char c = src_[i];
      if (c == quote) break;
      if (c == '\n') ++line_;
      if (c != '\\') {
        out += c;
        ++i;
        continue;
      }
      if (i + 1 >= src_.size()) Fail("unexpected end of string");
      const char e = src_[i + 1];
      i += 2;
      auto hex = [&](int count) {
        uint32_t v = 0;
        for (int k = 0; k < count; ++k, ++i) {
          if (i >= src_.size() || !std::isxdigit(static_cast<unsigned char>(src_[i])))
            Fail(fmt::format("truncated \\{} escape in a string", e));
          v = v * 16 + static_cast<uint32_t>(std::stoi(std::string(1, src_[i]), nullptr, 16));
        }
        if (v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF))
          Fail(fmt::format("\\{} escape {:x} is not a character", e, v));
        AppendUtf8(v, &out);
      };
      switch (e) {
        case '\n':
          ++line_;
          break;  // a backslash-newline joins lines
        case '\\':
          out += '\\';
          break;
        case '\'':
          out += '\'';
          break;
        case '"':
          out += '"';
          break;
        case 'a':
          out += '\a';
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'n':
          out += '\n';
          break;
        case 'r':
          out += '\r';
          break;
        case 't':
          out += '\t';
          break;
        case 'v':
          out += '\v';
          break;
        case 'x':
          hex(2);
          break;
        case 'u':
          hex(4);
          break;
        case 'U':
          hex(8);
          break;
        default:
          if (e >= '0' && e <= '7') {
            uint32_t v = e - '0';
            for (int k = 0; k < 2 && i < src_.size() && src_[i] >= '0' && src_[i] <= '7'; ++k, ++i)
              v = v * 8 + (src_[i] - '0');
            AppendUtf8(v, &out);
          } else {
            out += '\\';  // Python keeps an unknown escape as written
            out += e;
          }
      }
    }
    tokens_.push_back({Token::Type::kString, "", line, Value::String(std::move(out))});
    pos_ = i + 1;
  }

  // {% raw %} … {% endraw %}: the text between, verbatim.
  void LexRaw(bool strip_start, bool* strip_next, bool* trim_newline) {
    size_t search = pos_;
    while (true) {
      const size_t at = src_.find("{%", search);
      if (at == std::string::npos) Fail("missing end of raw directive");
      size_t p = at + 2;
      const char modifier = p < src_.size() ? src_[p] : '\0';
      if (modifier == '-' || modifier == '+') ++p;
      while (p < src_.size() && IsSpace(src_[p]))
        ++p;
      if (src_.compare(p, 6, "endraw") != 0) {
        search = at + 2;
        continue;
      }
      p += 6;
      while (p < src_.size() && IsSpace(src_[p]))
        ++p;
      char close = '\0';
      if (p < src_.size() && (src_[p] == '-' || src_[p] == '+')) close = src_[p++];
      if (src_.compare(p, 2, "%}") != 0) Fail("missing end of raw directive");
      std::string text = src_.substr(pos_, at - pos_);
      if (strip_start) {
        size_t k = 0;
        while (k < text.size() && IsSpace(text[k]))
          ++k;
        text.erase(0, k);
      }
      if (modifier == '-') {
        while (!text.empty() && IsSpace(text.back()))
          text.pop_back();
      } else if (modifier != '+') {
        LstripBlock(&text, at);
      }
      EmitText(text, at);
      CountLines(at, p + 2);
      pos_ = p + 2;
      *strip_next = close == '-';
      *trim_newline = close == '\0';
      return;
    }
  }

  std::string src_;
  size_t pos_ = 0;
  int line_ = 1;
  std::vector<Token> tokens_;
};

}  // namespace

std::vector<Token> Lex(std::string_view source) {
  return Lexer(source).Run();
}

}  // namespace sy::jinja
