#!/usr/bin/env python3
"""Memory and open-time benchmark of the shared decoded data-set cache (src/data/cache.c).

For `dtrain train --data fashion-mnist --model mlp --epochs 1 --quiet` it reports, with the cache
cold (empty cache dir), warm (second run) and off (DTRAIN_DATA_CACHE=0): peak RSS from
/usr/bin/time -v and peak PSS sampled from /proc/PID/smaps_rollup every few ms; then the same for
N processes started together (sum of their PSS, as a launcher's job total would be); and the
data-set open time (libdtrain.so through ctypes, best of 3) cold, warm and private. The cache dir
is a fresh directory under /dev/shm, removed at the end. Prints a table and one JSON line.

  python3 bench/data_cache_mem.py [BUILD] [--procs N] [--data NAME]
"""
import argparse, ctypes, json, os, re, shutil, subprocess, sys, tempfile, time

ap = argparse.ArgumentParser(description="shared data-set cache: memory and open time")
ap.add_argument("build", nargs="?", default="build")
ap.add_argument("--procs", type=int, default=2, help="processes started together in the multi-process rows")
ap.add_argument("--data", default="fashion-mnist")
A = ap.parse_args()
BUILD, PROCS, DATA = A.build, A.procs, A.data
CMD = [f"{BUILD}/dtrain", "train", "--data", DATA, "--model", "mlp", "--epochs", "1", "--quiet"]

def rollup(pid):
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            return {k: int(v) for k, v in re.findall(r"^(\w+):\s+(\d+) kB", f.read(), re.M)}
    except OSError:
        return None

def run(env_cache, n):
    """Starts n copies together; returns per-process peak RSS (time -v), peak PSS, and the peak of
    their summed PSS (all kB). A round reads every process twice and counts only when no value
    moved by more than 1 MB in between, so a process mapping or exiting between two reads does
    not add one process's before to another's after."""
    env = dict(os.environ, DTRAIN_DATA_CACHE=env_cache)
    procs = [subprocess.Popen(["/usr/bin/time", "-v"] + CMD, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
             for _ in range(n)]
    peak_pss, peak_sum, kids = [0] * n, 0, [None] * n
    while any(p.poll() is None for p in procs):
        for i, p in enumerate(procs):
            if kids[i] is None:  # the dtrain child of /usr/bin/time
                try:
                    with open(f"/proc/{p.pid}/task/{p.pid}/children") as f:
                        c = f.read().split()
                    kids[i] = int(c[0]) if c else None
                except OSError:
                    pass
        a = [rollup(k)["Pss"] if k and rollup(k) else 0 for k in kids]
        b = [rollup(k)["Pss"] if k and rollup(k) else 0 for k in kids]
        for i in range(n):
            peak_pss[i] = max(peak_pss[i], a[i], b[i])
        if all(abs(x - y) < 1024 for x, y in zip(a, b)):
            peak_sum = max(peak_sum, sum(b))
        time.sleep(0.003)
    rss = []
    for p in procs:
        err = p.stderr.read()
        if p.wait() != 0:
            sys.exit(f"data_cache_mem: {' '.join(CMD)} failed:\n{err}")
        rss.append(int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", err).group(1)))
    return rss, peak_pss, peak_sum

def open_times(cache):
    lib = ctypes.CDLL(os.path.abspath(f"{BUILD}/libdtrain.so"))
    lib.dt_now.restype = ctypes.c_double
    def once(env):
        os.environ["DTRAIN_DATA_CACHE"] = env
        tr, te = ctypes.c_void_p(), ctypes.c_void_p()
        t0 = lib.dt_now()
        if lib.dt_dataset_open(ctypes.byref(tr), ctypes.byref(te), DATA.encode()) != 0:
            sys.exit("data_cache_mem: cannot open " + DATA)
        dt = lib.dt_now() - t0
        lib.dt_dataset_destroy(tr), lib.dt_dataset_destroy(te)
        return dt
    out = {}
    for name in os.listdir(cache):
        os.unlink(os.path.join(cache, name))
    out["cold"] = once(cache)
    out["warm"] = min(once(cache) for _ in range(3))
    out["private"] = min(once("0") for _ in range(3))
    return out

def main():
    cache = tempfile.mkdtemp(prefix="dtrain-bench-", dir="/dev/shm")
    try:
        res = {}
        res["cold"] = run(cache, 1)
        res["warm"] = run(cache, 1)
        res["off"] = run("0", 1)
        res[f"warm_x{PROCS}"] = run(cache, PROCS)
        res[f"off_x{PROCS}"] = run("0", PROCS)
        sizes = {n: os.path.getsize(os.path.join(cache, n)) for n in os.listdir(cache) if n.endswith(".v1")}
        times = open_times(cache)
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    print(f"{' '.join(CMD)}")
    print(f"{'mode':<12} {'procs':>5} {'peak RSS MB (each)':>24} {'peak PSS MB (each)':>24} {'sum PSS MB':>11}")
    for k, (rss, pss, tot) in res.items():
        print(f"{k:<12} {len(rss):>5} {' '.join(f'{v/1024:.1f}' for v in rss):>24} {' '.join(f'{v/1024:.1f}' for v in pss):>24} {tot/1024:>11.1f}")
    print("cache files: " + ", ".join(f"{v/1e6:.2f} MB" for v in sorted(sizes.values(), reverse=True)))
    print(f"open {DATA} (train+test): cold {times['cold']*1e3:.1f} ms, warm {times['warm']*1e3:.1f} ms, private {times['private']*1e3:.1f} ms")
    j = {"bench": "data_cache_mem", "data": DATA, "procs": PROCS, "cache_bytes": sorted(sizes.values(), reverse=True),
         "open_s": {k: round(v, 4) for k, v in times.items()}}
    for k, (rss, pss, tot) in res.items():
        j[k] = {"peak_rss_kb": rss, "peak_pss_kb": pss, "peak_sum_pss_kb": tot}
    print(json.dumps(j))

if __name__ == "__main__":
    main()
