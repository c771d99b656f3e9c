# Elastic shrink with the real command: the same rank slot is killed (kill -9) in two jobs in a
# row, so the supervisor drops the slot and the third job runs with one worker; it must train to
# the end (exit 0) from the newest checkpoint, for slot 1 and for slot 0. The kills land on the
# ranks as soon as they exist, and world rank 0 runs at a tenth of its speed (--slow 0:10: it
# sleeps 9x its compute, and the other rank waits for it at each allreduce), so that the
# replacement of the first victim is still training when it is found on any machine: unslowed,
# 400 steps took 0.1 s on a Zen 5 and the replacement finished before the second kill.
. "$(dirname "$0")/testlib.bash"
if ! have_fmnist; then echo "skip: Fashion-MNIST not installed (apt-get install dataset-fashion-mnist)"; exit 77; fi
for slot in 1 0; do
  D="$TMP/ck$slot"
  $DT train --workers 2 --model mlp --batch 64 --epochs 1 --max-steps 400 --quiet --elastic 1:2 --slow 0:10 \
    --checkpoint-dir "$D" --checkpoint-every 100 --metrics "$TMP/m$slot.jsonl" >"$TMP/el$slot.log" 2>&1 &
  pid=$!
  v1=$(wait_rank_pid $pid $slot) && kill -9 "$v1"
  v2=$(wait_rank_pid $pid $slot "$v1") && kill -9 "$v2"
  wait $pid
  rc=$?
  log=$(cat "$TMP/el$slot.log")
  if [ $rc -eq 0 ] && grep -q "rank $slot failed twice in a row: continuing without it" <<<"$log" \
     && grep -q "with 1 worker from" <<<"$log" && ! grep -q "but this job has" <<<"$log" \
     && grep -q "done: test accuracy" <<<"$log"; then
    ok "slot $slot killed twice: the job shrinks to 1 worker and finishes"
  else bad "slot $slot killed twice (exit $rc, victims ${v1:-none} ${v2:-none}): $log"; fi
done
finish
