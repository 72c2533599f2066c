// `switchyard quantize`: a DeepSeek-V3-layout checkpoint directory (fp8 with block scales, bf16
// or f32) written as a `deepseek2` GGUF the way llama.cpp's convert_hf_to_gguf.py lays it out
// (tensor names, attn_k_b / attn_v_b split from kv_b_proj, routed experts stacked per layer,
// deepseek2.* metadata, the tokenizer as tokenizer.ggml.*), each matrix encoded in the chosen
// type straight from the fp8 blocks: no bf16 copy of the model on disk first, as llama.cpp's
// path from DeepSeek's fp8 release needs. One tensor is in memory at a time.
//
// Types: f32, f16, bf16, q8_0; q4_k_m (llama.cpp's Q4_K_M choice per tensor: Q6_K for the output
// head and for attn_v_b and ffn_down in the layers it gives more bits, Q4_K elsewhere); q4_k_mix
// (Q6_K for the head, attention output and every down projection). 1-D tensors, norms, biases and
// the router stay F32, as the converter keeps them; rows that are not whole K-quant blocks take
// Q5_0 (for Q4_K) or Q8_0 (for Q6_K), as llama.cpp's quantizer does, and F32 where not even that.
// The encoders are tensor/ggml_quants.h's EncodeGgml: bit for bit what
// tools/gguf/make_default_gguf.py writes for the same checkpoint (tests/gguf_model_test.cc).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "base/status.h"

namespace sy {

struct GgufExportOptions {
  std::string type = "q4_k_m";  // f32, f16, bf16, q8_0, q4_k_m, q4_k_mix
  std::string kv_b = "split";   // split (attn_k_b, attn_v_b), fused (attn_kv_b) or both
  // After each tensor: (tensors done, of all, bytes written).
  std::function<void(size_t, size_t, uint64_t)> progress;
  // The checkpoint's chat templates as its tokenizer configuration gives them (the tokenizer
  // library's LoadTokenizerConfig: chat_template.jinja and additional_chat_templates/, which
  // replace tokenizer_config.json's string or list of named templates), written as
  // tokenizer.chat_template and a named tool_use one as gguf-py writes named templates
  // (tokenizer.chat_template.tool_use, listed in tokenizer.chat_templates). Unset: only
  // tokenizer_config.json's chat_template string, as this library reads no more of it.
  std::optional<std::string> chat_template;
  std::string tool_use_chat_template;
};

// Writes `out` from the checkpoint in `model_dir` (config.json, safetensors, tokenizer.json,
// tokenizer_config.json). Errors name the file, the tensor or the option.
Status ExportGguf(const std::string& model_dir, const std::string& out,
                  const GgufExportOptions& options);

}  // namespace sy
