# Uneven workers end to end with the real command: 4 fully asynchronous ps workers reach test
# accuracy >= 0.84 on the reference MLP within 2 epochs (and the saved model evaluates the same);
# the same with --ps-overlap; killing a ps worker (kill -9) mid-run: the job completes, says so and
# counts every sample once (also with --ps-overlap); SIGTERM stops a ps job with a checkpoint and
# --resume trains the rest from its position (both modes); --max-steps stops cleanly (both modes);
# with --grad-accum a step pushes batch x grad-accum samples;
# bounded staleness under a straggler stays within its bound (metrics), with fixed shards and with
# dynamic assignment;
# localsgd and ddp + --balance dynamic report per-worker figures; flag errors name the fix; and
# ps over MPI where mpirun exists, where a killed worker is dropped too (mpirun --enable-recovery).
. "$(dirname "$0")/testlib.bash"
# the sanitizer pass (several times slower) runs the --ps-overlap variants of the kill, SIGTERM
# and --max-steps cases in the optimized pass only, to stay within the CI budget
OVLS=("")
if [ -z "${DTRAIN_SANITIZED:-}" ]; then OVLS+=(--ps-overlap); else echo "note: sanitizer build: --ps-overlap variants of 2, 2b, 2d skipped"; fi
if ! have_fmnist; then echo "skip: Fashion-MNIST not installed (apt-get install dataset-fashion-mnist)"; exit 77; fi
acc_of() { grep -o 'done: test accuracy [0-9.]*' "$1" | awk '{print $4}'; }
ge() { python3 -c "import sys; sys.exit(0 if float('$1') >= float('$2') else 1)"; }
# launcher_of JOB: the dtrain launcher that `timeout ... $DT train --workers N &` (JOB) runs. Signal
# it, not timeout: timeout passes a signal to its whole process group, and a second SIGTERM kills a rank
launcher_of() {
  local l=""
  for _ in $(seq 50); do l=$(ps -o pid= --ppid "$1" | head -1); [ -n "$l" ] && break; sleep 0.1; done
  echo $l
}
rank_pid() {  # LAUNCHER R: the rank whose environment says DTRAIN_RANK=R
  for p in $(ps -o pid= --ppid "$1"); do tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "DTRAIN_RANK=$2" && echo $p; done
}
wait_for() { for _ in $(seq 300); do grep -q "$2" "$1" && return 0; sleep 0.1; done; return 1; }  # FILE RE, 30 s
# epoch_samples JSONL: each epoch report's samples, summed over the workers
epoch_samples() { python3 -c "import json,sys; print(*[sum(w['samples'] for w in json.loads(l)['workers']) for l in open(sys.argv[1])])" "$1"; }

# 1. convergence: 4 async workers (and 1 server), 2 epochs
$DT train --workers 4 --strategy ps --staleness inf --model mlp --epochs 2 --batch 32 --quiet \
  --metrics "$TMP/async.jsonl" --save "$TMP/async.safetensors" >"$TMP/async.log" 2>&1 \
  || bad "async run: $(tail -5 "$TMP/async.log")"
a=$(acc_of "$TMP/async.log")
[ -n "$a" ] && ge "$a" 0.84 && ok "4 async ps workers, 2 epochs: test_acc $a >= 0.84" || bad "async accuracy '$a' < 0.84"
# the checkpoint holds the model server 0 assembled and evaluated
e=$($DT eval --checkpoint "$TMP/async.safetensors" 2>&1 | grep -o 'accuracy [0-9.]*' | awk '{print $2}')
[ "$e" = "$a" ] && ok "ps --save: dtrain eval of the assembled model gives $e" || bad "eval '$e' vs reported '$a'"
python3 - "$TMP/async.jsonl" <<'PY' && ok "ps metrics: 4 workers, shares, staleness histogram" || bad "ps metrics"
import json, sys
r = [json.loads(l) for l in open(sys.argv[1])][-1]
assert r["strategy"] == "ps" and r["world_size"] == 5 and r["global_batch"] == 128, r
w = r["workers"]
assert [x["rank"] for x in w] == [1, 2, 3, 4] and all(x["alive"] for x in w), w
assert abs(sum(x["share"] for x in w) - 1) < 1e-3 and all(x["samples_per_s"] > 0 for x in w), w
h = r["staleness"]["hist"]
assert len(h) == 16 and sum(h) > 0 and r["max_clock_gap"] >= 0, h
assert r["step_ms"]["compute"] > 0 and r["step_ms"]["comm_wait"] > 0, r["step_ms"]  # the workers' steps
print("staleness mean", r["staleness"]["mean"], "max", r["staleness"]["max"])
PY

