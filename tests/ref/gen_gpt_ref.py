#!/usr/bin/python3
"""Generates the PyTorch reference fixtures for the graph ops and the GPT, which
src/nn/graph_ref_test.c compares dtrain's graph (include/dtrain/nn.h) and GPT builder
(include/dtrain/models.h) against. Needs Debian's python3-torch (1.13); CI uses the committed
files.

    /usr/bin/python3 tests/ref/gen_gpt_ref.py tests/ref      (part of `make fixtures`)

As in gen_ref.py: inputs, weights and upstream gradients are drawn in float32, everything else is
computed by torch autograd in float64 and rounded once to float32 when stored. Same file format
(see gen_ref.py / src/nn/fixture.h). Writes two files:

    graph_ops.dtref  each new graph op on a batch (B first, then the per-sample shape):
                     <case>.x (and .b, .ids, .targets ...), <case>.w/.bias (parameters),
                     <case>.dy (upstream gradient), <case>.y (forward), <case>.dx ... (input
                     gradients), <case>.dw/.dbias (parameter gradients), <case>.cfg (i32 op
                     settings). Losses store .loss and the gradient of the logits / predictions.
    gpt.dtref        a small nanoGPT-style GPT (bias=True, dropout 0, tied lm_head), its config,
                     ids, targets, every parameter by nanoGPT name (gpt.param.<name>), logits,
                     loss, every parameter gradient (gpt.grad.<name>), then 5 torch.optim.AdamW
                     steps (one param group, lr 1e-3, weight_decay 0.01): the 6 losses before each
                     step and after the last (gpt.adamw.losses) and the final parameters
                     (gpt.final.<name>).
"""
import math
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.dont_write_bytecode = True  # no __pycache__ beside the fixtures
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gen_ref import Fixture, r32  # noqa: E402  (same format and float32 draws)


def i32(*vals):
    return torch.tensor(list(vals), dtype=torch.int64)


def grads(out, dout, *tensors):
    return torch.autograd.grad(out, tensors, dout)


def causal_self_attention(qkv, heads):
    """qkv (B, T, 3C) -> (B, T, C): nanoGPT's split, per-head causal softmax(q k^T / sqrt(hs)) v."""
    B, T, C3 = qkv.shape
    C = C3 // 3
    hs = C // heads
    q, k, v = qkv.split(C, dim=2)
    q = q.view(B, T, heads, hs).transpose(1, 2)  # (B, nh, T, hs)
    k = k.view(B, T, heads, hs).transpose(1, 2)
    v = v.view(B, T, heads, hs).transpose(1, 2)
    att = (q @ k.transpose(-2, -1)) / math.sqrt(hs)
    future = torch.ones(T, T, dtype=torch.bool).triu(1)
    att = att.masked_fill(future, float("-inf")).softmax(dim=-1)
    return (att @ v).transpose(1, 2).contiguous().view(B, T, C)


# ---- graph ops ------------------------------------------------------------------------------

