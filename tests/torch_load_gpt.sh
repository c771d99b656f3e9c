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
import json, math, struct, sys
import torch, torch.nn as nn, torch.nn.functional as F
raw = open(sys.argv[1], "rb").read(); n = struct.unpack("<Q", raw[:8])[0]; h = json.loads(raw[8:8 + n]); h.pop("__metadata__")
sd = {k: torch.frombuffer(bytearray(raw[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]]), dtype=torch.float32).view(v["shape"])
      for k, v in h.items() if not k.startswith("optim.")}
L, H, C, T, V = 2, 2, 32, 16, 256
class Attn(nn.Module):
    def __init__(s): super().__init__(); s.c_attn = nn.Linear(C, 3 * C); s.c_proj = nn.Linear(C, C)
    def forward(s, x):
        B = x.shape[0]; q, k, v = s.c_attn(x).split(C, 2)
        q, k, v = (t.view(B, T, H, C // H).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True) if hasattr(F, "scaled_dot_product_attention") else \
            F.softmax((q @ k.transpose(-2, -1) / math.sqrt(C // H)).masked_fill(~torch.tril(torch.ones(T, T, dtype=torch.bool)), float("-inf")), -1) @ v
        return s.c_proj(y.transpose(1, 2).reshape(B, T, C))
class MLP(nn.Module):
    def __init__(s): super().__init__(); s.c_fc = nn.Linear(C, 4 * C); s.c_proj = nn.Linear(4 * C, C)
    def forward(s, x): return s.c_proj(F.gelu(s.c_fc(x)))
class Block(nn.Module):
    def __init__(s): super().__init__(); s.ln_1 = nn.LayerNorm(C); s.attn = Attn(); s.ln_2 = nn.LayerNorm(C); s.mlp = MLP()
    def forward(s, x): x = x + s.attn(s.ln_1(x)); return x + s.mlp(s.ln_2(x))
class GPT(nn.Module):
    def __init__(s):
        super().__init__()
        s.transformer = nn.ModuleDict(dict(wte=nn.Embedding(V, C), wpe=nn.Embedding(T, C), h=nn.ModuleList(Block() for _ in range(L)), ln_f=nn.LayerNorm(C)))
        s.lm_head = nn.Linear(C, V, bias=False); s.transformer.wte.weight = s.lm_head.weight
    def forward(s, idx):
        x = s.transformer.wte(idx) + s.transformer.wpe(torch.arange(T))
        for b in s.transformer.h: x = b(x)
        return s.lm_head(s.transformer.ln_f(x))
m = GPT()
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
