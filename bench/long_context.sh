#!/usr/bin/env bash
# Long context on one GPU: each mxtrain row beside the planner's prediction for it (the planner
# accuracy harness). The PyTorch side of the fixed rows is `bench/vs_torch.sh OUT long8b long131k`
# (each mxtrain row and PyTorch eager with checkpointing in one command).
# Usage: bench/long_context.sh OUTDIR   (BIN=path/to/mxtrain, default build/cuda/mxtrain)
# Rows: llama-1b at 131,072 tokens (full recompute), llama-8b at 32,768 (full recompute), and for
# each model the longest sequence `mxtrain plan --recommend --objective context` finds on this GPU
# (its search stops at --max-seq, 131,072 by default), run as it recommends.
# Writes OUTDIR/context_<model>.json (the recommendations), OUTDIR/configs.json (the rows),
# OUTDIR/mxtrain.json (the planner accuracy harness: predicted and measured per row) and its log
# OUTDIR/mxtrain.txt. scripts/derive.py turns them into the README table. About 6 minutes on an H200.
set -euo pipefail
out=${1:?usage: bench/long_context.sh OUTDIR}
mkdir -p "$out"
bin=${BIN:-build/cuda/mxtrain}
gpu=${GPU:-h200}
for model in llama-1b llama-8b; do
  "$bin" plan -m "$model" -p bf16 -b 1 --gpu "$gpu" --recommend --objective context --top 3 \
    --out "$out/context_$model.json" > "$out/context_$model.txt"
done
python3 - "$out" <<'PY'
import json, sys
out = sys.argv[1]
rows = [("llama-1b", 131072, "full"), ("llama-8b", 32768, "full")]
for model in ("llama-1b", "llama-8b"):
    best = json.load(open(f"{out}/context_{model}.json"))["best"]
    assert best["micro_batches"] == 1 and best["precision"] == "bf16", best
    rows.append((model, best["seq_len"], best["recompute"]))
configs, seen = [], set()
for model, seq, recompute in rows:
    if (model, seq, recompute) in seen: continue
    seen.add((model, seq, recompute))
    configs.append({"name": f"{model} b1 s{seq} {recompute}",
                    "set": {"model.preset": model, "train.micro_batch_size": 1, "train.seq_len": seq,
                            "train.recompute": recompute, "train.precision": "bf16", "optimizer.grad_clip": 0}})
json.dump({"notes": "bench/long_context.sh: long-context rows on one GPU", "gpu": "h200",
           "warmup_steps": 1, "timed_steps": 2, "configs": configs}, open(f"{out}/configs.json", "w"), indent=1)
PY
"$bin" plan --accuracy-configs "$out/configs.json" --gpu "$gpu" --measure --out "$out/mxtrain.json" \
  > "$out/mxtrain.txt" 2>&1 || { echo "mxtrain accuracy harness failed (see $out/mxtrain.txt)" >&2; exit 1; }
