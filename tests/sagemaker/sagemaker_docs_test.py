#!/usr/bin/env python3
"""docs/sagemaker.md and examples/sagemaker/launch.py against the real binary (label cpu).

1. One source of truth: the metric_definitions and hyperparameters of the docs' Estimator example
   equal launch.py's METRIC_DEFINITIONS and HYPERPARAMETERS.
2. The metric regexes (Python `re`, as SageMaker applies them) match the lines of a real CPU run's
   log, only the lines they are meant for, and capture the value metrics.jsonl records; the MFU
   regex is checked on the committed H200 log (the CPU prints no MFU).
3. Every hyperparameter example of the docs and launch.py is accepted by `mxtrain train` in a fake
   job (as SageMaker writes them: str() and json.dumps() values), and the effective config has the
   values, read through the docs' name table; the launch.py commands of the README and the docs
   run (with --dry-run).

Usage: sagemaker_docs_test.py MXTRAIN_BINARY SOURCE_DIR WORK_DIR
"""
import ast
import importlib.util
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tomllib

BINARY, SOURCE, WORK = sys.argv[1:4]
DOCS = os.path.join(SOURCE, "docs", "sagemaker.md")
LAUNCH = os.path.join(SOURCE, "examples", "sagemaker", "launch.py")
GPU_LOG = os.path.join(SOURCE, "bench", "results", "h200_cuda_tests_95924c658092.log")
failures = []


def check(condition, message):
    if not condition:
        failures.append(message)
        print("FAIL:", message)


