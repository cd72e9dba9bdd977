"""A run killed after a checkpoint and resumed: TensorBoard's own reader (PyPI `tensorboard`,
EventAccumulator with purge_orphaned_data, its default) sees each scalar tag once per step, with
the values of metrics.jsonl, although the killed run's event file still holds the steps it trained
after the checkpoint.

The run checkpoints every 4 steps and evaluates every 3; MXT_TEST_CHECKPOINT_PAUSE holds it in
the save of step 8 (its rank file written, no manifest), where it is killed with SIGKILL. Steps 5
to 8 and the held-out loss of step 6 are then in its event file but not in a checkpoint; the same
command resumes from step 4 and trains to step 12.

Usage: tensorboard_resume.py WORKDIR MXTRAIN CORPUS_DIR"""
import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import time

from tensorboard.backend.event_processing import event_accumulator

workdir, mxtrain, corpus = sys.argv[1:4]
shutil.rmtree(workdir, ignore_errors=True)
os.makedirs(workdir)
run_dir = os.path.join(workdir, "run")
command = [mxtrain, "train", "--steps", "12", "-b", "2", "-s", "32", "--device", "cpu", "-o", run_dir,
           "--set", "model.hidden=64", "--set", "model.heads=2", "--set", "model.kv_heads=1",
           "--set", "model.layers=2", "--set", "model.ffn_hidden=128",
           "--set", "data.train=%s/train_*.bin" % corpus, "--set", "data.val=%s/val_*.bin" % corpus,
           "--set", "eval.every=3", "--set", "eval.batches=1", "--set", "checkpoint.every=4",
           "--set", "train.threads=1"]
failures = []


def fail(message):
    print("FAIL:", message)
    sys.exit(1)


def killed_in_the_save_of_step_8():
    log_path = os.path.join(workdir, "killed.txt")
    environment = dict(os.environ, MXT_TEST_CHECKPOINT_PAUSE="8:120:rank_files")
    with open(log_path, "w") as log:
        trainer = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=environment)
    deadline = time.time() + 120
    while time.time() < deadline and trainer.poll() is None and "pausing" not in open(log_path).read():
        time.sleep(0.1)
    if trainer.poll() is not None or "pausing" not in open(log_path).read():
        trainer.kill()
        fail("the run did not pause in the save of step 8:\n" + open(log_path).read()[-2000:])
    trainer.send_signal(signal.SIGKILL)
    trainer.wait(30)


def event_steps(run_dir):
    """The steps of train/loss in each event file, read alone (no purge across files)."""
    directory = os.path.join(run_dir, "tensorboard")
    steps = []
    for name in sorted(os.listdir(directory)):
        single = event_accumulator.EventAccumulator(os.path.join(directory, name),
                                                    size_guidance={event_accumulator.SCALARS: 0})
        single.Reload()
        steps.append([e.step for e in single.Scalars("train/loss")] if "train/loss" in single.Tags()["scalars"] else [])
    return steps


killed_in_the_save_of_step_8()
before = event_steps(run_dir)
if before != [list(range(1, 9))]:
    fail("the killed run's event file holds train/loss of steps %s, expected 1 to 8" % before)

resumed = subprocess.run(command, capture_output=True, text=True)
if resumed.returncode != 0:
    fail("the resumed run failed (%d): %s" % (resumed.returncode, resumed.stdout[-1000:] + resumed.stderr[-1000:]))
if "resumed from %s/checkpoints/step_00000004 at step 4" % run_dir not in resumed.stdout + resumed.stderr:
    fail("the run did not resume from step 4:\n" + resumed.stdout[-2000:] + resumed.stderr[-2000:])
after = event_steps(run_dir)
if after != [list(range(1, 9)), list(range(5, 13))]:
    fail("event files hold train/loss of steps %s, expected 1 to 8 (killed) then 5 to 12 (resumed)" % after)

# The whole directory through the reader TensorBoard uses: each tag once per step, as metrics.jsonl.
accumulator = event_accumulator.EventAccumulator(os.path.join(run_dir, "tensorboard"),
                                                 size_guidance={event_accumulator.SCALARS: 0})
accumulator.Reload()
tags = accumulator.Tags()["scalars"]
for tag in tags:
    steps = [e.step for e in accumulator.Scalars(tag)]
    if len(steps) != len(set(steps)):
        failures.append("%s: steps %s (a step more than once)" % (tag, steps))
records = [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl"))]
pairs = {"train/loss": "loss", "train/lr": "lr", "train/grad_norm": "grad_norm", "perf/tokens_per_s": "tokens_per_s",
         "perf/step_ms": "step_ms", "perf/tflops": "tflops", "eval/val_loss": "val_loss"}
f32 = lambda x: struct.unpack("<f", struct.pack("<f", x))[0]
for tag, key in pairs.items():
    want = [(r["step"], f32(r[key])) for r in records if key in r]
    got = [(e.step, e.value) for e in accumulator.Scalars(tag)] if tag in tags else []
    if not want or got != want:
        failures.append("%s: tensorboard %s, metrics.jsonl %s" % (tag, got, want))
loss_steps = [e.step for e in accumulator.Scalars("train/loss")] if "train/loss" in tags else []
if loss_steps != list(range(1, 13)):
    failures.append("train/loss at steps %s, expected 1 to 12" % loss_steps)
if [r["step"] for r in records if "val_loss" in r] != [3, 6, 9, 12]:
    failures.append("metrics.jsonl val_loss steps %s, expected 3, 6, 9, 12" % [r["step"] for r in records if "val_loss" in r])
print("tensorboard resume: %d tags, train/loss at steps %s after a kill at step 8 and a resume from step 4"
      % (len(tags), loss_steps))
for failure in failures:
    print("FAIL:", failure)
sys.exit(1 if failures else 0)
