// DeepSeek-V3.2's chat encoding. The release ships no Jinja template: its tokenizer_config.json
// has none, and DeepSeek's encoding_dsv32.py renders conversations in Python (vLLM runs it under
// `--tokenizer-mode deepseek_v32`). This is that encoding, step for step, as vLLM drives it:
// tools go in a system message of their own at the front, a thinking mode from the request's
// `thinking` template argument (chat when absent), earlier reasoning dropped when the
// conversation ends with a user turn, and tool calls written in DSML:
//
//   <｜DSML｜function_calls>
//   <｜DSML｜invoke name="NAME">
//   <｜DSML｜parameter name="KEY" string="true|false">VALUE</｜DSML｜parameter>
//   </｜DSML｜invoke>
//   </｜DSML｜function_calls>
//
// (a string value as it is, any other as JSON). tests/tokenizer_test.cc checks it against the
// encoding's output on committed conversations (tools/tokenizer/gen_dsv32_fixtures.py).
#pragma once

#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "base/status.h"
#include "tokenizer/chat_template.h"

namespace sy {

inline constexpr std::string_view kDsmlToken = "｜DSML｜";

Result<std::string> RenderDeepSeekV32(const nlohmann::ordered_json& messages,
                                      const ChatOptions& options, std::string_view bos,
                                      std::string_view eos);

}  // namespace sy
