# Integration tests of the GPT path through the real command, on a small corpus the test writes:
# train (1 and 2 workers), the checkpoint carries nanoGPT's tensor names, eval agrees with the
# run's own evaluation, resume continues bit for bit, sample is deterministic per seed, its exit
# statuses follow dtrain's convention (0, 1, 2, 78), sample reads --weights as it reads the
# checkpoint, eval and sample take a --checkpoint-dir
# directory, and the mistakes a new user makes get clear errors.
. "$(dirname "$0")/testlib.bash"

python3 "$DTRAIN_TOOLS/word_corpus.py" "$TMP/corpus.txt" 7 40000
M="gpt:L=1,H=2,C=32,T=32"
D="text:$TMP/corpus.txt"
run() { $DT train --data "$D" --model "$M" --batch 8 --optimizer adamw --lr 3e-3 --quiet "$@"; }

# ---- errors ----
expect_fail "gpt on image data is refused" "reads token ids: give it --data text:FILE" \
  $DT train --model "$M" --data "$TMP/none.csv"
expect_fail "text with a layer stack is refused" "takes no token ids: use a --model gpt" $DT train --data "$D" --model mlp
expect_fail "a bad gpt spec names the key" "unknown key 'Q'" $DT train --data "$D" --model "gpt:Q=1"
expect_fail "heads must divide the width" "multiple of the H=3 heads" $DT train --data "$D" --model "gpt:C=32,H=3"
expect_fail "missing corpus" "$TMP/nope.txt" $DT train --data "text:$TMP/nope.txt" --model "$M"
expect_fail "val fraction range" "--val-fraction 0.9" run --val-fraction 0.9
expect_fail "--normalize on text is refused" "drop --normalize" run --normalize --max-steps 1
expect_fail "sample needs a checkpoint" "no --checkpoint or --weights given" $DT sample

# ---- training, checkpoint names, eval ----
out=$(run --max-steps 150 --save "$TMP/g.st" --save-weights "$TMP/g.w" --metrics "$TMP/g.jsonl" 2>&1) || bad "train gpt: $out"
python3 - "$TMP/g.jsonl" "$TMP/g.st" <<'PY' && ok "gpt learns (val loss < 2.2) and the checkpoint has nanoGPT names" || bad "gpt run: $out"
import json, struct, sys
r = [json.loads(l) for l in open(sys.argv[1])][-1]
assert r["test_loss"] < 2.2, r
raw = open(sys.argv[2], "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
names = set(json.loads(raw[8:8 + n])) - {"__metadata__"}
want = {"transformer.wte.weight", "transformer.wpe.weight", "transformer.h.0.ln_1.weight",
        "transformer.h.0.attn.c_attn.weight", "transformer.h.0.attn.c_proj.bias", "transformer.h.0.mlp.c_fc.weight",
        "transformer.h.0.mlp.c_proj.weight", "transformer.ln_f.bias"}
assert want <= names, want - names
assert "lm_head.weight" not in names  # tied to wte
PY
ev=$($DT eval --checkpoint "$TMP/g.st" --data "$D" 2>&1) || bad "eval gpt: $ev"
# eval prints 4 decimals and the metrics file keeps 5 digits: compare the numbers (within 6e-5, the
# two roundings), not the strings, since "%.4f" of an already rounded 1.22965 reads 1.2296.
want=$(python3 -c "import json;r=[json.loads(l) for l in open('$TMP/g.jsonl')][-1];print(r['test_loss'])")
got=$(sed -n 's/.*loss \([0-9.]*\),.*/\1/p' <<<"$ev")
python3 -c "import sys; sys.exit(not abs(float('$got') - $want) <= 6e-5)" 2>/dev/null &&
    ok "eval agrees with the run's validation loss ($got, the run's $want)" || bad "eval: $ev (want loss $want)"

# ---- resume is bitwise exact ----
run --max-steps 120 --save "$TMP/full.st" >/dev/null 2>&1
run --max-steps 50 --save "$TMP/half.st" >/dev/null 2>&1
run --max-steps 120 --resume "$TMP/half.st" --save "$TMP/res.st" >/dev/null 2>&1
python3 - "$TMP/full.st" "$TMP/res.st" <<'PY' && ok "gpt resume: bitwise equal weights" || bad "gpt resume differs"
import json, struct, sys
def tensors(p):
    raw = open(p, "rb").read(); n = struct.unpack("<Q", raw[:8])[0]; h = json.loads(raw[8:8 + n]); h.pop("__metadata__")
    return {k: raw[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]] for k, v in h.items()}
a, b = tensors(sys.argv[1]), tensors(sys.argv[2])
assert a.keys() == b.keys() and all(a[k] == b[k] for k in a)
PY
# a resume whose epoch is now shorter than where the checkpoint stopped says why (exit 78)
run --max-steps 60 --epoch-windows 8 --resume "$TMP/half.st" >"$TMP/ew.log" 2>&1
rc=$?
[ $rc -eq 78 ] && grep -q "stopped at batch 50 of epoch 1, but an epoch of this run has" "$TMP/ew.log" \
  && ok "resume into a shorter epoch (--epoch-windows changed) is refused, exit 78" || bad "epoch-windows resume (exit $rc): $(cat "$TMP/ew.log")"

