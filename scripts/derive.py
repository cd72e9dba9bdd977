#!/usr/bin/env python3
"""Every figure the documents quote, regenerated from the committed measurements.

The documents (README.md, docs/*.md) hold generated text between marker comments:

    <!-- derived:KIND ARGS -->generated text<!-- /derived -->

(on one line for a phrase, or with the text on the lines between for a table). This script
recomputes each span from the files it names under bench/results/ (and docs/tune-llama-1b/,
docs/precision-curves/), and the derived files below, and writes them back. With --check it
writes nothing and exits 1 when any document or derived file would change, or when a committed
result fails its acceptance check; `ctest -L cpu -R docs_match_data` runs it that way.

Derived files (rewritten from the measurements):
  bench/results/planner_calibration_fit.json  the harness's fit, copied out of planner_accuracy.json
  bench/results/planner_cross_validation.json `mxtrain plan --cross-validate` of planner_accuracy.json
  bench/results/planner_peaks.json            every accuracy config re-planned: planned vs measured peak

Results checks (--check fails when they do not hold):
  soak    a bench/results/soak_*.log a document cites ended bit-identical.
  tune    docs/tune-llama-1b: tune's pick, measured, reaches 97% of the grid's fastest trial, the
          grid is the full 15-config space, both ran at one commit on one model.

Usage: python3 scripts/derive.py [--check] [--binary build/auto/mxtrain]
Only the standard library; the planner figures run the binary (no GPU needed).
"""
import argparse
import difflib
import glob
import json
import os
import re
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MARKER = re.compile(r"<!-- derived:([a-z0-9-]+)((?: [^ >]+)*) -->(.*?)<!-- /derived -->", re.S)

ALIASES = {"gpt2-124M": "gpt2-124m", "gpt2-1.5B": "gpt2-1.5b", "tinyllama-1.1B": "llama-1b", "llama3-8B": "llama-8b"}


def path(relative):
    return os.path.join(ROOT, relative)


def read(relative):
    with open(path(relative)) as f:
        return f.read()


def jsonl(relative):
    return [json.loads(line) for line in read(relative).splitlines() if line.strip().startswith("{")]


def thousands(x):
    return f"{x:,.0f}"


# ---- mxtrain beside PyTorch (bench/vs_torch.sh files) ----------------------------------------------

def vs_torch_rows(relative):
    """One row per mxtrain record, in file order, with the PyTorch records of the same shape."""
    records = jsonl(relative)

    def key(r):
        name = ALIASES.get(r.get("name"), r.get("name"))
        if r.get("engine") == "mxtrain":
            recompute = r.get("recompute", "none")
        else:
            recompute = "full" if r.get("ckpt") else "none"
        return (name, r.get("B"), r.get("T"), recompute)

    eager = {key(r): r for r in records if r.get("engine") != "mxtrain" and not r.get("compile") and "tok_s" in r}
    eager_oom = {key(r) for r in records if r.get("engine") != "mxtrain" and not r.get("compile")
                 and "OutOfMemory" in r.get("error", "")}
    compiled = {key(r): r for r in records if r.get("engine") != "mxtrain" and r.get("compile") and "tok_s" in r}
    rows = []
    for r in records:
        if r.get("engine") != "mxtrain":
            continue
        k = key(r)
        e, c = eager.get(k), compiled.get(k)
        best = max([x for x in (e, c) if x], key=lambda x: x["tok_s"], default=None)
        rows.append({"key": k, "ours": r, "eager": e, "compile": c, "best": best, "eager_oom": k in eager_oom,
                     "ratio": r["tok_s"] / best["tok_s"] if best else None})
    return rows


def vs_torch_table(relative):
    lines = ["| model | batch × seq | recompute | mxtrain tok/s | PyTorch eager | torch.compile | "
             "mxtrain / best PyTorch | peak GiB mxtrain / eager / compile | mxtrain MFU |",
             "|---|---|---|---|---|---|---|---|---|"]
    for row in vs_torch_rows(relative):
        name, b, t, recompute = row["key"]
        r, e, c = row["ours"], row["eager"], row["compile"]
        fmt = lambda x: thousands(x["tok_s"]) if x else "–"
        peak = lambda x: f"{x['peak_gib']:.1f}" if x else "–"
        ratio = f"**{row['ratio']:.3f}×**" if row["ratio"] else "–"
        if row["best"] is not None and c is None:
            ratio += " (eager)"
        eager_text = "out of memory" if row["eager_oom"] and e is None else fmt(e)
        lines.append(f"| {name} | {b} × {t} | {recompute} | {fmt(r)} | {eager_text} | {fmt(c)} | {ratio} | "
                     f"{peak(r)} / {peak(e)} / {peak(c)} | {100 * r['mfu']:.1f}% |")
    return "\n".join(lines)


def vs_torch_ratios(relative):
    """'llama-1b 8×2048 1.104× (210.5 ms against torch.compile's 232.4)', one per mxtrain row."""
    parts = []
    for row in vs_torch_rows(relative):
        name, b, t, recompute = row["key"]
        best = row["best"]
        shape = f"{name} {b}×{t}" + (f" {recompute}" if recompute != "none" else "")
        if best is None:
            why = "PyTorch eager ran out of memory" if row["eager_oom"] else "no PyTorch line"
            parts.append(f"{shape} {row['ours']['step_ms']:.1f} ms ({why})")
            continue
        against = "torch.compile's" if best is row["compile"] else "eager's"
        parts.append(f"{shape} {row['ratio']:.3f}× ({row['ours']['step_ms']:.1f} ms against {against} "
                     f"{best['step_ms']:.1f})")
    return ", ".join(parts)


# ---- long context on one GPU (bench/long_context.sh folders) -------------------------------------

def long_context_rows(folder):
    """Per mxtrain row of the folder: predicted, measured, and whether the context objective chose it."""
    report = json.loads(read(f"{folder}/mxtrain.json"))
    picks = {}
    for model in ("llama-1b", "llama-8b"):
        best = json.loads(read(f"{folder}/context_{model}.json"))["best"]
        picks[(model, best["seq_len"], best["recompute"])] = True
    rows = []
    for entry in report["entries"]:
        s = entry["set"]
        key = (s["model.preset"], s["train.seq_len"], s["train.recompute"])
        rows.append({"model": key[0], "seq": key[1], "recompute": key[2], "predicted": entry["predicted"],
                     "measured": entry.get("measured", {}), "context_pick": key in picks})
    return rows


def long_context_table(folder):
    lines = ["| model | tokens | recompute | measured step s | tokens/s | planned step s (error) | "
             "peak GiB measured | planned peak − measured |",
             "|---|---|---|---|---|---|---|---|"]
    for row in long_context_rows(folder):
        p, m = row["predicted"], row["measured"]
        name = row["model"] + (" (the context objective's pick)" if row["context_pick"] else "")
        if not m.get("fits"):
            lines.append(f"| {name} | {row['seq']:,} | {row['recompute']} | did not run | – | "
                         f"{p['step_ms'] / 1e3:.2f} | – | – |")
            continue
        step_error = 100 * (p["step_ms"] / m["step_ms"] - 1)
        diff = p["peak_bytes"] - m["peak_bytes"]
        lines.append(f"| {name} | {row['seq']:,} | {row['recompute']} | {m['step_ms'] / 1e3:.2f} | "
                     f"{thousands(m['tokens_per_s'])} | {p['step_ms'] / 1e3:.2f} ({step_error:+.1f}%) | "
                     f"{m['peak_bytes'] / 2**30:.2f} | {diff:,} bytes |")
    return "\n".join(lines)


def ab_steps(relative):
    """A/B files (binaries interleaved in one call): per model, each binary's step times in file order."""
    ms = lambda records: ", ".join(f"{r['step_ms']:.2f}" for r in records)
    models = {}
    for r in jsonl(relative):
        runs = models.setdefault(r["name"], {})
        runs.setdefault(r["commit"], []).append(r)
    parts = []
    for name, runs in models.items():
        if len(runs) == 1:
            (only,) = runs.values()
            parts.append(f"{name} {ms(only)} ms")
            continue
        sides = [f"`{commit[:7]}` {ms(rs)} ms ({rs[0]['peak_gib']:.1f} GiB)"
                 for commit, rs in runs.items()]
        parts.append(f"{name} " + " → ".join(sides))
    return "; ".join(parts)


# ---- FP8 beside PyTorch FP8 (bench/fp8_vs_torch.sh) -------------------------------------------------

