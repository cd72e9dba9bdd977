#!/usr/bin/env bash
# bench/binaries_ab.sh and scripts/derive.py's binary-ab on the CPU: the same binary on both
# sides, one round of a tiny set, must leave one line a side that derive.py pairs; a missing
# binary is refused before anything runs.
# Usage: tests/bench/binaries_ab_test.sh SOURCE_DIR MXTRAIN
set -euo pipefail
src=${1:?source dir}; bin=${2:?mxtrain binary}
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
ROUNDS=1 "$src/bench/binaries_ab.sh" "$bin" "$bin" "$work/ab" '-m tiny -b 2 -s 32 -d cpu'
for side in before after; do
  lines=$(wc -l < "$work/ab_$side.jsonl")
  [[ $lines -eq 1 ]] || { echo "FAIL: $side has $lines lines"; exit 1; }
done
text=$(cd "$src" && python3 -c "
import sys; sys.path.insert(0, 'scripts'); import derive
print(derive.binary_ab(sys.argv[1], sys.argv[2], 'tiny'))" "$work/ab_before.jsonl" "$work/ab_after.jsonl")
[[ $text == "tiny: "*"after faster in "*" of 1 pairs)"* ]] || { echo "FAIL: derive.py said: $text"; exit 1; }
if ROUNDS=1 "$src/bench/binaries_ab.sh" "$bin" "$work/none" "$work/x" '-m tiny' 2> "$work/err"; then
  echo "FAIL: a missing binary was taken"; exit 1
fi
grep -q "is not an executable mxtrain" "$work/err" || { echo "FAIL: no message for the missing binary"; exit 1; }
[[ ! -e $work/x_before.jsonl ]] || { echo "FAIL: it ran before refusing"; exit 1; }
echo "binaries_ab: ok ($text)"
