#!/usr/bin/env python3
"""PyTorch's own PowerSGD (DDP comm hook powerSGD_hook) on dtrain's compression reference recipe,
to compare with `dtrain train --compress powersgd:R`: the MLP (flatten linear(128) relu
linear(10)), Adam 1e-3, batch 32 per worker, 2 gloo workers on the CPU, pixels / 255, each epoch
a fresh shuffle split between the workers; prints the test accuracy after the last epoch.
Usage: torch_powersgd.py [--compress none|powersgd:R[:warmup=S][:mcr=X]] [--seed N] [--epochs E]
                         [--data DIR]
warmup=S is start_powerSGD_iter (PyTorch needs S >= 2 with error feedback; 0 or 1 runs 2);
mcr=X is min_compression_rate (PyTorch's default 2)."""
import argparse, gzip, os, struct

import numpy as np
import torch, torch.distributed as dist, torch.multiprocessing as mp, torch.nn as nn
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd


def idx(path):
    b = gzip.open(path).read()
    nd = b[3]
    dims = struct.unpack(">" + "I" * nd, b[4:4 + 4 * nd])
    return np.frombuffer(b, np.uint8, offset=4 + 4 * nd).reshape(dims)


def load(d, split):
    x = idx(f"{d}/{split}-images-idx3-ubyte.gz").reshape(-1, 784).astype(np.float32) / 255
    return torch.from_numpy(x), torch.from_numpy(idx(f"{d}/{split}-labels-idx1-ubyte.gz").astype(np.int64))


def worker(rank, a):
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(a.port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.manual_seed(a.seed)
    model = nn.parallel.DistributedDataParallel(nn.Sequential(nn.Linear(784, 128), nn.ReLU(), nn.Linear(128, 10)))
    parts = a.compress.split(":")
    if parts[0] == "powersgd":
        opt = dict(p.split("=") for p in parts[2:])
        state = psgd.PowerSGDState(process_group=None, matrix_approximation_rank=int(parts[1]),
                                   start_powerSGD_iter=max(2, int(opt.get("warmup", 1000))),
                                   min_compression_rate=float(opt.get("mcr", 2)), random_seed=a.seed)
        model.register_comm_hook(state, psgd.powerSGD_hook)
    x, y = load(a.data, "train")
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(a.seed)
    for _ in range(a.epochs):
        perm = torch.randperm(len(x), generator=g)
        mine = perm[rank::2]
        for i in range(0, len(mine) - 31, 32):
            b = mine[i:i + 32]
            opt.zero_grad()
            nn.functional.cross_entropy(model(x[b]), y[b]).backward()
            opt.step()
    if rank == 0:
        tx, ty = load(a.data, "t10k")
        with torch.no_grad():
            print(f"{a.compress} seed {a.seed}: test accuracy {(model(tx).argmax(1) == ty).float().mean().item():.4f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--compress", default="none")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    p.add_argument("--port", type=int, default=29517)
    mp.spawn(worker, args=(p.parse_args(),), nprocs=2)
