#!/usr/bin/env python3
"""Times llama.cpp (through llama-cpp-python's C API bindings) on a GGUF: prefill tokens per
second for one prompt, and greedy decode tokens per second with N sequences stepping together
in one batch — the same work `switchyard generate` does.

usage: run_llama.py MODEL.gguf SEQUENCES PROMPT_LEN GENERATE THREADS
env:   LLAMA_EXTRA_BUFTS: 1 (llama.cpp's default: its extra CPU buffer types, which repack
       weights for its AMX and AVX-512 kernels) or 0 (plain CPU buffers). On an Intel Xeon with
       AMX, llama.cpp 0.3.36's AMX buffer aborts on the bench GGUF while scheduling the graph
       (GGML_ASSERT(*cur_backend_id != -1)); 0 runs it without them.
prints one JSON line: {"sequences", "prefill_tok_s", "decode_tok_s"}
"""
import ctypes
import json
import os
import sys
import time

import llama_cpp
import numpy as np


def main():
    path, sequences, prompt_len, generate, threads = sys.argv[1], *map(int, sys.argv[2:6])
    llama_cpp.llama_backend_init()
    model_params = llama_cpp.llama_model_default_params()
    model_params.use_extra_bufts = os.environ.get("LLAMA_EXTRA_BUFTS", "1") != "0"
    model = llama_cpp.llama_model_load_from_file(path.encode(), model_params)
    if not model:
        raise SystemExit(f"llama.cpp could not load {path}")
    params = llama_cpp.llama_context_default_params()
    params.n_ctx = sequences * (prompt_len + generate + 8)
    params.n_batch = max(prompt_len * sequences, sequences)
    params.n_ubatch = params.n_batch
    params.n_seq_max = sequences
    params.n_threads = threads
    params.n_threads_batch = threads
    ctx = llama_cpp.llama_init_from_model(model, params)
    vocab = llama_cpp.llama_model_get_vocab(model)
    n_vocab = llama_cpp.llama_vocab_n_tokens(vocab)
    batch = llama_cpp.llama_batch_init(params.n_batch, 0, sequences)

    def submit(entries):  # entries: (token, position, sequence, wants_logits)
        batch.n_tokens = len(entries)
        for i, (token, position, sequence, logits) in enumerate(entries):
            batch.token[i] = token
            batch.pos[i] = position
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = sequence
            batch.logits[i] = 1 if logits else 0
        if llama_cpp.llama_decode(ctx, batch) != 0:
            raise SystemExit("llama_decode failed")

    # The same token ids switchyard's generate gets.
    prompts = [[(s * 131 + i * 17 + 3) % n_vocab for i in range(prompt_len)] for s in range(sequences)]
    start = time.perf_counter()
    submit([(tok, i, s, i == prompt_len - 1) for s in range(sequences) for i, tok in enumerate(prompts[s])])
    prefill = time.perf_counter() - start
    last_index = [(s + 1) * prompt_len - 1 for s in range(sequences)]

    start = time.perf_counter()
    for step in range(generate):
        entries = []
        for s in range(sequences):
            logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx, last_index[s]), shape=(n_vocab,))
            entries.append((int(logits.argmax()), prompt_len + step, s, True))
        submit(entries)
        last_index = list(range(sequences))
    decode = time.perf_counter() - start
    print(json.dumps({"sequences": sequences, "prefill_tok_s": sequences * prompt_len / prefill,
                      "decode_tok_s": sequences * generate / decode}))
    llama_cpp.llama_batch_free(batch)
    llama_cpp.llama_free(ctx)
    llama_cpp.llama_model_free(model)


if __name__ == "__main__":
    main()
