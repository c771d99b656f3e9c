#!/usr/bin/python3
"""PyTorch side of `dtrain bench train --vs-torch`: the reference MLP and CNN (the presets of
src/nn/spec.c, torch layouts) trained with Adam (lr 1e-3) on 8 fixed random batches of 1x28x28
images, and the GPT of bench/gpt_torch.py (AdamW), float32, ONE thread, in Debian's PyTorch
default environment otherwise. One thread means torch.set_num_threads(1) AND OPENBLAS_NUM_THREADS=1
(+ OMP_NUM_THREADS=1) set before torch loads: Debian's PyTorch does its Linear layers through the
system OpenBLAS, whose own thread pool set_num_threads does not reach. Measured on a 2-core AMD EPYC,
set_num_threads(1) alone used 2 CPU-seconds per second (MLP b128 76k samples/s wall, 39k per
CPU-second; pinned: 64-70k wall = per CPU-second). 3 untimed warm-up steps, then steps until --seconds
have passed. Prints one JSON line: {"model": ..., "batch": ..., "samples_per_s": ..., "steps": ...,
"samples_per_cpu_s": ...} (per second of the process's CPU time: steadier on a loaded machine;
not for gpt).

    /usr/bin/python3 bench/train_torch.py --model mlp|cnn|gpt --batch 128 [--seconds 3]
"""
import argparse
import json
import os
import subprocess
import sys
import time

os.environ["OPENBLAS_NUM_THREADS"] = "1"  # before torch loads OpenBLAS (see above)
os.environ["OMP_NUM_THREADS"] = "1"
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402


def build(name):
    if name == "mlp":
        return nn.Sequential(nn.Flatten(), nn.Linear(784, 128), nn.ReLU(), nn.Linear(128, 10))
    return nn.Sequential(
        nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(64 * 7 * 7, 128), nn.ReLU(), nn.Linear(128, 10))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="mlp", choices=["mlp", "cnn", "gpt"])
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--seconds", type=float, default=3)
    a = ap.parse_args()
    if a.model == "gpt":  # the GPT side lives in gpt_torch.py (T = 64)
        here = os.path.dirname(os.path.abspath(__file__))
        out = subprocess.run([sys.executable, os.path.join(here, "gpt_torch.py"), "--batch", str(a.batch),
                              "--seconds", str(a.seconds)], capture_output=True, text=True, check=True).stdout
        r = json.loads(out.strip().splitlines()[-1])
        print(json.dumps({"model": "gpt", "batch": a.batch, "samples_per_s": r["tokens_per_s"] / 64,
                          "steps": r["steps"], "threads": 1}))
        return
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = build(a.model)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    xs = torch.rand(8, a.batch, 1, 28, 28)
    ys = torch.randint(0, 10, (8, a.batch))
    loss_fn = nn.CrossEntropyLoss()

    def step(i):
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(xs[i % 8]), ys[i % 8])
        loss.backward()
        opt.step()

    for i in range(3):
        step(i)
    n, t0, c0 = 0, time.perf_counter(), time.process_time()
    while True:
        step(n)
        n += 1
        dt = time.perf_counter() - t0
        if n % 8 == 0 and dt >= a.seconds:
            break
    cpu = time.process_time() - c0
    print(json.dumps({"model": a.model, "batch": a.batch, "samples_per_s": n * a.batch / dt, "steps": n,
                      "threads": torch.get_num_threads(), "samples_per_cpu_s": n * a.batch / cpu if cpu > 0 else 0}))


if __name__ == "__main__":
    main()
