"""What a batch's lines cost in memory: the server's resident set after a large input file is
uploaded, and again once a batch of it is created (its lines checked and held until they run).
The lines are typical chat requests; the batch's lines wait behind --max-num-seqs 1.

Usage: python batch_memory.py SWITCHYARD_BINARY MODEL_DIR [LINES] [CONTENT_BYTES]
(the openai package: build/venv-serve-tests has it)."""
import io
import json
import subprocess
import sys
import threading
import time

import openai


def rss(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def main():
    binary, model = sys.argv[1], sys.argv[2]
    count = int(sys.argv[3]) if len(sys.argv) > 3 else 50000
    content = int(sys.argv[4]) if len(sys.argv) > 4 else 400
    process = subprocess.Popen(
        [binary, "--threads", "2", "serve", "--model", model, "--port", "0",
         "--served-model-name", "m", "--max-num-seqs", "1", "--files-mb", "1024"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = None
    for line in process.stdout:
        if "serving" in line and "http://" in line:
            url = "http://" + line.split("http://")[1].split(" ")[0]
            break
    threading.Thread(target=lambda: [None for _ in process.stdout], daemon=True).start()
    try:
        client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=600)
        lines = [{"custom_id": f"request-{i}", "method": "POST", "url": "/v1/chat/completions",
                  "body": {"model": "m", "max_tokens": 1, "temperature": 0,
                           "messages": [{"role": "system", "content": "You are terse."},
                                        {"role": "user", "content": f"{i} " + "x" * content}]}}
                 for i in range(count)]
        data = "".join(json.dumps(line) + "\n" for line in lines).encode()
        before = rss(process.pid)
        uploaded = client.files.create(file=("big.jsonl", io.BytesIO(data)), purpose="batch")
        time.sleep(1)
        after_upload = rss(process.pid)
        batch = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions",
                                      completion_window="24h")
        time.sleep(1)
        after_create = rss(process.pid)
        client.batches.cancel(batch.id)
        mb = 1 << 20
        print(f"{count} lines, {len(data) / mb:.1f} MiB of JSONL: resident {before / mb:.0f} MiB "
              f"at start, +{(after_upload - before) / mb:.0f} MiB after the upload, "
              f"+{(after_create - after_upload) / mb:.0f} MiB more once the batch holds its lines")
    finally:
        process.terminate()
        process.wait()


if __name__ == "__main__":
    main()