def fp8_groups(relative, commit):
    """Per model, in file order: bf16, fp8, fp8-current, [fp8 with quantized_weights], PyTorch FP8.
    bench/fp8_vs_torch.sh writes the quantized_weights run as the model's second fp8 line.
    `commit` may list several commits, comma-separated (each model's set measured at one)."""
    commits = commit.split(",")
    groups = {}
    previous = None  # the commit of the last mxtrain line before this one
    for r in jsonl(relative):
        mine = r.get("engine") == "mxtrain"
        if mine:
            previous = r.get("commit")
        if previous not in commits:
            continue
        name = r["name"]
        g = groups.setdefault(name, {"shape": (r["B"], r["T"])})
        if not mine:
            # PyTorch lines carry no commit: the one right after this commit's mxtrain lines.
            if len(g) > 1 and "torch" not in g:
                g["torch"] = r
            continue
        slot = r["precision"]
        if slot == "fp8" and "fp8" in g:
            # Lines that say: the run with BF16 weight copies (quantized_weights became the
            # default); older lines: the second fp8 line is the one with quantized_weights.
            slot = "fp8_copies" if r.get("quantized_weights") is False else "fp8_quantized_weights"
        g.setdefault(slot, r)
    # A set run with MX_ROWS may lack the bf16 row: its cells then say "–".
    return {name: g for name, g in groups.items() if "torch" in g and "fp8" in g}


def fp8_table(relative, commit):
    groups = fp8_groups(relative, commit)
    copies = any("fp8_copies" in g for g in groups.values())
    extra = ("fp8 with BF16 weight copies (`quantized_weights = false`)" if copies
             else "fp8 + `quantized_weights`")
    lines = [f"| model | bf16 tok/s | fp8 (delayed) | fp8-current | PyTorch FP8 | {extra} | "
             "peak GiB bf16 / fp8 / PyTorch FP8 |", "|---|---|---|---|---|---|---|"]
    for name, g in groups.items():
        bf16 = g["bf16"]["tok_s"] if "bf16" in g else None
        torch = g["torch"]["tok_s"]

        def cell(r):
            if r is None:
                return "–"
            versus_bf16 = f"**{r['tok_s'] / bf16:.3f}×** bf16, " if bf16 else ""
            return f"{thousands(r['tok_s'])} ({versus_bf16}**{r['tok_s'] / torch:.3f}×** PyTorch)"
        q = g.get("fp8_copies" if copies else "fp8_quantized_weights")
        qcell = f"{thousands(q['tok_s'])} tok/s at **{q['peak_gib']:.1f} GiB**" if q else "–"
        b, t = g["shape"]
        bf16_peak = f"{g['bf16']['peak_gib']:.1f}" if bf16 else "–"
        lines.append(f"| {name} {b} × {t} | {thousands(bf16) if bf16 else '–'} | {cell(g['fp8'])} | "
                     f"{cell(g.get('fp8-current'))} | {thousands(torch)} | {qcell} | {bf16_peak} / "
                     f"{g['fp8']['peak_gib']:.1f} / {g['torch']['peak_gib']:.1f} |")
    return "\n".join(lines)


def fp8_ratios(relative, commit):
    parts = []
    for name, g in fp8_groups(relative, commit).items():
        torch = g["torch"]["tok_s"]
        if "bf16" not in g:  # a set run without mxtrain's bf16 row: PyTorch FP8's ratios only
            parts.append(f"{name} fp8 {g['fp8']['tok_s'] / torch:.3f}×"
                         + (f", fp8-current {g['fp8-current']['tok_s'] / torch:.3f}×" if "fp8-current" in g else "")
                         + " PyTorch FP8")
            continue
        bf16 = g["bf16"]["tok_s"]
        parts.append(f"{name} fp8 {g['fp8']['tok_s'] / bf16:.3f}× / {g['fp8']['tok_s'] / torch:.3f}×, fp8-current "
                     f"{g['fp8-current']['tok_s'] / bf16:.3f}× / {g['fp8-current']['tok_s'] / torch:.3f}×")
    return "; ".join(parts)


# ---- the attention backward: cuDNN's beside FlashAttention-4's (ATTENTION_BACKWARDS runs) ----------

def attention_backward_rows(*relatives):
    """Per mxtrain configuration of the files (ATTENTION_BACKWARDS="cudnn flash-attention-4" runs of
    bench/fp8_vs_torch.sh and bench/vs_torch.sh), its cudnn and flash-attention-4 lines and the
    PyTorch baseline of the same file: PyTorch FP8 for the fp8 recipes, torch.compile for bf16."""
    rows = []
    for relative in relatives:
        records = jsonl(relative)
        torch = [r for r in records if r.get("engine") != "mxtrain" and "tok_s" in r]
        pairs = {}
        for r in records:
            if r.get("engine") != "mxtrain":
                continue
            key = (r["name"], r["B"], r["T"], r["precision"], r.get("quantized_weights"))
            pairs.setdefault(key, {})[r["attention_backward"]] = r
        for (name, b, t, precision, quantized), pair in pairs.items():
            if "cudnn" not in pair or "flash-attention-4" not in pair:
                continue
            want_fp8 = precision.startswith("fp8")
            base = next((x for x in torch if ALIASES.get(x["name"], x["name"]) == name and x["B"] == b and x["T"] == t
                         and x.get("compile") and (x.get("precision") == "fp8") == want_fp8), None)
            rows.append({"name": name, "shape": (b, t), "precision": precision, "quantized": quantized,
                         "cudnn": pair["cudnn"], "fa4": pair["flash-attention-4"], "base": base, "file": relative})
    return rows


def attention_backward_table(*relatives):
    lines = ["| model | batch × seq | precision | step ms, cuDNN backward | step ms, FlashAttention-4 backward | "
             "saved | PyTorch baseline | mxtrain / baseline, cuDNN → FA4 | peak GiB cuDNN / FA4 / baseline |",
             "|---|---|---|---|---|---|---|---|---|"]
    for row in attention_backward_rows(*relatives):
        c, f, base = row["cudnn"], row["fa4"], row["base"]
        precision = row["precision"] + (" (BF16 weight copies)" if row["quantized"] is False and
                                         row["precision"] != "bf16" else "")
        saved = f"{c['step_ms'] - f['step_ms']:.1f} ms ({100 * (1 - f['step_ms'] / c['step_ms']):.1f}%)"
        if base:
            label = ("PyTorch FP8" if base.get("precision") == "fp8" else "torch.compile") + f" {base['step_ms']:.1f} ms"
            ratio = f"{base['step_ms'] / c['step_ms']:.3f}× → **{base['step_ms'] / f['step_ms']:.3f}×**"
            peak = f"{c['peak_gib']:.1f} / {f['peak_gib']:.1f} / {base['peak_gib']:.1f}"
        else:
            label, ratio, peak = "not in this run", "–", f"{c['peak_gib']:.1f} / {f['peak_gib']:.1f} / –"
        b, t = row["shape"]
        lines.append(f"| {row['name']} | {b} × {t} | {precision} | {c['step_ms']:.1f} | {f['step_ms']:.1f} | {saved} | "
                     f"{label} | {ratio} | {peak} |")
    return "\n".join(lines)


def attention_backward_ratios(*relatives):
    """'llama-1b fp8 1.232× → 1.276×', one per row with a baseline: mxtrain over the baseline."""
    parts = []
    for row in attention_backward_rows(*relatives):
        if row["base"] is None or (row["quantized"] is False and row["precision"] != "bf16"):
            continue
        base = row["base"]["step_ms"]
        mfu = f", MFU {100 * row['fa4']['mfu']:.1f}%" if row["precision"] == "bf16" and "mfu" in row["fa4"] else ""
        parts.append(f"{row['name']} {row['precision']} {base / row['cudnn']['step_ms']:.3f}× → "
                     f"{base / row['fa4']['step_ms']:.3f}×{mfu}")
    return ", ".join(parts)


def kernels_as_measured(r):
    """The --set flags that re-plan a measured line with the kernels it ran: its attention_backward
    and gemm_kernels, or what both were before the lines recorded them (cudnn, cublaslt): since
    both settings default to auto, a build that carries FlashAttention-4's and quack's kernels
    would otherwise plan those."""
    return ["--set", f"train.attention_backward={r.get('attention_backward', 'cudnn')}",
            "--set", f"train.gemm_kernels={r.get('gemm_kernels', 'cublaslt')}"]


def grad_dtype_as_measured(r):
    """The --set flags that re-plan a measured line with the blocks' gradient dtype it ran: its
    grad_dtype, or for an fp8 / fp8-current line from before the lines recorded it, f32 (auto gave
    those recipes BF16 block gradients only from then on; bf16 lines had them all along)."""
    dtype = r.get("grad_dtype", "f32" if r["precision"] in ("fp8", "fp8-current") else None)
    return ["--set", f"precision.grad_dtype={dtype}"] if dtype else []


