#!/usr/bin/env bash
# Two builds of mxtrain against each other on one GPU, in one command: for ROUNDS rounds, the
# BEFORE binary then the AFTER binary run every set (so clock and temperature drift fall on both
# alike; the order within a round is fixed, which a set whose code is the same in both builds —
# a control — shows). Each run's JSON line goes to OUT_before.jsonl or OUT_after.jsonl (a device
# copy's git metadata may give both binaries the same `commit` field; the file tells them apart),
# the logs to OUT.log. scripts/derive.py's `binary-ab` quotes the pairs.
#
# Usage: ROUNDS=4 bench/binaries_ab.sh BEFORE_BIN AFTER_BIN OUT 'BENCH ARGS' ['BENCH ARGS' ...]
#   e.g. bench/binaries_ab.sh /tmp/base/build/gpu/mxtrain build/gpu/mxtrain $OUT/ab \
#          '-m gpt2-124m -b 64 -s 1024 -p bf16' '-m gpt2-1.5b -b 16 -s 1024 -p bf16'
# As bench/vs_torch.sh: optimizer.grad_clip = 0, 3 warm-up and 10 timed steps.
#
# The BEFORE build, from a commit, beside the working tree (as tests/cuda/run_on_device.sh
# configures; on the GPU machine add -DMXTRAIN_FLASH_ATTENTION_4=$PWD/.fa4-kernels where carried):
#   git worktree add -f /tmp/base COMMIT
#   cmake -S /tmp/base -B /tmp/base/build/gpu -G Ninja -DMXTRAIN_CUDA=ON -DMXTRAIN_BENCHMARKS=OFF \
#     -DCMAKE_PREFIX_PATH=$PWD/.gpu-deps -DCMAKE_INCLUDE_PATH=$PWD/.gpu-deps/include \
#     -DMXTRAIN_CUDA_ARCHITECTURES=90 -DCMAKE_CXX_COMPILER=g++ && ninja -C /tmp/base/build/gpu mxtrain
set -uo pipefail
before=${1:?usage: bench/binaries_ab.sh BEFORE_BIN AFTER_BIN OUT 'BENCH ARGS' ...}
after=${2:?usage: bench/binaries_ab.sh BEFORE_BIN AFTER_BIN OUT 'BENCH ARGS' ...}
out=${3:?usage: bench/binaries_ab.sh BEFORE_BIN AFTER_BIN OUT 'BENCH ARGS' ...}
shift 3
(( $# > 0 )) || { echo "binaries_ab.sh: name at least one set of bench arguments" >&2; exit 2; }
for bin in "$before" "$after"; do
  [[ -x $bin ]] || { echo "binaries_ab.sh: $bin is not an executable mxtrain" >&2; exit 2; }
done
mkdir -p "$(dirname "$out")"
failed=0
for round in $(seq 1 "${ROUNDS:-2}"); do
  for side in before after; do
    bin=$before; [[ $side == after ]] && bin=$after
    for set in "$@"; do
      read -r -a args <<< "$set"
      echo "# round $round, $side ($bin): ${args[*]}" >> "$out.log"
      if ! "$bin" bench "${args[@]}" --warmup 3 --timed 10 --set optimizer.grad_clip=0 --json "${out}_$side.jsonl" \
          >> "$out.log" 2>&1; then
        echo "binaries_ab.sh: round $round, $side: mxtrain bench ${args[*]} failed (see $out.log)" >&2
        failed=1
      fi
    done
  done
done
exit $failed
