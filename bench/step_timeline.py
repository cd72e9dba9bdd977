"""Where a training step's wall time goes, from a CUPTI trace (bench/cupti_trace.cpp): per step,
the span between the ends of two optimizer phases, the time the GPU ran something (union of
kernel, memcpy and memset intervals) and the idle rest; the largest idle gaps with their
neighbours; and the kernel time of the last step by kernel name, at the clocks of a real step.

Usage: python3 bench/step_timeline.py trace.csv [--steps 3] [--end REGEX] [--top 30] [--sequence FILE]
--sequence writes the last step's records in launch order (start offset, duration, gap before,
name) to FILE: which launch sits where, e.g. what a memset precedes.
The optimizer's kernels (REGEX, default adamw|multi_tensor_apply) mark the end of a step; a run
of them with fewer than 50 other records between belongs to one step."""
import argparse, collections, csv, re

ap = argparse.ArgumentParser()
ap.add_argument("trace")
ap.add_argument("--steps", type=int, default=3)
ap.add_argument("--end", default="adamw|multi_tensor_apply")
ap.add_argument("--top", type=int, default=30)
ap.add_argument("--sequence")
a = ap.parse_args()

recs = sorted(((int(r["start_ns"]), int(r["end_ns"]), r["kind"], r["name"]) for r in csv.DictReader(open(a.trace))))
end_re = re.compile(a.end, re.I)
opt = [i for i, r in enumerate(recs) if r[2] == "K" and end_re.search(r[3])]
if not opt:
    raise SystemExit("no optimizer kernel matches --end %r" % a.end)
# Last optimizer record of each step.
step_ends = [i for i, j in zip(opt, opt[1:] + [None]) if j is None or j - i > 50]
if len(step_ends) < a.steps + 1:
    raise SystemExit("the trace has %d steps; need %d" % (len(step_ends), a.steps + 1))


def busy(lo, hi):
    """Union of record intervals inside [recs[lo].end, recs[hi].end]."""
    t0 = recs[lo][1]
    total, cur_s, cur_e, gaps = 0, None, None, []
    prev = lo
    for i in range(lo + 1, hi + 1):
        s, e = max(recs[i][0], t0), recs[i][1]
        if cur_e is None:
            gaps.append((s - t0, prev, i))
            cur_s, cur_e = s, e
        elif s > cur_e:
            total += cur_e - cur_s
            gaps.append((s - cur_e, prev, i))
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
        prev = i if recs[i][1] >= recs[prev][1] else prev
    total += cur_e - cur_s
    return total, gaps


print("%-6s %10s %10s %10s %8s" % ("step", "span ms", "busy ms", "idle ms", "records"))
all_gaps = []
for n, (lo, hi) in enumerate(zip(step_ends[-a.steps - 1:-1], step_ends[-a.steps:])):
    span = recs[hi][1] - recs[lo][1]
    b, gaps = busy(lo, hi)
    all_gaps = gaps
    print("%-6d %10.3f %10.3f %10.3f %8d" % (n, span / 1e6, b / 1e6, (span - b) / 1e6, hi - lo))

lo, hi = step_ends[-2], step_ends[-1]
print("\n# largest idle gaps of the last step (us, record before -> record after)")
for g, i, j in sorted(all_gaps, reverse=True)[:12]:
    print("%9.1f  %s  ->  %s" % (g / 1e3, recs[i][3][:70], recs[j][3][:70]))
hist = collections.Counter()
for g, _, _ in all_gaps:
    hist["< 2 us" if g < 2e3 else "2-5 us" if g < 5e3 else "5-20 us" if g < 2e4 else ">= 20 us"] += g
print("idle by gap size: " + ", ".join("%s %.3f ms" % (k, v / 1e6) for k, v in sorted(hist.items())))

agg = collections.OrderedDict()
for s, e, kind, name in recs[lo + 1:hi + 1]:
    x = agg.setdefault(name, [0, 0])
    x[0] += 1
    x[1] += e - s
total = sum(v[1] for v in agg.values())
print("\n# last step: %d records, %.2f ms of GPU time (real clocks)" % (hi - lo, total / 1e6))
for name, (c, ns) in sorted(agg.items(), key=lambda kv: -kv[1][1])[:a.top]:
    print("%9.3f ms %5dx  %s" % (ns / 1e6, c, name[:150]))

if a.sequence:
    with open(a.sequence, "w") as out:
        out.write("# %10s %9s %9s  name (the last step's records in start order)\n" % ("start us", "dur us", "gap us"))
        t0, prev_end = recs[lo][1], recs[lo][1]
        for s, e, kind, name in recs[lo + 1:hi + 1]:
            out.write("%12.1f %9.1f %9.1f  %s\n" % ((s - t0) / 1e3, (e - s) / 1e3, (s - prev_end) / 1e3, name[:110]))
            prev_end = max(prev_end, e)
