#!/usr/bin/env bash
# Issue 37 (run/, flags, data, launch): a run's own checkpoint at the legal extremes of its
# settings (a cosine schedule ends at rate 0) is read back by eval, predict, export and --resume;
# a ZeRO rank's shard temp file left by a killed rank is pruned; unbounded inputs (--workers
# 100000, --data text:/dev/zero) are refused; flag values that are not what the flag wants (nan,
# a negative seed, an integer too large) are refused naming the flag; one exit status per class
# of failure (a table, docs/exit-codes.md). Small CSV data: a few seconds in all.
. "$(dirname "$0")/testlib.bash"
awk 'BEGIN{srand(11);for(i=0;i<400;i++){y=i%4;printf "%d",y;for(k=0;k<16;k++)printf ",%.3f",rand()+(k%4==y);printf "\n"}}' >"$TMP/train.csv"
M='linear(32) relu linear(4)'
TR=(train --data "$TMP/train.csv" --model "$M" --quiet)

# ---- a cosine run's final checkpoint (scheduled rate 0 at --min-lr 0) is usable ----
$DT "${TR[@]}" --epochs 2 --schedule cosine --save "$TMP/c.st" --checkpoint-dir "$TMP/ck" --checkpoint-every 1000 \
  >"$TMP/c.log" 2>&1 || bad "cosine train: $(cat "$TMP/c.log")"
python3 - "$TMP/c.st" <<'PY' && ok "the cosine run's checkpoint stores the scheduled rate 0" || bad "dtrain.lr of the cosine run is not 0"
import json, struct, sys
b = open(sys.argv[1], 'rb').read(); n = struct.unpack('<Q', b[:8])[0]
sys.exit(0 if float(json.loads(b[8:8 + n])['__metadata__']['dtrain.lr']) == 0 else 1)
PY
for cmd in "eval --checkpoint $TMP/c.st --data $TMP/train.csv" \
           "predict --checkpoint $TMP/c.st --data $TMP/train.csv --split train -o $TMP/p.csv" \
           "export --checkpoint $TMP/c.st -o $TMP/m.onnx" \
           "train --data $TMP/train.csv --quiet --epochs 3 --resume $TMP/c.st" \
           "train --data $TMP/train.csv --quiet --epochs 3 --resume auto --checkpoint-dir $TMP/ck"; do
  out=$($DT $cmd 2>&1) && ok "lr 0 checkpoint: dtrain ${cmd//$TMP\//}" || bad "lr 0 checkpoint: dtrain $cmd: $out"
done
# a step schedule with --gamma 0 also reaches rate 0; settings a checkpoint cannot hold are refused up front
$DT "${TR[@]}" --epochs 1 --schedule step --step-size 10 --gamma 0 --save "$TMP/g.st" >/dev/null 2>&1 \
  && $DT eval --checkpoint "$TMP/g.st" --data "$TMP/train.csv" >/dev/null 2>&1 && ok "--gamma 0: its checkpoint evaluates" \
  || bad "--gamma 0 checkpoint"
expect_fail "--min-lr -1 refused" "--min-lr -1: need a final learning rate >= 0" $DT "${TR[@]}" --epochs 1 --min-lr -1
expect_fail "--gamma 2 refused" "--gamma 2: need a decay factor in [0, 1]" $DT "${TR[@]}" --epochs 1 --gamma 2
expect_fail "--step-size -3 refused" "--step-size -3: must not be negative" $DT "${TR[@]}" --epochs 1 --step-size -3

# ---- a ZeRO rank killed writing its shard leaves ckpt-N.safetensors.rR-of-2.tmp.PID: the run's prune removes it ----
sh -c 'exit 0' & dead=$!; wait $dead
mkdir -p "$TMP/zk"; : >"$TMP/zk/ckpt-0000000006.safetensors.r1-of-2.tmp.$dead"
$DT "${TR[@]}" --epochs 1 --checkpoint-dir "$TMP/zk" --checkpoint-every 5 --keep 3 >/dev/null 2>&1 || bad "train with --keep 3"
[ ! -e "$TMP/zk/ckpt-0000000006.safetensors.r1-of-2.tmp.$dead" ] && ok "a dead rank's shard temp file is pruned" \
  || bad "a dead rank's shard temp file survived: $(ls "$TMP/zk")"