def plan_as_measured(planner, r):
    """A measured mxtrain bench line re-planned on the H200 with every setting as it ran (kernels,
    the blocks' gradient dtype, gradient clipping, FP8 weight copies; plan_bench_line in
    tests/plan/planner_accuracy_test.cpp does the same for the H100 lines the C++ tests check):
    (line, planned peak bytes, planned ms)."""
    args = ["plan", "-m", r["name"], "-b", str(r["B"]), "-s", str(r["T"]), "-p", r["precision"], "--gpu", "h200",
            "--plan-steps", str(r["warmup_steps"] + r["timed_steps"]), "--json", *kernels_as_measured(r),
            *grad_dtype_as_measured(r)]
    if r["precision"] != "bf16" and "quantized_weights" in r:
        args += ["--set", f"precision.quantized_weights={'true' if r['quantized_weights'] else 'false'}"]
    if "grad_clip" in r:  # the optimizer as it ran (the bench scripts set 0 since 2026-12-02)
        args += ["--set", f"optimizer.grad_clip={r['grad_clip']}"]
    plan = json.loads(planner.run(*args))
    return r, int(plan["memory"]["peak_live_bytes"]), 1e3 * plan["time"]["step_s"]


def fp8_planned_rows(relative, commit, planner):
    """Each mxtrain line of `commit` in the FP8 file re-planned: (line, planned peak bytes, planned ms)."""
    return [plan_as_measured(planner, r) for r in jsonl(relative)
            if r.get("engine") == "mxtrain" and r.get("commit") in commit.split(",")]


def fp8_planned_table(relative, commit, planner):
    lines = ["| model | precision | weight copies | measured peak bytes | planned | measured step ms | planned |",
             "|---|---|---|---|---|---|---|"]
    for r, peak, ms in fp8_planned_rows(relative, commit, planner):
        copies = "–" if r["precision"] == "bf16" else ("none" if r.get("quantized_weights") else "BF16")
        difference = "equal" if peak == r["peak_bytes"] else f"{peak - r['peak_bytes']:+,d} bytes"
        lines.append(f"| {r['name']} {r['B']} × {r['T']} | {r['precision']} | {copies} | {thousands(r['peak_bytes'])} | "
                     f"{thousands(peak)} ({difference}) | {r['step_ms']:.1f} | {ms:.1f} "
                     f"({100 * (ms / r['step_ms'] - 1):+.1f}%) |")
    return "\n".join(lines)


def fp8_planned_summary(relative, commit, planner):
    rows = fp8_planned_rows(relative, commit, planner)
    equal = sum(peak == r["peak_bytes"] for r, peak, _ in rows)
    worst = max(abs(ms / r["step_ms"] - 1) for r, _, ms in rows)
    return (f"planned peak equal to the measured one to the byte on {equal} of {len(rows)} rows, step time within "
            f"{100 * worst:.1f}%")


def attention_backward_planned(planner, *relatives):
    """Each pair of attention_backward_rows re-planned, every line with its own settings: the planned
    peaks and step times against the measured, and the planned saving against the measured."""
    lines, savings = [], []
    for row in attention_backward_rows(*relatives):
        cudnn, fa4 = plan_as_measured(planner, row["cudnn"]), plan_as_measured(planner, row["fa4"])
        lines += [cudnn, fa4]
        savings.append((cudnn[2] - fa4[2], row["cudnn"]["step_ms"] - row["fa4"]["step_ms"]))
    equal = sum(peak == r["peak_bytes"] for r, peak, _ in lines)
    worst_peak = max(abs(peak - r["peak_bytes"]) for r, peak, _ in lines)
    worst = max(abs(ms / r["step_ms"] - 1) for r, _, ms in lines)
    planned_text = f"{min(p for p, _ in savings):.1f}–{max(p for p, _ in savings):.1f}"
    measured_text = f"{min(m for _, m in savings):.1f}–{max(m for _, m in savings):.1f}"
    others = "" if equal == len(lines) else f" (the others at most {worst_peak / 2**20:.1f} MiB apart)"
    return (f"planned peak equal to the measured one to the byte on {equal} of {len(lines)} rows{others}, step time "
            f"within {100 * worst:.1f}%; FlashAttention-4's backward "
            f"planned to save {planned_text} ms a step, measured {measured_text} ms")


# ---- precision curves (mxtrain compare-precision) ---------------------------------------------------

def precision_curves(relative, *columns):
    """The final-loss table of a compare-precision run; `tok_s` adds each format's tokens/s. Runs
    with data.val add the held-out loss after the last step and its gap."""
    data = json.loads(read(relative))
    speed = "tok_s" in columns
    held_out = all(f.get("val_loss", -1) > 0 for f in data["formats"])
    labels = {"fp8": "fp8 (delayed scaling, HYBRID)", "fp8-current": "fp8-current (current scaling, HYBRID)",
              "mxfp8": "mxfp8 (emulated on sm_90)", "nvfp4": "nvfp4 (emulated on sm_90, RHT + stochastic rounding)"}

    def gap(f, key):
        return "–" if f["format"] == data["baseline"] else f"{100 * f[key]:+.2f}%".replace("-", "−")

    lines = [f"| format | final loss (mean of last {data['final_window']} steps) | gap to {data['baseline']} |"
             + (" held-out loss after the last step | gap to " + data["baseline"] + " |" if held_out else "")
             + (" tok/s (this small step; not a throughput benchmark) |" if speed else ""),
             "|---|---|---|" + ("---|---|" if held_out else "") + ("---|" if speed else "")]
    for f in data["formats"]:
        lines.append(f"| {labels.get(f['format'], f['format'])} | {f['final_loss']:.4f} | {gap(f, 'gap_to_baseline')} |"
                     + (f" {f['val_loss']:.4f} | {gap(f, 'val_gap_to_baseline')} |" if held_out else "")
                     + (f" {thousands(f['tokens_per_s'])} |" if speed else ""))
    return "\n".join(lines)


# ---- the tune run (docs/tune-llama-1b) -------------------------------------------------------------

def tune_files():
    return json.loads(read("docs/tune-llama-1b/tune.json")), json.loads(read("docs/tune-llama-1b/grid/tune.json"))


def tune_key(config):
    return (config["micro_batch"], config["micro_batches"], config["recompute"], config["precision"], config["seq_len"])


def check_tune():
    """The acceptance of the tuner: its pick, measured in its own trial, is within 3% of the grid's best."""
    tune, grid = tune_files()
    problems = []
    pick = tune["trials"][tune["best"]]
    ok = [t for t in grid["trials"] if t["status"] == "ok"]
    grid_best = max(t["tokens_per_s"] for t in ok)
    if len(grid["trials"]) != 15:
        problems.append(f"the grid has {len(grid['trials'])} trials, not 15 (micro-batch 1..16 x none/selective/full)")
    if any(t["config"]["global_batch"] != pick["config"]["global_batch"] for t in grid["trials"]):
        problems.append("the grid's global batch differs from the pick's")
    if tune_key(pick["config"]) not in {tune_key(t["config"]) for t in ok}:
        problems.append(f"tune's pick {tune_key(pick['config'])} is not among the grid's configs")
    if tune["model"] != grid["model"] or tune["commit"] != grid["commit"]:
        problems.append("tune and grid were not run on the same model at the same commit")
    if pick["tokens_per_s"] < 0.97 * grid_best:
        problems.append(f"tune's pick reached {pick['tokens_per_s']:.0f} tokens/s, under 97% of the grid's best "
                        f"{grid_best:.0f}")
    return problems


def tune_table():
    tune, grid = tune_files()
    tried = {tune_key(t["config"]): t for t in tune["trials"]}
    pick = tune_key(tune["trials"][tune["best"]]["config"])
    best = max((t for t in grid["trials"] if t["status"] == "ok"), key=lambda t: t["tokens_per_s"])
    lines = ["| config | tune: tokens/s | grid: tokens/s | predicted tokens/s | peak GiB | planned GiB |",
             "|---|---|---|---|---|---|"]
    gib = lambda b: f"{b / 2**30:.2f}"
    for t in sorted(grid["trials"], key=lambda t: -t.get("tokens_per_s", 0)):
        k = tune_key(t["config"])
        label = f"micro-batch {k[0]} × {k[1]}, {k[2]}" + (" (tune's pick)" if k == pick else "")
        mine = tried.get(k)
        tune_cell = "–" if mine is None else (f"**{thousands(mine['tokens_per_s'])}**" if k == pick
                                              else thousands(mine["tokens_per_s"]))
        grid_cell = thousands(t["tokens_per_s"]) if t["status"] == "ok" else t["status"]
        if t is best:
            grid_cell = f"**{grid_cell}** (grid's best)"
        lines.append(f"| {label} | {tune_cell} | {grid_cell} | {thousands(t['config']['tokens_per_s'])} | "
                     f"{gib(t['peak_bytes'])} | {gib(t['predicted_peak_bytes'])} |")
    return "\n".join(lines)


