#!/usr/bin/env bash
# Long context on one GPU, in one command (the protocol of docs/benchmarking.md): each mxtrain row
# beside the planner's prediction for it, then PyTorch eager with activation checkpointing at the
# same shapes (where it fits at all).
# Usage: bench/long_context.sh OUTDIR   (BIN=path/to/mxtrain, default build/cuda/mxtrain)
# Rows: llama-1b at 131,072 tokens (full recompute), llama-8b at 32,768 (full recompute), and for
# each model the longest sequence `mxtrain plan --recommend --objective context` finds on this GPU
# (its search stops at --max-seq, 131,072 by default), run as it recommends.
# Writes OUTDIR/context_<model>.json (the recommendations), OUTDIR/configs.json (the rows),
# OUTDIR/mxtrain.json (the planner accuracy harness: predicted and measured per row) and
# OUTDIR/torch.jsonl (PyTorch). scripts/derive.py turns them into the README table.
set -euo pipefail
out=${1:?usage: bench/long_context.sh OUTDIR}
mkdir -p "$out"
bin=${BIN:-build/cuda/mxtrain}
here=$(cd "$(dirname "$0")" && pwd)
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
  > "$out/mxtrain.txt" 2>&1 || echo "mxtrain accuracy harness failed (see $out/mxtrain.txt)" >&2
# PyTorch eager with per-block checkpointing (torch.utils.checkpoint), the same shapes, 1 warm-up
# and 2 timed steps; an out-of-memory is recorded as an error line.
python3 - "$here" "$out/torch.jsonl" <<'PY'
import sys; sys.path.insert(0, sys.argv[1]); import torch_baseline as tb, io, contextlib
tl = dict(arch="llama", vocab=32000, d=2048, L=22, h=32, kv=4, ffn=5632)
l8 = dict(arch="llama", vocab=128256, d=4096, L=32, h=32, kv=8, ffn=14336)
buf = io.StringIO()
with contextlib.redirect_stdout(buf):
    tb.train_bench("tinyllama-1.1B", B=1, T=131072, ckpt=True, steps=2, warm=1, **tl)
    tb.train_bench("llama3-8B", B=1, T=32768, ckpt=True, steps=2, warm=1, **l8)
open(sys.argv[2], "a").write(buf.getvalue())
PY
