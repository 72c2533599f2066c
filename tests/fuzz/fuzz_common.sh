# Sourced by every tests/fuzz/run_*_fuzzer.sh: the one way a fuzzer here is built and run.
#   fuzz_begin NAME SOURCE_DIR BUILD_DIR [SECONDS]  sets src, build, seconds and corpus
#   fuzz_build SOURCES-AND-FLAGS...  tests/fuzz/NAME_fuzzer.cc and the sources it tests, built
#                                    by clang with libFuzzer, AddressSanitizer and UBSan
#   (the script writes its seeds into $corpus)
#   fuzz_run MAX_LEN                 runs for SECONDS; a crash fails the script and leaves its
#                                    input in BUILD_DIR (NAME_crash-…), never in the source tree
set -euo pipefail

fuzz_begin() {
  fuzz_name="$1"; src="$2"; build="$3"; seconds="${4:-30}"
  corpus="$build/${fuzz_name}_corpus"
  mkdir -p "$corpus"
}

fuzz_build() {
  # Each source compiled on its own, as many at once as there are cores (the serve fuzzer has
  # some fifty), then one link; the other arguments (defines, -l flags) go to both steps.
  local sources=("$src/tests/fuzz/${fuzz_name}_fuzzer.cc") flags=() arg
  for arg in "$@"; do
    if [[ "$arg" == *.cc ]]; then sources+=("$arg"); else flags+=("$arg"); fi
  done
  local objects="$build/${fuzz_name}_objects"
  rm -rf "$objects" && mkdir -p "$objects"
  local cxx=(clang++ -std=c++20 -O1 -g -fsanitize=fuzzer,address,undefined
             -fno-sanitize-recover=undefined -Wno-unused-command-line-argument -I "$src/src")
  printf '%q ' exec "${cxx[@]}" "${flags[@]}" > "$objects/compile.sh"
  echo '-c "$1" -o "$2"' >> "$objects/compile.sh"
  local i
  for i in "${!sources[@]}"; do printf '%s\0%s\0' "${sources[$i]}" "$objects/$i.o"; done |
    xargs -0 -n 2 -P "$(nproc)" bash "$objects/compile.sh"
  "${cxx[@]}" "$objects"/*.o "${flags[@]}" -o "$build/${fuzz_name}_fuzzer"
}

fuzz_run() {
  "$build/${fuzz_name}_fuzzer" -max_total_time="$seconds" -max_len="$1" -timeout=10 \
    -artifact_prefix="$build/${fuzz_name}_" \
    -rss_limit_mb=4096 -print_final_stats=1 "$corpus" 2>&1 | tail -n 15
}
