"""What `serve --files-dir` costs a batch: the same batch of short chat lines run to completion on
a fresh server with files and batches in memory, then on one keeping them in a new directory,
alternated ROUNDS times; prints each side's times, their medians and the ratio.

Usage: python persistence_cost.py SWITCHYARD_BINARY MODEL_DIR [LINES] [ROUNDS]
(the openai package: build/venv-serve-tests has it)."""
import io
import json
import statistics
import subprocess
import sys
import tempfile
import time

import openai


def start(binary, model, extra):
    process = subprocess.Popen(
        [binary, "--threads", "2", "serve", "--model", model, "--port", "0",
         "--served-model-name", "m", *extra], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True)
    for line in process.stdout:
        if "serving" in line and "http://" in line:
            return process, "http://" + line.split("http://")[1].split(" ")[0]
    raise SystemExit("the server did not start")


def run(binary, model, lines, extra):
    process, url = start(binary, model, extra)
    try:
        client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
        requests = [{"custom_id": f"c{i}", "method": "POST", "url": "/v1/chat/completions",
                     "body": {"model": "m", "messages": [{"role": "user", "content": f"Say {i}"}],
                              "max_tokens": 16, "temperature": 0, "ignore_eos": True}}
                    for i in range(lines)]
        body = "".join(json.dumps(r) + "\n" for r in requests).encode()
        uploaded = client.files.create(file=("r.jsonl", io.BytesIO(body)), purpose="batch")
        began = time.time()
        batch = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions",
                                      completion_window="24h")
        while client.batches.retrieve(batch.id).status != "completed":
            time.sleep(0.01)
        return time.time() - began
    finally:
        process.terminate()
        process.wait()


def main():
    binary, model = sys.argv[1], sys.argv[2]
    lines = int(sys.argv[3]) if len(sys.argv) > 3 else 256
    rounds = int(sys.argv[4]) if len(sys.argv) > 4 else 5
    times = {"memory": [], "--files-dir": []}
    with tempfile.TemporaryDirectory() as root:
        for _ in range(rounds):
            times["memory"].append(run(binary, model, lines, []))
            times["--files-dir"].append(
                run(binary, model, lines, ["--files-dir", tempfile.mkdtemp(dir=root)]))
    for side, values in times.items():
        print(f"{side}: median {statistics.median(values):.3f} s "
              f"({', '.join(f'{v:.3f}' for v in values)})")
    print(f"--files-dir / memory: {statistics.median(times['--files-dir']) / statistics.median(times['memory']):.3f}")


if __name__ == "__main__":
    main()
