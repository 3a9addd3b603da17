#!/usr/bin/env python3
"""Open and close of one file, and create, 4 KiB write and close of new files, timed one by
one (docs/performance.md, "Closes posted"). Run it under `moneta run` with a directory under
/moneta, or directly with one on a kernel file system, to compare:

    moneta run -- python3 scripts/bench-closes.py /moneta/oc
    python3 scripts/bench-closes.py /dev/shm/oc
"""
import os
import sys
import time

d = sys.argv[1] if len(sys.argv) > 1 else "/moneta/oc"
pairs = int(os.environ.get("PAIRS", "20000"))
files = int(os.environ.get("FILES", "2000"))
os.makedirs(d, exist_ok=True)
fd = os.open(d + "/f", os.O_CREAT | os.O_RDWR, 0o644)
os.close(fd)
oc = []
for _ in range(pairs):
    t0 = time.perf_counter_ns()
    fd = os.open(d + "/f", os.O_RDWR)
    os.close(fd)
    oc.append(time.perf_counter_ns() - t0)
cwc = []
for i in range(files):
    t0 = time.perf_counter_ns()
    fd = os.open(f"{d}/n{i}", os.O_CREAT | os.O_RDWR | os.O_EXCL, 0o644)
    os.write(fd, b"x" * 4096)
    os.close(fd)
    cwc.append(time.perf_counter_ns() - t0)
for i in range(files):
    os.unlink(f"{d}/n{i}")
oc.sort()
cwc.sort()
print(
    "open+close p50 %.2f us, p90 %.2f us; create+write+close p50 %.2f us, p90 %.2f us"
    % (
        oc[len(oc) // 2] / 1000,
        oc[len(oc) * 9 // 10] / 1000,
        cwc[len(cwc) // 2] / 1000,
        cwc[len(cwc) * 9 // 10] / 1000,
    )
)
