"""lm-evaluation-harness (pinned in requirements.txt) against a server on the trained default
model, as a user points it at any OpenAI-compatible endpoint: loglikelihood (multiple choice),
loglikelihood_rolling (perplexity) and generate_until through `local-completions` with batched
token-id prompts and concurrent requests, and generate_until through `local-chat-completions`.
The harness's per-sample figures are checked against `switchyard logits` and
`switchyard generate` on the token ids the harness sends (the harness tokenizes with transformers'
tokenizer from the model directory)."""

import glob
import json
import os
import random
import shutil
import subprocess
import sys

import numpy as np
import pytest

from conftest import BINARY, TMP, Server

SOURCE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEFAULT_MODEL = os.path.join(SOURCE, "models", "default")
HELDOUT = os.path.join(SOURCE, "configs", "bench", "heldout-prompts.jsonl")
WORK = os.path.join(TMP, "lm_eval")
LM_EVAL = os.path.join(os.path.dirname(sys.executable), "lm_eval")
# Nothing from the Hugging Face hub: the tokenizer and the data are local files.
OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "HF_HOME": os.path.join(WORK, "hf-home"), "TOKENIZERS_PARALLELISM": "false"}
# An f32 log-softmax of logits below 32 over 4,096 terms against the same in f64: the log-sum's
# relative rounding grows at most with the term count (2^-24 x 4,096 = 2.4e-4 of a value near 1
# in the worst case, ~1e-6 in practice); a token's log-probability within 5e-5 holds it with room.
LOGSOFTMAX_BOUND = 5e-5
# A passage's first four lines, then the fifth line or a fifth line from another passage.
CONTEXT_LINES = 4


def passages():
    with open(HELDOUT) as f:
        return [json.loads(line)["text"] for line in f]


def write_tasks():
    """The four tasks as YAML over JSON Lines written here (the data comes from the committed
    held-out passages, so nothing is downloaded)."""
    os.makedirs(WORK, exist_ok=True)
    texts = passages()
    lines = [[x for x in text.split("\n") if x.strip()] for text in texts]
    usable = [i for i, ls in enumerate(lines) if len(ls) > CONTEXT_LINES]
    rng = random.Random(0)
    choice_docs = []
    for i in usable:
        others = rng.sample([j for j in usable if j != i], 3)
        choices = [lines[i][CONTEXT_LINES]] + [lines[j][CONTEXT_LINES] for j in others]
        rng.shuffle(choices)
        choice_docs.append({"context": "\n".join(lines[i][:CONTEXT_LINES]) + "\n",
                            "choices": choices, "label": choices.index(lines[i][CONTEXT_LINES])})
    data = {"choice": choice_docs, "text": [{"text": t} for t in texts]}
    for name, docs in data.items():
        with open(os.path.join(WORK, f"{name}.jsonl"), "w") as f:
            f.writelines(json.dumps(d) + "\n" for d in docs)

    def task(name, data_name, body):
        with open(os.path.join(WORK, f"{name}.yaml"), "w") as f:
            f.write(f"task: {name}\ndataset_path: json\ndataset_kwargs:\n  data_files:\n"
                    f"    test: {os.path.join(WORK, data_name + '.jsonl')}\ntest_split: test\n"
                    + body)

    task("sy_next_line", "choice",
         "output_type: multiple_choice\ndoc_to_text: '{{context}}'\n"
         "doc_to_choice: '{{choices}}'\ndoc_to_target: '{{label}}'\ntarget_delimiter: ''\n"
         "metric_list:\n  - metric: acc\n    aggregation: mean\n    higher_is_better: true\n")
    task("sy_heldout_perplexity", "text",
         "output_type: loglikelihood_rolling\ndoc_to_text: ''\ndoc_to_target: '{{text}}'\n"
         "metric_list:\n  - metric: word_perplexity\n  - metric: byte_perplexity\n"
         "  - metric: bits_per_byte\n")
    generation = ("output_type: generate_until\ndoc_to_text: '{{context}}'\n"
                  "doc_to_target: '{{choices[label]}}'\n"
                  "generation_kwargs:\n  until: [\"\\n\"]\n  max_gen_toks: 24\n"
                  "  do_sample: false\n  temperature: 0\n"
                  "metric_list:\n  - metric: exact_match\n    aggregation: mean\n"
                  "    higher_is_better: true\n")
    task("sy_next_line_generate", "choice", generation)
    task("sy_next_line_chat", "choice", generation)


