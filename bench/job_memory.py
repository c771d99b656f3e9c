#!/usr/bin/env python3
"""Memory of a data-parallel job: `dtrain train --workers N` (launcher + N workers).

Samples every process of the job every few ms from /proc/PID/smaps_rollup and reports the peak
RSS of each worker and of the launcher, and the peak of the job's total (sum of PSS, which
counts the shared decoded data set once, and sum of RSS, which counts it per process).
Prints a table and one JSON line.

  python3 bench/job_memory.py [BUILD] [--workers N] [-- extra train flags]
"""
import argparse, json, os, re, subprocess, sys, time

ap = argparse.ArgumentParser()
ap.add_argument("build", nargs="?", default="build")
ap.add_argument("--workers", type=int, default=2)
ap.add_argument("extra", nargs="*")
A = ap.parse_args()
cmd = [f"{A.build}/dtrain", "train", "--workers", str(A.workers), "--model", "mlp", "--epochs", "2",
       "--batch", "32", "--optimizer", "adam", "--lr", "0.001", "--quiet"] + A.extra

def kids(pid):
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(x) for x in f.read().split()]
    except OSError:
        return []

def rollup(pid):
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            d = {k: int(v) for k, v in re.findall(r"^(\w+):\s+(\d+) kB", f.read(), re.M)}
        return d.get("Rss", 0), d.get("Pss", 0)
    except OSError:
        return None

p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
peak_rss, peak_pss_total, peak_rss_total = {}, 0, 0
while p.poll() is None:
    procs = [p.pid] + kids(p.pid)
    pss_total = rss_total = 0
    for pid in procs:
        r = rollup(pid)
        if r is None:
            continue
        role = "launcher" if pid == p.pid else f"worker {procs.index(pid) - 1}"
        peak_rss[role] = max(peak_rss.get(role, 0), r[0])
        rss_total += r[0]
        pss_total += r[1]
    peak_pss_total = max(peak_pss_total, pss_total)
    peak_rss_total = max(peak_rss_total, rss_total)
    time.sleep(0.003)
out = p.stdout.read()
acc = re.findall(r"test accuracy ([0-9.]+)", out)
print(f"# {' '.join(cmd)}")
for role in sorted(peak_rss):
    print(f"{role:10s} peak RSS {peak_rss[role] / 1024:7.1f} MB")
print(f"job total  peak PSS {peak_pss_total / 1024:7.1f} MB   (sum of RSS {peak_rss_total / 1024:.1f} MB)")
print(f"test accuracy {acc[-1] if acc else '?'}")
print(json.dumps({"bench": "job_memory", "workers": A.workers,
                  "peak_rss_mb": {k: round(v / 1024, 1) for k, v in peak_rss.items()},
                  "job_peak_pss_mb": round(peak_pss_total / 1024, 1), "job_peak_rss_sum_mb": round(peak_rss_total / 1024, 1),
                  "test_acc": float(acc[-1]) if acc else None}))
sys.exit(p.returncode)