def tune_summary():
    tune, grid = tune_files()
    pick = tune["trials"][tune["best"]]
    ok = [t for t in grid["trials"] if t["status"] == "ok"]
    best = max(ok, key=lambda t: t["tokens_per_s"])
    errors = [abs(t["config"]["tokens_per_s"] / t["tokens_per_s"] - 1) for t in ok]
    same = sum(t["peak_bytes"] == t["predicted_peak_bytes"] for t in ok)
    k = pick["config"]
    return (f"tune's pick (micro-batch {k['micro_batch']} × {k['micro_batches']}, {k['recompute']}) ran at "
            f"{thousands(pick['tokens_per_s'])} tokens/s in its own trial, "
            f"{100 * pick['tokens_per_s'] / best['tokens_per_s']:.1f}% of the grid's best trial "
            f"({thousands(best['tokens_per_s'])} tokens/s, micro-batch {best['config']['micro_batch']} × "
            f"{best['config']['micro_batches']}, {best['config']['recompute']}); the planner of commit "
            f"{tune['commit']} predicted the {len(ok)} grid trials' throughput within {100 * max(errors):.1f}% and "
            f"their peaks to the byte on {same} of {len(ok)}")


# ---- the planner against the H200 (bench/results/planner_accuracy.json) ----------------------------

class Planner:
    """Runs the binary once per question and remembers the answers."""

    def __init__(self, binary):
        self.binary = binary
        self._peaks = None
        self._cross = None

    def run(self, *args):
        if not self.binary or not os.access(self.binary, os.X_OK):
            raise SystemExit(f"derive.py: the planner figures need the mxtrain binary ({self.binary!r} not found): "
                             "build it (./scripts/setup.sh) or pass --binary")
        done = subprocess.run([self.binary, *args], cwd=ROOT, capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"derive.py: {self.binary} {' '.join(args)} failed:\n{done.stdout}{done.stderr}")
        return done.stdout

    def cross_validation(self):
        if self._cross is None:
            self._cross = json.loads(self.run("plan", "--cross-validate", "bench/results/planner_accuracy.json",
                                              "--json"))
            # The calibration files are named relative to the repository, so the file is the same anywhere.
            self._cross["calibration_sources"] = [os.path.relpath(p, ROOT) if os.path.isabs(p) else p
                                                  for p in self._cross.get("calibration_sources", [])]
        return self._cross

    def peaks(self):
        if self._peaks is None:
            report = json.loads(read("bench/results/planner_accuracy.json"))
            rows = []
            for entry in report["entries"]:
                args = ["plan", "--gpu", report["gpu"], "--plan-steps", str(report["plan_steps"]), "--json"]
                # Keys whose defaults changed after the measurement, at their values then (under the set keys).
                # A key changed for some recipes only holds its values then by train.precision.
                precision = entry["set"].get("train.precision", "auto")
                then = {key: value.get(precision) if isinstance(value, dict) else value
                        for key, value in report.get("defaults_at_measurement", {}).items()}
                settings = {**{key: value for key, value in then.items() if value is not None}, **entry["set"]}
                for key, value in settings.items():
                    args += ["--set", f"{key}={value}"]
                plan = json.loads(self.run(*args))
                planned = int(plan["memory"]["peak_live_bytes"])
                measured = int(entry["measured"]["peak_bytes"])
                rows.append({"name": entry["name"], "measured_peak_bytes": measured, "planned_peak_bytes": planned,
                             "difference_bytes": planned - measured,
                             "relative_error": planned / measured - 1})
            self._peaks = {"kind": "planner_peaks",
                           "source": "bench/results/planner_accuracy.json (measured at commit "
                                     f"{report['commit']}), every config re-planned by scripts/derive.py",
                           "gpu": report["gpu"], "entries": rows}
        return self._peaks


def mib(b):
    return f"{b / 2**20:.2f} MiB" if abs(b) >= 2**20 else (f"{b / 2**10:.1f} KiB" if abs(b) >= 1024 else f"{b} bytes")


def planner_summary(planner):
    report = json.loads(read("bench/results/planner_accuracy.json"))
    cross = planner.cross_validation()
    peaks = planner.peaks()["entries"]
    exact = sum(p["difference_bytes"] == 0 for p in peaks)
    worst_peak = max(peaks, key=lambda p: abs(p["difference_bytes"]))
    remeasured = [e["name"] for e in report["entries"] if "measured_note" in e]
    return {
        "configs": len(peaks), "commit": report["commit"], "exact": exact, "worst_peak": worst_peak,
        "remeasured": remeasured, **cross_figures(cross["entries"]),
    }


def cross_figures(rows):
    """Worst and median step-time errors of `mxtrain plan --cross-validate`'s rows, in sample and held out."""
    return {
        "worst_in": max(rows, key=lambda r: abs(r["predicted_error"])),
        "worst_out": max(rows, key=lambda r: abs(r["held_out_error"])),
        "median_in": statistics.median(abs(r["predicted_error"]) for r in rows),
        "median_out": statistics.median(abs(r["held_out_error"]) for r in rows),
    }


def cross_phrase(f):
    """cross_figures as the documents say them."""
    return (f"step time within **{100 * abs(f['worst_in']['predicted_error']):.1f}%** with the committed calibration "
            f"(median {100 * f['median_in']:.1f}%; worst {f['worst_in']['name']}) and within "
            f"**{100 * abs(f['worst_out']['held_out_error']):.1f}%** (median {100 * f['median_out']:.1f}%; worst "
            f"{f['worst_out']['name']}) for each config held out of a fit to the others")


def planner_accuracy_text(planner):
    s = planner_summary(planner)
    p = s["worst_peak"]
    later = (f" (the peak of {', '.join(s['remeasured'])} re-measured later: the entry's `measured_note`)"
             if s["remeasured"] else "")
    return (f"{s['configs']} configs measured at commit `{s['commit']}`{later} and re-planned by this commit's planner: "
            f"planned peak equal to the allocator's measured peak to the byte on {s['exact']} of {s['configs']}, "
            f"at most {mib(abs(p['difference_bytes']))} ({100 * abs(p['relative_error']):.4f}%, {p['name']}) apart; "
            + cross_phrase(s))


def planner_accuracy_table(planner):
    s = planner_summary(planner)
    p = s["worst_peak"]
    return "\n".join([
        "| | worst | typical |", "|---|---|---|",
        f"| peak memory (allocator live bytes) | {mib(abs(p['difference_bytes']))} "
        f"({100 * abs(p['relative_error']):.4f}%, {p['name']}) | 0 bytes on {s['exact']} of {s['configs']} |",
        f"| step time, with the committed calibration | {100 * abs(s['worst_in']['predicted_error']):.1f}% "
        f"({s['worst_in']['name']}) | median {100 * s['median_in']:.1f}% |",
        f"| step time, held out of the fit (leave-one-out) | {100 * abs(s['worst_out']['held_out_error']):.1f}% "
        f"({s['worst_out']['name']}) | median {100 * s['median_out']:.1f}% |"])


def calibration_fit_text():
    fit = json.loads(read("bench/results/planner_accuracy.json"))["calibration_fit"]["gpus"]["h200"]
    return (f"GEMM fraction {fit['gemm']['peak_fraction']:.3f}, attention {fit['attention']['forward_fraction']:.3f} "
            f"forward and {fit['attention']['backward_fraction']:.3f} backward, memory-bound "
            f"{fit['memory']['bandwidth_fraction']:.3f}")


def derived_files(planner):
    report = json.loads(read("bench/results/planner_accuracy.json"))
    return {
        "bench/results/planner_calibration_fit.json": json.dumps(report["calibration_fit"], indent=2) + "\n",
        "bench/results/planner_cross_validation.json": json.dumps(planner.cross_validation(), indent=2) + "\n",
        "bench/results/planner_peaks.json": json.dumps(planner.peaks(), indent=2) + "\n",
    }


# ---- the CPU default run (bench/results/cpu_default_run_*.log) -------------------------------------

