#!/usr/bin/env python3
"""Writes a `deepseek2` GGUF of a switchyard checkpoint (DeepSeek-V3 layout, fp8 or bf16) the way
llama.cpp's convert_hf_to_gguf.py does, with gguf-py alone (no torch, no transformers):

- tensor names from gguf-py's own TensorNameMap for MODEL_ARCH.DEEPSEEK2 (token_embd,
  blk.N.attn_q_a, attn_kv_a_mqa, ffn_*_exps stacked per layer, ffn_*_shexp, exp_probs_b.bias...);
  kv_b_proj split into attn_k_b (transposed per head) and attn_v_b as the converter does, or kept
  fused as attn_kv_b (--kv-b fused, the layout of older files), or both (--kv-b both);
- the converter's metadata keys (deepseek2.*: lora ranks, MLA key/value lengths, expert counts,
  groups, gating function, YaRN), MTP layers left out as the converter leaves them;
- the tokenizer as _set_vocab_gpt2 writes it: every id's spelling, token types (control for
  special added tokens, user-defined for other added ones, [PADn] unused fillers up to
  vocab_size), and merges, special ids and the chat template from gguf-py's SpecialVocab;
  tokenizer.ggml.pre "deepseek-v3" (the default model's pre-tokenizer is DeepSeek-V3's);
- 1-D tensors and the router in F32 (the converter's rule), the rest in --type; q4_k_mix is
  Q4_K with Q6_K for the head, attention output and down projections (llama.cpp's Q4_K_M in
  spirit), q4_k_m llama.cpp's own Q4_K_M choice per tensor; both by a plain round-to-nearest
  encoder written here, gguf-py having no K-quant encoder.

fp8 weights are dequantized first (weight * its block's scale_inv, in float32).

usage: make_default_gguf.py MODEL_DIR OUT.gguf [--type f32|f16|bf16|q8_0|q4_0|q5_0|q4_k_mix|q4_k_m...]
                           [--kv-b split|fused|both] [--tokenizer-only] [--split-max-tensors N]
"""
import argparse
import json
import os
import struct

import numpy as np
import gguf

T = gguf.GGMLQuantizationType


