#!/usr/bin/env python3
"""Randomized config/command-line run (issue 24): many commands of random verbs, flags, config keys
and values — in range, at and past the bounds, huge, negative, malformed, in TOML files, in
MXTRAIN_* variables — each checked for the one property that matters to a user: mxtrain answers
with a result or with one message, and never ends with a signal (a crash, an OOM kill), an
uncaught exception ("unexpected error", "terminate called"), an "internal error", a sanitizer
report, or a hang. Every command runs under a bounded address space (ulimit -v), so unbounded
growth shows as a failure instead of taking the machine.

Usage: scripts/random_cli.py --binary build/cpu/mxtrain [--cases 10000] [--seed 1] [--jobs 2]
                             [--log FILE]
Exit status 0 when no case failed; the log lists the failures (command and output) and a summary.
"""
import argparse, os, random, re, shlex, shutil, subprocess, sys, tempfile, time
from concurrent.futures import ThreadPoolExecutor

BAD_OUTPUT = ["internal error", "unexpected error", "terminate called", "AddressSanitizer", "LeakSanitizer",
              "UndefinedBehaviorSanitizer", "runtime error:",
              "Segmentation fault", "std::bad_alloc", "core dumped"]
# Shapes the trainer can run in a second or two on a CPU (short `train` cases draw from these).
WORK_KEYS = {"train.steps", "train.global_batch_size", "train.micro_batch_size", "train.seq_len", "eval.batches",
             "eval.every", "log.sample_every", "log.sample_tokens", "model.preset", "model.layers", "model.hidden",
             "model.ffn_hidden", "model.vocab_size", "model.padded_vocab", "model.heads", "model.kv_heads",
             "checkpoint.every", "train.logits_chunk_tokens", "train.threads", "model.init_from"}
SMALL_MODEL = ["--set", "model.hidden=32", "--set", "model.layers=1", "--set", "model.heads=2",
               "--set", "model.kv_heads=1", "--set", "model.ffn_hidden=64", "-b", "2", "-s", "16"]


def read_keys(binary):
    """(key, type, choices, (lo, hi) or None) from `mxtrain train --help-config`."""
    text = subprocess.run([binary, "train", "--help-config"], capture_output=True, text=True, check=True).stdout
    keys = []
    for line in text.splitlines()[1:]:
        m = re.match(r"\s+(\S+)\s+(\w+)\s+default\s+\"(.*?)\"\s+(.*)$", line)
        if not m:
            continue
        key, kind, default, rest = m.groups()
        choices = []
        cm = re.search(r"\(([^()]*)\)\s*(\[.*\])?$", rest)
        if kind == "choice" and cm:
            choices = [c.strip() for c in cm.group(1).split(",")]
        bounds = None
        rm = re.search(r"\[(-?[\d,.e+]+) to (-?[\d,.e+]+)\]$", rest)
        if rm:
            bounds = tuple(float(v.replace(",", "")) for v in rm.groups())
        keys.append((key, kind, default, choices, bounds))
    return keys


def random_value(rng, kind, default, choices, bounds):
    junk = ["", "abc", "1e309", "nan", "inf", "-inf", "0x10", "1.5", "-1", "-9223372036854775808",
            "9223372036854775807", "99999999999999999999999", " 3", "3 ", "true", "\u00e9", "1_000", "'", "\"", "auto"]
    r = rng.random()
    if r < 0.08:
        return rng.choice(junk)
    if kind == "choice":
        return rng.choice(choices) if choices and r < 0.8 else rng.choice(junk + ["FP8", "none"])
    if kind == "boolean":
        return rng.choice(["true", "false", "1", "0", "True", "yes"])
    if kind in ("integer", "number") and bounds:
        lo, hi = bounds
        pick = rng.random()
        if pick < 0.2:  # at and past the bounds
            value = rng.choice([lo, hi, lo - 1, hi + 1, hi * 2, hi * 1e6])
        elif pick < 0.8:  # in range, mostly small
            value = lo + (min(hi, lo + 2 ** rng.uniform(0, 12)) - lo) * rng.random()
        else:  # anywhere up to 2^62
            value = 2 ** rng.uniform(0, 62)
        if kind == "integer":
            return str(int(value))
        return "%g" % value
    if kind == "string":
        return rng.choice(["", "data/fortunes/train_*.bin", "/nonexistent/x", "/dev/null", "/tmp", "byte", "auto",
                           "full", "selective", "none", "3", "-1", "99999", "a" * 300])
    return default


