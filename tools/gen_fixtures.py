#!/usr/bin/env python3
"""Builds tiny DeepSeek checkpoints and records Hugging Face transformers' logits for them.

Each fixture directory under tests/fixtures/ holds:
  config.json, model.safetensors (or shards + model.safetensors.index.json)  - the checkpoint
  tokens.txt   - the input sequences in the CLI's format ("1,2,3;4,5")
  logits.bin   - float32 little-endian [total positions x vocab], sequence after sequence
  meta.json    - versions, shapes and what the fixture exercises

The reference is DeepseekV3ForCausalLM (or DeepseekV2ForCausalLM) in float32 with eager
attention, run on exactly the weights stored in the checkpoint (bf16/f16-rounded, or fp8
dequantized with ceil-division block scales). Run through tools/make_fixtures.sh, which installs
the pinned versions from tools/requirements-fixtures.txt.
"""

import argparse
import json
import math
import os
import shutil

import numpy as np
import torch
import transformers
from safetensors.torch import save_file

BLOCK = 128
# Linear weights DeepSeek stores in fp8 (spec §3.3): every projection except the router.
FP8_SUFFIXES = ("q_a_proj.weight", "q_b_proj.weight", "q_proj.weight", "kv_a_proj_with_mqa.weight",
                "kv_b_proj.weight", "o_proj.weight", "gate_proj.weight", "up_proj.weight",
                "down_proj.weight")

