// Incremental detokenization for streaming: tokens arrive one at a time; text leaves only in
// whole UTF-8 characters, and text that may still turn into a stop string is held back until it
// cannot. A stop string found ends the request; it is not part of the output (unless asked).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace sy {

class IncrementalDetokenizer {
 public:
  IncrementalDetokenizer(const Tokenizer& tokenizer, std::vector<std::string> stop,
                         bool skip_special_tokens, bool include_stop);

  // Adds a token; returns the text now safe to emit. Sets *stopped when a stop string completed
  // (the returned text then ends before it, or after it with include_stop).
  std::string Add(int32_t token, bool* stopped);
  // The stop string that ended the text (the earliest in it), once Add has set *stopped.
  const std::string& matched_stop() const { return matched_stop_; }
  // The rest of the text when the request ends for another reason (length, EOS): held-back text
  // is released, an incomplete character becomes U+FFFD.
  std::string Flush();
  const std::string& text() const { return emitted_; }

 private:
  const Tokenizer& tokenizer_;
  std::vector<std::string> stop_;
  bool skip_special_;
  bool include_stop_;
  std::string pending_;  // bytes decoded but not yet emitted
  std::string emitted_;  // everything emitted so far
  std::string matched_stop_;
};

}  // namespace sy
