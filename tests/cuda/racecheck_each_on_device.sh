#!/usr/bin/env bash
# racecheck over mxtrain's own kernels, one process per CUDA test, on the GPU machine (after
# tests/cuda/run_on_device.sh built them). Usage:
#   tests/cuda/racecheck_each_on_device.sh GTEST_FILTER LOG [SECONDS]
# By default only mxtrain's kernels are instrumented (--kernel-name kns=mxtrain: their mangled
# names hold the namespace). In that mode compute-sanitizer 2025.3 fails with "Internal Sanitizer
# Error: The Sanitizer failed to handle a hardware exception" in the first cuBLASLt Hopper GEMM
# (BF16 or FP8) a process runs, and the illegal-address error it leaves poisons the CUDA context for
# every later test of that process. Those GEMMs run clean without the sanitizer, under memcheck and
# under racecheck with every kernel instrumented. One process a test keeps the other tests'
# verdicts; each test's line says which way it ended.
# ALL_KERNELS=1 instruments every kernel instead and lists every hazard (no print limit): cuDNN's
# and cuBLAS's Hopper kernels order shared memory with asynchronous copies and barriers racecheck
# cannot follow, so they report hazards; a test passes when no hazard is in an mxtrain kernel.
# SECONDS bounds the whole loop (default 300): tests not started by then are listed as not run;
# PER_TEST_SECONDS (default 120) bounds each test. JOBS (default 1) runs that many tests at once;
# the log keeps the tests' order. The instrumented kernels share the GPU in time slices, so more
# jobs overlap only the host's part (start-up, the CPU oracles): a GPU test run beside one
# racecheck process took 353 s instead of 19 s. Two at a time is what the H200 runs used.
set -o pipefail
filter=${1:?usage: racecheck_each_on_device.sh FILTER LOG [SECONDS]}
log=${2:?}; seconds=${3:-300}
cs=${COMPUTE_SANITIZER:-/usr/local/cuda/bin/compute-sanitizer}
binary=${TEST_BINARY:-build/gpu/tests/mxtrain_cuda_tests}
options=(--tool racecheck --error-exitcode 9 --target-processes all)
all_kernels=${ALL_KERNELS:-0}
jobs=${JOBS:-1}
if [[ $all_kernels == 1 ]]; then options+=(--print-limit 100000000); else options+=(--kernel-name kns=mxtrain); fi
tests=$("$binary" --gtest_list_tests --gtest_filter="$filter" | awk '
  /^[^ ]/ { suite = $1; next }
  /^  / { print suite $1 }')
start=$(date +%s)
{
  echo "# compute-sanitizer $("$cs" --version | tail -1)"
  echo "# command, for each TEST: $cs ${options[*]} $binary --gtest_filter=TEST   (one process each, $jobs at a time; filter '$filter')"
} > "$log"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# Runs TEST under the sanitizer; writes its section of the log to $work/N.section and its verdict
# class (clean, skipped, hazards, fault, failed) to $work/N.class.
check() {
  local test=$1 n=$2 output status summary ours theirs verdict class passed
  output=$(timeout "${PER_TEST_SECONDS:-120}" "$cs" "${options[@]}" "$binary" --gtest_filter="$test" 2>&1)
  status=$?
  summary=$(grep -E "RACECHECK SUMMARY" <<< "$output" | tail -1)
  # Every hazard report names the kernel of each access ("Race reported between Write access at
  # KERNEL+0xOFFSET"); an mxtrain kernel's name holds "mxtrain".
  ours=$(grep -E "Race reported between|^=========     and .* access at" <<< "$output" | grep -c "mxtrain")
  theirs=$(grep -cE "Race reported between" <<< "$output")
  passed=0
  grep -q "^\[  PASSED  \] 1 test" <<< "$output" && passed=1
  if grep -q "Internal Sanitizer Error" <<< "$output"; then
    verdict="sanitizer fault (Internal Sanitizer Error in an uninstrumented kernel)" class=fault
  elif grep -q "^\[  SKIPPED \]" <<< "$output" && (( status == 0 )); then
    verdict="skipped (no GPU, or a feature this GPU lacks)" class=skipped
  elif (( ours > 0 )); then
    verdict="HAZARDS in mxtrain kernels: $ours access lines, ${summary#========= }" class=hazards
  elif [[ $all_kernels == 1 ]] && (( passed && (status == 0 || status == 9) )); then
    verdict="passed, 0 hazards in mxtrain kernels (reports in NVIDIA's kernels: $theirs; ${summary#========= })" class=clean
  elif (( passed && status == 0 )) && grep -q "RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)" <<< "$output"; then
    verdict="passed, 0 hazards" class=clean
  elif (( status == 9 )) && [[ $all_kernels != 1 ]] && ! grep -q "RACECHECK SUMMARY: 0 hazards displayed (0 errors" <<< "$output"; then
    verdict="HAZARDS: ${summary#========= }" class=hazards
  else
    # No verdict of the test's own (it failed, or its process ended early): the last lines say how.
    verdict="test did not pass (exit $status; 124: its ${PER_TEST_SECONDS:-120} s ran out), ${summary#========= }" class=failed
  fi
  {
    echo "## $test: $verdict"
    # The sanitizer's own lines and the test's verdict lines.
    # (all kernels: the distinct hazard sites of NVIDIA's kernels, once each, not every report.)
    if [[ $all_kernels == 1 ]]; then
      grep -E "^========= (Error: Race|    and)" <<< "$output" | sed -E 's/\+0x[0-9a-f]+//g; s/ \[[0-9]+ hazards\]//' | sort | uniq -c | sort -rn | head -12
      grep -E "SUMMARY|^\[ +(FAILED|OK|SKIPPED) +\]|Failure|exception" <<< "$output" | head -10
    else
      grep -E "^=========|^\[ +(FAILED|OK|SKIPPED) +\]|Failure|exception" <<< "$output" | head -40
    fi
    if [[ $class == failed ]]; then
      echo "#   the process's last lines:"
      grep -vE "Host Frame|^=========     (Saved host|in )|^========= *$" <<< "$output" | tail -25 | sed 's/^/#   /'
    fi
  } > "$work/$n.section"
  echo "$class" > "$work/$n.class"
}
n=0
for test in $tests; do
  n=$((n + 1))
  # At most $jobs sanitized processes at once.
  while (( $(jobs -rp | wc -l) >= jobs )); do wait -n; done
  if (( $(date +%s) - start >= seconds )); then
    echo "## $test: not run (the loop's $seconds s were spent)" > "$work/$n.section"
    echo not_run > "$work/$n.class"
    continue
  fi
  check "$test" "$n" &
done
wait
clean=0 skipped=0 hazards=0 sanitizer_faults=0 failed=0 not_run=0
for (( i = 1; i <= n; i++ )); do
  cat "$work/$i.section" >> "$log"
  case $(cat "$work/$i.class" 2>/dev/null || echo failed) in
    clean) clean=$((clean + 1)) ;;
    skipped) skipped=$((skipped + 1)) ;;
    hazards) hazards=$((hazards + 1)) ;;
    fault) sanitizer_faults=$((sanitizer_faults + 1)) ;;
    not_run) not_run=$((not_run + 1)) ;;
    *) failed=$((failed + 1)) ;;
  esac
done
line="racecheck$([[ $all_kernels == 1 ]] && echo " (every kernel instrumented)"), one process a test: ${clean} passed with 0 hazards, ${skipped} skipped, ${hazards} with hazards, ${sanitizer_faults} sanitizer faults, ${failed} failed otherwise, ${not_run} not run; $(( $(date +%s) - start )) s"
echo "# $line" >> "$log"
echo "$line"
grep -E "^## [^:]+: (HAZARDS|sanitizer fault|test did not pass|not run)" "$log" | head -20
(( hazards == 0 && failed == 0 ))
