#!/usr/bin/env python3
"""What a data-parallel step is made of, from a `dtrain train --workers N --timeline FILE` trace
of ranks on one host (their events share one clock there): per step, the arrival skew at the last
gradient bucket (the last rank to end backward minus the first), how long the allreduce took after
every rank had arrived (for the last rank to arrive, and for the first, which waited), compute
(forward + backward), the optimizer, taking the batch, and the step period. Prints percentiles
over the steps after the first SKIP (default 20), in microseconds.

    dtrain train --workers 2 --model mlp --batch 128 --max-steps 1500 --timeline t.json
    python3 bench/ddp_timeline.py t.json [SKIP]

Reading it: the comm wait of the first rank is skew + its "after all arrived" time; a skew that
dominates is the ranks' compute or the machine's scheduling, not the allreduce; a large "after all
arrived" for the last rank is the allreduce itself (copies, synchronisations, wake-ups)."""
import json
import statistics
import sys


def load(path):
    d = json.load(open(path))
    steps = {}
    for e in d["traceEvents"] if isinstance(d, dict) else d:
        if e.get("ph") != "X":
            continue
        name = e["name"]
        if name.split(" ")[0] in ("allreduce", "fp16", "bf16", "topk", "powersgd", "reduce_scatter"):
            name = "bucket " + name.split(" b")[-1]
        steps.setdefault(e["args"]["step"], {}).setdefault(e["pid"], {})[name] = (e["ts"], e["ts"] + e["dur"])
    return steps


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    steps, skip = load(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 20
    ranks = sorted({r for s in steps.values() for r in s})
    want = {"forward", "backward"}  # one worker (strategy single) traces no optimizer span
    ks = [k for k in sorted(steps) if k >= skip and len(steps[k]) == len(ranks)
          and all(want <= set(steps[k][r]) for r in ranks)]
    if not ks:
        sys.exit("%s: need a trace of ddp ranks (or one worker) with steps after %d" % (sys.argv[1], skip))
    buckets = [int(n.split()[1]) for n in steps[ks[0]][ranks[0]] if n.startswith("bucket ")]
    last = "bucket %d" % max(buckets) if buckets else "none"
    rows = {}
    add = lambda name, v: rows.setdefault(name, []).append(v)
    for i, k in enumerate(ks):
        s = steps[k]
        arrive = {r: s[r]["backward"][1] for r in ranks}
        first, final = min(arrive, key=arrive.get), max(arrive, key=arrive.get)
        if len(ranks) > 1:
            add("arrival skew (last - first)", arrive[final] - arrive[first])
        if len(ranks) > 1 and last in s[final] and last in s[first]:
            add("after all arrived: last rank", s[final][last][1] - arrive[final])
            add("after all arrived: first rank", s[first][last][1] - arrive[final])
        for r in ranks:
            add("compute (forward + backward)", s[r]["backward"][1] - s[r]["forward"][0])
            for part in ("optimizer", "allgather params"):  # the latter: ZeRO stages 1-2
                if part in s[r]:
                    add(part, s[r][part][1] - s[r][part][0])
            nxt = steps.get(k + 1, {}).get(r, {})
            if i + 1 < len(ks) and ks[i + 1] == k + 1 and "data" in nxt:
                add("taking the next batch", nxt["data"][1] - nxt["data"][0])
                add("step period", nxt["forward"][0] - s[r]["forward"][0])
    print("# %s: %d ranks, %d steps (after %d), last bucket '%s'; microseconds" % (sys.argv[1], len(ranks), len(ks),
                                                                                 skip, last))
    print("%-32s %8s %8s %8s %8s %8s" % ("part", "p10", "p25", "median", "mean", "p90"))
    for name, v in rows.items():
        v.sort()
        q = lambda f: v[min(len(v) - 1, int(len(v) * f))]
        print("%-32s %8.1f %8.1f %8.1f %8.1f %8.1f" % (name, q(0.1), q(0.25), statistics.median(v),
                                                         statistics.mean(v), q(0.9)))


if __name__ == "__main__":
    main()
