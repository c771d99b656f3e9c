# Integration tests of the real dtrain command on the real data set: training reaches a sane
# accuracy, metrics are JSON Lines, runs are deterministic, resume is bitwise exact, eval agrees,
# and bad input (flags, specs, data, checkpoints) gets clear errors.
. "$(dirname "$0")/testlib.bash"

# ---- errors that need no data ----
expect_fail "unknown flag" "unknown flag '--epoch'" $DT train --epoch 2
expect_fail "a near miss names the flag" "did you mean --epochs?" $DT train --epoch 2
expect_fail "a swap of two letters names the flag" "did you mean --batch?" $DT train --bacth 2
out=$($DT train --frobnicate 2 2>&1)
grep -q "did you mean" <<<"$out" && bad "--frobnicate got a suggestion: $out" || ok "no suggestion for a far miss"
expect_fail "bad flag value" "flag --batch needs an integer, got 'x'" $DT train --batch x
expect_fail "bad spec quotes token+position" "bad token 'maxpol(2)' at position 23" \
  $DT train --model "conv(32,3,pad=1) relu maxpol(2) flatten linear(10)" --data "$TMP/none"
expect_fail "unknown optimizer" "unknown optimizer 'adamx'" $DT train --optimizer adamx
expect_fail "missing data dir" "$TMP/nodata" $DT train --data "$TMP/nodata"
# the outputs are probed before training (an epoch is not spent to find out), once for the job
expect_fail "--save into a directory that takes no file" "--save /proc/x.st: cannot write into /proc" \
  $DT train --save /proc/x.st --max-steps 1
expect_fail "--save of a directory" "--save $TMP: is a directory" $DT train --save "$TMP" --max-steps 1
expect_fail "--save-weights without its directory" "--save-weights $TMP/no/w.st: cannot write into $TMP/no" \
  $DT train --save-weights "$TMP/no/w.st" --max-steps 1
# dtrain --help's bench line names every benchmark that dtrain bench --help lists
line=$($DT --help | grep '^  bench ')
missing=$($DT bench --help | sed -n 's/^  \([a-z]*\) .*/\1/p' | while read -r b; do grep -qw "$b" <<<"$line" || echo "$b"; done)
[ -z "$missing" ] && ok "dtrain --help names every benchmark" || bad "dtrain --help's bench line lacks: $missing ($line)"
expect_fail "bench train: a negative --seconds" "--seconds -1: give 0 to 3600" $DT bench train --seconds -1
expect_fail "bench train: --threads 0" "--threads 0: need at least 1" $DT bench train --threads 0
# predict and export probe their -o the same way, before any model is read: exit 73, not a late 1
for c in predict export; do
  out=$($DT $c --checkpoint "$TMP/none.st" -o "$TMP/no/out" 2>&1); rc=$?
  [ $rc -eq 73 ] && grep -q -- "-o $TMP/no/out: cannot write into $TMP/no" <<<"$out" \
    && ok "$c -o without its directory: exit 73 naming it" || bad "$c -o $TMP/no/out (exit $rc): $out"
done
out=$($DT train --workers 2 --checkpoint-dir /proc/ck --max-steps 1 2>&1); rc=$?
if [ $rc -eq 73 ] && [ "$(grep -c 'checkpoint-dir /proc/ck: cannot write' <<<"$out")" = 1 ] && ! grep -q '^\[' <<<"$out"
then ok "--checkpoint-dir that cannot be made: exit 73 before any rank starts"
else bad "--checkpoint-dir /proc/ck (exit $rc): $out"; fi
expect_fail "eval needs checkpoint" "no --checkpoint given" $DT eval
expect_fail "unknown command" "unknown command 'trian'" $DT trian
expect_fail "a mistyped command gets a suggestion" "did you mean 'dtrain train'?" $DT trian
expect_fail "a mistyped benchmark gets a suggestion" "did you mean 'dtrain bench train'?" $DT bench trian
out=$($DT frobnicate 2>&1)
grep -q "did you mean" <<<"$out" && bad "dtrain frobnicate got a suggestion: $out" || ok "no command suggested for a far miss"
expect_fail "a flag with one dash names the flag" "did you mean --epochs? (flags take two dashes" $DT train -epochs 2
printf '0,1,2\n1,3,4\n99,5,6\n2,1,1\n' >"$TMP/bad_train.csv"
expect_fail "a label beyond the model names its sample" "label 99 of sample 2 is outside [0, 3)" \
  $DT train --data "$TMP/bad_train.csv" --model "linear(3)"
