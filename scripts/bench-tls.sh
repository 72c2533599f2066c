#!/usr/bin/env bash
# What TLS costs: `switchyard bench serve` against plaintext and HTTPS `serve`, and against a
# router over one instance in clear text and one with an HTTPS front over mutual-TLS gRPC, at
# concurrency 1 and 64 on the default model. The four setups run side by side; rounds alternate
# them; each figure is the median of the rounds.
# Usage: scripts/bench-tls.sh BUILD_DIR [ROUNDS=3]   (prints a Markdown table)
set -euo pipefail
build="$(cd "$1" && pwd)"; rounds="${2:-3}"
bin="$build/switchyard"
work="$(mktemp -d /tmp/sy-bench-tls-XXXXXX)"
pids=()
trap 'for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null; rm -rf "$work"' EXIT

# A CA, and one certificate for 127.0.0.1 used by every server and by the router as a client.
cd "$work"
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 -subj /CN=ca \
  -keyout ca.key -out ca.pem 2>/dev/null
openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj /CN=node \
  -keyout node.key -out node.csr 2>/dev/null
printf 'subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth\n' > node.ext
openssl x509 -req -in node.csr -CA ca.pem -CAkey ca.key -set_serial 2 -days 2 -extfile node.ext \
  -out node.pem 2>/dev/null
tls_http=(--ssl-certfile node.pem --ssl-keyfile node.key)
tls_grpc=(--grpc-tls-cert node.pem --grpc-tls-key node.key --grpc-tls-client-ca ca.pem)
tls_engine=(--engine-tls-ca ca.pem --engine-tls-cert node.pem --engine-tls-key node.key)

# Starts a command in the background; waits for its "serving … on SCHEME://H:P" line.
url_of() {
  local log="$1"
  for _ in $(seq 600); do
    if grep -q "serving .* on http" "$log"; then
      grep -o "on https\?://[0-9.]*:[0-9]*" "$log" | head -1 | cut -c4-
      return
    fi
    sleep 0.1
  done
  echo "did not start: $(cat "$log")" >&2; exit 1
}
start() {
  local name="$1"; shift
  "$@" > "$name.log" 2>&1 &
  pids+=($!)
}
read -r port_plain port_mtls < <(python3 -c "
import socket
s = [socket.socket() for _ in range(2)]
for x in s: x.bind(('127.0.0.1', 0))
print(*[x.getsockname()[1] for x in s])")
serve=("$bin" --threads 2 serve --port 0 --served-model-name sy)
start plain "${serve[@]}"
start https "${serve[@]}" "${tls_http[@]}"
start inst-plain "${serve[@]}" --grpc-port "$port_plain"
start inst-mtls "${serve[@]}" --grpc-port "$port_mtls" "${tls_grpc[@]}"
url_of inst-plain.log >/dev/null; url_of inst-mtls.log >/dev/null
start route-plain "$bin" route --engines "127.0.0.1:$port_plain" --port 0 --served-model-name sy
start route-mtls "$bin" route --engines "127.0.0.1:$port_mtls" --port 0 --served-model-name sy \
  "${tls_engine[@]}" "${tls_http[@]}"
declare -A url
for s in plain https route-plain route-mtls; do url[$s]="$(url_of "$s.log")"; done

results="$work/results"
for round in $(seq "$rounds"); do
  for c in 1 64; do
    n=$(( c == 1 ? 16 : 128 ))
    for s in plain https route-plain route-mtls; do
      "$bin" bench serve --url "${url[$s]}" --ssl-ca-certs ca.pem --concurrency "$c" \
        --num-prompts "$n" --input-len 128 --output-len 128 --json > "$work/out.json"
      python3 -c "
import json, sys
r = json.load(open('$work/out.json'))
assert r['completed'] == $n, r['errors'][:3]
print('$s', $c, r['median_ttft_ms'], r['output_throughput'])" >> "$results"
    done
  done
done
python3 - "$results" <<'EOF'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    s, c, ttft, tput = line.split()
    rows.setdefault((s, int(c)), []).append((float(ttft), float(tput)))
names = {"plain": "serve, HTTP", "https": "serve, HTTPS", "route-plain": "route → instance, clear text",
         "route-mtls": "route (HTTPS) → instance (mutual TLS)"}
print("| setup | c=1 median TTFT (ms) | c=1 output tok/s | c=64 median TTFT (ms) | c=64 output tok/s |")
print("|---|---|---|---|---|")
for s, name in names.items():
    cells = []
    for c in (1, 64):
        runs = rows[(s, c)]
        ttft, tput = [r[0] for r in runs], [r[1] for r in runs]
        cells += [f"{statistics.median(ttft):.1f} ({min(ttft):.1f}–{max(ttft):.1f})",
                  f"{statistics.median(tput):.0f} ({min(tput):.0f}–{max(tput):.0f})"]
    print(f"| {name} | " + " | ".join(cells) + " |")
print(f"\n(medians of {len(rows[('plain', 1)])} rounds, range in brackets)")
EOF
