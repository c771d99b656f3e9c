#!/usr/bin/env bash
# Gradient compression through the real CLI on 2 local workers (shared memory): a run stopped and
# resumed from its checkpoint ends bitwise equal to an uninterrupted one, for every compressor
# with state (top-k with DGC momentum correction and warm-up, PowerSGD, fp16) under ddp and for
# top-k under localsgd (stopped where it averages: a checkpoint averages first), and for a run
# stopped by SIGTERM: the error-feedback state of every rank is in the checkpoint. The metrics line reports bytes per
# step and the compression ratio, which matches the stated one (top-k 0.1: 4n / (8 ceil(0.1 n)))
# within 5%. ddp with --allreduce hier (forced on one host) ends where flat ends. Bad --compress
# and --allreduce values are usage errors that name the value. The residual is reported, and
# carried across a resume that changes --precision, in gradient units (fp16 keeps it scaled).
# Usage: bash tests/compress.sh BUILDDIR
source "$(dirname "$0")/testlib.bash"

# a small separable 4-class CSV: 300 samples of 12 features
awk 'BEGIN { srand(7); for (i = 0; i < 300; i++) { y = int(rand() * 4); printf "%d", y;
     for (k = 0; k < 12; k++) printf ",%.4f", rand() + (k % 4 == y ? 1.5 : 0); printf "\n" } }' >"$TMP/toy_train.csv"
COMMON=(--data "$TMP/toy_train.csv" --model "linear(32) relu linear(4)" --batch 8 --epochs 3 --seed 3
        --optimizer sgd --lr 0.05 --workers 2 --quiet)

resume_exact() {  # NAME ARGS...: 24 steps straight == STOP (11) steps, then resumed to 24
  local name=$1 stop=${STOP:-11}; shift
  "$DT" train "${COMMON[@]}" "$@" --max-steps 24 --save "$TMP/$name-a.st" >"$TMP/$name-a.log" 2>&1 || {
    bad "$name: straight run failed: $(tail -3 "$TMP/$name-a.log")"; return; }
  "$DT" train "${COMMON[@]}" "$@" --max-steps "$stop" --save "$TMP/$name-b.st" >"$TMP/$name-b.log" 2>&1 &&
    "$DT" train "${COMMON[@]}" "$@" --max-steps 24 --resume "$TMP/$name-b.st" --save "$TMP/$name-c.st" \
      >"$TMP/$name-c.log" 2>&1 || { bad "$name: stop/resume failed: $(tail -3 "$TMP/$name-c.log")"; return; }
  if cmp -s "$TMP/$name-a.st" "$TMP/$name-c.st"; then ok "$name: resumed run bitwise equal to the straight one"
  else bad "$name: resumed run differs from the straight one"; fi
}
resume_exact topk --compress topk:0.1:momentum=0.9:warmup=5 --momentum 0
resume_exact powersgd --compress powersgd:2:warmup=0 --bucket-mb 0.001
resume_exact fp16 --compress fp16
# fp16 GEMMs with loss scaling: the scaler and the error feedback at its scale both resume
resume_exact fp16-scaled --compress fp16 --precision fp16
# the residual is kept at fp16's loss scale: the metrics report it divided by the scale, and a
# resume that changes --precision across fp16 converts it (else one step later it is 65536x off)
ef_at_12() {  # PRECISION [RESUME]: ef_norm of step 12 of a top-k run
  "$DT" train "${COMMON[@]}" --compress topk:0.1:warmup=0 --precision "$1" --max-steps 12 ${2:+--resume "$2"} \
    --metrics "$TMP/ef-$1.jsonl" >/dev/null 2>&1 && grep -o '"ef_norm": [0-9.e+-]*' "$TMP/ef-$1.jsonl" | tail -1 | awk '{print $2}'
}
for from in fp16 fp32; do
  "$DT" train "${COMMON[@]}" --compress topk:0.1:warmup=0 --precision $from --max-steps 11 --save "$TMP/ef-$from.st" >/dev/null 2>&1
