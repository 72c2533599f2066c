#!/usr/bin/env python3
"""Builds tiny AWQ, GPTQ and compressed-tensors int4 checkpoints of DeepSeek-V3's layout and
records Hugging Face transformers' logits on their dequantized weights (tests/fixtures/hf-int4).

Each checkpoint directory (awq, gptq, ct-sym, ct-asym) holds:
  config.json        - tools/gen_fixtures.py's tiny V3 shape, widened so every linear layer's
                       input is whole groups of 128, with the format's quantization_config
  model.safetensors  - quantized linear layers in the format's packed int32 tensors; embeddings,
                       lm_head, norms and the router in bf16 (the bias in f32)
  tokens.txt, logits.bin, meta.json - as tools/gen_fixtures.py writes them: DeepseekV3ForCausalLM,
                       float32, eager attention, run on the dequantized weights s * (q - z)
                       (exact in float32)
  dequant.bin        - float32 dequantized weights of the modules dequant.json lists, in order

How each format is packed:
  compressed-tensors: the library itself (PackedQuantizationCompressor.compress, which calls its
    quantize() and pack_to_int32()), and its decompress() must give back the dequantized weights
    recorded here (rounded to bf16, the scales' dtype, as it returns them).
  AWQ and GPTQ: AutoAWQ and auto-gptq need CUDA to install, so their pack code is followed here
    in numpy, step for step: AutoAWQ's WQLinear_GEMM.from_linear (intweight transposed to
    [in, out], eight output columns a word in the order [0, 2, 4, 6, 1, 3, 5, 7], qzeros the same)
    and auto-gptq's QuantLinear.pack (eight input rows a word in order, zeros minus one, eight
    output columns a word). Scales are RTN's: (max - min) / 15 per group, zero round(-min / s),
    as both libraries' quantizers compute them (GPTQ's error feedback changes which codes are
    chosen, not how they are stored).

Run through tools/hf_int4/make_fixtures.sh (pinned versions in requirements.txt).
"""

import argparse
import json
import os
import shutil
import sys

import numpy as np
import torch
import transformers
from safetensors.torch import save_file

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import gen_fixtures as gf  # noqa: E402

GROUP = 128

# tools/gen_fixtures.py's tiny V3 (q_lora, YaRN, a dense first layer, 4 groups of 16 experts, 2
# shared), every projection's input a multiple of 128 and every output a multiple of 8.
TINY_INT4 = dict(gf.TINY_V3, **{
    "intermediate_size": 256, "moe_intermediate_size": 128, "q_lora_rank": 128,
    "kv_lora_rank": 128, "num_attention_heads": 2, "num_key_value_heads": 2,
    "qk_nope_head_dim": 64, "qk_rope_head_dim": 16, "v_head_dim": 64,
    "num_nextn_predict_layers": 0,
})

# Modules whose dequantized weights are recorded for the bit-exact tests.
DEQUANT_MODULES = ["model.layers.0.mlp.down_proj", "model.layers.1.self_attn.kv_a_proj_with_mqa",
                   "model.layers.1.self_attn.o_proj", "model.layers.2.mlp.experts.3.up_proj",
                   "model.layers.2.mlp.shared_experts.gate_proj"]


def quantized(name):
    return name.endswith(gf.FP8_SUFFIXES) and ".mlp.gate." not in name


