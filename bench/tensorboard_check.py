"""Reads a run's TensorBoard event files with TensorBoard's own reader (PyPI `tensorboard`,
EventAccumulator) and compares every scalar with the run's metrics.jsonl: the same steps and the
same values (as float32) for each metric both hold. Prints one JSON line per tag and a summary;
exit status 1 on any difference.

Usage: .cache/test-venv/bin/python3 bench/tensorboard_check.py RUN_DIR   (RUN_DIR holds
metrics.jsonl and tensorboard/)"""
import json
import os
import struct
import sys

from tensorboard.backend.event_processing import event_accumulator

run_dir = sys.argv[1]
records = [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl")) if line.strip()]
accumulator = event_accumulator.EventAccumulator(os.path.join(run_dir, "tensorboard"),
                                                 size_guidance={event_accumulator.SCALARS: 0})
accumulator.Reload()
tags = accumulator.Tags()["scalars"]
pairs = {"train/loss": "loss", "train/lr": "lr", "train/grad_norm": "grad_norm", "perf/tokens_per_s": "tokens_per_s",
         "perf/step_ms": "step_ms", "perf/tflops": "tflops", "perf/mfu": "mfu", "eval/val_loss": "val_loss"}
f32 = lambda x: struct.unpack("<f", struct.pack("<f", x))[0]
failures = 0
for tag, key in pairs.items():
    want = [(r["step"], f32(r[key])) for r in records if key in r and "event" not in r]
    got = [(e.step, e.value) for e in accumulator.Scalars(tag)] if tag in tags else []
    ok = bool(want) and got == want
    failures += not ok
    print(json.dumps({"tag": tag, "metrics_key": key, "points_tensorboard": len(got), "points_metrics": len(want),
                      "equal": ok}))
print(json.dumps({"tags_in_event_files": sorted(tags), "compared": len(pairs), "differing": failures}))
sys.exit(1 if failures else 0)
