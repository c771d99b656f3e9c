#!/usr/bin/python3
"""Generates the PyTorch reference fixtures that src/nn/ref_test.c compares the C kernels, models
and optimizers against (llm.c's test_gpt2 approach). Needs Debian's python3-torch (1.13); CI does
not have torch and only uses the committed files.

    /usr/bin/python3 tests/ref/gen_ref.py tests/ref        (what `make fixtures` runs)

Inputs, weights and gradient seeds are drawn in float32; everything else is computed by torch
autograd in float64 and rounded once to float32 when stored, so the C side can use tight
tolerances. Writes three files:
    layers.dtref   every layer kernel: outputs, input and parameter gradients
    models.dtref   the "mlp" and "cnn" presets and a mixed stack, through torch.nn.Sequential
    optim.dtref    SGD (momentum, nesterov, weight decay), Adam, AdamW steps and grad clipping

File format (little-endian), read by src/nn/fixture.h:
    magic "DTRNNREF" (8 bytes), u32 version = 1, u32 count
    count x { u32 name_len, name (utf-8), u32 dtype (0 = f32, 1 = i32), u32 ndim,
              ndim x u32 dims, the values (f32 or i32) }
"""
import os
import struct
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

MAGIC = b"DTRNNREF"
VERSION = 1


class Fixture:
    def __init__(self):
        self.entries = []
        self.names = set()

    def add(self, name, t, dtype="f32"):
        assert name not in self.names, name
        self.names.add(name)
        t = torch.as_tensor(t).detach()
        if dtype == "f32":
            t = t.to(torch.float32)
        else:
            t = t.to(torch.int32)
        self.entries.append((name, dtype, t.contiguous()))

    def scalar(self, name, v):
        self.add(name, torch.tensor([float(v)]))

    def write(self, path):
        with open(path, "wb") as f:
            f.write(MAGIC)
            f.write(struct.pack("<II", VERSION, len(self.entries)))
            for name, dtype, t in self.entries:
                nb = name.encode()
                f.write(struct.pack("<I", len(nb)))
                f.write(nb)
                f.write(struct.pack("<II", 0 if dtype == "f32" else 1, t.dim()))
                f.write(struct.pack("<%dI" % t.dim(), *t.shape))
                f.write(t.numpy().astype("<f4" if dtype == "f32" else "<i4").tobytes())
        print("wrote %s: %d tensors, %d bytes" % (path, len(self.entries), os.path.getsize(path)))


def r32(*shape, lo=-1.0, hi=1.0):
    """Uniform float32 values, returned as float64 (exactly representable in float32)."""
    return (torch.rand(*shape, dtype=torch.float32) * (hi - lo) + lo).double()


def grads_of(out, dout, *tensors):
    return torch.autograd.grad(out, tensors, dout)


# ---- layers --------------------------------------------------------------------------------