def load_launch():
    spec = importlib.util.spec_from_file_location("launch", LAUNCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def docs_python_assignments(text):
    """name -> literal value of every top-level assignment in the docs' python blocks."""
    values = {}
    for block in re.findall(r"```python\n(.*?)```", text, re.S):
        for node in ast.parse(block).body:
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                try:
                    values[node.targets[0].id] = ast.literal_eval(node.value)
                except ValueError:
                    pass  # Estimator(...): not a literal
    return values


def alias_table(text):
    """The docs' table: hyperparameter -> config key."""
    return dict(re.findall(r"^\| `([a-z-]+)` \| `([a-z_.]+)` \|", text, re.M))


def normalized(name):
    return name.lower().replace("-", "_").replace(".", "_")


# --- 1. one source of truth -------------------------------------------------------------------
docs_text = open(DOCS, encoding="utf-8").read()
launch = load_launch()
assignments = docs_python_assignments(docs_text)
check(assignments.get("metric_definitions") == launch.METRIC_DEFINITIONS,
      "docs/sagemaker.md's metric_definitions differ from launch.py's METRIC_DEFINITIONS")
check(assignments.get("hyperparameters") == launch.HYPERPARAMETERS,
      "docs/sagemaker.md's hyperparameters differ from launch.py's HYPERPARAMETERS")
names = alias_table(docs_text)
check(len(names) >= 20, f"the docs' hyperparameter table has {len(names)} rows")


def run(command, environment=None, **kwargs):
    result = subprocess.run(command, capture_output=True, text=True, env={**os.environ, **(environment or {})},
                            **kwargs)
    return result


# --- 2. the regexes against real log lines ----------------------------------------------------
shutil.rmtree(WORK, ignore_errors=True)
os.makedirs(WORK)
words = "the quick brown fox jumps over a lazy dog and then it runs far away from home".split()
state = 12345
with open(os.path.join(WORK, "corpus.txt"), "w") as out:
    for i in range(30000):
        state = (state * 6364136223846793005 + 1442695040888963407) % 2**64
        out.write(words[state >> 60] + ("\n" if i % 11 == 10 else " "))
prepared = run([BINARY, "prepare", "--output", os.path.join(WORK, "shards"), "--val-fraction", "0.2",
                os.path.join(WORK, "corpus.txt")])
check(prepared.returncode == 0, "prepare failed:\n" + prepared.stdout + prepared.stderr)
run_dir = os.path.join(WORK, "run")
trained = run([BINARY, "train", "-m", "tiny", "-d", "cpu", "-p", "fp32", "-b", "4", "-s", "64", "--steps", "12",
               "--set", "model.layers=2", "--set", "eval.every=5", "--set", "eval.batches=1", "--set",
               "checkpoint.every=0", "--set", "data.train=" + os.path.join(WORK, "shards", "train_*.bin"), "--set",
               "data.val=" + os.path.join(WORK, "shards", "val_*.bin"), "-o", run_dir])
check(trained.returncode == 0, "the run failed:\n" + trained.stdout + trained.stderr)
log_lines = trained.stdout.splitlines()
records = [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl"))]
by_step = {}
for record in records:
    by_step.setdefault(record["step"], {}).update(record)

# metric name -> (metrics.jsonl field, scale, decimals printed, the lines it belongs to)
expected = {
    "train:loss": ("loss", 1, 4, "step"),
    "validation:loss": ("val_loss", 1, 4, "val"),
    "train:learning_rate": ("lr", 1, None, "step"),
    "train:grad_norm": ("grad_norm", 1, 2, "step"),
    "train:step_ms": ("step_ms", 1, 1, "step"),
    "train:tflops": ("tflops", 1, 2, "step"),
    "train:mfu_percent": ("mfu", 100, 1, "step"),
}
check(sorted(expected) == sorted(d["Name"] for d in launch.METRIC_DEFINITIONS),
      "this test does not know every metric of launch.py")
step_line = re.compile(r"^\[rank 0\] step (\d+)/\d+ \| (loss|val_loss) ")
for definition in launch.METRIC_DEFINITIONS:
    name, pattern = definition["Name"], re.compile(definition["Regex"])
    field, scale, decimals, kind = expected[name]
    source = log_lines if name != "train:mfu_percent" else open(GPU_LOG, encoding="utf-8").read().splitlines()
    matched = 0
    for line in source:
        found = pattern.search(line)
        if not found:
            continue
        matched += 1
        value = float(found.group(1))  # SageMaker reads the first group as a number
        head = step_line.search(line)
        check(head is not None and (head.group(2) == "val_loss") == (kind == "val"),
              f"{name} matches a line it is not meant for: {line}")
        if head is None or name == "train:mfu_percent":
            continue
        recorded = by_step[int(head.group(1))][field] * scale
        tolerance = 0.5 * 10 ** -decimals if decimals is not None else abs(recorded) * 0.05 + 1e-12
        check(math.isclose(value, recorded, abs_tol=tolerance * 1.0001),
              f"{name}: {value} from '{line}' but metrics.jsonl has {recorded}")
    wanted = 12 if kind == "step" and name != "train:mfu_percent" else 1
    print(f"{name}: {matched} line(s) matched")
    check(matched >= wanted, f"{name} matched {matched} line(s), expected at least {wanted}")

# --- 3. every hyperparameter example is accepted ----------------------------------------------
examples = [("docs Estimator example", assignments.get("hyperparameters", {})), ("launch.py", launch.HYPERPARAMETERS)]
for block in re.findall(r"<<'JSON'\n(.*?)\nJSON", docs_text, re.S):
    examples.append(("docs hyperparameters.json", json.loads(block)))
arguments = re.findall(r"`docker run IMAGE train((?: --[\w.-]+ [^ `]+)+)`", docs_text)
check(arguments, "no `docker run IMAGE train --name value` example found in the docs")


def effective_config(hyperparameters, encode, extra_arguments=()):
    root = os.path.join(WORK, "job")
    shutil.rmtree(root, ignore_errors=True)
    os.makedirs(os.path.join(root, "input", "config"))
    os.makedirs(os.path.join(root, "input", "data", "train"))
    shutil.copy(os.path.join(WORK, "corpus.txt"), os.path.join(root, "input", "data", "train"))
    with open(os.path.join(root, "input", "config", "hyperparameters.json"), "w") as out:
        json.dump({name: encode(value) for name, value in hyperparameters.items()}, out)
    result = run([BINARY, "train", "--print-config", *extra_arguments], {"MXTRAIN_SAGEMAKER_ROOT": root})
    return result, (tomllib.loads(result.stdout) if result.returncode == 0 else None)


def config_key(name):
    for alias, key in names.items():
        if normalized(alias) == normalized(name):
            return key
    return None  # a config key itself: found by normalization below


def expect_values(where, config, hyperparameters):
    flat = {f"{section}.{key}": value for section, table in config.items() for key, value in table.items()}
    for name, value in hyperparameters.items():
        key = config_key(name) or next((k for k in flat if normalized(k) == normalized(name)), None)
        check(key in flat, f"{where}: {name} maps to no config key")
        if key not in flat:
            continue
        got = flat[key]
        same = math.isclose(float(got), float(value)) if isinstance(got, (int, float)) and not isinstance(got, bool) \
            else str(got).lower() == str(value).lower()
        check(same, f"{where}: {name}={value!r} but the effective {key} is {got!r}")


for where, hyperparameters in examples:
    print(f"{where}: {len(hyperparameters)} hyperparameters")
    for encoding, encode in (("str()", str), ("json.dumps()", json.dumps)):
        result, config = effective_config(hyperparameters, encode)
        check(result.returncode == 0, f"{where} with {encoding} values refused:\n{result.stderr}")
        if config:
            expect_values(f"{where} ({encoding})", config, hyperparameters)
for text in arguments:
    split = text.split()
    given = dict(zip([item[2:] for item in split[0::2]], split[1::2]))
    result, config = effective_config({}, str, split)
    check(result.returncode == 0, f"docker run IMAGE train{text} refused:\n{result.stderr}")
    if config:
        expect_values("arguments" + text, config, given)

# The README's and the docs' launch.py commands parse (as --dry-run: no AWS account here).
for document in ("README.md", "docs/sagemaker.md"):
    joined = re.sub(r"\\\n\s*", " ", open(os.path.join(SOURCE, document), encoding="utf-8").read())
    for command in re.findall(r"^python3 examples/sagemaker/launch\.py (.*)$", joined, re.M):
        result = run([sys.executable, LAUNCH, *command.split(), "--dry-run"])
        check(result.returncode == 0, f"{document}: launch.py {command} fails:\n{result.stderr}")
        if result.returncode == 0:
            print(f"{document}: launch.py {command}: ok")

print(f"{len(failures)} failure(s)")
sys.exit(1 if failures else 0)