expect_fail "a model without parameters is refused" "no trainable parameters" $DT train --data "$TMP/bad_train.csv" --model relu
expect_fail "flag values are checked" "--momentum 5: need a value in [0, 1)" $DT train --momentum 5
help=$($DT train --help)
for f in data model epochs batch optimizer lr seed threads save resume metrics quiet; do
  grep -q -- "--$f" <<<"$help" || bad "train --help lacks --$f"
done
ok "train --help documents the flags"
# train --help: the description first (before any flag), then the flags in their groups, each once
first_flag=$(grep -n -m1 '^  --' <<<"$help" | cut -d: -f1)
desc=$(grep -n -m1 '^Trains a model' <<<"$help" | cut -d: -f1)
[ -n "$desc" ] && [ "$desc" -lt 5 ] && [ "$desc" -lt "$first_flag" ] && [ "$first_flag" -lt 15 ] \
  && ok "train --help: the description comes first, the flags by line $first_flag" \
  || bad "train --help: description at line ${desc:-none}, first flag at $first_flag"
groups=$(grep -E '^[A-Z][A-Za-z ]+:$' <<<"$help" | tr '\n' '|')
[ "$groups" = "Data:|Model:|Optimisation:|Parallelism:|Outputs:|Checkpoints and faults:|Advanced:|" ] \
  && ok "train --help groups its flags" || bad "train --help groups: $groups"
dups=$(grep -o '^  --[a-z0-9-]*' <<<"$help" | sort | uniq -d)
nflags=$(grep -c '^  --[a-z]' <<<"$help")
[ -z "$dups" ] && [ "$nflags" -ge 60 ] && ok "train --help lists each of its $nflags flags once" \
  || bad "train --help lists twice: $dups ($nflags flags)"
