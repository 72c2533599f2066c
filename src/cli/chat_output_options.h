// The chat output flags serve and route share (vLLM's names): --enable-auto-tool-choice,
// --exclude-tools-when-tool-choice-none, --tool-call-parser, --reasoning-parser.
#pragma once

#include <string>

#include <CLI/CLI.hpp>

#include "serve/openai_api.h"
#include "tokenizer/text_codec.h"

namespace sy {

struct ChatOutputArgs {
  bool enable_auto_tool_choice = false;
  bool exclude_tools_when_tool_choice_none = false;
  std::string tool_call_parser;  // "": the chat template's format
  std::string reasoning_parser;  // "": none
};
void AddChatOutputOptions(CLI::App* verb, ChatOutputArgs& args);
// Sets the server's chat output limits; fails the verb on an unknown parser.
void ApplyChatOutputOrFail(const ChatOutputArgs& args, const TextCodec& codec,
                           serve::ServingLimits* limits);

}  // namespace sy
