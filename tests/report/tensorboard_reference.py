"""mxtrain's TensorBoard event files against TensorBoard's own reader (PyPI `tensorboard`,
EventAccumulator): every point written comes back with its tag, step, value (as float32) and wall
time, and the reader reports no data loss (its CRC checks pass).

Then a short `mxtrain train` on the CPU: its tensorboard/ directory holds the same points as its
metrics.jsonl (loss, learning rate, grad norm, tokens/s, step time, peak memory, held-out loss).

Usage: tensorboard_reference.py TOOL WORKDIR MXTRAIN CORPUS_DIR"""
import json
import math
import os
import random
import shutil
import struct
import subprocess
import sys

from tensorboard.backend.event_processing import event_accumulator

tool, workdir, mxtrain, corpus = sys.argv[1:5]
shutil.rmtree(workdir, ignore_errors=True)
os.makedirs(workdir)
rng = random.Random(5)
points = []
for step in range(1, 301):
    wall = 1_790_000_000.0 + step * 0.75
    points.append(["train/loss", step, 5.5 * math.exp(-step / 80) + rng.random() * 0.01, wall])
    points.append(["train/lr", step, 3e-4 * min(1, step / 30), wall])
    points.append(["perf/tokens_per_s", step, 4000 + 500 * rng.random(), wall])
    if step % 50 == 0:
        points.append(["eval/val_loss", step, 2.0 + 3 / step, wall])
points.append(["memory/peak_gib", 300, 0.3138, 1_790_000_226.0])
points_path = os.path.join(workdir, "points.json")
with open(points_path, "w") as f:
    json.dump(points, f)
run = os.path.join(workdir, "run")
subprocess.run([tool, run, points_path], check=True, capture_output=True)

accumulator = event_accumulator.EventAccumulator(run, size_guidance={event_accumulator.SCALARS: 0})
accumulator.Reload()
failures = []
expected = {}
for tag, step, value, wall in points:
    expected.setdefault(tag, []).append((step, struct.unpack("<f", struct.pack("<f", value))[0], wall))
tags = accumulator.Tags()["scalars"]
if sorted(tags) != sorted(expected):
    failures.append("tags %s, expected %s" % (sorted(tags), sorted(expected)))
for tag, want in expected.items():
    got = [(e.step, e.value, e.wall_time) for e in accumulator.Scalars(tag)] if tag in tags else []
    if got != want:
        failures.append("%s: %d points read, %d written; first difference %s" % (
            tag, len(got), len(want), next(((g, w) for g, w in zip(got, want) if g != w), None)))
print("tensorboard reference: %d points in %d tags read back by EventAccumulator" % (len(points), len(expected)))

# The trainer's own event files against its metrics.jsonl.
train_dir = os.path.join(workdir, "train_run")
command = [mxtrain, "train", "--steps", "6", "-b", "2", "-s", "64", "--device", "cpu", "-o", train_dir,
           "--set", "data.train=%s/train_*.bin" % corpus, "--set", "data.val=%s/val_*.bin" % corpus,
           "--set", "eval.every=3", "--set", "eval.batches=2", "--set", "train.threads=2"]
run = subprocess.run(command, capture_output=True, text=True)
if run.returncode != 0:
    failures.append("mxtrain train failed (%d): %s" % (run.returncode, run.stderr[-500:]))
else:
    records = [json.loads(line) for line in open(os.path.join(train_dir, "metrics.jsonl"))]
    trained = event_accumulator.EventAccumulator(os.path.join(train_dir, "tensorboard"),
                                                 size_guidance={event_accumulator.SCALARS: 0})
    trained.Reload()
    pairs = {"train/loss": "loss", "train/lr": "lr", "train/grad_norm": "grad_norm", "perf/tokens_per_s": "tokens_per_s",
             "perf/step_ms": "step_ms", "eval/val_loss": "val_loss"}
    f32 = lambda x: struct.unpack("<f", struct.pack("<f", x))[0]
    for tag, key in pairs.items():
        want = [(r["step"], f32(r[key])) for r in records if key in r]
        got = [(e.step, e.value) for e in trained.Scalars(tag)] if tag in trained.Tags()["scalars"] else []
        if not want or got != want:
            failures.append("train run %s: tensorboard %s, metrics.jsonl %s" % (tag, got[:3], want[:3]))
    print("train run: %d metrics records, tags %s" % (len(records), sorted(trained.Tags()["scalars"])))
for failure in failures:
    print("FAIL:", failure)
sys.exit(1 if failures else 0)
