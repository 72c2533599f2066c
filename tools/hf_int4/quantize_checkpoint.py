#!/usr/bin/env python3
"""Writes an AWQ (GEMM layout) int4 copy of a DeepSeek checkpoint directory (fp8 or bf16), for
`switchyard bench accuracy --model OUT --against IN`: every linear layer whose input is whole
groups of 128 columns, packed as make_fixtures.py's pack_awq (AutoAWQ's layout, round-to-nearest
scales); the others (and embeddings, lm_head, the router) stay as they are and are listed in
modules_to_not_convert. Usage: quantize_checkpoint.py IN_DIR OUT_DIR
"""
import json
import os
import shutil
import sys

import numpy as np
import torch
from safetensors.torch import load_file, save_file

sys.path.insert(0, os.path.dirname(__file__))
import make_fixtures as mf  # noqa: E402


def main():
    source, out = sys.argv[1], sys.argv[2]
    config = json.load(open(os.path.join(source, "config.json")))
    block = config.get("quantization_config", {}).get("weight_block_size", [128, 128])
    tensors = load_file(os.path.join(source, "model.safetensors"))
    result, skipped = {}, set()
    for name, value in tensors.items():
        if name.endswith("_scale_inv"):
            continue
        weight = value
        if value.dtype == torch.float8_e4m3fn:
            scales = tensors[name + "_scale_inv"]
            expanded = scales.repeat_interleave(block[0], 0)[: value.shape[0]]
            expanded = expanded.repeat_interleave(block[1], 1)[:, : value.shape[1]]
            weight = value.to(torch.float32) * expanded
        if mf.quantized(name):
            if weight.shape[1] % mf.GROUP == 0 and weight.shape[0] % 8 == 0:
                mf.pack_awq(name, weight.to(torch.float32).numpy(), result)
                continue
            skipped.add(name[: -len(".weight")].split(".")[-1])
        elif name.endswith("eh_proj.weight"):
            skipped.add("eh_proj")  # the MTP projection, kept as it is
        result[name] = weight.to(torch.bfloat16) if weight.dtype != value.dtype else value
        if result[name].dtype == torch.float8_e4m3fn:
            result[name] = weight.to(torch.bfloat16)
    config["quantization_config"] = {"quant_method": "awq", "bits": 4, "group_size": mf.GROUP,
                                     "zero_point": True, "version": "gemm",
                                     "modules_to_not_convert": sorted(skipped) or None}
    os.makedirs(out, exist_ok=True)
    save_file(result, os.path.join(out, "model.safetensors"))
    json.dump(config, open(os.path.join(out, "config.json"), "w"), indent=2)
    for extra in os.listdir(source):
        if extra.startswith("tokenizer") or extra == "generation_config.json":
            shutil.copy(os.path.join(source, extra), out)
    print(f"{out}: left out {sorted(skipped)}")


if __name__ == "__main__":
    main()
