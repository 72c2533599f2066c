#include "model/int4_export.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "base/thread_pool.h"
#include "model/calibration.h"
#include "model/config.h"
#include "model/export_common.h"
#include "model/safetensors.h"
#include "model/safetensors_writer.h"
#include "tensor/dtype.h"

namespace sy {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;

// The linear layers of DeepSeek-V2/V3 the formats quantize (the router, `mlp.gate`, is kept).
constexpr const char* kLinearSuffixes[] = {
    "q_a_proj.weight",           "q_b_proj.weight",  "q_proj.weight",
    "kv_a_proj_with_mqa.weight", "kv_b_proj.weight", "o_proj.weight",
    "gate_proj.weight",          "up_proj.weight",   "down_proj.weight"};

bool IsLinear(const std::string& name) {
  for (const char* suffix : kLinearSuffixes)
    if (name.ends_with(suffix)) return true;
  return false;
}

uint16_t ScaleBits(float s, bool f16) {
  return f16 ? F32ToF16(s) : F32ToBF16(s);
}
float ScaleValue(uint16_t bits, bool f16) {
  return f16 ? F16ToF32(bits) : BF16ToF32(bits);
}

// The scale and zero point `scheme` gives a group whose range is [lo, hi] (lo <= 0 <= hi).
void GroupScale(float lo, float hi, Int4Scheme scheme, uint16_t* scale, float* s, int* zero) {
  if (scheme == Int4Scheme::kCtSym) {
    *scale = ScaleBits(std::max(-lo, hi) / 7.5f, false);
    if (ScaleValue(*scale, false) == 0) *scale = ScaleBits(1.0f, false);
    *s = ScaleValue(*scale, false);
    *zero = 8;
  } else if (scheme == Int4Scheme::kCtAsym) {
    *scale = ScaleBits((hi - lo) / 15.0f, false);
    if (ScaleValue(*scale, false) == 0) *scale = ScaleBits(1.0f, false);
    *s = ScaleValue(*scale, false);
    *zero = static_cast<int>(std::clamp(RoundEven(-8.0f - lo / *s), -8.0f, 7.0f)) + 8;
  } else {
    *scale = ScaleBits(std::max(hi - lo, 1e-5f) / 15.0f, true);
    *s = ScaleValue(*scale, true);
    *zero = static_cast<int>(std::clamp(RoundEven(-lo / *s), 0.0f, 15.0f));
    if (scheme == Int4Scheme::kGptq && *zero == 0) {
      // Stored as z − 1, a zero of 0 would read back as 16: use z = 1 and a scale that reaches
      // max at code 15.
      *scale = ScaleBits(std::max(hi, 1e-5f) / 14.0f, true);
      *s = ScaleValue(*scale, true);
      *zero = 1;
    }
  }
}

inline uint8_t Code(float w, float s, int zero) {
  return static_cast<uint8_t>(std::clamp(RoundEven(w / s) + static_cast<float>(zero), 0.0f, 15.0f));
}

// Clipping ranges tried under calibration: the group's largest magnitude times 1, 0.975, ...,
// 0.525 (AutoAWQ's auto_clip grid); the first is round-to-nearest itself.
constexpr int kClipSteps = 20;

void QuantizeGroup(const float* w, const float* importance, Int4Scheme scheme, uint8_t* q,
                   uint8_t* z, uint16_t* scale) {
  float lo = 0, hi = 0;  // the range always holds 0, as the tools' observers make it
  for (int64_t i = 0; i < kInt4Group; ++i) {
    lo = std::min(lo, w[i]);
    hi = std::max(hi, w[i]);
  }
  float s;
  int zero;  // as an unsigned nibble
  GroupScale(lo, hi, scheme, scale, &s, &zero);
  if (importance != nullptr) {
    // The clip that leaves the least importance-weighted squared error, Σ h_j (w_j − ŵ_j)².
    auto error = [&](float scale_value, int zero_point) {
      double sum = 0;
      for (int64_t i = 0; i < kInt4Group; ++i) {
        const float back =
            scale_value * static_cast<float>(int{Code(w[i], scale_value, zero_point)} - zero_point);
        const double d = static_cast<double>(w[i]) - back;
        sum += importance[i] * d * d;
      }
      return sum;
    };
    double best = error(s, zero);
    const float largest = std::max(-lo, hi);
    for (int step = 1; step < kClipSteps; ++step) {
      const float limit = largest * (1.0f - static_cast<float>(step) / (2 * kClipSteps));
      uint16_t candidate_bits;
      float candidate;
      int candidate_zero;
      GroupScale(std::max(lo, -limit), std::min(hi, limit), scheme, &candidate_bits, &candidate,
                 &candidate_zero);
      const double e = error(candidate, candidate_zero);
      if (e < best) {
        best = e;
        *scale = candidate_bits;
        s = candidate;
        zero = candidate_zero;
      }
    }
  }
  *z = static_cast<uint8_t>(zero);
  for (int64_t i = 0; i < kInt4Group; ++i)
    q[i] = Code(w[i], s, zero);
}

// The tensors of a module being written, made once for all of them.
struct PackedModule {
  std::string module;
  std::vector<std::vector<uint8_t>> bytes;  // in PackedLayout's order
};

struct PackedTensor {
  const char* suffix;
  DType dtype;
  std::vector<int64_t> shape;
};

// The tensors a [rows (out), cols (in)] linear layer is stored as, in `scheme`'s format.
std::vector<PackedTensor> PackedLayout(Int4Scheme scheme, int64_t rows, int64_t cols) {
  const int64_t groups = cols / kInt4Group;
  switch (scheme) {
    case Int4Scheme::kAwq:
      return {{".qweight", DType::kI32, {cols, rows / 8}},
              {".qzeros", DType::kI32, {groups, rows / 8}},
              {".scales", DType::kF16, {groups, rows}}};
    case Int4Scheme::kGptq:
      return {{".qweight", DType::kI32, {cols / 8, rows}},
              {".qzeros", DType::kI32, {groups, rows / 8}},
              {".scales", DType::kF16, {groups, rows}},
              {".g_idx", DType::kI32, {cols}}};
    case Int4Scheme::kCtSym:
      return {{".weight_packed", DType::kI32, {rows, cols / 8}},
              {".weight_scale", DType::kBF16, {rows, groups}},
              {".weight_shape", DType::kI64, {2}}};
    case Int4Scheme::kCtAsym:
      return {{".weight_packed", DType::kI32, {rows, cols / 8}},
              {".weight_scale", DType::kBF16, {rows, groups}},
              {".weight_shape", DType::kI64, {2}},
              {".weight_zero_point", DType::kI32, {rows / 8, groups}}};
  }
  return {};
}

void PutWord(std::vector<uint8_t>& bytes, size_t word, uint32_t value) {
  std::memcpy(bytes.data() + 4 * word, &value, 4);
}

std::vector<uint8_t> ScaleBytes(const std::vector<uint16_t>& scales, int64_t rows, int64_t groups,
                                bool transpose) {
  std::vector<uint8_t> bytes(scales.size() * 2);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t g = 0; g < groups; ++g) {
      const size_t at = transpose ? g * rows + r : r * groups + g;
      std::memcpy(bytes.data() + 2 * at, &scales[r * groups + g], 2);
    }
  return bytes;
}

