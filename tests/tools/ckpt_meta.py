#!/usr/bin/env python3
"""Rewrites metadata of a dtrain checkpoint (safetensors) and recomputes dtrain.header_crc32 the
way the header documents it (CRC-32 of the header text with the 8 digits set to '0'), so the
result passes the integrity checks and only the values themselves are wrong.
Usage: ckpt_meta.py IN OUT KEY=VALUE...   (VALUE "-" removes the key)"""
import json
import struct
import sys
import zlib


def main():
    src, dst, edits = sys.argv[1], sys.argv[2], sys.argv[3:]
    raw = open(src, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    data = raw[8 + n:]
    meta = header["__metadata__"]
    for e in edits:
        k, v = e.split("=", 1)
        if v == "-":
            meta.pop(k, None)
        else:
            meta[k] = v
    meta["dtrain.header_crc32"] = "00000000"
    text = json.dumps(header, separators=(",", ":"))
    text += " " * (-(len(text)) % 8)  # keep the data 8-byte aligned
    crc = "%08x" % (zlib.crc32(text.encode()) & 0xFFFFFFFF)
    text = text.replace('"dtrain.header_crc32":"00000000"', '"dtrain.header_crc32":"%s"' % crc)
    with open(dst, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text.encode() + data)


main()
