#!/usr/bin/env python3
"""Builds tiny DeepSeek-V3.2 (DSA) checkpoints and records transformers' logits for them.

Each directory under tests/fixtures/ has the layout of tools/gen_fixtures.py's (config.json,
model.safetensors, tokens.txt, logits.bin, meta.json). The reference is transformers'
DeepseekV32ForCausalLM in float32 with eager attention, on exactly the weights the checkpoint
holds. index_topk is small, so most queries attend sparsely (their indexer's top-k keys) and the
choice is really tested.

The keys a query attends to turn on the order of its indexer scores, and switchyard computes
those scores in another order of sums than torch: a seed is kept only where every sparse query's
k-th and (k+1)-th best scores stand apart by MARGIN of the row's largest |score|, in every layer,
in the full forward and in HF's own decode path, so that the test checks the choice and not the
rounding. meta.json records the smallest gap found.

Run through tools/deepseek_v32/make_fixtures.sh, which installs the pinned versions.
"""

import json
import math
import os
import shutil
import sys

import numpy as np
import torch
import transformers
from transformers.models.deepseek_v32 import modeling_deepseek_v32

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from gen_fixtures import (BLOCK, FP8_SUFFIXES, TINY_V3, build_variants,  # noqa: E402
                          init_weights, quantize_fp8, reference_logits, write_checkpoint,
                          write_reference)

# The indexer's projections are stored in fp8 in DeepSeek-V3.2's release, as the attention's are;
# weights_proj stays bf16.
INDEXER_FP8 = ("indexer.wq_b.weight", "indexer.wk.weight")

# tools/gen_fixtures.py's tiny V3 with DeepSeek-V3.2's indexer: 8 heads of 32 (half of it
# rotated), the best 8 keys for each query.
TINY_V32 = dict(TINY_V3, architectures=["DeepseekV32ForCausalLM"], model_type="deepseek_v32",
                index_topk=8, index_head_dim=32, index_n_heads=8)

VARIANTS = {
    "tiny-v32-bf16": (TINY_V32, "bf16", "DSA (index_topk 8 of up to 40 keys), bf16, MTP declared but not stored"),
    "tiny-v32-fp8": (dict(TINY_V32, quantization_config={
        "activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
        "weight_block_size": [BLOCK, BLOCK]}), "fp8",
        "DSA, fp8 e4m3 128x128 blocks (the indexer's wq_b and wk too), MTP tensors with an indexer"),
}

SEQUENCE_LENGTHS = [40, 7, 23]
MARGIN = 1e-4
HF_KEYS = ("vocab_size", "hidden_size", "intermediate_size", "moe_intermediate_size",
           "num_hidden_layers", "first_k_dense_replace", "num_attention_heads",
           "num_key_value_heads", "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim",
           "qk_rope_head_dim", "v_head_dim", "n_routed_experts", "n_group", "topk_group",
           "num_experts_per_tok", "n_shared_experts", "routed_scaling_factor", "norm_topk_prob",
           "hidden_act", "rms_norm_eps", "max_position_embeddings", "attention_bias",
           "tie_word_embeddings", "index_topk", "index_head_dim", "index_n_heads",
           "bos_token_id", "eos_token_id")


def hf_config(config, layers=None):
    kwargs = {k: config[k] for k in HF_KEYS}
    if layers is not None:
        kwargs["num_hidden_layers"] = layers
    rope = {"rope_type": "yarn", "rope_theta": float(config["rope_theta"])}
    rope.update({k: v for k, v in config["rope_scaling"].items() if k != "type"})
    kwargs["rope_parameters"] = rope
    c = transformers.DeepseekV32Config(**kwargs)
    c._attn_implementation = "eager"
    return c


def store(tensors, name, value, storage):
    """The checkpoint's copy of `value` in the variant's storage; returns it as f32."""
    fp8 = storage == "fp8" and (name.endswith(FP8_SUFFIXES) or name.endswith(INDEXER_FP8)) \
        and ".mlp.gate." not in name and "weights_proj" not in name
    if fp8:
        quantized, scales, dequantized = quantize_fp8(value)
        tensors[name] = quantized.contiguous()
        tensors[name + "_scale_inv"] = scales.contiguous()
        return dequantized
    if name.endswith("e_score_correction_bias"):
        tensors[name] = value.to(torch.float32).contiguous()
        return tensors[name].clone()
    tensors[name] = value.to(torch.bfloat16).contiguous()
    return tensors[name].to(torch.float32)


def store_state(tensors, prefix, module, storage):
    """Every tensor of `module` into the checkpoint under DeepSeek's names (experts one by one),
    and the stored values back into the module, so the reference runs on what the file holds."""
    state = module.state_dict()
    for key, value in state.items():
        name = prefix + key
        if key.endswith("experts.gate_up_proj"):
            base = name[: -len("gate_up_proj")]
            width = value.shape[1] // 2
            for e in range(value.shape[0]):
                gate = store(tensors, f"{base}{e}.gate_proj.weight", value[e, :width], storage)
                up = store(tensors, f"{base}{e}.up_proj.weight", value[e, width:], storage)
                value[e].copy_(torch.cat([gate, up]))
        elif key.endswith("experts.down_proj"):
            base = name[: -len("down_proj")]
            for e in range(value.shape[0]):
                value[e].copy_(store(tensors, f"{base}{e}.down_proj.weight", value[e], storage))
        else:
            value.copy_(store(tensors, name, value, storage))