std::vector<std::vector<uint8_t>> Pack(const Int4Codes& c, int64_t rows, int64_t cols,
                                       Int4Scheme scheme) {
  const int64_t groups = cols / kInt4Group;
  std::vector<std::vector<uint8_t>> p;
  auto qv = [&](int64_t r, int64_t col) -> uint32_t { return c.q[r * cols + col]; };
  auto zv = [&](int64_t r, int64_t g) -> uint32_t { return c.z[r * groups + g]; };
  if (scheme == Int4Scheme::kAwq) {
    // qweight [in, out/8]: nibble k of word (i, w) is output 8w + order[k]; qzeros likewise.
    static constexpr int kOrder[8] = {0, 2, 4, 6, 1, 3, 5, 7};
    std::vector<uint8_t> qweight(cols * rows / 2), qzeros(groups * rows / 2);
    ParallelRows(cols, [&](int64_t i) {
      for (int64_t w = 0; w < rows / 8; ++w) {
        uint32_t word = 0;
        for (int k = 0; k < 8; ++k)
          word |= qv(8 * w + kOrder[k], i) << (4 * k);
        PutWord(qweight, i * (rows / 8) + w, word);
      }
    });
    for (int64_t g = 0; g < groups; ++g)
      for (int64_t w = 0; w < rows / 8; ++w) {
        uint32_t word = 0;
        for (int k = 0; k < 8; ++k)
          word |= zv(8 * w + kOrder[k], g) << (4 * k);
        PutWord(qzeros, g * (rows / 8) + w, word);
      }
    p.push_back(std::move(qweight));
    p.push_back(std::move(qzeros));
    p.push_back(ScaleBytes(c.scales, rows, groups, true));
  } else if (scheme == Int4Scheme::kGptq) {
    // qweight [in/8, out]: nibble k of word (r, o) is input 8r + k; qzeros [in/g, out/8]: nibble
    // k of word (g, w) is output 8w + k, stored minus one; g_idx [in] = i / g.
    std::vector<uint8_t> qweight(cols * rows / 2), qzeros(groups * rows / 2), g_idx(cols * 4);
    ParallelRows(cols / 8, [&](int64_t r8) {
      for (int64_t o = 0; o < rows; ++o) {
        uint32_t word = 0;
        for (int k = 0; k < 8; ++k)
          word |= qv(o, 8 * r8 + k) << (4 * k);
        PutWord(qweight, r8 * rows + o, word);
      }
    });
    for (int64_t g = 0; g < groups; ++g)
      for (int64_t w = 0; w < rows / 8; ++w) {
        uint32_t word = 0;
        for (int k = 0; k < 8; ++k)
          word |= ((zv(8 * w + k, g) - 1) & 15u) << (4 * k);
        PutWord(qzeros, g * (rows / 8) + w, word);
      }
    for (int64_t i = 0; i < cols; ++i)
      PutWord(g_idx, i, static_cast<uint32_t>(i / kInt4Group));
    p.push_back(std::move(qweight));
    p.push_back(std::move(qzeros));
    p.push_back(ScaleBytes(c.scales, rows, groups, true));
    p.push_back(std::move(g_idx));
  } else {
    // weight_packed [out, in/8]: nibble k of word (o, w) is input 8w + k; weight_scale [out,
    // in/g]; weight_zero_point [out/8, in/g] (asymmetric): nibble k of word (r, g) is output
    // 8r + k; weight_shape [out, in].
    std::vector<uint8_t> packed(cols * rows / 2), shape(16);
    ParallelRows(rows, [&](int64_t o) {
      for (int64_t w = 0; w < cols / 8; ++w) {
        uint32_t word = 0;
        for (int k = 0; k < 8; ++k)
          word |= qv(o, 8 * w + k) << (4 * k);
        PutWord(packed, o * (cols / 8) + w, word);
      }
    });
    p.push_back(std::move(packed));
    p.push_back(ScaleBytes(c.scales, rows, groups, false));
    const int64_t dims[2] = {rows, cols};
    std::memcpy(shape.data(), dims, 16);
    p.push_back(std::move(shape));
    if (scheme == Int4Scheme::kCtAsym) {
      std::vector<uint8_t> zeros(groups * rows / 2);
      for (int64_t r8 = 0; r8 < rows / 8; ++r8)
        for (int64_t g = 0; g < groups; ++g) {
          uint32_t word = 0;
          for (int k = 0; k < 8; ++k)
            word |= zv(8 * r8 + k, g) << (4 * k);
          PutWord(zeros, r8 * groups + g, word);
        }
      p.push_back(std::move(zeros));
    }
  }
  return p;
}

