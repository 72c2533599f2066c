// GGML block encoders (ggml_quants.h: EncodeGgml). Compiled with -ffp-contract=off (CMakeLists):
// every product and sum is rounded to float on its own, as numpy rounds them, so the blocks are
// the bits gguf-py (Q8_0, Q5_0) and tools/gguf/make_default_gguf.py (Q4_K, Q6_K) write.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "tensor/dtype.h"
#include "tensor/ggml_quants.h"

namespace sy {
namespace {

void PutHalf(uint16_t bits, uint8_t* out) {
  std::memcpy(out, &bits, 2);
}

// The float32 value of a float16 (numpy's x.astype(float16).astype(float32)).
float ThroughHalf(float x) {
  return F16ToF32(F32ToF16(x));
}

// gguf-py's np_roundf (ggml's roundf: halves away from zero), in float32 steps.
float RoundHalfAway(float n) {
  const float a = std::fabs(n);
  const float floored = std::floor(a);
  const float b = floored + std::floor(2.0f * (a - floored));
  return n > 0 ? b : n < 0 ? -b : 0.0f * b;
}

// 32 values: d = max|x| / 127 as a half, codes round(x / d) (gguf-py's Q8_0, ggml's reference).
void EncodeQ8_0(const float* x, uint8_t* out) {
  float amax = 0;
  for (int i = 0; i < 32; ++i)
    amax = std::max(amax, std::fabs(x[i]));
  const float d = amax / 127.0f;
  const float id = d == 0 ? 0.0f : 1.0f / d;
  PutHalf(F32ToF16(d), out);
  for (int i = 0; i < 32; ++i)
    out[2 + i] = static_cast<uint8_t>(static_cast<int8_t>(RoundHalfAway(x[i] * id)));
}

// 32 values: d = (the value of largest magnitude) / −16, codes trunc(x / d + 16.5) clipped to 31
// (gguf-py's Q5_0): the low nibbles of elements i and i + 16 in byte i, the fifth bits in qh.
void EncodeQ5_0(const float* x, uint8_t* out) {
  int pick = 0;
  for (int i = 1; i < 32; ++i)
    if (std::fabs(x[i]) > std::fabs(x[pick])) pick = i;  // the first of equals, as argmax
  const float d = x[pick] / -16.0f;
  const float id = d == 0 ? 0.0f : 1.0f / d;
  uint8_t q[32];
  for (int i = 0; i < 32; ++i) {
    const float t = std::trunc(x[i] * id + 16.5f);
    q[i] = static_cast<uint8_t>(std::clamp(t, 0.0f, 31.0f));
  }
  PutHalf(F32ToF16(d), out);
  uint32_t qh = 0;
  for (int i = 0; i < 32; ++i)
    qh |= static_cast<uint32_t>(q[i] >> 4) << i;
  std::memcpy(out + 2, &qh, 4);
  for (int i = 0; i < 16; ++i)
    out[6 + i] = static_cast<uint8_t>((q[i] & 15) | ((q[i + 16] & 15) << 4));
}

// 256 values as Q4_K by round to nearest: per 32 a scale (max − min) / 15 and a min ≤ 0, both as
// 6-bit multiples of the block's half-precision d and dmin.
void EncodeQ4_K(const float* x, uint8_t* out) {
  float low[8], scale[8];
  for (int j = 0; j < 8; ++j) {
    float lo = x[32 * j], hi = x[32 * j];
    for (int i = 1; i < 32; ++i) {
      lo = std::min(lo, x[32 * j + i]);
      hi = std::max(hi, x[32 * j + i]);
    }
    low[j] = std::min(lo, 0.0f);
    scale[j] = (hi - low[j]) / 15.0f;
  }
  float max_scale = scale[0], max_min = -low[0];
  for (int j = 1; j < 8; ++j) {
    max_scale = std::max(max_scale, scale[j]);
    max_min = std::max(max_min, -low[j]);
  }
  const float d = ThroughHalf(max_scale / 63.0f), dmin = ThroughHalf(max_min / 63.0f);
  uint8_t sc[8], mn[8], q[256];
  for (int j = 0; j < 8; ++j) {
    sc[j] =
        static_cast<uint8_t>(std::clamp(d > 0 ? std::nearbyint(scale[j] / d) : 0.0f, 0.0f, 63.0f));
    mn[j] = static_cast<uint8_t>(
        std::clamp(dmin > 0 ? std::nearbyint(-low[j] / dmin) : 0.0f, 0.0f, 63.0f));
    const float step = d * static_cast<float>(sc[j]);
    const float offset = dmin * static_cast<float>(mn[j]);
    for (int i = 0; i < 32; ++i) {
      const float v = step > 0 ? RoundEven((x[32 * j + i] + offset) / step) : 0.0f;
      q[32 * j + i] = static_cast<uint8_t>(std::clamp(v, 0.0f, 15.0f));
    }
  }
  PutHalf(F32ToF16(d), out);
  PutHalf(F32ToF16(dmin), out + 2);
  uint8_t* s = out + 4;  // ggml's 12-byte packing of eight 6-bit scales and mins
  for (int j = 0; j < 4; ++j) {
    s[j] = static_cast<uint8_t>((sc[j] & 63) | ((sc[j + 4] >> 4) << 6));
    s[j + 4] = static_cast<uint8_t>((mn[j] & 63) | ((mn[j + 4] >> 4) << 6));
    s[j + 8] = static_cast<uint8_t>((sc[j + 4] & 15) | ((mn[j + 4] & 15) << 4));
  }
  for (int p = 0; p < 4; ++p)  // 64 values per 32 bytes: sub-block 2p low nibbles, 2p + 1 high
    for (int l = 0; l < 32; ++l)
      out[16 + 32 * p + l] = static_cast<uint8_t>(q[64 * p + l] | (q[64 * p + 32 + l] << 4));
}

// 256 values as Q6_K by round to nearest: per 16 a signed 8-bit scale (the value of largest
// magnitude / −32, as a multiple of the block's half-precision d), codes q + 32 in 6 bits.
void EncodeQ6_K(const float* x, uint8_t* out) {
  float scale[16];
  float max_abs = 0;
  for (int j = 0; j < 16; ++j) {
    int pick = 0;
    for (int i = 1; i < 16; ++i)
      if (std::fabs(x[16 * j + i]) > std::fabs(x[16 * j + pick])) pick = i;
    scale[j] = x[16 * j + pick] / -32.0f;
    max_abs = std::max(max_abs, std::fabs(scale[j]));
  }
  const float d = ThroughHalf(max_abs / 127.0f);
  int8_t sc[16];
  uint8_t q[256];
  for (int j = 0; j < 16; ++j) {
    sc[j] = static_cast<int8_t>(
        std::clamp(d > 0 ? std::nearbyint(scale[j] / d) : 0.0f, -128.0f, 127.0f));
    const float step = d * static_cast<float>(sc[j]);
    for (int i = 0; i < 16; ++i) {
      const float v = step != 0 ? RoundEven(x[16 * j + i] / step) : 0.0f;
      q[16 * j + i] = static_cast<uint8_t>(std::clamp(v, -32.0f, 31.0f) + 32.0f);
    }
  }
  // ggml's layout per 128-value half h: ql[64h + 32(g % 2) + l] holds column 128h + 32g + l's
  // low nibble (g < 2 low, g ≥ 2 high), qh[32h + l] its top two bits at 2g.
  uint8_t* ql = out;
  uint8_t* qh = out + 128;
  std::memset(out, 0, 192);
  for (int h = 0; h < 2; ++h)
    for (int g = 0; g < 4; ++g)
      for (int l = 0; l < 32; ++l) {
        const uint8_t v = q[128 * h + 32 * g + l];
        ql[64 * h + 32 * (g % 2) + l] |= static_cast<uint8_t>((v & 15) << (4 * (g / 2)));
        qh[32 * h + l] |= static_cast<uint8_t>((v >> 4) << (2 * g));
      }
  std::memcpy(out + 192, sc, 16);
  PutHalf(F32ToF16(d), out + 208);
}

}  // namespace

Status EncodeGgml(GgmlType type, const float* source, int64_t elements, uint8_t* out) {
  const auto traits = GgmlTypeInfo(type);
  if (!traits) return Status::Error("EncodeGgml: an unknown type");
  if (elements % traits->block_size != 0)
    return Status::Errorf("EncodeGgml: {} values are not whole {} blocks of {}", elements,
                          traits->name, traits->block_size);
  const int64_t blocks = elements / traits->block_size;
  void (*encode)(const float*, uint8_t*) = nullptr;
  switch (type) {
    case GgmlType::kQ8_0:
      encode = EncodeQ8_0;
      break;
    case GgmlType::kQ5_0:
      encode = EncodeQ5_0;
      break;
    case GgmlType::kQ4_K:
      encode = EncodeQ4_K;
      break;
    case GgmlType::kQ6_K:
      encode = EncodeQ6_K;
      break;
    default:
      return Status::Errorf("EncodeGgml: {} has no encoder here (Q8_0, Q5_0, Q4_K, Q6_K)",
                            traits->name);
  }
  for (int64_t b = 0; b < blocks; ++b)
    encode(source + b * traits->block_size, out + b * traits->block_bytes);
  return Status::Ok();
}

}  // namespace sy
