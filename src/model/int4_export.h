// `switchyard quantize --to awq-int4 | gptq-int4 | ct-w4a16 | ct-w4a16-asym`: a DeepSeek-V3-layout
// checkpoint directory (fp8 with block scales, bf16 or f32) written as a Hugging Face W4A16
// checkpoint that vLLM, SGLang and switchyard load: every linear layer whose input is whole
// groups of 128 columns (and output whole words of 8) as 4-bit codes in the format's packed int32
// tensors (the layouts model/hf_int4.h reads), everything else as it was (fp8 decoded to bf16).
// One tensor is in memory at a time; the output is sharded as save_pretrained shards.
//
// The codes are round-to-nearest per row and group of 128 columns, as the formats' own tools
// compute them before any calibration (tools/hf_int4/make_fixtures.py follows them):
//   awq-int4, gptq-int4: asymmetric, s = (max − min) / 15 in fp16 (min ≤ 0 ≤ max),
//     z = round(−min / s), q = clamp(round(w / s) + z, 0, 15). GPTQ's "gptq" checkpoint format
//     stores z − 1 and its readers add one back, so a zero point of 0 cannot be stored there: such
//     a group takes z = 1 and s = max / 14 instead.
//   ct-w4a16 (llm-compressor's W4A16 scheme): symmetric, s = max|w| / 7.5 in bf16,
//     q = clamp(round(w / s), −8, 7).
//   ct-w4a16-asym: s = (max − min) / 15 in bf16, z = clamp(round(−8 − min / s), −8, 7),
//     q = clamp(round(w / s) + z, −8, 7).
// Each weight then reads back as s · (q − z). Divisions are float32, rounding is to nearest even.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "base/status.h"

namespace sy {

enum class Int4Scheme {
  kAwq,     // asymmetric, fp16 scales
  kGptq,    // asymmetric, fp16 scales, zero points at least 1
  kCtSym,   // symmetric, bf16 scales
  kCtAsym,  // asymmetric, bf16 scales
};

// One matrix's codes, all as unsigned nibbles: q [rows, cols] and z [rows, cols / 128] in 0..15
// (compressed-tensors' signed values plus 8; its symmetric zero point is 8), scales [rows,
// cols / 128] as fp16 or bf16 bits.
struct Int4Codes {
  std::vector<uint8_t> q;
  std::vector<uint8_t> z;
  std::vector<uint16_t> scales;
};

constexpr int64_t kInt4Group = 128;

// `w` is [rows, cols] row-major, cols a multiple of kInt4Group. With `importance` ([cols], each
// input column's mean square activation: model/calibration.h), each group's range is clipped to
// the one of AutoAWQ's auto_clip grid (its largest magnitude times 1, 0.975, ..., 0.525) that
// leaves the least Σ_j importance_j · (w_j − ŵ_j)²; the first candidate is round-to-nearest, so
// the result is never worse by that measure.
Int4Codes QuantizeInt4(const float* w, int64_t rows, int64_t cols, Int4Scheme scheme,
                       const float* importance = nullptr);

// AWQ's per-input-channel scales for a matrix whose inputs have mean squares `importance`
// ([cols]): s_j = sqrt(importance_j)^α, centred so that max(s) · min(s) = 1, with α from the grid
// 0, 0.05, ..., 0.95 that minimizes Σ_j importance_j · (w_j − Q(w · s)_j / s_j)² (round to nearest
// in `scheme`). The layer then stores w · s (quantized) and whatever produces its input divides
// by s. α = 0 (all ones, round to nearest) is a candidate, so it is never worse by that measure.
std::vector<float> SearchInt4Scales(const float* w, int64_t rows, int64_t cols,
                                    const float* importance, Int4Scheme scheme);

// The pieces, for scales shared by several matrices (all the projections one norm feeds): the
// grid's exponents α = step / kInt4ScaleSteps; the scales a basis (the shared input's mean
// squares) gives at one step; and one matrix's weighted error (with its own inputs' importance)
// at every step, to be summed over the matrices before choosing.
constexpr int kInt4ScaleSteps = 20;
std::vector<float> Int4ChannelScales(const float* basis, int64_t cols, int step);
std::vector<double> Int4ScaleErrors(const float* w, int64_t rows, int64_t cols,
                                    const float* importance, const float* basis, Int4Scheme scheme);

struct Importance;  // model/calibration.h

struct Int4ExportOptions {
  std::string type = "awq-int4";             // awq-int4, gptq-int4, ct-w4a16, ct-w4a16-asym
  uint64_t max_shard_bytes = 5'000'000'000;  // save_pretrained's default, "5GB"
  // When set, each layer it has a measure for is quantized with it (QuantizeInt4's importance:
  // Importance::Weights); the others round to nearest. And every MLP's down projection (routed
  // experts, shared, dense) whose up projection is quantized too gets AWQ's per-channel scales
  // (SearchInt4Scales): down_proj stores W · s, up_proj's rows are divided by s, so
  // down(silu(gate x) · up x) is unchanged before quantization.
  const Importance* importance = nullptr;
  // After each tensor: (tensors done, of all, bytes written).
  std::function<void(size_t, size_t, uint64_t)> progress;
};

// Writes the checkpoint directory `out_dir` (config.json with the format's quantization_config,
// the safetensors, and every other file of `model_dir`: tokenizer, generation config, code).
// `out_dir` must not exist or be empty; it is written as `out_dir`.partial and renamed when
// whole. Errors name the file, the tensor or the option.
Status ExportInt4Checkpoint(const std::string& model_dir, const std::string& out_dir,
                            const Int4ExportOptions& options);

}  // namespace sy
