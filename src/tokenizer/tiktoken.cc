#include "tokenizer/tiktoken.h"

#include <charconv>
#include <filesystem>
#include <map>

#include <openssl/evp.h>
#include <nlohmann/json.hpp>

#include "tokenizer/bpe.h"
#include "tokenizer/pre_tokenizer.h"

namespace sy {

namespace {

// What a tokenizer class's Python code fixes: its pattern, how many special ids follow the
// ranks, and the cuts its encode makes before tiktoken runs.
struct TiktokenClass {
  std::string_view module_class;  // auto_map's "module.Class"
  std::string_view pattern;
  size_t special_ids;
  size_t max_chunk, max_run;
};

const TiktokenClass kKnownClasses[] = {
    {kKimiTokenizerClass, kKimiK2Pattern, 256 + 2, 400000, 25000},
};

// Standard base64 (OpenSSL's decoder: the library does this better than code written here).
bool DecodeBase64(std::string_view text, std::string* out) {
  if (text.empty() || text.size() % 4 != 0) return false;
  out->resize(text.size() / 4 * 3);
  const int n = EVP_DecodeBlock(reinterpret_cast<unsigned char*>(out->data()),
                                reinterpret_cast<const unsigned char*>(text.data()),
                                static_cast<int>(text.size()));
  if (n < 0) return false;
  // EVP_DecodeBlock counts the padding as zero bytes.
  size_t padding = 0;
  if (text.back() == '=') ++padding;
  if (text.size() >= 2 && text[text.size() - 2] == '=') ++padding;
  out->resize(static_cast<size_t>(n) - padding);
  return true;
}

Result<const TiktokenClass*> ClassOf(const nlohmann::json& config, const std::string& source) {
  const std::string name = TokenizerClassName(config);
  for (const TiktokenClass& known : kKnownClasses)
    if (known.module_class == name) return &known;
  std::string names;
  for (const TiktokenClass& known : kKnownClasses)
    names += (names.empty() ? "" : ", ") + std::string(known.module_class);
  return Status::Errorf(
      "{}: tokenizer class \"{}\" is not supported for tiktoken.model (its pattern is in its "
      "Python code; known: {})",
      source, name.empty() ? "(none)" : name, names);
}

}  // namespace

std::string TokenizerClassName(const nlohmann::json& config) {
  std::string name;
  if (auto map = config.find("auto_map"); map != config.end() && map->is_object()) {
    if (auto tok = map->find("AutoTokenizer"); tok != map->end()) {
      if (tok->is_array() && !tok->empty() && (*tok)[0].is_string())
        name = (*tok)[0].get<std::string>();
      else if (tok->is_string())
        name = tok->get<std::string>();
    }
  }
  // A model's auto_map may point into another repository ("org/repo--module.Class").
  if (const size_t sep = name.find("--"); sep != std::string::npos) name = name.substr(sep + 2);
  if (name.empty()) {
    if (auto cls = config.find("tokenizer_class"); cls != config.end() && cls->is_string())
      name = cls->get<std::string>() == "TikTokenTokenizer" ? std::string(kKimiTokenizerClass)
                                                            : cls->get<std::string>();
  }
  return name;
}

bool HasTiktokenModel(const std::string& directory) {
  std::error_code error;
  return std::filesystem::is_regular_file(directory + "/tiktoken.model", error) &&
         !std::filesystem::exists(directory + "/tokenizer.json", error);
}

Result<std::vector<std::string>> ParseTiktokenRanks(std::string_view text,
                                                    const std::string& source) {
  std::vector<std::pair<std::string, int64_t>> entries;
  size_t line_number = 0;
  std::string bytes;
  for (size_t at = 0; at < text.size();) {
    size_t end = text.find('\n', at);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(at, end - at);
    at = end + 1;
    ++line_number;
    while (!line.empty() && (line.back() == '\r' || line.back() == ' ' || line.back() == '\t'))
      line.remove_suffix(1);
    if (line.empty()) continue;
    const size_t space = line.find_first_of(" \t");
    if (space == std::string_view::npos)
      return Status::Errorf("{}:{}: expected \"base64-token rank\"", source, line_number);
    const std::string_view token = line.substr(0, space);
    std::string_view rank_text = line.substr(space + 1);
    while (!rank_text.empty() && (rank_text.front() == ' ' || rank_text.front() == '\t'))
      rank_text.remove_prefix(1);
    int64_t rank = -1;
    const auto [ptr, ec] =
        std::from_chars(rank_text.data(), rank_text.data() + rank_text.size(), rank);
    if (ec != std::errc() || ptr != rank_text.data() + rank_text.size() || rank < 0)
      return Status::Errorf("{}:{}: rank \"{}\" is not a non-negative integer", source, line_number,
                            rank_text);
    if (!DecodeBase64(token, &bytes) || bytes.empty())
      return Status::Errorf("{}:{}: \"{}\" is not base64 of a token", source, line_number,
                            token.substr(0, 64));
    entries.emplace_back(bytes, rank);
  }
  if (entries.empty()) return Status::Errorf("{}: no tokens", source);
  // Special tokens take the ids after the last rank, so the ranks must be exactly 0..N-1.
  std::vector<std::string> by_rank(entries.size());
  for (auto& [token, rank] : entries) {
    if (rank >= static_cast<int64_t>(entries.size()))
      return Status::Errorf("{}: rank {} but only {} tokens (ranks must be 0..N-1)", source, rank,
                            entries.size());
    if (!by_rank[rank].empty()) return Status::Errorf("{}: rank {} is given twice", source, rank);
    by_rank[rank] = std::move(token);
  }
  return by_rank;
}

Result<Tokenizer> LoadTiktokenTokenizer(const std::string& directory) {
  const std::string model_path = directory + "/tiktoken.model";
  const std::string config_path = directory + "/tokenizer_config.json";
  SY_ASSIGN_OR_RETURN(std::string config_text, ReadTextFile(config_path));
  nlohmann::json config;
  try {
    config = nlohmann::json::parse(config_text);
  } catch (const nlohmann::json::exception& e) {
    return Status::Errorf("{}: not valid JSON: {}", config_path, e.what());
  }
  if (!config.is_object()) return Status::Errorf("{}: expected a JSON object", config_path);
  SY_ASSIGN_OR_RETURN(const TiktokenClass* cls, ClassOf(config, config_path));

  SY_ASSIGN_OR_RETURN(std::string model_text, ReadTextFile(model_path));
  SY_ASSIGN_OR_RETURN(std::vector<std::string> ranks, ParseTiktokenRanks(model_text, model_path));
  auto model = BpeModel::FromRanks(ranks);
  if (!model.ok()) return model.status().WithContext(model_path);
  auto pre = PreTokenizer::Tiktoken(std::string(cls->pattern), cls->max_chunk, cls->max_run);
  if (!pre.ok()) return pre.status().WithContext(model_path);

  // added_tokens_decoder: {"ID": {"content", "lstrip", "rstrip", "special", ...}}.
  std::map<int64_t, AddedToken> listed;
  if (auto decoder = config.find("added_tokens_decoder"); decoder != config.end()) {
    if (!decoder->is_object())
      return Status::Errorf("{}: \"added_tokens_decoder\" must be an object", config_path);
    for (const auto& [key, entry] : decoder->items()) {
      const std::string where = fmt::format("{}: added_tokens_decoder[\"{}\"]", config_path, key);
      int64_t id = -1;
      const auto [ptr, ec] = std::from_chars(key.data(), key.data() + key.size(), id);
      if (ec != std::errc() || ptr != key.data() + key.size() || id < 0)
        return Status::Errorf("{}: the key is not a token id", where);
      if (!entry.is_object() || !entry.contains("content") || !entry["content"].is_string() ||
          entry["content"].get<std::string>().empty())
        return Status::Errorf("{}: needs a non-empty string \"content\"", where);
      AddedToken token;
      token.id = static_cast<int32_t>(std::min<int64_t>(id, INT32_MAX));
      token.content = entry["content"].get<std::string>();
      token.special = entry.value("special", true);
      token.lstrip = entry.value("lstrip", false);
      token.rstrip = entry.value("rstrip", false);
      if (entry.value("single_word", false))
        return Status::Errorf("{} (\"{}\"): single_word tokens are not supported", where,
                              token.content);
      listed[id] = std::move(token);
    }
  }
  // The class's special ids come right after the ranks; those added_tokens_decoder does not
  // name are its reserved tokens.
  std::vector<AddedToken> added;
  const int64_t first_special = static_cast<int64_t>(ranks.size());
  for (int64_t id = first_special; id < first_special + static_cast<int64_t>(cls->special_ids);
       ++id) {
    auto it = listed.find(id);
    if (it != listed.end()) {
      added.push_back(std::move(it->second));
      listed.erase(it);
    } else {
      AddedToken reserved;
      reserved.id = static_cast<int32_t>(id);
      reserved.content = fmt::format("<|reserved_token_{}|>", id);
      reserved.special = true;
      added.push_back(std::move(reserved));
    }
  }
  for (auto& [id, token] : listed)
    added.push_back(std::move(token));
  return Tokenizer::FromParts(model_path, std::move(pre).value(), std::move(model).value(),
                              std::move(added));
}

}  // namespace sy