def read_safetensors(path):
    """name -> float32 array (fp8 e4m3 decoded by table; bf16 widened), without torch."""
    with open(path, "rb") as f:
        header_len = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(header_len))
        base = 8 + header_len
        raw = np.memmap(path, dtype=np.uint8, mode="r")
    e4m3 = np.zeros(256, dtype=np.float32)
    for b in range(256):
        sign, exp, man = b >> 7, (b >> 3) & 15, b & 7
        value = np.nan if (exp == 15 and man == 7) else (
            man * 2.0 ** -9 if exp == 0 else (1 + man / 8) * 2.0 ** (exp - 7))
        e4m3[b] = -value if sign else value
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        data = raw[base + begin: base + end]
        dtype, shape = info["dtype"], info["shape"]
        if dtype == "F32":
            value = data.view(np.float32)
        elif dtype == "BF16":
            value = (data.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
        elif dtype == "F16":
            value = data.view(np.float16).astype(np.float32)
        elif dtype == "F8_E4M3":
            value = e4m3[data]
        else:
            raise ValueError(f"{name}: dtype {dtype} not handled")
        out[name] = value.reshape(shape)
    return out


def dequantize_fp8(tensors, block):
    for name in [n for n in tensors if n.endswith("_scale_inv")]:
        weight_name = name[: -len("_scale_inv")]
        scales = tensors.pop(name)
        weight = tensors[weight_name]
        rows, cols = weight.shape
        expanded = np.repeat(np.repeat(scales, block[0], axis=0)[:rows], block[1], axis=1)[:, :cols]
        tensors[weight_name] = (weight * expanded).astype(np.float32)


def vocab_tokens(model_dir, vocab_size):
    """_set_vocab_gpt2's token list and types, from tokenizer.json."""
    tok = json.load(open(os.path.join(model_dir, "tokenizer.json"), encoding="utf-8"))
    reverse = {i: t for t, i in tok["model"]["vocab"].items()}
    added = {a["id"]: a for a in tok["added_tokens"]}
    for i, a in added.items():
        reverse[i] = a["content"]
    tokens, types = [], []
    for i in range(vocab_size):
        if i not in reverse:
            tokens.append(f"[PAD{i}]")
            types.append(gguf.TokenType.UNUSED)
        elif i in added:
            tokens.append(reverse[i])
            types.append(gguf.TokenType.CONTROL if added[i]["special"] else gguf.TokenType.USER_DEFINED)
        else:
            tokens.append(reverse[i])
            types.append(gguf.TokenType.NORMAL)
    return tokens, types


def add_tokenizer(writer, model_dir, vocab_size):
    tokens, types = vocab_tokens(model_dir, vocab_size)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("deepseek-v3")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    gguf.SpecialVocab(model_dir, load_merges=True, n_vocab=len(tokens)).add_to_gguf(writer, quiet=True)


def add_parameters(writer, c):
    writer.add_block_count(c["num_hidden_layers"])
    writer.add_context_length(c["max_position_embeddings"])
    writer.add_embedding_length(c["hidden_size"])
    writer.add_feed_forward_length(c["intermediate_size"])
    writer.add_head_count(c["num_attention_heads"])
    writer.add_head_count_kv(1)  # MLA as MQA, as the converter writes it
    writer.add_rope_freq_base(c["rope_theta"])
    writer.add_layer_norm_rms_eps(c["rms_norm_eps"])
    writer.add_expert_used_count(c["num_experts_per_tok"])
    writer.add_expert_count(c["n_routed_experts"])
    writer.add_leading_dense_block_count(c["first_k_dense_replace"])
    writer.add_vocab_size(c["vocab_size"])
    if c.get("q_lora_rank") is not None:
        writer.add_q_lora_rank(c["q_lora_rank"])
    writer.add_kv_lora_rank(c["kv_lora_rank"])
    writer.add_key_length(c["kv_lora_rank"] + c["qk_rope_head_dim"])
    writer.add_value_length(c["kv_lora_rank"])
    writer.add_key_length_mla(c["qk_nope_head_dim"] + c["qk_rope_head_dim"])
    writer.add_value_length_mla(c["v_head_dim"])
    writer.add_expert_feed_forward_length(c["moe_intermediate_size"])
    writer.add_expert_shared_count(c["n_shared_experts"])
    writer.add_expert_weights_scale(c["routed_scaling_factor"])
    writer.add_expert_weights_norm(c["norm_topk_prob"])
    writer.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID if c["scoring_func"] == "sigmoid"
                                  else gguf.ExpertGatingFuncType.SOFTMAX)
    writer.add_expert_group_count(c.get("n_group", 1))
    writer.add_expert_group_used_count(c.get("topk_group", 1))
    writer.add_rope_dimension_count(c["qk_rope_head_dim"])
    rope = c.get("rope_scaling")
    if rope and rope.get("type", rope.get("rope_type")) == "yarn":
        writer.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        writer.add_rope_scaling_factor(rope["factor"])
        writer.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
        if "beta_fast" in rope:
            writer.add_rope_scaling_yarn_beta_fast(rope["beta_fast"])
        if "beta_slow" in rope:
            writer.add_rope_scaling_yarn_beta_slow(rope["beta_slow"])
        writer.add_rope_scaling_yarn_log_mul(0.1 * rope["mscale_all_dim"])


