#!/usr/bin/env python3
"""llama.cpp (through llama-cpp-python's C API bindings) on a GGUF: the logits of every position,
or the file quantized by llama.cpp's own quantizer.

  llama_logits.py logits MODEL.gguf TOKENS OUT.bin [THREADS]
      TOKENS as switchyard's `logits --tokens` takes them ('1,2,3;4,5': two sequences, each
      prefilled on its own from position 0); OUT.bin as switchyard's `logits --out` writes it:
      little-endian f32, one row of n_vocab per position, sequences in order.
  llama_logits.py quantize IN.gguf OUT.gguf TYPE [THREADS]
      llama_model_quantize with its defaults (no importance matrix), TYPE as llama-quantize
      names it (Q4_K_M, Q8_0, ...).
"""
import ctypes
import sys

import llama_cpp
import numpy as np


def logits(path, tokens_text, out_path, threads):
    sequences = [[int(t) for t in s.split(",") if t.strip()] for s in tokens_text.split(";") if s.strip()]
    llama_cpp.llama_backend_init()
    model = llama_cpp.llama_model_load_from_file(path.encode(), llama_cpp.llama_model_default_params())
    if not model:
        raise SystemExit(f"llama.cpp could not load {path}")
    longest = max(len(s) for s in sequences)
    params = llama_cpp.llama_context_default_params()
    params.n_ctx = max(64, longest)
    params.n_batch = params.n_ubatch = max(64, longest)
    params.n_seq_max = 1
    params.n_threads = params.n_threads_batch = threads
    n_vocab = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(model))
    rows = []
    for ids in sequences:
        ctx = llama_cpp.llama_init_from_model(model, params)  # an empty cache per sequence
        batch = llama_cpp.llama_batch_init(len(ids), 0, 1)
        batch.n_tokens = len(ids)
        for i, token in enumerate(ids):
            batch.token[i], batch.pos[i], batch.n_seq_id[i] = token, i, 1
            batch.seq_id[i][0] = 0
            batch.logits[i] = 1
        if llama_cpp.llama_decode(ctx, batch) != 0:
            raise SystemExit("llama_decode failed")
        for i in range(len(ids)):
            rows.append(np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx, i), shape=(n_vocab,)).copy())
        llama_cpp.llama_batch_free(batch)
        llama_cpp.llama_free(ctx)
    np.stack(rows).astype("<f4").tofile(out_path)
    llama_cpp.llama_model_free(model)


def quantize(source, target, type_name, threads):
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{type_name.upper()}")
    params.nthread = threads
    if llama_cpp.llama_model_quantize(source.encode(), target.encode(), ctypes.byref(params)) != 0:
        raise SystemExit(f"llama_model_quantize failed on {source}")


def main():
    if len(sys.argv) >= 5 and sys.argv[1] == "logits":
        logits(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]) if len(sys.argv) > 5 else 2)
    elif len(sys.argv) >= 5 and sys.argv[1] == "quantize":
        quantize(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]) if len(sys.argv) > 5 else 2)
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main()