// A calibration's scales on one tensor [rows, cols] (a norm: one row): columns multiplied by its
// column scales, rows (or a norm's elements) divided by its row divisors; `importance` (the
// columns' input mean squares) divided by s² with the columns, since their inputs are.
void ApplyScales(std::vector<float>& w, int64_t rows, int64_t cols,
                 const std::map<std::string, std::vector<float>>& column_scales,
                 const std::map<std::string, std::vector<float>>& row_divisors,
                 const std::string& name, std::vector<float>* importance) {
  if (auto it = column_scales.find(name); it != column_scales.end()) {
    const std::vector<float>& s = it->second;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c)
        w[r * cols + c] *= s[c];
    if (importance != nullptr)
      for (int64_t c = 0; c < cols; ++c)
        (*importance)[c] /= s[c] * s[c];
  }
  if (auto it = row_divisors.find(name); it != row_divisors.end()) {
    const std::vector<float>& s = it->second;
    if (rows == 1) {  // a norm's weights: element j makes input column j
      for (int64_t c = 0; c < cols; ++c)
        w[c] /= s[c];
    } else {
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c)
          w[r * cols + c] /= s[r];
    }
  }
}

// The projections that share an input, with what produces it (AWQ's scaling groups for
// DeepSeek's layers): input_layernorm → q_a_proj (or q_proj), kv_a_proj_with_mqa;
// q_a_layernorm → q_b_proj; kv_a_layernorm → kv_b_proj; post_attention_layernorm → every gate
// and up projection of the MLP (routed experts, shared, dense) and the router; each up_proj →
// its down_proj. Only tensors present, main layers only (MTP is not calibrated).
struct ScaleGroup {
  std::string producer;
  std::vector<std::string> members;
};
Result<std::vector<ScaleGroup>> ScaleGroups(const Checkpoint& ckpt, const ModelConfig& config) {
  std::vector<ScaleGroup> groups;
  auto add = [&](const std::string& producer, std::vector<std::string> members) {
    if (ckpt.Find(producer) == nullptr) return;
    std::erase_if(members, [&](const std::string& m) { return ckpt.Find(m) == nullptr; });
    if (!members.empty()) groups.push_back({producer, std::move(members)});
  };
  for (int64_t layer = 0; layer < config.num_hidden_layers; ++layer) {
    const std::string p = fmt::format("model.layers.{}.", layer);
    add(p + "input_layernorm.weight",
        {p + "self_attn.q_a_proj.weight", p + "self_attn.q_proj.weight",
         p + "self_attn.kv_a_proj_with_mqa.weight"});
    add(p + "self_attn.q_a_layernorm.weight", {p + "self_attn.q_b_proj.weight"});
    add(p + "self_attn.kv_a_layernorm.weight", {p + "self_attn.kv_b_proj.weight"});
    std::vector<std::string> mlp_inputs = {p + "mlp.gate.weight"};
    for (auto it = ckpt.tensors().lower_bound(p + "mlp.");
         it != ckpt.tensors().end() && it->first.starts_with(p + "mlp."); ++it) {
      const std::string& name = it->first;
      if (name.ends_with(".gate_proj.weight") || name.ends_with(".up_proj.weight"))
        mlp_inputs.push_back(name);
      if (name.ends_with(".down_proj.weight"))
        add(name.substr(0, name.size() - 16) + "up_proj.weight", {name});
    }
    add(p + "post_attention_layernorm.weight", std::move(mlp_inputs));
  }
  // A member's columns must be the producer's width (a norm's elements, an up_proj's rows).
  for (const ScaleGroup& g : groups) {
    const auto& ps = ckpt.Find(g.producer)->entry->shape;
    const int64_t width = ps.empty() ? 1 : ps[0];
    for (const std::string& m : g.members) {
      const auto& ms = ckpt.Find(m)->entry->shape;
      if (ms.size() != 2 || ms[1] != width)
        return Status::Errorf("{}: '{}' does not take '{}' ({} values) as its input",
                              ckpt.directory(), m, g.producer, width);
    }
  }
  return groups;
}