def cpu_run(relative):
    text = read(relative)
    header = dict(re.findall(r"^# (\w+): (.*)$", text, re.M))
    steps = [(int(m[0]), float(m[1]), float(m[2].replace(",", "")), float(m[3]))
             for m in re.findall(r"step (\d+)/\d+ \| loss [\d.]+ \|.*?\| ([\d.]+) ms \| ([\d,]+) tok/s \|.*?peak ([\d.]+) MiB",
                                 text)]
    done = re.search(r"done: (\d+) steps \| final loss ([\d.]+) \| held-out loss ([\d.]+) \(ln\(vocab\) = ([\d.]+)\) \| "
                     r"([\d,]+) tok/s", text)
    if not done or not steps:
        raise SystemExit(f"derive.py: {relative} holds no finished run")
    return header, steps, done


def cpu_run_text(relative):
    header, steps, done = cpu_run(relative)
    count, final, held, ln_vocab, tok_s = done.groups()
    median = statistics.median(s[2] for s in steps)
    return (f"`{header['command']}` at commit `{header['commit'][:12]}` ({header['machine']}, {header['date']}): "
            f"{count} steps, final loss {final}, held-out loss {held} (from ln 256 = {ln_vocab}, "
            f"{100 * (1 - float(held) / float(ln_vocab)):.0f}% lower), **{tok_s} tokens/s** over the run (median "
            f"logged step {thousands(median)} tok/s), peak {max(s[3] for s in steps):.1f} MiB; wall time "
            f"{header['wall']}" + (f"; load average {header['load'].split(' (')[0]}" if "load" in header else ""))


def cpu_run_sample(relative):
    """The `mxtrain generate` sample the default-run log ends with: its command, then its text."""
    text = read(relative)
    command = [l[len("# generate: "):] for l in text.splitlines() if l.startswith("# generate: ")]
    sample = [l[len("[generate] "):] for l in text.splitlines() if l.startswith("[generate] ")]
    if not command or not sample:
        raise SystemExit("derive.py: %s holds no generate sample (rerun bench/cpu_default_run.sh)" % relative)
    return "```\n$ " + command[0] + "\n" + "\n".join(sample) + "\n```"


def cpu_run_tail(relative):
    text = read(relative)
    lines = [l for l in text.splitlines() if l.startswith("[rank 0]")]
    last = [i for i, l in enumerate(lines) if re.search(r"step \d+/\d+ \| loss", l)][-1]
    return "```\n" + "\n".join(lines[last:]) + "\n```"


# ---- the soak (bench/soak.py) -------------------------------------------------------------------------

def soak_text(relative):
    """The phrase docs/reliability.md quotes of a soak log: its run, its cycles and its verdict."""
    text = read(relative)
    head = re.search(r"^# soak: (\d+) steps, checkpoint every (\d+), (\d+) random", text, re.M)
    commit = re.search(r"^# commit ([0-9a-f]+);", text, re.M)
    signals = re.findall(r"^cycle \d+: .*; (SIGTERM|SIGKILL) after step (\d+) -> exit", text, re.M)
    final = re.search(r"^final loss: reference (\S+), soaked (\S+)$", text, re.M)
    digest = re.search(r"^final checkpoint rank_00000\.bin sha256: reference (\w+), soaked (\w+)$", text, re.M)
    verdict = re.search(r"^verdict: (.*) \(([\d.]+) s in all\)$", text, re.M)
    if not (head and commit and signals and final and digest and verdict):
        raise SystemExit(f"derive.py: {relative} is not a finished soak log (bench/soak.py)")
    steps, every, cycles = head.groups()
    kills = ", ".join(f"{name} after step {thousands(int(step))}" for name, step in signals)
    return (f"{thousands(int(steps))} steps with a checkpoint every {every}, stopped {cycles} times ({kills}) and "
            f"restarted, at commit `{commit.group(1)[:7]}`: final loss {final.group(2)} (uninterrupted: "
            f"{final.group(1)}), final checkpoint sha256 {digest.group(2)} (uninterrupted: {digest.group(1)}): "
            f"**{verdict.group(1)}**")


def check_soak_results(documents):
    """A cited soak log ended bit-identical."""
    problems = []
    for doc in documents:
        for relative in sorted(set(re.findall(r"bench/results/soak_[a-z]+_[0-9a-f]+\.log", read(doc)))):
            if not os.path.exists(path(relative)):
                problems.append(f"{relative} is cited but not committed")
            elif not re.search(r"^verdict: bit-identical ", read(relative), re.M):
                problems.append(f"{relative}: the soak did not end bit-identical")
    return problems


# ---- the planning table (bench/planning_table.sh) ---------------------------------------------------

def planning_table(planner):
    planner.run("version")  # says what to do when the binary is missing
    return subprocess.run(["bash", path("bench/planning_table.sh"), planner.binary], cwd=ROOT, capture_output=True,
                          text=True, check=True).stdout


# ---- compute-sanitizer on the GPU (tests/cuda/*_on_device.sh) --------------------------------------

def sanitizer_text(*relatives):
    """The phrase docs/reliability.md quotes of compute-sanitizer logs. Racecheck logs of
    tests/cuda/racecheck_each_on_device.sh: each test's verdict line ("## TEST: VERDICT"), the
    last one across the logs in the order given counting (a later log re-runs what an earlier one
    could not finish); the tests that passed in a log with every kernel instrumented (ALL_KERNELS=1)
    are counted apart. A memcheck log of memcheck_processes_on_device.sh (one file): its summary
    line."""
    texts = [read(relative) for relative in relatives]
    if any(re.search(r"^# racecheck", text, re.M) for text in texts):
        verdicts, every = {}, {}
        for text in texts:
            all_kernels = "--print-limit" in text  # ALL_KERNELS=1 lifts the print limit; the command says so
            for name, verdict in re.findall(r"^## ([^:\n]+): (.*)$", text, re.M):
                verdicts[name] = verdict
                every[name] = all_kernels
        counts = dict(clean=0, skipped=0, hazards=0, faults=0, failed=0, not_run=0)
        for verdict in verdicts.values():
            kind = ("clean" if verdict.startswith("passed") else "skipped" if verdict.startswith("skipped")
                    else "hazards" if verdict.startswith("HAZARDS") else "faults" if verdict.startswith("sanitizer fault")
                    else "not_run" if verdict.startswith("not run") else "failed")
            counts[kind] += 1
        clean_every = sum(1 for name, verdict in verdicts.items() if every[name] and verdict.startswith("passed"))
        where = "in mxtrain's kernels"
        if clean_every and clean_every == counts["clean"]:
            where += " (every kernel instrumented)"
        elif clean_every:
            where += f" ({clean_every} of them with every kernel instrumented)"
        return (f"{counts['clean']} of {len(verdicts)} tests passed with 0 hazards {where}, {counts['hazards']} with "
                f"hazards, {counts['faults']} stopped by the sanitizer's own fault in a cuBLASLt GEMM, "
                f"{counts['failed']} did not pass otherwise, {counts['skipped']} skipped, {counts['not_run']} not run")
    if len(texts) != 1:
        raise SystemExit(f"derive.py: sanitizer takes one memcheck log, not {len(texts)}")
    memcheck = re.search(r"^# memcheck over (\d+) processes: (\d+) failed, (\d+) memory-access errors$", texts[0], re.M)
    if memcheck:
        processes, failed, errors = (int(x) for x in memcheck.groups())
        return f"{processes - failed} of {processes} processes ran to the end, with {errors} memory-access errors"
    raise SystemExit(f"derive.py: {relatives[0]} has no summary line of tests/cuda/*_on_device.sh")


def gtest_text(relative):
    """A GoogleTest log's verdict: "all N passed" or "N passed, M failed"."""
    text = read(relative)
    passed = re.findall(r"^\[  PASSED  \] (\d+) tests?\.$", text, re.M)
    failed = re.findall(r"^\[  FAILED  \] (\d+) tests?, listed below:$", text, re.M)
    if not passed and not failed:
        raise SystemExit(f"derive.py: {relative} has no GoogleTest summary line")
    ok = int(passed[-1]) if passed else 0
    if not failed:
        return f"all {ok} passed"
    return f"{ok} passed, {int(failed[-1])} failed"


def quack_probe_shapes(relative):
    """bench/quack_probe.cpp's output: per shape, each kernel's fastest quack configuration, the
    cuBLASLt GEMM of the same shape and the largest relative L2 difference of its outputs."""
    shapes, current = [], None
    for line in read(relative).splitlines():
        m = re.match(r"# quack_probe M=(\d+) H=(\d+) F=(\d+)", line)
        if m:
            current = {"M": int(m[1]), "H": int(m[2]), "F": int(m[3]), "kernels": {}, "errors": {}}
            shapes.append(current)
            continue
        m = re.match(r"(gated|dgated|dx|dw1)\s+(\S+)\s+([\d.]+) ms\s+cuBLASLt\s+([\d.]+) ms", line)
        if m and current is not None:
            current["kernels"][m[1]] = {"config": m[2], "quack": float(m[3]), "cublaslt": float(m[4])}
            continue
        m = re.match(r"(gated|dgated|dx|dw1)( \w+)?\s+([\d.e+-]+)$", line)
        if m and current is not None:
            current["errors"][m[1]] = max(current["errors"].get(m[1], 0.0), float(m[3]))
    if not shapes or any(len(s["kernels"]) != 4 for s in shapes):
        raise SystemExit(f"derive.py: {relative} does not hold four kernels a shape")
    return shapes