# ---- 2 workers run the same job ----
out=$($DT train --data "$D" --model "$M" --batch 4 --workers 2 --optimizer adamw --lr 3e-3 --max-steps 40 --quiet 2>&1) \
  && grep -q "done:" <<<"$out" && ok "gpt under ddp with 2 workers" || bad "gpt ddp: $out"

# ---- sampling ----
s1=$($DT sample --checkpoint "$TMP/g.st" --prompt "the earth" --tokens 60 --seed 4 2>&1)
s2=$($DT sample --checkpoint "$TMP/g.st" --prompt "the earth" --tokens 60 --seed 4 2>&1)
s3=$($DT sample --checkpoint "$TMP/g.st" --prompt "the earth" --tokens 60 --seed 5 2>&1)
[ "$s1" = "$s2" ] && [ "$s1" != "$s3" ] && [ "${#s1}" -ge 69 ] && ok "sample: same seed same text, another seed other text" \
  || bad "sample: '$s1' / '$s2' / '$s3'"
grep -q "^the earth" <<<"$s1" && ok "sample continues the prompt" || bad "sample: '$s1'"
# the same model as plain weights (--save-weights: nanoGPT's names) gives the same text
w1=$($DT sample --weights "$TMP/g.w" --prompt "the earth" --tokens 60 --seed 4 2>&1)
[ "$w1" = "$s1" ] && ok "sample --weights (the run's --save-weights) gives the checkpoint's text" \
  || bad "sample --weights: '$w1' against '$s1'"
g=$($DT sample --checkpoint "$TMP/g.st" --prompt "the earth" --tokens 30 --temperature 0 2>&1)
python3 -c "import sys; t=sys.argv[1]; sys.exit(0 if set(t) <= set('abcdefghijklmnopqrstuvwxyz .\n') else 1)" "$g" \
  && ok "greedy sample stays in the corpus alphabet" || bad "greedy sample: '$g'"
expect_fail "sample refuses an image model" "not a language model" \
  bash -c "$DT train --data '$TMP/none.csv' --quiet 2>/dev/null; printf '0,1,2\n1,3,4\n' > '$TMP/t_train.csv'; \
           $DT train --data '$TMP/t_train.csv' --model 'linear(2)' --batch 2 --max-steps 1 --quiet --save '$TMP/img.st' >/dev/null 2>&1; \
           $DT sample --checkpoint '$TMP/img.st'"

# ---- exit statuses of sample (dtrain train --help's convention) ----
rc_of() { "$@" >/dev/null 2>&1; echo $?; }
printf 'not a checkpoint' >"$TMP/junk.st"; mkdir -p "$TMP/emptyd"
got="$(rc_of $DT sample --checkpoint "$TMP/g.st" --tokens 3) $(rc_of $DT sample) $(rc_of $DT sample --bogus)"
got="$got $(rc_of $DT sample --checkpoint "$TMP/g.st" --tokens -1) $(rc_of $DT sample --checkpoint "$TMP/g.st" --top-k -2)"
got="$got $(rc_of $DT sample --checkpoint "$TMP/g.st" --temperature 200) $(rc_of $DT sample --checkpoint "$TMP/nope.st")"
got="$got $(rc_of $DT sample --checkpoint "$TMP/junk.st") $(rc_of $DT sample --checkpoint "$TMP/img.st")"
got="$got $(rc_of $DT sample --checkpoint "$TMP/emptyd")"
[ "$got" = "0 2 2 2 2 2 78 78 78 78" ] \
  && ok "sample exits 0; 2 for no --checkpoint, an unknown flag or a bad value; 78 for a missing, damaged, non-GPT or empty one" \
  || bad "sample exit statuses (want 0 2 2 2 2 2 78 78 78 78): $got"

# ---- eval and sample take a --checkpoint-dir directory: its newest usable checkpoint ----
run --max-steps 6 --checkpoint-dir "$TMP/gd" --checkpoint-every 3 >/dev/null 2>&1 || bad "checkpoint-dir run"
last="$TMP/gd/ckpt-0000000006.safetensors"
sd=$($DT sample --checkpoint "$TMP/gd" --prompt "the" --tokens 20 --temperature 0 2>"$TMP/sd.err")
sf=$($DT sample --checkpoint "$last" --prompt "the" --tokens 20 --temperature 0 2>/dev/null)
ed=$($DT eval --checkpoint "$TMP/gd" --data "$D" 2>"$TMP/ed.err"); ef=$($DT eval --checkpoint "$last" --data "$D" 2>&1)
if [ -n "$sd" ] && [ "$sd" = "$sf" ] && [ -n "$ed" ] && [ "$ed" = "$ef" ] && grep -q "ckpt-0000000006" "$TMP/sd.err" \
   && grep -q "ckpt-0000000006" "$TMP/ed.err"; then
  ok "eval and sample of a --checkpoint-dir use its newest checkpoint and name it ($ed)"
else bad "a checkpoint directory: sample '$sd' vs '$sf'; eval '$ed' vs '$ef'; $(cat "$TMP/sd.err" "$TMP/ed.err")"; fi
finish
