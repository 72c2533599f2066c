#include "tokenizer/pre_tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <nlohmann/json.hpp>

#include "tokenizer/unicode.h"

namespace sy {

// Oniguruma's Unicode \s: TAB..CR, NEL and the Z categories (PCRE2's UCP \s omits NEL).
constexpr std::string_view kOnigSpaceItems = "\\t\\n\\x0B\\f\\r\\x{85}\\p{Z}";
// Oniguruma's Unicode \w: letters, marks, decimal digits, connector punctuation.
constexpr std::string_view kOnigWordItems = "\\p{L}\\p{M}\\p{Nd}\\p{Pc}";

Result<std::string> OnigurumaToPcre2(std::string_view pattern) {
  std::string out;
  out.reserve(pattern.size() + 32);
  bool in_class = false;
  size_t class_start = 0;
  for (size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      const char e = pattern[i + 1];
      ++i;
      if (e == 's' || e == 'w') {
        const std::string_view items = e == 's' ? kOnigSpaceItems : kOnigWordItems;
        if (in_class) {
          out += items;
        } else {
          out += '[';
          out += items;
          out += ']';
        }
      } else if (e == 'S' || e == 'W') {
        if (in_class)
          return Status::Errorf("\\{} inside a character class is not supported (at offset {})", e,
                                i - 1);
        out += "[^";
        out += e == 'S' ? kOnigSpaceItems : kOnigWordItems;
        out += ']';
      } else {
        out += '\\';
        out += e;
      }
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      class_start = out.size();
      out += c;
      // A ']' right after '[' or '[^' is a literal member, not the end of the class.
      if (i + 1 < pattern.size() && pattern[i + 1] == '^') out += pattern[++i];
      if (i + 1 < pattern.size() && pattern[i + 1] == ']') out += pattern[++i];
      continue;
    }
    if (in_class && c == '[') {
      return Status::Errorf("nested character classes are not supported (at offset {})", i);
    }
    if (in_class && c == ']') in_class = false;
    out += c;
  }
  (void)class_start;
  if (in_class) return Status::Error("unterminated character class");
  return out;
}

// A compiled PCRE2 pattern with JIT; match state is per thread.
class CompiledRegex {
 public:
  static Result<std::shared_ptr<CompiledRegex>> Compile(const std::string& pattern, bool literal) {
    int error = 0;
    PCRE2_SIZE offset = 0;
    uint32_t options = PCRE2_UTF | PCRE2_UCP | PCRE2_NO_UTF_CHECK;
    if (literal) options = PCRE2_UTF | PCRE2_LITERAL;
    pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                     options, &error, &offset, nullptr);
    if (code == nullptr) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(error, message, sizeof(message));
      return Status::Errorf("regex does not compile at offset {}: {}", offset,
                            reinterpret_cast<const char*>(message));
    }
    auto compiled = std::shared_ptr<CompiledRegex>(new CompiledRegex(code));
    compiled->jit_ = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
    return compiled;
  }
  ~CompiledRegex() { pcre2_code_free(code_); }

  // Appends the [begin, end) of every non-empty, non-overlapping match in text[begin, end).
  Status FindAll(std::string_view text, uint32_t begin, uint32_t end,
                 std::vector<TextPiece>* matches) const {
    MatchState& state = ThreadState();
    const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data() + begin);
    const size_t length = end - begin;
    size_t start = 0;
    while (start < length) {
      const int rc =
          jit_ ? pcre2_jit_match(code_, subject, length, start, 0, state.data, state.context)
               : pcre2_match(code_, subject, length, start, PCRE2_NO_UTF_CHECK, state.data,
                             state.context);
      if (rc == PCRE2_ERROR_NOMATCH) break;
      if (rc < 0) {
        PCRE2_UCHAR message[256];
        pcre2_get_error_message(rc, message, sizeof(message));
        return Status::Errorf("regex match failed: {}", reinterpret_cast<const char*>(message));
      }
      const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(state.data);
      const size_t match_begin = ovector[0], match_end = ovector[1];
      if (match_end > match_begin) {
        matches->push_back(
            {static_cast<uint32_t>(begin + match_begin), static_cast<uint32_t>(begin + match_end)});
        start = match_end;
      } else {
        // An empty match yields no piece; step over one character.
        size_t next = match_begin;
        NextCodePoint(std::string_view(text.data() + begin, length), &next);
        start = next;
      }
    }
    return Status::Ok();
  }

 private:
  explicit CompiledRegex(pcre2_code* code) : code_(code) {}

  struct MatchState {
    MatchState() {
      data = pcre2_match_data_create(16, nullptr);
      context = pcre2_match_context_create(nullptr);
      // Long runs (thousands of spaces or digits) need more than the default 32 KiB JIT stack.
      stack = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, nullptr);
      pcre2_jit_stack_assign(context, nullptr, stack);
    }
    ~MatchState() {
      pcre2_match_data_free(data);
      pcre2_match_context_free(context);
      pcre2_jit_stack_free(stack);
    }
    pcre2_match_data* data;
    pcre2_match_context* context;
    pcre2_jit_stack* stack;
  };
  static MatchState& ThreadState() {
    thread_local MatchState state;
    return state;
  }

  pcre2_code* code_;
  bool jit_ = false;
};

