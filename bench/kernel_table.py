"""Kernel-time table of one steady-state mxtrain step from an ncu CSV
(ncu --csv --metrics gpu__time_duration.sum ...). The step is the last one that ends with the
AdamW kernel. Usage: python3 bench/kernel_table.py ncu.csv"""
import csv, sys, collections
rows = [r for r in csv.DictReader(l for l in open(sys.argv[1]) if l.startswith('"'))]
kern = []
for r in rows:
    if r.get("Metric Name") != "gpu__time_duration.sum": continue
    v = float(r["Metric Value"].replace(",", ""))
    unit = r.get("Metric Unit", "nsecond")
    ns = v * {"nsecond": 1, "usecond": 1e3, "msecond": 1e6, "ns": 1, "us": 1e3, "ms": 1e6}.get(unit, 1)
    kern.append((r["Kernel Name"], ns))
# The last step: from after the previous step's AdamW launches (a gap of more than 50 kernels
# between AdamW launches marks a step boundary) to the last AdamW launch.
ends = [i for i, (n, _) in enumerate(kern) if "adamw" in n.lower()]
last = ends[-1]
start = 0
for before, after in zip(reversed(ends[:-1]), reversed(ends[1:])):
    if after - before > 50:
        start = before + 1
        break
step = kern[start:last + 1]
agg = collections.OrderedDict()
for n, ns in step:
    a = agg.setdefault(n, [0, 0.0]); a[0] += 1; a[1] += ns
total = sum(ns for _, ns in step)
print(f"# one step: {len(step)} kernels, {total/1e6:.2f} ms of kernel time")
for n, (c, ns) in sorted(agg.items(), key=lambda kv: -kv[1][1]):
    print(f"{ns/1e6:9.3f} ms {c:5d}x  {n[:160]}")
