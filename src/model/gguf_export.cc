#include "model/gguf_export.h"

#include <algorithm>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <sstream>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "base/thread_pool.h"
#include "model/config.h"
#include "model/export_common.h"
#include "model/gguf_model.h"
#include "model/gguf_writer.h"
#include "model/safetensors.h"
#include "tensor/dtype.h"
#include "tensor/matrix.h"

namespace sy {
namespace {

using json = nlohmann::ordered_json;

// llama.cpp's token types (llama_token_type) and file types (llama_ftype).
enum TokenType : int32_t { kNormal = 1, kControl = 3, kUserDefined = 4, kUnused = 5 };

// The tokenizer as llama.cpp's converter writes a byte-level BPE vocabulary (_set_vocab_gpt2 and
// gguf-py's SpecialVocab): every id's spelling (added tokens by content; ids nothing names as
// [PADn], unused), token types, merges as "a b", the special ids tokenizer_config.json names (by
// their added token's content) or config.json gives, the add_*_token flags and the chat template.
Status AddTokenizer(const std::string& dir, const json& config, int64_t vocab_size,
                    const GgufExportOptions& options, GgufWriter& w) {
  SY_ASSIGN_OR_RETURN(json tok, ReadJsonObject(dir + "/tokenizer.json", true));
  SY_ASSIGN_OR_RETURN(json tc, ReadJsonObject(dir + "/tokenizer_config.json", false));
  const json* vocab = tok.contains("model") ? &tok["model"] : nullptr;
  if (vocab == nullptr || !vocab->contains("vocab") || !(*vocab)["vocab"].is_object())
    return Status::Errorf("{}/tokenizer.json: no model.vocab object", dir);
  std::vector<std::string> tokens(static_cast<size_t>(vocab_size));
  std::vector<int32_t> types(static_cast<size_t>(vocab_size), kUnused);
  std::vector<bool> named(static_cast<size_t>(vocab_size), false);
  for (const auto& [text, id] : (*vocab)["vocab"].items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= vocab_size)
      continue;  // the converter keeps ids below vocab_size
    tokens[id.get<size_t>()] = text;
    types[id.get<size_t>()] = kNormal;
    named[id.get<size_t>()] = true;
  }
  const json added = tok.value("added_tokens", json::array());
  for (const json& a : added) {
    if (!a.is_object() || !a.contains("id") || !a["id"].is_number_integer()) continue;
    const int64_t id = a["id"].get<int64_t>();
    if (id < 0 || id >= vocab_size || !a.contains("content") || !a["content"].is_string()) continue;
    tokens[id] = a["content"].get<std::string>();
    types[id] = a.value("special", false) ? kControl : kUserDefined;
    named[id] = true;
  }
  for (int64_t id = 0; id < vocab_size; ++id)
    if (!named[id]) tokens[id] = fmt::format("[PAD{}]", id);
  std::vector<std::string> merges;
  if (vocab->contains("merges") && (*vocab)["merges"].is_array()) {
    for (const json& m : (*vocab)["merges"]) {
      if (m.is_string()) {
        merges.push_back(m.get<std::string>());
      } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
        // A space inside a part is written as U+0120 + 256's neighbour, as gguf-py does.
        auto part = [](const std::string& s) {
          std::string out;
          for (char c : s)
            out += c == ' ' ? std::string("\xc5\xa0") : std::string(1, c);
          return out;
        };
        merges.push_back(part(m[0]) + " " + part(m[1]));
      } else {
        return Status::Errorf("{}/tokenizer.json: model.merges has an entry of neither form", dir);
      }
    }
  }
  w.AddString("tokenizer.ggml.model", "gpt2");
  w.AddString("tokenizer.ggml.pre", "deepseek-v3");
  w.AddStrings("tokenizer.ggml.tokens", std::move(tokens));
  w.AddInt32s("tokenizer.ggml.token_type", std::move(types));
  if (!merges.empty()) w.AddStrings("tokenizer.ggml.merges", std::move(merges));

