#!/usr/bin/python3
"""Reads a safetensors file (e.g. a dtrain checkpoint) with nothing but the Python stdlib, to show
the layout is standard. Applies the checks of the official Rust loader (header length, JSON, dtype,
shape x dtype = byte span, tensors contiguous and covering the data section exactly), verifies
dtrain's CRC32 metadata where present, and prints one line per tensor: name, dtype, shape, crc32
and, with numpy, sum and first values. Optional: --torch also builds torch tensors from the bytes;
--check-sample asserts the values of the sample written by
`DTRAIN_ST_SAMPLE=/tmp/s.safetensors build/tests/safetensors_test`. If the `safetensors` package
is importable, the file is also loaded with safetensors.torch.load_file and compared.
A manual/dev check (needs Debian's /usr/bin/python3 for numpy/torch); not part of `make test`.

usage: /usr/bin/python3 tests/ref/read_safetensors.py FILE [--torch] [--check-sample]
"""
import json
import struct
import sys
import zlib

SIZES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1}
NEEDLE = b'"dtrain.header_crc32":"'


def fail(path, msg):
    sys.exit(f"{path}: {msg}")


def read(path):
    raw = open(path, "rb").read()
    if len(raw) < 8:
        fail(path, "shorter than 8 bytes")
    (n,) = struct.unpack("<Q", raw[:8])
    if n > 100_000_000 or 8 + n > len(raw):
        fail(path, f"bad header length {n}")
    hdr = raw[8:8 + n]
    if not hdr.startswith(b"{"):
        fail(path, "header does not start with '{'")
    header = json.loads(hdr.decode("utf-8"))  # trailing spaces are allowed by json
    meta = header.pop("__metadata__", {})
    if not all(isinstance(v, str) for v in meta.values()):
        fail(path, "metadata values must be strings")
    data = raw[8 + n:]
    # official loader rules: spans match dtype x shape, tensors contiguous from 0, cover all data
    pos = 0
    for name, t in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"]):
        b, e = t["data_offsets"]
        numel = 1
        for d in t["shape"]:
            numel *= d
        if b != pos or e - b != numel * SIZES[t["dtype"]]:
            fail(path, f"tensor {name}: offsets {b},{e} not contiguous or wrong size")
        pos = e
    if pos != len(data):
        fail(path, f"tensors cover {pos} bytes of a {len(data)}-byte data section")
    # dtrain integrity metadata (see include/dtrain/safetensors.h)
    verified = False
    if "dtrain.header_crc32" in meta:
        i = hdr.index(NEEDLE) + len(NEEDLE)
        if hdr.count(NEEDLE) != 1:
            fail(path, "dtrain.header_crc32 appears more than once")
        want = int(hdr[i:i + 8], 16)
        got = zlib.crc32(hdr[:i] + b"00000000" + hdr[i + 8:])
        if got != want:
            fail(path, f"header CRC32 mismatch: stored {want:08x}, computed {got:08x}")
        verified = True
    for name, t in header.items():
        b, e = t["data_offsets"]
        c = meta.get("dtrain.crc32." + name)
        if c is not None and int(c, 16) != zlib.crc32(data[b:e]):
            fail(path, f"tensor {name}: CRC32 mismatch")
        verified = verified and c is not None
    return header, meta, data, verified


def as_numpy(np, t, buf):
    dt = t["dtype"]
    if dt == "BF16":  # numpy has no bfloat16: widen the bits to float32
        a = (np.frombuffer(buf, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
    else:
        a = np.frombuffer(buf, dtype={"F64": "<f8", "F32": "<f4", "F16": "<f2", "I64": "<i8", "I32": "<i4",
                                      "I16": "<i2", "I8": "i1", "U8": "u1", "BOOL": "?"}[dt])
    return a.reshape(t["shape"])


def check_sample(np, arrays):
    """Values written by src/run/safetensors_test.c's sample_writer()."""
    want = {
        "0.weight": np.arange(12, dtype=np.float32).reshape(4, 3) * 0.5 - 1,
        "0.bias": 1 / np.arange(1, 5, dtype=np.float32),
        "emb": np.arange(10, dtype=np.float32).reshape(2, 5) - 4.5,
        "half": np.arange(3, dtype=np.float32) * 0.25,
        "idx": np.array([[-1, 0], [1 << 40, 42]], dtype=np.int64),
        "mask": np.array([1, 0, 255, 3, 4, 5, 6], dtype=np.uint8),
        "scalar": np.array(3.25, dtype=np.float32),
        "empty": np.zeros((3, 0), dtype=np.float32),
        "i8": np.array([-7], dtype=np.int8),
    }
    for name, w in want.items():
        a = arrays[name]
        if a.shape != w.shape or not np.array_equal(a.astype(np.float64), w.astype(np.float64)):
            sys.exit(f"sample tensor {name}: got {a!r}, want {w!r}")
    print(f"sample values: all {len(want)} tensors match what safetensors_test wrote")


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    if len(args) != 1:
        sys.exit(__doc__)
    path = args[0]
    header, meta, data, verified = read(path)
    try:
        import numpy as np
    except ImportError:
        np = None
    arrays = {}
    print(f"{path}: {len(header)} tensors, {len(data)} data bytes, "
          f"{'dtrain CRC32s verified' if verified else 'no dtrain CRC32s (plain safetensors)'}")
    for k, v in meta.items():
        if not k.startswith("dtrain.crc32."):
            print(f"  meta {k} = {v!r}")
    for name, t in header.items():
        b, e = t["data_offsets"]
        line = f"  {name:12s} {t['dtype']:5s} {str(t['shape']):10s} crc32={zlib.crc32(data[b:e]):08x}"
        if np is not None:
            a = arrays[name] = as_numpy(np, t, data[b:e])
            line += f" sum={a.astype(np.float64).sum():.6g} first={a.reshape(-1)[:3].tolist()}"
        print(line)
    if "--check-sample" in sys.argv:
        if np is None:
            sys.exit("--check-sample needs numpy")
        check_sample(np, arrays)
    if "--torch" in sys.argv:
        import torch
        for name, t in header.items():
            b, e = t["data_offsets"]
            tt = getattr(torch, {"F32": "float32", "F64": "float64", "F16": "float16", "BF16": "bfloat16",
                                 "I64": "int64", "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8"}[t["dtype"]])
            x = torch.frombuffer(bytearray(data[b:e]), dtype=tt) if e > b else torch.empty(0, dtype=tt)
            x = x.reshape(t["shape"])
            if np is not None and not np.array_equal(x.double().numpy(), arrays[name].astype(np.float64)):
                sys.exit(f"torch and numpy disagree on {name}")
        print(f"torch {torch.__version__}: built all {len(header)} tensors from the bytes, equal to numpy's")
    try:
        from safetensors.torch import load_file
    except ImportError:
        print("safetensors package not installed: official loader not tried")
        return
    loaded = load_file(path)
    assert set(loaded) == set(header), "official loader sees different tensor names"
    for name, x in loaded.items():
        assert list(x.shape) == header[name]["shape"], name
    print(f"safetensors.torch.load_file: loaded all {len(loaded)} tensors")


if __name__ == "__main__":
    main()