# 1b. the same with --ps-overlap (push/pull in the background, one batch held ahead): every
# gradient one step staler, and every epoch holds every sample. The extra staleness costs ~0.5
# points here: 19 runs on a loaded 2-core machine gave 0.8396-0.8482 (mean ~0.845; 2 below
# 0.84), so the bar is 0.835, not the 0.84 of the run without overlap
$DT train --workers 4 --strategy ps --staleness inf --ps-overlap --model mlp --epochs 2 --batch 32 --quiet \
  --metrics "$TMP/ovl.jsonl" >"$TMP/ovl.log" 2>&1 || bad "overlap run: $(tail -5 "$TMP/ovl.log")"
a=$(acc_of "$TMP/ovl.log")
python3 - "$TMP/ovl.jsonl" <<'PY' || bad "overlap metrics"
import json, sys
for r in [json.loads(l) for l in open(sys.argv[1])]:
    assert sum(x["samples"] for x in r["workers"]) == 60000, r["workers"]
PY
[ -n "$a" ] && ge "$a" 0.835 && ok "4 async ps workers --ps-overlap, 2 epochs: test_acc $a >= 0.835" || bad "overlap accuracy '$a' < 0.835"

# 2. a worker killed (kill -9) once the first epoch is reported, without and with --ps-overlap
# (where it dies holding two units): the servers drop it, the others finish, the run says so, and
# every epoch's report counts each sample once (the units it held go to the others)
for ovl in "${OVLS[@]}"; do
  timeout 120 $DT train --workers 4 --strategy ps --staleness inf $ovl --model mlp --epochs 3 --batch 32 \
    --metrics "$TMP/kill.jsonl" >"$TMP/kill.log" 2>&1 &
  job=$!
  l=$(launcher_of $job) victim=""
  for _ in $(seq 100); do victim=$(rank_pid "$l" 3); [ -n "$victim" ] && break; sleep 0.1; done
  wait_for "$TMP/kill.log" "^\[0\] epoch 1/3: " && [ -n "$victim" ] && kill -9 "$victim"
  wait $job
  rc=$?
  n=$(epoch_samples "$TMP/kill.jsonl")
  if [ -n "$victim" ] && [ $rc -eq 0 ] && grep -q "worker rank 3 died at step [0-9]*; continuing with 3 workers" "$TMP/kill.log" \
     && grep -q "rank 3 was killed by signal 9 (SIGKILL); the job goes on without it" "$TMP/kill.log" \
     && grep -q "done: test accuracy" "$TMP/kill.log" && [ "$n" = "60000 60000 60000" ]; then
    ok "kill -9 of worker rank 3${ovl:+ ($ovl)}: $(grep -o 'worker rank 3 died.*' "$TMP/kill.log"), test_acc $(acc_of "$TMP/kill.log"), samples per epoch $n"
  else bad "killed worker${ovl:+ ($ovl)} (victim '$victim', exit $rc, samples per epoch '$n'): $(tail -8 "$TMP/kill.log")"; fi
done