struct TypeInfo {
  const char* name;
  Int4Scheme scheme;
};
constexpr TypeInfo kTypes[] = {{"awq-int4", Int4Scheme::kAwq},
                               {"gptq-int4", Int4Scheme::kGptq},
                               {"ct-w4a16", Int4Scheme::kCtSym},
                               {"ct-w4a16-asym", Int4Scheme::kCtAsym}};

// The quantization_config the format's own tools write, with the modules left as they were.
json QuantizationConfig(Int4Scheme scheme, const std::set<std::string>& skipped) {
  json not_converted = skipped.empty() ? json(nullptr) : json(skipped);
  switch (scheme) {
    case Int4Scheme::kAwq:
      return {{"quant_method", "awq"},    {"bits", 4},
              {"group_size", kInt4Group}, {"zero_point", true},
              {"version", "gemm"},        {"modules_to_not_convert", not_converted}};
    case Int4Scheme::kGptq:
      return {{"quant_method", "gptq"},
              {"bits", 4},
              {"group_size", kInt4Group},
              {"desc_act", false},
              {"sym", false},
              {"checkpoint_format", "gptq"},
              {"modules_to_not_convert", not_converted}};
    default: {
      json ignore = {"lm_head", "re:.*mlp.gate$"};
      for (const std::string& module : skipped)
        ignore.push_back(fmt::format("re:.*{}$", module));
      const bool symmetric = scheme == Int4Scheme::kCtSym;
      return {{"quant_method", "compressed-tensors"},
              {"format", "pack-quantized"},
              {"quantization_status", "compressed"},
              {"kv_cache_scheme", nullptr},
              {"ignore", ignore},
              {"config_groups",
               {{"group_0",
                 {{"targets", {"Linear"}},
                  {"format", "pack-quantized"},
                  {"weights",
                   {{"num_bits", 4},
                    {"type", "int"},
                    {"symmetric", symmetric},
                    {"strategy", "group"},
                    {"group_size", kInt4Group},
                    {"actorder", nullptr},
                    {"dynamic", false},
                    {"observer", "minmax"}}},
                  {"input_activations", nullptr},
                  {"output_activations", nullptr}}}}}};
    }
  }
}

}  // namespace

