# A dtrain checkpoint loads into the equivalent PyTorch model unchanged (README's promise, until
# now a manual script): the MLP's tensors go into torch.nn.Sequential(Flatten, Linear, ReLU,
# Linear) with load_state_dict(strict=True), and PyTorch's test accuracy and loss on
# Fashion-MNIST equal `dtrain eval`'s. Needs Debian's python3-torch (skips without it).
. "$(dirname "$0")/testlib.bash"
PY=/usr/bin/python3
if ! $PY -c "import torch" 2>/dev/null; then echo "skip: $PY has no torch (apt-get install python3-torch)"; exit 77; fi
if ! have_fmnist; then echo "skip: Fashion-MNIST not installed (apt-get install dataset-fashion-mnist)"; exit 77; fi
$DT train --data fashion-mnist --model mlp --epochs 1 --max-steps 300 --quiet --save "$TMP/mlp.st" >/dev/null \
  || { bad "training failed"; finish; exit 1; }
ev=$($DT eval --checkpoint "$TMP/mlp.st" --data fashion-mnist)
read -r d_loss d_acc < <(sed -E 's/.*loss ([0-9.]+), accuracy ([0-9.]+).*/\1 \2/' <<<"$ev")
t_out=$($PY - "$TMP/mlp.st" /usr/share/datasets/fashion-mnist <<'PY'
import gzip, json, struct, sys
import torch
path, data = sys.argv[1], sys.argv[2]
raw = open(path, "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
hdr = json.loads(raw[8:8 + n])
body = raw[8 + n:]
state = {}
for name, t in hdr.items():
    if name == "__metadata__" or name.startswith("optim."):
        continue
    assert t["dtype"] == "F32", t
    a, b = t["data_offsets"]
    state[name] = torch.frombuffer(bytearray(body[a:b]), dtype=torch.float32).reshape(t["shape"])
model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(784, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
model.load_state_dict(state, strict=True)  # the names (1.weight, 3.bias, ...) are torch's own
def idx(name):
    b = gzip.open(f"{data}/{name}.gz").read()
    nd = b[3]
    dims = struct.unpack(">" + "I" * nd, b[4:4 + 4 * nd])
    return torch.frombuffer(bytearray(b[4 + 4 * nd:]), dtype=torch.uint8).reshape(dims)
x = idx("t10k-images-idx3-ubyte").float() / 255.0
y = idx("t10k-labels-idx1-ubyte").long()
with torch.no_grad():
    logits = model(x.unsqueeze(1))
    loss = torch.nn.functional.cross_entropy(logits, y).item()
    acc = (logits.argmax(1) == y).float().mean().item()
print(f"{loss:.6f} {acc:.6f}")
PY
) || { bad "PyTorch could not load the checkpoint: $t_out"; finish; exit 1; }
read -r t_loss t_acc <<<"$t_out"
python3 -c "import sys; sys.exit(0 if abs($t_loss - $d_loss) < 1e-3 and abs($t_acc - $d_acc) <= 3e-4 else 1)" \
  && ok "PyTorch loads the checkpoint strictly: loss $t_loss acc $t_acc, dtrain eval: loss $d_loss acc $d_acc" \
  || bad "PyTorch loss $t_loss acc $t_acc vs dtrain eval loss $d_loss acc $d_acc"
finish
