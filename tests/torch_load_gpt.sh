# A GPT checkpoint loads into a nanoGPT-style PyTorch model unchanged (skipped without Debian's
# python3-torch, which CI does not install): the tensor names and shapes are nanoGPT's
# (load_state_dict(strict=False) misses only lm_head.weight, tied to transformer.wte.weight), and
# PyTorch's validation loss over the same windows equals dtrain eval's.
. "$(dirname "$0")/testlib.bash"
/usr/bin/python3 -c "import torch" 2>/dev/null || { echo "skip: python3-torch is not installed"; finish; exit 77; }
python3 -c "
import random; random.seed(3); w='and the lord spake unto moses saying .'.split()
open('$TMP/c.txt','w').write(' '.join(random.choice(w) for _ in range(4000)))"
M="gpt:L=2,H=2,C=32,T=16"
$DT train --data "text:$TMP/c.txt" --model "$M" --batch 8 --optimizer adamw --lr 3e-3 --max-steps 60 --quiet \
  --save "$TMP/g.st" >/dev/null 2>&1 || bad "train"
ev=$($DT eval --checkpoint "$TMP/g.st" --data "text:$TMP/c.txt" 2>&1) || bad "eval: $ev"
loss=$(sed -n 's/.*loss \([0-9.]*\),.*/\1/p' <<<"$ev")
/usr/bin/python3 - "$TMP/g.st" "$TMP/c.txt" "$loss" <<'PY' && ok "nanoGPT-style torch model loads the checkpoint; val loss $loss matches" || bad "torch load"
import math, os, sys
import torch, torch.nn.functional as F
sys.path.insert(0, os.environ["DTRAIN_TOOLS"])
from torch_models import gpt, load_safetensors
sd = load_safetensors(sys.argv[1], skip_prefix="optim.")
L, H, C, T, V = 2, 2, 32, 16, 256
m = gpt(L, H, C, T, V)
r = m.load_state_dict(sd, strict=False)
assert r.missing_keys == ["lm_head.weight"] and not r.unexpected_keys, r
data = open(sys.argv[2], "rb").read(); vlen = int(math.floor(len(data) * 0.1)); val = data[len(data) - vlen:]
nw = (len(val) - 1) // T
x = torch.tensor([list(val[i * T:i * T + T]) for i in range(nw)]); y = torch.tensor([list(val[i * T + 1:i * T + T + 1]) for i in range(nw)])
with torch.no_grad(): loss = F.cross_entropy(m(x).reshape(-1, V), y.reshape(-1)).item()
print("torch val loss %.4f, dtrain %s" % (loss, sys.argv[3]))
assert abs(loss - float(sys.argv[3])) < 2e-4, (loss, sys.argv[3])
PY
finish