Int4Codes QuantizeInt4(const float* w, int64_t rows, int64_t cols, Int4Scheme scheme,
                       const float* importance) {
  const int64_t groups = cols / kInt4Group;
  Int4Codes c;
  c.q.resize(static_cast<size_t>(rows * cols));
  c.z.resize(static_cast<size_t>(rows * groups));
  c.scales.resize(static_cast<size_t>(rows * groups));
  ThreadPool::Global().ParallelForIf(
      rows * cols >= (1 << 16), static_cast<size_t>(rows), [&](size_t begin, size_t end) {
        for (size_t r = begin; r < end; ++r)
          for (int64_t g = 0; g < groups; ++g)
            QuantizeGroup(w + r * cols + g * kInt4Group,
                          importance == nullptr ? nullptr : importance + g * kInt4Group, scheme,
                          c.q.data() + r * cols + g * kInt4Group, &c.z[r * groups + g],
                          &c.scales[r * groups + g]);
      });
  return c;
}

std::vector<float> Int4ChannelScales(const float* basis, int64_t cols, int step) {
  // s_j = sqrt(basis_j)^α (the root mean square of column j's inputs), centred so that
  // max · min = 1: α = 0 is all ones.
  const float alpha = static_cast<float>(step) / kInt4ScaleSteps;
  std::vector<float> s(static_cast<size_t>(cols));
  float largest = 0, smallest = 0;
  for (int64_t c = 0; c < cols; ++c) {
    s[c] = std::max(std::pow(std::sqrt(basis[c]), alpha), 1e-4f);
    largest = c == 0 ? s[c] : std::max(largest, s[c]);
    smallest = c == 0 ? s[c] : std::min(smallest, s[c]);
  }
  const float centre = std::sqrt(largest * smallest);
  for (float& v : s)
    v /= centre;
  return s;
}

