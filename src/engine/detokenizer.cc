#include "engine/detokenizer.h"

#include <algorithm>

#include "tokenizer/unicode.h"

namespace sy {

IncrementalDetokenizer::IncrementalDetokenizer(const Tokenizer& tokenizer,
                                               std::vector<std::string> stop,
                                               bool skip_special_tokens, bool include_stop)
    : tokenizer_(tokenizer),
      stop_(std::move(stop)),
      skip_special_(skip_special_tokens),
      include_stop_(include_stop) {}

std::string IncrementalDetokenizer::Add(int32_t token, bool* stopped) {
  *stopped = false;
  if (!(skip_special_ && tokenizer_.IsSpecial(token))) pending_ += tokenizer_.TokenBytes(token);
  // Text is searched for stop strings across token boundaries: pending_ holds everything not
  // yet emitted, which always includes any partial stop string.
  size_t stop_at = std::string::npos, stop_length = 0;
  const std::string* matched = nullptr;
  for (const std::string& s : stop_) {
    const size_t at = pending_.find(s);
    if (at != std::string::npos && at < stop_at) {
      stop_at = at;
      stop_length = s.size();
      matched = &s;
    }
  }
  if (stop_at != std::string::npos) {
    *stopped = true;
    matched_stop_ = *matched;
    std::string out =
        Utf8Lossy(pending_.substr(0, include_stop_ ? stop_at + stop_length : stop_at));
    pending_.clear();
    emitted_ += out;
    return out;
  }
  // Hold back the longest tail that is a proper prefix of some stop string, and any incomplete
  // UTF-8 character at the end.
  size_t hold = 0;
  for (const std::string& s : stop_)
    for (size_t n = std::min(s.size() - 1, pending_.size()); n > hold; --n)
      if (pending_.compare(pending_.size() - n, n, s, 0, n) == 0) {
        hold = n;
        break;
      }
  size_t ready = pending_.size() - hold;
  ready = CompleteUtf8Prefix(std::string_view(pending_).substr(0, ready));
  std::string out = Utf8Lossy(std::string_view(pending_).substr(0, ready));
  pending_.erase(0, ready);
  emitted_ += out;
  return out;
}

std::string IncrementalDetokenizer::Flush() {
  std::string out = Utf8Lossy(pending_);
  pending_.clear();
  emitted_ += out;
  return out;
}

}  // namespace sy