def run_lm_eval(server, model, model_args, task, *extra):
    """Runs the harness's CLI; returns (the task's metrics, its logged samples by doc_id)."""
    out = os.path.join(WORK, "out-" + task)
    shutil.rmtree(out, ignore_errors=True)
    args = [LM_EVAL, "--model", model, "--model_args", model_args, "--tasks", task,
            "--include_path", WORK, "--output_path", out, "--log_samples", *extra]
    result = subprocess.run(args, capture_output=True, text=True, timeout=600,
                            env={**os.environ, **OFFLINE})
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:] + "".join(
        server.log[-20:])
    (results_file,) = glob.glob(os.path.join(out, "*", "results_*.json"))
    (samples_file,) = glob.glob(os.path.join(out, "*", f"samples_{task}_*.jsonl"))
    with open(results_file) as f:
        metrics = json.load(f)["results"][task]
    with open(samples_file) as f:
        samples = {s["doc_id"]: s for s in map(json.loads, f)}
    return metrics, samples


def reference_log_probs(sequences):
    """Log-softmax rows of `switchyard logits` for each sequence: [positions, vocab] arrays
    (row p predicts token p + 1), in the server's bf16 latent cache."""
    out = os.path.join(WORK, "reference_logits.bin")
    subprocess.run([BINARY, "logits", "--model", DEFAULT_MODEL, "--kv-dtype", "bf16", "--tokens",
                    ";".join(",".join(map(str, s)) for s in sequences), "--out", out],
                   check=True, capture_output=True)
    values = np.fromfile(out, dtype="<f4")
    vocab = values.size // sum(len(s) for s in sequences)
    rows = values.reshape(-1, vocab).astype(np.float64)
    rows -= rows.max(axis=1, keepdims=True)
    rows -= np.log(np.exp(rows).sum(axis=1, keepdims=True))
    split = np.cumsum([len(s) for s in sequences])[:-1]
    return np.split(rows, split)


def continuation_score(log_probs, ids, start):
    """(sum of log-probabilities of ids[start:], whether each is the argmax), as the harness
    scores a continuation."""
    positions = np.arange(start, len(ids))
    picked = log_probs[positions - 1, np.asarray(ids)[positions]]
    greedy = bool(np.all(log_probs[positions - 1].argmax(axis=1) == np.asarray(ids)[positions]))
    return float(picked.sum()), greedy


@pytest.fixture(scope="module")
def trained_server():
    write_tasks()
    # The serving default: one answer per request, so what the harness gets does not depend on
    # how its requests were batched, and prompt rows are computed as `switchyard logits` does.
    s = Server(DEFAULT_MODEL, "--kv-cache-tokens", "32768")
    yield s
    assert s.stop() == 0, "".join(s.log)


@pytest.fixture(scope="module")
def tokenizer():
    os.environ.update(OFFLINE)
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(DEFAULT_MODEL)


def completions_args(server, **extra):
    args = {"model": "sy-test", "base_url": server.url + "/v1/completions",
            "tokenizer": DEFAULT_MODEL, "num_concurrent": 4, "max_retries": 1, **extra}
    return ",".join(f"{k}={v}" for k, v in args.items())