def timeline_mean_us(relative, kernel):
    """The mean launch time (us) of the kernels whose name holds `kernel` in a step_timeline.py table."""
    total, launches = timeline_kernel(relative, kernel)
    return 1000.0 * total / launches


def last_step_kernels(relative):
    """A step_timeline.py table's last step: (its GPU time in ms, [(ms, launches, kernel name)])
    in the table's order."""
    step, rows = None, []
    for line in read(relative).splitlines():
        m = re.match(r"# last step: \d+ records, ([\d.]+) ms of GPU time", line)
        if m:
            step, rows = float(m[1]), []
            continue
        m = re.match(r"\s*([\d.]+) ms\s+(\d+)x\s+(.+?)\s*$", line)
        if step is not None and m:
            rows.append((float(m[1]), int(m[2]), m[3]))
    if step is None:
        raise SystemExit(f"derive.py: {relative} has no '# last step' table")
    return step, rows


def timeline_kernel(relative, kernel):
    """(total ms, launches) of the last step's kernel whose name holds `kernel` in a step_timeline.py
    table: the first such line, or with a leading '+' every such line added up (the variants of
    one kernel)."""
    every = kernel.startswith("+")
    kernel = kernel.lstrip("+")
    total, launches, found = 0.0, 0, False
    for ms, count, name in last_step_kernels(relative)[1]:
        if kernel in name:
            if not every:
                return ms, count
            total, launches, found = total + ms, launches + count, True
    if found:
        return total, launches
    raise SystemExit(f"derive.py: {relative} has no kernel named like {kernel!r}")


STEP_CLASSES = (  # (class, a part of the kernel names it takes), the first match wins
    ("GEMMs", ("nvjet", "Gemm", "gemm", "cutlass_80_tensorop", "sm90_xmma")),
    ("attention", ("flash_attn", "sdpa", "fmha")),
    ("AdamW", ("adamw",)),
)


def step_classes(relative):
    """The last step of a step_timeline.py table summed by kind of kernel: GEMMs (cuBLASLt's and
    quack's, fused epilogues included), attention (cuDNN's and FlashAttention-4's kernels, their
    pre- and postprocessing included), AdamW, and everything else (norms, activations, RoPE,
    casts, the loss, reductions, memsets). Returns (traced step ms, {class: ms})."""
    classes = {name: 0.0 for name, _ in STEP_CLASSES}
    classes["the rest"] = 0.0
    step, rows = last_step_kernels(relative)
    for ms, _, kernel in rows:
        kind = next((name for name, parts in STEP_CLASSES if any(p in kernel for p in parts)), "the rest")
        classes[kind] += ms
    if abs(sum(classes.values()) - step) > 0.01 * step:
        raise SystemExit(f"derive.py: {relative}: its last step's kernels do not add up to its span")
    return step, classes


def bar_budget(timeline, vs_torch, name, bar):
    """Where a BF16 step stands against the bar of `bar`× torch.compile: the kernel classes of a
    traced step (step_classes) beside the bench step and torch.compile's of a vs_torch file."""
    bar = float(bar)
    row = next((r for r in vs_torch_rows(vs_torch) if r["ours"]["name"] == name and r["compile"]), None)
    if row is None:
        raise SystemExit(f"derive.py: {vs_torch} has no {name} row beside torch.compile")
    ours, theirs = row["ours"]["step_ms"], row["compile"]["step_ms"]
    want = theirs / bar
    step, classes = step_classes(timeline)
    parts = ", ".join(f"{k} {v:.1f} ms" for k, v in classes.items())
    cut = ours - want
    rest = classes["the rest"]
    head = (f"{name}: torch.compile {theirs:.1f} ms a step, so {bar:.2f}× asks for {want:.1f} ms; mxtrain "
            f"{ours:.1f} ms ({theirs / ours:.3f}×)")
    if cut <= 0:
        return f"{head}, {-cut:.1f} ms under it. Its traced step of {step:.1f} ms: {parts}"
    return (f"{head}, {cut:.1f} ms ({cut / ours * 100:.1f}% of its step) too slow. Its traced step of "
            f"{step:.1f} ms: {parts}; the kernels outside the GEMMs, attention and AdamW would have to shrink "
            f"from {rest:.1f} to {rest - cut:.1f} ms ({cut / rest * 100:.0f}% of them) with the rest as fast as it is")


def timeline_ab(before, after, *kernels):
    """Each named kernel's time in the last step of two step timelines (one binary and another, in
    one call): total ms and launches before, after, and the change. A kernel argument is the part
    of its name to look for, or LABEL=PART to call it LABEL; a PART starting with '+' adds up every
    kernel whose name holds it."""
    parts = []
    for named in kernels:
        label, _, kernel = named.rpartition("=")
        (a, na), (b, nb) = timeline_kernel(before, kernel), timeline_kernel(after, kernel)
        launches = f"{na} launches" if na == nb else f"{na} and {nb} launches"
        parts.append(f"{label or kernel} {a:.3f} → {b:.3f} ms ({launches}, {(b - a) / a * 100:+.1f}%)")
    return "; ".join(parts)


QUACK_PLAIN = {"gated": "x · W1ᵀ", "dgated": "dY · W2", "dx": "dpreact · W1", "dw1": "dpreactᵀ · x"}


def quack_probe_table(relative):
    lines = ["| shape M×H, F | kernel | quack, fastest configuration | cuBLASLt, plain GEMM | quack − cuBLASLt | largest rel. L2 difference |",
             "|---|---|---|---|---|---|"]
    for s in quack_probe_shapes(relative):
        for name in ("gated", "dgated", "dx", "dw1"):
            k = s["kernels"][name]
            lines.append(f"| {s['M']}×{s['H']}, {s['F']} | {name} | {k['quack']:.4f} ms ({k['config']}) | "
                         f"{k['cublaslt']:.4f} ms ({QUACK_PLAIN[name]}) | {k['quack'] - k['cublaslt']:+.4f} ms | "
                         f"{s['errors'].get(name, 0.0):.1e} |")
    return "\n".join(lines)


def quack_probe_layer(relative, timeline, layers):
    """What a llama-1b layer would save with quack's kernels: the probe's first shape, and the
    trainer's SwiGLU kernels' mean launch times from a step timeline at that shape."""
    k = quack_probe_shapes(relative)[0]["kernels"]
    fwd = timeline_mean_us(timeline, "swiglu_forward_kernel") / 1000.0
    bwd = timeline_mean_us(timeline, "swiglu_backward_kernel") / 1000.0
    d = {name: k[name]["quack"] - k[name]["cublaslt"] for name in k}
    concat = d["gated"] - fwd + d["dgated"] - bwd + d["dx"] + d["dw1"]
    interleaved = d["gated"] - fwd + d["dgated"] - bwd + min(d["dx"], 0.0)
    n = int(layers)
    return (f"the trainer's SwiGLU forward and backward kernels take {fwd:.3f} and {bwd:.3f} ms a launch in the step; "
            f"with the weights kept [gate; up] (all four GEMMs quack's) a layer would change by {concat:+.3f} ms "
            f"({n} layers: {n * concat:+.1f} ms a step); with the gate/up weight stored interleaved (the weight "
            f"gradient then cuBLASLt's, the input gradient the faster of the two) by {interleaved:+.3f} ms "
            f"({n * interleaved:+.1f} ms a step)")


def gemm_kernels_ab(relative, autotune):
    """The train.gemm_kernels A/B: each model's runs with cuBLASLt alone and with quack's GEMMs among
    the autotune's candidates (the value was called auto when it ran), and how many GEMM shapes
    the autotune gave to quack."""
    runs = {}
    for r in jsonl(relative):
        kernels = "cublaslt" if r["gemm_kernels"] == "cublaslt" else "quack"
        runs.setdefault(r["name"], {}).setdefault(kernels, []).append(r["step_ms"])
    picks, name = {}, None
    for line in read(autotune).splitlines():
        m = re.match(r"# (\S+)_auto:", line)
        if m:
            name = m[1]
            picks[name] = [0, 0]
        elif "gemm autotune" in line and name:
            picks[name][1] += 1
            picks[name][0] += "chose quack" in line
    parts = []
    for model, r in runs.items():
        a, b = r["cublaslt"], r["quack"]
        ma, mb = sum(a) / len(a), sum(b) / len(b)
        ms = lambda xs: " and ".join(f"{x:.1f}" for x in xs)
        parts.append(f"{model} {ms(a)} ms with cuBLASLt alone, {ms(b)} ms with quack's GEMMs among the candidates "
                     f"({(mb - ma) / ma * 100:+.1f}%; quack chosen for {picks[model][0]} of {picks[model][1]} GEMM shapes)")
    return "; ".join(parts)