done
e16=$(ef_at_12 fp16); e32=$(ef_at_12 fp32); e16from32=$(ef_at_12 fp16 "$TMP/ef-fp32.st"); e32from16=$(ef_at_12 fp32 "$TMP/ef-fp16.st")
if awk -v a="${e16:-0}" -v b="${e32:-0}" -v c="${e16from32:-0}" -v d="${e32from16:-0}" 'BEGIN {
     exit !(b > 0 && a / b > 0.8 && a / b < 1.25 && c / b > 0.8 && c / b < 1.25 && d / b > 0.8 && d / b < 1.25) }'; then
  ok "error-feedback norm at step 12: fp16 $e16, fp32 $e32, resumed across precisions $e16from32 and $e32from16"
else bad "error-feedback norm at step 12: fp16 ${e16:-?}, fp32 ${e32:-?}, fp32->fp16 resume ${e16from32:-?}, fp16->fp32 resume ${e32from16:-?}: not in gradient units"; fi
# localsgd averages before a checkpoint (so it is the common model): stop where it averages anyway
STOP=12 resume_exact localsgd --strategy "localsgd(sync_every=3)" --compress topk:0.2:warmup=0

# SIGTERM mid-run: every rank gathers the error-feedback state before the checkpoint, so the
# resumed run still ends bitwise equal to a straight one (wherever the signal landed)
if have_fmnist; then
  F=(--data fashion-mnist --model "linear(32) relu linear(10)" --batch 32 --epochs 2 --seed 3 --workers 2 --quiet --compress topk:0.01:warmup=0
     --max-steps 1876)  # two whole epochs; the signal goes once the first has ended
  "$DT" train "${F[@]}" --save "$TMP/sig-a.st" >/dev/null 2>&1
  "$DT" train "${F[@]}" --save "$TMP/sig-b.st" --metrics "$TMP/sig.jsonl" >"$TMP/sig.log" 2>&1 &
  pid=$!
  for _ in $(seq 1200); do [ -s "$TMP/sig.jsonl" ] && break; sleep 0.05; done
  kill -TERM $pid 2>/dev/null
  wait $pid
  if grep -q "stopped at step" "$TMP/sig.log"; then
    "$DT" train "${F[@]}" --resume "$TMP/sig-b.st" --save "$TMP/sig-c.st" >/dev/null 2>&1
    if cmp -s "$TMP/sig-a.st" "$TMP/sig-c.st"; then ok "SIGTERM at $(grep -o 'stopped at step [0-9]*' "$TMP/sig.log"), resumed: bitwise equal"
    else bad "SIGTERM, resumed: differs from the straight run"; fi
  else echo "note: the run ended before SIGTERM arrived; the interrupted resume was not exercised"; fi
fi

# the state really is in the checkpoint (so a resume without it would differ)
if grep -qa 'compress.topk.state' "$TMP/topk-b.st"; then ok "checkpoint holds compress.topk.state"
else bad "checkpoint lacks compress.topk.state"; fi

# bytes per step against the stated ratio: one bucket of n = 12*32+32+32*4+4 = 548 floats
"$DT" train "${COMMON[@]}" --compress topk:0.1:warmup=0 --max-steps 20 --metrics "$TMP/m.jsonl" >/dev/null 2>&1
got=$(grep -o '"compression_ratio": [0-9.e+]*' "$TMP/m.jsonl" | head -1 | awk '{print $2}')
want=$(awk 'BEGIN { n = 548; k = int(0.1 * n); if (k < 0.1 * n) k++; print 4 * n / (8 * k) }')
if awk -v g="${got:-0}" -v w="$want" 'BEGIN { exit !(g > 0.95 * w && g < 1.05 * w) }'; then
  ok "topk:0.1 compression ratio $got (stated $want)"
else bad "topk:0.1 compression ratio ${got:-missing} (stated $want)"; fi
# the default warm-up (DT_COMPRESS_DEFAULT_WARMUP, PyTorch's start_powerSGD_iter): a run shorter
# than it sends plain gradients, warmup=0 compresses from the first step
for c in powersgd:2 powersgd:2:warmup=0; do
  "$DT" train "${COMMON[@]}" --compress $c --max-steps 20 --metrics "$TMP/w.jsonl" >/dev/null 2>&1
  r=$(grep -o '"compression_ratio": [0-9.e+]*' "$TMP/w.jsonl" | tail -1 | awk '{print $2}')
  if [ $c = powersgd:2 ]; then awk -v r="${r:-0}" 'BEGIN { exit !(r > 0.99 && r < 1.01) }' \
      && ok "powersgd:2 warms up with plain allreduce by default (ratio $r over 20 steps)" || bad "powersgd:2 default warm-up: ratio ${r:-missing}"
  else awk -v r="${r:-0}" 'BEGIN { exit !(r > 1.5) }' && ok "powersgd:2:warmup=0 compresses from the first step (ratio $r)" \
      || bad "powersgd:2:warmup=0: ratio ${r:-missing}"; fi
  rm -f "$TMP/w.jsonl"