def gen_layers(fx):
    # linear
    B, C, OC = 5, 7, 6
    x, w, b, dy = r32(B, C).requires_grad_(), r32(OC, C), r32(OC), r32(B, OC)
    w.requires_grad_(), b.requires_grad_()
    y = F.linear(x, w, b)
    dx, dw, db = grads_of(y, dy, x, w, b)
    for k, v in dict(x=x, w=w, b=b, dy=dy, y=y, dx=dx, dw=dw, db=db).items():
        fx.add("linear." + k, v)

    # conv2d: (name, B, C, H, W, OC, K, stride, pad)
    convs = [("conv_same", 2, 3, 6, 6, 4, 3, 1, 1), ("conv_s2p1", 2, 3, 7, 7, 4, 3, 2, 1),
             ("conv_valid", 2, 2, 6, 5, 3, 3, 1, 0), ("conv_k1", 2, 4, 5, 5, 3, 1, 1, 0),
             ("conv_k5s2p2", 1, 2, 9, 8, 3, 5, 2, 2), ("conv_ref2", 2, 32, 6, 6, 8, 3, 1, 1)]
    for name, B, C, H, W, OC, K, S, P in convs:
        x = r32(B, C, H, W).requires_grad_()
        bound = 1.0 / (C * K * K) ** 0.5
        w = r32(OC, C, K, K, lo=-bound, hi=bound).requires_grad_()
        b = r32(OC, lo=-bound, hi=bound).requires_grad_()
        y = F.conv2d(x, w, b, stride=S, padding=P)
        dy = r32(*y.shape)
        dx, dw, db = grads_of(y, dy, x, w, b)
        fx.add(name + ".dims", torch.tensor([B, C, H, W, OC, K, S, P]), "i32")
        for k, v in dict(x=x, w=w, b=b, dy=dy, y=y, dx=dx, dw=dw, db=db).items():
            fx.add("%s.%s" % (name, k), v)

    # pools: (name, max?, B, C, H, W, K, S, ties?)
    pools = [("maxpool_k2", 1, 2, 3, 6, 6, 2, 2, 0), ("maxpool_k3s2", 1, 2, 2, 7, 7, 3, 2, 0),
             ("maxpool_odd", 1, 2, 2, 7, 9, 2, 2, 0), ("maxpool_ties", 1, 1, 2, 6, 6, 2, 2, 1),
             ("maxpool_ties_k3s2", 1, 1, 2, 7, 7, 3, 2, 1),
             ("avgpool_k2", 0, 2, 3, 6, 6, 2, 2, 0), ("avgpool_k3s2", 0, 2, 2, 7, 7, 3, 2, 0)]
    for name, is_max, B, C, H, W, K, S, ties in pools:
        x = r32(B, C, H, W)
        if ties:  # few distinct values: torch keeps the first max of each window
            x = torch.round(x * 2)
        x.requires_grad_()
        if is_max:
            y, idx = F.max_pool2d(x, K, S, return_indices=True)
            fx.add(name + ".idx", idx, "i32")  # flat index within each (H,W) plane
        else:
            y = F.avg_pool2d(x, K, S)
        dy = r32(*y.shape)
        (dx,) = grads_of(y, dy, x)
        fx.add(name + ".dims", torch.tensor([B, C, H, W, K, S]), "i32")
        for k, v in dict(x=x, dy=dy, y=y, dx=dx).items():
            fx.add("%s.%s" % (name, k), v)

    # activations
    acts = {"relu": torch.relu, "gelu": nn.GELU(), "tanh": torch.tanh, "sigmoid": torch.sigmoid}
    for name, fn in acts.items():
        x = r32(64, lo=-4, hi=4)
        x[0], x[1], x[2], x[3] = 0.0, 30.0, -30.0, -1e-3  # edges: 0, saturation, tiny negative
        x.requires_grad_()
        y = fn(x)
        dy = r32(64)
        (dx,) = grads_of(y, dy, x)
        for k, v in dict(x=x, dy=dy, y=y, dx=dx).items():
            fx.add("%s.%s" % (name, k), v)

    # layernorm over the last dim
    N, C = 5, 12
    x = r32(N, C, lo=-3, hi=3).requires_grad_()
    w, b, dy = r32(C, lo=0.5, hi=1.5).requires_grad_(), r32(C).requires_grad_(), r32(N, C)
    y = F.layer_norm(x, (C,), w, b, eps=1e-5)
    dx, dw, db = grads_of(y, dy, x, w, b)
    for k, v in dict(x=x, w=w, b=b, dy=dy, y=y, dx=dx, dw=dw, db=db).items():
        fx.add("layernorm." + k, v)

    # batchnorm2d: train step (batch stats, running-stat update) then eval with the new stats
    B, C, H, W = 3, 4, 3, 5
    x = (r32(B, C, H, W, lo=-2, hi=2) + torch.arange(C).double().view(1, C, 1, 1)).requires_grad_()
    w, b = r32(C, lo=0.5, hi=1.5).requires_grad_(), r32(C).requires_grad_()
    rm0, rv0 = r32(C, lo=-0.5, hi=0.5), r32(C, lo=0.5, hi=2.0)
    rm, rv = rm0.clone(), rv0.clone()
    y = F.batch_norm(x, rm, rv, w, b, training=True, momentum=0.1, eps=1e-5)
    dy = r32(*y.shape)
    dx, dw, db = grads_of(y, dy, x, w, b)
    y_eval = F.batch_norm(x, rm, rv, w, b, training=False, eps=1e-5)
    for k, v in dict(x=x, w=w, b=b, rm0=rm0, rv0=rv0, dy=dy, y=y, dx=dx, dw=dw, db=db, rm=rm, rv=rv,
                     y_eval=y_eval).items():
        fx.add("batchnorm." + k, v)
    fx.add("batchnorm.dims", torch.tensor([B, C, H * W]), "i32")

    # softmax cross-entropy (mean over the batch), including large logits
    B, V = 6, 7
    logits = r32(B, V, lo=-5, hi=5)
    logits[1] += 80.0
    logits.requires_grad_()
    labels = torch.randint(0, V, (B,))
    loss = F.cross_entropy(logits, labels)
    (dl,) = torch.autograd.grad(loss, logits)
    fx.add("xent.logits", logits)
    fx.add("xent.labels", labels, "i32")
    fx.scalar("xent.loss", loss.item())
    fx.add("xent.probs", torch.softmax(logits, 1))
    fx.add("xent.dlogits", dl)

    # mse (mean over all values)
    pred, target = r32(4, 9, lo=-2, hi=2).requires_grad_(), r32(4, 9, lo=-2, hi=2)
    loss = F.mse_loss(pred, target)
    (dp,) = torch.autograd.grad(loss, pred)
    fx.add("mse.pred", pred)
    fx.add("mse.target", target)
    fx.scalar("mse.loss", loss.item())
    fx.add("mse.dpred", dp)


