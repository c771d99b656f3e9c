#!/usr/bin/python3
"""PyTorch side of the GPT throughput comparison (bench/gpt_vs_torch.sh): a nanoGPT-style model
(pre-LN, GELU MLP, learned positions, tied head; no dropout) trained with AdamW on random bytes,
one thread, float32. Prints one JSON line: {"tokens_per_s": ..., "steps": ..., "seconds": ...}.

    /usr/bin/python3 bench/gpt_torch.py [--L 4 --H 4 --C 128 --T 64 --batch 12 --seconds 10]
"""
import argparse
import json
import math
import os
import time

os.environ["OPENBLAS_NUM_THREADS"] = "1"  # one thread: torch.set_num_threads does not reach OpenBLAS's pool
os.environ["OMP_NUM_THREADS"] = "1"
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402


class Block(nn.Module):
    def __init__(self, C, H):
        super().__init__()
        self.H = H
        self.ln_1 = nn.LayerNorm(C)
        self.c_attn = nn.Linear(C, 3 * C)
        self.c_proj = nn.Linear(C, C)
        self.ln_2 = nn.LayerNorm(C)
        self.c_fc = nn.Linear(C, 4 * C)
        self.mlp_proj = nn.Linear(4 * C, C)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.H, C // self.H).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(C // self.H)
        mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
        att = F.softmax(att.masked_fill(~mask, float("-inf")), dim=-1)
        x = x + self.c_proj((att @ v).transpose(1, 2).contiguous().view(B, T, C))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x))))


class GPT(nn.Module):
    def __init__(self, L, H, C, T, V):
        super().__init__()
        self.wte = nn.Embedding(V, C)
        self.wpe = nn.Embedding(T, C)
        self.h = nn.ModuleList(Block(C, H) for _ in range(L))
        self.ln_f = nn.LayerNorm(C)

    def forward(self, idx, targets):
        T = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(T))
        for b in self.h:
            x = b(x)
        logits = self.ln_f(x) @ self.wte.weight.t()
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.reshape(-1))


def main():
    ap = argparse.ArgumentParser()
    for k, v in (("L", 4), ("H", 4), ("C", 128), ("T", 64), ("V", 256), ("batch", 12)):
        ap.add_argument("--" + k, type=int, default=v)
    ap.add_argument("--seconds", type=float, default=10)
    a = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    m = GPT(a.L, a.H, a.C, a.T, a.V)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
    data = torch.randint(0, a.V, (8, a.batch, a.T + 1))
    steps, t0 = 0, None
    while True:
        if steps == 3:
            t0 = time.perf_counter()
        d = data[steps % 8]
        loss = m(d[:, :-1], d[:, 1:])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        steps += 1
        if t0 is not None and (steps - 3) % 8 == 0 and time.perf_counter() - t0 >= a.seconds:
            break
    dt = time.perf_counter() - t0
    n = steps - 3
    print(json.dumps({"tokens_per_s": n * a.batch * a.T / dt, "steps": n, "seconds": dt,
                      "torch": torch.__version__, "threads": torch.get_num_threads()}))


if __name__ == "__main__":
    main()
