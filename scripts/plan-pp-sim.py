#!/usr/bin/env python3
"""The planner's pipeline formula (src/plan/cost.c, dt_plan_pipeline_s) against an event simulation
of dtrain's two schedules (src/parallel/pp_schedule.c, pp_step.c): non-blocking sends, a stage that
holds one micro-batch's activations and recomputes the forward of the others before their backward,
each direction of a link carrying one send at a time. Prints the formula's error over random
pipelines (unequal stages, latency and wire time from 0 to 10x a stage's), and the previous
formula's. Usage: scripts/plan-pp-sim.py [CASES]"""
import math
import random
import sys


def order(s, K, M, gpipe):
    """Stage s's actions as dt_pp_schedule lists them."""
    if gpipe:
        return [('F', j) for j in range(M)] + [('B', j) for j in range(M - 1, -1, -1)]
    warm = min(K - s - 1, M)
    o, f, b = [('F', j) for j in range(warm)], warm, 0
    while f < M:
        o += [('F', f), ('B', b)]
        f, b = f + 1, b + 1
    return o + [('B', j) for j in range(b, M)]


def simulate(K, M, f, b, lat, wire, gpipe):
    """The step's seconds: f[s], b[s] a stage's forward and backward of one micro-batch."""
    t, idx, live, pend = [0.0] * K, [0] * K, [-1] * K, [False] * K
    orders = [order(s, K, M, gpipe) for s in range(K)]
    arrive, link_free = {}, {}
    moved = True
    while moved:
        moved = False
        for s in range(K):
            while idx[s] < len(orders[s]):
                kind, j = orders[s][idx[s]]
                if kind == 'B' and live[s] != j and not pend[s]:  # the recomputation fills the wait
                    t[s] += f[s]
                    pend[s] = True
                dep = (('F', s - 1, j) if s > 0 else None) if kind == 'F' else (('B', s + 1, j) if s < K - 1 else None)
                if dep and dep not in arrive:
                    break
                t[s] = max(t[s], arrive[dep] if dep else 0) + (f[s] if kind == 'F' else b[s])
                if kind == 'F':
                    live[s] = j
                pend[s] = False
                idx[s] += 1
                moved = True
                if (kind == 'F' and s < K - 1) or (kind == 'B' and s > 0):
                    start = max(t[s], link_free.get((s, kind), 0))
                    link_free[(s, kind)] = start + wire
                    arrive[(kind, s, j)] = start + wire + lat
    return max(t)


def formula(K, M, f, b, lat, wire, gpipe):
    """dt_plan_pipeline_s with dt_plan_predict's busy time (recomputed forwards included)."""
    fb = [f[s] + b[s] for s in range(K)]
    rec = [M - 1 if gpipe else (M if s < K - 1 else 0) for s in range(K)]
    busy = [M * fb[s] + rec[s] * f[s] for s in range(K)]
    m = max(range(K), key=lambda s: busy[s])
    msg = lat + wire
    a = max(busy[m], (2 if gpipe else 1) * M * wire) + sum(fb) - fb[m] + 2 * (K - 1) * msg
    return a if gpipe else max(a, math.ceil(M / K) * (sum(fb) + 2 * (K - 1) * msg))


def previous(K, M, f, b, lat, wire):
    """The formula before: the busiest stage and both sends of every micro-batch, (K-1) of them idle."""
    cm, p2p = max(f[s] + b[s] for s in range(K)), 2 * (lat + wire)
    return M * cm + M * p2p + (K - 1) * (cm + p2p)


def main():
    cases = int(sys.argv[1]) if len(sys.argv) > 1 else 3000
    rng = random.Random(5)
    for gpipe in (False, True):
        new, old = [], []
        for _ in range(cases):
            K = rng.choice([2, 2, 2, 3, 4, 8])
            M = max(rng.choice([1, 2, 4, 8, 16, 32]), K)
            base = rng.uniform(0.05, 2)
            f = [base * rng.uniform(0.3, 1.5) for _ in range(K)]
            b = [2 * x * rng.uniform(0.8, 1.2) for x in f]
            lat = rng.choice([0, 0.01, 0.1, 0.5, 1, 3]) * base
            wire = rng.choice([0, 0, 0.01, 0.1, 0.5, 1, 3, 10]) * base
            s = simulate(K, M, f, b, lat, wire, gpipe)
            new.append(formula(K, M, f, b, lat, wire, gpipe) / s - 1)
            old.append(previous(K, M, f, b, lat, wire) / s - 1)
        for name, e in (('formula', new), ('previous', old)):
            print('%-5s %-8s mean |error| %5.1f%%  worst %+6.1f%% %+6.1f%%' % (
                'gpipe' if gpipe else '1f1b', name, 100 * sum(map(abs, e)) / len(e), 100 * min(e), 100 * max(e)))


if __name__ == '__main__':
    main()