  static constexpr std::pair<const char*, const char*> kSpecial[] = {
      {"bos", "bos_token_id"},       {"eos", "eos_token_id"},     {"unk", "unknown_token_id"},
      {"sep", "seperator_token_id"}, {"pad", "padding_token_id"}, {"cls", "cls_token_id"},
      {"mask", "mask_token_id"}};
  std::map<std::string, int64_t> ids;
  std::vector<std::string> order;
  auto set = [&](const std::string& typ, std::optional<int64_t> id) {
    if (!id || *id < 0 || *id >= vocab_size || ids.count(typ)) return;
    ids[typ] = *id;
    order.push_back(typ);
  };
  if (tc.is_object()) {
    for (const auto& [typ, key] : kSpecial) {
      const json* entry =
          tc.contains(fmt::format("{}_token", typ)) ? &tc[fmt::format("{}_token", typ)] : nullptr;
      std::string content;
      if (entry && entry->is_string())
        content = entry->get<std::string>();
      else if (entry && entry->is_object() && entry->contains("content") &&
               (*entry)["content"].is_string())
        content = (*entry)["content"].get<std::string>();
      else
        continue;
      for (const json& a : added)
        if (a.is_object() && a.value("content", std::string()) == content && a.contains("id") &&
            a["id"].is_number_integer()) {
          set(typ, a["id"].get<int64_t>());
          break;
        }
    }
  }
  for (const auto& [typ, key] : kSpecial) {
    const std::string k = fmt::format("{}_token_id", typ);
    if (config.contains(k) && config[k].is_number_integer()) set(typ, config[k].get<int64_t>());
  }
  for (const std::string& typ : order)
    for (const auto& [t, key] : kSpecial)
      if (typ == t) w.AddUint32(fmt::format("tokenizer.ggml.{}", key), ids[typ]);
  if (tc.is_object()) {
    for (const auto& [typ, key] : kSpecial) {
      const std::string k = fmt::format("add_{}_token", typ);
      if (tc.contains(k) && tc[k].is_boolean())
        w.AddBool(fmt::format("tokenizer.ggml.add_{}_token", typ), tc[k].get<bool>());
    }
    if (!options.chat_template && tc.contains("chat_template") && tc["chat_template"].is_string())
      w.AddString("tokenizer.chat_template", tc["chat_template"].get<std::string>());
  }
  if (options.chat_template && !options.chat_template->empty())
    w.AddString("tokenizer.chat_template", *options.chat_template);
  if (options.chat_template && !options.tool_use_chat_template.empty()) {
    w.AddString("tokenizer.chat_template.tool_use", options.tool_use_chat_template);
    w.AddStrings("tokenizer.chat_templates", {"tool_use"});
  }
  return Status::Ok();
}

// deepseek2.* as the converter writes them from config.json.
Status AddParameters(const json& c, const ModelConfig& m, GgufWriter& w) {
  auto u32 = [&](const char* key, int64_t v) { w.AddUint32(fmt::format("deepseek2.{}", key), v); };
  auto f32 = [&](const char* key, double v) {
    w.AddFloat32(fmt::format("deepseek2.{}", key), static_cast<float>(v));
  };
  u32("block_count", m.num_hidden_layers);
  u32("context_length", m.max_position_embeddings);
  u32("embedding_length", m.hidden_size);
  u32("feed_forward_length", m.intermediate_size);
  u32("attention.head_count", m.num_attention_heads);
  u32("attention.head_count_kv", 1);  // MLA as MQA, as the converter writes it
  f32("rope.freq_base", m.rope_theta);
  f32("attention.layer_norm_rms_epsilon", m.rms_norm_eps);
  u32("expert_used_count", m.num_experts_per_tok);
  u32("expert_count", m.n_routed_experts);
  u32("leading_dense_block_count", m.first_k_dense_replace);
  u32("vocab_size", m.vocab_size);
  if (m.q_lora_rank) u32("attention.q_lora_rank", *m.q_lora_rank);
  u32("attention.kv_lora_rank", m.kv_lora_rank);
  u32("attention.key_length", m.kv_lora_rank + m.qk_rope_head_dim);
  u32("attention.value_length", m.kv_lora_rank);
  u32("attention.key_length_mla", m.qk_nope_head_dim + m.qk_rope_head_dim);
  u32("attention.value_length_mla", m.v_head_dim);
  u32("expert_feed_forward_length", m.moe_intermediate_size);
  u32("expert_shared_count", m.n_shared_experts);
  f32("expert_weights_scale", m.routed_scaling_factor);
  w.AddBool("deepseek2.expert_weights_norm", m.norm_topk_prob);
  u32("expert_gating_func", m.scoring_func == ScoringFunc::kSigmoid ? 2 : 1);
  u32("expert_group_count", m.n_group);
  u32("expert_group_used_count", c.value("topk_group", int64_t{1}));
  u32("rope.dimension_count", m.qk_rope_head_dim);
  if (m.yarn) {
    w.AddString("deepseek2.rope.scaling.type", "yarn");
    f32("rope.scaling.factor", m.yarn->factor);
    u32("rope.scaling.original_context_length", m.yarn->original_max_position_embeddings);
    const json& rope = c["rope_scaling"];
    if (rope.contains("beta_fast")) f32("rope.scaling.yarn_beta_fast", m.yarn->beta_fast);
    if (rope.contains("beta_slow")) f32("rope.scaling.yarn_beta_slow", m.yarn->beta_slow);
    if (!m.yarn->mscale_all_dim)
      return Status::Error("config.json: rope_scaling of type yarn without mscale_all_dim");
    f32("rope.scaling.yarn_log_multiplier", 0.1 * *m.yarn->mscale_all_dim);
  }
  return Status::Ok();
}

