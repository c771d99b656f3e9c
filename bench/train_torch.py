#!/usr/bin/python3
"""PyTorch side of `dtrain bench train --vs-torch`: the reference MLP and CNN (the presets of
src/nn/spec.c, torch layouts) trained with Adam (lr 1e-3), and the GPT of bench/gpt_torch.py
(AdamW), float32, ONE thread, on the very batches dtrain trains on: the bench writes them to a file
(--data: NB batches of x, float32 features or int32 token ids, then y, int32 labels or next tokens,
raw little-endian) drawn from Fashion-MNIST or the King James Bible. The bench also pins this
process to dtrain's CPU (taskset). One thread means torch.set_num_threads(1) AND
OPENBLAS_NUM_THREADS=1 (+ OMP_NUM_THREADS=1) set before torch loads: Debian's PyTorch does its Linear
layers through the system OpenBLAS, whose own thread pool set_num_threads does not reach. 3 untimed
warm-up steps, then whole groups of 8 steps until --seconds have passed. Prints one JSON line:
{"model": ..., "batch": ..., "samples_per_s": ..., "steps": ..., "samples_per_cpu_s": ...}.

    /usr/bin/python3 bench/train_torch.py --model mlp|cnn|gpt --batch 128 --data FILE --nb 64 [--seconds 3]
"""
import argparse
import json
import os
import sys
import time

os.environ["OPENBLAS_NUM_THREADS"] = "1"  # before torch loads OpenBLAS (see above)
os.environ["OMP_NUM_THREADS"] = "1"
import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpt_torch import GPT  # noqa: E402

GPT_SHAPE = dict(L=4, H=4, C=128, T=64, V=256)  # the bench's gpt:L=4,H=4,C=128,T=64 (bytes)


def build(name):
    if name == "mlp":
        return nn.Sequential(nn.Flatten(), nn.Linear(784, 128), nn.ReLU(), nn.Linear(128, 10))
    if name == "gpt":
        return GPT(**GPT_SHAPE)
    return nn.Sequential(
        nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(64 * 7 * 7, 128), nn.ReLU(), nn.Linear(128, 10))


def load(path, model, nb, batch):
    """The bench's batches: x (nb, batch, ...) and y (nb, batch[, T]) as torch tensors."""
    raw = np.fromfile(path, dtype=np.uint8)
    T = GPT_SHAPE["T"]
    xv, yv = (T, T) if model == "gpt" else (784, 1)
    n = nb * batch
    if raw.size != 4 * n * (xv + yv):
        sys.exit(f"train_torch.py: {path} holds {raw.size} bytes, expected {4 * n * (xv + yv)} for "
                 f"{nb} batches of {batch} ({model}): rerun it from `dtrain bench train --vs-torch`")
    x = raw[:4 * n * xv].view(np.int32 if model == "gpt" else np.float32)
    y = raw[4 * n * xv:].view(np.int32)
    if model == "gpt":
        return (torch.from_numpy(x.astype(np.int64).reshape(nb, batch, T)),
                torch.from_numpy(y.astype(np.int64).reshape(nb, batch, T)))
    return (torch.from_numpy(x.copy().reshape(nb, batch, 1, 28, 28)),
            torch.from_numpy(y.astype(np.int64).reshape(nb, batch)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="mlp", choices=["mlp", "cnn", "gpt"])
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--seconds", type=float, default=3)
    ap.add_argument("--data", required=True, help="the batches written by dtrain bench train")
    ap.add_argument("--nb", type=int, default=64, help="batches in --data")
    a = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = build(a.model)
    xs, ys = load(a.data, a.model, a.nb, a.batch)
    if a.model == "gpt":
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

        def loss_of(i):
            return model(xs[i % a.nb], ys[i % a.nb])
    else:
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        loss_fn = nn.CrossEntropyLoss()

        def loss_of(i):
            return loss_fn(model(xs[i % a.nb]), ys[i % a.nb])

    def step(i):
        opt.zero_grad(set_to_none=True)
        loss = loss_of(i)
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
                      "threads": torch.get_num_threads(), "samples_per_cpu_s": n * a.batch / cpu if cpu > 0 else 0,
                      "torch": torch.__version__}))


if __name__ == "__main__":
    main()