def test_multiple_choice_loglikelihoods_equal_the_logits(trained_server, tokenizer):
    # add_bos_token: DeepSeek's prompts start with BOS, as a user of the harness sets for it.
    metrics, samples = run_lm_eval(
        trained_server, "local-completions", completions_args(trained_server, add_bos_token=True),
        "sy_next_line", "--batch_size", "4")
    sequences, starts, expected = [], [], []
    for doc_id in sorted(samples):
        doc = samples[doc_id]["doc"]
        # The harness moves the context's trailing newline into the continuation, encodes the
        # context and the whole text apart and sends the context's ids followed by the whole
        # text's ids past the context's length (where BPE merged across the boundary, as "?\n"
        # here, that drops a token: the harness's way, reproduced).
        context = doc["context"].rstrip("\n")
        context_ids = tokenizer(context).input_ids
        assert context_ids[0] == tokenizer.bos_token_id
        for choice in doc["choices"]:
            whole = tokenizer(context + "\n" + choice).input_ids
            sequences.append(context_ids + whole[len(context_ids):])
            starts.append(len(context_ids))
        expected.append(doc["label"])
    log_probs = reference_log_probs(sequences)
    correct = 0
    for doc_index, doc_id in enumerate(sorted(samples)):
        scores = []
        for c, response in enumerate(samples[doc_id]["resps"]):
            k = doc_index * 4 + c
            reference, greedy = continuation_score(log_probs[k], sequences[k], starts[k])
            served, served_greedy = float(response[0][0]), response[0][1] == "True"
            # The server's logits are `logits`' bits (one answer per request: the same forms and
            # kernels for prompt rows); what is left is the log-softmax, the server's in f32 over
            # 4,096 terms, this one in f64: LOGSOFTMAX_BOUND a scored token.
            scored = len(sequences[k]) - starts[k]
            assert served == pytest.approx(reference, abs=LOGSOFTMAX_BOUND * scored), (doc_id, c)
            assert served_greedy == greedy, (doc_id, c)
            scores.append(reference)
        correct += int(np.argmax(scores) == expected[doc_index])
    assert len(samples) == 63
    assert metrics["acc,none"] == pytest.approx(correct / len(samples))
    # The trained model tells a passage's own next line from other passages' more often than
    # chance (0.25) would.
    assert metrics["acc,none"] > 0.28


def test_rolling_perplexity_equals_the_logits(trained_server, tokenizer):
    metrics, samples = run_lm_eval(
        trained_server, "local-completions", completions_args(trained_server),
        "sy_heldout_perplexity", "--batch_size", "4")
    assert len(samples) == 64
    # Every passage fits one window: BOS, then the passage's tokens, each scored.
    checked = sorted(samples)[:8]
    sequences = [[tokenizer.bos_token_id] + tokenizer(samples[d]["doc"]["text"],
                                                      add_special_tokens=False).input_ids
                 for d in checked]
    log_probs = reference_log_probs(sequences)
    for k, doc_id in enumerate(checked):
        reference, _ = continuation_score(log_probs[k], sequences[k], 1)
        served = float(samples[doc_id]["resps"][0][0])
        assert served == pytest.approx(reference, abs=LOGSOFTMAX_BOUND * (len(sequences[k]) - 1)), \
            doc_id
    assert 1.0 < metrics["word_perplexity,none"] < 1e4
    assert 0.0 < metrics["bits_per_byte,none"] < 8.0


def generate_reference(prompt_args):
    # The same mode as the server (one answer per request). With --batch-invariant, as this had
    # been since the server left it, prompt rows take the absorbed attention instead of the
    # expanded one: other last bits, and a near tie between experts (the router in f32) gave
    # other text for 2 of 8 prompts.
    out = subprocess.run([BINARY, "generate", "--model", DEFAULT_MODEL,
                          "--max-tokens", "24", "--json", *prompt_args],
                         check=True, capture_output=True, text=True).stdout
    return [o["text"] for o in json.loads(out)["outputs"]]


def test_generate_until_equals_generate(trained_server, tokenizer):
    metrics, samples = run_lm_eval(
        trained_server, "local-completions", completions_args(trained_server, add_bos_token=True),
        "sy_next_line_generate", "--batch_size", "4")
    assert len(samples) == 63
    assert "exact_match,none" in metrics
    checked = sorted(samples)[:8]
    ids = [tokenizer(samples[d]["doc"]["context"]).input_ids for d in checked]
    texts = generate_reference(["--prompt-tokens", ";".join(",".join(map(str, i)) for i in ids)])
    for doc_id, text in zip(checked, texts):
        # The harness asked to stop at a newline, which the server leaves out.
        assert samples[doc_id]["resps"][0][0] == text.split("\n")[0], doc_id


def test_chat_generate_until_equals_generate(trained_server):
    args = {"model": "sy-test", "base_url": trained_server.url + "/v1/chat/completions",
            "num_concurrent": 4, "max_retries": 1}
    metrics, samples = run_lm_eval(
        trained_server, "local-chat-completions", ",".join(f"{k}={v}" for k, v in args.items()),
        "sy_next_line_chat", "--apply_chat_template", "--limit", "6")
    assert len(samples) == 6 and "exact_match,none" in metrics
    checked = sorted(samples)
    texts = generate_reference(["--chat"] + [a for d in checked for a in
                                             ("--prompt", samples[d]["doc"]["context"])])
    for doc_id, text in zip(checked, texts):
        assert samples[doc_id]["resps"][0][0] == text.split("\n")[0], doc_id
