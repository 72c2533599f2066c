// The OpenAI front's flags serve and route share: the chat template's (vLLM's names)
// --chat-template, --chat-template-content-format, --trust-request-chat-template; the chat
// output's --enable-auto-tool-choice, --exclude-tools-when-tool-choice-none, --tool-call-parser,
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
  double files_mb = 512;                              // 0: no Files and Batch APIs
  std::string files_dir;                              // "": files and batches in memory only
  double batch_completion_window = 24 * 3600;         // seconds; 0: batches never expire
  std::string chat_template;                          // "": the checkpoint's
  std::string chat_template_content_format = "auto";  // auto, string or openai
  bool trust_request_chat_template = false;
};
void AddChatOutputOptions(CLI::App* verb, ChatOutputArgs& args);
// --chat-template (a file, or the template itself) replaces the codec's chat template; an
// empty value leaves it. Fails the verb on a template that does not parse.
void ApplyChatTemplateOrFail(const std::string& path_or_text, TextCodec* codec);
// Sets the server's chat output limits and its Responses store; fails the verb on an unknown
// parser.
void ApplyChatOutputOrFail(const ChatOutputArgs& args, const TextCodec& codec,
                           serve::ServerOptions* options);

}  // namespace sy