def rtn_asymmetric(weight):
    """Per row and group of 128 columns: s = (max - min) / 15 in fp16, z = round(-min / s),
    q = clamp(round(w / s) + z, 0, 15). Returns q [out, in], z [out, in/g], s16 [out, in/g]."""
    out, inp = weight.shape
    w = weight.reshape(out, inp // GROUP, GROUP).astype(np.float32)
    lo, hi = np.minimum(w.min(axis=2), 0), np.maximum(w.max(axis=2), 0)
    s = (np.maximum(hi - lo, 1e-5) / 15).astype(np.float16)
    s32 = s.astype(np.float32)
    z = np.clip(np.round(-lo / s32), 0, 15).astype(np.int64)
    q = np.clip(np.round(w / s32[:, :, None]) + z[:, :, None], 0, 15).astype(np.int64)
    return q.reshape(out, inp), z, s


def dequantize(q, z, s):
    out, inp = q.shape
    groups = q.reshape(out, inp // GROUP, GROUP) - z[:, :, None]
    return (s.astype(np.float32)[:, :, None] * groups.astype(np.float32)).reshape(out, inp)


def as_int32(words):
    return torch.from_numpy(np.ascontiguousarray(words.astype(np.uint32)).view(np.int32))


def pack_awq(name, weight, tensors):
    """AutoAWQ WQLinear_GEMM.from_linear."""
    q, z, s = rtn_asymmetric(weight)
    intweight = q.T  # [in, out]
    order = [0, 2, 4, 6, 1, 3, 5, 7]
    qweight = np.zeros((intweight.shape[0], intweight.shape[1] // 8), dtype=np.uint32)
    for col in range(intweight.shape[1] // 8):
        for i in range(8):
            qweight[:, col] |= intweight[:, col * 8 + order[i]].astype(np.uint32) << (i * 4)
    zeros = z.T  # [in/g, out]
    qzeros = np.zeros((zeros.shape[0], zeros.shape[1] // 8), dtype=np.uint32)
    for col in range(zeros.shape[1] // 8):
        for i in range(8):
            qzeros[:, col] |= zeros[:, col * 8 + order[i]].astype(np.uint32) << (i * 4)
    module = name[: -len(".weight")]
    tensors[module + ".qweight"] = as_int32(qweight)
    tensors[module + ".qzeros"] = as_int32(qzeros)
    tensors[module + ".scales"] = torch.from_numpy(np.ascontiguousarray(s.T))
    return dequantize(q, z, s)


def pack_gptq(name, weight, tensors):
    """auto-gptq QuantLinear.pack (checkpoint_format gptq: zeros stored minus one)."""
    q, z, s = rtn_asymmetric(weight)
    intweight = q.T.astype(np.uint32)  # [in, out]
    qweight = np.zeros((intweight.shape[0] // 8, intweight.shape[1]), dtype=np.uint32)
    i, row = 0, 0
    while row < qweight.shape[0]:
        for j in range(i, i + 8):
            qweight[row] |= intweight[j] << (4 * (j - i))
        i += 8
        row += 1
    zeros = (z.T - 1).astype(np.int64).astype(np.uint32)  # a zero point of 0 wraps, as there
    qzeros = np.zeros((zeros.shape[0], zeros.shape[1] // 8), dtype=np.uint32)
    i, col = 0, 0
    while col < qzeros.shape[1]:
        for j in range(i, i + 8):
            qzeros[:, col] |= (zeros[:, j] & 0xF) << (4 * (j - i))
        i += 8
        col += 1
    module = name[: -len(".weight")]
    tensors[module + ".qweight"] = as_int32(qweight)
    tensors[module + ".qzeros"] = as_int32(qzeros)
    tensors[module + ".scales"] = torch.from_numpy(np.ascontiguousarray(s.T))
    tensors[module + ".g_idx"] = torch.arange(weight.shape[1], dtype=torch.int32) // GROUP
    # What the readers (auto-gptq, vLLM) decode: the stored nibble plus one.
    return dequantize(q, (zeros.T & 0xF).astype(np.int64) + 1, s)


def ct_args(symmetric):
    from compressed_tensors.quantization import QuantizationArgs
    return QuantizationArgs(num_bits=4, type="int", symmetric=symmetric, strategy="group",
                            group_size=GROUP)


def pack_ct(symmetric):
    def pack(name, weight, tensors):
        """compressed-tensors' own compressor, on scales and zero points computed as its
        calculate_qparams does (min/max observer: symmetric s = max|w| / 7.5; asymmetric
        s = (max - min) / 15, z = round(-8 - min / s))."""
        from compressed_tensors.compressors import PackedQuantizationCompressor
        from compressed_tensors.quantization import QuantizationScheme
        args = ct_args(symmetric)
        out, inp = weight.shape
        w = torch.from_numpy(weight.astype(np.float32)).to(torch.bfloat16)
        groups = w.float().reshape(out, inp // GROUP, GROUP)
        lo = torch.clamp(groups.amin(dim=2), max=0)
        hi = torch.clamp(groups.amax(dim=2), min=0)
        if symmetric:
            scale = (torch.maximum(-lo, hi) / 7.5).to(torch.bfloat16)
            zero = torch.zeros_like(scale, dtype=torch.int8)
        else:
            scale = ((hi - lo) / 15).to(torch.bfloat16)
            zero = torch.clamp(torch.round(-8 - lo / scale.float()), -8, 7).to(torch.int8)
        scale = torch.where(scale == 0, torch.ones_like(scale), scale)
        scheme = QuantizationScheme(targets=["Linear"], weights=args)
        state = {"weight": w, "weight_scale": scale}
        if not symmetric:
            state["weight_zero_point"] = zero
        packed = PackedQuantizationCompressor.compress(state, scheme)
        module = name[: -len(".weight")]
        for key, value in packed.items():
            tensors[f"{module}.{key}"] = value.contiguous()
        # The dequantized weights, from the packed codes: (q - z) * s, exact in float32 ...
        unpacked = torch.zeros(out, inp, dtype=torch.int64)
        words = packed["weight_packed"].numpy().view(np.uint32).astype(np.int64)
        for k in range(8):
            unpacked[:, k::8] = torch.from_numpy((words >> (4 * k)) & 15) - 8
        zeros = zero.to(torch.int64).repeat_interleave(GROUP, dim=1)
        scales = scale.float().repeat_interleave(GROUP, dim=1)
        exact = (scales * (unpacked - zeros).float()).numpy()
        # ... which the library's own decompressor gives too, up to its rounding to bf16.
        back = PackedQuantizationCompressor.decompress(dict(packed), scheme)["weight"]
        want = torch.from_numpy(exact).to(back.dtype)
        assert torch.equal(back, want), name
        return exact
    return pack


FORMATS = {
    "awq": (pack_awq, {"quant_method": "awq", "bits": 4, "group_size": GROUP, "zero_point": True,
                       "version": "gemm", "modules_to_not_convert": None}),
    "gptq": (pack_gptq, {"quant_method": "gptq", "bits": 4, "group_size": GROUP,
                         "desc_act": False, "sym": False, "checkpoint_format": "gptq",
                         "true_sequential": True, "damp_percent": 0.01}),
    "ct-sym": (pack_ct(True), None),
    "ct-asym": (pack_ct(False), None),
}


def ct_config(symmetric):
    return {
        "quant_method": "compressed-tensors", "format": "pack-quantized",
        "quantization_status": "compressed", "kv_cache_scheme": None,
        "ignore": ["lm_head", "re:.*mlp.gate$"],
        "config_groups": {"group_0": {
            "targets": ["Linear"], "format": "pack-quantized",
            "weights": {"num_bits": 4, "type": "int", "symmetric": symmetric,
                        "strategy": "group", "group_size": GROUP, "actorder": None,
                        "dynamic": False, "observer": "minmax"},
            "input_activations": None, "output_activations": None}},
    }


def build(name, out_root, seed):
    pack, quant_config = FORMATS[name]
    if quant_config is None:
        quant_config = ct_config(name == "ct-sym")
    config = dict(TINY_INT4, quantization_config=quant_config)
    config_class, model_class = gf.hf_classes(config["model_type"])
    hf_kwargs = {k: v for k, v in config.items()
                 if k not in ("architectures", "model_type", "quantization_config", "torch_dtype")}
    hf_config = config_class(**hf_kwargs)
    hf_config._attn_implementation = "eager"
    generator = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    model = model_class(hf_config).float().eval()
    gf.init_weights(model, config, generator)

    tensors, dequantized = {}, {}
    with torch.no_grad():
        state = model.state_dict()
        for key, value in state.items():
            if quantized(key):
                held = torch.from_numpy(pack(key, value.numpy(), tensors))
                dequantized[key[: -len(".weight")]] = held
            else:
                held = gf.store(tensors, key, value, "bf16")
            state[key].copy_(held)  # the reference runs on exactly what the checkpoint holds

    directory = os.path.join(out_root, name)
    shutil.rmtree(directory, ignore_errors=True)
    os.makedirs(directory)
    gf.write_checkpoint(directory, tensors, 1)
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    np.concatenate([dequantized[m].numpy().reshape(-1) for m in DEQUANT_MODULES]).astype(
        "<f4").tofile(os.path.join(directory, "dequant.bin"))
    with open(os.path.join(directory, "dequant.json"), "w") as f:
        json.dump([{"module": m, "shape": list(dequantized[m].shape)} for m in DEQUANT_MODULES],
                  f, indent=1)

    rng = np.random.default_rng(seed)
    sequences = [rng.integers(2, config["vocab_size"], size=n).tolist()
                 for n in gf.SEQUENCE_LENGTHS]
    rows = []
    with torch.no_grad():
        for ids in sequences:
            rows.append(model(torch.tensor([ids])).logits[0].to(torch.float32).numpy())
    all_rows = np.concatenate(rows).astype("<f4")
    all_rows.tofile(os.path.join(directory, "logits.bin"))
    with open(os.path.join(directory, "tokens.txt"), "w") as f:
        f.write(";".join(",".join(str(t) for t in ids) for ids in sequences) + "\n")
    import compressed_tensors
    meta = {
        "reference": f"transformers {transformers.__version__} {model_class.__name__}, float32, "
                     "eager attention, on the dequantized weights",
        "torch": torch.__version__,
        "compressed_tensors": compressed_tensors.__version__,
        "seed": seed,
        "format": name,
        "sequence_lengths": gf.SEQUENCE_LENGTHS,
        "rows": int(all_rows.shape[0]),
        "vocab_size": config["vocab_size"],
        "max_abs_logit": float(np.abs(all_rows).max()),
    }
    with open(os.path.join(directory, "meta.json"), "w") as f:
        json.dump(meta, f, indent=2)
    print(f"{name}: {meta['rows']} rows, max |logit| {meta['max_abs_logit']:.3f}")


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "..",
                                                      "tests", "fixtures", "hf-int4"))
    parser.add_argument("--seed", type=int, default=4321)
    parser.add_argument("formats", nargs="*", default=list(FORMATS))
    args = parser.parse_args()
    torch.set_num_threads(1)
    for name in args.formats:
        build(name, args.out, args.seed + list(FORMATS).index(name))


if __name__ == "__main__":
    main()
