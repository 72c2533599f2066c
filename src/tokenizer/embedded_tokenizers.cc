#include "tokenizer/embedded_tokenizers.h"

#include <fstream>
#include <string_view>

namespace sy {
namespace embedded {
extern const std::string_view kDefaultTokenizerJson;
extern const std::string_view kDefaultTokenizerConfig;
extern const std::string_view kBenchTokenizerJson;
extern const std::string_view kBenchTokenizerConfig;
}  // namespace embedded

Status WriteEmbeddedTokenizer(const std::string& preset, const std::string& directory) {
  const bool bench = preset == "bench";
  if (!bench && preset != "default")
    return Status::Errorf("no embedded tokenizer for '{}'", preset);
  const std::pair<const char*, std::string_view> files[] = {
      {"tokenizer.json", bench ? embedded::kBenchTokenizerJson : embedded::kDefaultTokenizerJson},
      {"tokenizer_config.json",
       bench ? embedded::kBenchTokenizerConfig : embedded::kDefaultTokenizerConfig}};
  for (const auto& [name, content] : files) {
    const std::string path = directory + "/" + name;
    std::ofstream out(path, std::ios::binary);
    out.write(content.data(), static_cast<std::streamsize>(content.size()));
    if (!out) return Status::Errorf("{}: cannot write", path);
  }
  return Status::Ok();
}

}  // namespace sy
