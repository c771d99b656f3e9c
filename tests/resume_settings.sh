# --resume FILE continues the run that wrote FILE: the training settings the command line leaves
# out (--optimizer and its hyper-parameters, --lr and the schedule, --seed, --batch, --grad-accum,
# --clip, --model, and a ddp/localsgd strategy with options such as --compress) are the
# checkpoint's, so a resume with none of them equals the uninterrupted
# run bit for bit; a setting given that differs from the checkpoint's is announced once (rank 0);
# the batch is compared as a step's samples (--batch x --grad-accum).
. "$(dirname "$0")/testlib.bash"

python3 "$DTRAIN_TOOLS/word_corpus.py" "$TMP/corpus.txt" 7 20000
D=(--data "text:$TMP/corpus.txt" --val-fraction 0.05)
M=(--model gpt:L=1,H=2,C=16,T=16)

# ---- adamw at --lr 0.01 --seed 7, saved at step 3, resumed with no training flags ----
SET=(--batch 4 --lr 0.01 --seed 7 --optimizer adamw)
$DT train "${D[@]}" "${M[@]}" "${SET[@]}" --max-steps 6 --save "$TMP/full.st" --quiet >/dev/null 2>&1 || bad "full run"
$DT train "${D[@]}" "${M[@]}" "${SET[@]}" --max-steps 3 --save "$TMP/half.st" --quiet >/dev/null 2>&1 || bad "half run"
out=$($DT train "${D[@]}" --max-steps 6 --resume "$TMP/half.st" --save "$TMP/res.st" 2>&1) || bad "resume: $out"
cmp -s "$TMP/full.st" "$TMP/res.st" \
  && ok "resume without --lr/--seed/--optimizer/--batch/--model equals the uninterrupted run bit for bit" \
  || bad "resume with the checkpoint's settings differs from the uninterrupted run: $out"
grep -q "batch 4, adamw lr 0.01, seed 7" <<<"$out" && ok "the header shows the checkpoint's optimizer, lr and seed" \
  || bad "header: $out"
grep -q "other settings" <<<"$out" && bad "a resume with no flags changed announces a change: $out" \
  || ok "a resume that changes nothing announces nothing"

# the data set is the checkpoint's too (dtrain.data, files as absolute paths): a resume, eval and
# predict without --data, from another directory, use the text file the run trained on
mkdir -p "$TMP/elsewhere"
DTA=$(cd "$(dirname "$DT")" && pwd)/dtrain
out=$(cd "$TMP/elsewhere" && $DTA train --max-steps 6 --resume "$TMP/half.st" --save "$TMP/nodata.st" 2>&1)
cmp -s "$TMP/full.st" "$TMP/nodata.st" && ok "resume without --data (from another directory) trains on the checkpoint's data" \
  || bad "resume without --data: $out"
want=$($DT eval --checkpoint "$TMP/half.st" --data "text:$TMP/corpus.txt" 2>&1); got=$(cd "$TMP/elsewhere" && $DTA eval --checkpoint "$TMP/half.st" 2>&1)
[ -n "$want" ] && [ "$want" = "$got" ] && grep -q "^eval: " <<<"$got" && ok "eval without --data evaluates on the checkpoint's data" \
  || bad "eval without --data: '$got' against '$want'"
(cd "$TMP/elsewhere" && $DTA predict --checkpoint "$TMP/half.st" --limit 2 -o p.jsonl 2>&1) | grep -q "of --data text:$TMP/corpus.txt" \
  && ok "predict without --data names the checkpoint's data" || bad "predict without --data"

# the same through --resume auto (the newest checkpoint in --checkpoint-dir)
$DT train "${D[@]}" "${M[@]}" "${SET[@]}" --max-steps 3 --checkpoint-dir "$TMP/ck" --checkpoint-every 3 --quiet \
  >/dev/null 2>&1 || bad "checkpoint-dir run"
out=$($DT train "${D[@]}" --max-steps 6 --resume "$TMP/ck" --save "$TMP/dir.st" 2>&1)
cmp -s "$TMP/full.st" "$TMP/dir.st" && grep -q "resume $TMP/ck: its newest usable checkpoint" <<<"$out" \
  && ok "--resume DIR takes the directory's newest checkpoint, named, and equals the uninterrupted run" \
  || bad "--resume DIR: $out"
out=$($DT train "${D[@]}" --max-steps 6 --resume auto --checkpoint-dir "$TMP/ck" --save "$TMP/auto.st" --quiet 2>&1)
cmp -s "$TMP/full.st" "$TMP/auto.st" && ok "--resume auto with no training flags equals the uninterrupted run" \
  || bad "--resume auto with the checkpoint's settings differs: $out"

