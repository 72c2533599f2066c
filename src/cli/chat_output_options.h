// The OpenAI front's flags serve and route share: the chat output's (vLLM's names)
// --enable-auto-tool-choice, --exclude-tools-when-tool-choice-none, --tool-call-parser,
// --reasoning-parser; --reasoning-effort-budgets; the Responses API's store,
// --responses-store-mb and --responses-store-dir; --sse-keepalive-seconds; and --files-mb (the
// Files and Batch APIs).
#pragma once

#include <string>

#include <CLI/CLI.hpp>

#include "serve/http_server.h"
#include "tokenizer/text_codec.h"

namespace sy {

struct ChatOutputArgs {
  bool enable_auto_tool_choice = false;
  bool exclude_tools_when_tool_choice_none = false;
  std::string tool_call_parser;     // "": the chat template's format
  std::string reasoning_parser;     // "": none
  std::string effort_budgets;       // "": the defaults (serve::DefaultEffortBudgets)
  double responses_store_mb = 256;  // 0: the Responses API keeps nothing
  std::string responses_store_dir;  // "": in memory only
  double sse_keepalive_seconds = 15;
  double files_mb = 512;  // 0: no Files and Batch APIs
};
void AddChatOutputOptions(CLI::App* verb, ChatOutputArgs& args);
// Sets the server's chat output limits and its Responses store; fails the verb on an unknown
// parser.
void ApplyChatOutputOrFail(const ChatOutputArgs& args, const TextCodec& codec,
                           serve::ServerOptions* options);

}  // namespace sy
