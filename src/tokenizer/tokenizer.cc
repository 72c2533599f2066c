#include "tokenizer/tokenizer.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "tokenizer/gguf_tokenizer.h"
#include "tokenizer/tiktoken.h"
#include "tokenizer/unicode.h"

namespace sy {
namespace {

Status CheckNormalizer(const nlohmann::json& spec, const std::string& where) {
  if (spec.is_null()) return Status::Ok();
  if (!spec.is_object() || !spec.contains("type") || !spec["type"].is_string())
    return Status::Errorf("{}: expected an object with a \"type\"", where);
  const std::string type = spec["type"].get<std::string>();
  if (type == "Sequence") {
    const auto it = spec.find("normalizers");
    if (it == spec.end() || !it->is_array())
      return Status::Errorf("{}: Sequence needs a \"normalizers\" list", where);
    for (size_t i = 0; i < it->size(); ++i)
      SY_RETURN_IF_ERROR(CheckNormalizer((*it)[i], fmt::format("{}.normalizers[{}]", where, i)));
    return Status::Ok();
  }
  return Status::Errorf("{}: normalizer \"{}\" is not supported", where, type);
}

Status CheckDecoder(const nlohmann::json& spec) {
  if (spec.is_null()) return Status::Error("decoder: missing (byte-level BPE needs ByteLevel)");
  const std::string type = spec.value("type", std::string());
  if (type == "ByteLevel") return Status::Ok();
  if (type == "Sequence" && spec.contains("decoders") && spec["decoders"].is_array() &&
      spec["decoders"].size() == 1 && spec["decoders"][0].value("type", "") == "ByteLevel")
    return Status::Ok();
  return Status::Errorf("decoder: \"{}\" is not supported (ByteLevel only)", type);
}

Status CheckPostProcessor(const nlohmann::json& spec) {
  // ByteLevel's post-processor only trims offsets; Encode adds no special tokens, so a template
  // that would add them does not apply either.
  if (spec.is_null()) return Status::Ok();
  const std::string type = spec.value("type", std::string());
  if (type == "ByteLevel" || type == "TemplateProcessing" || type == "Sequence")
    return Status::Ok();
  return Status::Errorf("post_processor: \"{}\" is not supported", type);
}

}  // namespace

Result<std::string> ReadTextFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::Errorf("{}: cannot open", path);
  std::ostringstream buffer;
  buffer << in.rdbuf();
  if (in.bad()) return Status::Errorf("{}: read failed", path);
  return buffer.str();
}

Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

Result<Tokenizer> Tokenizer::Load(const std::string& path) {
  std::string file = path;
  std::error_code error;
  if (std::filesystem::is_directory(path, error)) {
    // Kimi's checkpoints ship tiktoken.model instead (tokenizer/tiktoken.h).
    if (HasTiktokenModel(path)) return LoadTiktokenTokenizer(path);
    file = path + "/tokenizer.json";
  } else if (std::filesystem::path(path).filename() == "tiktoken.model") {
    const std::string directory = std::filesystem::path(path).parent_path().string();
    return LoadTiktokenTokenizer(directory.empty() ? "." : directory);
  }
  if (IsGgufFile(file)) {
    // A GGUF model carries its tokenizer: the equivalent tokenizer.json is made from it.
    SY_ASSIGN_OR_RETURN(GgufFile gguf, GgufFile::Open(file));
    SY_ASSIGN_OR_RETURN(std::string json, GgufTokenizerJson(gguf));
    return FromJson(json, file);
  }
  SY_ASSIGN_OR_RETURN(std::string text, ReadTextFile(file));
  return FromJson(text, file);
}

Result<Tokenizer> Tokenizer::FromJson(std::string_view json_text, const std::string& source) {
  // A field of the wrong type deep inside (a string where a flag belongs) throws from the JSON
  // library; it is one more malformed file, named like the others.
  try {
    return FromJsonChecked(json_text, source);
  } catch (const nlohmann::json::exception& e) {
    return Status::Errorf("{}: malformed: {}", source, e.what());
  }
}

