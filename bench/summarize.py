"""Pairs mxtrain and PyTorch measurements of one benchmark file (JSON lines from bench/vs_torch.sh)
and prints the markdown table the README shows. Usage: python3 bench/summarize.py FILE.jsonl"""
import json, sys

ALIASES = {"gpt2-124M": "gpt2-124m", "gpt2-1.5B": "gpt2-1.5b", "tinyllama-1.1B": "llama-1b", "llama-3b": "llama-3b",
           "te-fsdp-10L": "te-fsdp"}


def key(record):
    name = ALIASES.get(record.get("name"), record.get("name"))
    recompute = record.get("recompute", "full" if record.get("ckpt") else "none")
    return (name, record.get("B"), record.get("T"), "none" if recompute in ("none", False) else "full")


def main(path):
    records = [json.loads(line) for line in open(path) if line.strip().startswith("{")]
    ours = {key(r): r for r in records if r.get("engine") == "mxtrain"}
    eager = {key(r): r for r in records if r.get("engine") != "mxtrain" and not r.get("compile") and "tok_s" in r}
    compiled = {key(r): r for r in records if r.get("engine") != "mxtrain" and r.get("compile") and "tok_s" in r}
    print("| model | batch x seq | recompute | mxtrain tok/s | PyTorch eager tok/s | torch.compile tok/s | "
          "mxtrain / best PyTorch | peak GiB mxtrain / eager / compile | MFU |")
    print("|---|---|---|---|---|---|---|---|---|")
    for k, r in ours.items():
        e, c = eager.get(k), compiled.get(k)
        if not r.get("fits", True):
            print(f"| {k[0]} | {k[1]}x{k[2]} | {k[3]} | out of memory | | | | | |")
            continue
        best = max([x["tok_s"] for x in (e, c) if x] or [0])
        ratio = f"{r['tok_s'] / best:.3f}x" if best else "-"  # 3 decimals: 1.096x is not 1.10x
        peaks = " / ".join(f"{x['peak_gib']:.1f}" if x else "-" for x in (r, e, c))
        fmt = lambda x: f"{x['tok_s']:,.0f}" if x else "-"
        mfu = f"{100 * r['mfu']:.1f}%" if "mfu" in r else "-"
        print(f"| {k[0]} | {k[1]}x{k[2]} | {k[3]} | {fmt(r)} | {fmt(e)} | {fmt(c)} | {ratio} | {peaks} | {mfu} |")


if __name__ == "__main__":
    main(sys.argv[1])