YARN_V3 = {"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096,
           "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0}

# ds3-tiny from the spec (§9.1), with narrower experts to keep the fixtures small.
TINY_V3 = {
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
    "vocab_size": 1000, "hidden_size": 256, "intermediate_size": 512, "moe_intermediate_size": 64,
    "num_hidden_layers": 3, "first_k_dense_replace": 1, "moe_layer_freq": 1,
    "num_attention_heads": 4, "num_key_value_heads": 4,
    "q_lora_rank": 64, "kv_lora_rank": 32,
    "qk_nope_head_dim": 32, "qk_rope_head_dim": 16, "v_head_dim": 24,
    "n_routed_experts": 16, "n_group": 4, "topk_group": 2, "num_experts_per_tok": 4,
    "n_shared_experts": 2, "routed_scaling_factor": 2.5, "norm_topk_prob": True,
    "scoring_func": "sigmoid", "topk_method": "noaux_tc",
    "hidden_act": "silu", "rms_norm_eps": 1e-6, "rope_theta": 10000,
    "rope_scaling": YARN_V3, "max_position_embeddings": 163840,
    "attention_bias": False, "tie_word_embeddings": False,
    "num_nextn_predict_layers": 1,
    "bos_token_id": 0, "eos_token_id": 1, "torch_dtype": "float32",
}

# No q_lora (a single q_proj), plain RoPE, two dense-first layers, 8 experts in 2 groups,
# no renormalization of the top-k weights.
QPROJ_V3 = dict(TINY_V3, **{
    "vocab_size": 512, "hidden_size": 128, "intermediate_size": 320, "moe_intermediate_size": 48,
    "num_hidden_layers": 4, "first_k_dense_replace": 2, "q_lora_rank": None, "kv_lora_rank": 40,
    "qk_nope_head_dim": 24, "qk_rope_head_dim": 8, "v_head_dim": 16, "num_attention_heads": 3,
    "num_key_value_heads": 3, "n_routed_experts": 8, "n_group": 2, "topk_group": 1,
    "num_experts_per_tok": 3, "n_shared_experts": 1, "routed_scaling_factor": 1.5,
    "norm_topk_prob": False, "rope_scaling": None, "max_position_embeddings": 4096,
    "num_nextn_predict_layers": 0,
})

# DeepSeek-V2 style: softmax gate, group score = max, no correction bias.
TINY_V2 = {
    "architectures": ["DeepseekV2ForCausalLM"], "model_type": "deepseek_v2",
    "vocab_size": 512, "hidden_size": 128, "intermediate_size": 320, "moe_intermediate_size": 48,
    "num_hidden_layers": 3, "first_k_dense_replace": 1, "num_attention_heads": 4,
    "num_key_value_heads": 4, "q_lora_rank": None, "kv_lora_rank": 32,
    "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 16,
    "n_routed_experts": 12, "n_group": 4, "topk_group": 2, "num_experts_per_tok": 3,
    "n_shared_experts": 2, "routed_scaling_factor": 4.0, "norm_topk_prob": False,
    "topk_method": "group_limited_greedy", "hidden_act": "silu", "rms_norm_eps": 1e-6,
    "rope_theta": 10000, "rope_scaling": None, "max_position_embeddings": 4096,
    "attention_bias": False, "tie_word_embeddings": False, "bos_token_id": 0, "eos_token_id": 1,
    "torch_dtype": "float32",
}

VARIANTS = {
    # name: (config, storage dtype, shards, what it exercises); MTP tensors are stored only when
    # the description says so (HF's save_pretrained drops them, so both cases occur in practice).
    "tiny-v3-bf16": (TINY_V3, "bf16", 1, "q_lora, YaRN, dense-first, 4 groups, 2 shared experts, bf16, MTP declared but not stored"),
    "tiny-v3-fp8": (dict(TINY_V3, quantization_config={
        "activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
        "weight_block_size": [BLOCK, BLOCK]}), "fp8", 1,
        "fp8 e4m3 with 128x128 block scales, partial edge blocks everywhere, MTP tensors"),
    "tiny-v3-qproj-f16": (QPROJ_V3, "f16", 2, "q_proj without q_lora, RoPE without YaRN, 2 dense-first layers, no renormalization, f16, sharded"),
    "tiny-v2-f32": (TINY_V2, "f32", 1, "DeepSeek-V2 softmax gate with group-limited greedy top-k, f32"),
}

SEQUENCE_LENGTHS = [19, 7, 12]
DECODE_FROM = 5


def hf_classes(model_type):
    if model_type == "deepseek_v3":
        return transformers.DeepseekV3Config, transformers.DeepseekV3ForCausalLM
    return transformers.DeepseekV2Config, transformers.DeepseekV2ForCausalLM


def init_weights(model, config, generator):
    """Spec §9.2: far-from-uniform weights so routing and attention are really tested."""
    hidden = config["hidden_size"]
    for name, param in model.named_parameters():
        shape = param.shape
        if name.endswith("embed_tokens.weight"):
            value = torch.randn(shape, generator=generator)
        elif name.endswith("mlp.gate.weight"):
            value = torch.randn(shape, generator=generator) / math.sqrt(hidden)
        elif name.endswith("k_norm.bias"):  # DeepSeek-V3.2's indexer LayerNorm
            value = 0.1 * torch.randn(shape, generator=generator)
        elif "norm" in name.split(".")[-2] or name.endswith("norm.weight"):
            value = 1.0 + 0.1 * torch.randn(shape, generator=generator)
        elif len(shape) in (2, 3):  # transformers 5 fuses experts: [experts, rows, cols]
            value = torch.randn(shape, generator=generator) / math.sqrt(shape[-1])
        else:
            raise ValueError(f"no init rule for {name}")
        param.data.copy_(value)
    for name, buffer in model.named_buffers():
        if name.endswith("e_score_correction_bias"):
            buffer.copy_(0.1 * torch.rand(buffer.shape, generator=generator))


def quantize_fp8(weight):
    """DeepSeek block quantization: per 128x128 block (partial at the edges) s = amax/448."""
    rows, cols = weight.shape
    scale_rows, scale_cols = math.ceil(rows / BLOCK), math.ceil(cols / BLOCK)
    scales = torch.empty(scale_rows, scale_cols)
    for i in range(scale_rows):
        for j in range(scale_cols):
            block = weight[i * BLOCK:(i + 1) * BLOCK, j * BLOCK:(j + 1) * BLOCK]
            amax = block.abs().max().item()
            scales[i, j] = amax / 448.0 if amax > 0 else 1.0
    expanded = scales.repeat_interleave(BLOCK, 0)[:rows].repeat_interleave(BLOCK, 1)[:, :cols]
    quantized = (weight / expanded).to(torch.float8_e4m3fn)
    dequantized = quantized.to(torch.float32) * expanded  # ceil-division indexing, as the spec says
    return quantized, scales, dequantized


def store(tensors, name, value, storage):
    """Adds `value` to the checkpoint in the variant's storage and returns what the checkpoint
    now holds, as f32, for the reference to use."""
    if storage == "fp8" and name.endswith(FP8_SUFFIXES) and ".mlp.gate." not in name:
        quantized, scales, dequantized = quantize_fp8(value)
        tensors[name] = quantized.contiguous()
        tensors[name + "_scale_inv"] = scales.contiguous()
        return dequantized
    if name.endswith("e_score_correction_bias") or storage == "f32":
        tensors[name] = value.to(torch.float32).contiguous()
        return tensors[name].clone()
    dtype = torch.float16 if storage == "f16" else torch.bfloat16  # fp8 checkpoints keep bf16 here
    tensors[name] = value.to(dtype).contiguous()
    return tensors[name].to(torch.float32)


def mtp_tensors(hf_config, config, model, generator, storage, tensors):
    """An MTP module stored after the last layer, as DeepSeek-V3 ships it (spec §8)."""
    _, model_class = hf_classes(config["model_type"])
    layer_index = config["num_hidden_layers"]
    block_config = transformers.DeepseekV3Config(**dict(hf_config.to_dict(), num_hidden_layers=layer_index + 1))
    block = model_class(block_config).model.layers[layer_index]
    wrapper = torch.nn.Module()
    wrapper.layers = torch.nn.ModuleList([block])
    init_weights(wrapper, config, generator)
    prefix = f"model.layers.{layer_index}."
    for name, value in block.state_dict().items():
        store(tensors, prefix + name, value, storage)
    hidden = config["hidden_size"]
    for name in ("enorm.weight", "hnorm.weight", "shared_head.norm.weight"):
        store(tensors, prefix + name, 1.0 + 0.1 * torch.randn(hidden, generator=generator), storage)
    eh_proj = torch.randn(hidden, 2 * hidden, generator=generator) / math.sqrt(2 * hidden)
    tensors[prefix + "eh_proj.weight"] = eh_proj.to(torch.bfloat16 if storage in ("bf16", "fp8") else torch.float32)


def write_checkpoint(directory, tensors, shards):
    names = sorted(tensors)
    if shards == 1:
        save_file(tensors, os.path.join(directory, "model.safetensors"))
        return
    weight_map = {}
    for shard in range(shards):
        file_name = f"model-{shard + 1:05d}-of-{shards:05d}.safetensors"
        part = {n: tensors[n] for n in names[shard::shards]}
        save_file(part, os.path.join(directory, file_name))
        weight_map.update({n: file_name for n in part})
    with open(os.path.join(directory, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": weight_map}, f, indent=1, sort_keys=True)


def build(name, out_root, seed):
    config, storage, shards, exercises = VARIANTS[name]
    config_class, model_class = hf_classes(config["model_type"])
    hf_kwargs = {k: v for k, v in config.items() if k not in ("architectures", "model_type", "quantization_config", "torch_dtype")}
    hf_config = config_class(**hf_kwargs)
    hf_config._attn_implementation = "eager"
    generator = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    model = model_class(hf_config).float().eval()
    init_weights(model, config, generator)

    tensors = {}
    with torch.no_grad():
        state = model.state_dict()
        for key, value in state.items():
            held = store(tensors, key, value, storage)
            state[key].copy_(held)  # the reference runs on exactly what the checkpoint holds
        if "MTP tensors" in exercises:
            mtp_tensors(hf_config, config, model, generator, storage, tensors)

    directory = os.path.join(out_root, name)
    shutil.rmtree(directory, ignore_errors=True)
    os.makedirs(directory)
    write_checkpoint(directory, tensors, shards)
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(config, f, indent=2)

    rng = np.random.default_rng(seed)
    sequences = [rng.integers(2, config["vocab_size"], size=n).tolist() for n in SEQUENCE_LENGTHS]
    rows = []
    with torch.no_grad():
        for ids in sequences:
            logits, drift = reference_logits(model, ids)
            assert drift <= 1e-4, f"HF cache drift {drift} of the largest logit"
            rows.append(logits.numpy())
    meta = write_reference(directory, config, np.concatenate(rows), sequences, model_class.__name__,
                           seed, storage, exercises)
    print(f"{name}: {meta['rows']} rows, max |logit| {meta['max_abs_logit']:.3f}")


def reference_logits(model, ids):
    """HF's logits for one sequence in one forward, and how far its own cache path (a prefill of
    DECODE_FROM tokens, then one token a step) strays from them, over the largest logit."""
    input_ids = torch.tensor([ids])
    logits = model(input_ids).logits[0].to(torch.float32)
    out = model(input_ids[:, :DECODE_FROM], use_cache=True)
    cache, steps = out.past_key_values, [out.logits[0]]
    for position in range(DECODE_FROM, len(ids)):
        out = model(input_ids[:, position:position + 1], past_key_values=cache, use_cache=True)
        cache = out.past_key_values
        steps.append(out.logits[0])
    drift = (torch.cat(steps) - logits).abs().max().item() / logits.abs().max().item()
    return logits, drift


def write_reference(directory, config, rows, sequences, model_class, seed, storage, exercises, **extra):
    """A fixture's reference files: logits.bin (float32 rows), tokens.txt and meta.json (what made
    them, `extra` fields, the row count, vocabulary size and largest |logit|). Returns the meta."""
    meta = {
        "reference": f"transformers {transformers.__version__} {model_class}, float32, eager attention",
        "torch": torch.__version__,
        "seed": seed,
        "storage": storage,
        "exercises": exercises,
        "sequence_lengths": [len(ids) for ids in sequences],
        "decode_from": DECODE_FROM,
        **extra,
    }
    rows = rows.astype("<f4")
    rows.tofile(os.path.join(directory, "logits.bin"))
    with open(os.path.join(directory, "tokens.txt"), "w") as f:
        f.write(";".join(",".join(str(t) for t in ids) for ids in sequences) + "\n")
    meta = dict(meta, rows=int(rows.shape[0]), vocab_size=config["vocab_size"],
                max_abs_logit=float(np.abs(rows).max()))
    with open(os.path.join(directory, "meta.json"), "w") as f:
        json.dump(meta, f, indent=2)
    return meta


def build_variants(description, variants, build_one, seed):
    """The fixture scripts' command line: builds the named variants (all by default) into --out,
    variant i with seed --seed + i."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures"))
    parser.add_argument("--seed", type=int, default=seed)
    parser.add_argument("variants", nargs="*", default=list(variants))
    args = parser.parse_args()
    torch.set_num_threads(2)
    for index, name in enumerate(args.variants):
        build_one(name, args.out, args.seed + index)


def main():
    build_variants(__doc__, VARIANTS, build, 1234)


if __name__ == "__main__":
    main()
