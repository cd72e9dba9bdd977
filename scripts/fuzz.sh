#!/usr/bin/env bash
# Builds the libFuzzer targets (CMake preset `fuzz`: clang-14, -fsanitize=fuzzer,address,undefined)
# and runs each for SECONDS on one core, from the committed seeds (tests/fuzz/corpus/<target>/)
# plus what earlier runs found (build/fuzz/corpus/<target>/). A crash, a sanitizer report, an
# exception other than mxtrain::Error, a timeout or a memory blow-up is a finding: its input is kept
# as build/fuzz/artifacts/<target>-*, and the script exits 1.
#
# Usage: scripts/fuzz.sh [--ci] [--log FILE] SECONDS [TARGET...]
#   --ci        exit 77 (ctest: skipped) where clang-14 or its libFuzzer runtime is missing
#   --log FILE  append each run's command, commit, executions and findings to FILE
#   --no-build  run what build/fuzz holds (several runs side by side must not all build)
# Targets: config shard safetensors tokenizer checkpoint (default: all).
set -euo pipefail
cd "$(dirname "$0")/.."
ci=0 log="" build=1
while [[ $# -gt 0 && "$1" == --* ]]; do
  case "$1" in
    --ci) ci=1; shift ;;
    --log) log="$2"; shift 2 ;;
    --no-build) build=0; shift ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
seconds="${1:?usage: scripts/fuzz.sh [--ci] [--log FILE] SECONDS [TARGET...]}"; shift
targets=("$@")
[[ ${#targets[@]} -gt 0 ]] || targets=(config shard safetensors tokenizer checkpoint hyperparameters)

probe="$(mktemp -d)"
trap 'rm -rf "$probe"' EXIT
if ! command -v clang++-14 >/dev/null ||
   ! echo 'extern "C" int LLVMFuzzerTestOneInput(const unsigned char*, unsigned long) { return 0; }' |
     clang++-14 -fsanitize=fuzzer -x c++ - -o "$probe/probe" 2>/dev/null; then
  echo "clang-14 with libFuzzer is not installed (Debian: sudo apt-get install clang-14 libclang-rt-14-dev)" >&2
  [[ $ci == 1 ]] && exit 77
  exit 2
fi

if [[ $build == 1 ]]; then
  cmake --preset fuzz >/dev/null
  ninja -C build/fuzz $(printf 'fuzz_%s ' "${targets[@]}")
fi
commit="$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)"
dirty="$(git status --porcelain --untracked-files=no 2>/dev/null | grep -q . && echo ' (with uncommitted changes)' || true)"
status=0
for target in "${targets[@]}"; do
  corpus="build/fuzz/tests/fuzz/corpus/$target"
  mkdir -p "$corpus" build/fuzz/artifacts
  command=(build/fuzz/tests/fuzz/fuzz_$target -max_total_time="$seconds" -rss_limit_mb=2048 -timeout=20
           -print_final_stats=1 -artifact_prefix="build/fuzz/artifacts/$target-" "$corpus" "tests/fuzz/corpus/$target")
  output="$(mktemp)"
  started=$SECONDS
  set +e
  "${command[@]}" >"$output" 2>&1
  code=$?
  set -e
  elapsed=$((SECONDS - started))
  executions="$(grep -o 'stat::number_of_executed_units: [0-9]*' "$output" | tail -1 | awk '{print $2}')"
  corpus_size="$(ls "$corpus" | wc -l)"
  findings=0
  [[ $code == 0 ]] || findings=1
  summary="fuzz_$target: ${executions:-?} executions in ${elapsed} s, corpus $corpus_size inputs, findings $findings (exit $code)"
  echo "$summary"
  if [[ $code != 0 ]]; then
    status=1
    grep -E 'ERROR|SUMMARY|property violated|exception other|internal error|Test unit written' "$output" | head -20 >&2 || true
  fi
  if [[ -n "$log" ]]; then
    {
      echo "## run ended $(date -u +%Y-%m-%dT%H:%M:%SZ), commit $commit$dirty on $(nproc) cores ($(uname -m)), load $(cut -d' ' -f1-3 /proc/loadavg)"
      echo "\$ ${command[*]}"
      grep -E '^(INFO: Seed|#[0-9]+[[:space:]]+(INITED|DONE)|stat::|==[0-9]+==ERROR|SUMMARY|property violated|exception other|internal error)' "$output" | head -40
      echo "$summary"
      echo
    } >>"$log"
  fi
  rm -f "$output"
done
exit $status
