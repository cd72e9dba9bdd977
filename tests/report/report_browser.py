#!/usr/bin/env python3
"""The run report in a real browser (headless Chromium from Debian, `chromium`).

A short CPU run writes RUN_DIR/report.html; Chromium loads it from disk, dumps the DOM and renders
a PNG. The test fails when the browser logs any console message (the page has no script, and its
Content-Security-Policy forbids loading anything: a stray external reference becomes a console
message), when a section of the report is missing from the rendered DOM or has no content, or when
the screenshot is not a PNG of the window's size. A control page with a console error, an
uncaught exception and a blocked external image must be caught by the same check, so the check
itself is known to work.

usage: report_browser.py MXTRAIN CORPUS_DIR WORK_DIR
"""
import os
import re
import shutil
import struct
import subprocess
import sys

WIDTH, HEIGHT = 1280, 5200
SECTIONS = ["summary", "loss", "throughput", "memory", "step-time", "startup", "config", "checkpoints",
            "samples", "warnings"]


def find_chromium():
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    sys.exit("FAIL: no chromium on PATH: install the Debian package (apt-get install chromium; scripts/setup.sh does)")


def browse(chromium, page, *arguments):
    """Runs headless Chromium on a file; returns (stdout, console messages)."""
    command = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
               "--enable-logging=stderr", "--v=0", "--user-data-dir=" + os.path.join(os.path.dirname(page), "profile"),
               *arguments, "file://" + os.path.abspath(page)]
    run = subprocess.run(command, capture_output=True, text=True, errors="replace", timeout=120)
    if run.returncode != 0:
        sys.exit("FAIL: chromium exited %d: %s" % (run.returncode, run.stderr[-800:]))
    console = [line for line in run.stderr.splitlines() if re.search(r":CONSOLE[:(]", line)]
    return run.stdout, console


def main():
    mxtrain, corpus, work = sys.argv[1:4]
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    chromium = find_chromium()
    failures = []

    # The check catches what it must: a console error, an uncaught exception, a blocked image.
    control = os.path.join(work, "control.html")
    with open(control, "w") as out:
        out.write("<!DOCTYPE html><html><head><meta charset='utf-8'><meta http-equiv='Content-Security-Policy' "
                  "content=\"default-src 'none'; script-src 'unsafe-inline'\"></head><body>"
                  "<script>console.error('control'); missing_function();</script>"
                  "<img src='https://example.invalid/x.png'></body></html>")
    _, console = browse(chromium, control, "--dump-dom")
    if len(console) < 3:
        failures.append("the console check missed the control page's errors: %s" % console)

    run_dir = os.path.join(work, "run")
    command = [mxtrain, "train", "--steps", "12", "-b", "2", "-s", "64", "--device", "cpu", "-o", run_dir,
               "--set", "data.train=%s/train_*.bin" % corpus, "--set", "data.val=%s/val_*.bin" % corpus,
               "--set", "eval.every=4", "--set", "eval.batches=2", "--set", "checkpoint.every=6",
               "--set", "log.sample_every=6", "--set", "log.sample_tokens=48", "--set", "train.threads=2"]
    run = subprocess.run(command, capture_output=True, text=True, errors="replace")
    if run.returncode != 0:
        sys.exit("FAIL: mxtrain train exited %d: %s" % (run.returncode, run.stderr[-800:]))
    page = os.path.join(run_dir, "report.html")
    if not os.path.exists(page):
        sys.exit("FAIL: the run wrote no report.html; its output ends: %s" % run.stdout[-800:])

    dom, console = browse(chromium, page, "--dump-dom")
    if console:
        failures.append("console messages: %s" % console)
    for section in SECTIONS:
        match = re.search(r'<section id="%s"><h2>[^<]+</h2>(.*?)</section>' % re.escape(section), dom, re.S)
        if not match:
            failures.append("section %s is not in the rendered page" % section)
        elif len(re.sub(r"<[^>]+>", "", match.group(1)).strip()) == 0:
            failures.append("section %s has no content" % section)
    charts = dom.count("<svg")
    if charts < 4:
        failures.append("%d charts rendered, expected at least 4 (loss, tokens/s, memory, step time)" % charts)

    screenshot = os.path.join(work, "report.png")
    _, console = browse(chromium, page, "--screenshot=" + screenshot, "--window-size=%d,%d" % (WIDTH, HEIGHT))
    if console:
        failures.append("console messages while rendering: %s" % console)
    with open(screenshot, "rb") as image:
        header = image.read(24)
    if header[:8] != b"\x89PNG\r\n\x1a\n":
        failures.append("the screenshot is not a PNG")
    else:
        width, height = struct.unpack(">II", header[16:24])
        if (width, height) != (WIDTH, HEIGHT):
            failures.append("the screenshot is %dx%d, not %dx%d" % (width, height, WIDTH, HEIGHT))
    print("report: %s, %d charts, screenshot %s" % (page, charts, screenshot))
    for failure in failures:
        print("FAIL:", failure)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
