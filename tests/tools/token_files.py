"""Writes pre-tokenized corpora the way other projects do, for the tokens:DIR tests.
  token_files.py nanogpt DIR SEED N   DIR/train.bin, DIR/val.bin as nanoGPT's prepare.py writes them
                                      (np.uint16 .tofile, 90 % / 10 % of N tokens)
  token_files.py llmc DIR SEED N      llm.c shards DIR/tiny_val_000000.bin (first 10 %) and
                                      DIR/tiny_train_00000{1,2}.bin, with llm.c's 256-int32 header
The tokens: 64 distinct ids k*11 (k < 64, the largest 693, above a byte) in a Markov chain that
follows k -> (5k + 3) % 64 nine times in ten (learnable), else a random k. The same seed, the same files."""
import os, sys
import numpy as np

def stream(seed, n):
    rng = np.random.default_rng(seed)
    k, out = 0, np.empty(n, dtype=np.uint16)
    jump, rand = rng.random(n) < 0.1, rng.integers(0, 64, n)
    for i in range(n):
        k = int(rand[i]) if jump[i] else (5 * k + 3) % 64
        out[i] = 11 * k
    return out

def write_datafile(filename, toks):  # llm.c dev/data/data_common.py's layout
    header = np.zeros(256, dtype=np.int32)
    header[0], header[1], header[2] = 20240520, 1, len(toks)
    with open(filename, "wb") as f:
        f.write(header.tobytes())
        f.write(toks.astype(np.uint16).tobytes())

kind, d, seed, n = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
os.makedirs(d, exist_ok=True)
ids = stream(seed, n)
cut = int(n * 0.9)
if kind == "nanogpt":
    ids[:cut].tofile(os.path.join(d, "train.bin"))
    ids[cut:].tofile(os.path.join(d, "val.bin"))
else:
    v = n - cut
    write_datafile(os.path.join(d, "tiny_val_000000.bin"), ids[:v])
    half = v + (n - v) // 2
    write_datafile(os.path.join(d, "tiny_train_000001.bin"), ids[v:half])
    write_datafile(os.path.join(d, "tiny_train_000002.bin"), ids[half:])
