#!/usr/bin/env bash
# Installs everything switchyard needs from Debian's packages and builds it into build/.
# Safe to run again: installed packages and an up-to-date build are left as they are.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"

packages=(
  build-essential cmake ninja-build pkg-config git
  clang libclang-rt-14-dev          # the libFuzzer target of the test suite
  libgtest-dev libgmock-dev libbenchmark-dev libpcre2-dev libboost-dev
  nlohmann-json3-dev libcli11-dev libfmt-dev libspdlog-dev libhwy-dev libxxhash-dev
  openmpi-bin libopenmpi-dev iproute2
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler   # the instance API
  libssl-dev openssl                # HTTPS and mutual TLS; the TLS tests make certificates
  libucx-dev                        # UCX: prefill/decode disaggregation's transfer of latent rows
  libdnnl-dev                       # oneDNN: the reference matmul beside ours in bench kernels
  json-schema-test-suite            # the grammar engine's tests: the official JSON Schema suite
  python3 python3-venv prometheus   # the server tests: a venv for the openai client; Prometheus
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

jobs="$(nproc)"
cmake -S "$root" -B "$root/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSWITCHYARD_NATIVE=OFF >/dev/null
cmake --build "$root/build" -j "$jobs"
