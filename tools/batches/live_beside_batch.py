"""What a batch costs the live traffic beside it: interactive requests (streamed chat, greedy)
timed one after another on a server whose slots (--max-num-seqs) are
  idle:       taken by nothing else;
  batch:      taken by a Batch API batch of long lines (background work: live requests go first);
  live flood: taken by the same lines sent as live requests, as many at once as there are slots
              (what a client without a batch API does).
Each round runs the three in turn on one server; prints, per side, the median over rounds of the
interactive requests' median time to first token and end-to-end time, and their ratio to idle.

Usage: python live_beside_batch.py SWITCHYARD_BINARY MODEL_DIR [ROUNDS] [SLOTS]
(the openai package: build/venv-serve-tests has it)."""
import concurrent.futures
import io
import json
import statistics
import subprocess
import sys
import threading
import time

import openai

INTERACTIVE = 12      # interactive requests per side and round
LINE_TOKENS = 256     # each batch line's output
INTERACTIVE_TOKENS = 16


def start(binary, model, slots):
    process = subprocess.Popen(
        [binary, "--threads", "2", "serve", "--model", model, "--port", "0",
         "--served-model-name", "m", "--max-num-seqs", str(slots)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for line in process.stdout:
        if "serving" in line and "http://" in line:
            threading.Thread(target=lambda: [None for _ in process.stdout], daemon=True).start()
            return process, "http://" + line.split("http://")[1].split(" ")[0]
    raise SystemExit("the server did not start")


def interactive(client):
    """Median TTFT and end-to-end seconds of INTERACTIVE streamed requests, one at a time."""
    ttfts, totals = [], []
    for i in range(INTERACTIVE):
        began = time.time()
        first = None
        stream = client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": f"Hail, {i}!"}],
            max_tokens=INTERACTIVE_TOKENS, temperature=0, stream=True,
            extra_body={"ignore_eos": True})
        for chunk in stream:
            if first is None and chunk.choices and chunk.choices[0].delta.content:
                first = time.time()
        ttfts.append(first - began)
        totals.append(time.time() - began)
    return statistics.median(ttfts), statistics.median(totals)


def body(i):
    return {"model": "m", "messages": [{"role": "user", "content": f"Tell a long tale, {i}."}],
            "max_tokens": LINE_TOKENS, "temperature": 0, "ignore_eos": True}


def with_batch(client, slots):
    lines = [{"custom_id": f"l{i}", "method": "POST", "url": "/v1/chat/completions",
              "body": body(i)} for i in range(slots * 64)]
    uploaded = client.files.create(file=("l.jsonl", io.BytesIO(
        "".join(json.dumps(line) + "\n" for line in lines).encode())), purpose="batch")
    batch = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions",
                                  completion_window="24h")
    time.sleep(0.5)  # its lines take every slot
    result = interactive(client)
    # The batch must outlast the measurement, or part of it measured an idle server.
    if client.batches.retrieve(batch.id).status != "in_progress":
        raise SystemExit("the batch ended before the interactive requests: make it longer")
    client.batches.cancel(batch.id)
    while client.batches.retrieve(batch.id).status != "cancelled":
        time.sleep(0.05)
    return result


def with_flood(client, slots):
    stop = threading.Event()

    def sender(k):
        i = k
        while not stop.is_set():
            client.chat.completions.create(**{key: value for key, value in body(i).items()
                                              if key != "ignore_eos"},
                                           extra_body={"ignore_eos": True})
            i += slots

    with concurrent.futures.ThreadPoolExecutor(slots) as pool:
        futures = [pool.submit(sender, k) for k in range(slots)]
        time.sleep(0.5)
        result = interactive(client)
        stop.set()
        for f in futures:
            f.result()
    return result


def main():
    binary, model = sys.argv[1], sys.argv[2]
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 3
    slots = int(sys.argv[4]) if len(sys.argv) > 4 else 4
    process, url = start(binary, model, slots)
    sides = {"idle": [], "batch": [], "live flood": []}
    try:
        client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=600)
        interactive(client)  # warm up
        for _ in range(rounds):
            sides["idle"].append(interactive(client))
            sides["batch"].append(with_batch(client, slots))
            sides["live flood"].append(with_flood(client, slots))
    finally:
        process.terminate()
        process.wait()
    idle_ttft = statistics.median(t for t, _ in sides["idle"])
    idle_total = statistics.median(e for _, e in sides["idle"])
    for side, values in sides.items():
        ttft = statistics.median(t for t, _ in values)
        total = statistics.median(e for _, e in values)
        print(f"{side}: TTFT {ttft * 1000:.1f} ms ({ttft / idle_ttft:.2f}x idle), end-to-end "
              f"{total * 1000:.1f} ms ({total / idle_total:.2f}x idle); rounds: "
              + ", ".join(f"{t * 1000:.1f}/{e * 1000:.1f}" for t, e in values))


if __name__ == "__main__":
    main()
