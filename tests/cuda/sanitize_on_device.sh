#!/usr/bin/env bash
# compute-sanitizer over the CUDA tests on the GPU machine (after tests/cuda/run_on_device.sh built
# them). Usage: tests/cuda/sanitize_on_device.sh TOOL GTEST_FILTER LOG [SECONDS] [EXTRA OPTIONS...]
#   TOOL     memcheck or racecheck (racecheck instruments only mxtrain's own kernels, whose
#            mangled names contain "mxtrain": the cuDNN and cuBLAS kernels it would otherwise also
#            instrument use Hopper's asynchronous copies and barriers, which racecheck reports as
#            hazards it cannot order; see docs/reliability.md)
#   SECONDS  a time limit (default 300); the log says where it stopped
# Child processes (the launcher's ranks) are checked too. Exit status: the sanitizer's (9 on a
# finding), 124 on the time limit.
set -o pipefail
tool=${1:?usage: sanitize_on_device.sh TOOL FILTER LOG [SECONDS]}
filter=${2:?}; log=${3:?}; seconds=${4:-300}; shift 4 2>/dev/null || shift $#
cs=${COMPUTE_SANITIZER:-/usr/local/cuda/bin/compute-sanitizer}
options=(--tool "$tool" --error-exitcode 9 --target-processes all)
# (--kernel-name is compute-sanitizer 2025's name for the old --filter, which it refuses.)
[[ $tool == racecheck ]] && options+=(--kernel-name kns=mxtrain)
start=$(date +%s)
{
  echo "# compute-sanitizer $("$cs" --version | tail -1)"
  echo "# command: $cs ${options[*]} $* build/gpu/tests/mxtrain_cuda_tests --gtest_filter='$filter'"
} > "$log"
timeout "$seconds" "$cs" "${options[@]}" "$@" build/gpu/tests/mxtrain_cuda_tests --gtest_filter="$filter" >> "$log" 2>&1
status=$?
echo "# exit status $status after $(( $(date +%s) - start )) s" >> "$log"
echo "$tool '$filter': exit $status after $(( $(date +%s) - start )) s"
grep -E "ERROR SUMMARY|RACECHECK SUMMARY|^\[  (PASSED|FAILED)|^\[==========\] [0-9]+ tests? from" "$log" | head -8
exit $status
