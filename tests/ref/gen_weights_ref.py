#!/usr/bin/python3
"""Generates the plain-weights fixtures of tests/weights_in.sh: small PyTorch models trained for a
few hundred steps on Fashion-MNIST, saved the way `safetensors.torch.save_file(model.state_dict())`
saves them (no dtrain metadata; Debian has no python3-safetensors, so the file layout of that
library is written here: 8-byte header length, JSON header padded with spaces to a multiple of 8,
tensors sorted by alignment then name), and PyTorch's loss and accuracy of each on the 10,000
test images. Needs Debian's python3-torch and dataset-fashion-mnist; CI uses the committed files.

    /usr/bin/python3 tests/ref/gen_weights_ref.py tests/ref/weights

Writes mlp_f32.safetensors (784-16-10), mlp_bf16.safetensors (the same weights in BF16),
cnn_f16.safetensors (conv, batchnorm with num_batches_tracked, maxpool, linear; F16) and
expected.json {file: {model, loss, acc, samples}}: the loss is the mean cross-entropy over the
test set of PyTorch's float32 logits, accumulated in float64."""
import copy
import gzip
import json
import os
import struct
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

DATA = "/usr/share/datasets/fashion-mnist"
DTYPES = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16", torch.int64: "I64"}


def save_file(tensors, path):
    """safetensors.torch.save_file's layout, for a dict of contiguous CPU tensors."""
    items = sorted(tensors.items(), key=lambda kv: (-kv[1].element_size(), kv[0]))
    header, blobs, off = {}, [], 0
    for name, t in items:
        raw = t.contiguous().view(torch.uint8).numpy().tobytes() if t.dim() else t.reshape(1).view(torch.uint8).numpy().tobytes()
        header[name] = {"dtype": DTYPES[t.dtype], "shape": list(t.shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def idx(name):
    b = gzip.open(f"{DATA}/{name}.gz").read()
    nd = b[3]
    dims = struct.unpack(">" + "I" * nd, b[4:4 + 4 * nd])
    return torch.frombuffer(bytearray(b[4 + 4 * nd:]), dtype=torch.uint8).reshape(dims)


def train(model, x, y, steps=300, batch=64):
    opt = torch.optim.Adam(model.parameters(), lr=2e-3)
    g = torch.Generator().manual_seed(1)
    model.train()
    for _ in range(steps):
        i = torch.randint(0, len(x), (batch,), generator=g)
        opt.zero_grad()
        F.cross_entropy(model(x[i]), y[i]).backward()
        opt.step()
    model.eval()


def reference(model, x, y):
    with torch.no_grad():
        logits = model(x)
    loss = F.cross_entropy(logits.double(), y).item()
    acc = (logits.argmax(1) == y).double().mean().item()
    return loss, acc


def main(out):
    torch.manual_seed(0)
    torch.set_num_threads(1)
    xtr = idx("train-images-idx3-ubyte").float().div(255).unsqueeze(1)
    ytr = idx("train-labels-idx1-ubyte").long()
    xte = idx("t10k-images-idx3-ubyte").float().div(255).unsqueeze(1)
    yte = idx("t10k-labels-idx1-ubyte").long()
    expected = {}
    mlp = nn.Sequential(nn.Flatten(), nn.Linear(784, 16), nn.ReLU(), nn.Linear(16, 10))
    train(mlp, xtr, ytr)
    cnn = nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                        nn.Linear(4 * 13 * 13, 10))
    train(cnn, xtr, ytr)
    cases = [("mlp_f32", mlp, torch.float32, "flatten linear(16) relu linear(10)"),
             ("mlp_bf16", mlp, torch.bfloat16, "flatten linear(16) relu linear(10)"),
             ("cnn_f16", cnn, torch.float16, "conv(4,3) batchnorm relu maxpool(2) flatten linear(10)")]
    for name, model, dtype, spec in cases:
        sd = {k: (v.to(dtype) if v.is_floating_point() else v) for k, v in model.state_dict().items()}
        save_file(sd, os.path.join(out, name + ".safetensors"))
        ref = copy.deepcopy(model)  # the model as a strict load of the file gives it
        ref.load_state_dict({k: v.float() if v.is_floating_point() else v for k, v in sd.items()}, strict=True)
        ref.eval()
        loss, acc = reference(ref, xte, yte)
        expected[name + ".safetensors"] = {"model": spec, "loss": loss, "acc": acc, "samples": len(yte)}
        print(f"{name}: loss {loss:.6f} acc {acc:.4f}")
    with open(os.path.join(out, "expected.json"), "w") as f:
        json.dump(expected, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tests/ref/weights")
