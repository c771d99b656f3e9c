# Memory that is per rank from set-up on, with the real command: a GPT whose parameters, gradients
# and Adam moments (16 bytes a parameter) exceed --mem-limit is refused on one worker (exit 78,
# naming the limit) and trains under the same limit with --pp 4, --tp 4 and --tp 2 --pp 2, each
# rank reporting the bytes it was charged at most (core/mem.c's accounting, below the limit);
# --dry-run's per-rank total for --tp 2 --pp 2 is within 3% of what each rank held at most. The
# limit is 10 bytes a parameter of the model, read from --dry-run. With a test set each layout
# evaluates on its shards under the same limit, with the 1-worker loss and accuracy; --save still
# gathers the whole model (not streamed yet), which the last check shows refused under the limit
# with a message saying so. A model larger than the machine is planned by --dry-run and refused,
# naming the machine's memory, by a run. No timing is checked.
. "$(dirname "$0")/testlib.bash"
awk 'BEGIN { srand(5); split("the lord said unto moses and of in light was", w, " ");
       for (i = 0; i < 6000; i++) printf "%s%s", w[int(rand() * 10) + 1], (i % 13 == 12) ? ".\n" : " " }' >"$TMP/t.txt"
GPT=gpt:L=4,H=4,C=256,T=32
run() { $DT train --data "text:$TMP/t.txt" --model $GPT --batch 4 --max-steps 2 --val-fraction 0 "$@" 2>&1; }
P=$($DT train --data "text:$TMP/t.txt" --model $GPT --dry-run 2>&1 | sed -n 's/.*, \([0-9]*\) parameters,.*/\1/p')
LIM=$((10 * P))

out=$(run --mem-limit $LIM); rc=$?
if [ -n "$P" ] && [ $rc -eq 78 ] && grep -q -- "--mem-limit $LIM bytes: this rank already holds" <<<"$out"; then
  ok "1 worker: $P parameters x 16 bytes exceed --mem-limit $LIM (exit 78)"
else bad "1 worker under --mem-limit $LIM for $P parameters (exit $rc): $out"; fi

# every rank trained and was charged at most the limit
held() { grep -o 'rank [0-9]* held at most [0-9]* bytes' <<<"$1" | awk -v lim="$2" -v n="$3" \
  '{ if ($5 + 0 > lim + 0) bad = 1; c++ } END { exit !(c == n && !bad) }'; }
for layout in "--pp 4" "--tp 4" "--tp 2 --pp 2"; do
  out=$(run --workers 4 $layout --mem-limit $LIM); rc=$?
  [ "$layout" = "--tp 2 --pp 2" ] && tppp_out=$out
  if [ $rc -eq 0 ] && grep -q "done: 2 steps" <<<"$out" && held "$out" $LIM 4; then
    ok "$layout: 4 ranks train the same GPT under --mem-limit $LIM ($(grep -o 'held at most [0-9]*' <<<"$out" | \
       awk '{ printf "%s%s", s, $4; s = ", " }') bytes)"
  else bad "$layout under --mem-limit $LIM (exit $rc): $out"; fi
done

# the plan of each tp2 x pp2 rank against what that rank held at most
tppp_plan=$($DT train --data "text:$TMP/t.txt" --model $GPT --batch 4 --val-fraction 0 --workers 4 --tp 2 --pp 2 \
            --mem-limit $LIM --dry-run 2>&1)