def gguf_tensors(tensors, c, kv_b_layout):
    """(gguf name, array) in the converter's layout."""
    n_layers = c["num_hidden_layers"]
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.DEEPSEEK2, n_layers)
    H, dn, dv = c["num_attention_heads"], c["qk_nope_head_dim"], c["v_head_dim"]
    out = []
    experts = {}
    for name in sorted(tensors):
        parts = name.split(".")
        if name.startswith("model.layers.") and int(parts[2]) >= n_layers:
            continue  # MTP layers: the converter skips them
        data = tensors[name]
        if ".mlp.experts." in name:
            layer, expert, proj = int(parts[2]), int(parts[5]), parts[6]
            experts.setdefault((layer, proj), {})[expert] = data
            continue
        if name.endswith("kv_b_proj.weight") and kv_b_layout != "fused":
            kv_b = data.reshape(H, dn + dv, data.shape[-1])
            k_b = np.ascontiguousarray(kv_b[:, :dn, :].transpose(0, 2, 1))
            v_b = np.ascontiguousarray(kv_b[:, dn:, :])
            out.append((names.get_name(name.replace("kv_b_proj", "k_b_proj"), try_suffixes=(".weight",)), k_b))
            out.append((names.get_name(name.replace("kv_b_proj", "v_b_proj"), try_suffixes=(".weight",)), v_b))
            if kv_b_layout == "split":
                continue
        if name.endswith("e_score_correction_bias"):  # as the converter's base.py renames it
            name = name.replace("e_score_correction_bias", "e_score_correction.bias")
        mapped = names.get_name(name, try_suffixes=(".weight", ".bias"))
        if mapped is None:
            raise ValueError(f"no GGUF name for {name}")
        out.append((mapped, data))
    for (layer, proj), by_expert in sorted(experts.items()):
        stacked = np.stack([by_expert[e] for e in range(c["n_routed_experts"])])
        merged = f"model.layers.{layer}.mlp.experts.{proj}.weight"
        out.append((names.get_name(merged, try_suffixes=(".weight",)), stacked))
    return out


def f16_bits(values):
    return np.asarray(values, dtype=np.float16).view(np.uint8).reshape(-1, 2)


