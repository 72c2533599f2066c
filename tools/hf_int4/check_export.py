#!/usr/bin/env python3
"""Checks `switchyard quantize --to awq-int4 | ct-w4a16 | ct-w4a16-asym` against independent
readers and writers (run by hand, through check_export.sh; the suite's int4_export_test checks the
codes through switchyard's own loader):

  awq-int4: every tensor byte for byte, and config.json, as quantize_checkpoint.py writes them
            (AutoAWQ's GEMM packing, followed step by step in numpy).
  ct-w4a16, ct-w4a16-asym: the compressed-tensors library's own decompressor
            (PackedQuantizationCompressor.decompress) turns every packed module back into weights,
            transformers' DeepseekV3ForCausalLM (float32, eager attention) runs on them, and its
            logits must match `switchyard --gguf-dequantize logits` on the written checkpoint
            within float32 rounding. (transformers 4.57 with compressed-tensors 0.20 cannot load
            an asymmetric pack-quantized directory itself: its model skeleton expects the zero
            points unpacked, [out, groups], while the library's compress() and vLLM store them
            packed, [out / 8, groups], as switchyard writes them.)

  With a fourth argument, a calibration text, ct-w4a16 is also written with --calibrate (AWQ's
  scales folded into norms, up projections and the router, which stay dense in f32) and checked
  the same way: transformers must read those tensors as switchyard does.

Usage: check_export.py SWITCHYARD MODEL_DIR WORK_DIR [CALIBRATION_TEXT]
"""
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import torch
from safetensors.torch import load_file

HERE = os.path.dirname(os.path.abspath(__file__))
SEQUENCES = [[5, 100, 200, 300, 400, 500, 600, 700, 800, 900, 1000, 33, 44, 55, 66, 77],
             [9, 8, 7, 6, 5, 4, 3, 2, 1000, 2000, 3000]]


def quantize(switchyard, model, to, out, extra=()):
    shutil.rmtree(out, ignore_errors=True)
    subprocess.run([switchyard, "quantize", "--model", model, "--to", to, "--out", out, *extra],
                   check=True, stderr=subprocess.DEVNULL)


def check_awq(switchyard, model, work):
    ours, theirs = os.path.join(work, "awq-switchyard"), os.path.join(work, "awq-python")
    quantize(switchyard, model, "awq-int4", ours)
    shutil.rmtree(theirs, ignore_errors=True)
    subprocess.run([sys.executable, os.path.join(HERE, "quantize_checkpoint.py"), model, theirs],
                   check=True)
    a = load_file(os.path.join(ours, "model.safetensors"))
    b = load_file(os.path.join(theirs, "model.safetensors"))
    assert set(a) == set(b), set(a) ^ set(b)
    differ = [k for k in a if a[k].dtype != b[k].dtype or a[k].shape != b[k].shape
              or a[k].contiguous().view(torch.uint8).numpy().tobytes()
              != b[k].contiguous().view(torch.uint8).numpy().tobytes()]
    assert not differ, differ[:5]
    ca = json.load(open(os.path.join(ours, "config.json")))
    cb = json.load(open(os.path.join(theirs, "config.json")))
    assert ca == cb, {k: (ca.get(k), cb.get(k)) for k in set(ca) | set(cb) if ca.get(k) != cb.get(k)}
    print(f"awq-int4: {len(a)} tensors and config.json identical to quantize_checkpoint.py's")


def check_ct(switchyard, model, work, to, extra=(), label=None):
    from compressed_tensors.compressors import PackedQuantizationCompressor
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM
    label = label or to
    out = os.path.join(work, label)
    quantize(switchyard, model, to, out, extra)
    config = json.load(open(os.path.join(out, "config.json")))
    weights = QuantizationArgs(**config["quantization_config"]["config_groups"]["group_0"]["weights"])
    scheme = QuantizationScheme(targets=["Linear"], weights=weights)
    packed = load_file(os.path.join(out, "model.safetensors"))
    dense = {k: v.float() for k, v in packed.items() if not k.split(".")[-1].startswith("weight_")}
    modules = sorted({k[: -len(".weight_packed")] for k in packed if k.endswith(".weight_packed")})
    for m in modules:
        state = {k[len(m) + 1:]: v for k, v in packed.items() if k.startswith(m + ".weight_")}
        # Scales as float32: the library then returns s * (q - z) exactly, not rounded to bf16.
        state["weight_scale"] = state["weight_scale"].float()
        dense[m + ".weight"] = PackedQuantizationCompressor.decompress(state, scheme)["weight"].float()
    dense_dir = out + "-decompressed"
    shutil.rmtree(dense_dir, ignore_errors=True)
    os.makedirs(dense_dir)
    save_file({k: v.contiguous() for k, v in dense.items()}, os.path.join(dense_dir, "model.safetensors"))
    del config["quantization_config"]
    json.dump(config, open(os.path.join(dense_dir, "config.json"), "w"))
    hf = AutoModelForCausalLM.from_pretrained(dense_dir, torch_dtype=torch.float32,
                                              attn_implementation="eager").eval()
    worst, agree, rows = 0.0, 0, 0
    for i, ids in enumerate(SEQUENCES):
        with torch.no_grad():
            ref = hf(torch.tensor([ids])).logits[0].float().numpy()
        path = os.path.join(work, f"{label}-{i}.bin")
        subprocess.run([switchyard, "--gguf-dequantize", "logits", "--model", out, "--tokens",
                        ",".join(map(str, ids)), "--out", path], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        got = np.fromfile(path, dtype="<f4").reshape(ref.shape)
        worst = max(worst, float(np.abs(got - ref).max() / np.abs(ref).max()))
        agree += int((got.argmax(1) == ref.argmax(1)).sum())
        rows += ref.shape[0]
    print(f"{label}: {len(modules)} modules; transformers on the library's decompression against switchyard, max |diff| / max |logit| "
          f"{worst:.2e}, argmax {agree}/{rows}")
    assert worst < 1e-4 and agree == rows


def main():
    switchyard, model, work = sys.argv[1:4]
    os.makedirs(work, exist_ok=True)
    torch.set_num_threads(2)
    check_awq(switchyard, model, work)
    for to in ("ct-w4a16", "ct-w4a16-asym"):
        check_ct(switchyard, model, work, to)
    if len(sys.argv) > 4:
        check_ct(switchyard, model, work, "ct-w4a16", ("--calibrate", sys.argv[4]),
                 "ct-w4a16-calibrated")


if __name__ == "__main__":
    main()
