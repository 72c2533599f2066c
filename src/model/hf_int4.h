// Hugging Face int4 (W4A16) weights: AWQ, GPTQ and compressed-tensors pack-quantized checkpoints,
// read from their packed int32 tensors and repacked once, at load, into switchyard's
// HF_INT4_G128 blocks (tensor/ggml_quants.h), which the native 4-bit panel kernels multiply
// (kernels/cpu/ggml_gemm.h). compressed-tensors' symmetric groups of 32 (Kimi K2-Thinking's
// release) become llama.cpp's Q4_0 blocks instead, the same values: a half scale times q − 8. The
// repacking is exact: every weight keeps the value the checkpoint's own dequantizer gives before it
// rounds to the checkpoint's dtype, s · (q − z) (an fp16 scale, or a bf16/f32 one that a half holds
// exactly, times a small integer).
//
// The layouts, for a linear layer of `out` × `in` weights in groups of g = 128 input columns,
// as the libraries' pack code writes them (tools/hf_int4/make_fixtures.py packs the same way):
//   AWQ (AutoAWQ, GEMM version):
//     <m>.qweight [in, out/8] int32: nibble k of word (i, c) holds output column 8c + order[k],
//                 order = [0, 2, 4, 6, 1, 3, 5, 7];
//     <m>.qzeros  [in/g, out/8] int32, the same interleave; <m>.scales [in/g, out] f16;
//     value (q − z) · s.
//   GPTQ (auto-gptq, GPTQModel):
//     <m>.qweight [in/8, out] int32: nibble k of word (r, o) holds input row 8r + k;
//     <m>.qzeros  [in/g, out/8] int32, nibble k of word (gi, c) output column 8c + k, stored
//                 as z − 1 under checkpoint_format "gptq" (read back as nibble + 1, so 1..16),
//                 as z under "gptq_v2"; <m>.scales [in/g, out] f16;
//     <m>.g_idx   [in] int32, optional: must be i / g for every i (act-order checkpoints whose
//                 groups are permuted are refused);
//     value (q − z) · s.
//   compressed-tensors pack-quantized:
//     <m>.weight_packed [out, in/8] int32: nibble k of word (o, c) holds input column 8c + k,
//                 as the signed code plus 8;
//     <m>.weight_scale  [out, in/g] (f16, bf16 or f32);
//     <m>.weight_zero_point [out/8, in/g] int32 (asymmetric only): nibble k of word (r, gi)
//                 output row 8r + k, the signed zero point plus 8;
//     <m>.weight_shape  [2] int: [out, in]; <m>.weight_g_idx [in] optional, as GPTQ's g_idx;
//     value (q_signed − z_signed) · s = (nibble − z_nibble) · s; symmetric: z_nibble = 8.
#pragma once

#include <cstdint>
#include <set>
#include <string>

#include "base/status.h"
#include "model/config.h"
#include "model/safetensors.h"
#include "tensor/matrix.h"

namespace sy {

// Whether `config` quantizes the linear layer `module` ("model.layers.3.mlp.experts.5.up_proj"),
// by its not-converted/ignore list.
bool Int4Quantizes(const Int4Config& config, const std::string& module);

// The names of the tensors that hold `module`'s int4 weights in `config`'s format: the packed
// codes first. Optional ones (g_idx, zero points of symmetric schemes) are included.
std::vector<std::string> Int4TensorNames(const Int4Config& config, const std::string& module);

// Reads `module`'s int4 weights, [rows (out), cols (in)], out of `checkpoint` and repacks them
// into HF_INT4_G128 blocks (Q4_0 for groups of 32): a Matrix of dtype kGgml that owns them. Every
// shape, dtype and value that does not fit the format is an error naming the tensor; nothing is
// trusted. The names of the tensors read are added to `used`.
Result<Matrix> LoadInt4Matrix(const Checkpoint& checkpoint, const Int4Config& config,
                              const std::string& module, int64_t rows, int64_t cols,
                              std::set<std::string>* used = nullptr);

}  // namespace sy