// One GGUF tensor: its name, numpy-order shape, and how to make its float32 values.
// Stacked experts come in slices, one expert each, encoded one at a time: DeepSeek-V3's stack of
// 256 is 15 GB in float32, one expert 59 MB.
struct Planned {
  std::string name;
  std::vector<int64_t> shape;  // outermost first
  std::function<Result<std::vector<float>>(int64_t slice)> values;
  int64_t slices = 1;  // equal parts along the outermost dimension
};

// The tensor type for `name` (the converter's rules, then the target's).
GgmlType ChooseType(const std::string& name, const std::vector<int64_t>& shape,
                    const std::string& type, int64_t layers) {
  const bool keep_f32 = shape.size() == 1 || name.ends_with("_norm.weight") ||
                        name.find(".ffn_gate_inp.") != std::string::npos ||
                        !name.ends_with(".weight");
  GgmlType target = GgmlType::kF32;
  if (!keep_f32) {
    if (type == "f16")
      target = GgmlType::kF16;
    else if (type == "bf16")
      target = GgmlType::kBF16;
    else if (type == "q8_0")
      target = GgmlType::kQ8_0;
    else if (type == "q4_k_mix")
      target = name == "output.weight" || name.find(".attn_output.") != std::string::npos ||
                       name.find("ffn_down") != std::string::npos
                   ? GgmlType::kQ6_K
                   : GgmlType::kQ4_K;
    else if (type == "q4_k_m") {
      target = GgmlType::kQ4_K;
      if (name == "output.weight") target = GgmlType::kQ6_K;
      if (name.starts_with("blk.") && (name.find("ffn_down") != std::string::npos ||
                                       name.find(".attn_v") != std::string::npos)) {
        const int64_t i = ParseNameIndex(name.substr(4, name.find('.', 4) - 4));
        // use_more_bits: the first and last eighth of the layers, and every third between.
        if (i < layers / 8 || i >= 7 * layers / 8 || (i - layers / 8) % 3 == 2)
          target = GgmlType::kQ6_K;
      }
    }
  }
  const int64_t row = shape.back();
  if ((target == GgmlType::kQ4_K || target == GgmlType::kQ6_K) && row % 256 != 0)
    target = target == GgmlType::kQ4_K ? GgmlType::kQ5_0 : GgmlType::kQ8_0;
  if (row % GgmlTypeInfo(target)->block_size != 0) target = GgmlType::kF32;
  return target;
}

Status Encode(GgmlType type, const std::vector<float>& v, uint8_t* out) {
  switch (type) {
    case GgmlType::kF32:
      std::memcpy(out, v.data(), v.size() * 4);
      return Status::Ok();
    case GgmlType::kF16:
    case GgmlType::kBF16:
      for (size_t i = 0; i < v.size(); ++i) {
        const uint16_t bits = type == GgmlType::kF16 ? F32ToF16(v[i]) : F32ToBF16(v[i]);
        std::memcpy(out + 2 * i, &bits, 2);
      }
      return Status::Ok();
    default: {
      // Blocks are independent: spread them over the pool (a DeepSeek-V3 tensor is GBs).
      const auto traits = *GgmlTypeInfo(type);
      const int64_t blocks = static_cast<int64_t>(v.size()) / traits.block_size;
      Status failed;
      std::mutex mutex;
      ThreadPool::Global().ParallelForIf(
          v.size() >= (1 << 16), static_cast<size_t>(blocks), [&](size_t begin, size_t end) {
            Status s = EncodeGgml(type, v.data() + begin * traits.block_size,
                                  static_cast<int64_t>(end - begin) * traits.block_size,
                                  out + begin * traits.block_bytes);
            std::lock_guard<std::mutex> lock(mutex);
            if (!s.ok() && failed.ok()) failed = s;
          });
      return failed;
    }
  }
}

}  // namespace

