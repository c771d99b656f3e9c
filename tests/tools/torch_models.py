"""PyTorch side of the tests that load dtrain's files into torch: a safetensors reader and a
nanoGPT-style GPT whose parameter names and shapes are dtrain's GPT preset's (pre-LN blocks,
GELU MLP, learned positions, head tied to the token embedding). Used by tests/torch_load_gpt.sh
and tests/weights_io.sh."""
import json, math, struct

import torch, torch.nn as nn, torch.nn.functional as F

DTYPES = {"F32": torch.float32, "I64": torch.int64, "I32": torch.int32}


def load_safetensors(path, skip_prefix=None):
    """The tensors of a safetensors file by name (those starting with skip_prefix left out)."""
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    h = json.loads(raw[8:8 + n])
    h.pop("__metadata__", None)
    return {k: torch.frombuffer(bytearray(raw[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]]),
                                dtype=DTYPES[v["dtype"]]).view(v["shape"])
            for k, v in h.items() if not (skip_prefix and k.startswith(skip_prefix))}


def gpt(L, H, C, T, V=256):
    """A GPT of L blocks, H heads, width C, context T and vocabulary V."""
    class Attn(nn.Module):
        def __init__(s): super().__init__(); s.c_attn = nn.Linear(C, 3 * C); s.c_proj = nn.Linear(C, C)

        def forward(s, x):
            B = x.shape[0]
            q, k, v = s.c_attn(x).split(C, 2)
            q, k, v = (t.view(B, T, H, C // H).transpose(1, 2) for t in (q, k, v))
            a = (q @ k.transpose(-2, -1) / math.sqrt(C // H)).masked_fill(
                ~torch.tril(torch.ones(T, T, dtype=torch.bool)), float("-inf"))
            return s.c_proj((F.softmax(a, -1) @ v).transpose(1, 2).reshape(B, T, C))

    class MLP(nn.Module):
        def __init__(s): super().__init__(); s.c_fc = nn.Linear(C, 4 * C); s.c_proj = nn.Linear(4 * C, C)

        def forward(s, x): return s.c_proj(F.gelu(s.c_fc(x)))

    class Block(nn.Module):
        def __init__(s):
            super().__init__()
            s.ln_1 = nn.LayerNorm(C); s.attn = Attn(); s.ln_2 = nn.LayerNorm(C); s.mlp = MLP()

        def forward(s, x):
            x = x + s.attn(s.ln_1(x))
            return x + s.mlp(s.ln_2(x))

    class GPT(nn.Module):
        def __init__(s):
            super().__init__()
            s.transformer = nn.ModuleDict(dict(wte=nn.Embedding(V, C), wpe=nn.Embedding(T, C),
                                               h=nn.ModuleList(Block() for _ in range(L)), ln_f=nn.LayerNorm(C)))
            s.lm_head = nn.Linear(C, V, bias=False)
            s.transformer.wte.weight = s.lm_head.weight

        def forward(s, idx):
            x = s.transformer.wte(idx) + s.transformer.wpe(torch.arange(T))
            for b in s.transformer.h: x = b(x)
            return s.lm_head(s.transformer.ln_f(x))

    return GPT()