# ---- unbounded inputs: refused at once, before anything is prepared ----
expect_code() {  # NAME CODE NEEDLE CMD...: CMD must exit CODE and print NEEDLE
  local name=$1 code=$2 needle=$3; shift 3
  local out rc
  out=$("$@" 2>&1); rc=$?
  [ $rc -eq "$code" ] && grep -qF -- "$needle" <<<"$out" && ok "$name" || bad "$name (exit $rc, wanted $code and '$needle'): $out"
}
expect_code "--workers 100000 refused" 2 "--workers 100000: at most 256 local ranks on one host" \
  timeout 20 $DT "${TR[@]}" --epochs 1 --workers 100000
expect_code "--elastic 1:300 refused" 2 "--elastic 1:300: at most 256 local ranks" \
  $DT "${TR[@]}" --epochs 1 --workers 2 --elastic 1:300 --checkpoint-dir "$TMP/el" --checkpoint-every 5
expect_code "dtrain launch -n 100000 refused" 2 "-n 100000: at most 256 local ranks" timeout 20 $DT launch -n 100000 true
expect_code "--data text:/dev/zero refused" 78 "/dev/zero is a character device, not a file" \
  timeout 20 $DT train --data text:/dev/zero --model gpt:L=1,H=1,C=16,T=16 --epochs 1
# more ranks than cores: a note, and the job runs
W=$(( $(getconf _NPROCESSORS_ONLN) + 1 ))
if [ "$W" -le 9 ]; then
  out=$($DT "${TR[@]}" --epochs 1 --workers $W 2>&1); rc=$?
  [ $rc -eq 0 ] && grep -qF "note: $W ranks on $((W - 1)) cores: the ranks take turns" <<<"$out" \
    && ok "--workers $W on $((W - 1)) cores runs, with a note" || bad "--workers $W (exit $rc): $out"
else echo "skip: --workers beyond the cores: $((W - 1)) cores would make it a long run"; fi

# ---- flag values that are not what the flag wants: exit 2, naming the flag and what it wants ----
flag_refused() {  # NAME NEEDLE FLAGS...: dtrain train FLAGS must exit 2 and print NEEDLE
  local name=$1 needle=$2; shift 2
  local out rc
  out=$($DT "${TR[@]}" --epochs 1 "$@" 2>&1); rc=$?
  [ $rc -eq 2 ] && grep -qF -- "$needle" <<<"$out" && ok "$name" || bad "$name (exit $rc, wanted 2 and '$needle'): $out"
}
flag_refused "--timeout nan" "flag --timeout needs a finite number, got 'nan'" --timeout nan
flag_refused "--lr inf" "flag --lr needs a finite number, got 'inf'" --lr inf
flag_refused "--seed -1" "--seed -1: need an integer >= 0" --seed -1
flag_refused "--epochs too large" "flag --epochs: '99999999999999999999999' is too large (at most 2147483647)" \
  --epochs 99999999999999999999999
flag_refused "--max-steps too large" "flag --max-steps: '99999999999999999999999' is too large" --max-steps 99999999999999999999999
flag_refused "--lr abc names the flag, its meaning and default" "HINT: --lr X: learning rate (default 0.001)" --lr abc

