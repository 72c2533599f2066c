#!/usr/bin/env python3
"""Converts a switchyard checkpoint (DeepSeek-V3 layout, fp8 or bf16) to a Q8_0 GGUF for llama.cpp.

The fp8 weights are dequantized here (ceil-division block scales, as the spec prescribes) into a
bf16 Hugging Face checkpoint, which llama.cpp's own converter (from the llama-cpp-python sdist on
PyPI, the version pinned in compare.sh) turns into Q8_0, llama.cpp's closest one-byte format.
Synthetic checkpoints have no tokenizer, so the converter's vocabulary step is replaced by a
plain list of `vocab_size` placeholder tokens: the benchmark feeds token ids, never text.

usage: convert_to_gguf.py MODEL_DIR LLAMA_CPP_DIR OUT.gguf
"""
import json
import math
import os
import shutil
import sys
import tempfile

import torch
from safetensors import safe_open
from safetensors.torch import save_file


def dequantized_checkpoint(model_dir, out_dir):
    config = json.load(open(os.path.join(model_dir, "config.json")))
    block = config.get("quantization_config", {}).get("weight_block_size", [128, 128])
    config.pop("quantization_config", None)
    config["torch_dtype"] = "bfloat16"
    tensors = {}
    with safe_open(os.path.join(model_dir, "model.safetensors"), framework="pt") as f:
        names = set(f.keys())
        for name in names:
            if name.endswith("_scale_inv"):
                continue
            value = f.get_tensor(name)
            if value.dtype == torch.float8_e4m3fn:
                scales = f.get_tensor(name + "_scale_inv")
                rows, cols = value.shape
                expanded = scales.repeat_interleave(block[0], 0)[:rows].repeat_interleave(block[1], 1)[:, :cols]
                value = value.to(torch.float32) * expanded
            if value.dtype != torch.float32 or not name.endswith("e_score_correction_bias"):
                value = value.to(torch.bfloat16)
            tensors[name] = value.contiguous()
    save_file(tensors, os.path.join(out_dir, "model.safetensors"))
    json.dump(config, open(os.path.join(out_dir, "config.json"), "w"), indent=2)


def main():
    model_dir, llama_dir, out = sys.argv[1:4]
    sys.path.insert(0, llama_dir)
    sys.path.insert(1, os.path.join(llama_dir, "gguf-py"))
    import gguf
    import convert_hf_to_gguf
    from conversion import deepseek

    def placeholder_vocab(self):
        n = self.hparams["vocab_size"]
        self.gguf_writer.add_tokenizer_model("gpt2")
        self.gguf_writer.add_tokenizer_pre("default")
        self.gguf_writer.add_token_list([f"<t{i}>" for i in range(n)])
        self.gguf_writer.add_token_types([gguf.TokenType.NORMAL] * n)
        self.gguf_writer.add_token_merges(["<t2> <t3>"])  # llama.cpp requires a merges list
        self.gguf_writer.add_bos_token_id(self.hparams.get("bos_token_id", 0))
        self.gguf_writer.add_eos_token_id(self.hparams.get("eos_token_id", 1))

    deepseek.DeepseekV2Model.set_vocab = placeholder_vocab
    with tempfile.TemporaryDirectory() as bf16_dir:
        dequantized_checkpoint(model_dir, bf16_dir)
        sys.argv = ["convert_hf_to_gguf.py", bf16_dir, "--outfile", out, "--outtype", "q8_0"]
        convert_hf_to_gguf.main()


if __name__ == "__main__":
    main()
