#!/usr/bin/env bash
# oneDNN's kernel ceiling at the reference models' own shapes: runs `dtrain bench train` with
# oneDNN's verbose mode at fp32 and bf16 (interleaved, REPEAT times) and tabulates oneDNN's own
# execution time per primitive, pass and shape (the fastest call: load adds time, never takes it
# away): the main primitives (matmul, convolution) side by side at f32 and bf16 (x = f32 time /
# bf16 time: the most bf16 kernels can gain at that shape on this CPU, conversions not counted),
# and the mean time per step spent in reorders (layout and f32 -> bf16 conversions).
#   bench/onednn_ceiling.sh [build/dtrain] [model: cnn|mlp|gpt] [batch] [seconds] [repeat]
set -euo pipefail
DT=${1:-build/dtrain}
MODEL=${2:-cnn}
BATCH=${3:-}
SECONDS_PER=${4:-2}
REPEAT=${5:-2}
args=(bench train --model "$MODEL" --kernels onednn --precision fp32,bf16 --seconds "$SECONDS_PER" --repeat "$REPEAT")
[ -n "$BATCH" ] && args+=(--batch "$BATCH")
echo "# $DT ${args[*]} (load average $(cut -d' ' -f1 /proc/loadavg))"
ONEDNN_VERBOSE=1 "$DT" "${args[@]}" | awk -F, '
  /^onednn_verbose,exec,/ { n++; kind[n] = $4; impl[n] = $5; prop[n] = $6; shape[n] = $(NF - 1); t[n] = $NF; next }
  /^(mlp|cnn|gpt|spec) / {   # a result row closes the verbose lines before it
    split($0, w, " +"); prec = w[4]
    for (i = 1; i <= n; i++) {
      if (kind[i] == "reorder") { reorder[prec] += t[i]; continue }
      k = kind[i] " " prop[i] " " shape[i]
      sum[prec, k] += t[i]; cnt[prec, k]++; if (!((prec, k) in lo) || t[i] < lo[prec, k]) lo[prec, k] = t[i]; keys[k] = 1; impls[prec, k] = impl[i]
      if (cnt[prec, k] > steps[prec]) steps[prec] = cnt[prec, k]
    }
    n = 0; print "# row: " $0; next
  }
  END {
    printf "%-12s %-16s %-52s %9s %9s %6s  %s\n", "primitive", "pass", "shape", "f32 min ms", "bf16 min", "x", "impl at bf16"
    m = 0
    for (k in keys) if (cnt["fp32", k] > 0 && cnt["bf16", k] > 0) order[++m] = k
    for (i = 1; i <= m; i++) for (j = i + 1; j <= m; j++) if (order[j] < order[i]) { s = order[i]; order[i] = order[j]; order[j] = s }
    for (i = 1; i <= m; i++) {
      k = order[i]; split(k, p, " ")
      a = lo["fp32", k]; b = lo["bf16", k]; tf += a; tb += b
      printf "%-12s %-16s %-52s %9.3f %9.3f %5.2fx  %s\n", p[1], p[2], p[3], a, b, a / b, impls["bf16", k]
    }
    printf "%-12s %-16s %-52s %9.3f %9.3f %5.2fx\n", "main total", "", "(one call of each row: about one step)", tf, tb, tf / tb
    rf = steps["fp32"] ? reorder["fp32"] / steps["fp32"] : 0; rb = steps["bf16"] ? reorder["bf16"] / steps["bf16"] : 0
    printf "%-12s %-16s %-52s %9.3f %9.3f\n", "reorders", "", "(per step)", rf, rb
  }'
