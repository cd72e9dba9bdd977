#!/usr/bin/env bash
# Builds mxtrain_cuda_tests on the GPU machine and runs them, writing every log under $OUT
# (the device tool brings $OUT back). Usage, from the repository root on the device machine:
#   bash tests/cuda/run_on_device.sh [gtest filter]
# The per-op timing table (a disabled measuring test) runs too. The last lines printed are a
# summary: failures, then the measured errors and timings.
set -o pipefail
OUT=${OUT:-/tmp/mxtrain-cuda-out}
mkdir -p "$OUT"
FILTER=${1:-*}
export NCCL_HOME=${NCCL_HOME:-/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl}
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv > "$OUT/gpu.txt" 2>&1
cat "$OUT/gpu.txt"
start=$(date +%s)
# FlashAttention-4's backward kernels where the call carries them (scripts/fa4_kernels.sh's folder).
fa4=()
[ -f .fa4-kernels/fa4_kernels.txt ] && fa4=(-DMXTRAIN_FLASH_ATTENTION_4="$PWD/.fa4-kernels")
cmake -S . -B build/gpu -G Ninja -DMXTRAIN_CUDA=ON -DMXTRAIN_BENCHMARKS=OFF -DCMAKE_PREFIX_PATH="$PWD/.gpu-deps" \
  -DCMAKE_INCLUDE_PATH="$PWD/.gpu-deps/include" -DMXTRAIN_CUDA_ARCHITECTURES=90 -DCMAKE_CXX_COMPILER=g++ "${fa4[@]}" \
  > "$OUT/configure.log" 2>&1 || { tail -40 "$OUT/configure.log"; exit 1; }
grep -E "CUDNN|NCCL" build/gpu/CMakeCache.txt | grep -E "_DIR:|_LIBRARY:" | tee -a "$OUT/configure.log"
if ! ninja -C build/gpu -k 0 mxtrain_cuda_tests mxtrain > "$OUT/build.log" 2>&1; then
  grep -E -A6 "error|FAILED" "$OUT/build.log" | head -40
  echo "build failed"
  exit 1
fi
echo "build: $(( $(date +%s) - start )) s"
./build/gpu/tests/mxtrain_cuda_tests --gtest_also_run_disabled_tests --gtest_filter="$FILTER" > "$OUT/cuda_tests.log" 2>&1
status=$?
echo "tests: exit $status after $(( $(date +%s) - start )) s"
grep -E "^\[ +(FAILED|PASSED) +\]|Failure|Expected|Which is|which is|actual|error:" "$OUT/cuda_tests.log" | head -60
grep -E "^\[ (error|info) \]" "$OUT/cuda_tests.log" | awk '{ if ($0 ~ /rel L2/) { split($0, a, "rel L2 "); if (a[2] + 0 > 1e-3) print } else print }' | head -80
grep -E "^\[ time  \]" "$OUT/cuda_tests.log"
exit $status