class GapRecorder:
    """Wraps the indexer's top-k to record, for every query with more keys than index_topk, the
    gap between its k-th and (k+1)-th best scores over the row's largest |score|."""

    def __init__(self):
        self.smallest = math.inf
        self.rows = 0

    def __enter__(self):
        original = modeling_deepseek_v32.DeepseekV32Indexer.forward
        recorder = self

        def forward(module, *args, **kwargs):
            topk = torch.Tensor.topk

            def recording(scores, k, *a, **kw):
                visible = torch.isfinite(scores) & (scores > torch.finfo(scores.dtype).min / 2)
                for row, mask in zip(scores.reshape(-1, scores.shape[-1]), visible.reshape(-1, scores.shape[-1])):
                    values = row[mask]
                    if values.numel() <= k:
                        continue
                    ordered = torch.sort(values, descending=True).values
                    scale = values.abs().max().item()
                    recorder.smallest = min(recorder.smallest, (ordered[k - 1] - ordered[k]).item() / scale)
                    recorder.rows += 1
                return topk(scores, k, *a, **kw)

            torch.Tensor.topk = recording
            try:
                return original(module, *args, **kwargs)
            finally:
                torch.Tensor.topk = topk

        self.original = original
        modeling_deepseek_v32.DeepseekV32Indexer.forward = forward
        return self

    def __exit__(self, *exc):
        modeling_deepseek_v32.DeepseekV32Indexer.forward = self.original


def attempt(name, seed):
    config, storage, exercises = VARIANTS[name]
    generator = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    model = transformers.DeepseekV32ForCausalLM(hf_config(config)).float().eval()
    init_weights(model, config, generator)
    tensors = {}
    with torch.no_grad():
        store_state(tensors, "", model, storage)
        if "MTP tensors" in exercises:
            layer = config["num_hidden_layers"]
            block = transformers.DeepseekV32ForCausalLM(hf_config(config, layer + 1)).model.layers[layer]
            wrapper = torch.nn.Module()
            wrapper.layers = torch.nn.ModuleList([block])
            init_weights(wrapper, config, generator)
            prefix = f"model.layers.{layer}."
            store_state(tensors, prefix, block, storage)
            hidden = config["hidden_size"]
            for key in ("enorm.weight", "hnorm.weight", "shared_head.norm.weight"):
                store(tensors, prefix + key, 1.0 + 0.1 * torch.randn(hidden, generator=generator), storage)
            eh_proj = torch.randn(hidden, 2 * hidden, generator=generator) / math.sqrt(2 * hidden)
            tensors[prefix + "eh_proj.weight"] = eh_proj.to(torch.bfloat16)

    rng = np.random.default_rng(seed)
    sequences = [rng.integers(2, config["vocab_size"], size=n).tolist() for n in SEQUENCE_LENGTHS]
    rows, drifts = [], []
    with torch.no_grad(), GapRecorder() as gaps:
        for ids in sequences:
            logits, drift = reference_logits(model, ids)  # the full forward and HF's cache path
            drifts.append(drift)
            rows.append(logits.numpy())
    return tensors, sequences, np.concatenate(rows).astype("<f4"), gaps, max(drifts)


def build(name, out_root, seed):
    config, storage, exercises = VARIANTS[name]
    for tries in range(200):
        tensors, sequences, logits, gaps, drift = attempt(name, seed + 1000 * tries)
        if gaps.smallest >= MARGIN:
            # Away from near ties, HF's decode path must agree with its full forward.
            assert drift <= 1e-4, f"HF cache drift {drift} of the largest logit"
            break
        print(f"{name}: seed {seed + 1000 * tries}: smallest gap {gaps.smallest:.2e}, another seed")
    else:
        raise SystemExit(f"{name}: no seed with every top-k gap over {MARGIN}")
    seed += 1000 * tries
    directory = os.path.join(out_root, name)
    shutil.rmtree(directory, ignore_errors=True)
    os.makedirs(directory)
    write_checkpoint(directory, tensors, 1)
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    meta = write_reference(directory, config, logits, sequences, "DeepseekV32ForCausalLM", seed,
                           storage, exercises, sparse_query_rows=gaps.rows,
                           smallest_topk_gap=gaps.smallest)
    print(f"{name}: seed {seed}, {meta['rows']} rows, {gaps.rows} sparse query rows, "
          f"smallest top-k gap {gaps.smallest:.2e}, max |logit| {meta['max_abs_logit']:.3f}")


def main():
    build_variants(__doc__, VARIANTS, build, 3200)


if __name__ == "__main__":
    main()