def random_case(rng, keys, work):
    """argv (after the binary), environment additions, and a label."""
    env = {}
    verb_roll = rng.random()
    if verb_roll < 0.02:
        return [rng.choice(["frobnicate", "trian", "", "--version", "-x", "plan2"])], env, "verb"
    if verb_roll < 0.60:
        argv, label = ["plan"], "plan"
    elif verb_roll < 0.85:
        argv, label = ["train", "--print-config"], "train --print-config"
    elif verb_roll < 0.90:
        argv, label = ["train", "--steps", str(rng.choice([1, 2])), "-d", "cpu", "-p", "fp32", "-o",
                       os.path.join(work, "run%d" % rng.randrange(10 ** 9))] + SMALL_MODEL, "train (short)"
        argv += ["--set", "eval.batches=1", "--set", "log.tensorboard=false", "--set", "train.threads=1"]
    elif verb_roll < 0.95:
        argv, label = ["plan", "--recommend", "--top", "2"], "plan --recommend"
    elif verb_roll < 0.97:
        argv, label = [rng.choice(["launch", "export", "generate", "prepare", "tune"])], "other verbs"
    else:
        argv, label = ["bench", "--warmup", "0", "--timed", "1", "-d", "cpu", "-p", "fp32"] + SMALL_MODEL, "bench (short)"
    # Flags of the verbs themselves.
    flag_pool = {"plan": [("--gpus", ["0", "1", "8", "65536", "65537", "-3", "x"]), ("--gpu", ["h100", "b300", "h999", ""]),
                          ("--nodes", ["0", "1", "3", "100000"]), ("--headroom", ["0", "0.5", "0.9", "nan"]),
                          ("--plan-steps", ["1", "0", "101"])],
                 "train": [("--world-size", ["0", "1", "2", "70000"]), ("--rank", ["0", "-1", "5"]),
                           ("--master-port", ["0", "1", "65536"])],
                 "launch": [("--nproc-per-node", ["0", "-1", "70000", "x"]), ("--nnodes", ["0", "2"])]}
    if argv[0] == "launch":  # its per-rank logs go to the scratch directory, not ./launch_logs
        argv += ["--log-dir", os.path.join(work, "launch_logs")]
    for flag, values in flag_pool.get(argv[0], []):
        if rng.random() < 0.15:
            argv += [flag, rng.choice(values)]
    # Short flags of the config (the train table), --set keys, a TOML file, MXTRAIN_* variables.
    toml = {}
    # The commands that compute take no key that scales their work (steps, batches, evaluations,
    # samples): a run asked for a million micro-batches is slow, not wrong. `plan` takes every key.
    runs = label in ("train (short)", "bench (short)")
    drawable = [k for k in keys if not (runs and k[0] in WORK_KEYS)]
    for _ in range(rng.randint(0, 5)):
        key, kind, default, choices, bounds = rng.choice(drawable)
        value = random_value(rng, kind, default, choices, bounds)
        where = rng.random()
        if where < 0.7:
            argv += ["--set", key + "=" + value]
        elif where < 0.85:
            env["MXTRAIN_" + key.replace(".", "_").upper()] = value
        else:
            section, name = key.split(".", 1)
            literal = value if kind in ("integer", "number", "boolean") and re.fullmatch(r"-?[\d.e+]+|true|false", value) \
                else '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
            toml.setdefault(section, {})[name] = literal
    if toml:
        path = os.path.join(work, "c%d.toml" % rng.randrange(10 ** 9))
        with open(path, "w") as out:
            for section, entries in toml.items():
                out.write("[%s]\n" % section + "".join("%s = %s\n" % kv for kv in entries.items()))
        argv.insert(1, path)
    if rng.random() < 0.1 and not runs:
        short = rng.choice([["-b", "0"], ["-b", "100000"], ["-s", "1"], ["-s", "4194305"], ["-m", "llama-64b"],
                            ["-r", "7"], ["-r", "-1"], ["-p", "fp7"], ["--steps", "0"], ["--global-batch", "3"]])
        argv += short
    if rng.random() < 0.03 and not toml:
        argv.insert(1, rng.choice(["/tmp", "/dev/zero", "/nonexistent.toml", work]))
    return argv, env, label


