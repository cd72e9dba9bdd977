#!/usr/bin/env bash
# racecheck over mxtrain's own kernels, one process per CUDA test, on the GPU machine (after
# tests/cuda/run_on_device.sh built them). Usage:
#   tests/cuda/racecheck_each_on_device.sh GTEST_FILTER LOG [SECONDS]
# Why one process a test: with --kernel-name (only kernels whose mangled name holds "mxtrain" are
# instrumented), compute-sanitizer 2025.3 fails with "Internal Sanitizer Error: The Sanitizer
# failed to handle a hardware exception" in the first cuBLASLt FP8 GEMM a process runs, and the
# illegal-address error it leaves poisons the CUDA context for every later test of that process.
# Those GEMMs run clean without the sanitizer, under memcheck (every kernel instrumented) and under
# racecheck with every kernel instrumented (docs/reliability.md). One process a test keeps the
# verdicts of the other tests; each test's line says which way it ended.
# SECONDS bounds the whole loop (default 300): tests not started by then are listed as not run;
# PER_TEST_SECONDS (default 120) bounds each test.
set -o pipefail
filter=${1:?usage: racecheck_each_on_device.sh FILTER LOG [SECONDS]}
log=${2:?}; seconds=${3:-300}
cs=${COMPUTE_SANITIZER:-/usr/local/cuda/bin/compute-sanitizer}
binary=${TEST_BINARY:-build/gpu/tests/mxtrain_cuda_tests}
options=(--tool racecheck --error-exitcode 9 --target-processes all --kernel-name kns=mxtrain)
tests=$("$binary" --gtest_list_tests --gtest_filter="$filter" | awk '
  /^[^ ]/ { suite = $1; next }
  /^  / { print suite $1 }')
start=$(date +%s)
{
  echo "# compute-sanitizer $("$cs" --version | tail -1)"
  echo "# command, for each TEST: $cs ${options[*]} $binary --gtest_filter=TEST   (one process each; filter '$filter')"
} > "$log"
clean=0 skipped=0 hazards=0 sanitizer_faults=0 failed=0 not_run=0
for test in $tests; do
  if (( $(date +%s) - start >= seconds )); then
    echo "## $test: not run (the loop's $seconds s were spent)" >> "$log"
    not_run=$((not_run + 1))
    continue
  fi
  output=$(timeout "${PER_TEST_SECONDS:-120}" "$cs" "${options[@]}" "$binary" --gtest_filter="$test" 2>&1)
  status=$?
  summary=$(grep -E "RACECHECK SUMMARY" <<< "$output" | tail -1)
  if grep -q "Internal Sanitizer Error" <<< "$output"; then
    verdict="sanitizer fault (Internal Sanitizer Error in an uninstrumented kernel)"
    sanitizer_faults=$((sanitizer_faults + 1))
  elif (( status == 0 )) && grep -q "^\[  SKIPPED \]" <<< "$output"; then
    verdict="skipped (no GPU, or a feature this GPU lacks)"
    skipped=$((skipped + 1))
  elif (( status == 0 )) && grep -q "RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)" <<< "$output"; then
    verdict="passed, 0 hazards"
    clean=$((clean + 1))
  elif (( status == 9 )); then
    verdict="HAZARDS: ${summary#========= }"
    hazards=$((hazards + 1))
  else
    verdict="test failed (exit $status; 124: its ${PER_TEST_SECONDS:-120} s ran out), ${summary#========= }"
    failed=$((failed + 1))
  fi
  {
    echo "## $test: $verdict"
    # The sanitizer's own lines and the test's verdict lines.
    grep -E "^=========|^\[ +(FAILED|OK|SKIPPED) +\]|Failure|exception" <<< "$output" | head -40
  } >> "$log"
done
line="racecheck, one process a test: ${clean} passed with 0 hazards, ${skipped} skipped, ${hazards} with hazards, ${sanitizer_faults} sanitizer faults, ${failed} failed otherwise, ${not_run} not run; $(( $(date +%s) - start )) s"
echo "# $line" >> "$log"
echo "$line"
grep -E "^## .*(HAZARDS|fault|failed|not run)" "$log" | head -20
(( hazards == 0 && failed == 0 ))