def quantize_q4_k(rows):
    """Q4_K blocks by a plain round-to-nearest encoder written here (gguf-py has no K-quant
    quantizer; llama.cpp's search for scales is better): per 32 weights a 6-bit scale and min."""
    blocks = rows.reshape(-1, 8, 32).astype(np.float32)
    low = np.minimum(blocks.min(axis=-1), 0)
    scale = (blocks.max(axis=-1) - low) / 15
    d = (scale.max(axis=-1) / 63).astype(np.float16).astype(np.float32)
    dmin = ((-low).max(axis=-1) / 63).astype(np.float16).astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        sc = np.where(d[:, None] > 0, np.rint(scale / d[:, None]), 0).clip(0, 63).astype(np.uint8)
        mn = np.where(dmin[:, None] > 0, np.rint(-low / dmin[:, None]), 0).clip(0, 63).astype(np.uint8)
        step = (d[:, None] * sc)[..., None]
        q = np.where(step > 0, np.rint((blocks + (dmin[:, None] * mn)[..., None]) / step), 0)
    q = q.clip(0, 15).astype(np.uint8)
    packed = np.zeros((blocks.shape[0], 12), dtype=np.uint8)
    packed[:, 0:4] = (sc[:, 0:4] & 63) | ((sc[:, 4:8] >> 4) << 6)
    packed[:, 4:8] = (mn[:, 0:4] & 63) | ((mn[:, 4:8] >> 4) << 6)
    packed[:, 8:12] = (sc[:, 4:8] & 0xF) | ((mn[:, 4:8] & 0xF) << 4)
    qs = (q[:, 0::2, :] | (q[:, 1::2, :] << 4)).reshape(-1, 128)
    out = np.concatenate([f16_bits(d), f16_bits(dmin), packed, qs], axis=1)
    return out.reshape(*rows.shape[:-1], rows.shape[-1] // 256 * 144)


def quantize_q6_k(rows):
    """Q6_K blocks, round to nearest: per 16 weights a signed 8-bit scale, 6-bit codes."""
    blocks = rows.reshape(-1, 16, 16).astype(np.float32)
    pick = np.take_along_axis(blocks, np.abs(blocks).argmax(axis=-1)[..., None], axis=-1)[..., 0]
    scale = pick / -32
    d = (np.abs(scale).max(axis=-1) / 127).astype(np.float16).astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        sc = np.where(d[:, None] > 0, np.rint(scale / d[:, None]), 0).clip(-128, 127).astype(np.int8)
        step = (d[:, None] * sc)[..., None]
        q = np.where(step != 0, np.rint(blocks / step), 0)
    q = (q.clip(-32, 31) + 32).astype(np.uint8).reshape(-1, 2, 4, 32)  # [half][g][l]
    ql = np.zeros((q.shape[0], 2, 2, 32), dtype=np.uint8)  # [half][g % 2][l]
    for g in range(4):
        ql[:, :, g % 2, :] |= (q[:, :, g, :] & 0xF) << (4 * (g // 2))
    qh = np.zeros((q.shape[0], 2, 32), dtype=np.uint8)
    for g in range(4):
        qh |= (q[:, :, g, :] >> 4) << (2 * g)
    out = np.concatenate([ql.reshape(-1, 128), qh.reshape(-1, 64), sc.view(np.uint8),
                          f16_bits(d)], axis=1)
    return out.reshape(*rows.shape[:-1], rows.shape[-1] // 256 * 210)


# A mix in the spirit of llama.cpp's Q4_K_M: Q6_K for the output head, attention output and the
# down projections, Q4_K for the rest.
def q4_k_mix_type(name):
    if name == "output.weight" or ".attn_output." in name or "ffn_down" in name:
        return T.Q6_K
    return T.Q4_K


# llama.cpp's Q4_K_M rule itself (llama_tensor_get_type): Q6_K for the output head, and for
# attn_v and ffn_down in the layers use_more_bits picks (the first and last eighth, and every
# third between); Q4_K for the rest.
def q4_k_m_type(name, layers):
    if name == "output.weight":
        return T.Q6_K
    if name.startswith("blk.") and ("ffn_down" in name or ".attn_v" in name):
        i = int(name.split(".")[1])
        if i < layers // 8 or i >= 7 * layers // 8 or (i - layers // 8) % 3 == 2:
            return T.Q6_K
    return T.Q4_K


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("model_dir")
    parser.add_argument("out")
    parser.add_argument("--type", default="f32")
    parser.add_argument("--kv-b", choices=["split", "fused", "both"], default="split")
    parser.add_argument("--tokenizer-only", action="store_true")
    parser.add_argument("--split-max-tensors", type=int, default=0,
                        help="shards of at most N tensors, named as llama.cpp names them")
    args = parser.parse_args()
    c = json.load(open(os.path.join(args.model_dir, "config.json")))
    writer = gguf.GGUFWriter(args.out, arch="deepseek2", split_max_tensors=args.split_max_tensors)
    writer.add_name(os.path.basename(os.path.normpath(args.model_dir)))
    add_tokenizer(writer, args.model_dir, c["vocab_size"])
    if not args.tokenizer_only:
        mix = args.type.lower() in ("q4_k_mix", "q4_k_m")
        mix_type = (q4_k_mix_type if args.type.lower() == "q4_k_mix"
                    else lambda name: q4_k_m_type(name, c["num_hidden_layers"]))
        qtype = T.Q4_K if mix else T[args.type.upper()]
        writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_K_M if mix
                             else gguf.LlamaFileType[f"MOSTLY_{qtype.name}"] if qtype != T.F32
                             else gguf.LlamaFileType.ALL_F32)
        add_parameters(writer, c)
        tensors = read_safetensors(os.path.join(args.model_dir, "model.safetensors"))
        dequantize_fp8(tensors, c.get("quantization_config", {}).get("weight_block_size", [128, 128]))
        for name, data in gguf_tensors(tensors, c, args.kv_b):
            data = np.ascontiguousarray(data, dtype=np.float32)
            # The converter's rule: 1-D tensors, norms, biases and the router stay F32.
            keep_f32 = (data.ndim == 1 or name.endswith("_norm.weight") or ".ffn_gate_inp." in name
                        or not name.endswith(".weight"))
            target = T.F32 if keep_f32 else (mix_type(name) if mix else qtype)
            # Rows that are not whole K-quant super-blocks: llama.cpp's quantizer falls back to
            # Q5_0 for Q4_K and Q8_0 for Q6_K.
            if target in (T.Q4_K, T.Q6_K) and data.shape[-1] % 256 != 0:
                target = T.Q5_0 if target == T.Q4_K else T.Q8_0
            if data.shape[-1] % gguf.GGML_QUANT_SIZES[target][0] != 0:
                target = T.F32  # the converter falls back to F16; F32 here
            if target == T.F32:
                writer.add_tensor(name, data)
            elif target == T.F16:
                writer.add_tensor(name, data.astype(np.float16))
            elif target in (T.Q4_K, T.Q6_K):
                encode = quantize_q4_k if target == T.Q4_K else quantize_q6_k
                writer.add_tensor(name, encode(data), raw_dtype=target)
            else:
                writer.add_tensor(name, gguf.quants.quantize(data, target), raw_dtype=target)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


if __name__ == "__main__":
    main()
