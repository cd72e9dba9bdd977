#!/usr/bin/env python3
"""Soak: a CPU training run interrupted at random and restarted ends bit-identical to an
uninterrupted one.

A tiny Llama (hidden 64, 2 layers, one thread, fp32) trains STEPS steps on data/fortunes with a
checkpoint every EVERY steps. The soaked run is stopped CYCLES times, each time at a random step
with a random signal, both kinds among them (SIGTERM: the run saves and exits 0; SIGKILL: it dies
wherever it is, a checkpoint write included), and restarted with the same command, which resumes from the newest
checkpoint that verifies. Then it runs to the end. The uninterrupted reference run does the same
steps in one go. Pass: every step's loss in metrics.jsonl is equal (each step recorded exactly
once), and the final checkpoints' rank files (masters and Adam moments) are byte-identical.

Usage: bench/soak.py [--binary build/cpu/mxtrain] [--steps 2000] [--cycles 5] [--every 100]
                     [--seed 1] [--work DIR] [--log bench/results/soak_<commit>.log]
The full soak writes its log to bench/results/; CI runs a short one (tests/CMakeLists.txt).
"""
import argparse
import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def train_command(binary, run_dir, steps, every, corpus):
    return [binary, "train", "--set", "model.hidden=64", "--set", "model.heads=2", "--set", "model.kv_heads=1",
            "--set", "model.layers=2", "--set", "model.ffn_hidden=128", "-s", "32", "-b", "4", "--global-batch", "8",
            "-d", "cpu", "-p", "fp32", "--set", "train.threads=1", "--set", "schedule.warmup_steps=20",
            "--set", "eval.every=0", "--set", "eval.batches=1", "--set", f"checkpoint.every={every}",
            "--set", "checkpoint.keep=2", "--set", "log.tensorboard=false", "--set", "log.every=100",
            "--set", f"data.train={corpus}/train_*.bin", "--set", f"data.val={corpus}/val_*.bin",
            "--steps", str(steps), "-o", run_dir]


def step_records(run_dir):
    """step -> list of loss records of metrics.jsonl (a resumed run must leave exactly one)."""
    records = {}
    path = os.path.join(run_dir, "metrics.jsonl")
    if not os.path.exists(path):
        return records
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line being written right now
            if "loss" in record:
                records.setdefault(record["step"], []).append(record["loss"])
    return records


def last_step(run_dir):
    records = step_records(run_dir)
    return max(records) if records else 0


