#include "tensor/ggml_quants.h"

#include <array>
#include <cstring>

#include "tensor/dtype.h"

namespace sy {
namespace {

constexpr int64_t kQK = 256;  // QK_K: elements per K-quant super-block

// Sizes from ggml.c's type_traits (gguf-py's GGML_QUANT_SIZES).
constexpr std::array<GgmlTypeTraits, 32> kTypes = {{
    {GgmlType::kF32, "F32", 1, 4, true},
    {GgmlType::kF16, "F16", 1, 2, true},
    {GgmlType::kQ4_0, "Q4_0", 32, 2 + 16, true},
    {GgmlType::kQ4_1, "Q4_1", 32, 2 + 2 + 16, true},
    {GgmlType::kQ5_0, "Q5_0", 32, 2 + 4 + 16, true},
    {GgmlType::kQ5_1, "Q5_1", 32, 2 + 2 + 4 + 16, true},
    {GgmlType::kQ8_0, "Q8_0", 32, 2 + 32, true},
    {GgmlType::kQ8_1, "Q8_1", 32, 4 + 4 + 32, false},
    {GgmlType::kQ2_K, "Q2_K", kQK, 2 + 2 + kQK / 16 + kQK / 4, true},
    {GgmlType::kQ3_K, "Q3_K", kQK, 2 + kQK / 4 + kQK / 8 + 12, true},
    {GgmlType::kQ4_K, "Q4_K", kQK, 2 + 2 + kQK / 2 + 12, true},
    {GgmlType::kQ5_K, "Q5_K", kQK, 2 + 2 + kQK / 2 + kQK / 8 + 12, true},
    {GgmlType::kQ6_K, "Q6_K", kQK, 2 + kQK / 2 + kQK / 4 + kQK / 16, true},
    {GgmlType::kQ8_K, "Q8_K", kQK, 4 + kQK + kQK / 8, false},
    {GgmlType::kIQ2_XXS, "IQ2_XXS", kQK, 2 + kQK / 4, false},
    {GgmlType::kIQ2_XS, "IQ2_XS", kQK, 2 + kQK / 4 + kQK / 32, false},
    {GgmlType::kIQ3_XXS, "IQ3_XXS", kQK, 2 + kQK / 4 + kQK / 8, false},
    {GgmlType::kIQ1_S, "IQ1_S", kQK, 2 + kQK / 8 + kQK / 16, false},
    {GgmlType::kIQ4_NL, "IQ4_NL", 32, 2 + 16, false},
    {GgmlType::kIQ3_S, "IQ3_S", kQK, 2 + kQK / 4 + kQK / 8 + kQK / 32 + 4, false},
    {GgmlType::kIQ2_S, "IQ2_S", kQK, 2 + kQK / 4 + kQK / 16, false},
    {GgmlType::kIQ4_XS, "IQ4_XS", kQK, 2 + 2 + kQK / 2 + kQK / 64, false},
    {GgmlType::kI8, "I8", 1, 1, false},
    {GgmlType::kI16, "I16", 1, 2, false},
    {GgmlType::kI32, "I32", 1, 4, false},
    {GgmlType::kI64, "I64", 1, 8, false},
    {GgmlType::kF64, "F64", 1, 8, false},
    {GgmlType::kIQ1_M, "IQ1_M", kQK, kQK / 8 + kQK / 16 + kQK / 32, false},
    {GgmlType::kBF16, "BF16", 1, 2, true},
    {GgmlType::kTQ1_0, "TQ1_0", kQK, 2 + 4 * 13, false},
    {GgmlType::kTQ2_0, "TQ2_0", kQK, 2 + 64, false},
    {GgmlType::kHfInt4, "HF_INT4_G128", kHfInt4GroupCols, kHfInt4BlockBytes, true},
}};

uint16_t Load16(const uint8_t* bytes) {
  uint16_t value;
  std::memcpy(&value, bytes, sizeof(value));
  return value;
}
float LoadHalf(const uint8_t* bytes) {
  return GgmlHalfToF32(Load16(bytes));
}

// Q4_0: d (f16), 16 bytes of nibbles; element i < 16 is the low nibble of byte i, element
// i >= 16 the high nibble of byte i - 16; value d * (q - 8).
void DequantizeQ4_0(const uint8_t* block, float* out) {
  const float d = LoadHalf(block);
  const uint8_t* qs = block + 2;
  for (int i = 0; i < 16; ++i) {
    out[i] = d * static_cast<float>((qs[i] & 0x0f) - 8);
    out[i + 16] = d * static_cast<float>((qs[i] >> 4) - 8);
  }
}

// Q4_1: d, m (f16), nibbles as Q4_0; value d * q + m.
void DequantizeQ4_1(const uint8_t* block, float* out) {
  const float d = LoadHalf(block), m = LoadHalf(block + 2);
  const uint8_t* qs = block + 4;
  for (int i = 0; i < 16; ++i) {
    out[i] = d * static_cast<float>(qs[i] & 0x0f) + m;
    out[i + 16] = d * static_cast<float>(qs[i] >> 4) + m;
  }
}

// The fifth bit of element i of a Q5_0/Q5_1 block: bit i of the little-endian word qh.
uint32_t Load32(const uint8_t* bytes) {
  return static_cast<uint32_t>(bytes[0]) | static_cast<uint32_t>(bytes[1]) << 8 |
         static_cast<uint32_t>(bytes[2]) << 16 | static_cast<uint32_t>(bytes[3]) << 24;
}

// Q5_0: d, qh (32 high bits), nibbles as Q4_0; value d * (q - 16).
void DequantizeQ5_0(const uint8_t* block, float* out) {
  const float d = LoadHalf(block);
  const uint32_t qh = Load32(block + 2);
  const uint8_t* qs = block + 6;
  for (int i = 0; i < 16; ++i) {
    const int low = (qs[i] & 0x0f) | static_cast<int>((qh >> i) & 1u) << 4;
    const int high = (qs[i] >> 4) | static_cast<int>((qh >> (i + 16)) & 1u) << 4;
    out[i] = d * static_cast<float>(low - 16);
    out[i + 16] = d * static_cast<float>(high - 16);
  }
}

// Q5_1: d, m, qh, nibbles; value d * q + m.
void DequantizeQ5_1(const uint8_t* block, float* out) {
  const float d = LoadHalf(block), m = LoadHalf(block + 2);
  const uint32_t qh = Load32(block + 4);
  const uint8_t* qs = block + 8;
  for (int i = 0; i < 16; ++i) {
    const int low = (qs[i] & 0x0f) | static_cast<int>((qh >> i) & 1u) << 4;
    const int high = (qs[i] >> 4) | static_cast<int>((qh >> (i + 16)) & 1u) << 4;
    out[i] = d * static_cast<float>(low) + m;
    out[i + 16] = d * static_cast<float>(high) + m;
  }
}

// Q8_0: d, 32 signed bytes; value q * d.
void DequantizeQ8_0(const uint8_t* block, float* out) {
  const float d = LoadHalf(block);
  for (int i = 0; i < 32; ++i)
    out[i] = static_cast<float>(static_cast<int8_t>(block[2 + i])) * d;
}

// Q2_K: 16 scale bytes (low nibble: scale, high nibble: min, one pair per 16 elements), 64
// bytes of 2-bit codes, d, dmin. Element e's code sits in byte (e / 128) * 32 + e % 32 at bit
// 2 * ((e % 128) / 32); value (d * scale) * q - dmin * min.
void DequantizeQ2_K(const uint8_t* block, float* out) {
  const uint8_t* scales = block;
  const uint8_t* qs = block + 16;
  const float d = LoadHalf(block + 80), dmin = LoadHalf(block + 82);
  for (int e = 0; e < kQK; ++e) {
    const int group = e / 16;
    const float scale = d * static_cast<float>(scales[group] & 0x0f);
    const float min = dmin * static_cast<float>(scales[group] >> 4);
    const int q = (qs[(e / 128) * 32 + e % 32] >> (2 * ((e % 128) / 32))) & 3;
    out[e] = scale * static_cast<float>(q) - min;
  }
}

// Q3_K: hmask (32 bytes: element e's high bit is bit e / 32 of byte e % 32, and a SET bit means
// no offset), 64 bytes of 2-bit codes laid out as Q2_K's, 12 bytes of sixteen 6-bit scales
// (low nibbles in bytes 0-7, high pairs in bytes 8-11), d; value (d * (scale - 32)) * q where
// q = low - 4 * (1 - high).
void DequantizeQ3_K(const uint8_t* block, float* out) {
  const uint8_t* hmask = block;
  const uint8_t* qs = block + 32;
  const uint8_t* packed = block + 96;
  const float d = LoadHalf(block + 108);
  float group_scale[16];
  for (int j = 0; j < 16; ++j) {
    const int low = (packed[j % 8] >> (4 * (j / 8))) & 0x0f;
    const int high = (packed[8 + j % 4] >> (2 * (j / 4))) & 3;
    group_scale[j] = d * static_cast<float>((low | high << 4) - 32);
  }
  for (int e = 0; e < kQK; ++e) {
    const int low = (qs[(e / 128) * 32 + e % 32] >> (2 * ((e % 128) / 32))) & 3;
    const int high = (hmask[e % 32] >> (e / 32)) & 1;
    out[e] = group_scale[e / 16] * static_cast<float>(low - ((high ^ 1) << 2));
  }
}

// The 6-bit scale and min of sub-block j (0..7) of a Q4_K/Q5_K block (get_scale_min_k4).
void ScaleMinK4(int j, const uint8_t* packed, int* scale, int* min) {
  if (j < 4) {
    *scale = packed[j] & 63;
    *min = packed[j + 4] & 63;
  } else {
    *scale = (packed[j + 4] & 0x0f) | ((packed[j - 4] >> 6) << 4);
    *min = (packed[j + 4] >> 4) | ((packed[j] >> 6) << 4);
  }
}

// Q4_K: d, dmin, 12 bytes of eight 6-bit (scale, min) pairs, 128 bytes of nibbles. Sub-block j
// (32 elements) reads the low (j even) or high (j odd) nibbles of bytes 32 * (j / 2) ...;
// value (d * scale) * q - dmin * min.
void DequantizeQ4_K(const uint8_t* block, float* out) {
  const float d = LoadHalf(block), dmin = LoadHalf(block + 2);
  const uint8_t* packed = block + 4;
  const uint8_t* qs = block + 16;
  for (int j = 0; j < 8; ++j) {
    int scale, min;
    ScaleMinK4(j, packed, &scale, &min);
    const float d_scale = d * static_cast<float>(scale);
    const float d_min = dmin * static_cast<float>(min);
    const uint8_t* bytes = qs + 32 * (j / 2);
    const int shift = 4 * (j % 2);
    for (int l = 0; l < 32; ++l)
      out[32 * j + l] = d_scale * static_cast<float>((bytes[l] >> shift) & 0x0f) - d_min;
  }
}

// Q5_K: d, dmin, 12 scale bytes, qh (32 bytes: sub-block j's fifth bits are bit j), then
// nibbles as Q4_K.
void DequantizeQ5_K(const uint8_t* block, float* out) {
  const float d = LoadHalf(block), dmin = LoadHalf(block + 2);
  const uint8_t* packed = block + 4;
  const uint8_t* qh = block + 16;
  const uint8_t* qs = block + 48;
  for (int j = 0; j < 8; ++j) {
    int scale, min;
    ScaleMinK4(j, packed, &scale, &min);
    const float d_scale = d * static_cast<float>(scale);
    const float d_min = dmin * static_cast<float>(min);
    const uint8_t* bytes = qs + 32 * (j / 2);
    const int shift = 4 * (j % 2);
    for (int l = 0; l < 32; ++l) {
      const int q = ((bytes[l] >> shift) & 0x0f) | ((qh[l] >> j) & 1) << 4;
      out[32 * j + l] = d_scale * static_cast<float>(q) - d_min;
    }
  }
}

// Q6_K: ql (128 bytes of low nibbles), qh (64 bytes of 2-bit high parts), 16 signed scales (one
// per 16 elements), d. Element e = 128 h + 32 g + l (h half, g 0..3): low nibble from
// ql[64 h + 32 (g % 2) + l] (shift 4 (g / 2)), high bits from qh[32 h + l] (shift 2 g);
// value (d * scale) * (q - 32).
void DequantizeQ6_K(const uint8_t* block, float* out) {
  const uint8_t* ql = block;
  const uint8_t* qh = block + 128;
  const int8_t* scales = reinterpret_cast<const int8_t*>(block + 192);
  const float d = LoadHalf(block + 208);
  for (int e = 0; e < kQK; ++e) {
    const int half = e / 128, g = (e % 128) / 32, l = e % 32;
    const int low = (ql[64 * half + 32 * (g % 2) + l] >> (4 * (g / 2))) & 0x0f;
    const int high = (qh[32 * half + l] >> (2 * g)) & 3;
    const float d_scale = d * static_cast<float>(scales[e / 16]);
    out[e] = d_scale * static_cast<float>((low | high << 4) - 32);
  }
}

// kHfInt4 (ggml_quants.h): s (f16), z, a zero byte, 64 bytes of nibble pairs; value s · (q − z),
// exact in float.
void DequantizeHfInt4(const uint8_t* block, float* out) {
  const float s = LoadHalf(block);
  const int z = block[2];
  const uint8_t* qs = block + 4;
  for (int i = 0; i < kHfInt4GroupCols / 2; ++i) {
    out[2 * i] = s * static_cast<float>((qs[i] & 0x0f) - z);
    out[2 * i + 1] = s * static_cast<float>((qs[i] >> 4) - z);
  }
}

using BlockDecoder = void (*)(const uint8_t*, float*);

BlockDecoder DecoderFor(GgmlType type) {
  switch (type) {
    case GgmlType::kQ4_0:
      return DequantizeQ4_0;
    case GgmlType::kQ4_1:
      return DequantizeQ4_1;
    case GgmlType::kQ5_0:
      return DequantizeQ5_0;
    case GgmlType::kQ5_1:
      return DequantizeQ5_1;
    case GgmlType::kQ8_0:
      return DequantizeQ8_0;
    case GgmlType::kQ2_K:
      return DequantizeQ2_K;
    case GgmlType::kQ3_K:
      return DequantizeQ3_K;
    case GgmlType::kQ4_K:
      return DequantizeQ4_K;
    case GgmlType::kQ5_K:
      return DequantizeQ5_K;
    case GgmlType::kQ6_K:
      return DequantizeQ6_K;
    case GgmlType::kHfInt4:
      return DequantizeHfInt4;
    default:
      return nullptr;
  }
}

}  // namespace

std::optional<GgmlTypeTraits> GgmlTypeInfo(uint32_t type_id) {
  for (const auto& traits : kTypes)
    if (static_cast<uint32_t>(traits.type) == type_id) return traits;
  return std::nullopt;
}

float GgmlHalfToF32(uint16_t bits) {
  const uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
  const uint32_t exponent = (bits >> 10) & 0x1fu, mantissa = bits & 0x3ffu;
  if (exponent == 0x1f) return F32FromBits(sign | 0x7f800000u | mantissa << 13);
  if (exponent != 0) return F32FromBits(sign | (exponent + 112) << 23 | mantissa << 13);
  // Zero and subnormals: mantissa * 2^-24, exact in float.
  const float magnitude = static_cast<float>(mantissa) * 5.9604644775390625e-8f;
  return sign ? -magnitude : magnitude;
}

Status DequantizeGgml(GgmlType type, const uint8_t* source, int64_t elements, float* out) {
  const auto traits = GgmlTypeInfo(type);
  if (!traits) return Status::Errorf("unknown GGML type id {}", static_cast<uint32_t>(type));
  if (!traits->dequantizable)
    return Status::Errorf("GGML type {} is not supported (no dequantizer)", traits->name);
  if (elements < 0 || elements % traits->block_size != 0)
    return Status::Errorf("{} elements of {} are not whole blocks of {}", elements, traits->name,
                          traits->block_size);
  switch (type) {
    case GgmlType::kF32:
      std::memcpy(out, source, static_cast<size_t>(elements) * 4);
      return Status::Ok();
    case GgmlType::kF16:
      for (int64_t i = 0; i < elements; ++i)
        out[i] = GgmlHalfToF32(Load16(source + 2 * i));
      return Status::Ok();
    case GgmlType::kBF16:
      for (int64_t i = 0; i < elements; ++i)
        out[i] = BF16ToF32(Load16(source + 2 * i));
      return Status::Ok();
    default:
      break;
  }
  const BlockDecoder decode = DecoderFor(type);
  const int64_t blocks = elements / traits->block_size;
  for (int64_t b = 0; b < blocks; ++b)
    decode(source + b * traits->block_bytes, out + b * traits->block_size);
  return Status::Ok();
}

std::optional<GgmlIntegerLayout> GgmlIntegerForm(GgmlType type) {
  switch (type) {
    case GgmlType::kQ4_0:
      return GgmlIntegerLayout{32, 4, true, 8, true};
    case GgmlType::kQ4_1:
      return GgmlIntegerLayout{32, 4, false, 0, true};
    case GgmlType::kQ5_0:
      return GgmlIntegerLayout{32, 5, true, 16, true};
    case GgmlType::kQ5_1:
      return GgmlIntegerLayout{32, 5, false, 0, true};
    case GgmlType::kQ8_0:
      return GgmlIntegerLayout{32, 8, true, 128, true};
    case GgmlType::kQ2_K:
      return GgmlIntegerLayout{16, 2, false, 0, false};
    case GgmlType::kQ3_K:
      return GgmlIntegerLayout{16, 3, true, 4, false};
    case GgmlType::kQ4_K:
      return GgmlIntegerLayout{32, 4, false, 0, false};
    case GgmlType::kQ5_K:
      return GgmlIntegerLayout{32, 5, false, 0, false};
    case GgmlType::kQ6_K:
      return GgmlIntegerLayout{16, 6, true, 32, false};
    case GgmlType::kHfInt4:
      return GgmlIntegerLayout{kHfInt4GroupCols, 4, false, 0, false};
    default:
      return std::nullopt;
  }
}

void DecodeGgmlIntegerBlock(GgmlType type, const uint8_t* block, GgmlIntegerBlock* out) {
  // The byte layouts are the dequantizers' above; only the arithmetic is left to the caller.
  auto unit = [&](int subs, int16_t min) {
    for (int j = 0; j < subs; ++j)
      out->sc[j] = 1, out->mn[j] = min;
  };
  switch (type) {
    case GgmlType::kQ4_0:
    case GgmlType::kQ4_1: {
      const bool offset = type == GgmlType::kQ4_0;
      out->d = Load16(block);
      out->dmin = offset ? out->d : static_cast<uint16_t>(Load16(block + 2) ^ 0x8000u);
      const uint8_t* qs = block + (offset ? 2 : 4);
      for (int i = 0; i < 16; ++i)
        out->q[i] = qs[i] & 0x0f, out->q[i + 16] = qs[i] >> 4;
      unit(1, offset ? 8 : 1);
      return;
    }
    case GgmlType::kQ5_0:
    case GgmlType::kQ5_1: {
      const bool offset = type == GgmlType::kQ5_0;
      out->d = Load16(block);
      out->dmin = offset ? out->d : static_cast<uint16_t>(Load16(block + 2) ^ 0x8000u);
      const uint32_t qh = Load32(block + (offset ? 2 : 4));
      const uint8_t* qs = block + (offset ? 6 : 8);
      for (int i = 0; i < 16; ++i) {
        out->q[i] = static_cast<uint8_t>((qs[i] & 0x0f) | ((qh >> i) & 1u) << 4);
        out->q[i + 16] = static_cast<uint8_t>((qs[i] >> 4) | ((qh >> (i + 16)) & 1u) << 4);
      }
      unit(1, offset ? 16 : 1);
      return;
    }
    case GgmlType::kQ8_0:
      out->d = out->dmin = Load16(block);
      for (int i = 0; i < 32; ++i)
        out->q[i] = static_cast<uint8_t>(block[2 + i] ^ 0x80u);  // int8 + 128
      unit(1, 128);
      return;
    case GgmlType::kQ2_K: {
      const uint8_t* scales = block;
      const uint8_t* qs = block + 16;
      out->d = Load16(block + 80);
      out->dmin = Load16(block + 82);
      for (int j = 0; j < 16; ++j)
        out->sc[j] = static_cast<int8_t>(scales[j] & 0x0f), out->mn[j] = scales[j] >> 4;
      for (int e = 0; e < kQK; ++e)
        out->q[e] = (qs[(e / 128) * 32 + e % 32] >> (2 * ((e % 128) / 32))) & 3;
      return;
    }
    case GgmlType::kQ3_K: {
      const uint8_t* hmask = block;
      const uint8_t* qs = block + 32;
      const uint8_t* packed = block + 96;
      out->d = out->dmin = Load16(block + 108);
      for (int j = 0; j < 16; ++j) {
        const int low = (packed[j % 8] >> (4 * (j / 8))) & 0x0f;
        const int high = (packed[8 + j % 4] >> (2 * (j / 4))) & 3;
        out->sc[j] = static_cast<int8_t>((low | high << 4) - 32);
        out->mn[j] = static_cast<int16_t>(4 * out->sc[j]);  // q − 4 with q = low + 4 · high
      }
      for (int e = 0; e < kQK; ++e) {
        const int low = (qs[(e / 128) * 32 + e % 32] >> (2 * ((e % 128) / 32))) & 3;
        const int high = (hmask[e % 32] >> (e / 32)) & 1;
        out->q[e] = static_cast<uint8_t>(low | high << 2);
      }
      return;
    }
    case GgmlType::kQ4_K:
    case GgmlType::kQ5_K: {
      const bool five = type == GgmlType::kQ5_K;
      out->d = Load16(block);
      out->dmin = Load16(block + 2);
      const uint8_t* packed = block + 4;
      const uint8_t* qh = block + 16;
      const uint8_t* qs = block + (five ? 48 : 16);
      for (int j = 0; j < 8; ++j) {
        int scale, min;
        ScaleMinK4(j, packed, &scale, &min);
        out->sc[j] = static_cast<int8_t>(scale);
        out->mn[j] = static_cast<int16_t>(min);
        const uint8_t* bytes = qs + 32 * (j / 2);
        const int shift = 4 * (j % 2);
        for (int l = 0; l < 32; ++l)
          out->q[32 * j + l] = static_cast<uint8_t>(((bytes[l] >> shift) & 0x0f) |
                                                    (five ? ((qh[l] >> j) & 1) << 4 : 0));
      }
      return;
    }
    case GgmlType::kQ6_K: {
      const uint8_t* ql = block;
      const uint8_t* qh = block + 128;
      const auto* scales = reinterpret_cast<const int8_t*>(block + 192);
      out->d = out->dmin = Load16(block + 208);
      for (int j = 0; j < 16; ++j)
        out->sc[j] = scales[j], out->mn[j] = static_cast<int16_t>(32 * scales[j]);
      for (int e = 0; e < kQK; ++e) {
        const int half = e / 128, g = (e % 128) / 32, l = e % 32;
        const int low = (ql[64 * half + 32 * (g % 2) + l] >> (4 * (g / 2))) & 0x0f;
        const int high = (qh[32 * half + l] >> (2 * g)) & 3;
        out->q[e] = static_cast<uint8_t>(low | high << 4);
      }
      return;
    }
    case GgmlType::kHfInt4: {
      out->d = out->dmin = Load16(block);
      out->sc[0] = 1;
      out->mn[0] = block[2];
      for (int i = 0; i < kHfInt4GroupCols / 2; ++i) {
        out->q[2 * i] = block[4 + i] & 0x0f;
        out->q[2 * i + 1] = block[4 + i] >> 4;
      }
      return;
    }
    default:
      return;
  }
}

}  // namespace sy