def run_case(binary, argv, env, timeout_s, memory_kb):
    # ulimit -v bounds the address space; a sanitizer build maps terabytes of shadow memory, so
    # --memory-gb 0 leaves it out (bound such a run with ASAN_OPTIONS=hard_rss_limit_mb=...).
    limit = "ulimit -v %d; " % memory_kb if memory_kb > 0 else ""
    command = "%sexec %s %s" % (limit, shlex.quote(binary), " ".join(shlex.quote(a) for a in argv))
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("MXTRAIN_")}
    full_env.update(env)
    start = time.time()
    try:
        done = subprocess.run(["bash", "-c", command], capture_output=True, text=True, errors="replace",
                              timeout=timeout_s, env=full_env)
    except subprocess.TimeoutExpired:
        return None, "timed out after %d s" % timeout_s, time.time() - start
    return done.returncode, done.stdout + done.stderr, time.time() - start


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--binary", required=True)
    parser.add_argument("--cases", type=int, default=10000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--timeout", type=int, default=120, help="seconds a case may run")
    parser.add_argument("--memory-gb", type=float, default=8, help="address-space limit of each case (0: none)")
    parser.add_argument("--log", help="write the log here too")
    args = parser.parse_args()
    binary = os.path.abspath(args.binary)
    keys = read_keys(binary)
    assert len(keys) > 50, "could not read the config keys from --help-config"
    rng = random.Random(args.seed)
    work = tempfile.mkdtemp(prefix="mxtrain_random_cli_")
    cases = [random_case(rng, keys, work) for _ in range(args.cases)]
    lines, failures, by_label, by_status = [], [], {}, {}
    start = time.time()

    def one(index):
        argv, env, label = cases[index]
        status, output, seconds = run_case(binary, argv, env, args.timeout, int(args.memory_gb * 1024 * 1024))
        return index, argv, env, label, status, output, seconds

    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        for index, argv, env, label, status, output, seconds in pool.map(one, range(len(cases))):
            bad = [needle for needle in BAD_OUTPUT if needle in output]
            if status is None or status < 0 or status >= 128 or bad:
                failures.append((index, argv, env, status, output, bad))
            by_label[label] = by_label.get(label, 0) + 1
            by_status[status] = by_status.get(status, 0) + 1
    shutil.rmtree(work, ignore_errors=True)
    elapsed = time.time() - start
    for index, argv, env, status, output, bad in failures:
        lines.append("FAIL case %d: status %s %s\n  env: %s\n  $ mxtrain %s\n%s" % (
            index, status, bad, env, " ".join(shlex.quote(a) for a in argv), output[-2000:]))
    lines.append("cases: %d (seed %d, %d jobs, %.0f s)" % (len(cases), args.seed, args.jobs, elapsed))
    lines.append("by kind: " + ", ".join("%s %d" % kv for kv in sorted(by_label.items())))
    lines.append("exit statuses: " + ", ".join("%s: %d" % (k, v) for k, v in sorted(by_status.items(), key=lambda kv: str(kv[0]))))
    lines.append("failures (signal, OOM kill, timeout, uncaught exception, internal error, sanitizer): %d" % len(failures))
    text = "\n".join(lines) + "\n"
    sys.stdout.write(text)
    if args.log:
        with open(args.log, "a") as out:
            out.write(text)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