Result<Tokenizer> Tokenizer::FromJsonChecked(std::string_view json_text,
                                             const std::string& source) {
  nlohmann::json root;
  try {
    root = nlohmann::json::parse(json_text);
  } catch (const nlohmann::json::exception& e) {
    return Status::Errorf("{}: not valid JSON: {}", source, e.what());
  }
  auto fail = [&](const Status& s) { return s.WithContext(source); };
  if (!root.is_object()) return Status::Errorf("{}: expected a JSON object", source);

  if (auto s = CheckNormalizer(root.value("normalizer", nlohmann::json()), "normalizer"); !s.ok())
    return fail(s);
  auto pre = PreTokenizer::FromJson(root.value("pre_tokenizer", nlohmann::json()));
  if (!pre.ok()) return fail(pre.status());
  if (!root.contains("model")) return Status::Errorf("{}: missing \"model\"", source);
  auto model = BpeModel::FromJson(root["model"]);
  if (!model.ok()) return fail(model.status());
  if (auto s = CheckDecoder(root.value("decoder", nlohmann::json())); !s.ok()) return fail(s);
  if (auto s = CheckPostProcessor(root.value("post_processor", nlohmann::json())); !s.ok())
    return fail(s);

  // Added tokens: content → id; they may reuse vocabulary ids or extend past them.
  const auto added = root.value("added_tokens", nlohmann::json::array());
  if (!added.is_array()) return Status::Errorf("{}: \"added_tokens\" must be a list", source);
  std::vector<AddedToken> added_tokens;
  for (size_t i = 0; i < added.size(); ++i) {
    const auto& a = added[i];
    const std::string where = fmt::format("{}: added_tokens[{}]", source, i);
    if (!a.is_object() || !a.contains("id") || !a["id"].is_number_integer() ||
        !a.contains("content") || !a["content"].is_string())
      return Status::Errorf("{}: needs an integer \"id\" and a string \"content\"", where);
    AddedToken token;
    const int64_t id = a["id"].get<int64_t>();
    const int64_t limit =
        static_cast<int64_t>(model->id_to_token().size() + added.size()) + kIdSlack;
    if (id < 0 || id >= limit)
      return Status::Errorf("{}: id {} outside [0, {}) (the vocabulary plus the added tokens)",
                            where, id, limit);
    token.id = static_cast<int32_t>(id);
    token.content = a["content"].get<std::string>();
    if (token.content.empty()) return Status::Errorf("{}: empty content", where);
    token.special = a.value("special", false);
    token.lstrip = a.value("lstrip", false);
    token.rstrip = a.value("rstrip", false);
    if (a.value("single_word", false))
      return Status::Errorf("{} (\"{}\"): single_word tokens are not supported", where,
                            token.content);
    added_tokens.push_back(std::move(token));
  }
  return FromParts(source, std::move(pre).value(), std::move(model).value(),
                   std::move(added_tokens));
}

Result<Tokenizer> Tokenizer::FromParts(const std::string& source,
                                       std::unique_ptr<PreTokenizer> pre_tokenizer, BpeModel model,
                                       std::vector<AddedToken> added_tokens) {
  Tokenizer tokenizer;
  tokenizer.source_ = source;
  tokenizer.pre_tokenizer_ = std::move(pre_tokenizer);
  tokenizer.model_ = std::make_unique<BpeModel>(std::move(model));
  tokenizer.added_tokens_ = std::move(added_tokens);
  // Tables are sized by the largest id: added tokens extend the vocabulary by their own number
  // of ids and at most kIdSlack unused ones, so a corrupt id cannot ask for gigabytes.
  const auto& vocab = tokenizer.model_->id_to_token();
  const int64_t limit =
      static_cast<int64_t>(vocab.size() + tokenizer.added_tokens_.size()) + kIdSlack;
  for (const AddedToken& t : tokenizer.added_tokens_) {
    if (t.id < 0 || t.id >= limit)
      return Status::Errorf("{}: added token \"{}\" has id {}, outside [0, {})", source, t.content,
                            t.id, limit);
    if (t.content.empty())
      return Status::Errorf("{}: an added token (id {}) is empty", source, t.id);
  }

  // Every id's decoded bytes (the ByteLevel decoder's rule: a token whose characters are all in
  // the byte alphabet stands for those bytes, any other token for its own UTF-8).
  size_t size = vocab.size();
  for (const AddedToken& t : tokenizer.added_tokens_)
    size = std::max(size, static_cast<size_t>(t.id) + 1);
  tokenizer.token_bytes_.assign(size, std::string());
  tokenizer.special_.assign(size, 0);
  const ByteLevelAlphabet& alphabet = ByteLevelAlphabet::Get();
  auto decoded = [&](const std::string& token) {
    std::string bytes;
    return alphabet.Decode(token, &bytes) ? bytes : token;
  };
  for (size_t id = 0; id < vocab.size(); ++id)
    if (!vocab[id].empty()) tokenizer.token_bytes_[id] = decoded(vocab[id]);
  for (const AddedToken& t : tokenizer.added_tokens_) {
    tokenizer.token_bytes_[t.id] = decoded(t.content);
    tokenizer.special_[t.id] = t.special ? 1 : 0;
  }

  tokenizer.added_by_first_byte_.assign(256, {});
  for (size_t i = 0; i < tokenizer.added_tokens_.size(); ++i) {
    const auto first = static_cast<uint8_t>(tokenizer.added_tokens_[i].content[0]);
    tokenizer.added_by_first_byte_[first].push_back(static_cast<int32_t>(i));
    tokenizer.any_added_first_byte_[first] = true;
  }
  for (auto& list : tokenizer.added_by_first_byte_)
    std::stable_sort(list.begin(), list.end(), [&](int32_t a, int32_t b) {
      return tokenizer.added_tokens_[a].content.size() > tokenizer.added_tokens_[b].content.size();
    });
  return tokenizer;
}