def gen_ops(fx):
    # embedding: ids (B, T) -> rows of w (num, out); repeated ids accumulate into one row
    B, T, num, D = 2, 5, 11, 6
    ids = torch.randint(0, num, (B, T))
    ids[1, 3] = ids[0, 0]
    ids[1, 4] = ids[0, 0]
    w = r32(num, D).requires_grad_()
    y = F.embedding(ids, w)
    dy = r32(*y.shape)
    (dw,) = grads(y, dy, w)
    fx.add("embedding.cfg", i32(B, T, num, D), "i32")
    fx.add("embedding.ids", ids, "i32")
    for k, v in dict(w=w, dy=dy, y=y, dw=dw).items():
        fx.add("embedding." + k, v)

    # position embedding: row t for position t (nanoGPT's wpe(arange(T))), ids only give T. The ids
    # are deliberately >= num: a position table must not look at their values.
    B, T, num, D = 2, 5, 7, 6
    ids = torch.randint(num, 50, (B, T))
    w = r32(num, D).requires_grad_()
    y = F.embedding(torch.arange(T), w).unsqueeze(0).expand(B, T, D)
    dy = r32(B, T, D)
    (dw,) = grads(y, dy, w)
    fx.add("posembed.cfg", i32(B, T, num, D), "i32")
    fx.add("posembed.ids", ids, "i32")
    for k, v in dict(w=w, dy=dy, y=y, dw=dw).items():
        fx.add("posembed." + k, v)

    # add (residual): y = a + b
    a, b = r32(2, 3, 4).requires_grad_(), r32(2, 3, 4).requires_grad_()
    y = a + b
    dy = r32(*y.shape)
    da, db = grads(y, dy, a, b)
    for k, v in dict(a=a, b=b, dy=dy, y=y, da=da, db=db).items():
        fx.add("add." + k, v)

    # causal multi-head self-attention: (name, B, T, C, heads, value range)
    for name, B, T, C, H, scale in (("attention", 2, 5, 8, 2, 1.0), ("attention_h3", 1, 7, 12, 3, 3.0),
                                    ("attention_h1", 2, 4, 4, 1, 2.0)):
        qkv = (r32(B, T, 3 * C) * scale).requires_grad_()
        y = causal_self_attention(qkv, H)
        dy = r32(B, T, C)
        (dqkv,) = grads(y, dy, qkv)
        fx.add(name + ".cfg", i32(B, T, C, H), "i32")
        for k, v in dict(x=qkv, dy=dy, y=y, dx=dqkv).items():
            fx.add("%s.%s" % (name, k), v)

    # matmul with a transposed weight (tied head): y = x @ w^T, w (O, C), no bias
    B, T, C, O = 2, 3, 5, 6
    x, w = r32(B, T, C).requires_grad_(), r32(O, C).requires_grad_()
    y = x @ w.t()
    dy = r32(*y.shape)
    dx, dw = grads(y, dy, x, w)
    fx.add("matmul_t.cfg", i32(B, T, C, O), "i32")
    for k, v in dict(x=x, w=w, dy=dy, y=y, dx=dx, dw=dw).items():
        fx.add("matmul_t." + k, v)

    # linear over the last dim (flatten=false), with and without bias
    for name, bias in (("linear3d", True), ("linear3d_nobias", False)):
        B, T, C, O = 2, 3, 5, 4
        x, w = r32(B, T, C).requires_grad_(), r32(O, C).requires_grad_()
        bb = r32(O).requires_grad_() if bias else None
        y = F.linear(x, w, bb)
        dy = r32(*y.shape)
        gs = grads(y, dy, x, w, *([bb] if bias else []))
        fx.add(name + ".cfg", i32(B, T, C, O, int(bias)), "i32")
        for k, v in dict(x=x, w=w, dy=dy, y=y, dx=gs[0], dw=gs[1]).items():
            fx.add("%s.%s" % (name, k), v)
        if bias:
            fx.add(name + ".bias", bb)
            fx.add(name + ".dbias", gs[2])

    # layernorm and gelu over the last dim of a (T, C) sample
    B, T, C = 2, 3, 8
    x = r32(B, T, C, lo=-3, hi=3).requires_grad_()
    w, bb = r32(C, lo=0.5, hi=1.5).requires_grad_(), r32(C).requires_grad_()
    y = F.layer_norm(x, (C,), w, bb, eps=1e-5)
    dy = r32(*y.shape)
    dx, dw, db = grads(y, dy, x, w, bb)
    fx.add("layernorm3d.cfg", i32(B, T, C), "i32")
    for k, v in dict(x=x, w=w, bias=bb, dy=dy, y=y, dx=dx, dw=dw, dbias=db).items():
        fx.add("layernorm3d." + k, v)
    x = r32(B, T, C, lo=-4, hi=4).requires_grad_()
    y = F.gelu(x)
    dy = r32(*y.shape)
    (dx,) = grads(y, dy, x)
    fx.add("gelu3d.cfg", i32(B, T, C), "i32")
    for k, v in dict(x=x, dy=dy, y=y, dx=dx).items():
        fx.add("gelu3d." + k, v)

    # reshape (a view): per sample (2, 6) -> (3, 4)
    x = r32(2, 2, 6).requires_grad_()
    y = x.view(2, 3, 4)
    dy = r32(*y.shape)
    (dx,) = grads(y, dy, x)
    fx.add("reshape.cfg", i32(2, 2, 6, 3, 4), "i32")
    for k, v in dict(x=x, dy=dy, y=y, dx=dx).items():
        fx.add("reshape." + k, v)

    # cross-entropy over (B*T, V) with ignored targets: torch's default ignore_index -100, and a
    # class index used as the ignore index. Mean over the targets that count.
    for name, ign in (("xent", -100), ("xent_ign3", 3)):
        B, T, V = 2, 5, 7
        logits = r32(B, T, V, lo=-4, hi=4)
        logits[0, 1] += 60.0  # large logits: the softmax must be shifted
        logits.requires_grad_()
        targets = torch.randint(0, V, (B, T))
        if ign < 0:
            targets[0, 2] = targets[1, 0] = targets[1, 4] = ign
        else:
            targets[0, 0] = targets[1, 1] = ign
            targets[0, 3] = (ign + 1) % V
        loss = F.cross_entropy(logits.view(-1, V), targets.view(-1), ignore_index=ign)
        (dl,) = torch.autograd.grad(loss, logits)
        counted = int((targets != ign).sum())
        assert 0 < counted < B * T
        fx.add(name + ".cfg", i32(B, T, V, ign, counted), "i32")
        fx.add(name + ".logits", logits)
        fx.add(name + ".targets", targets, "i32")
        fx.scalar(name + ".loss", loss.item())
        fx.add(name + ".dlogits", dl)

    # mse (mean over every value)
    pred, target = r32(2, 3, 4, lo=-2, hi=2).requires_grad_(), r32(2, 3, 4, lo=-2, hi=2)
    loss = F.mse_loss(pred, target)
    (dp,) = torch.autograd.grad(loss, pred)
    fx.add("mse.pred", pred)
    fx.add("mse.target", target)
    fx.scalar("mse.loss", loss.item())
    fx.add("mse.dpred", dp)