# 2b. SIGTERM: the workers finish their step, the server writes the model it holds and says how to go on
# (with --ps-overlap too: a worker drains its exchange in flight before leaving). --resume of that
# checkpoint (in the same mode) trains the rest of the epoch from the recorded position once (the
# first report counts the samples from step_in_epoch x 3 workers x 32 on), then whole epochs
for ovl in "${OVLS[@]}"; do
  timeout 120 $DT train --workers 3 --strategy ps --model mlp --epochs 5 --batch 32 $ovl --save "$TMP/stop.safetensors" \
    >"$TMP/stop.log" 2>&1 &
  job=$!
  l=$(launcher_of $job)
  wait_for "$TMP/stop.log" "strategy ps"
  sleep 0.5
  kill -TERM $l
  wait $job
  rc=$?
  if [ $rc -eq 0 ] && grep -q "stopped at step [0-9]*; checkpoint $TMP/stop.safetensors" "$TMP/stop.log" \
     && ! grep -q "error" "$TMP/stop.log" && $DT eval --checkpoint "$TMP/stop.safetensors" >/dev/null 2>&1; then
    ok "SIGTERM to a ps job${ovl:+ ($ovl)}: $(grep -o 'stopped at step [0-9]*' "$TMP/stop.log"), checkpoint evaluates"
  else bad "ps SIGTERM${ovl:+ ($ovl)} (exit $rc): $(tail -6 "$TMP/stop.log")"; fi
  read -r ep in_ep < <(python3 - "$TMP/stop.safetensors" <<'PY'
import json, struct, sys
b = open(sys.argv[1], "rb").read()
m = json.loads(b[8:8 + struct.unpack("<Q", b[:8])[0]])["__metadata__"]
print(m["dtrain.epoch"], m["dtrain.step_in_epoch"])
PY
  )
  rm -f "$TMP/res.jsonl"  # a resumed run appends to --metrics
  timeout 120 $DT train --workers 3 --strategy ps --model mlp --epochs $((ep + 2)) --batch 32 $ovl --quiet \
    --resume "$TMP/stop.safetensors" --metrics "$TMP/res.jsonl" >"$TMP/res.log" 2>&1
  rc=$?
  n=$(epoch_samples "$TMP/res.jsonl") want="$((60000 - in_ep * 3 * 32)) 60000"
  if [ $rc -eq 0 ] && [ "$n" = "$want" ] && grep -q "done: test accuracy" "$TMP/res.log"; then
    ok "--resume of it${ovl:+ ($ovl)} at epoch $((ep + 1)), step_in_epoch $in_ep: samples per epoch $n"
  else bad "ps resume${ovl:+ ($ovl)} at epoch $((ep + 1)), step_in_epoch $in_ep (exit $rc): samples '$n', want '$want': $(tail -4 "$TMP/res.log")"; fi
done

# 2c. the server killed: the workers stop, each naming it in one line (a worker that gets the launcher's SIGTERM
# between two steps just stops), and nothing crashes on the way out
$DT train --workers 2 --strategy ps --model mlp --epochs 3 --batch 32 >"$TMP/ksrv.log" 2>&1 &
job=$!
for _ in $(seq 100); do grep -q "strategy ps" "$TMP/ksrv.log" && break; sleep 0.1; done
sleep 0.5
for p in $(ps -o pid= --ppid $job); do
  tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "DTRAIN_RANK=0" && kill -9 "$p"
done
wait $job
rc=$?
named=$(grep -c '^\[[12]\] dtrain: stopped: world rank 0 failed' "$TMP/ksrv.log")
if [ $rc -ne 0 ] && [ "$named" -ge 1 ] && grep -q "rank 0 was killed by signal 9" "$TMP/ksrv.log" \
   && ! grep -q "SIGSEGV\|signal 11\|Sanitizer" "$TMP/ksrv.log"; then
  ok "kill -9 of the ps server: $named of 2 workers name it, none crashes (job exit $rc)"
else bad "killed server (exit $rc): $(tail -6 "$TMP/ksrv.log")"; fi

# 2d. --max-steps stops every worker cleanly after that many steps, without and with --ps-overlap,
# 1 and 3 workers, 2 servers; 4 x 500 x 32 samples cross an epoch end: the first epoch is whole
# (with overlap a worker's last unit handed ahead was left untrained and the epoch never ended)
f0=$fails
for ovl in "${OVLS[@]}"; do
  for wsm in 1:1:50 3:1:50 3:2:50 4:2:500; do
    IFS=: read -r w sv m <<<"$wsm"
    timeout 60 $DT train --workers $w --servers $sv --strategy ps --staleness inf $ovl --model mlp --epochs 2 --batch 32 \
      --max-steps $m --quiet --metrics "$TMP/ms.jsonl" >"$TMP/ms.log" 2>&1
    rc=$?
    n=$(epoch_samples "$TMP/ms.jsonl") want=$((w * m * 32))
    [ $want -gt 60000 ] && want="60000 $((want - 60000))"
    [ $rc -eq 0 ] && grep -q "after $m steps" "$TMP/ms.log" && [ "$n" = "$want" ] \
      || bad "--max-steps $m, $w worker(s), $sv server(s)${ovl:+ $ovl} (exit $rc, samples '$n', want '$want'): $(tail -4 "$TMP/ms.log")"
  done