std::vector<double> Int4ScaleErrors(const float* w, int64_t rows, int64_t cols,
                                    const float* importance, const float* basis,
                                    Int4Scheme scheme) {
  const bool half = scheme == Int4Scheme::kAwq || scheme == Int4Scheme::kGptq;
  std::vector<std::vector<float>> scales(kInt4ScaleSteps);
  for (int step = 0; step < kInt4ScaleSteps; ++step)
    scales[step] = Int4ChannelScales(basis, cols, step);
  // Each row's error at every step, then summed in row order: the same on any thread count.
  std::vector<double> row_errors(static_cast<size_t>(rows * kInt4ScaleSteps), 0.0);
  ThreadPool::Global().ParallelForIf(
      rows * cols >= (1 << 14), static_cast<size_t>(rows), [&](size_t begin, size_t end) {
        std::vector<float> scaled(static_cast<size_t>(cols));
        uint8_t q[kInt4Group], z;
        uint16_t bits;
        for (size_t r = begin; r < end; ++r) {
          const float* row = w + r * cols;
          for (int step = 0; step < kInt4ScaleSteps; ++step) {
            const std::vector<float>& s = scales[step];
            for (int64_t c = 0; c < cols; ++c)
              scaled[c] = row[c] * s[c];
            double error = 0;
            for (int64_t g = 0; g < cols / kInt4Group; ++g) {
              QuantizeGroup(scaled.data() + g * kInt4Group, nullptr, scheme, q, &z, &bits);
              const float scale = ScaleValue(bits, half);
              for (int64_t i = 0; i < kInt4Group; ++i) {
                const int64_t c = g * kInt4Group + i;
                const float back = scale * static_cast<float>(int{q[i]} - int{z}) / s[c];
                const double d = static_cast<double>(row[c]) - back;
                error += importance[c] * d * d;
              }
            }
            row_errors[r * kInt4ScaleSteps + step] = error;
          }
        }
      });
  std::vector<double> errors(kInt4ScaleSteps, 0.0);
  for (int64_t r = 0; r < rows; ++r)
    for (int step = 0; step < kInt4ScaleSteps; ++step)
      errors[step] += row_errors[r * kInt4ScaleSteps + step];
  return errors;
}

std::vector<float> SearchInt4Scales(const float* w, int64_t rows, int64_t cols,
                                    const float* importance, Int4Scheme scheme) {
  const std::vector<double> errors = Int4ScaleErrors(w, rows, cols, importance, importance, scheme);
  const int best =
      static_cast<int>(std::min_element(errors.begin(), errors.end()) - errors.begin());
  return Int4ChannelScales(importance, cols, best);
}

