"""bench/step_timeline.py on a made-up CUPTI trace whose answers are known: the steps it finds
(the span, busy and idle time of each), the largest gap with its neighbours, the per-kernel
table of the last step, and the --sequence file (launch order, offsets, gaps).

Usage: python3 tests/bench/step_timeline_test.py [bench/step_timeline.py]"""
import csv, os, subprocess, sys, tempfile

tool = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "../../bench/step_timeline.py")
us = 1000  # ns


def trace_rows():
    """Five steps. Each: a memset (1 us), a 2 us gap, 60 GEMMs of 10 us back to back, a 5 us gap,
    then AdamW (20 us). The last step's first GEMM overlaps the memset by 0.5 us (a second stream)."""
    rows, t = [], 0
    for step in range(5):
        rows.append(("S", t, t + 1 * us, "memset bytes 4"))
        t += 3 * us
        if step == 4:
            t -= int(2.5 * us)
        for i in range(60):
            rows.append(("K", t, t + 10 * us, "gemm_%d" % (i % 2)))
            t += 10 * us
        t += 5 * us
        rows.append(("K", t, t + 20 * us, "adamw_kernel"))
        t += 20 * us
    return rows


def check(condition, message):
    if not condition:
        sys.exit("step_timeline_test: " + message)


with tempfile.TemporaryDirectory() as work:
    trace = os.path.join(work, "trace.csv")
    with open(trace, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["kind", "start_ns", "end_ns", "stream", "name"])
        for kind, s, e, name in trace_rows():
            w.writerow([kind, s, e, 7, name])
    sequence = os.path.join(work, "sequence.txt")
    out = subprocess.run([sys.executable, tool, trace, "--steps", "3", "--sequence", sequence],
                         capture_output=True, text=True)
    check(out.returncode == 0, "the tool failed: " + out.stderr)
    lines = out.stdout.splitlines()
    steps = [l.split() for l in lines[1:4]]
    # A step runs from one AdamW's end to the next: memset 1 + gap 2 + GEMMs 600 + gap 5 + AdamW 20 us
    # (628 us, 7 us idle); the last one 625.5 us with 5 us idle (its first GEMM overlaps the memset).
    for n, (span, busy, idle) in enumerate([(0.628, 0.621, 0.007)] * 2 + [(0.6255, 0.6205, 0.005)]):
        got = tuple(float(x) for x in steps[n][1:4])
        check(abs(got[0] - span) < 1e-3 and abs(got[1] - busy) < 1e-3 and abs(got[2] - idle) < 1e-3,
              "step %d: span/busy/idle %s, expected %s" % (n, got, (span, busy, idle)))
        check(steps[n][4] == "62", "step %d: %s records, expected 62" % (n, steps[n][4]))
    gap = next(l for l in lines if "->" in l and not l.startswith("#"))
    check(gap.split()[0] == "5.0" and "gemm_1" in gap and "adamw_kernel" in gap,
          "largest gap of the last step: %r, expected 5.0 us gemm_1 -> adamw_kernel" % gap)
    table = {l.split()[3]: (float(l.split()[0]), l.split()[2]) for l in lines if " ms " in l and "x  " in l}
    check(table.get("gemm_0") == (0.3, "30x") and table.get("adamw_kernel") == (0.02, "1x"),
          "last step's kernel table: %s" % table)
    with open(sequence) as f:
        seq = [l.split() for l in f if not l.startswith("#")]
    check(len(seq) == 62, "sequence has %d records, expected 62" % len(seq))
    check(seq[0][3:] == ["memset", "bytes", "4"] and seq[1][3] == "gemm_0" and seq[-1][3] == "adamw_kernel",
          "sequence order: %s ... %s" % (seq[:2], seq[-1]))
    # Offsets from the last AdamW's end; the overlapping GEMM starts 0.5 us after it (gap 0 against
    # the memset's end), AdamW 5 us after the last GEMM.
    check(seq[0][0] == "0.0" and seq[1][0] == "0.5" and seq[1][2] == "-0.5" and seq[-1][2] == "5.0",
          "sequence offsets and gaps: %s %s %s" % (seq[0], seq[1], seq[-1]))
print("step_timeline_test: passed")