# ---- one exit status per class of failure (dtrain --help, docs/exit-codes.md): a table ----
{ cat "$TMP/train.csv"; echo "7,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1"; } >"$TMP/lab.csv"
head -c 2000 /dev/urandom | tr -d ',\n' >"$TMP/bin.csv"
: >"$TMP/empty.txt"; printf 'abc' >"$TMP/short.txt"; mkdir -p "$TMP/dir.csv" "$TMP/adir"; touch "$TMP/afile"
python3 - "$TMP/idx" <<'PY'
import os, struct, sys
d = sys.argv[1]; os.makedirs(d, exist_ok=True)
for part, n in (("train", 64), ("t10k", 16)):
    with open(f"{d}/{part}-images-idx3-ubyte", "wb") as f:
        f.write(struct.pack(">IIII", 0x803, n, 4, 4) + bytes((i * 7) % 256 for i in range(n * 16)))
    with open(f"{d}/{part}-labels-idx1-ubyte", "wb") as f:
        f.write(struct.pack(">II", 0x801, n) + bytes(i % 10 for i in range(n)))
PY
cp "$TMP/c.st" "$TMP/grown.st"; head -c 100 /dev/zero >>"$TMP/grown.st"
ln -s /dev/zero "$TMP/zero.csv"
GPT=(--model gpt:L=1,H=1,C=16,T=16 --epochs 1 --quiet)
while IFS='|' read -r code needle args; do
  [ -z "$code" ] && continue
  eval "cmd=($args)"
  out=$(timeout 60 $DT "${cmd[@]}" 2>&1); rc=$?
  [ $rc -eq "$code" ] && grep -qF -- "$needle" <<<"$out" && ok "exit $code: ${args//$TMP\//}" \
    || bad "exit $code wanted, got $rc, for dtrain $args (want '$needle'): $out"
done <<EOT
0|done:|train --data $TMP/train.csv --model "$M" --epochs 1
2|flag --timeout needs a finite number|train --data $TMP/train.csv --timeout nan
2|unknown flag '--epoch'|train --data $TMP/train.csv --epoch 1
2|at most 256 local ranks|train --data $TMP/train.csv --workers 100000
73|--save $TMP/no/c.st: cannot write into $TMP/no|train --data $TMP/train.csv --save $TMP/no/c.st
73|--metrics $TMP/adir: is a directory|train --data $TMP/train.csv --metrics $TMP/adir
73|--timeline $TMP/no/t.json: cannot write into|train --data $TMP/train.csv --timeline $TMP/no/t.json
73|--tensorboard $TMP/afile|train --data $TMP/train.csv --model "$M" --tensorboard $TMP/afile
73|-o $TMP/no/p.csv: cannot write into|predict --checkpoint $TMP/c.st --data $TMP/train.csv -o $TMP/no/p.csv
73|-o $TMP/no/c.st: cannot write into|ckpt consolidate $TMP/c.st -o $TMP/no/c.st
78|labels up to 7|train --data $TMP/lab.csv --model "$M" --epochs 1
78|label 7 of sample 400 is outside [0, 4)|eval --checkpoint $TMP/c.st --data $TMP/lab.csv
78|bin.csv:|train --data $TMP/bin.csv --model "$M" --epochs 1
78|zero.csv is a character device, not a file|train --data $TMP/zero.csv --model "$M" --epochs 1
78|is a directory|train --data $TMP/dir.csv --model "$M" --epochs 1
78|not a directory or .csv file|train --data $TMP/afile --model "$M" --epochs 1
78|no such data set: pass fashion-mnist, mnist, an IDX directory, a .csv file, or text:FILE or kjv|train --data $TMP/none --epochs 1
78|empty.txt is empty|train --data text:$TMP/empty.txt ${GPT[*]}
78|short.txt has 3 bytes|train --data text:$TMP/short.txt ${GPT[*]}
78|adir is a directory|train --data text:$TMP/adir ${GPT[*]}
78|idx/train-labels-idx1-ubyte: label 4 of sample 4 is outside [0, 4)|train --data $TMP/idx --model "flatten linear(4)" --epochs 1
78|something was appended|eval --checkpoint $TMP/grown.st --data $TMP/train.csv
124|timeout after 1 s|launch --timeout 1 -n 1 -- sleep 30
EOT

finish
