#!/usr/bin/env bash
# The README's first command's main job, logged: runs `./build/auto/mxtrain train` (the embedded
# default: tiny Llama, fortunes corpus, 300 steps) from a fresh run directory, then samples text
# from it with `mxtrain generate`, and writes both logs
# to bench/results/cpu_default_run_<commit>.log with the command, commit, binary version,
# machine, date and wall time at the top. scripts/derive.py quotes the README's figures for the
# default run from that file. Run after ./scripts/setup.sh, on the CPU (a few minutes).
#
# Usage: bench/cpu_default_run.sh [path/to/mxtrain]   (default: build/auto/mxtrain)
set -euo pipefail
cd "$(dirname "$0")/.."
binary="${1:-build/auto/mxtrain}"
if [[ -e runs/tiny ]]; then
  echo "cpu_default_run.sh: runs/tiny exists and the run would resume from it; move it away first" >&2
  exit 2
fi
commit=$(git rev-parse HEAD)
out=bench/results/cpu_default_run_${commit:0:7}.log
body=$(mktemp)
load_before=$(cut -d' ' -f1 /proc/loadavg)
start=$(date +%s)
"./$binary" train > "$body" 2>&1
end=$(date +%s)
load_after=$(cut -d' ' -f1 /proc/loadavg)
# A sample from the trained model (the README shows it): each line of its output as "[generate] ...".
prompt="Q: What is a computer?"
sample_command="./$binary generate runs/tiny --prompt '$prompt' --max-tokens 200 --seed 1"
sample=$("./$binary" generate runs/tiny --prompt "$prompt" --max-tokens 200 --seed 1 2>&1)
{
  echo "# command: ./$binary train"
  echo "# commit: $commit$(git diff --quiet HEAD -- src CMakeLists.txt cmake configs || echo ' (with uncommitted changes)')"
  echo "# version: $("./$binary" version | tr '\n' ' ' | sed 's/ *$//')"
  echo "# machine: $(nproc) CPU cores ($(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //')), $(command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null | head -1 || echo 'no GPU')"
  echo "# date: $(date -u +%Y-%m-%d)"
  echo "# wall: $(( (end - start) / 60 )) min $(( (end - start) % 60 )) s (the run alone)"
  echo "# load: $load_before at the start, $load_after at the end (1-minute load average; other work shares the cores)"
  cat "$body"
  echo "# generate: $sample_command"
  printf '%s\n' "$sample" | sed 's/^/[generate] /'
} > "$out"
rm -f "$body"
echo "wrote $out"
