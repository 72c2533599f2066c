#!/usr/bin/env bash
# Quick start 2: install, build, and run every test (GoogleTest under CTest, the fuzzer).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
"$root/scripts/setup.sh"
cd "$root/build"
ctest --output-on-failure -j "$(nproc)" --timeout 900
