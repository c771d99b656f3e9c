# Pre-tokenized data through the real command (--data tokens:DIR): a nanoGPT-format train.bin /
# val.bin written by a small script (tests/tools/token_files.py, as prepare.py writes them) trains
# a GPT whose vocabulary comes from the data, evaluates on val.bin, and `dtrain eval` of its
# checkpoint agrees; llm.c's shards (256-int32 header) train the same way; a V below the data's
# tokens, and unusable files, are refused with the file named (exit 2 and 78).
. "$(dirname "$0")/testlib.bash"
DT=$(cd "$(dirname "$DT")" && pwd)/dtrain  # absolute: some checks run from another directory
PY=/usr/bin/python3; $PY -c "import numpy" 2>/dev/null || { echo "skip: $PY has no numpy (apt-get install python3-numpy)"; exit 77; }
$PY "$DTRAIN_TOOLS/token_files.py" nanogpt "$TMP/ng" 1 40000 || bad "token_files.py nanogpt"
$PY "$DTRAIN_TOOLS/token_files.py" llmc "$TMP/lc" 2 40000 || bad "token_files.py llmc"
M="gpt:L=1,H=2,C=32,T=16"
run() { $DT train --model "$M" --batch 8 --optimizer adamw --lr 3e-3 --quiet "$@"; }
last() { python3 -c "import json,sys; r=[json.loads(l) for l in open(sys.argv[1])][-1]; print(r[sys.argv[2]])" "$@"; }

# ---- nanoGPT: train.bin / val.bin ----
out=$(run --data "tokens:$TMP/ng" --max-steps 150 --save "$TMP/ng.st" --metrics "$TMP/ng.jsonl" 2>&1) || bad "train on nanoGPT files: $out"
loss=$(last "$TMP/ng.jsonl" test_loss); acc=$(last "$TMP/ng.jsonl" test_acc); model=$(last "$TMP/ng.jsonl" model)
# the chain is followed 9 times in 10: a model that learned it predicts ~90 % (chance: 1/64)
python3 -c "import sys; sys.exit(0 if float(sys.argv[1]) < 1.5 and float(sys.argv[2]) > 0.8 else 1)" "$loss" "$acc" \
  && ok "nanoGPT train.bin trains and evaluates on val.bin (test loss $loss, accuracy $acc)" \
  || bad "nanoGPT run did not learn: test loss $loss, accuracy $acc: $out"
[ "$model" = "gpt:L=1,H=2,C=32,T=16,V=694" ] && ok "the vocabulary comes from the data (largest token 693 + 1)" \
  || bad "model '$model', want V=694"
ev=$($DT eval --checkpoint "$TMP/ng.st" 2>&1) || bad "dtrain eval of the tokens checkpoint: $ev"
grep -q "loss $(printf '%.4f' "$loss")" <<<"$ev" && ok "dtrain eval of the checkpoint reads val.bin again: $ev" \
  || bad "dtrain eval '$ev' vs the run's test loss $loss"

# the checkpoint stores the directory as an absolute path: eval from elsewhere of a run given a relative one
(cd "$TMP" && run --data tokens:ng --max-steps 5 --save rel.st >/dev/null 2>&1) || bad "train with a relative tokens:ng"
ev=$(cd / && $DT eval --checkpoint "$TMP/rel.st" 2>&1) && grep -q "eval: 249 samples" <<<"$ev" \
  && ok "dtrain eval from / finds tokens:ng given relative to the run's directory" || bad "eval from /: $ev"

# sample: a model of token files takes and prints token ids (--ids); greedy follows the chain k -> 5k+3
out=$($DT sample --checkpoint "$TMP/ng.st" --ids --prompt "0 11,33" --tokens 3 --temperature 0 2>&1)
[ "$out" = "0 11 33 198 319 220" ] && ok "dtrain sample --ids continues the token ids: $out" || bad "sample --ids: '$out'"
expect_fail "sample without --ids says the model reads token ids" "has V=694 tokens" $DT sample --checkpoint "$TMP/ng.st" --prompt hi
expect_fail "sample --ids names an id outside the vocabulary" "token 2 ('700') is not an id in [0, 694)" \
  $DT sample --checkpoint "$TMP/ng.st" --ids --prompt "0 700"

# ---- llm.c shards, and an explicit V ----
out=$(run --data "tokens:$TMP/lc" --model "$M,V=1024" --max-steps 60 --metrics "$TMP/lc.jsonl" 2>&1) \
  && [ "$(last "$TMP/lc.jsonl" model)" = "gpt:L=1,H=2,C=32,T=16,V=1024" ] \
  && ok "llm.c shards train with --model ...,V=1024 (test loss $(last "$TMP/lc.jsonl" test_loss))" || bad "llm.c shards: $out"

# ---- errors ----
expect_fail "a V below the data's tokens names the token and the V to use" "pass V=694 or more" \
  run --data "tokens:$TMP/ng" --model "$M,V=600" --max-steps 1
run --data "tokens:$TMP/ng" --model "$M,V=600" --max-steps 1 >/dev/null 2>&1; rc=$?
[ $rc -eq 2 ] && ok "a too small V exits 2" || bad "a too small V exits $rc, want 2"
mkdir -p "$TMP/odd" && head -c 1001 "$TMP/ng/train.bin" >"$TMP/odd/train.bin"
expect_fail "an odd-sized train.bin is named" "$TMP/odd/train.bin has 1001 bytes, an odd count" \
  run --data "tokens:$TMP/odd" --max-steps 1
run --data "tokens:$TMP/odd" --max-steps 1 >/dev/null 2>&1; rc=$?
[ $rc -eq 78 ] && ok "unusable token files exit 78" || bad "unusable token files exit $rc, want 78"
mkdir -p "$TMP/cut" && head -c 5000 "$TMP/lc/tiny_train_000001.bin" >"$TMP/cut/tiny_train_000001.bin"
expect_fail "a cut-short llm.c shard is named" "tiny_train_000001.bin: its llm.c header says" run --data "tokens:$TMP/cut" --max-steps 1
mkdir -p "$TMP/empty"
expect_fail "a directory without token files says what it looks for" "holds neither train.bin" run --data "tokens:$TMP/empty"
expect_fail "token files with a layer stack are refused" "takes no token ids" $DT train --data "tokens:$TMP/ng" --model mlp
finish
