#!/usr/bin/env bash
# Real-step kernel timelines of `mxtrain bench` runs, in one command on the GPU machine (after
# tests/cuda/run_on_device.sh or a CUDA build made the binary): builds the CUPTI tracer
# (bench/cupti_trace.cpp) against the CUPTI it finds, runs each configuration with the tracer
# injected, and writes per configuration the bench output and bench/step_timeline.py's table
# (span and idle time per step, the kernel time of the last step by kernel, at a real step's
# clocks). Usage:
#   bench/step_timelines.sh OUT_DIR NAME='BENCH ARGS' ...
#   e.g. bench/step_timelines.sh $OUT fp8='-m llama-1b -b 8 -s 2048 -p fp8' fp8c='-m llama-1b -b 8 -s 2048 -p fp8-current'
# BIN (default build/gpu/mxtrain) is the binary; TIMED (default 6) the timed steps; SEQUENCE=1
# also writes the last step's records in launch order (sequence_NAME.txt).
set -euo pipefail
out=${1:?usage: bench/step_timelines.sh OUT_DIR NAME='BENCH ARGS' ...}; shift
(( $# > 0 )) || { echo "step_timelines.sh: name at least one configuration, NAME='BENCH ARGS'" >&2; exit 2; }
bin=${BIN:-build/gpu/mxtrain}
cuda=${CUDA_HOME:-/usr/local/cuda}
here=$(cd "$(dirname "$0")" && pwd)
# CUPTI comes with the toolkit (include/ or extras/CUPTI/) or, on the GPU machine, with PyTorch's
# nvidia-cuda-cupti wheel.
search=("$cuda/" /opt/torch/.venv/lib)
header=$(find "${search[@]}" -name cupti.h 2>/dev/null | head -1 || true)
library=$(find "${search[@]}" -name 'libcupti.so*' 2>/dev/null | sort | head -1 || true)
if [[ -z $header || -z $library ]]; then
  echo "step_timelines.sh: no CUPTI found (cupti.h and libcupti.so under ${search[*]}); set CUDA_HOME to a toolkit that has it" >&2
  exit 1
fi
mkdir -p "$out" build
tracer=$PWD/build/libmxtrain_cupti_trace.so
g++ -std=c++17 -O2 -shared -fPIC "$here/cupti_trace.cpp" -I"$(dirname "$header")" -I"$cuda/include" "$library" \
  -Wl,-rpath,"$(dirname "$library")" -o "$tracer"
echo "# tracer built against $header and $library"
for spec in "$@"; do
  name=${spec%%=*}
  [[ $name != "$spec" && $name =~ ^[A-Za-z0-9_.-]+$ ]] || { echo "step_timelines.sh: '$spec' is not NAME='BENCH ARGS'" >&2; exit 2; }
  read -r -a args <<< "${spec#*=}"
  trace=$(mktemp --suffix=.csv)
  echo "# $name: $bin bench ${args[*]} --warmup 3 --timed ${TIMED:-6}"
  if ! CUDA_INJECTION64_PATH=$tracer CUPTI_TRACE_OUT=$trace "$bin" bench "${args[@]}" --warmup 3 --timed "${TIMED:-6}" \
      > "$out/bench_$name.txt" 2>&1; then
    echo "step_timelines.sh: the bench run '$name' failed; its output: $out/bench_$name.txt" >&2
    tail -5 "$out/bench_$name.txt" >&2
    continue
  fi
  grep -E "tok/s|step" "$out/bench_$name.txt" | tail -2
  if python3 "$here/step_timeline.py" "$trace" --top 40 \
      ${SEQUENCE:+--sequence "$out/sequence_$name.txt"} > "$out/timeline_$name.txt" 2>&1; then
    head -12 "$out/timeline_$name.txt"
  else
    echo "step_timelines.sh: no step in the trace of '$name' ($(cat "$out/timeline_$name.txt")): did it run on the GPU?" >&2
  fi
  rm -f "$trace"
done
