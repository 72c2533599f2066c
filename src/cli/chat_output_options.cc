#include "cli/chat_output_options.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "cli/verbs.h"

namespace sy {

void ApplyChatTemplateOrFail(const std::string& path_or_text, TextCodec* codec) {
  if (path_or_text.empty()) return;
  if (path_or_text == "deepseek_v32") {  // DeepSeek-V3.2's encoding, which has no template
    codec->UseDeepSeekV32Encoding();
    return;
  }
  std::string text = path_or_text, source = "--chat-template";
  std::error_code error;
  if (std::filesystem::is_regular_file(path_or_text, error)) {
    std::ifstream in(path_or_text, std::ios::binary);
    std::stringstream buffer;
    buffer << in.rdbuf();
    if (!in) FailVerb("--chat-template: cannot read " + path_or_text);
    text = buffer.str();
    source = path_or_text;
  } else if (path_or_text.find("{{") == std::string::npos &&
             path_or_text.find("{%") == std::string::npos) {
    // vLLM takes a path or the template itself; text with no tag is a path that is not there.
    FailVerb("--chat-template: no such file '" + path_or_text +
             "' (give a template file, or the template's text)");
  }
  Status s = codec->UseChatTemplate(text, source);
  if (!s.ok()) FailVerb(s.message());
}

void AddChatOutputOptions(CLI::App* verb, ChatOutputArgs& args) {
  verb->add_option("--chat-template", args.chat_template,
                   "A Jinja chat template (a file, or the template's text) to use instead of the "
                   "checkpoint's; DeepSeek's own are rendered natively, any other is interpreted "
                   "as transformers renders it. deepseek_v32: DeepSeek-V3.2's encoding (its "
                   "release has no template; chosen by default for a deepseek_v32 checkpoint "
                   "without one)");
  verb->add_option("--chat-template-content-format", args.chat_template_content_format,
                   "How an interpreted template gets a message's content: string (text parts "
                   "joined), openai (a list of {type, text} parts), or auto (parts when the "
                   "template loops over content; default)")
      ->check(CLI::IsMember({"auto", "string", "openai"}));
  verb->add_flag("--trust-request-chat-template", args.trust_request_chat_template,
                 "Let a request send its own chat_template (a template is code the server runs; "
                 "it is bounded in steps and memory, but only trusted clients should send one)");
  verb->add_flag("--enable-auto-tool-choice", args.enable_auto_tool_choice,
                 "Allow tool_choice \"auto\" (the default when a request gives tools): the model "
                 "may call tools and its output is parsed for calls");
  verb->add_flag("--exclude-tools-when-tool-choice-none", args.exclude_tools_when_tool_choice_none,
                 "Leave the tools out of the prompt when a request's tool_choice is \"none\" "
                 "(default: they are shown to the model, as vLLM does)");
  verb->add_option("--tool-call-parser", args.tool_call_parser,
                   "Tool-call format: deepseek_v3 (V3, R1, V3-0324), deepseek_v31, deepseek_v32 "
                   "(V3.2's DSML) or kimi_k2 (Kimi K2; default: the chat template's, or kimi_k2 "
                   "when the tokenizer has its tokens)")
      ->check(CLI::IsMember({"deepseek_v3", "deepseek_v31", "deepseek_v32", "deepseekv3",
                             "deepseekv31", "deepseekv32", "kimi_k2"}));
  verb->add_option("--reasoning-parser", args.reasoning_parser,
                   "Split <think>...</think> into reasoning_content: deepseek_r1, deepseek_v3 or "
                   "kimi_k2 (K2-Thinking; default: off)")
      ->check(CLI::IsMember({"deepseek_r1", "deepseek_v3", "kimi_k2"}));
  verb->add_option("--reasoning-effort-budgets", args.effort_budgets,
                   "Thinking budgets (tokens, -1: none) for the reasoning effort levels a request "
                   "may ask for (reasoning_effort, reasoning.effort, output_config.effort), e.g. "
                   "low=1024,medium=4096,high=16384 (default: none=0, the others unbounded)");
  verb->add_option("--responses-store-dir", args.responses_store_dir,
                   "Keep the store (stored responses, conversations, message threads) in this "
                   "directory too, so it outlives the process: changes are journaled as they are "
                   "made and read back at start (one process per directory; default: memory "
                   "only)");
  verb->add_option("--sse-keepalive-seconds", args.sse_keepalive_seconds,
                   "A streamed response idle this long (queued, or a long prompt prefilling) gets "
                   "an SSE comment line, so proxies and client timeouts do not cut it; 0: never "
                   "(default 15)")
      ->check(CLI::Range(0.0, 3600.0));
  verb->add_option("--files-mb", args.files_mb,
                   "Memory for OpenAI's Files and Batch APIs (/v1/files, /v1/batches): uploaded "
                   "batch inputs and the output and error files batches write; files stay until "
                   "deleted and a file that does not fit is refused. 0: no Files and Batch APIs "
                   "(default 512)")
      ->check(CLI::Range(0.0, 1e6));
  verb->add_option("--files-dir", args.files_dir,
                   "Keep the Files and Batch APIs' state in this directory as well (created if "
                   "need be): files as they are uploaded or written, each batch's state and each "
                   "line's result as it is recorded. A restart reads them back and runs on the "
                   "batches it interrupted from their first line without a result. One process "
                   "at a time (default: memory only)");
  verb->add_option("--batch-completion-window", args.batch_completion_window,
                   "Seconds a batch (/v1/batches, /v1/messages/batches) may run: when they are "
                   "up, its requests in flight stop and every line without a result is reported "
                   "expired, beside the results so far (OpenAI's and Anthropic's 24 hours by "
                   "default; 0: never)")
      ->check(CLI::Range(0.0, 1e9));
  verb->add_option("--responses-store-mb", args.responses_store_mb,
                   "Memory for stored Responses API responses (store, previous_response_id, "
                   "GET /v1/responses/{id}) and Anthropic message threads; the least recently "
                   "used go first. 0: keep none, and refuse store: true, previous_response_id "
                   "and thread (default 256)")
      ->check(CLI::Range(0.0, 1e6));
}

void ApplyChatOutputOrFail(const ChatOutputArgs& args, const TextCodec& codec,
                           serve::ServerOptions* options) {
  Status s = serve::ConfigureChatOutput(args.tool_call_parser, args.enable_auto_tool_choice,
                                        args.reasoning_parser, codec, &options->limits);
  if (!s.ok()) FailVerb(s.message());
  options->limits.exclude_tools_when_tool_choice_none = args.exclude_tools_when_tool_choice_none;
  options->limits.content_format =
      args.chat_template_content_format == "openai"   ? serve::ContentFormat::kOpenAI
      : args.chat_template_content_format == "string" ? serve::ContentFormat::kString
                                                      : serve::ContentFormat::kAuto;
  options->limits.trust_request_chat_template = args.trust_request_chat_template;
  options->sse_keepalive_seconds = args.sse_keepalive_seconds;
  if (!args.effort_budgets.empty()) {
    s = serve::ParseEffortBudgets(args.effort_budgets, &options->limits.effort_budgets);
    if (!s.ok()) FailVerb(s.message());
  }
  options->files_bytes = static_cast<size_t>(args.files_mb * (1 << 20));
  if (!args.files_dir.empty() && options->files_bytes == 0)
    FailVerb("--files-dir keeps the Files and Batch APIs' state: --files-mb must not be 0");
  options->files_dir = args.files_dir;
  options->batch_completion_window = static_cast<int64_t>(std::ceil(args.batch_completion_window));
  const auto store_bytes = static_cast<size_t>(args.responses_store_mb * (1 << 20));
  if (!args.responses_store_dir.empty()) {
    if (store_bytes == 0)
      FailVerb("--responses-store-dir needs a store: --responses-store-mb must not be 0");
    auto store = serve::ResponsesStore::Open(store_bytes, args.responses_store_dir);
    if (!store.ok()) FailVerb(store.status().message());
    options->responses_store = std::move(store).value();
  } else if (store_bytes > 0) {
    options->responses_store = std::make_shared<serve::ResponsesStore>(store_bytes);
  }
}

}  // namespace sy
