#!/usr/bin/env bash
# One device-tool call: runs a carried, prebuilt mxtrain_cuda_tests when every library it needs
# resolves on the GPU machine (the same cuDNN 9.19 it was built against, from the torch wheel),
# else builds in place with run_on_device.sh. Usage: bash tests/cuda/device_call.sh [filter]
set -o pipefail
OUT=${OUT:-/tmp/mxtrain-cuda-out}
FILTER=${1:-*}
BIN=build/h-cuda/tests/mxtrain_cuda_tests
SITE=/opt/torch/.venv/lib/python3.12/site-packages/nvidia
dirs=""
for lib in libcudnn.so.9 libnccl.so.2 libnvrtc.so.13 libcublasLt.so.13; do
  found=$(find "$SITE" -name "$lib" 2>/dev/null | head -1)
  [ -n "$found" ] && dirs="$dirs:$(dirname "$found")"
done
export LD_LIBRARY_PATH="${dirs#:}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
if [ -x "$BIN" ] && ! ldd "$BIN" | grep -q "not found"; then
  ldd "$BIN" | grep -E "cudnn|cublas|nccl|nvrtc|cudart"
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv
  start=$(date +%s)
  "$BIN" --gtest_also_run_disabled_tests --gtest_filter="$FILTER" > "$OUT/cuda_tests.log" 2>&1
  status=$?
  echo "tests: exit $status after $(( $(date +%s) - start )) s"
  grep -E "^\[ +(FAILED|PASSED) +\]|Failure|Expected|Which is|which is|actual|error:|what\(\)" "$OUT/cuda_tests.log" | head -60
  grep -E "^\[ (error|info) \]" "$OUT/cuda_tests.log" | awk '{ if ($0 ~ /rel L2/) { split($0, a, "rel L2 "); if (a[2] + 0 > 1e-3) print } else print }' | head -80
  grep -E "^\[ time  \]" "$OUT/cuda_tests.log"
  exit $status
fi
ldd "$BIN" 2>&1 | grep "not found"
echo "prebuilt binary unusable here; building in place"
exec bash tests/cuda/run_on_device.sh "$FILTER"
