#!/usr/bin/env bash
# memcheck over whole mxtrain processes on the GPU, as a user starts them (after
# tests/cuda/run_on_device.sh built build/gpu/mxtrain): a CUDA run that saves checkpoints, its
# resume, `mxtrain launch` starting a rank that trains FSDP over NCCL and saves, and a launched run
# stopped by SIGTERM (it saves) and resumed through the launcher. This is what
# the OneGpuProcesses tests do, run under the sanitizer directly instead of from inside the test
# binary (under `--target-processes all`, those tests made no progress past their first child in
# 420 s; docs/reliability.md).
# Usage: tests/cuda/memcheck_processes_on_device.sh CORPUS_DIR LOG [SECONDS_EACH]
# CORPUS_DIR holds prepared train_*.bin and val_*.bin shards (data/fortunes after scripts/setup.sh).
set -o pipefail
corpus=${1:?usage: memcheck_processes_on_device.sh CORPUS_DIR LOG [SECONDS_EACH]}
log=${2:?}; seconds=${3:-100}
cs=${COMPUTE_SANITIZER:-/usr/local/cuda/bin/compute-sanitizer}
binary=${BINARY:-build/gpu/mxtrain}
backend=${DIST_BACKEND:-nccl}  # (gloo-less CPU machines: DIST_BACKEND=auto, DEVICE=cpu, to try the script)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
options=(--tool memcheck --error-exitcode 9 --target-processes all)
flags=(--set model.hidden=64 --set model.heads=2 --set model.kv_heads=1 --set model.layers=2 --set model.ffn_hidden=128
       -s 32 -b 4 --global-batch 8 -d "${DEVICE:-cuda}" --set train.threads=1 --set schedule.warmup_steps=2
       --set schedule.decay=constant --set eval.every=2 --set eval.batches=1 --set "data.train=$corpus/train_*.bin"
       --set "data.val=$corpus/val_*.bin")
echo "# compute-sanitizer $("$cs" --version | tail -1); each command below runs as: $cs ${options[*]} COMMAND" > "$log"
memory_errors=0 failures=0 processes=0
# The verdict of the command whose output is in $work/out: NAME STATUS START_SECONDS.
verdict() {
  local name=$1 status=$2 start=$3
  # The sanitizer's findings and summary, and the run's last lines (the effective config is left out).
  grep -E "^=========" "$work/out" | grep -v "Host Frame" >> "$log"
  grep -vE "^=========" "$work/out" | grep -E "^\[rank|^mxtrain|error|saved|resumed|finished|step " | tail -12 >> "$log"
  local invalid; invalid=$(grep -cE "^========= (Invalid|Misaligned|Out of range|Cuda API error.*illegal)" "$work/out")
  memory_errors=$((memory_errors + invalid))
  # Exit 9 with no memory-access error: CUDA API errors only (NCCL probes its kernel images); the
  # run itself failed when the sanitizer says so or ends otherwise.
  if grep -q "Target application returned an error" "$work/out" || (( status != 0 && status != 9 )); then
    failures=$((failures + 1))
  fi
  processes=$((processes + 1))
  echo "## $name: exit $status after $(( $(date +%s) - start )) s, memory-access errors $invalid" >> "$log"
  echo "$name: exit $status, memory-access errors $invalid"
}
run() {
  local name=$1; shift
  local start; start=$(date +%s)
  echo "## $name: $*" >> "$log"
  timeout "$seconds" "$cs" "${options[@]}" "$@" > "$work/out" 2>&1
  verdict "$name" $? "$start"
}
run "train on the GPU, checkpoints at steps 2 and 4" \
  "$binary" train "${flags[@]}" -o "$work/local" --steps 4 --set checkpoint.every=2
run "resume it from step 4 and train to step 6" \
  "$binary" train "${flags[@]}" -o "$work/local" --steps 6 --set checkpoint.every=2
run "launch one rank: FSDP full_shard over $backend, checkpoints at steps 2 and 4" \
  "$binary" launch --nproc-per-node 1 --log-dir "$work/logs" -- train "${flags[@]}" -o "$work/nccl" --steps 4 \
  --set "dist.backend=$backend" --strategy full_shard --set checkpoint.every=2
# SIGTERM through the launcher: the rank saves a checkpoint at its next step and exits 0; the
# resume through the launcher goes on from it.
name="launch one rank over $backend for a million steps, SIGTERM to the launcher once three steps are recorded"
start=$(date +%s)
launch=("$binary" launch --nproc-per-node 1 --log-dir "$work/term-logs" -- train "${flags[@]}" -o "$work/term"
        --steps 1000000 --set "dist.backend=$backend")
echo "## $name: ${launch[*]}" >> "$log"
timeout "$seconds" "$cs" "${options[@]}" "${launch[@]}" > "$work/out" 2>&1 &
sanitizer=$!
for ((i = 0; i < seconds; i++)); do
  steps=$(grep -c '"loss"' "$work/term/metrics.jsonl" 2>/dev/null)
  (( ${steps:-0} >= 3 )) && break
  kill -0 "$sanitizer" 2>/dev/null || break
  sleep 1
done
# The launcher itself: of the processes whose command line holds the launch (the sanitizer's
# does too), the one running the binary, whatever path its command line shows. (On the GPU
# machine a pattern anchored at the binary's path as given, or the wait above, failed once: the
# signal came only from the time limit. The log line below says which part ran.)
signalled=0
for pid in $(pgrep -f -- "launch --nproc-per-node 1 --log-dir $work/term-logs"); do
  if [[ $(readlink -f "/proc/$pid/exe") == "$(readlink -f "$binary")" ]]; then
    kill -TERM "$pid" && signalled=$((signalled + 1))
  fi
done
echo "## SIGTERM sent to $signalled launcher process(es) after $(( $(date +%s) - start )) s" >> "$log"
wait "$sanitizer"
verdict "$name" $? "$start"
saved=""
for checkpoint in "$work/term/checkpoints/step_"*; do
  [[ -d $checkpoint && $checkpoint != *.tmp ]] && saved=$checkpoint
done
if [[ -z $saved ]]; then
  echo "## no checkpoint was saved on SIGTERM" >> "$log"
  failures=$((failures + 1))
else
  stopped=$((10#${saved##*step_}))
  run "resume it through the launcher and train 2 steps more (from step $stopped)" \
    "$binary" launch --nproc-per-node 1 --log-dir "$work/resume-logs" -- train "${flags[@]}" -o "$work/term" \
    --steps $((stopped + 2)) --set "dist.backend=$backend"
fi
{
  echo "## the launched ranks' logs, their last lines:"
  tail -n 4 "$work"/*logs/rank_*.log 2>&1
  echo "# memcheck over $processes processes: $failures failed, $memory_errors memory-access errors"
} >> "$log"
echo "memcheck over $processes processes: $failures failed, $memory_errors memory-access errors"
(( failures == 0 && memory_errors == 0 ))