Status ExportGguf(const std::string& model_dir, const std::string& out,
                  const GgufExportOptions& options) {
  static constexpr const char* kTypes[] = {"f32", "f16", "bf16", "q8_0", "q4_k_m", "q4_k_mix"};
  if (std::find(std::begin(kTypes), std::end(kTypes), options.type) == std::end(kTypes))
    return Status::Errorf("--to {}: not one of f32, f16, bf16, q8_0, q4_k_m, q4_k_mix",
                          options.type);
  if (options.kv_b != "split" && options.kv_b != "fused" && options.kv_b != "both")
    return Status::Errorf("--kv-b {}: not one of split, fused, both", options.kv_b);
  SY_ASSIGN_OR_RETURN(ExportSource source, OpenExportSource(model_dir));
  json& raw = source.raw_config;
  const ModelConfig& config = source.config;
  if (config.has_indexer())
    return Status::Errorf(
        "{}/config.json: model_type deepseek_v32 (DeepSeek-V3.2's sparse attention): llama.cpp's "
        "deepseek2 GGUF has no place for the indexer's tensors; quantize it to int4 "
        "(--to awq-int4, gptq-int4, ct-w4a16) instead",
        model_dir);
  const Checkpoint& ckpt = source.checkpoint;

  GgufWriter w;
  w.AddString("general.architecture", "deepseek2");
  std::string name = model_dir;
  while (name.size() > 1 && name.back() == '/')
    name.pop_back();
  w.AddString("general.name", name.substr(name.find_last_of('/') + 1));
  // The JSON files are read as they come: a value of an unexpected type is an error naming them.
  try {
    SY_RETURN_IF_ERROR(AddTokenizer(model_dir, raw, config.vocab_size, options, w));
  } catch (const json::exception& e) {
    return Status::Errorf("{}/tokenizer.json or tokenizer_config.json: {}", model_dir, e.what());
  }
  const std::map<std::string, uint32_t> file_types = {
      {"f32", 0}, {"f16", 1}, {"q8_0", 7}, {"bf16", 32}, {"q4_k_m", 15}, {"q4_k_mix", 15}};
  w.AddUint32("general.file_type", file_types.at(options.type));
  try {
    SY_RETURN_IF_ERROR(AddParameters(raw, config, w));
  } catch (const json::exception& e) {
    return Status::Errorf("{}/config.json: {}", model_dir, e.what());
  }

  // The converter's order: checkpoint names sorted, kv_b_proj's split pair in its place, the
  // routed experts stacked per (layer, projection) at the end.
  std::vector<Planned> plan;
  std::map<std::pair<int64_t, std::string>, std::vector<std::string>> experts;
  const int64_t H = config.num_attention_heads, dn = config.qk_nope_head_dim,
                dv = config.v_head_dim, r = config.kv_lora_rank;
  for (const auto& [hf, tensor] : ckpt.tensors()) {
    if (hf.ends_with("_scale_inv")) continue;
    int64_t layer = -1;
    if (hf.starts_with("model.layers.")) {
      layer = ParseNameIndex(hf.substr(13, hf.find('.', 13) - 13));
      if (layer < 0) return Status::Errorf("{}: tensor '{}' names no layer", model_dir, hf);
      if (layer >= config.num_hidden_layers) continue;  // MTP: the converter leaves them out
    }
    // A scalar is written as one value, as gguf-py writes a 0-d array.
    const std::vector<int64_t> shape =
        tensor.entry->shape.empty() ? std::vector<int64_t>{1} : tensor.entry->shape;
    const std::string h = hf;
    if (const size_t at = hf.find(".mlp.experts."); at != std::string::npos) {
      const size_t e0 = at + 13, e1 = hf.find('.', e0);
      const int64_t expert = e1 == std::string::npos ? -1 : ParseNameIndex(hf.substr(e0, e1 - e0));
      if (expert < 0 || expert >= config.n_routed_experts)
        return Status::Errorf("{}: tensor '{}' names no expert of {}", model_dir, hf,
                              config.n_routed_experts);
      const std::string proj = hf.substr(e1 + 1, hf.find('.', e1 + 1) - e1 - 1);
      auto& list = experts[{layer, proj}];
      if (static_cast<int64_t>(list.size()) <= expert) list.resize(expert + 1);
      list[expert] = hf;
      continue;
    }
    if (hf.ends_with("kv_b_proj.weight") && options.kv_b != "fused") {
      if (shape != std::vector<int64_t>{H * (dn + dv), r})
        return Status::Errorf("{}: '{}' is not [{}, {}]", model_dir, hf, H * (dn + dv), r);
      const std::string prefix = fmt::format("blk.{}.", layer);
      // attn_k_b: per head W_UK transposed, [H, r, dn]; attn_v_b: W_UV, [H, dv, r].
      plan.push_back({prefix + "attn_k_b.weight",
                      {H, r, dn},
                      [&ckpt, &config, h, H, dn, dv, r](int64_t) -> Result<std::vector<float>> {
                        SY_ASSIGN_OR_RETURN(auto kv, ReadTensorF32(ckpt, config, h));
                        std::vector<float> k(static_cast<size_t>(H * r * dn));
                        for (int64_t head = 0; head < H; ++head)
                          for (int64_t i = 0; i < dn; ++i)
                            for (int64_t c = 0; c < r; ++c)
                              k[(head * r + c) * dn + i] = kv[(head * (dn + dv) + i) * r + c];
                        return k;
                      }});
      plan.push_back({prefix + "attn_v_b.weight",
                      {H, dv, r},
                      [&ckpt, &config, h, H, dn, dv, r](int64_t) -> Result<std::vector<float>> {
                        SY_ASSIGN_OR_RETURN(auto kv, ReadTensorF32(ckpt, config, h));
                        std::vector<float> v(static_cast<size_t>(H * dv * r));
                        for (int64_t head = 0; head < H; ++head)
                          std::copy_n(kv.data() + (head * (dn + dv) + dn) * r, dv * r,
                                      v.data() + head * dv * r);
                        return v;
                      }});
      if (options.kv_b == "split") continue;
    }
    const std::string gguf = GgufTensorName(hf);
    if (gguf.empty()) return Status::Errorf("{}: no GGUF name for tensor '{}'", model_dir, hf);
    plan.push_back(
        {gguf, shape, [&ckpt, &config, h](int64_t) { return ReadTensorF32(ckpt, config, h); }});
  }
  for (const auto& [key, list] : experts) {
    const auto& [layer, proj] = key;
    if (static_cast<int64_t>(list.size()) != config.n_routed_experts ||
        std::count(list.begin(), list.end(), std::string()) != 0)
      return Status::Errorf("{}: layer {} {} has not every one of its {} experts", model_dir, layer,
                            proj, config.n_routed_experts);
    const std::string gguf =
        GgufTensorName(fmt::format("model.layers.{}.mlp.experts.{}.weight", layer, proj));
    if (gguf.empty()) return Status::Errorf("{}: no GGUF name for experts' {}", model_dir, proj);
    std::vector<int64_t> shape = {config.n_routed_experts};
    for (int64_t d : ckpt.Find(list.front())->entry->shape)
      shape.push_back(d);
    for (const std::string& e : list)
      if (ckpt.Find(e)->entry->shape != ckpt.Find(list.front())->entry->shape)
        return Status::Errorf("{}: '{}' is not the shape of '{}'", model_dir, e, list.front());
    plan.push_back(
        {gguf, shape,
         [&ckpt, &config, list](int64_t e) { return ReadTensorF32(ckpt, config, list[e]); },
         config.n_routed_experts});
  }
  for (Planned& p : plan) {
    const GgmlType type = ChooseType(p.name, p.shape, options.type, config.num_hidden_layers);
    std::vector<int64_t> dims(p.shape.rbegin(), p.shape.rend());
    const auto traits = *GgmlTypeInfo(type);
    int64_t elements = 1;
    for (int64_t d : p.shape)
      elements *= d;
    const int64_t slice_bytes = elements / p.slices / traits.block_size * traits.block_bytes;
    auto values = p.values;
    const int64_t slices = p.slices, slice_elements = elements / p.slices;
    SY_RETURN_IF_ERROR(w.AddTensor(
        p.name, dims, type,
        [values, type, slices, slice_elements, slice_bytes](uint8_t* bytes) -> Status {
          for (int64_t i = 0; i < slices; ++i) {
            SY_ASSIGN_OR_RETURN(std::vector<float> v, values(i));
            if (static_cast<int64_t>(v.size()) != slice_elements)
              return Status::Errorf("{} values where {} were expected", v.size(), slice_elements);
            SY_RETURN_IF_ERROR(Encode(type, v, bytes + i * slice_bytes));
          }
          return Status::Ok();
        }));
  }
  return w.Write(out, options.progress);
}

}  // namespace sy
