#!/usr/bin/env bash
# mxtrain beside the PyTorch baseline, in one command, on one GPU (the protocol of docs/benchmarking.md).
# Usage: bench/vs_torch.sh OUT.jsonl SET...   with SET one of
#   gpt2    gpt2-124m 64x1024 (vs PyTorch eager and torch.compile)
#   gpt2xl  gpt2-1.5b 16x1024 (vs eager and torch.compile)
#   llama   llama-1b 8x2048 (vs eager and torch.compile)
#   long    llama-1b at 8192 tokens: 1x8192 none, 1x8192 full, 16x8192 full (vs PyTorch eager)
#   long8b  llama-8b 1x32768 full recompute (vs PyTorch eager with checkpointing; 1 warm-up, 2 timed steps)
#   long131k llama-1b 1x131072 full recompute (vs PyTorch eager with checkpointing; 1 warm-up, 2 timed steps)
# Every line of OUT.jsonl is one measurement; mxtrain's carry "engine": "mxtrain", PyTorch's do
# not. bench/summarize.py turns the file into the README table.
set -euo pipefail
out=${1:?usage: bench/vs_torch.sh OUT.jsonl SET...}; shift
bin=${BIN:-build/cuda/mxtrain}
here=$(cd "$(dirname "$0")" && pwd)
# The baseline's optimizer step is fused AdamW without gradient clipping; mxtrain runs the same
# (optimizer.grad_clip = 0: its AdamW pass still sums the squared gradients for the reported norm).
# ATTENTION_BACKWARDS="cudnn flash-attention-4": each mxtrain row of the sets above once with each
# attention backward (train.attention_backward; the second needs a build with FlashAttention-4's
# kernels, docs/attention.md); default auto (the trainer's default: FlashAttention-4's where the
# build carries it for the shape on a Hopper, else cuDNN's). Each line records the backward the
# run took. GEMM_KERNELS="cublaslt cublaslt+quack-swiglu": likewise with each train.gemm_kernels
# (docs/gemm-kernels.md); default auto. Each line records the kernels the run took.
mx() {
  for kernels in ${GEMM_KERNELS:-auto}; do
    for backward in ${ATTENTION_BACKWARDS:-auto}; do
      "$bin" bench --warmup 3 --timed 10 --json "$out" --set optimizer.grad_clip=0 \
        --set train.attention_backward="$backward" --set train.gemm_kernels="$kernels" "$@" >/dev/null ||
        echo "mxtrain bench $* ($backward, $kernels) failed" >&2
    done
  done
}
# Each PyTorch line lands in OUT as it is measured (train_bench prints whole lines and flushes), so a
# command cut short by a time limit keeps the rows it finished.
torch_set() { python3 "$here/torch_baseline.py" "$1" | grep --line-buffered '"kind": "train"' >> "$out" || echo "torch $1 failed" >&2; }
for set in "$@"; do
  case $set in
    gpt2)
      mx -m gpt2-124m -b 64 -s 1024 -p bf16
      torch_set gpt2
      ;;
    gpt2xl)
      mx -m gpt2-1.5b -b 16 -s 1024 -p bf16
      torch_set gpt2xl
      ;;
    llama)
      mx -m llama-1b -b 8 -s 2048 -p bf16
      python3 - "$here" "$out" <<'PY'
import sys; sys.path.insert(0, sys.argv[1]); import torch_baseline as tb, contextlib
tl = dict(arch="llama", vocab=32000, d=2048, L=22, h=32, kv=4, ffn=5632)
with open(sys.argv[2], "a") as out, contextlib.redirect_stdout(out):
    tb.train_bench("tinyllama-1.1B", B=8, T=2048, **tl)
    tb.train_bench("tinyllama-1.1B", B=8, T=2048, compile=True, **tl)
PY
      ;;
    long)
      mx -m llama-1b -b 1 -s 8192 -p bf16 -r none
      mx -m llama-1b -b 1 -s 8192 -p bf16 -r full
      "$bin" bench --warmup 2 --timed 5 --json "$out" --set optimizer.grad_clip=0 -m llama-1b -b 16 -s 8192 -p bf16 -r full >/dev/null || echo "mxtrain bench llama-1b 16x8192 failed" >&2
      python3 - "$here" "$out" <<'PY'
import sys; sys.path.insert(0, sys.argv[1]); import torch_baseline as tb, contextlib
tl = dict(arch="llama", vocab=32000, d=2048, L=22, h=32, kv=4, ffn=5632)
with open(sys.argv[2], "a") as out, contextlib.redirect_stdout(out):
    tb.train_bench("tinyllama-1.1B", B=1, T=8192, **tl)
    tb.train_bench("tinyllama-1.1B", B=1, T=8192, ckpt=True, **tl)
    tb.train_bench("tinyllama-1.1B", B=16, T=8192, ckpt=True, steps=5, warm=2, **tl)
PY
      ;;
    long8b|long131k)
      if [[ $set == long8b ]]; then shape=(-m llama-8b -s 32768); else shape=(-m llama-1b -s 131072); fi
      "$bin" bench --warmup 1 --timed 2 --json "$out" --set optimizer.grad_clip=0 "${shape[@]}" -b 1 -p bf16 -r full \
        >/dev/null || echo "mxtrain bench ${shape[*]} failed" >&2
      python3 - "$here" "$out" "$set" <<'PY'
import sys; sys.path.insert(0, sys.argv[1]); import torch_baseline as tb, contextlib
with open(sys.argv[2], "a") as out, contextlib.redirect_stdout(out):
    if sys.argv[3] == "long8b":
        tb.train_bench("llama3-8B", "llama", 128256, 4096, 32, 32, kv=8, ffn=14336, B=1, T=32768, ckpt=True, steps=2, warm=1)
    else:
        tb.train_bench("tinyllama-1.1B", "llama", 32000, 2048, 22, 32, kv=4, ffn=5632, B=1, T=131072, ckpt=True, steps=2, warm=1)
PY
      ;;
    *) echo "unknown set $set" >&2; exit 2 ;;
  esac
done
