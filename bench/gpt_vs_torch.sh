#!/usr/bin/env bash
# The GPT throughput target side by side: dtrain (bench train --model gpt) and PyTorch 1.13
# (bench/gpt_torch.py, Debian's python3-torch) on the same shape (L4 H4 C128 T64, batch 12,
# AdamW, f32, one thread), interleaved ROUNDS times so both see the same machine; PyTorch runs
# in the default environment and with OpenBLAS's kernel set fixed (OPENBLAS_CORETYPE, the one
# dtrain picks on this CPU). Prints a table of medians, the ratios, and one JSON line.
#   bench/gpt_vs_torch.sh [ROUNDS=3] [SECONDS=8]      (needs python3-torch: not part of CI)
set -euo pipefail
cd "$(dirname "$0")/.."
R=${1:-3} S=${2:-8} DT=${DT:-build/dtrain}
/usr/bin/python3 -c "import torch" 2>/dev/null || { echo "skip: python3-torch is not installed (apt-get install python3-torch)"; exit 77; }
core=$($DT bench train --model gpt --seconds 0.5 | sed -n 's/^# openblas: \([A-Za-z0-9]*\) kernels.*/\1/p')
[ "$core" = Prescott ] && core=SkylakeX
d=() t0=() t1=()
for i in $(seq "$R"); do
  d+=("$($DT bench train --model gpt --seconds "$S" | sed -n 's/.*"tokens_per_s": \([0-9.]*\).*/\1/p')")
  t0+=("$(/usr/bin/python3 bench/gpt_torch.py --seconds "$S" | sed -n 's/.*"tokens_per_s": \([0-9.]*\).*/\1/p')")
  t1+=("$(OPENBLAS_CORETYPE=$core /usr/bin/python3 bench/gpt_torch.py --seconds "$S" | sed -n 's/.*"tokens_per_s": \([0-9.]*\).*/\1/p')")
done
python3 - "$core" "${d[*]}" "${t0[*]}" "${t1[*]}" <<'PY'
import json, statistics, sys
core = sys.argv[1]
d, t0, t1 = ([float(x) for x in a.split()] for a in sys.argv[2:5])
md, m0, m1 = statistics.median(d), statistics.median(t0), statistics.median(t1)
print("# gpt L4 H4 C128 T64, batch 12, AdamW, f32, 1 thread; %d interleaved rounds" % len(d))
with open("/proc/cpuinfo") as f:
    cpu = next((l.split(":", 1)[1].strip() for l in f if l.startswith("model name")), "?")
print("# cpu: %s" % cpu)
print("%-42s %12s %28s %10s" % ("run", "tokens/s", "rounds", "dtrain is"))
print("%-42s %12.0f %28s %10s" % ("dtrain", md, " ".join("%.0f" % x for x in d), "-"))
print("%-42s %12.0f %28s %9.2fx" % ("pytorch 1.13 (default env)", m0, " ".join("%.0f" % x for x in t0), md / m0))
print("%-42s %12.0f %28s %9.2fx" % ("pytorch 1.13 (OPENBLAS_CORETYPE=%s)" % core, m1, " ".join("%.0f" % x for x in t1), md / m1))
print(json.dumps({"bench": "gpt_vs_torch", "cpu": cpu, "dtrain_tokens_per_s": md, "torch_default_tokens_per_s": m0,
                  "torch_fixed_tokens_per_s": m1, "ratio_default": md / m0, "ratio_fixed": md / m1, "rounds": len(d)}))
PY
