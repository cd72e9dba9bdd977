#!/usr/bin/env bash
# A SageMaker job rehearsed on a GPU machine without SageMaker: a directory laid out like /opt/ml
# (MXTRAIN_SAGEMAKER_ROOT) with resourceconfig.json for one host, SM_NUM_GPUS ranks, the seed's
# hyperparameters and a train channel of raw text. `mxtrain train` starts the ranks itself (as on
# a multi-GPU instance), local rank 0 prepares the text; SIGTERM (a spot interruption) after a
# few steps; the same command again resumes; a second job runs uninterrupted for comparison. The
# log (stdout) ends with the losses of both jobs step by step and the files the job left.
#
# Usage: bench/sagemaker_rehearsal.sh MXTRAIN_BINARY GPUS WORK_DIR [PRECISION] > log
# (PRECISION bf16 by default; fp32 runs the same rehearsal on a CPU build with GPUS = 1.)
set -uo pipefail
binary=$(readlink -f "$1") gpus=$2 work=$3 precision=${4:-bf16}
rm -rf "$work" && mkdir -p "$work"
echo "# command: bench/sagemaker_rehearsal.sh $1 $gpus $work $precision"
echo "# commit: $("$binary" version | head -1)"
echo "# date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | sed 's/^/# gpu: /'

make_root() {
  local root=$1
  mkdir -p "$root/input/config" "$root/input/data/train" "$root/model" "$root/output"
  echo '{"current_host": "localhost", "hosts": ["localhost"], "network_interface_name": "lo"}' \
    > "$root/input/config/resourceconfig.json"
  cat > "$root/input/config/hyperparameters.json" <<JSON
{"model": "tiny", "precision": "$precision", "num-layers": "4", "batch-size": "8", "seq-length": "256",
 "steps": "60", "checkpoint.every": "20", "eval.every": "20", "warmup-steps": "5",
 "train.deterministic": "true", "sagemaker_region": "\\"us-east-1\\""}
JSON
  python3 - "$root/input/data/train" <<'PY'
import json, sys
words = "the quick brown fox jumps over a lazy dog and then it runs far away from home while we sleep".split()
state = 7
with open(sys.argv[1] + "/part-0.txt", "w") as text, open(sys.argv[1] + "/part-1.jsonl", "w") as lines:
    for document in range(4000):
        sentence = []
        for _ in range(40):
            state = (state * 6364136223846793005 + 1442695040888963407) % 2**64
            sentence.append(words[state >> 59 & 15])
        (text.write(" ".join(sentence) + ".\n") if document % 2 else
         lines.write(json.dumps({"text": " ".join(sentence) + "."}) + "\n"))
PY
}

job=$work/job reference=$work/reference
make_root "$job"
make_root "$reference"
export SM_NUM_GPUS=$gpus
echo "## the job, interrupted"
MXTRAIN_SAGEMAKER_ROOT=$job "$binary" train > "$work/interrupted.log" 2>&1 &
pid=$!
for _ in $(seq 600); do
  grep -q "step 25/60" "$work/interrupted.log" && break
  kill -0 $pid 2>/dev/null || break
  sleep 0.2
done
kill -TERM $pid
wait $pid; echo "# exit status $?"
cat "$work/interrupted.log"
echo "## the job, restarted"
MXTRAIN_SAGEMAKER_ROOT=$job "$binary" train > "$work/resumed.log" 2>&1; echo "# exit status $?"
cat "$work/resumed.log"
echo "## the reference job, uninterrupted"
MXTRAIN_SAGEMAKER_ROOT=$reference "$binary" train > "$work/reference.log" 2>&1; echo "# exit status $?"
grep -E "step [0-9]+/60 \| (loss|val_loss)|done:|exported" "$work/reference.log"
echo "## losses: step, interrupted+resumed job, reference job, equal"
python3 - "$job/checkpoints/metrics.jsonl" "$reference/checkpoints/metrics.jsonl" <<'PY'
import json, sys
def losses(path):
    return {r["step"]: r["loss"] for r in map(json.loads, open(path)) if "loss" in r}
job, reference = losses(sys.argv[1]), losses(sys.argv[2])
for step in sorted(reference):
    print(step, job.get(step), reference[step], job.get(step) == reference[step])
print("# steps", len(job), len(reference), "all equal:", job == reference)
PY
echo "## files the job left"
(cd "$job" && find model output -type f | sort && cat output/failure 2>/dev/null)
