#include "cli/token_lists.h"

#include <charconv>

namespace sy {

Result<std::vector<std::vector<int32_t>>> ParseTokenLists(const std::string& text,
                                                          const std::string& flag) {
  std::vector<std::vector<int32_t>> sequences(1);
  auto trim = [](std::string_view s) {
    while (!s.empty() && (s.front() == ' ' || s.front() == '\t'))
      s.remove_prefix(1);
    while (!s.empty() && (s.back() == ' ' || s.back() == '\t'))
      s.remove_suffix(1);
    return s;
  };
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find_first_of(",;", start);
    if (end == std::string::npos) end = text.size();
    std::string_view item = trim(std::string_view(text).substr(start, end - start));
    const size_t sequence = sequences.size() - 1;
    if (!item.empty()) {
      int64_t value = 0;
      auto [pointer, error] = std::from_chars(item.data(), item.data() + item.size(), value);
      if (error != std::errc() || pointer != item.data() + item.size() || value < 0 ||
          value > INT32_MAX) {
        return Status::Errorf("{}: '{}' in sequence {} is not a token id", flag, item, sequence);
      }
      sequences.back().push_back(static_cast<int32_t>(value));
    } else if (end < text.size() && text[end] == ',') {
      return Status::Errorf("{}: empty entry in sequence {}", flag, sequence);
    }
    if (end < text.size() && text[end] == ';') {
      if (sequences.back().empty())
        return Status::Errorf("{}: sequence {} is empty", flag, sequence);
      sequences.emplace_back();
    }
    start = end + 1;
  }
  if (sequences.back().empty())
    return Status::Errorf("{}: sequence {} is empty", flag, sequences.size() - 1);
  return sequences;
}

}  // namespace sy