done
[ $fails -eq $f0 ] && ok "--max-steps 50 (1 and 3 workers, 2 servers) and 500 (over an epoch end), with and without --ps-overlap: exit 0, every step"

# 2e. --grad-accum: a worker's step (and push) is batch x grad-accum samples (the server refused
# such pushes as impossible and dropped every worker), with either balance mode
for mode in dynamic static; do
  rm -f "$TMP/ga.jsonl"
  timeout 60 $DT train --workers 2 --strategy ps --balance $mode --grad-accum 2 --model mlp --epochs 1 --batch 32 \
    --max-steps 20 --quiet --metrics "$TMP/ga.jsonl" >"$TMP/ga.log" 2>&1
  rc=$? n=$(epoch_samples "$TMP/ga.jsonl")
  [ $rc -eq 0 ] && grep -q "after 20 steps" "$TMP/ga.log" && [ "$n" = "2560" ] \
    && ok "ps --balance $mode --grad-accum 2: 2 workers x 20 steps x 64 samples" \
    || bad "ps --balance $mode --grad-accum 2 (exit $rc, samples '$n', want 2560): $(tail -4 "$TMP/ga.log")"
done

# 3. bounded staleness under a straggler, both ways: fixed shards (SSP on the workers' own clocks)
# and the default dynamic assignment (rounds of one batch per worker); the gap stays within --staleness
for mode in static dynamic; do
  $DT train --workers 3 --strategy ps --staleness 2 --balance $mode --slow 3:4 --model mlp --epochs 1 --max-steps 300 \
    --batch 32 --quiet --metrics "$TMP/ssp.jsonl" >"$TMP/ssp.log" 2>&1 || bad "ssp $mode run: $(tail -5 "$TMP/ssp.log")"
  python3 - "$TMP/ssp.jsonl" <<'PY' && ok "ps --balance $mode, 4x straggler: gap within --staleness 2" || bad "SSP bound ($mode)"
import json, sys
r = [json.loads(l) for l in open(sys.argv[1])][-1]
print("max_clock_gap", r["max_clock_gap"], "staleness", r["staleness"])
assert 0 <= r["max_clock_gap"] <= 2, r
PY
done

# 4. localsgd and dynamic balancing report per-worker shares and batches
$DT train --workers 2 --strategy localsgd --sync-every 4 --model mlp --epochs 1 --batch 32 --quiet \
  --metrics "$TMP/lsgd.jsonl" >"$TMP/lsgd.log" 2>&1 || bad "localsgd: $(tail -5 "$TMP/lsgd.log")"
a=$(acc_of "$TMP/lsgd.log")
[ -n "$a" ] && ge "$a" 0.80 && ok "localsgd H=4, 2 workers: test_acc $a" || bad "localsgd accuracy '$a'"
for st in ddp localsgd; do
  $DT train --workers 2 --strategy $st --balance dynamic --slow 1:3 --model mlp --epochs 1 --batch 64 --quiet \
    --metrics "$TMP/bal.jsonl" >"$TMP/bal.log" 2>&1 || bad "$st balance: $(tail -5 "$TMP/bal.log")"
  python3 - "$TMP/bal.jsonl" <<'PY' && ok "$st --balance dynamic: the 3x slower rank trains the smaller share" || bad "$st balance metrics"
import json, sys
r = [json.loads(l) for l in open(sys.argv[1])][-1]
w = r["workers"]
print("batches", [x["batch"] for x in w], "shares", [x["share"] for x in w], "test_acc", r["test_acc"])
# the epoch's shares, not the last cut: on a loaded machine one late re-cut can follow a passing
# spike of the other rank (balance_test checks the cutting arithmetic itself, without a clock)
assert w[0]["batch"] + w[1]["batch"] == 128 and w[1]["share"] < w[0]["share"], w
assert w[0]["samples"] + w[1]["samples"] == 60000 and r["test_acc"] > 0.78, w
PY
done

