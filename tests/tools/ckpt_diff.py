#!/usr/bin/env python3
"""Compares the F32 tensors of two dtrain checkpoints (safetensors): prints the largest
|a - b| relative to the largest |b| of its tensor (absolute with --abs; optimizer state excluded
with --params), and exits 1 when it exceeds TOL.
Usage: ckpt_diff.py A B TOL [--params] [--abs]"""
import array
import json
import struct
import sys


def tensors(path):
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    data = raw[8 + n:]
    out = {}
    for name, t in header.items():
        if name == "__metadata__" or t["dtype"] != "F32":
            continue
        lo, hi = t["data_offsets"]
        out[name] = array.array("f", data[lo:hi])
    return out


def main():
    a, b, tol = tensors(sys.argv[1]), tensors(sys.argv[2]), float(sys.argv[3])
    params, absolute = "--params" in sys.argv[4:], "--abs" in sys.argv[4:]
    if set(a) != set(b):
        print("tensor names differ: %s" % sorted(set(a) ^ set(b)))
        sys.exit(1)
    worst, where = 0.0, ""
    for name in sorted(a):
        if params and name.startswith("optim."):
            continue
        x, y = a[name], b[name]
        scale = 1.0 if absolute else max((abs(v) for v in y), default=0.0) or 1.0
        d = max((abs(p - q) for p, q in zip(x, y)), default=0.0) / scale
        if d > worst or d != d:
            worst, where = d, name
    print("max %s diff %.3e (%s)" % ("abs" if absolute else "rel", worst, where))
    sys.exit(0 if worst <= tol else 1)


if __name__ == "__main__":
    main()
