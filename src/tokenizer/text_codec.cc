#include "tokenizer/text_codec.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "tokenizer/gguf_tokenizer.h"

namespace sy {
namespace {

// Whether `directory`/config.json names model_type deepseek_v32 (read for that field only: the
// model's loader checks the rest).
bool IsDeepSeekV32Checkpoint(const std::string& directory) {
  std::ifstream in(directory + "/config.json", std::ios::binary);
  if (!in) return false;
  std::stringstream text;
  text << in.rdbuf();
  const nlohmann::json config = nlohmann::json::parse(text.str(), nullptr, false);
  return config.is_object() && config.contains("model_type") &&
         config["model_type"] == "deepseek_v32";
}

}  // namespace

Result<TextCodec> TextCodec::Load(const std::string& directory, const std::string& tokenizer_path) {
  TextCodec codec;
  const std::string source = tokenizer_path.empty() ? directory : tokenizer_path;
  SY_ASSIGN_OR_RETURN(Tokenizer tokenizer, Tokenizer::Load(source));
  codec.tokenizer = std::make_unique<Tokenizer>(std::move(tokenizer));
  if (IsGgufFile(source)) {
    SY_ASSIGN_OR_RETURN(GgufFile gguf, GgufFile::Open(source));
    SY_ASSIGN_OR_RETURN(codec.config, GgufTokenizerConfig(gguf));
  } else {
    std::string config_directory = source;
    std::error_code error;
    if (!std::filesystem::is_directory(config_directory, error))
      config_directory = std::filesystem::path(config_directory).parent_path().string();
    SY_ASSIGN_OR_RETURN(codec.config,
                        LoadTokenizerConfig(config_directory.empty() ? "." : config_directory));
  }
  if (!codec.config.bos_token.empty())
    codec.bos_id = codec.tokenizer->TokenToId(codec.config.bos_token);
  if (codec.config.chat_template.empty() && IsDeepSeekV32Checkpoint(directory)) {
    codec.UseDeepSeekV32Encoding();
    return codec;
  }
  auto chat = ChatTemplate::Load(codec.config.chat_template, codec.special_tokens());
  if (chat.ok()) {
    codec.chat = chat.value();
  } else {
    codec.chat_status = chat.status().WithContext(codec.config.source);
  }
  if (!codec.config.tool_use_chat_template.empty()) {
    auto tool_use = ChatTemplate::Load(codec.config.tool_use_chat_template, codec.special_tokens());
    if (!tool_use.ok())
      return tool_use.status().WithContext(codec.config.source + " (the tool_use template)");
    codec.tool_use_chat = std::move(tool_use).value();
  }
  return codec;
}

void TextCodec::UseDeepSeekV32Encoding() {
  chat = ChatTemplate::DeepSeekV32(special_tokens());
  chat_status = Status::Ok();
  tool_use_chat.reset();
}

SpecialTokens TextCodec::special_tokens() const {
  return SpecialTokens{config.bos_token, config.eos_token};
}

Status TextCodec::UseChatTemplate(std::string_view template_text, const std::string& source) {
  auto chat = ChatTemplate::Load(template_text, special_tokens());
  if (!chat.ok()) return chat.status().WithContext(source);
  this->chat = std::move(chat).value();
  chat_status = Status::Ok();
  tool_use_chat.reset();  // the operator's template is the one for every request
  return Status::Ok();
}

Result<std::vector<int32_t>> TextCodec::EncodePrompt(const std::string& text,
                                                     bool add_special_tokens) const {
  SY_ASSIGN_OR_RETURN(std::vector<int32_t> ids, tokenizer->Encode(text));
  if (add_special_tokens && config.add_bos_token && bos_id) ids.insert(ids.begin(), *bos_id);
  return ids;
}

Result<std::vector<int32_t>> TextCodec::EncodeFim(const std::string& prefix,
                                                  const std::string& suffix) const {
  static constexpr const char* kMarkers[] = {"<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>"};
  for (const char* marker : kMarkers)
    if (!tokenizer->TokenToId(marker))
      return Status::Errorf(
          "this model's tokenizer has no fill-in-the-middle token \"{}\" (DeepSeek-V3's has)",
          marker);
  // One string, so the ids are what the tokenizer gives the whole FIM prompt (the markers are
  // added tokens: they split the text as they would written anywhere).
  return EncodePrompt(std::string(kMarkers[0]) + prefix + kMarkers[1] + suffix + kMarkers[2]);
}

Result<std::string> TextCodec::RenderChat(const nlohmann::ordered_json& messages,
                                          const ChatOptions& options) const {
  if (!chat) return chat_status;
  return chat->Render(messages, options);
}

Result<std::vector<int32_t>> TextCodec::EncodeChat(const nlohmann::ordered_json& messages,
                                                   const ChatOptions& options) const {
  SY_ASSIGN_OR_RETURN(std::string prompt, RenderChat(messages, options));
  return tokenizer->Encode(prompt);
}

Result<std::vector<int32_t>> TextCodec::EncodeChat(const std::string& user_message) const {
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  messages.push_back({{"role", "user"}, {"content", user_message}});
  return EncodeChat(messages, ChatOptions{});
}

}  // namespace sy