cmp=$( { sed -n 's/^rank \([0-9]*\) (.*/P \1/p; s/^  total *\([0-9]*\) bytes.*/T \1/p' <<<"$tppp_plan";
         grep -o 'rank [0-9]* held at most [0-9]*' <<<"$tppp_out" | awk '{ print "H", $2, $6 }'; } | awk '
  $1 == "P" { r = $2 } $1 == "T" { plan[r] = $2 } $1 == "H" { held[$2] = $3 }
  END { for (r = 0; r < 4; r++) { d = plan[r] / held[r] - 1; if (!(held[r] > 0) || d > 0.03 || d < -0.03) bad = 1;
          printf "%srank %d plan %d held %d", r ? ", " : "", r, plan[r], held[r] } if (bad) printf " MISMATCH" }')
if [ -n "$cmp" ] && ! grep -q MISMATCH <<<"$cmp"; then ok "--tp 2 --pp 2: --dry-run within 3% of each rank's held bytes ($cmp)"
else bad "--tp 2 --pp 2: --dry-run against held ($cmp): $tppp_plan"; fi

plan() { $DT train --data "text:$TMP/t.txt" --model $GPT --batch 4 --val-fraction 0 --mem-limit $LIM --dry-run "$@" 2>&1; }
p1=$(plan); pp4=$(plan --workers 4 --pp 4); tp4=$(plan --workers 4 --tp 4)
if grep -q "1 of 1 rank would exceed it (rank 0)" <<<"$p1" && grep -q "every rank fits" <<<"$pp4" \
   && grep -q "every rank fits" <<<"$tp4" && grep -q "dp 1 x pp 4 x tp 1" <<<"$pp4" && grep -q "dp 1 x pp 1 x tp 4" <<<"$tp4"; then
  ok "--dry-run: 1 worker exceeds the limit, each rank of --pp 4 and of --tp 4 fits"
else bad "--dry-run plans: $p1 / $pp4 / $tp4"; fi
# with a validation set tp and pp evaluate on their shards: the plan fits; --save gathers the
# whole model to write it: the plan says so and exits as the run would (78)
out=$($DT train --data "text:$TMP/t.txt" --model $GPT --batch 4 --mem-limit $LIM --dry-run --workers 4 --pp 4 2>&1); rc=$?
out2=$($DT train --data "text:$TMP/t.txt" --model $GPT --batch 4 --mem-limit $LIM --dry-run --workers 4 --pp 4 \
       --save "$TMP/never.ckpt" 2>&1); rc2=$?
if [ $rc -eq 0 ] && grep -q "every rank fits" <<<"$out" && [ $rc2 -eq 78 ] && grep -q "at eval/ckpt" <<<"$out2" \
   && grep -q "of 4 ranks would exceed it (rank" <<<"$out2"; then
  ok "--dry-run: a validation set fits (evaluated on the shards), --save counts the whole-model gather and exits 78"
else bad "--dry-run with a validation set (exit $rc): $out / with --save (exit $rc2): $out2"; fi

# the epoch's evaluation under the same limit: on the shards, the 1-worker loss and accuracy
# (the single worker runs without the limit, which it cannot train under)
fig() { grep -o 'test accuracy [0-9.]*, test loss [0-9.]*' <<<"$1"; }
one=$(fig "$($DT train --data "text:$TMP/t.txt" --model $GPT --batch 4 --max-steps 2 2>&1)")
for layout in "--pp 4" "--tp 4" "--tp 2 --pp 2"; do
  out=$($DT train --data "text:$TMP/t.txt" --model $GPT --batch 4 --max-steps 2 --workers 4 $layout \
        --mem-limit $LIM 2>&1); rc=$?
  if [ -n "$one" ] && [ $rc -eq 0 ] && [ "$(fig "$out")" = "$one" ] && held "$out" $LIM 4; then
    ok "$layout with a test set: evaluated under --mem-limit $LIM on the shards, as 1 worker ($one)"
  else bad "$layout with a test set under --mem-limit $LIM (exit $rc; 1 worker: $one): $out"; fi
done

out=$($DT train --data "text:$TMP/t.txt" --model $GPT --batch 4 --max-steps 2 --workers 4 --pp 4 \
      --mem-limit $LIM --save "$TMP/p.ckpt" 2>&1); rc=$?
if [ $rc -ne 0 ] && grep -q "checkpoints (and with --zero 3 evaluation) gather the whole model" <<<"$out"; then
  ok "--pp 4 with --save: the checkpoint's whole-model gather is refused under the limit, saying why"
else bad "--pp 4 with --save under --mem-limit $LIM (exit $rc): $out"; fi

# a shuffled feature set of 4-256 MiB is read from each rank's private copy on huge pages: it is in
# the plan (a 'loader copy' row, in the total) and charged, so the plan's total is within 3% of
# what each rank of the Fashion-MNIST MLP held at most
if have_fmnist; then
  for split in "" "--val-split 0.1"; do  # with --val-split: the copy of the training part (a view)
  fplan=$($DT train --model mlp --workers 2 $split --dry-run --mem-limit 1G 2>&1)
  fout=$($DT train --model mlp --workers 2 $split --max-steps 5 --epochs 1 --mem-limit 1G --quiet 2>&1)
  copy=$(awk '/^  loader copy/ { print $3; exit }' <<<"$fplan"); tot=$(awk '/^  total/ { print $2; exit }' <<<"$fplan")
  if [ -n "$copy" ] && [ "$copy" -gt 40000000 ] && grep -q "every rank fits" <<<"$fplan" &&
     grep -o 'rank [0-9]* held at most [0-9]*' <<<"$fout" | awk -v t="$tot" '{ d = t / $6 - 1; if (d > 0.03 || d < -0.03) bad = 1; c++ }
       END { exit !(c == 2 && !bad) }'; then
    ok "Fashion-MNIST${split:+ $split}: the plan's loader copy ($copy bytes) and total ($tot) match what each rank held (within 3%)"
  else bad "Fashion-MNIST${split:+ $split} plan (copy $copy, total $tot) against held: $fplan / $fout"; fi
  done
else echo "note: Fashion-MNIST not installed: loader copy plan skipped"; fi

# a model larger than the machine: --dry-run plans it without reserving its memory (it failed to
# reserve the slab), and a run that would place it is refused naming the machine's memory, not
# killed by the kernel on a page fault (412 GB of parameters; not on a machine that has that)
BIG=gpt:L=128,H=64,C=8192,T=64
out=$($DT train --data "text:$TMP/t.txt" --model $BIG --dry-run --workers 8 --zero 3 2>&1); rc=$?
[ $rc -eq 0 ] && grep -q "103095484416 parameters" <<<"$out" && grep -q "^rank 7 " <<<"$out" \
  && ok "--dry-run of a 103G-parameter GPT prints each rank's plan" || bad "--dry-run of $BIG: exit $rc: $(head -3 <<<"$out")"
if [ "$(awk '/^MemTotal:/ { print $2 }' /proc/meminfo)" -lt 400000000 ]; then
  out=$($DT train --data "text:$TMP/t.txt" --model $BIG --max-steps 1 2>&1); rc=$?
  [ $rc -eq 1 ] && grep -q "more than this machine's [0-9]* bytes of memory" <<<"$out" \
    && ok "a run that would place 412 GB is refused naming the machine's memory (exit 1)" || bad "$BIG run: exit $rc: $out"
fi
finish