Status ExportInt4Checkpoint(const std::string& model_dir, const std::string& out_dir,
                            const Int4ExportOptions& options) {
  const TypeInfo* type = nullptr;
  for (const TypeInfo& t : kTypes)
    if (options.type == t.name) type = &t;
  if (type == nullptr)
    return Status::Errorf("--to {}: not one of awq-int4, gptq-int4, ct-w4a16, ct-w4a16-asym",
                          options.type);
  const Int4Scheme scheme = type->scheme;
  std::error_code error;
  if (fs::exists(out_dir, error) &&
      (!fs::is_directory(out_dir, error) || !fs::is_empty(out_dir, error)))
    return Status::Errorf("{}: exists and is not an empty directory; name a new one", out_dir);
  SY_ASSIGN_OR_RETURN(ExportSource source, OpenExportSource(model_dir));
  json& raw = source.raw_config;
  const ModelConfig& config = source.config;
  const Checkpoint& ckpt = source.checkpoint;

  SafetensorsWriter writer;
  std::set<std::string> skipped;  // short module names left unquantized
  // Linear layers left unquantized (too small for the groups) by full name, and the short names
  // of those quantized: where a kind is both (a small model's dense down_proj beside its
  // experts'), the list names the unquantized modules whole, since loaders match its entries as
  // substrings of every module's name and "down_proj" would take in the quantized ones too.
  std::vector<std::pair<std::string, std::string>> skipped_linear;  // (module, short name)
  std::set<std::string> quantized_kinds;
  // The packed tensors of the module being written: made when its first tensor is written, the
  // others taken from here (the writer asks for them in order).
  auto current = std::make_shared<PackedModule>();
  auto fits = [](const SafetensorsEntry& e) {
    return e.shape.size() == 2 && e.shape[0] > 0 && e.shape[1] > 0 &&
           e.shape[1] % kInt4Group == 0 && e.shape[0] % 8 == 0;
  };
  // Calibrated: AWQ's per-channel scales, found before anything is written. Each group is the
  // projections one producer feeds — a norm, or an MLP's up_proj for its down_proj — sharing one
  // s: the members' columns are multiplied by s (the quantized ones stored so, an unquantized one
  // such as the MoE router exactly), the producer's elements (a norm) or rows (up_proj) divided.
  std::map<std::string, std::vector<float>> column_scales, row_divisors;
  if (options.importance != nullptr) {
    SY_ASSIGN_OR_RETURN(auto groups, ScaleGroups(ckpt, config));
    for (const ScaleGroup& group : groups) {
      // The basis: the shared input as the member that saw the most rows (every token) has it.
      std::string basis;
      int64_t basis_rows = 0;
      for (const std::string& m : group.members)
        if (auto it = options.importance->rows.find(m);
            it != options.importance->rows.end() && it->second > basis_rows) {
          basis = m;
          basis_rows = it->second;
        }
      if (basis.empty()) continue;
      const int64_t cols = static_cast<int64_t>(options.importance->Find(basis)->size());
      const std::vector<float> floored = options.importance->Weights(basis, cols);
      std::vector<double> errors(kInt4ScaleSteps, 0.0);
      bool any = false;
      for (const std::string& m : group.members) {
        const SafetensorsEntry& e = *ckpt.Find(m)->entry;
        const std::vector<float> h = options.importance->Weights(m, cols);
        if (!fits(e) || e.shape[1] != cols || h.empty()) continue;
        SY_ASSIGN_OR_RETURN(std::vector<float> w, ReadTensorF32(ckpt, config, m));
        const std::vector<double> e_m =
            Int4ScaleErrors(w.data(), e.shape[0], cols, h.data(), floored.data(), scheme);
        for (int k = 0; k < kInt4ScaleSteps; ++k)
          errors[k] += e_m[k];
        any = true;
      }
      const int best =
          static_cast<int>(std::min_element(errors.begin(), errors.end()) - errors.begin());
      if (!any || best == 0) continue;
      std::vector<float> scales = Int4ChannelScales(floored.data(), cols, best);
      for (const std::string& m : group.members)
        column_scales[m] = scales;
      row_divisors[group.producer] = std::move(scales);
    }
  }
  for (const auto& [name, tensor] : ckpt.tensors()) {
    if (name.ends_with("_scale_inv")) continue;
    const SafetensorsEntry& entry = *tensor.entry;
    const std::string h = name;
    const std::string module = name.substr(0, name.size() - std::string(".weight").size());
    const std::string short_name = module.substr(module.find_last_of('.') + 1);
    if (IsLinear(name)) {
      if (entry.shape.size() != 2)
        return Status::Errorf("{}: '{}' is not a matrix", *tensor.file, name);
      const int64_t rows = entry.shape[0], cols = entry.shape[1];
      if (fits(entry)) {
        quantized_kinds.insert(short_name);
        const std::vector<PackedTensor> layout = PackedLayout(scheme, rows, cols);
        for (size_t i = 0; i < layout.size(); ++i)
          SY_RETURN_IF_ERROR(writer.AddTensor(
              module + layout[i].suffix, layout[i].dtype, layout[i].shape,
              [&ckpt, &config, &options, &column_scales, &row_divisors, h, module, rows, cols,
               scheme, current, i](uint8_t* out) -> Status {
                if (current->module != module) {
                  SY_ASSIGN_OR_RETURN(std::vector<float> w, ReadTensorF32(ckpt, config, h));
                  std::vector<float> importance = options.importance
                                                      ? options.importance->Weights(h, cols)
                                                      : std::vector<float>();
                  ApplyScales(w, rows, cols, column_scales, row_divisors, h,
                              importance.empty() ? nullptr : &importance);
                  *current = {module,
                              Pack(QuantizeInt4(w.data(), rows, cols, scheme,
                                                importance.empty() ? nullptr : importance.data()),
                                   rows, cols, scheme)};
                }
                std::memcpy(out, current->bytes[i].data(), current->bytes[i].size());
                return Status::Ok();
              }));
        continue;
      }
      skipped_linear.emplace_back(module, short_name);
    } else if (name.ends_with("eh_proj.weight")) {
      skipped.insert("eh_proj");  // the MTP projection: vLLM keeps it a plain linear layer
    } else {
      // DeepSeek-V3.2's indexer: its choice of keys is only as good as its scores, so its linear
      // layers stay dense (switchyard multiplies them in f32 whatever they hold).
      for (const char* indexer : {"indexer.wq_b", "indexer.wk", "indexer.weights_proj"})
        if (name.ends_with(std::string(".") + indexer + ".weight")) skipped.insert(indexer);
    }
    // Kept as it is; fp8 decoded (times its block scales) to bf16. A norm, router or dense
    // projection a calibration rescaled is written in f32, its scales applied.
    const bool rescaled = column_scales.count(name) != 0 || row_divisors.count(name) != 0;
    const DType dtype = rescaled                        ? DType::kF32
                        : entry.dtype == DType::kF8E4M3 ? DType::kBF16
                                                        : entry.dtype;
    const CheckpointTensor* source = &tensor;
    SY_RETURN_IF_ERROR(writer.AddTensor(
        name, dtype, entry.shape,
        [&ckpt, &config, &column_scales, &row_divisors, h, source, dtype,
         rescaled](uint8_t* out) -> Status {
          if (rescaled) {
            SY_ASSIGN_OR_RETURN(std::vector<float> v, ReadTensorF32(ckpt, config, h));
            const auto& shape = source->entry->shape;
            const int64_t cols = shape.empty() ? 1 : shape.back();
            ApplyScales(v, static_cast<int64_t>(v.size()) / cols, cols, column_scales, row_divisors,
                        h, nullptr);
            std::memcpy(out, v.data(), v.size() * 4);
            return Status::Ok();
          }
          if (source->entry->dtype == dtype) {
            std::memcpy(out, source->data, source->entry->data_end - source->entry->data_begin);
            return Status::Ok();
          }
          SY_ASSIGN_OR_RETURN(std::vector<float> v, ReadTensorF32(ckpt, config, h));
          for (size_t i = 0; i < v.size(); ++i) {
            const uint16_t bits = F32ToBF16(v[i]);
            std::memcpy(out + 2 * i, &bits, 2);
          }
          return Status::Ok();
        }));
  }
  for (const auto& [module, short_name] : skipped_linear)
    skipped.insert(quantized_kinds.count(short_name) ? module : short_name);
  raw["quantization_config"] = QuantizationConfig(scheme, skipped);

  // Everything goes into OUT.partial, renamed when whole: a failed or stopped run leaves no
  // directory a loader would take for a checkpoint.
  const std::string temporary = out_dir + ".partial";
  fs::remove_all(temporary, error);
  if (!fs::create_directories(temporary, error))
    return Status::Errorf("{}: cannot create: {}", temporary, error.message());
  auto write = [&]() -> Status {
    SY_RETURN_IF_ERROR(writer.WriteDirectory(temporary, options.max_shard_bytes, options.progress));
    {
      std::ofstream out(temporary + "/config.json", std::ios::trunc);
      out << raw.dump(2) << "\n";
      if (!out) return Status::Errorf("{}/config.json: write failed", temporary);
    }
    // The tokenizer, generation config, chat template, model code...: every other file.
    for (const auto& file : fs::directory_iterator(model_dir, error)) {
      const std::string base = file.path().filename().string();
      if (!file.is_regular_file() || base == "config.json" || base.ends_with(".safetensors") ||
          base == "model.safetensors.index.json")
        continue;
      if (!fs::copy_file(file.path(), temporary + "/" + base, error))
        return Status::Errorf("{}: cannot copy to {}: {}", file.path().string(), temporary,
                              error.message());
    }
    if (error) return Status::Errorf("{}: cannot list: {}", model_dir, error.message());
    // transformers' named chat templates live in a folder of their own (tool_use.jinja, ...).
    const fs::path named = fs::path(model_dir) / "additional_chat_templates";
    std::error_code absent;
    if (fs::is_directory(named, absent)) {
      fs::copy(named, fs::path(temporary) / "additional_chat_templates",
               fs::copy_options::recursive, error);
      if (error)
        return Status::Errorf("{}: cannot copy to {}: {}", named.string(), temporary,
                              error.message());
    }
    fs::remove(out_dir, error);  // empty, if there
    fs::rename(temporary, out_dir, error);
    if (error)
      return Status::Errorf("{}: cannot rename to {}: {}", temporary, out_dir, error.message());
    return Status::Ok();
  };
  Status s = write();
  if (!s.ok()) fs::remove_all(temporary, error);
  return s;
}

}  // namespace sy