# 5. flag errors say what to do
expect_fail "bad --balance" "--balance sideways: unknown mode" $DT train --strategy ps --balance sideways
expect_fail "--slow on a server" "is a ps server" $DT train --workers 2 --strategy ps --slow 0:2 --max-steps 1
expect_fail "bad --staleness" "--staleness" $DT train --strategy ps --staleness soon
expect_fail "--dry-run does not plan ps" "not --strategy ps" $DT train --workers 3 --strategy ps --dry-run
expect_fail "--ps-overlap needs ps" "add --strategy ps" $DT train --workers 2 --ps-overlap --max-steps 1
expect_fail "--ps-overlap with fixed shards" "drop --balance static" $DT train --strategy ps --balance static --ps-overlap
expect_fail "--ps-overlap with a bound" "use --staleness inf" $DT train --strategy ps --staleness 2 --ps-overlap
expect_fail "ps needs a worker" "needs more than 1 ranks" $DT launch -n 1 -- $DT train --strategy ps --max-steps 1
expect_fail "unknown --strategy, once, before any rank starts" "--strategy psx: unknown strategy" \
  $DT train --workers 2 --strategy psx --max-steps 1
expect_fail "--staleness needs ps" "drop --staleness" $DT train --workers 2 --staleness 2 --max-steps 1
expect_fail "--servers needs ps" "--servers 2: only --strategy ps" $DT train --workers 2 --servers 2 --max-steps 1
expect_fail "--sync-every needs localsgd" "add --strategy localsgd" $DT train --workers 2 --strategy ps --sync-every 4
expect_fail "ps has no --checkpoint-dir" "use --save FILE" $DT train --workers 2 --strategy ps --checkpoint-dir "$TMP/ck"
expect_fail "--slow outside the job" "--slow 5:3: this job has only 2 ranks" $DT train --workers 2 --slow 5:3 --max-steps 1
expect_fail "--workers counts ps workers" "--workers 3 with --servers 1 makes 4 ranks, but this job has 3" \
  $DT launch -n 3 -- $DT train --strategy ps --workers 3 --max-steps 1
# the spec form of --strategy: its options and the flags agree or are refused, naming both
expect_fail "a spec option and its flag disagree" "--servers 3: --strategy ps(servers=2) sets servers=2" \
  $DT train --strategy "ps(servers=2)" --servers 3
expect_fail "an unknown spec option lists the strategy's" "--strategy ddp: unknown option 'staleness' (ddp takes bucket_mb, compress, allreduce, zero, update, balance)" \
  $DT train --workers 2 --strategy "ddp(staleness=2)"
expect_fail "the spec's rules between options" "overlap=1 needs shards=dynamic and staleness=inf" \
  $DT train --strategy "ps(staleness=2)" --ps-overlap
out=$(timeout 60 $DT train --workers 2 --strategy "ps(servers=1,staleness=inf,overlap=1)" --staleness inf --max-steps 4 2>&1)
if [ $? -eq 0 ] && grep -q "strategy ps(servers=1,staleness=inf,shards=dynamic,overlap=1): 1 server, 2 workers" <<<"$out" \
   && grep -q "after 4 steps" <<<"$out"; then ok "--strategy \"ps(servers=1,staleness=inf,overlap=1)\" with an agreeing flag trains"
else bad "spec run: $(tail -4 <<<"$out")"; fi
out=$(timeout 60 $DT train --workers 2 --strategy ps --model "flatten batchnorm linear(10)" --max-steps 1 2>&1)
if [ $? -eq 78 ] && grep -q "does not keep model buffers" <<<"$out" && ! grep -q "goes on without" <<<"$out"; then
  ok "a ps worker's set-up error stops the job (not 'goes on without it')"
else bad "ps + batchnorm: $out"; fi

