#!/usr/bin/env bash
# The table of docs/planning.md: `mxtrain plan --recommend` for every Llama preset from 1B to 64B
# on 8 x H100, H200, B200 and B300 (one node), 4096-token sequences, a global batch of 256
# sequences (1M tokens), BF16, with the kernels of the README's build (cuDNN's attention backward,
# cuBLASLt alone: train.attention_backward and train.gemm_kernels are auto, and a build that
# carries FlashAttention-4's and quack's kernels would plan those on the Hopper rows). Prints it;
# with --update rewrites it in docs/planning.md between the planning-table markers. No GPU needed
# (a few seconds on a laptop).
#
# Usage: bench/planning_table.sh [--update] [path/to/mxtrain]   (default: build/cpu/mxtrain)
set -euo pipefail
cd "$(dirname "$0")/.."
update=0
if [[ "${1:-}" == "--update" ]]; then update=1; shift; fi
binary="${1:-build/cpu/mxtrain}"
if [[ ! -x "$binary" ]]; then
  echo "planning_table.sh: $binary not found; build it first: cmake --preset cpu && cmake --build build/cpu -j" >&2
  exit 2
fi
table() {
  printf '| model | GPUs | fits | recommended config | memory per GPU | predicted tokens/s | MFU |\n'
  printf '|---|---|---|---|---|---|---|\n'
  for preset in llama-1b llama-3b llama-8b llama-14b llama-32b llama-64b; do
    for gpu in h100 h200 b200 b300; do
      "$binary" plan -m "$preset" -s 4096 --global-batch 256 --gpu "$gpu" --gpus 8 --recommend --summary \
        --set train.attention_backward=cudnn --set train.gemm_kernels=cublaslt
    done
  done
}
if [[ $update -eq 0 ]]; then
  table
  exit 0
fi
doc=docs/planning.md
generated="$(table)"
awk -v table="$generated" '
  /<!-- planning-table:begin -->/ { print; print table; skipping = 1; next }
  /<!-- planning-table:end -->/ { skipping = 0 }
  !skipping { print }
' "$doc" > "$doc.tmp"
mv "$doc.tmp" "$doc"
echo "updated the table in $doc"
