// A checkpoint's text interface in one place: tokenizer.json, and from tokenizer_config.json the
// chat template (recognised or parsed once) and the BOS that plain prompts start with.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "base/status.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace sy {

struct TextCodec {
  std::unique_ptr<Tokenizer> tokenizer;
  TokenizerConfig config;
  std::optional<int32_t> bos_id;
  std::optional<ChatTemplate> chat;  // absent when the template is missing or does not parse
  Status chat_status;                // why `chat` is absent
  // The checkpoint's "tool_use" template, for requests that give tools (transformers' choice).
  std::optional<ChatTemplate> tool_use_chat;

  // Loads `directory`'s tokenizer, or the file/directory `tokenizer_path` names instead.
  static Result<TextCodec> Load(const std::string& directory,
                                const std::string& tokenizer_path = "");

  // Replaces the checkpoint's chat template (--chat-template); `source` names it in errors.
  Status UseChatTemplate(std::string_view template_text, const std::string& source);
  // DeepSeek-V3.2's encoding in place of a template (--chat-template deepseek_v32; chosen by
  // Load for a deepseek_v32 checkpoint whose tokenizer has no template, as V3.2's has none).
  void UseDeepSeekV32Encoding();
  SpecialTokens special_tokens() const;

  // Plain text → prompt ids (BOS first when add_special_tokens and the config asks for it).
  Result<std::vector<int32_t>> EncodePrompt(const std::string& text,
                                            bool add_special_tokens = true) const;
  // Fill in the middle (DeepSeek's FIM, as its API's completions with `suffix`): the prompt
  // "<｜fim▁begin｜>prefix<｜fim▁hole｜>suffix<｜fim▁end｜>", after which the model writes what
  // goes between. An error where the tokenizer has no FIM tokens (the default model's has none).
  Result<std::vector<int32_t>> EncodeFim(const std::string& prefix,
                                         const std::string& suffix) const;
  // Messages (OpenAI shape) rendered through the chat template, then tokenized (the template
  // writes BOS itself).
  Result<std::string> RenderChat(const nlohmann::ordered_json& messages,
                                 const ChatOptions& options) const;
  Result<std::vector<int32_t>> EncodeChat(const nlohmann::ordered_json& messages,
                                          const ChatOptions& options) const;
  // One user message.
  Result<std::vector<int32_t>> EncodeChat(const std::string& user_message) const;
};

}  // namespace sy