# ---- GPT ------------------------------------------------------------------------------------

class SelfAttention(nn.Module):
    def __init__(self, C, H):
        super().__init__()
        self.heads = H
        self.c_attn = nn.Linear(C, 3 * C)
        self.c_proj = nn.Linear(C, C)

    def forward(self, x):
        return self.c_proj(causal_self_attention(self.c_attn(x), self.heads))


class MLP(nn.Module):
    def __init__(self, C):
        super().__init__()
        self.c_fc = nn.Linear(C, 4 * C)
        self.c_proj = nn.Linear(4 * C, C)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, C, H):
        super().__init__()
        self.ln_1 = nn.LayerNorm(C, eps=1e-5)
        self.attn = SelfAttention(C, H)
        self.ln_2 = nn.LayerNorm(C, eps=1e-5)
        self.mlp = MLP(C)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """Decoder-only, pre-LN, learned positions, lm_head tied to wte; nanoGPT's module names."""

    def __init__(self, L, H, C, T, V):
        super().__init__()
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(V, C), wpe=nn.Embedding(T, C),
            h=nn.ModuleList([Block(C, H) for _ in range(L)]), ln_f=nn.LayerNorm(C, eps=1e-5)))
        self.lm_head = nn.Linear(C, V, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # tied: one Parameter, named wte first

    def forward(self, ids, targets):
        t = self.transformer
        T = ids.shape[1]
        x = t.wte(ids) + t.wpe(torch.arange(T))
        for block in t.h:
            x = block(x)
        logits = self.lm_head(t.ln_f(x))
        loss = F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))
        return logits, loss


