#!/usr/bin/env python3
"""Writes a Fashion-MNIST subset as the data set ships (gzip'd IDX): the first NTRAIN training
and the first NTEST test images and labels, so a test's training and end-of-epoch test pass stay
short while the images are the real ones (the same first test images as the full set).
Usage: fmnist_subset.py SRC_DIR DST_DIR NTRAIN NTEST"""
import gzip
import os
import struct
import sys

src, dst, ntrain, ntest = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
os.makedirs(dst, exist_ok=True)
for name, k in (("train-images-idx3-ubyte", ntrain), ("train-labels-idx1-ubyte", ntrain),
                ("t10k-images-idx3-ubyte", ntest), ("t10k-labels-idx1-ubyte", ntest)):
    b = gzip.open(f"{src}/{name}.gz").read()
    nd = b[3]
    dims = list(struct.unpack(">" + "I" * nd, b[4:4 + 4 * nd]))
    per = 1
    for d in dims[1:]:
        per *= d
    dims[0] = min(k, dims[0])
    with gzip.open(f"{dst}/{name}.gz", "wb") as f:
        f.write(b[:4] + struct.pack(">" + "I" * nd, *dims) + b[4 + 4 * nd:4 + 4 * nd + dims[0] * per])