# ---- a different --lr (or --seed) given is announced once, also with 2 workers ----
out=$($DT train "${D[@]}" --max-steps 6 --resume "$TMP/half.st" --lr 0.005 --quiet 2>&1) || bad "resume --lr: $out"
n=$(grep -c "other settings: --lr 0.005 (the checkpoint's run: 0.01)" <<<"$out")
[ "$n" = 1 ] && ok "a resume with another --lr says so once" || bad "--lr change announced $n times: $out"
out=$($DT train "${D[@]}" --max-steps 6 --resume "$TMP/half.st" --seed 9 --workers 2 --quiet 2>&1) \
  || bad "resume --seed on 2 workers: $out"
n=$(grep -c -- "--seed 9 (the checkpoint's run: 7)" <<<"$out")
[ "$n" = 1 ] && ! grep -q "warn" <<<"$out" && ok "2 workers: another --seed is announced once (rank 0), no per-rank warning" \
  || bad "--seed change on 2 workers announced $n times: $out"

# ---- sgd with momentum, a step schedule, clipping and gradient accumulation ----
SET=(--batch 2 --grad-accum 2 --optimizer sgd --momentum 0.9 --nesterov --lr 0.05 --schedule step --step-size 2
     --gamma 0.5 --weight-decay 0.001 --clip 0.5 --seed 3)
$DT train "${D[@]}" "${M[@]}" "${SET[@]}" --max-steps 6 --save "$TMP/full2.st" --quiet >/dev/null 2>&1 || bad "full sgd"
$DT train "${D[@]}" "${M[@]}" "${SET[@]}" --max-steps 3 --save "$TMP/half2.st" --quiet >/dev/null 2>&1 || bad "half sgd"
out=$($DT train "${D[@]}" --max-steps 6 --resume "$TMP/half2.st" --save "$TMP/res2.st" --quiet 2>&1) || bad "resume sgd: $out"
cmp -s "$TMP/full2.st" "$TMP/res2.st" \
  && ok "sgd/nesterov, step schedule, --clip, --grad-accum: the resume without flags equals the uninterrupted run" \
  || bad "sgd resume with the checkpoint's settings differs: $out"
out=$($DT train "${D[@]}" --max-steps 6 --resume "$TMP/half2.st" --gamma 0.9 --momentum 0.5 --quiet 2>&1)
grep -q -- "--gamma 0.9 (the checkpoint's run: 0.5); --momentum 0.5 (the checkpoint's run: 0.9)" <<<"$out" \
  && ok "changed schedule and optimizer hyper-parameters are named" || bad "hyper-parameter change: $out"

# ---- the batch at an epoch's end: a step's samples (--batch x --grad-accum) are compared ----
# the same samples a step with another split is no batch change (only --grad-accum is named);
# a different number is named in both runs' flags, never as "--batch 8 ... used 8"
awk 'BEGIN { srand(7); for (i = 0; i < 96; i++) { y = int(rand() * 4); printf "%d", y;
       for (k = 0; k < 6; k++) printf ",%.4f", rand() + (k % 4 == y ? 1.5 : 0); printf "\n" } }' >"$TMP/b.csv"
B=(--data "$TMP/b.csv" --model "linear(8) relu linear(4)")
$DT train "${B[@]}" --batch 8 --epochs 1 --save "$TMP/b8.st" --quiet >/dev/null 2>&1 || bad "batch-8 run"
note() { $DT train "${B[@]}" --epochs 2 --resume "$TMP/b8.st" "$@" --quiet 2>&1 | grep "other settings"; }
same=$(note --batch 8); split=$(note --batch 4 --grad-accum 2); more=$(note --batch 8 --grad-accum 2)
if [ -z "$same" ] && grep -q -- "other settings: --grad-accum 2 (the checkpoint's run: 1)\. " <<<"$split" \
   && grep -q -- "--batch 8 x --grad-accum 2 = 16 samples a step (the checkpoint's run: 8 x 1 = 8)" <<<"$more" \
   && ! grep -q -- "--batch 8, the checkpoint's run used 8" <<<"$more"; then
  ok "batch notes: none for the same batch; --batch 4 x --grad-accum 2 names only --grad-accum; 16 a step against 8 is named"
else bad "batch notes: same '$same'; 4 x 2 '$split'; 8 x 2 '$more'"; fi

