# Hostile input and failing disks with the real command (issue 11): a full disk under --metrics
# fails loudly; a resumed run does not write an epoch's metrics twice; eval refuses labels the
# model has no output for; checkpoints whose metadata is CRC-valid but impossible (negative step,
# batch 0, world size 0, non-numeric optimizer steps, a spec that once hung the parser) are
# refused naming the field. Small CSV data: no data set needed, a few seconds in all.
. "$(dirname "$0")/testlib.bash"
META="python3 $(dirname "$0")/tools/ckpt_meta.py"
# 64 samples of 4 features, 3 classes; bad.csv has the same features and a label 5
awk 'BEGIN { for (i = 0; i < 64; i++) printf "%d,%.3f,%.3f,%.3f,%.3f\n", i % 3, i % 3, (i * 7) % 5 / 5, i % 2, (i % 3) / 2 }' >"$TMP/d.csv"
{ cat "$TMP/d.csv"; echo "5,1,1,1,1"; } >"$TMP/bad.csv"
TR=(train --data "$TMP/d.csv" --model "linear(8) relu linear(3)" --batch 8 --quiet)

# ---- a full disk: the metrics record cannot be written ----
if [ -w /dev/full ]; then
  expect_fail "--metrics /dev/full fails and says why" "--metrics /dev/full: writing the record of an epoch failed: No space left on device" \
    $DT "${TR[@]}" --epochs 1 --metrics /dev/full
else echo "skip: no /dev/full"; fi