size_t Tokenizer::FindAddedToken(std::string_view text, size_t from, size_t* length,
                                 int32_t* index) const {
  for (size_t pos = from; pos < text.size(); ++pos) {
    const auto first = static_cast<uint8_t>(text[pos]);
    if (!any_added_first_byte_[first]) continue;
    for (int32_t i : added_by_first_byte_[first]) {
      const std::string& content = added_tokens_[i].content;
      if (text.compare(pos, content.size(), content) == 0) {
        *length = content.size();
        *index = i;
        return pos;
      }
    }
  }
  return std::string_view::npos;
}

Status Tokenizer::EncodeOrdinary(std::string_view text, std::vector<int32_t>* ids) const {
  if (text.empty()) return Status::Ok();
  std::string buffer(text);
  std::vector<TextPiece> pieces;
  SY_RETURN_IF_ERROR(pre_tokenizer_->Split(&buffer, &pieces));
  const std::string_view view(buffer);
  for (const TextPiece& p : pieces)
    model_->EncodePiece(view.substr(p.begin, p.end - p.begin), ids);
  return Status::Ok();
}

Result<std::vector<int32_t>> Tokenizer::Encode(std::string_view text) const {
  if (const size_t bad = FindInvalidUtf8(text); bad != std::string_view::npos)
    return Status::Errorf("text is not valid UTF-8 (byte offset {})", bad);
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  size_t cursor = 0;
  while (cursor <= text.size()) {
    size_t length = 0;
    int32_t index = -1;
    const size_t at = FindAddedToken(text, cursor, &length, &index);
    if (at == std::string_view::npos) {
      SY_RETURN_IF_ERROR(EncodeOrdinary(text.substr(cursor), &ids));
      break;
    }
    const AddedToken& token = added_tokens_[index];
    // lstrip/rstrip: the token takes the whitespace around it out of the neighbouring text.
    size_t segment_end = at;
    if (token.lstrip) {
      while (segment_end > cursor) {
        size_t start = segment_end - 1;
        while (start > cursor && (static_cast<uint8_t>(text[start]) & 0xC0) == 0x80)
          --start;
        size_t p = start;
        if (!IsUnicodeWhitespace(NextCodePoint(text, &p))) break;
        segment_end = start;
      }
    }
    SY_RETURN_IF_ERROR(EncodeOrdinary(text.substr(cursor, segment_end - cursor), &ids));
    ids.push_back(token.id);
    cursor = at + length;
    if (token.rstrip) {
      while (cursor < text.size()) {
        size_t p = cursor;
        if (!IsUnicodeWhitespace(NextCodePoint(text, &p))) break;
        cursor = p;
      }
    }
    if (cursor == text.size()) break;
  }
  return ids;
}

Result<std::string> Tokenizer::Decode(std::span<const int32_t> ids,
                                      bool skip_special_tokens) const {
  std::string bytes;
  for (size_t i = 0; i < ids.size(); ++i) {
    const int32_t id = ids[i];
    if (id < 0 || id >= vocab_size())
      return Status::Errorf("token id {} (position {}) is outside [0, {})", id, i, vocab_size());
    if (skip_special_tokens && special_[id]) continue;
    bytes += token_bytes_[id];
  }
  return Utf8Lossy(bytes);
}

std::string_view Tokenizer::TokenBytes(int32_t id) const {
  if (id < 0 || id >= vocab_size()) return {};
  return token_bytes_[id];
}

bool Tokenizer::IsSpecial(int32_t id) const {
  return id >= 0 && id < vocab_size() && special_[id] != 0;
}

std::optional<int32_t> Tokenizer::TokenToId(std::string_view token) const {
  for (const AddedToken& t : added_tokens_)
    if (t.content == token) return t.id;
  const auto& map = model_->token_to_id();
  auto it = map.find(std::string(token));
  if (it == map.end()) return std::nullopt;
  return it->second;
}