def swiglu_ab(relative, name):
    """The alternating train.gemm_kernels = cublaslt / cublaslt+quack-swiglu A/B of `name`: each
    setting's step times in file order, their means, in how many pairs the fused one was faster,
    and the peak memory when both settings agree on it."""
    runs = {"cublaslt": [], "cublaslt+quack-swiglu": []}
    peaks = set()
    for r in jsonl(relative):
        if r.get("engine") == "mxtrain" and r["name"] == name and r["gemm_kernels"] in runs:
            runs[r["gemm_kernels"]].append(r["step_ms"])
            peaks.add(r["peak_bytes"])
    a, b = runs["cublaslt"], runs["cublaslt+quack-swiglu"]
    if not a or len(a) != len(b):
        raise SystemExit(f"derive.py: {relative} has no alternating pairs of {name}")
    ma, mb, faster = pairs(a, b)
    ms = lambda xs: ", ".join(f"{x:.1f}" for x in xs)
    peak = (f"; peak memory {next(iter(peaks)) / 2**30:.2f} GiB with either" if len(peaks) == 1
            else "; peak memory differs")
    return (f"{name}: {ms(a)} ms with cuBLASLt and the SwiGLU kernel, {ms(b)} ms with quack's gated GEMM "
            f"(means {ma:.1f} and {mb:.1f} ms, {(mb - ma) / ma * 100:+.1f}%; the fused step faster in {faster} of "
            f"{len(a)} pairs){peak}")


def pairs(a, b):
    """Alternating runs a[i], b[i]: the two means and in how many pairs b was faster."""
    return sum(a) / len(a), sum(b) / len(b), sum(y < x for x, y in zip(a, b))


def binary_ab(before, after, name):
    """Two binaries run alternately in one call, their lines in two files (the device's stale git
    metadata gives both the same commit field): `name`'s step times in file order, the means, in
    how many pairs the second was faster, and the peak when every run agrees on it."""
    runs = [[r for r in jsonl(f) if r.get("engine") == "mxtrain" and r["name"] == name] for f in (before, after)]
    a, b = ([r["step_ms"] for r in side] for side in runs)
    if not a or len(a) != len(b):
        raise SystemExit(f"derive.py: {before} and {after} have no pairs of {name}")
    peaks = {r["peak_bytes"] for side in runs for r in side}
    ma, mb, faster = pairs(a, b)
    ms = lambda xs: ", ".join(f"{x:.2f}" for x in xs)
    peak = f"; peak {next(iter(peaks)) / 2**30:.2f} GiB in every run" if len(peaks) == 1 else "; peaks differ"
    return (f"{name}: {ms(a)} ms before, {ms(b)} ms after (means {ma:.2f} and {mb:.2f} ms, "
            f"{(mb - ma) / ma * 100:+.2f}%; after faster in {faster} of {len(a)} pairs){peak}")


def head_loss_timings(relative):
    """CudaOpTimings.DISABLED_HeadLoss's lines: a chunk of each model's LM head and loss, chunked
    and as quack's linear cross-entropy."""
    rows = re.findall(r"^\[ time  \] head_loss (\S+) \S+ +(\d+)-row chunk, hidden +(\d+), V(\d+): chunked +([\d.]+) ms, "
                      r"quack-lce +([\d.]+) ms", read(relative), re.M)
    if not rows:
        raise SystemExit(f"derive.py: {relative} has no head_loss timing lines")
    return "; ".join(f"{name} ({int(chunk):,}-row chunk, hidden {hidden}, {int(vocab):,} columns) {float(a):.3f} → "
                     f"{float(b):.3f} ms ({float(a) / float(b):.3f}×)" for name, chunk, hidden, vocab, a, b in rows)


def head_loss_errors(relative):
    """CudaQuackHeadLoss's measured errors: the largest relative L2 of each output, each path."""
    found = re.findall(r"^\[ error \] head loss, (chunked|quack-lce): (loss|dx|dW) .* rel L2 (\S+)$", read(relative), re.M)
    if not found:
        raise SystemExit(f"derive.py: {relative} has no head loss error lines")
    worst = {}
    for path, what, err in found:
        worst[(path, what)] = max(worst.get((path, what), 0.0), float(err))
    cases = len(found) // 6
    return "; ".join(f"{path} loss {worst[(path, 'loss')]:.1e}, dx {worst[(path, 'dx')]:.1e}, "
                     f"dW {worst[(path, 'dW')]:.1e}" for path in ("quack-lce", "chunked")) + f" (largest of {cases} shapes)"


def gelu_gemm_timings(relative):
    """CudaOpTimings.DISABLED_GeluGemms's lines: GPT-2's two GELU GEMMs a layer, the plain GEMM of
    the same size beside cuBLASLt's GELU epilogue and quack's."""
    rows = re.findall(r"^\[ time  \] gelu_gemm (\S+) \S+ +(forward|backward) +(\S+): plain GEMM ([\d.]+) ms, "
                      r"cuBLASLt ([\d.]+) ms, quack ([\d.]+) ms", read(relative), re.M)
    if not rows:
        raise SystemExit(f"derive.py: {relative} has no gelu_gemm timing lines")
    return "; ".join(f"{name} {direction} ({shape}) plain {float(p):.3f}, cuBLASLt {float(c):.3f}, quack {float(q):.3f} ms "
                     f"({float(c) / float(q):.2f}×)" for name, direction, shape, p, c, q in rows)


def gelu_gemm_errors(relative):
    """CudaQuackGelu's measured errors against the CPU oracle: the largest relative L2 of quack's
    configurations run one by one, and of the backend's GELU GEMMs, over the shapes."""
    text = read(relative)
    configs = [float(e) for e in re.findall(r"^\[ error \] quack d?gelu \S+: (?:pre|out|dx) .* rel L2 (\S+)$", text, re.M)]
    backend = [float(e) for e in re.findall(r"^\[ error \] (?:GELU (?:pre-activation|activation)|DGELU input gradient) "
                                             r"\d.* rel L2 (\S+)$", text, re.M)]
    if not configs or not backend:
        raise SystemExit(f"derive.py: {relative} has no GELU GEMM error lines")
    return (f"{len(configs)} outputs of quack's configurations at most {max(configs):.1e}, the backend's GELU GEMMs "
            f"at most {max(backend):.1e}")


def dgelu_bias(relative):
    """The DGELU GEMM that sums the up projection's bias gradient (CudaQuackGelu's errors, and
    CudaOpTimings.DISABLED_GeluGemms's backward with the bias gradient)."""
    text = read(relative)
    configs = [float(e) for e in re.findall(r"^\[ error \] quack dgelub \S+: bias gradient .* rel L2 (\S+)$", text, re.M)]
    # The backend's bias gradient at the shapes quack's kernels take (the others run the column sum).
    shapes = set(re.findall(r"^\[ error \] quack dgelub \S+: bias gradient (\S+)", text, re.M))
    fused = [float(e) for shape, e in re.findall(r"^\[ error \] DGELU bias gradient (?:added to )?(\d\S*) +rel L2 (\S+)$",
                                                 text, re.M) if shape in shapes]
    apart = [float(e) for e in re.findall(r"^\[ error \] DGELU bias gradient, cuBLASLt and column sum .* rel L2 (\S+)$",
                                          text, re.M)]
    times = re.findall(r"^\[ time  \] gelu_gemm (\S+) \S+ +backward with the bias gradient (\S+): cuBLASLt \+ column sum "
                       r"([\d.]+) ms, quack ([\d.]+) ms", text, re.M)
    if not configs or not fused or not apart or not times:
        raise SystemExit(f"derive.py: {relative} has no DGELU bias-gradient lines")
    timing = "; ".join(f"{name} ({shape}) cuBLASLt's DGELU and the column sum {float(c):.3f} ms, quack's with the "
                       f"partial sums {float(q):.3f} ms ({float(c) / float(q):.2f}×)" for name, shape, c, q in times)
    return (f"bias gradient against the oracle: {len(configs)} sums of quack's configurations at most "
            f"{max(configs):.1e}, Backend::gemm's with quack's GELU GEMMs at most {max(fused):.1e}, cuBLASLt's DGELU with "
            f"the column sum at most {max(apart):.1e}; {timing}")


