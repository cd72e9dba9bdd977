#!/usr/bin/env bash
# The planner's accuracy harness, on the GPU machine (issue 6 acceptance): for every config of
# bench/planner_accuracy_configs.json it plans the step for one H200 and runs it with `mxtrain
# bench`'s code (2 warm-up + 5 timed steps), then writes predicted vs measured peak (allocator
# peak live bytes) and step time to bench/results/planner_accuracy.json, with a least-squares
# calibration fit of the measured step times ("calibration_fit", also written on its own to
# bench/results/planner_calibration_fit.json). About 2-4 minutes of GPU time.
#
# Usage: bench/planner_accuracy.sh [path/to/mxtrain]   (default: build/cuda/mxtrain)
# Then: commit bench/results/planner_accuracy.json; to adopt the fit, merge the fit's gpus.h200
# entry into configs/plan/calibration.json (or try it first: mxtrain plan ... --calibration
# bench/results/planner_calibration_fit.json) and rerun the CPU test PlannerAccuracy.*; then
# `python3 scripts/derive.py` rewrites every figure the documents quote from the new file.
set -euo pipefail
cd "$(dirname "$0")/.."
binary="${1:-build/cuda/mxtrain}"
if [[ ! -x "$binary" ]]; then
  echo "planner_accuracy.sh: $binary not found; build it first: cmake --preset cuda && cmake --build build/cuda -j" >&2
  exit 2
fi
report=bench/results/planner_accuracy.json
mkdir -p bench/results
"$binary" plan --accuracy-configs bench/planner_accuracy_configs.json --gpu h200 --measure --out "$report"
python3 - "$report" bench/results/planner_calibration_fit.json <<'PY'
import json, sys
report = json.load(open(sys.argv[1]))
fit = report.get("calibration_fit")
if fit:
    json.dump(fit, open(sys.argv[2], "w"), indent=2)
    print("wrote", sys.argv[2])
PY
echo "wrote $report"