done
grep -q '"ef_norm": [0-9]' "$TMP/m.jsonl" && ok "metrics carry the error-feedback norm" || bad "no ef_norm in the metrics"

# a checkpoint without the state starts compression afresh; another number of ranks is refused
"$DT" train "${COMMON[@]}" --max-steps 24 --resume "$TMP/fp16-b.st" --compress topk:0.1 >"$TMP/x.log" 2>&1 &&
  ok "resume of a checkpoint without error-feedback state" || bad "resume without state: $(tail -2 "$TMP/x.log")"
"$DT" train "${COMMON[@]}" --workers 3 --compress topk:0.1:momentum=0.9:warmup=5 --momentum 0 --max-steps 24 \
  --resume "$TMP/topk-b.st" >"$TMP/y.log" 2>&1
rc=$?
if [ $rc -eq 78 ] && grep -q "resume with as many workers" "$TMP/y.log"; then ok "another number of ranks: exit 78, says what to do"
else bad "another number of ranks: exit $rc: $(grep error "$TMP/y.log" | head -1)"; fi

# ddp with the hierarchical allreduce forced (one host: every rank reduces through its leader)
# ends where the flat ring ends, to float rounding
for a in flat hier; do
  "$DT" train "${COMMON[@]}" --workers 4 --allreduce $a --max-steps 20 --save "$TMP/ar-$a.st" >"$TMP/ar-$a.log" 2>&1 ||
    bad "--allreduce $a: $(tail -2 "$TMP/ar-$a.log")"
done
d=$(python3 - "$TMP/ar-flat.st" "$TMP/ar-hier.st" <<'PY'
import json, struct, sys
def load(p):
    b = open(p, "rb").read(); n = struct.unpack("<Q", b[:8])[0]; h = json.loads(b[8:8 + n]); d = b[8 + n:]
    return {k: struct.unpack("<%df" % ((v["data_offsets"][1] - v["data_offsets"][0]) // 4),
                             d[v["data_offsets"][0]:v["data_offsets"][1]]) for k, v in h.items() if k != "__metadata__"}
a, b = load(sys.argv[1]), load(sys.argv[2])
print(max(abs(x - y) for k in a if not k.startswith("optim") for x, y in zip(a[k], b[k])))
PY
)
if awk -v d="${d:-1}" 'BEGIN { exit !(d < 1e-5) }'; then ok "--allreduce hier equals flat (max |diff| $d)"
else bad "--allreduce hier differs from flat by ${d:-?}"; fi
expect_fail "bad --allreduce" "allreduce=ring" "$DT" train "${COMMON[@]}" --allreduce ring
expect_fail "--allreduce with localsgd" "only ddp allreduces" "$DT" train "${COMMON[@]}" --strategy localsgd --allreduce hier
expect_fail "bad compressor" "--compress zip" "$DT" train "${COMMON[@]}" --compress zip
expect_fail "bad ratio" "topk:2" "$DT" train "${COMMON[@]}" --compress topk:2
out=$("$DT" train "${COMMON[@]}" --compress zip 2>&1)
grep -q "^HINT: e.g. --compress topk:0.01" <<<"$out" && ! grep -q "NAME(KEY=VALUE" <<<"$out" \
  && ok "a bad --compress hints at compressors, not the strategy grammar" || bad "bad --compress hint: $out"
expect_fail "a compressor with a parenthesis" "not a compressor" "$DT" train "${COMMON[@]}" --compress "topk:0.1)"
expect_fail "compress with ps" "only ddp and localsgd" "$DT" train "${COMMON[@]}" --strategy ps --compress fp16
finish