# ---- a full file system (a private 8 KiB tmpfs): --save, --checkpoint-dir and --timeline fail loudly ----
if [ "$(id -u)" -eq 0 ] && unshare -m true 2>/dev/null; then
  mkdir -p "$TMP/full"
  BIG=(train --data "$TMP/d.csv" --model "linear(256) relu linear(3)" --batch 8 --epochs 2 --quiet)
  out=$(unshare -m bash -c "mount -t tmpfs -o size=8k tmpfs '$TMP/full' || exit 99
    $(printf '%q ' "$DT" "${BIG[@]}") --save '$TMP/full/a.st'; echo \"rc=\$?\"
    $(printf '%q ' "$DT" "${BIG[@]}") --checkpoint-dir '$TMP/full/ck' --checkpoint-every 4; echo \"rc=\$?\"
    $(printf '%q ' "$DT" train --data "$TMP/d.csv" --model "linear(3)" --batch 1 --epochs 20 --quiet) --timeline '$TMP/full/t.json'; echo \"rc=\$?\"
    ls '$TMP/full' '$TMP/full/ck'" 2>&1)
  [ "$(grep -c '^rc=1$' <<<"$out")" -eq 3 ] && [ "$(grep -c 'No space left on device' <<<"$out")" -eq 3 ] \
    && grep -q "a.st.tmp.[0-9]*: write failed" <<<"$out" && grep -q "ckpt-0000000004.safetensors.tmp.[0-9]*: write failed" <<<"$out" \
    && grep -q -- "--timeline $TMP/full/t.json: writing" <<<"$out" && ! grep -q "\.tmp\." <<<"$(tail -3 <<<"$out")" \
    && ok "disk full: --save, a numbered checkpoint and --timeline exit 1 naming the file, no temp file left" \
    || bad "disk full: $out"
else echo "skip: a full-disk check needs root and unshare -m"; fi

# ---- resume from a checkpoint before the last epoch's end: each epoch's record once ----
$DT "${TR[@]}" --epochs 2 --checkpoint-dir "$TMP/ck" --checkpoint-every 6 --metrics "$TMP/m.jsonl" >/dev/null 2>&1 \
  || bad "training with checkpoints failed"
$DT "${TR[@]}" --epochs 2 --resume "$TMP/ck/ckpt-0000000006.safetensors" --metrics "$TMP/m.jsonl" >"$TMP/res.log" 2>&1 \
  || bad "resume failed: $(cat "$TMP/res.log")"
epochs=$(python3 -c "import json; print(' '.join(str(json.loads(l)['epoch']) for l in open('$TMP/m.jsonl')))")
[ "$epochs" = "1 2" ] && grep -q "dropped 2 records after step 6" "$TMP/res.log" \
  && ok "resumed at step 6: metrics hold epochs 1 2 once each" || bad "metrics epochs after resume: '$epochs': $(cat "$TMP/res.log")"

# ---- --keep K keeps exactly the newest K checkpoints ----
$DT "${TR[@]}" --epochs 2 --checkpoint-dir "$TMP/keep" --checkpoint-every 2 --keep 3 >/dev/null 2>&1 || bad "--keep run failed"
kept=$(cd "$TMP/keep" && ls ckpt-*.safetensors 2>/dev/null | tr '\n' ' ')
[ "$kept" = "ckpt-0000000012.safetensors ckpt-0000000014.safetensors ckpt-0000000016.safetensors " ] \
  && ok "--keep 3 keeps the newest 3 of 8 checkpoints" || bad "--keep 3 kept: $kept"

# ---- a rank killed while writing a checkpoint leaves DIR/ckpt-*.safetensors.tmp.<pid>: the
# launcher removes such files of dead writers when its ranks end (here the ranks fail in set-up,
# before any of them writes, so only the launcher can) ----
mkdir -p "$TMP/stale"; sleep 0 & deadpid=$!; wait $deadpid
touch "$TMP/stale/ckpt-0000000010.safetensors.tmp.$deadpid"
$DT train --workers 2 --data "$TMP/missing.csv" --model mlp --checkpoint-dir "$TMP/stale" --quiet >/dev/null 2>&1
[ -z "$(ls "$TMP/stale")" ] && ok "a dead writer's checkpoint temp file is removed by the launcher" \
  || bad "left in the checkpoint directory: $(ls "$TMP/stale")"

# ---- what is printed is true: a cut-short epoch, a loss over part of an epoch, a changed resume ----
out=$($DT train --data "$TMP/d.csv" --model "linear(3)" --batch 8 --max-steps 5 --save "$TMP/p5.st" 2>&1)
grep -q "epoch 1/1 (5 of 8 steps): train_loss" <<<"$out" && ok "--max-steps in mid-epoch: the line says 5 of 8 steps" \
  || bad "partial epoch line: $out"
out=$($DT train --data "$TMP/d.csv" --model "linear(3)" --batch 8 --resume "$TMP/p5.st" --lr 0.01 2>&1)
grep -qF "with other settings: --lr 0.01 (the checkpoint's run: 0.001)" <<<"$out" \
  && grep -q "train_loss [0-9.]* (over its last 3 steps, since the resume)" <<<"$out" \
  && ok "resume with another --lr says so; the epoch loss says it covers 3 steps" || bad "resume notes: $out"
expect_fail "softmax in a spec: the loss applies it" "already applies softmax" $DT "${TR[@]}" --model "linear(3) softmax"

# ---- eval: labels beyond the model's outputs ----
$DT "${TR[@]}" --epochs 1 --save "$TMP/a.st" >/dev/null 2>&1 || bad "training for eval failed"
expect_fail "eval refuses a label the model has no output for" "label 5 of sample 64 is outside [0, 3)" \
  $DT eval --checkpoint "$TMP/a.st" --data "$TMP/bad.csv"

# ---- batch limits: larger than the training set, absurdly large (aborted the ASan build) ----
expect_fail "a batch larger than the training set is refused" "--batch 65 is more than the training set (64 samples" \
  $DT "${TR[@]}" --batch 65
expect_fail "--batch 1000000000 is an error, not an abort" "use --batch 64 or less" $DT "${TR[@]}" --batch 1000000000
expect_fail "2 workers x batch 40 > 64 samples" "--batch 40 x 2 workers = 80 samples per step" \
  $DT "${TR[@]}" --workers 2 --batch 40

# ---- impossible metadata (CRC-valid): refused, naming the field ----
for kv in dtrain.step=-5 dtrain.epoch=-1 dtrain.batch=0 dtrain.world_size=0 dtrain.optim_steps=abc \
          dtrain.step_in_epoch=x dtrain.input_shape=0,1,4 dtrain.lr=nan; do
  $META "$TMP/a.st" "$TMP/m.st" "$kv"
  expect_fail "checkpoint with $kv refused" "${kv%%=*}" timeout 20 $DT "${TR[@]}" --epochs 2 --resume "$TMP/m.st"
done
$META "$TMP/a.st" "$TMP/ok.st"
$DT eval --checkpoint "$TMP/ok.st" --data "$TMP/d.csv" >/dev/null 2>&1 && ok "an unchanged rewrite still loads (the CRC helper is right)" \
  || bad "rewritten checkpoint does not load: $($DT eval --checkpoint "$TMP/ok.st" --data "$TMP/d.csv" 2>&1)"
# a model spec that made the parser spin forever (and ignore SIGTERM)
$META "$TMP/a.st" "$TMP/spin.st" 'dtrain.model_spec=conv(=0)'
expect_fail "eval of a checkpoint whose spec is 'conv(=0)' ends with an error" "spin.st: its dtrain.model_spec" \
  timeout 20 $DT eval --checkpoint "$TMP/spin.st" --data "$TMP/d.csv"
expect_fail "resume of it ends with an error" "no name before it" timeout 20 $DT train --data "$TMP/d.csv" --resume "$TMP/spin.st"

# ---- --workers N on a terminal shows rank 0's progress bar (it relays through the launcher) ----
if command -v script >/dev/null; then
  cmd=$(printf '%q ' "$DT" train --data "$TMP/d.csv" --model "linear(3)" --workers 2 --epochs 1 --batch 4)
  bar=$(timeout 60 script -qec "$cmd" /dev/null 2>&1 | tr '\r' '\n')
  grep -aq "epoch 1/1 \[#" <<<"$bar" && ok "--workers 2 on a terminal: progress bar shown" || bad "no progress bar: $bar"
else echo "skip: no 'script' to emulate a terminal"; fi

# ---- one exit-status convention across the subcommands (dtrain --help) ----
f0=$fails
code() {  # WANT CMD...: CMD exits WANT
  local want=$1; shift
  "$@" >/dev/null 2>&1; local rc=$?
  [ $rc -eq "$want" ] || bad "exit $rc, want $want: $*"
}
code 2 $DT train --bogus; code 2 $DT eval --bogus; code 2 $DT trian; code 2 $DT cache foo; code 2 $DT launch -n 0
code 2 $DT "${TR[@]}" --batch 0; code 2 $DT eval --checkpoint "$TMP/a.st" --batch 0; code 2 $DT "${TR[@]}" --model "linear(3"
code 78 $DT train --data "$TMP/none.csv"; code 78 $DT eval --checkpoint "$TMP/none.st"; code 78 $DT eval --checkpoint "$TMP/spin.st"
code 2 $DT "${TR[@]}" --workers 2 --batch 0
out=$($DT "${TR[@]}" --workers 2 --batch 0 --elastic 1:2 --checkpoint-dir "$TMP/elu" \
  --checkpoint-every 5 2>&1); rc=$?
[ $rc -eq 2 ] && grep -q "not restarting" <<<"$out" || bad "elastic restarts a usage error (exit $rc): $out"
grep -q "Exit status: 0 done; 1 failed at run time" <<<"$($DT --help)" && grep -q "78 a data set" <<<"$($DT eval --help)" \
  || bad "--help does not document the exit statuses"
[ $fails -eq $f0 ] && ok "exit statuses: 2 for command-line mistakes, 78 for unusable data/checkpoints, in every subcommand"

# ---- dtrain cache ls|clear (in a cache directory of our own) ----
if have_fmnist; then
  export DTRAIN_DATA_CACHE="$TMP/cache"
  touch "$TMP/cache.stale"; mkdir -p "$TMP/cache"; : >"$TMP/cache/dtrain-data-00000000000000aa.lock"
  $DT train --data fashion-mnist --max-steps 2 --quiet >/dev/null 2>&1 || bad "training to fill the cache failed"
  ls_out=$($DT cache ls)
  grep -q "2 files in $TMP/cache" <<<"$ls_out" && grep -q "train-images-idx3-ubyte" <<<"$ls_out" \
    && ok "cache ls: 2 entries, the stale lock of an older run removed" || bad "cache ls: $ls_out"
  grep -q "removed 2 files" <<<"$($DT cache clear)" && [ -z "$(ls "$TMP/cache")" ] && ok "cache clear empties it" \
    || bad "cache clear left: $(ls "$TMP/cache")"
  unset DTRAIN_DATA_CACHE
fi

# ---- outputs through symbolic links and onto devices: a link keeps pointing at the file it names
# (the rename replaces that file, not the link); a device, FIFO or descriptor (/dev/null,
# /dev/stdout, /dev/fd/1) is refused up front, exit 2, naming the flag, and stays what it was;
# --metrics, which is appended to, still streams to /dev/stdout
mkdir -p "$TMP/real"
$DT "${TR[@]}" --epochs 1 --save "$TMP/real/m.st" >/dev/null 2>&1
$DT "${TR[@]}" --epochs 2 --save "$TMP/direct.st" >/dev/null 2>&1
ln -s real/m.st "$TMP/m-link.st"
$DT "${TR[@]}" --epochs 2 --save "$TMP/m-link.st" >/dev/null 2>&1 && [ -L "$TMP/m-link.st" ] && cmp -s "$TMP/real/m.st" "$TMP/direct.st" \
  && ok "--save through a symbolic link writes the file it names and keeps the link" \
  || bad "--save through a link: $(ls -l "$TMP/m-link.st" "$TMP/real/")"
ln -s real/p.csv "$TMP/p-link.csv"
$DT predict --checkpoint "$TMP/real/m.st" --data "$TMP/d.csv" -o "$TMP/p-link.csv" >/dev/null 2>&1 && [ -L "$TMP/p-link.csv" ] \
  && [ -s "$TMP/real/p.csv" ] && ok "predict -o through a link writes the file it names" || bad "predict -o link: $(ls -l "$TMP")"
refused() {  # NAME CMD...: exit 2 naming NAME, and the devices are still devices
  local name=$1 out rc; shift
  out=$("$@" 2>&1 >/dev/null); rc=$?
  [ $rc -eq 2 ] && grep -qF -- "$name: not a regular file" <<<"$out" && [ -c /dev/null ] && [ -c /dev/full ] && [ -L /dev/stdout ] \
    && ok "$name is refused (exit 2) and left as it is" || bad "$name: exit $rc: $out"
}
refused "--save /dev/null" $DT "${TR[@]}" --epochs 1 --save /dev/null
refused "--timeline /dev/stdout" $DT "${TR[@]}" --epochs 1 --timeline /dev/stdout
refused "-o /dev/fd/1" $DT predict --checkpoint "$TMP/real/m.st" --data "$TMP/d.csv" -o /dev/fd/1
refused "-o /dev/full" $DT export --checkpoint "$TMP/real/m.st" -o /dev/full
$DT "${TR[@]}" --epochs 1 --metrics /dev/stdout 2>/dev/null | grep -q '"epoch": 1' \
  && ok "--metrics /dev/stdout streams the records" || bad "--metrics /dev/stdout"
finish
