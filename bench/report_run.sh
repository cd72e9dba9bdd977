#!/usr/bin/env bash
# The run report's acceptance run: a short training run with a periodic checkpoint, a SIGTERM in
# the middle and a resume to the end, samples on, then `mxtrain report`. Everything it keeps goes
# under OUT_DIR: run.log (a header with the command, commit, binary version, machine and date, then
# both processes' logs and the report command's), the run's metrics.jsonl, plan.json, config.toml,
# tensorboard/ and report.html, and report.png when a Chromium is on PATH. The checkpoints stay in
# RUN_DIR (a llama-1b checkpoint is about 13 GB; checkpoint.keep = 1 keeps one, and the report
# lists the pruned ones).
#
# Usage: bench/report_run.sh OUT_DIR
# Environment (defaults: the H200 acceptance run, llama-1b, 300 steps of 16 x 1024 tokens, a
# checkpoint every 100 steps, SIGTERM once step 150 is logged; about 0.2 s a step on an H200):
#   BIN       the mxtrain binary               (build/cuda/mxtrain, else build/auto/mxtrain)
#   MODEL     model preset                      (llama-1b; `tiny` checks the script on a CPU)
#   STEPS BATCH SEQ PRECISION DEVICE            (300, 16, 1024, auto, auto)
#   CHECKPOINT_EVERY KEEP STOP_AT_STEP SAMPLE_EVERY  (100, 1, 150, 100)
#   RUN_DIR   the run directory                 (a new temporary directory; must not exist)
#   EXTRA     more arguments for `mxtrain train`, word-split (e.g. "--set train.threads=2")
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: bench/report_run.sh OUT_DIR}
binary=${BIN:-}
if [[ -z $binary ]]; then
  binary=build/cuda/mxtrain
  [[ -x $binary ]] || binary=build/auto/mxtrain
fi
[[ -x $binary ]] || { echo "report_run.sh: no mxtrain binary at $binary (set BIN)" >&2; exit 2; }
model=${MODEL:-llama-1b}
steps=${STEPS:-300}
stop_at=${STOP_AT_STEP:-150}
run_dir=${RUN_DIR:-$(mktemp -d)/run}
if [[ -e $run_dir ]]; then
  echo "report_run.sh: $run_dir exists and the run would resume from it; move it away or set RUN_DIR" >&2
  exit 2
fi
mkdir -p "$out"
log=$out/run.log
# shellcheck disable=SC2206
extra=(${EXTRA:-})
command=("$binary" train -m "$model" --steps "$steps" -b "${BATCH:-16}" -s "${SEQ:-1024}" -p "${PRECISION:-auto}"
         -d "${DEVICE:-auto}" -o "$run_dir" --set "checkpoint.every=${CHECKPOINT_EVERY:-100}" --set "checkpoint.keep=${KEEP:-1}"
         --set "log.sample_every=${SAMPLE_EVERY:-100}" --set log.sample_tokens=48 --set eval.every=50
         --set log.every=10 "${extra[@]}")
# The tree's commit (and whether sources differ from it); without a git checkout, the binary's.
if commit=$(git rev-parse HEAD 2>/dev/null); then
  git diff --quiet HEAD -- src CMakeLists.txt cmake configs || commit="$commit (with uncommitted changes)"
else
  commit="not a git checkout; the binary says: $("$binary" version | head -1)"
fi
{
  echo "# command: ${command[*]}  (SIGTERM once step $stop_at is logged, then the same command again to resume)"
  echo "# then: $binary report $run_dir"
  echo "# commit: $commit"
  echo "# version: $("$binary" version | tr '\n' ' ' | sed 's/ *$//')"
  echo "# machine: $(nproc) CPU cores, $(command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null | head -1 || echo 'no GPU')"
  echo "# date: $(date -u '+%Y-%m-%d %H:%M UTC')"
} > "$log"

# The first process: stopped by SIGTERM once metrics.jsonl records step $stop_at.
echo "# --- first process" >> "$log"
"${command[@]}" >> "$log" 2>&1 &
pid=$!
metrics=$run_dir/metrics.jsonl
# (A step record's keys are sorted: "loss" comes before "step".)
until [[ -f $metrics ]] && grep -qE "\"loss\":.*\"step\":$stop_at[,}]" "$metrics"; do
  if ! kill -0 "$pid" 2>/dev/null; then
    wait "$pid" || true
    echo "report_run.sh: the run ended before step $stop_at; see $log" >&2
    exit 1
  fi
  sleep 0.2
done
kill -TERM "$pid"
status=0
wait "$pid" || status=$?
echo "# first process: SIGTERM after step $stop_at, exit status $status" >> "$log"
if [[ $status -ne 0 ]]; then echo "report_run.sh: the stopped run exited $status; see $log" >&2; exit 1; fi

echo "# --- second process (resumes)" >> "$log"
"${command[@]}" >> "$log" 2>&1 || { echo "report_run.sh: the resumed run failed; see $log" >&2; exit 1; }
echo "# --- mxtrain report" >> "$log"
"$binary" report "$run_dir" >> "$log" 2>&1

for file in metrics.jsonl plan.json config.toml report.html; do cp "$run_dir/$file" "$out/"; done
[[ -d $run_dir/tensorboard ]] && cp -r "$run_dir/tensorboard" "$out/"
if command -v chromium >/dev/null; then
  chromium --headless --no-sandbox --disable-gpu --hide-scrollbars --screenshot="$out/report.png" \
    --window-size=1280,5200 "file://$(cd "$out" && pwd)/report.html" >/dev/null 2>&1 || echo "no screenshot" >&2
fi
echo "wrote $out (log $log)"
