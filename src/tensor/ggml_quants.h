// GGML's tensor types (as GGUF files name them) and reference dequantizers to float32.
//
// A GGML quantized tensor is a sequence of fixed-size blocks along each row (the innermost
// dimension, ne[0]); a block holds `block_size` elements in `block_bytes` bytes. The decoders
// here are scalar and follow ggml-quants.c / gguf-py's numpy code operation for operation (no
// fused multiply-add: this file is compiled with -ffp-contract=off), so they agree with gguf-py's
// `gguf.quants.dequantize` bit for bit (tests/ggml_quants_test.cc).
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

#include "base/status.h"

namespace sy {

// ggml_type ids as stored in GGUF tensor infos (ggml.h); ids 4, 5 (Q4_2, Q4_3) and 31-33, 36-38
// were retired upstream and are unknown here.
enum class GgmlType : uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ5_0 = 6,
  kQ5_1 = 7,
  kQ8_0 = 8,
  kQ8_1 = 9,
  kQ2_K = 10,
  kQ3_K = 11,
  kQ4_K = 12,
  kQ5_K = 13,
  kQ6_K = 14,
  kQ8_K = 15,
  kIQ2_XXS = 16,
  kIQ2_XS = 17,
  kIQ3_XXS = 18,
  kIQ1_S = 19,
  kIQ4_NL = 20,
  kIQ3_S = 21,
  kIQ2_S = 22,
  kIQ4_XS = 23,
  kI8 = 24,
  kI16 = 25,
  kI32 = 26,
  kI64 = 27,
  kF64 = 28,
  kIQ1_M = 29,
  kBF16 = 30,
  kTQ1_0 = 34,
  kTQ2_0 = 35,
  kMXFP4 = 39,
  // Not a GGML type and never read from a GGUF file (the reader refuses it): Hugging Face int4
  // weights (AWQ, GPTQ, compressed-tensors pack-quantized; model/hf_int4.h) repacked at load into
  // blocks of 128 columns — one group of the checkpoint — so that they take the same path
  // (PackGgml, kernels/cpu/ggml_gemm.h) as GGUF's blocks. Block (68 bytes): the group's scale s
  // (IEEE half bits), its zero point z (a byte, 0..16), a zero byte, then 64 bytes of codes q
  // (0..15), element 2i the low nibble of byte i, element 2i + 1 the high. Value s · (q − z),
  // exact in float (an 11-bit significand times an integer of at most 5 bits). Integer form:
  // d = dmin = s, sc = 1, mn = z: d · sc · q − dmin · mn is the same value.
  kHfInt4 = 0x48463404,
};

struct GgmlTypeTraits {
  GgmlType type;
  std::string_view name;  // "Q4_K", as llama.cpp and gguf-py spell it
  int64_t block_size;     // elements per block
  int64_t block_bytes;    // bytes per block
  bool dequantizable;     // DequantizeGgml decodes it
};

// The traits of a type id read from a file; nullopt for an id GGML does not define.
std::optional<GgmlTypeTraits> GgmlTypeInfo(uint32_t type_id);
inline std::optional<GgmlTypeTraits> GgmlTypeInfo(GgmlType type) {
  return GgmlTypeInfo(static_cast<uint32_t>(type));
}

// Decodes `elements` values of `type` (a multiple of its block size) from `source`
// (elements / block_size * block_bytes bytes) into `out`. An error names a type this build
// cannot decode (the IQ*, TQ*, MXFP4, Q8_1/Q8_K and integer types) or a count that is not whole
// blocks; the bytes themselves are never invalid.
Status DequantizeGgml(GgmlType type, const uint8_t* source, int64_t elements, float* out);

// Encodes `elements` values (whole blocks) as `type`'s blocks into `out`: Q8_0 and Q5_0 as
// gguf-py quantizes them (ggml's reference encoders), Q4_K and Q6_K by round to nearest
// (tools/gguf/make_default_gguf.py's encoder; llama.cpp searches each sub-block's scale and min
// instead, which costs less accuracy). Bit for bit those encoders' output on every CPU. An error
// names a type without an encoder here or a count that is not whole blocks.
Status EncodeGgml(GgmlType type, const float* source, int64_t elements, uint8_t* out);

// A block in integer form, for kernels that multiply with the codes (kernels/cpu/ggml_gemm.h):
// element e is d · sc[j] · q[e] − dmin · mn[j], j = e / sub_size, q unsigned — the same values as
// DequantizeGgml's up to float rounding (it rounds d · sc to float first; this form keeps the
// integer parts apart). With `shared_d` dmin is d (the offset types: Q4_0, Q5_0, Q8_0, Q3_K,
// Q6_K, whose mn[j] is the offset times sc[j]).
struct GgmlIntegerLayout {
  int64_t sub_size;  // elements per sub-block sharing sc and mn: 16 or 32
  int code_bits;     // bits a code needs at most: 2, 3, 4, 5, 6 or 8
  bool shared_d;
  int offset;        // shared_d: mn = offset · sc (8, 16, 128, 4, 32); else 0
  bool unit_scales;  // one sub-block per block and sc = 1 (Q4_0..Q8_0; Q4_1/Q5_1: mn = 1 too)
};
struct GgmlIntegerBlock {
  uint8_t q[256];
  int8_t sc[16];
  int16_t mn[16];
  uint16_t d = 0, dmin = 0;  // IEEE half bits, as in the file (Q4_1/Q5_1: dmin is −m)
};
// The layout of a type's integer form; nullopt for types without one (F32, F16, BF16, IQ*...).
std::optional<GgmlIntegerLayout> GgmlIntegerForm(GgmlType type);
// Decodes one block of a type GgmlIntegerForm accepts.
void DecodeGgmlIntegerBlock(GgmlType type, const uint8_t* block, GgmlIntegerBlock* out);

// Whether `type` is one of switchyard's own block types (kHfInt4), which a GGUF file never holds.
inline bool GgmlTypeIsInternal(GgmlType type) {
  return type == GgmlType::kHfInt4;
}
inline constexpr int64_t kHfInt4GroupCols = 128;
inline constexpr int64_t kHfInt4BlockBytes = 4 + kHfInt4GroupCols / 2;

// IEEE half to float, NaN payloads kept (as numpy's float16 -> float32 conversion does).
float GgmlHalfToF32(uint16_t bits);

}  // namespace sy