def planner_report(relative):
    """A measured accuracy report as its harness wrote it (predictions of the planner of the
    measurement's commit, not re-planned): peaks and step times against the measurements."""
    report = json.loads(read(relative))
    rows = [e for e in report["entries"] if "peak_bytes" in e.get("measured", {})]
    if not rows:
        raise SystemExit(f"derive.py: {relative} has no measured entries")
    diffs = [(e["predicted"]["peak_bytes"] - e["measured"]["peak_bytes"], e["name"]) for e in rows]
    exact = sum(d == 0 for d, _ in diffs)
    worst_peak = max(diffs, key=lambda x: abs(x[0]))
    errors = [(abs(e["step_time_relative_error"]), e["name"]) for e in rows]
    worst = max(errors)
    within = sum(err <= 0.10 for err, _ in errors)
    peak = "" if exact == len(rows) else f", at most {mib(abs(worst_peak[0]))} apart ({worst_peak[1]})"
    return (f"{len(rows)} configs on one {report['gpu_name']} (`--gpu {report['gpu']}`): planned peak equal to the "
            f"allocator's measured peak to the byte on {exact} of {len(rows)}{peak}; step time within "
            f"{100 * worst[0]:.1f}% (median {100 * statistics.median(err for err, _ in errors):.1f}%; worst {worst[1]}), "
            f"{within} of {len(rows)} within 10%")


def planner_cross_validation(planner, relative):
    """A measured accuracy report re-planned by this commit's planner with the committed
    calibration, and each config held out of a fit to the others (`mxtrain plan --cross-validate`)."""
    cross = json.loads(planner.run("plan", "--cross-validate", relative, "--json"))
    return "re-planned by this commit's planner: " + cross_phrase(cross_figures(cross["entries"]))


def mfu_of(relative, name, gemm_kernels):
    """The MFU of each mxtrain line of `name` run with `gemm_kernels`, in file order: "59.97% and 59.90%"."""
    values = [f"{100 * r['mfu']:.2f}%" for r in jsonl(relative)
              if r.get("engine") == "mxtrain" and r["name"] == name and r.get("gemm_kernels") == gemm_kernels]
    if not values:
        raise SystemExit(f"derive.py: {relative} has no mxtrain line of {name} with gemm_kernels {gemm_kernels}")
    return " and ".join(values)


# ---- the documents ----------------------------------------------------------------------------------

def generate(kind, args, planner):
    generators = {
        "vs-torch-table": lambda: vs_torch_table(*args),
        "vs-torch-ratios": lambda: vs_torch_ratios(*args),
        "ab-steps": lambda: ab_steps(*args),
        "long-context-table": lambda: long_context_table(*args),
        "fp8-table": lambda: fp8_table(*args),
        "fp8-ratios": lambda: fp8_ratios(*args),
        "attention-backward-table": lambda: attention_backward_table(*args),
        "attention-backward-ratios": lambda: attention_backward_ratios(*args),
        "attention-backward-planned": lambda: attention_backward_planned(planner, *args),
        "precision-curves": lambda: precision_curves(*args),
        "tune-table": tune_table,
        "tune-summary": tune_summary,
        "planner-accuracy": lambda: planner_accuracy_text(planner),
        "fp8-planned": lambda: fp8_planned_table(*args, planner),
        "fp8-planned-summary": lambda: fp8_planned_summary(*args, planner),
        "planner-accuracy-table": lambda: planner_accuracy_table(planner),
        "calibration-fit": calibration_fit_text,
        "cpu-run": lambda: cpu_run_text(*args),
        "cpu-run-tail": lambda: cpu_run_tail(*args),
        "cpu-run-sample": lambda: cpu_run_sample(*args),
        "soak": lambda: soak_text(*args),
        "sanitizer": lambda: sanitizer_text(*args),
        "gtest": lambda: gtest_text(*args),
        "quack-probe-table": lambda: quack_probe_table(*args),
        "quack-probe-layer": lambda: quack_probe_layer(*args),
        "gemm-kernels-ab": lambda: gemm_kernels_ab(*args),
        "mfu": lambda: mfu_of(*args),
        "swiglu-ab": lambda: swiglu_ab(*args),
        "binary-ab": lambda: binary_ab(*args),
        "timeline-ab": lambda: timeline_ab(*args),
        "bar-budget": lambda: bar_budget(*args),
        "head-loss-timings": lambda: head_loss_timings(*args),
        "head-loss-errors": lambda: head_loss_errors(*args),
        "gelu-gemm-timings": lambda: gelu_gemm_timings(*args),
        "gelu-gemm-errors": lambda: gelu_gemm_errors(*args),
        "dgelu-bias": lambda: dgelu_bias(*args),
        "planner-report": lambda: planner_report(*args),
        "planner-cross-validation": lambda: planner_cross_validation(planner, *args),
    }
    if kind not in generators:
        raise SystemExit(f"derive.py: unknown derived kind {kind!r}")
    return generators[kind]()


def regenerate(text, planner):
    def replace(match):
        kind, args, old = match.group(1), match.group(2).split(), match.group(3)
        new = generate(kind, args, planner)
        if old.startswith("\n"):  # a block: the text sits on its own lines
            new = "\n" + new + "\n"
        return f"<!-- derived:{kind}{match.group(2)} -->{new}<!-- /derived -->"
    text = MARKER.sub(replace, text)
    begin, end = "<!-- planning-table:begin -->\n", "<!-- planning-table:end -->"
    if begin in text:
        head, rest = text.split(begin, 1)
        _, tail = rest.split(end, 1)
        text = head + begin + planning_table(planner) + end + tail
    return text


def check_gpu_results(documents):
    """The GPU logs the documents cite say what the documents say of them: a cited
    h100_/h200_cuda_tests_*.log ran its tests and every one passed; every case of a cited
    h100_/h200_hf_roundtrip_*.jsonl is within its 1e-4 bound."""
    problems = []
    cited = set()
    for doc in documents:
        cited.update(re.findall(r"bench/results/h[12]00_(?:cuda_tests|hf_roundtrip)_[0-9a-f]+\.(?:log|jsonl)", read(doc)))
    for relative in sorted(cited):
        if not os.path.exists(path(relative)):
            problems.append(f"{relative} is cited but not committed")
        elif relative.endswith(".log"):
            text = read(relative)
            if not re.search(r"^\[  PASSED  \] \d+ tests?\.$", text, re.M) or re.search(r"^\[  FAILED  \]", text, re.M):
                problems.append(f"{relative}: not every GPU test passed")
        else:
            cases = [json.loads(line) for line in read(relative).splitlines() if '"case"' in line]
            if not cases or not all(c["ok"] and c["relative_difference"] <= 1e-4 for c in cases):
                problems.append(f"{relative}: a round-trip case is off")
    return problems


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if anything would change")
    parser.add_argument("--binary", default=os.environ.get("MXTRAIN_BINARY", path("build/auto/mxtrain")))
    options = parser.parse_args()
    planner = Planner(os.path.abspath(options.binary))
    outputs = {}
    documents = ["README.md"] + sorted(os.path.relpath(os.path.join(d, f), ROOT)
                                       for d, _, files in os.walk(path("docs")) for f in files if f.endswith(".md"))
    # The results' own notes where they quote their data through a marker.
    documents += sorted(os.path.relpath(p, ROOT) for p in glob.glob(path("bench/results/*.md"))
                        if "<!-- derived:" in read(os.path.relpath(p, ROOT)))
    for doc in documents:
        outputs[doc] = regenerate(read(doc), planner)
    outputs.update(derived_files(planner))
    stale = []
    for relative, new in outputs.items():
        old = read(relative) if os.path.exists(path(relative)) else ""
        if old == new:
            continue
        stale.append(relative)
        if options.check:
            sys.stdout.writelines(difflib.unified_diff(old.splitlines(True), new.splitlines(True),
                                                       "a/" + relative, "b/" + relative))
        else:
            with open(path(relative), "w") as f:
                f.write(new)
            print(f"derive.py: rewrote {relative}")
    problems = check_tune() + check_gpu_results(documents) + check_soak_results(documents)
    for problem in problems:
        print(f"derive.py: results check failed: {problem}")
    if options.check and stale:
        print(f"derive.py: {', '.join(stale)} disagree with the committed measurements: run "
              "python3 scripts/derive.py and commit the result")
    if problems or (options.check and stale):
        return 1
    print(f"derive.py: {len(outputs)} files {'checked' if options.check else 'current'}, tune, GPU and soak results checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