namespace {

// GPT-2's pre-tokenizer regex, used by ByteLevel with use_regex.
constexpr const char* kGpt2Pattern =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

Result<SplitBehavior> ParseBehavior(const nlohmann::json& value, const std::string& where) {
  if (!value.is_string()) return Status::Errorf("{}: \"behavior\" must be a string", where);
  const std::string name = value.get<std::string>();
  if (name == "Removed") return SplitBehavior::kRemoved;
  if (name == "Isolated") return SplitBehavior::kIsolated;
  if (name == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (name == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (name == "Contiguous") return SplitBehavior::kContiguous;
  return Status::Errorf("{}: unknown split behavior \"{}\"", where, name);
}

Result<std::shared_ptr<CompiledRegex>> CompileOnig(const std::string& pattern,
                                                   const std::string& where) {
  auto translated = OnigurumaToPcre2(pattern);
  if (!translated.ok()) return translated.status().WithContext(where);
  auto compiled = CompiledRegex::Compile(translated.value(), false);
  if (!compiled.ok()) return compiled.status().WithContext(where);
  return compiled;
}

bool GetBool(const nlohmann::json& object, const char* key, bool fallback) {
  auto it = object.find(key);
  return it != object.end() && it->is_boolean() ? it->get<bool>() : fallback;
}

// Cuts one piece by its matches according to the behaviour (tokenizers' NormalizedString::split).
void SplitPiece(TextPiece piece, const std::vector<TextPiece>& matches, SplitBehavior behavior,
                bool invert, std::vector<TextPiece>* out) {
  // The piece as alternating (range, is_match) runs covering it.
  struct Run {
    TextPiece range;
    bool is_match;
  };
  std::vector<Run> runs;
  uint32_t cursor = piece.begin;
  for (const TextPiece& m : matches) {
    if (m.begin > cursor) runs.push_back({{cursor, m.begin}, invert});
    runs.push_back({m, !invert});
    cursor = m.end;
  }
  if (cursor < piece.end) runs.push_back({{cursor, piece.end}, invert});

  auto emit = [&](TextPiece p) {
    if (p.end > p.begin) out->push_back(p);
  };
  switch (behavior) {
    case SplitBehavior::kRemoved:
      for (const Run& r : runs)
        if (!r.is_match) emit(r.range);
      break;
    case SplitBehavior::kIsolated:
      for (const Run& r : runs)
        emit(r.range);
      break;
    case SplitBehavior::kContiguous: {
      bool previous_match = false;
      TextPiece pending{0, 0};
      bool have_pending = false;
      for (const Run& r : runs) {
        if (r.is_match && previous_match && have_pending) {
          pending.end = r.range.end;
        } else {
          if (have_pending) emit(pending);
          pending = r.range;
          have_pending = true;
        }
        previous_match = r.is_match;
      }
      if (have_pending) emit(pending);
      break;
    }
    case SplitBehavior::kMergedWithPrevious: {
      TextPiece pending{0, 0};
      bool have_pending = false;
      for (const Run& r : runs) {
        if (r.is_match && have_pending) {
          pending.end = r.range.end;
          emit(pending);
          have_pending = false;
        } else if (r.is_match) {
          emit(r.range);
        } else {
          if (have_pending) emit(pending);
          pending = r.range;
          have_pending = true;
        }
      }
      if (have_pending) emit(pending);
      break;
    }
    case SplitBehavior::kMergedWithNext: {
      TextPiece pending{0, 0};
      bool have_pending = false;
      for (const Run& r : runs) {
        if (r.is_match) {
          if (have_pending) emit(pending);
          pending = r.range;
          have_pending = true;
        } else if (have_pending) {
          pending.end = r.range.end;
          emit(pending);
          have_pending = false;
        } else {
          emit(r.range);
        }
      }
      if (have_pending) emit(pending);
      break;
    }
  }
}

}  // namespace

PreTokenizer::~PreTokenizer() = default;

Status PreTokenizer::AddSteps(const nlohmann::json& spec, const std::string& where,
                              std::vector<Step>* steps) {
  if (!spec.is_object() || !spec.contains("type") || !spec["type"].is_string())
    return Status::Errorf("{}: expected an object with a \"type\"", where);
  const std::string type = spec["type"].get<std::string>();
  if (type == "Sequence") {
    if (!spec.contains("pretokenizers") || !spec["pretokenizers"].is_array())
      return Status::Errorf("{}: Sequence needs a \"pretokenizers\" list", where);
    const auto& list = spec["pretokenizers"];
    for (size_t i = 0; i < list.size(); ++i)
      SY_RETURN_IF_ERROR(AddSteps(list[i], fmt::format("{}.pretokenizers[{}]", where, i), steps));
    return Status::Ok();
  }
  if (type == "Split") {
    Step step;
    const auto pattern = spec.find("pattern");
    if (pattern == spec.end() || !pattern->is_object())
      return Status::Errorf("{} (Split): missing \"pattern\"", where);
    if (pattern->contains("Regex") && (*pattern)["Regex"].is_string()) {
      SY_ASSIGN_OR_RETURN(step.regex,
                          CompileOnig((*pattern)["Regex"].get<std::string>(), where + " (Split)"));
    } else if (pattern->contains("String") && (*pattern)["String"].is_string()) {
      auto compiled = CompiledRegex::Compile((*pattern)["String"].get<std::string>(), true);
      if (!compiled.ok()) return compiled.status().WithContext(where + " (Split)");
      step.regex = compiled.value();
    } else {
      return Status::Errorf("{} (Split): \"pattern\" must hold a \"Regex\" or \"String\"", where);
    }
    SY_ASSIGN_OR_RETURN(step.behavior,
                        ParseBehavior(spec.value("behavior", nlohmann::json()), where));
    step.invert = GetBool(spec, "invert", false);
    steps->push_back(std::move(step));
    return Status::Ok();
  }
  if (type == "ByteLevel") {
    // The byte-to-character mapping itself happens in the BPE model, which works on bytes.
    if (GetBool(spec, "add_prefix_space", true)) {
      Step prefix;
      prefix.kind = Step::kByteLevelPrefixSpace;
      steps->push_back(prefix);
    }
    if (GetBool(spec, "use_regex", true)) {
      Step step;
      SY_ASSIGN_OR_RETURN(step.regex, CompileOnig(kGpt2Pattern, where + " (ByteLevel)"));
      step.behavior = SplitBehavior::kIsolated;
      steps->push_back(std::move(step));
    }
    return Status::Ok();
  }
  return Status::Errorf("{}: pre-tokenizer type \"{}\" is not supported", where, type);
}

Result<std::unique_ptr<PreTokenizer>> PreTokenizer::Tiktoken(const std::string& pattern,
                                                             size_t max_chunk, size_t max_run) {
  auto pre = std::unique_ptr<PreTokenizer>(new PreTokenizer());
  if (max_chunk > 0) {
    Step limit;
    limit.kind = Step::kRunLimit;
    limit.max_chunk = max_chunk;
    limit.max_run = max_run;
    pre->steps_.push_back(limit);
  }
  Step split;
  SY_ASSIGN_OR_RETURN(split.regex, CompileOnig(pattern, "tiktoken pattern"));
  // Removed + invert: the matches are kept and the text between them goes.
  split.behavior = SplitBehavior::kRemoved;
  split.invert = true;
  pre->steps_.push_back(std::move(split));
  return pre;
}

namespace {

// Python's str.isspace: White_Space, and the information separators U+001C..U+001F.
bool IsPythonSpace(uint32_t c) {
  return IsUnicodeWhitespace(c) || (c >= 0x1C && c <= 0x1F);
}

// Kimi's tokenizer's cuts: chunks of `max_chunk` code points, each cut where a run of the same
// kind (space or not) would pass `max_run`.
void CutRuns(std::string_view text, TextPiece piece, size_t max_chunk, size_t max_run,
             std::vector<TextPiece>* out) {
  size_t pos = piece.begin, slice_start = piece.begin, in_chunk = 0, run = 0;
  bool run_is_space = false;
  while (pos < piece.end) {
    const size_t at = pos;
    const bool space = IsPythonSpace(NextCodePoint(text, &pos));
    if (in_chunk == max_chunk) {  // a new chunk starts its own first run
      if (at > slice_start) out->push_back({uint32_t(slice_start), uint32_t(at)});
      slice_start = at;
      in_chunk = 0;
    }
    if (in_chunk == 0 || space != run_is_space) {
      run = 1;
      run_is_space = space;
    } else if (++run > max_run) {
      out->push_back({uint32_t(slice_start), uint32_t(at)});
      slice_start = at;
      run = 1;
    }
    ++in_chunk;
  }
  if (piece.end > slice_start) out->push_back({uint32_t(slice_start), piece.end});
}

}  // namespace

Result<std::unique_ptr<PreTokenizer>> PreTokenizer::FromJson(const nlohmann::json& spec) {
  auto pre = std::unique_ptr<PreTokenizer>(new PreTokenizer());
  if (!spec.is_null()) SY_RETURN_IF_ERROR(AddSteps(spec, "pre_tokenizer", &pre->steps_));
  return pre;
}

Status PreTokenizer::Split(std::string* text, std::vector<TextPiece>* pieces) const {
  pieces->clear();
  if (text->empty()) return Status::Ok();
  pieces->push_back({0, static_cast<uint32_t>(text->size())});
  std::vector<TextPiece> next, matches;
  for (const Step& step : steps_) {
    next.clear();
    if (step.kind == Step::kByteLevelPrefixSpace) {
      // Every piece not starting with a space gets one; rebuild the buffer around them.
      std::string rebuilt;
      rebuilt.reserve(text->size() + pieces->size());
      for (const TextPiece& p : *pieces) {
        const uint32_t begin = static_cast<uint32_t>(rebuilt.size());
        if ((*text)[p.begin] != ' ') rebuilt += ' ';
        rebuilt.append(*text, p.begin, p.end - p.begin);
        next.push_back({begin, static_cast<uint32_t>(rebuilt.size())});
      }
      *text = std::move(rebuilt);
    } else if (step.kind == Step::kRunLimit) {
      for (const TextPiece& p : *pieces)
        CutRuns(*text, p, step.max_chunk, step.max_run, &next);
    } else {
      for (const TextPiece& p : *pieces) {
        matches.clear();
        SY_RETURN_IF_ERROR(step.regex->FindAll(*text, p.begin, p.end, &matches));
        SplitPiece(p, matches, step.behavior, step.invert, &next);
      }
    }
    pieces->swap(next);
  }
  return Status::Ok();
}

}  // namespace sy