# ---- the strategy of a data-parallel run with options (--compress, localsgd) is the checkpoint's
# too: resumed with no strategy flag it equals the uninterrupted run; another one given is named;
# on one worker it is dropped with a note (as --compress of one worker is)
W1=(--data "$TMP/b.csv" --model "linear(8) relu linear(4)" --batch 8 --epochs 3 --seed 3 --optimizer sgd --lr 0.05 --quiet)
W=("${W1[@]}" --workers 2)
for strat in "--compress powersgd:2:warmup=0" "--strategy localsgd --sync-every 4"; do
  tag=$(tr -dc 'a-z0-9' <<<"$strat")
  $DT train "${W[@]}" $strat --max-steps 24 --save "$TMP/$tag-a.st" >/dev/null 2>&1 || bad "$strat: straight run"
  $DT train "${W[@]}" $strat --max-steps 12 --save "$TMP/$tag-b.st" >/dev/null 2>&1 || bad "$strat: first half"
  out=$($DT train "${W[@]}" --max-steps 24 --resume "$TMP/$tag-b.st" --save "$TMP/$tag-c.st" 2>&1)
  cmp -s "$TMP/$tag-a.st" "$TMP/$tag-c.st" && ! grep -q "other settings" <<<"$out" \
    && ok "$strat: a resume with no strategy flag continues it, bit for bit" \
    || bad "$strat: the resume without the flags differs from the uninterrupted run: $out"
done
out=$($DT train "${W[@]}" --strategy ddp --max-steps 24 --resume "$TMP/strategylocalsgdsyncevery4-b.st" 2>&1)
grep -q -- "other settings: --strategy ddp (the checkpoint's run: localsgd(sync_every=4))" <<<"$out" \
  && ok "another --strategy given is named in the resume's note" || bad "strategy change note: $out"
out=$($DT train "${W1[@]}" --max-steps 24 --resume "$TMP/compresspowersgd2warmup0-b.st" 2>&1)
grep -q "the checkpoint's --strategy ddp(compress=powersgd:2:warmup=0) needs more than one rank" <<<"$out" \
  && ok "a one-worker resume of a compressed run says it drops the compression" || bad "one-worker resume: $out"
out=$($DT train "${B[@]}" --compress topk:0.1 --max-steps 2 2>&1)
grep -q "note: --compress topk:0.1 with one worker sends nothing to compress" <<<"$out" \
  && ok "--compress on one worker is noted, not silently ignored" || bad "--compress on one worker: $out"

# layouts stay the flags': a ZeRO checkpoint resumed without --zero is named, not taken
$DT train "${W[@]}" --zero 1 --max-steps 12 --save "$TMP/z1.st" >/dev/null 2>&1 || bad "--zero 1 run"
out=$($DT train "${W[@]}" --max-steps 24 --resume "$TMP/z1.st" 2>&1)
grep -qF -- "--strategy ddp (the checkpoint's run: ddp(zero=1))" <<<"$out" && ok "a ZeRO checkpoint resumed without --zero: the change is named" \
  || bad "ZeRO resume note: $out"
# the data path is stored absolute with its links kept (train.csv -> a store blob keeps test.csv
# beside it); a stored path that is not there is noted, with what to do
mkdir -p "$TMP/store" "$TMP/ds"
cp "$TMP/b.csv" "$TMP/store/blob1"
ln -s ../store/blob1 "$TMP/ds/train.csv"
(cd "$TMP/ds" && $DTA train --data train.csv --model "linear(8) relu linear(4)" --epochs 1 --save "$TMP/lk.st" --quiet >/dev/null 2>&1)
out=$(cd "$TMP/elsewhere" && $DTA eval --checkpoint "$TMP/lk.st" 2>&1)
grep -q "^eval: [0-9]* samples" <<<"$out" && ok "eval from elsewhere of a run on a symlinked csv finds it by its link" || bad "symlinked data: $out"
python3 "$DTRAIN_TOOLS/ckpt_meta.py" "$TMP/lk.st" "$TMP/moved.st" dtrain.data=/nonexistent/train.csv
out=$($DT eval --checkpoint "$TMP/moved.st" 2>&1)
grep -q "trained on --data /nonexistent/train.csv, which is not on this machine; pass --data" <<<"$out" \
  && ok "a stored data path that is not here is noted, saying to pass --data" || bad "moved data: $out"
# a resume streaming its metrics to /dev/stdout that goes into a file appends, as a fresh run does
$DT train "${B[@]}" --epochs 2 --resume "$TMP/b8.st" --metrics /dev/stdout --quiet >"$TMP/m.out" 2>"$TMP/m.err" \
  && grep -q '^{"epoch": 2, ' "$TMP/m.out" && grep -q "^dtrain: resumed from" "$TMP/m.out" \
  && ok "a resume with --metrics /dev/stdout into a file: the records go into that stream, intact" \
  || bad "resume to /dev/stdout: $(cat "$TMP/m.out" "$TMP/m.err")"

# ---- another optimizer given explicitly is still refused (its state cannot carry over) ----
expect_fail "resume with another --optimizer is refused" "trained with --optimizer adamw" \
  $DT train "${D[@]}" --max-steps 6 --resume "$TMP/half.st" --optimizer sgd
finish
