#!/usr/bin/env bash
# FP8 training throughput beside mxtrain's own BF16 and PyTorch's FP8 (bench/torch_fp8.py:
# torch._scaled_mm with per-tensor current scaling under torch.compile), in one command, on one
# GPU. Also fp8 with the other precision.quantized_weights setting than the default's: with BF16
# weight copies (quantized_weights = false), the default before it became auto (on for one GPU).
# Usage: bench/fp8_vs_torch.sh OUT.jsonl SET...   with SET one of
#   1b   llama-1b 8x2048: mxtrain bf16, fp8 (delayed), fp8-current, fp8 with BF16 weight copies;
#        PyTorch bf16 and fp8 (compiled)
#   3b   llama-3b 4x2048: the same four mxtrain rows; PyTorch fp8 (compiled)
# mxtrain's lines carry "engine": "mxtrain"; bench/summarize.py reads both kinds.
# TORCH_FP8_ONLY=1: PyTorch's FP8 row only (one torch.compile per set instead of two for 1b).
# MX_ROWS="fp8 fp8-current": only those mxtrain rows, of bf16, fp8, fp8-current and
# fp8-bf16-weights (fp8 with quantized_weights = false); default all four.
# ATTENTION_BACKWARDS="cudnn flash-attention-4": every mxtrain row once with each attention
# backward (train.attention_backward; the second needs a build with FlashAttention-4's kernels,
# docs/attention.md); default auto (the trainer's default). Each line records the backward the run
# took.
set -euo pipefail
out=${1:?usage: bench/fp8_vs_torch.sh OUT.jsonl SET...}; shift
bin=${BIN:-build/cuda/mxtrain}
here=$(cd "$(dirname "$0")" && pwd)
# The optimizer is the baseline's: AdamW without gradient clipping (optimizer.grad_clip = 0; the
# AdamW pass still sums the squared gradients for the reported norm), as in bench/vs_torch.sh.
mx() {
  for backward in ${ATTENTION_BACKWARDS:-auto}; do
    "$bin" bench --warmup 3 --timed 10 --json "$out" --set optimizer.grad_clip=0 \
      --set train.attention_backward="$backward" "$@" >/dev/null || echo "mxtrain bench $* ($backward) failed" >&2
  done
}
for set in "$@"; do
  case $set in
    1b|3b)
      if [[ $set == 1b ]]; then shape=(-m llama-1b -b 8 -s 2048); else shape=(-m llama-3b -b 4 -s 2048); fi
      for row in ${MX_ROWS:-bf16 fp8 fp8-current fp8-bf16-weights}; do
        case $row in
          fp8-bf16-weights) mx "${shape[@]}" -p fp8 --set precision.quantized_weights=false ;;
          bf16|fp8|fp8-current) mx "${shape[@]}" -p "$row" ;;
          *) echo "fp8_vs_torch.sh: unknown MX_ROWS entry '$row' (bf16, fp8, fp8-current, fp8-bf16-weights)" >&2; exit 2 ;;
        esac
      done
      if [[ ${TORCH_FP8_ONLY:-0} == 1 ]]; then
        # Only PyTorch's FP8 row (its BF16 torch.compile row is bench/vs_torch.sh's): the same
        # run() of torch_fp8.py with its own model settings, one torch.compile less.
        python3 - "$here" "$set" <<'PY' | grep '"tok_s"\|"error"' >> "$out" || echo "torch_fp8 $set failed" >&2
import sys; sys.path.insert(0, sys.argv[1]); import torch_fp8 as t
tl = dict(arch="llama", vocab=32000, d=2048, L=22, h=32, kv=4, ffn=5632)
l3 = dict(arch="llama", vocab=128256, d=3072, L=28, h=24, kv=8, ffn=8192)
if sys.argv[2] == "1b": t.run("llama-1b", True, 8, 2048, **tl)
else: t.run("llama-3b", True, 4, 2048, **l3)
PY
      else
        python3 "$here/torch_fp8.py" "$set" | grep '"tok_s"\|"error"' >> "$out" || echo "torch_fp8 $set failed" >&2
      fi
      ;;
    *) echo "unknown set $set" >&2; exit 2 ;;
  esac
done