# on a terminal the flag lines wrap at its width, under the help column, and say the same
if command -v script >/dev/null; then
  tty_help=$(COLUMNS=80 script -qc "$DT train --help" /dev/null | tr -d '\r')
  wide=$(grep -E '^  --|^ {27}[^ ]' <<<"$tty_help" | awk 'length > 80')
  joined() {  # continuation lines (27 spaces) joined to their flag's line
    awk -v ind="^$(printf '%27s' '')[^ ]" '$0 ~ ind { sub(/^ +/, ""); line = line " " $0; next }
      { if (line != "") print line; line = $0 } END { print line }' | grep '^  --' | tr -s ' '; }
  if [ -z "$wide" ] && [ "$(joined <<<"$tty_help")" = "$(tr -s ' ' <<<"$help" | grep '^ --')" ] \
    && [ "$(wc -l <<<"$tty_help")" -gt "$(wc -l <<<"$help")" ]
  then ok "train --help on an 80-column terminal: the flag lines wrap under their column"
  else bad "train --help on a terminal: lines over 80 columns: ${wide:0:300}"; fi
else echo "note: no 'script' to emulate a terminal: wrapping not checked"; fi
grep -A2 '^Parallelism:' <<<"$help" | grep -q -- '--workers' && grep -A1 '^Data:' <<<"$help" | grep -q -- '--data' \
  && ok "train --help: --data under Data, --workers under Parallelism" || bad "train --help: groups hold the wrong flags"
# the Strategies and Compressors lists after the flags are made from the registries: each entry
# of src/parallel/registry.c and compress.c (as scripts/registry-check reads them) has its line
missing=$(python3 "$(dirname "$0")/../scripts/registry-check" "$(dirname "$0")/.." |
  sed -n "s/^registry-check: \(strategy\|compressor\) '\([a-z0-9_]*\)'.*/\1 \2/p" | while read -r kind name; do
    title=$([ "$kind" = strategy ] && echo Strategies || echo Compressors)
    sed -n "/^$title:/,/^\$/p" <<<"$help" | grep -qE "^  $name([(:]| |\$)" || echo "$kind $name"; done)
nlisted=$(sed -n '/^Strategies:/,/^How each/p' <<<"$help" | grep -cE '^  [a-z]')
[ -z "$missing" ] && [ "$nlisted" -ge 11 ] && ok "train --help lists every strategy and compressor of the registries ($nlisted)" \
  || bad "train --help's registry lists lack: ${missing:-none} ($nlisted entries listed)"

if ! have_fmnist; then
  echo "skip: Fashion-MNIST not installed (apt-get install dataset-fashion-mnist)"
  finish; exit 77
fi

# ---- training on Fashion-MNIST ----
run() { $DT train --data fashion-mnist --quiet "$@"; }
touch "$TMP/a.st.tmp.999999"  # left by a writer that was killed (no such pid)
out=$(run --model mlp --epochs 1 --max-steps 600 --batch 32 --metrics "$TMP/m.jsonl" --save "$TMP/a.st") \
  || bad "train mlp: $out"
[ -e "$TMP/a.st.tmp.999999" ] && bad "stale temp file of --save not removed" || ok "stale temp file of --save removed"
acc=$(python3 -c "import json;r=[json.loads(l) for l in open('$TMP/m.jsonl')];print(r[-1]['test_acc'])")
python3 - "$TMP/m.jsonl" <<'PY' && ok "metrics JSONL fields" || bad "metrics JSONL fields"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
need = {"epoch", "train_loss", "test_loss", "test_acc", "samples_per_s", "wall_s"}
assert rows and all(need <= set(r) for r in rows), rows
PY
python3 -c "import sys; sys.exit(0 if $acc > 0.78 else 1)" && ok "600 steps reach test_acc $acc > 0.78" \
  || bad "600 steps give test_acc $acc"
eval_out=$($DT eval --checkpoint "$TMP/a.st" --data fashion-mnist)
grep -q "accuracy $(printf '%.4f' "$acc")" <<<"$eval_out" && ok "eval agrees with training ($eval_out)" \
  || bad "eval '$eval_out' differs from training acc $acc"

run --model mlp --epochs 1 --max-steps 600 --batch 32 --save "$TMP/b.st" >/dev/null
cmp -s "$TMP/a.st" "$TMP/b.st" && ok "same seed, same config: bitwise identical checkpoints" \
  || bad "two identical runs differ"
run --model mlp --epochs 1 --max-steps 600 --batch 32 --seed 7 --save "$TMP/c.st" >/dev/null
cmp -s "$TMP/a.st" "$TMP/c.st" && bad "different seeds give identical models" || ok "different seed differs"
# consolidating a checkpoint onto itself would destroy it: refused, the file unchanged
cp "$TMP/c.st" "$TMP/c.keep"
expect_fail "ckpt consolidate -o its own input" "is the checkpoint it reads" $DT ckpt consolidate "$TMP/c.st" -o "$TMP/c.st"
cmp -s "$TMP/c.st" "$TMP/c.keep" && ok "the checkpoint is unchanged" || bad "consolidate -o its input changed it"

# resume mid-epoch and across an epoch boundary equals an uninterrupted run
run --model mlp --epochs 2 --batch 128 --max-steps 700 --save "$TMP/full.st" >/dev/null
run --model mlp --epochs 2 --batch 128 --max-steps 250 --save "$TMP/p1.st" >/dev/null
run --model mlp --epochs 2 --batch 128 --max-steps 500 --resume "$TMP/p1.st" --save "$TMP/p2.st" >/dev/null
run --model mlp --epochs 2 --batch 128 --max-steps 700 --resume "$TMP/p2.st" --save "$TMP/res.st" >/dev/null
cmp -s "$TMP/full.st" "$TMP/res.st" && ok "resume (mid-epoch, then across the epoch end) is bitwise exact" \
  || bad "resumed run differs from the uninterrupted one"
expect_fail "resume with another model" "pass the same --model" \
  $DT train --data fashion-mnist --model "flatten linear(64) relu linear(10)" --resume "$TMP/p1.st"
expect_fail "resume with another optimizer" "trained with --optimizer adam" \
  $DT train --data fashion-mnist --optimizer sgd --batch 128 --resume "$TMP/p1.st"

# corrupted and truncated checkpoints are rejected by name
cp "$TMP/a.st" "$TMP/flip.st"
size=$(stat -c %s "$TMP/flip.st")
printf '\x55' | dd of="$TMP/flip.st" bs=1 seek=$((size - 1000)) conv=notrunc status=none
expect_fail "flipped byte rejected" "flip.st" $DT eval --checkpoint "$TMP/flip.st"
head -c $((size / 2)) "$TMP/a.st" >"$TMP/trunc.st"
expect_fail "truncated checkpoint rejected" "trunc.st" $DT eval --checkpoint "$TMP/trunc.st"

# the CNN preset and other optimizers/schedules run
run --model cnn --epochs 1 --batch 32 --max-steps 30 >/dev/null && ok "cnn preset trains" || bad "cnn preset"
run --model "flatten linear(64) gelu dropout(0.1) layernorm linear(10)" --optimizer sgd --momentum 0.9 --nesterov \
  --schedule cosine --warmup 10 --clip 1.0 --max-steps 50 >/dev/null && ok "sgd+nesterov, cosine, clip, dropout, layernorm" \
  || bad "sgd/cosine run"
run --model "conv(4,3,stride=2,pad=1) batchnorm tanh avgpool(2) flatten linear(10) sigmoid linear(10)" \
  --optimizer adamw --schedule step --step-size 10 --max-steps 30 --normalize >/dev/null \
  && ok "adamw, step schedule, batchnorm, avgpool, tanh, sigmoid, --normalize" || bad "adamw/bn run"
out=$($DT bench train --model foo --seconds 0 2>/dev/null); rc=$?
[ $rc -eq 2 ] && [ -z "$out" ] && $DT bench train --model foo --seconds 0 2>&1 | grep -q "no benchmark case matches --model foo" \
  && ok "bench train --model foo: exit 2 naming it, before anything is measured or printed" || bad "bench train --model foo: exit $rc: $out"
# --backend: the names come from the transport registry; nccl without a usable GPU (or built
# without NCCL) is a config error (78) that says what to use instead, on every rank of the job
out=$($DT train --backend tcp --max-steps 1 2>&1); rc=$?
[ $rc -eq 2 ] && grep -q "unknown transport 'tcp' (expected auto, nccl, mpi, shm or self)" <<<"$out" \
  && ok "--backend tcp: exit 2 listing the registry's transports" || bad "--backend tcp: exit $rc: $out"
if ! nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
  out=$($DT train --workers 2 --backend nccl --max-steps 1 2>&1); rc=$?
  [ $rc -eq 78 ] && grep -Eq "needs a CUDA device on every rank, and rank 0: no usable CUDA device|nccl transport is not built in" <<<"$out" \
    && grep -q -- "--backend shm or mpi" <<<"$out" && ok "--backend nccl without a GPU: exit 78 saying what to use" \
    || bad "--backend nccl without a GPU: exit $rc: $out"
fi
n=$(( $(nproc) + 1 ))
$DT train --data fashion-mnist --model mlp --max-steps 2 --threads $n 2>&1 \
  | grep -q "note: --threads $n on $(nproc) cores" && ok "--threads above the cores is noted" || bad "no note for --threads $n"
finish