GPT_CFG = dict(L=2, H=2, C=16, T=8, V=256)
GPT_B = 3
ADAMW = dict(lr=1e-3, weight_decay=0.01, steps=5)


def gen_gpt(fx):
    c = GPT_CFG
    model = GPT(c["L"], c["H"], c["C"], c["T"], c["V"])
    # Weights far from nanoGPT's N(0, 0.02) on purpose: activations of order one, so attention is
    # not nearly uniform and every nonlinearity is exercised. Drawn in float32.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("wte.weight") or name.endswith("wpe.weight"):
                p.copy_(r32(*p.shape, lo=-0.5, hi=0.5))
            elif ".ln_" in name or "ln_f" in name:
                p.copy_(r32(*p.shape, lo=0.7, hi=1.3) if name.endswith("weight") else r32(*p.shape, lo=-0.2, hi=0.2))
            elif name.endswith("weight"):
                a = math.sqrt(3.0 / p.shape[1])  # unit-variance propagation
                p.copy_(r32(*p.shape, lo=-a, hi=a))
            else:
                p.copy_(r32(*p.shape, lo=-0.2, hi=0.2))
    model = model.double()
    names = [n for n, _ in model.named_parameters()]
    assert "lm_head.weight" not in names and names[0] == "transformer.wte.weight"
    ids = torch.randint(0, c["V"], (GPT_B, c["T"]))
    targets = torch.randint(0, c["V"], (GPT_B, c["T"]))
    fx.add("gpt.cfg", i32(c["L"], c["H"], c["C"], c["T"], c["V"], GPT_B), "i32")
    fx.add("gpt.ids", ids, "i32")
    fx.add("gpt.targets", targets, "i32")
    for n, p in model.named_parameters():
        fx.add("gpt.param." + n, p)

    logits, loss = model(ids, targets)
    model.zero_grad()
    loss.backward()
    fx.add("gpt.logits", logits)
    fx.scalar("gpt.loss", loss.item())
    for n, p in model.named_parameters():
        fx.add("gpt.grad." + n, p.grad)

    opt = torch.optim.AdamW(model.parameters(), lr=ADAMW["lr"], weight_decay=ADAMW["weight_decay"])
    losses, gmax = [], {n: torch.zeros_like(p) for n, p in model.named_parameters()}
    for _ in range(ADAMW["steps"]):
        opt.zero_grad()
        _, loss = model(ids, targets)
        losses.append(loss.item())
        loss.backward()
        for n, p in model.named_parameters():
            gmax[n] = torch.maximum(gmax[n], p.grad.abs())
        opt.step()
    with torch.no_grad():
        losses.append(model(ids, targets)[1].item())
    fx.add("gpt.adamw.cfg", torch.tensor([ADAMW["lr"], ADAMW["weight_decay"], ADAMW["steps"]], dtype=torch.float64))
    fx.add("gpt.adamw.losses", torch.tensor(losses, dtype=torch.float64))
    for n, p in model.named_parameters():
        fx.add("gpt.final." + n, p)
    # Coordinates whose true gradient is zero at every step: the key slice of each c_attn.bias
    # (softmax ignores a constant added to every score of a row). In float32 their gradient is
    # rounding noise, which Adam divides by its own magnitude into steps of up to lr: where they
    # end up is arbitrary (they do not change the loss). The C side checks only a bound there.
    top = max(float(g.max()) for g in gmax.values())
    for n, g in gmax.items():
        idx = (g.view(-1) <= 1e-12 * top).nonzero().view(-1)
        if len(idx):
            fx.add("gpt.adamw.zero_grad." + n, idx, "i32")


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
    torch.set_num_threads(1)
    for fname, seed, gen in (("graph_ops.dtref", 20261201, gen_ops), ("gpt.dtref", 20261202, gen_gpt)):
        torch.manual_seed(seed)
        fx = Fixture()
        gen(fx)
        fx.write(os.path.join(out, fname))


if __name__ == "__main__":
    main()