def final_checkpoint_digest(run_dir, steps):
    checkpoint = os.path.join(run_dir, "checkpoints", f"step_{steps:08d}")
    digests = {}
    for name in sorted(os.listdir(checkpoint)):
        if name.endswith(".bin"):
            with open(os.path.join(checkpoint, name), "rb") as f:
                digests[name] = hashlib.sha256(f.read()).hexdigest()
    return digests


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--binary", default=os.path.join(ROOT, "build/cpu/mxtrain"))
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--cycles", type=int, default=5)
    parser.add_argument("--every", type=int, default=100)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--corpus", default=os.path.join(ROOT, "data/fortunes"))
    parser.add_argument("--work", default="")
    parser.add_argument("--log", default="")
    args = parser.parse_args()
    if not os.path.exists(os.path.join(args.corpus, "meta.json")):
        sys.exit(f"soak.py: no prepared corpus in {args.corpus}; run ./scripts/setup.sh (or pass --corpus DIR)")
    work = args.work or tempfile.mkdtemp(prefix="mxtrain-soak-")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    rng = random.Random(args.seed)
    lines = []

    def log(text):
        lines.append(text)
        print(text, flush=True)

    commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short=12", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    version = subprocess.run([args.binary, "version"], capture_output=True, text=True).stdout.strip().splitlines()
    log(f"# soak: {args.steps} steps, checkpoint every {args.every}, {args.cycles} random SIGTERM/SIGKILL + restart "
        f"cycles, seed {args.seed}")
    log(f"# commit {commit}; {version[0] if version else args.binary}; {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}")
    log("# command: " + " ".join(train_command(args.binary, "RUN_DIR", args.steps, args.every, args.corpus)))
    started = time.time()

    reference = os.path.join(work, "reference")
    result = subprocess.run(train_command(args.binary, reference, args.steps, args.every, args.corpus),
                            capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit("soak.py: the reference run failed:\n" + result.stdout[-3000:] + result.stderr[-3000:])
    log(f"reference: {args.steps} steps uninterrupted in {time.time() - started:.1f} s")

    soaked = os.path.join(work, "soaked")
    # The kill points: one random step in each of `cycles` equal parts of the run.
    part = args.steps / (args.cycles + 1)
    # Random signals, both kinds among them whenever there are two cycles or more.
    signals = [rng.choice([signal.SIGTERM, signal.SIGKILL]) for _ in range(args.cycles)]
    if args.cycles >= 2 and len(set(signals)) == 1:
        signals[rng.randrange(args.cycles)] = signal.SIGKILL if signals[0] == signal.SIGTERM else signal.SIGTERM
    for cycle in range(args.cycles):
        target = rng.randint(int(part * (cycle + 0.5)) + 1, int(part * (cycle + 1.5)))
        signal_number = signals[cycle]
        output_path = os.path.join(work, f"cycle_{cycle}.txt")
        with open(output_path, "w") as output:
            process = subprocess.Popen(train_command(args.binary, soaked, args.steps, args.every, args.corpus),
                                       stdout=output, stderr=subprocess.STDOUT)
            while process.poll() is None and last_step(soaked) < target:
                time.sleep(0.002)
            reached = last_step(soaked)
            if process.poll() is not None:
                sys.exit(f"soak.py: cycle {cycle}: the run ended (exit {process.returncode}) before step {target}; "
                         f"see {output_path}")
            process.send_signal(signal_number)
            status = process.wait(timeout=120)
        with open(output_path) as f:
            text = f.read()
        resumed = [l for l in text.splitlines() if "] resumed from" in l]
        name = signal.Signals(signal_number).name
        log(f"cycle {cycle + 1}: {resumed[-1].split('] ')[-1] if resumed else 'started fresh'}; {name} after "
            f"step {reached} -> exit {status}")
        if signal_number == signal.SIGTERM and status != 0:
            sys.exit(f"soak.py: SIGTERM should end the run with exit 0, got {status}; see {output_path}")
    result = subprocess.run(train_command(args.binary, soaked, args.steps, args.every, args.corpus),
                            capture_output=True, text=True)
    resumed = [l for l in result.stdout.splitlines() if "] resumed from" in l]
    log(f"final: {resumed[-1].split('] ')[-1] if resumed else 'started fresh'}; ran to step {args.steps} -> exit "
        f"{result.returncode}")
    if result.returncode != 0:
        sys.exit("soak.py: the final run failed:\n" + result.stdout[-3000:] + result.stderr[-3000:])

    expected, got = step_records(reference), step_records(soaked)
    repeated = sorted(step for step, losses in got.items() if len(losses) != 1)
    differing = [step for step in range(1, args.steps + 1) if got.get(step, [None])[-1] != expected.get(step, [0])[0]]
    reference_digest = final_checkpoint_digest(reference, args.steps)
    soaked_digest = final_checkpoint_digest(soaked, args.steps)
    log(f"steps recorded: reference {len(expected)}, soaked {len(got)}; recorded more than once: {len(repeated)}")
    log(f"steps whose loss differs: {len(differing)}" + (f" (first {differing[:5]})" if differing else ""))
    log(f"final loss: reference {expected[args.steps][0]!r}, soaked {got.get(args.steps, [None])[-1]!r}")
    for name in sorted(reference_digest):
        log(f"final checkpoint {name} sha256: reference {reference_digest[name][:16]}, soaked "
            f"{soaked_digest.get(name, '')[:16]}")
    identical = not repeated and not differing and reference_digest == soaked_digest
    log(f"verdict: {'bit-identical' if identical else 'DIFFERENT'} ({time.time() - started:.1f} s in all)")
    if args.log:
        with open(args.log, "w") as f:
            f.write("\n".join(lines) + "\n")
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if identical else 1


if __name__ == "__main__":
    sys.exit(main())