# ---- models --------------------------------------------------------------------------------

MODELS = [
    # name, dtrain spec, torch layers (from the input shape), input (C,H,W), batch
    ("mlp", "mlp", lambda: [nn.Flatten(), nn.Linear(196, 128), nn.ReLU(), nn.Linear(128, 10)],
     (1, 14, 14), 4),
    ("cnn", "cnn", lambda: [nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                            nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                            nn.Linear(64 * 3 * 3, 128), nn.ReLU(), nn.Linear(128, 10)],
     (1, 12, 12), 3),
    ("mixed",
     "conv(4,3,stride=2,pad=1) batchnorm relu maxpool(3,stride=2) conv(6,1) avgpool(2) flatten "
     "linear(16) layernorm gelu linear(12) tanh linear(8,bias=0) sigmoid linear(5)",
     lambda: [nn.Conv2d(2, 4, 3, stride=2, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.MaxPool2d(3, 2),
              nn.Conv2d(4, 6, 1), nn.AvgPool2d(2), nn.Flatten(), nn.Linear(6, 16), nn.LayerNorm(16),
              nn.GELU(), nn.Linear(16, 12), nn.Tanh(), nn.Linear(12, 8, bias=False), nn.Sigmoid(),
              nn.Linear(8, 5)],
     (2, 13, 13), 4),
]


def gen_models(fx):
    for name, spec, layers, (C, H, W), B in MODELS:
        model = nn.Sequential(*layers())  # torch's default init, drawn in float32
        with torch.no_grad():  # non-trivial running stats for the batchnorm layers
            for n_, t in model.named_buffers():
                if n_.endswith("running_mean"):
                    t.copy_(r32(*t.shape, lo=-0.2, hi=0.2))
                elif n_.endswith("running_var"):
                    t.copy_(r32(*t.shape, lo=0.5, hi=1.5))
        model = model.double()  # exact: every value is a float32
        fx.add(name + ".spec_len", torch.tensor([len(spec)]), "i32")
        fx.add(name + ".spec", torch.tensor(list(spec.encode())), "i32")
        fx.add(name + ".dims", torch.tensor([C, H, W, B]), "i32")
        x = r32(B, C, H, W, lo=0, hi=1)
        labels = torch.randint(0, 10 if name != "mixed" else 5, (B,))
        fx.add(name + ".x", x)
        fx.add(name + ".labels", labels, "i32")
        for n_, t in model.state_dict().items():
            if n_.endswith("num_batches_tracked"):
                continue
            fx.add("%s.init.%s" % (name, n_), t)
        model.train()
        logits = model(x)
        loss = F.cross_entropy(logits, labels)
        model.zero_grad()
        loss.backward()
        fx.add(name + ".logits", logits)
        fx.scalar(name + ".loss", loss.item())
        for n_, p in model.named_parameters():
            fx.add("%s.grad.%s" % (name, n_), p.grad)
        for n_, t in model.named_buffers():
            if not n_.endswith("num_batches_tracked"):
                fx.add("%s.after.%s" % (name, n_), t)
        model.eval()
        with torch.no_grad():
            fx.add(name + ".logits_eval", model(x))


# ---- optimizers ----------------------------------------------------------------------------

OPTIMS = [
    # name, kind (0 sgd, 1 adam, 2 adamw), lr, momentum, nesterov, weight_decay, beta1, beta2, eps
    ("sgd", 0, 0.1, 0.0, 0, 0.0, 0, 0, 0),
    ("sgd_wd", 0, 0.1, 0.0, 0, 0.05, 0, 0, 0),
    ("sgd_momentum", 0, 0.05, 0.9, 0, 0.0, 0, 0, 0),
    ("sgd_momentum_wd", 0, 0.05, 0.9, 0, 0.01, 0, 0, 0),
    ("sgd_nesterov", 0, 0.05, 0.9, 1, 0.01, 0, 0, 0),
    ("adam", 1, 0.01, 0, 0, 0.0, 0.9, 0.999, 1e-8),
    ("adam_wd", 1, 0.01, 0, 0, 0.1, 0.9, 0.999, 1e-8),
    ("adam_betas", 1, 0.02, 0, 0, 0.0, 0.8, 0.95, 1e-6),
    ("adamw", 2, 0.01, 0, 0, 0.01, 0.9, 0.999, 1e-8),
    ("adamw_wd", 2, 0.02, 0, 0, 0.2, 0.85, 0.99, 1e-7),
]


def gen_optim(fx):
    n, T = 24, 6
    p0 = r32(n, lo=-2, hi=2)
    grads = r32(T, n)
    grads[:, 0] = 0.0          # a parameter that never gets a gradient
    grads[:, 1] *= 1e-4        # tiny gradients: adam's eps matters
    grads[3] *= 10.0           # a spike in one step
    fx.add("optim.p0", p0)
    fx.add("optim.grads", grads)
    fx.add("optim.dims", torch.tensor([n, T]), "i32")
    for name, kind, lr, mom, nest, wd, b1, b2, eps in OPTIMS:
        p = p0.clone().requires_grad_()
        if kind == 0:
            opt = torch.optim.SGD([p], lr=lr, momentum=mom, nesterov=bool(nest), weight_decay=wd)
        elif kind == 1:
            opt = torch.optim.Adam([p], lr=lr, betas=(b1, b2), eps=eps, weight_decay=wd)
        else:
            opt = torch.optim.AdamW([p], lr=lr, betas=(b1, b2), eps=eps, weight_decay=wd)
        traj = []
        for t in range(T):
            p.grad = grads[t].clone()
            opt.step()
            traj.append(p.detach().clone())
        fx.add("optim.%s.cfg" % name, torch.tensor([kind, lr, mom, nest, wd, b1, b2, eps], dtype=torch.float64))
        fx.add("optim.%s.traj" % name, torch.stack(traj))

    # gradient-norm clipping (torch.nn.utils.clip_grad_norm_): one clipped, one untouched
    for name, g, max_norm in (("clip", r32(n) * 3, 1.0), ("noclip", r32(n) * 0.01, 5.0)):
        q = torch.zeros(n, dtype=torch.float64, requires_grad=True)
        q.grad = g.clone()
        norm = torch.nn.utils.clip_grad_norm_([q], max_norm)
        fx.add("optim.%s.g" % name, g)
        fx.scalar("optim.%s.max_norm" % name, max_norm)
        fx.scalar("optim.%s.norm" % name, norm.item())
        fx.add("optim.%s.clipped" % name, q.grad)


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
    torch.manual_seed(20240611)
    torch.set_num_threads(1)
    for fname, gen in (("layers.dtref", gen_layers), ("models.dtref", gen_models), ("optim.dtref", gen_optim)):
        fx = Fixture()
        gen(fx)
        fx.write(os.path.join(out, fname))


if __name__ == "__main__":
    main()
