#!/usr/bin/env bash
# train.gemm_kernels A/B on one GPU, in one command: each value in KERNELS once a round, ROUNDS
# rounds, alternating (so clock and temperature drift fall on both alike). Each run's JSON line
# goes to OUT.jsonl (it records gemm_kernels), its log (the autotune's choices) to OUT.log.
# Usage: KERNELS="cublaslt cublaslt+quack-swiglu" ROUNDS=2 bench/gemm_kernels_ab.sh OUT.jsonl BENCH-ARGS...
#   e.g. ... OUT.jsonl -m llama-1b -b 8 -s 2048 -p bf16 --set train.attention_backward=flash-attention-4
# As bench/vs_torch.sh: optimizer.grad_clip = 0, 3 warm-up and 10 timed steps.
set -uo pipefail
out=${1:?usage: bench/gemm_kernels_ab.sh OUT.jsonl BENCH-ARGS...}; shift
bin=${BIN:-build/cuda/mxtrain}
log=${out%.jsonl}.log
for round in $(seq 1 "${ROUNDS:-2}"); do
  for kernels in ${KERNELS:-cublaslt cublaslt+quack-swiglu}; do
    echo "# round $round, train.gemm_kernels = $kernels: $*" >> "$log"
    "$bin" bench --warmup 3 --timed 10 --json "$out" --set optimizer.grad_clip=0 --set train.gemm_kernels="$kernels" \
      "$@" >> "$log" 2>&1 || echo "mxtrain bench $* ($kernels) failed" >&2
  done
done