namespace {

// bos_token/eos_token: a string, an AddedToken object {"content": ...}, or null.
Result<std::string> TokenText(const nlohmann::json& config, const char* key,
                              const std::string& source) {
  auto it = config.find(key);
  if (it == config.end() || it->is_null()) return std::string();
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string())
    return (*it)["content"].get<std::string>();
  return Status::Errorf("{}: \"{}\" must be a string or an object with \"content\"", source, key);
}

}  // namespace

namespace {

Result<TokenizerConfig> LoadTokenizerConfigChecked(const std::string& directory);

}  // namespace

namespace {

// transformers' newer layout: chat_template.jinja holds the default template and
// additional_chat_templates/NAME.jinja the named ones; where any is there, they replace
// tokenizer_config.json's, as from_pretrained does.
Status ReadChatTemplateFiles(const std::string& directory, TokenizerConfig* config) {
  std::error_code error;
  const std::string file = directory + "/chat_template.jinja";
  const std::string named = directory + "/additional_chat_templates";
  const bool has_file = std::filesystem::is_regular_file(file, error);
  const bool has_named = std::filesystem::is_directory(named, error);
  if (!has_file && !has_named) return Status::Ok();
  config->chat_template.clear();
  config->tool_use_chat_template.clear();
  if (has_file) {
    SY_ASSIGN_OR_RETURN(config->chat_template, ReadTextFile(file));
    config->source = file;
  }
  if (has_named) {
    const std::string tool_use = named + "/tool_use.jinja";
    if (std::filesystem::is_regular_file(tool_use, error)) {
      SY_ASSIGN_OR_RETURN(config->tool_use_chat_template, ReadTextFile(tool_use));
    }
    const std::string default_file = named + "/default.jinja";
    if (!has_file && std::filesystem::is_regular_file(default_file, error)) {
      SY_ASSIGN_OR_RETURN(config->chat_template, ReadTextFile(default_file));
      config->source = default_file;
    }
  }
  return Status::Ok();
}

}  // namespace

Result<TokenizerConfig> LoadTokenizerConfig(const std::string& directory) {
  TokenizerConfig config;
  try {
    SY_ASSIGN_OR_RETURN(config, LoadTokenizerConfigChecked(directory));
  } catch (const nlohmann::json::exception& e) {
    return Status::Errorf("{}/tokenizer_config.json: malformed: {}", directory, e.what());
  }
  SY_RETURN_IF_ERROR(ReadChatTemplateFiles(directory, &config));
  return config;
}

namespace {

Result<TokenizerConfig> LoadTokenizerConfigChecked(const std::string& directory) {
  TokenizerConfig config;
  const std::string path = directory + "/tokenizer_config.json";
  config.source = path;
  std::error_code error;
  if (!std::filesystem::exists(path, error)) return config;
  SY_ASSIGN_OR_RETURN(std::string text, ReadTextFile(path));
  nlohmann::json root;
  try {
    root = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    return Status::Errorf("{}: not valid JSON: {}", path, e.what());
  }
  if (!root.is_object()) return Status::Errorf("{}: expected a JSON object", path);
  if (auto it = root.find("chat_template"); it != root.end() && !it->is_null()) {
    if (it->is_string()) {
      config.chat_template = it->get<std::string>();
    } else if (it->is_array()) {
      // Several named templates: "default" is the chat template, "tool_use" the one transformers
      // picks when a request gives tools.
      for (const auto& entry : *it) {
        if (!entry.is_object() || !entry.contains("template") || !entry["template"].is_string())
          continue;
        const std::string name = entry.value("name", "");
        if (name == "default") config.chat_template = entry["template"].get<std::string>();
        if (name == "tool_use")
          config.tool_use_chat_template = entry["template"].get<std::string>();
      }
    } else {
      return Status::Errorf("{}: \"chat_template\" must be a string or a list", path);
    }
  }
  // Kimi's tokenizer class (tokenizer/tiktoken.h) sorts the tools' keys before rendering.
  config.sort_tool_keys = TokenizerClassName(root) == kKimiTokenizerClass;
  SY_ASSIGN_OR_RETURN(config.bos_token, TokenText(root, "bos_token", path));
  SY_ASSIGN_OR_RETURN(config.eos_token, TokenText(root, "eos_token", path));
  for (auto [key, field] : {std::pair{"add_bos_token", &config.add_bos_token},
                            std::pair{"add_eos_token", &config.add_eos_token}}) {
    auto it = root.find(key);
    if (it == root.end() || it->is_null()) continue;
    if (!it->is_boolean()) return Status::Errorf("{}: \"{}\" must be true or false", path, key);
    *field = it->get<bool>();
  }
  return config;
}

}  // namespace

}  // namespace sy