# 6. the same ps job over MPI
if command -v mpirun >/dev/null; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  ASAN_OPTIONS=${DTRAIN_SANITIZED:+detect_leaks=0} timeout 120 mpirun -np 3 --oversubscribe --bind-to none $DT train \
    --backend mpi --strategy ps --staleness 2 --model mlp --epochs 1 --max-steps 400 --batch 32 --quiet \
    --metrics "$TMP/mpi.jsonl" >"$TMP/mpi.log" 2>&1
  rc=$?
  if grep -q "built without MPI" "$TMP/mpi.log"; then echo "note: built without MPI, MPI run skipped"
  elif [ $rc -eq 0 ] && grep -q '"backend": "mpi"' "$TMP/mpi.jsonl" && ge "$(acc_of "$TMP/mpi.log")" 0.75; then
    ok "mpirun -np 3 ps (1 server, 2 workers): test_acc $(acc_of "$TMP/mpi.log")"
  else bad "mpirun ps (exit $rc): $(tail -5 "$TMP/mpi.log")"; fi
else
  echo "note: mpirun not installed, MPI run skipped"
fi

# 7. ps over mpirun --enable-recovery (without it mpirun ends the whole job when a rank dies):
# kill -9 of a worker: the server sees its process gone at once, drops it, the others finish;
# kill -9 of the server: every worker stops at once with an error naming it (mpirun itself
# exits 0 then: under --enable-recovery Open MPI 4.1 never reports a rank's failure)
mpi_kill_run() {  # LOG RANK: 1 server + 3 workers; kill -9 RANK once the first epoch is reported
  DTRAIN_TEST_JOB=$TMP ASAN_OPTIONS=${DTRAIN_SANITIZED:+detect_leaks=0} timeout 90 mpirun -np 4 --oversubscribe \
    --bind-to none --enable-recovery -x DTRAIN_TEST_JOB $DT train --backend mpi --strategy ps --staleness inf \
    --model mlp --epochs 3 --batch 128 --timeout 60 >"$1" 2>&1 &
  local job=$! e=""
  for _ in $(seq 300); do  # the rank's process: its environment has this job's mark and OMPI_COMM_WORLD_RANK
    e=$(grep -lzx "DTRAIN_TEST_JOB=$TMP" /proc/[0-9]*/environ 2>/dev/null |
        xargs -r grep -lzx "OMPI_COMM_WORLD_RANK=$2" 2>/dev/null | head -1)
    [ -n "$e" ] && break
    sleep 0.1
  done
  for _ in $(seq 300); do grep -q "^epoch 1/3: " "$1" && break; sleep 0.1; done
  victim=${e//[^0-9]/}
  [ -n "$victim" ] && kill -9 "$victim"
  wait $job
}
if command -v mpirun >/dev/null && ! grep -q "built without MPI" "$TMP/mpi.log"; then
  t0=$SECONDS
  mpi_kill_run "$TMP/mpikill.log" 3
  rc=$?
  if [ -n "$victim" ] && [ $rc -eq 0 ] && grep -q "worker rank 3 died at step [0-9]*; continuing with 2 workers" "$TMP/mpikill.log" \
     && ! grep -q "dtrain: error" "$TMP/mpikill.log" && ge "$(acc_of "$TMP/mpikill.log")" 0.80; then
    ok "mpirun --enable-recovery, kill -9 of worker rank 3: $(grep -o 'worker rank 3 died.*' "$TMP/mpikill.log"), test_acc $(acc_of "$TMP/mpikill.log") ($((SECONDS - t0)) s)"
  else bad "mpirun kill -9 of a worker (victim '$victim', exit $rc): $(tail -8 "$TMP/mpikill.log")"; fi
  t0=$SECONDS
  mpi_kill_run "$TMP/mpikill0.log" 0
  rc=$?
  n=$(grep -c "ps worker rank [123]: .*server rank 0: .*world rank 0, pid [0-9]*) is gone" "$TMP/mpikill0.log")
  if [ -n "$victim" ] && [ "$n" -eq 3 ] && [ $((SECONDS - t0)) -lt 50 ] && ! grep -q "done: test accuracy" "$TMP/mpikill0.log"; then
    ok "mpirun --enable-recovery, kill -9 of the server: all 3 workers stop naming it ($((SECONDS - t0)) s, mpirun exit $rc)"
  else bad "mpirun kill -9 of the server (victim '$victim', $n workers said so, exit $rc): $(tail -8 "$TMP/mpikill0.log")"; fi
fi
finish
