// `switchyard bench chat-template`: the time to turn a conversation into a prompt, for each chat
// template: switchyard's interpreter, its native rendering where the template is DeepSeek's, and
// transformers' render_jinja_template (what vLLM and SGLang run per request) side by side on the
// same conversations, in a subprocess timed inside it. Every rendering is checked equal to
// transformers' (count and checksum).
#pragma once

#include <string>
#include <vector>

#include "base/status.h"

namespace sy::bench {

struct ChatTemplateBenchOptions {
  std::vector<std::string> templates;      // template files
  std::vector<std::string> conversations;  // JSON files: [{"messages", "add_generation_prompt",
                                           //   "tools"?, "extra"?}]
  std::string hf_python;                   // a Python with transformers; empty: no HF column
  int repetitions = 7;
};

struct ChatTemplateBenchRow {
  std::string name;
  int64_t renders = 0;        // conversations the template renders (errors are left out)
  double parse_us = 0;        // switchyard: parsing the template once
  double interpreted_us = 0;  // per render, median over repetitions
  double native_us = 0;       // 0: not a DeepSeek template switchyard renders natively
  double hf_us = 0;           // 0: no HF run
  bool equal = true;          // the renderings equal transformers' (when it ran)
};

struct ChatTemplateBenchReport {
  std::vector<ChatTemplateBenchRow> rows;
  std::string hf_version;
  std::string hf_note;  // why there is no HF column, when there is none
};

Result<ChatTemplateBenchReport> RunChatTemplateBench(const ChatTemplateBenchOptions& options);
std::string ChatTemplateReportTable(const ChatTemplateBenchReport& report);

}  // namespace sy::bench
