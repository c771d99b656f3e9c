# st_maxdiff.py A B TOL [--model-only]: two safetensors files hold the same tensor names and shapes
# and max |A - B| <= TOL (printed); exit 1 otherwise. --model-only leaves out the optimizer state
# (optim.*), so a checkpoint compares with a consolidated or weights-only file. Used by the
# integration scripts (tp.sh, zero.sh).
import array, json, struct, sys
def tensors(p, model_only):
    raw = open(p, "rb").read(); n = struct.unpack("<Q", raw[:8])[0]; h = json.loads(raw[8:8 + n]); h.pop("__metadata__", None)
    out = {}
    for k, v in h.items():
        if model_only and k.startswith("optim."): continue
        a = array.array("f"); a.frombytes(raw[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]])
        out[k] = (v["shape"], a)
    return out
only = "--model-only" in sys.argv[4:]
a, b = tensors(sys.argv[1], only), tensors(sys.argv[2], only)
assert a.keys() == b.keys(), sorted(set(a) ^ set(b))
assert all(a[k][0] == b[k][0] for k in a), [k for k in a if a[k][0] != b[k][0]]
d = max(max(abs(x - y) for x, y in zip(a[k][1], b[k][1])) for k in a)
print("%.3g" % d)
sys.exit(0 if d <= float(sys.argv[3]) else 1)
