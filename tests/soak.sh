# Fault-injection soak (issue 11): runs short training jobs under ddp, localsgd, ps and --elastic
# and hits each at a random time with kill -9, SIGSTOP or SIGTERM of a worker (or a ps server), or
# SIGTERM/kill -9 of the launcher. Each run must finish (exit 0) or stop with a report that names
# the culprit (the rank it hit, never another one), within its deadline (no hang); every
# checkpoint it left must load; its metrics must hold no epoch twice; and no shared-memory segment
# of its job may be left in /dev/shm. Short in make test (6 runs); `tests/soak.sh --runs 50
# [--seed S]` for the long one. Prints one line per run and a summary.
. "$(dirname "$0")/testlib.bash"
RUNS=6 SEED=${DTRAIN_SOAK_SEED:-$$}
while [ $# -gt 0 ]; do
  case $1 in
    --runs) RUNS=$2; shift 2 ;;
    --seed) SEED=$2; shift 2 ;;
    /*|build*) shift ;;  # the build directory (run-tests passes it)
    *) echo "usage: soak.sh [BUILD] [--runs N] [--seed S]"; exit 2 ;;
  esac
done
[ -n "${DTRAIN_SANITIZED:-}" ] && RUNS=$(( RUNS < 3 ? RUNS : 3 ))
RANDOM=$SEED
echo "soak: $RUNS runs, seed $SEED"
# 3000 samples of 16 features, 4 classes: an epoch of 2 workers x 8 is 188 steps of a 70k-parameter
# MLP, a run a few seconds (long enough for the fault to land while it trains)
awk 'BEGIN { srand(7); for (i = 0; i < 3000; i++) { y = i % 4; printf "%d", y; for (k = 0; k < 16; k++) printf ",%.3f", rand() + (k % 4 == y); printf "\n" } }' >"$TMP/train.csv"
MODEL="linear(256) relu linear(256) relu linear(4)"
hangs=0 wrong=0 lost=0 dup=0 leaked=0 done_ok=0 stopped_ok=0 landed=0 orphans=0 launcher_gone=0
rank_pid() {  # LAUNCHER-PID RANK: pid of the child with DTRAIN_RANK=RANK
  local c
  for c in $(pgrep -P "$1"); do
    tr '\0' '\n' 2>/dev/null <"/proc/$c/environ" | grep -qx "DTRAIN_RANK=$2" && { echo "$c"; return 0; }
  done
  return 1
}
shm_of_us() {  # dtrain job segments in /dev/shm that no process maps (leftovers), among those new since $1
  local f
  for f in $(cd /dev/shm && ls -1 2>/dev/null | grep -E '^dtrain-[0-9a-f]{16}(\.|$)'); do
    [ "/dev/shm/$f" -nt "$1" ] || continue
    grep -qs "/dev/shm/$f" /proc/[0-9]*/maps || echo "$f"
  done
}
for run in $(seq "$RUNS"); do
  modes=(ddp localsgd ps elastic); mode=${modes[RANDOM % 4]}
  faults=(kill9 stop term term-launcher kill9-launcher); fault=${faults[RANDOM % 5]}
  delay=$(printf '0.%02d' $((RANDOM % 100)))
  D="$TMP/r$run"; mkdir -p "$D"; M="$TMP/m$run.jsonl"; L="$TMP/log$run"
  args=(train --data "$TMP/train.csv" --model "$MODEL" --batch 8 --epochs 12 --quiet --timeout 5 --metrics "$M")
  nranks=2 victim_rank=$((RANDOM % 2))
  case $mode in
    ddp) args+=(--workers 2 --checkpoint-dir "$D/ck" --checkpoint-every 200 --keep 3) ;;
    localsgd) args+=(--workers 2 --strategy localsgd --sync-every 4 --checkpoint-dir "$D/ck" --checkpoint-every 200 --keep 3) ;;
    ps) args+=(--workers 2 --strategy ps --save "$D/ps.st"); nranks=3 victim_rank=$((RANDOM % 3)) ;;  # rank 0 serves
    elastic) args+=(--workers 2 --elastic 1:2 --checkpoint-dir "$D/ck" --checkpoint-every 200 --keep 3) ;;
  esac
  stamp="$TMP/stamp$run"; touch "$stamp"; sleep 0.01
  t0=$SECONDS
  timeout -k 5 150 $DT "${args[@]}" >"$L" 2>&1 &
  job=$!
  launcher=""
  for _ in $(seq 400); do
    launcher=$(pgrep -P $job | head -1)
    [ -n "$launcher" ] && [ "$(pgrep -c -P "$launcher")" -ge "$nranks" ] && break
    sleep 0.05
  done
  sleep "$delay"
  victim=$([ -n "$launcher" ] && rank_pid "$launcher" $victim_rank)
  ranks=$([ -n "$launcher" ] && pgrep -P "$launcher" | tr '\n' ' ')
  hit=""
  case $fault in
    kill9) [ -n "$victim" ] && kill -9 "$victim" 2>/dev/null && hit=1 ;;
    stop) [ -n "$victim" ] && kill -STOP "$victim" 2>/dev/null && hit=1 ;;
    term) [ -n "$victim" ] && kill -TERM "$victim" 2>/dev/null && hit=1 ;;
    term-launcher) [ -n "$launcher" ] && kill -TERM "$launcher" 2>/dev/null && hit=1 ;;
    kill9-launcher) [ -n "$launcher" ] && kill -9 "$launcher" 2>/dev/null && hit=1 ;;
  esac
  [ -n "$hit" ] && landed=$((landed + 1))
  wait $job
  rc=$?
  [ "$fault" = stop ] && [ -n "$victim" ] && kill -CONT "$victim" 2>/dev/null
  sleep 0.3
  case $fault in *launcher) what="$mode/$fault" ;; *) what="$mode/$fault${victim:+ rank $victim_rank}" ;; esac
  [ -z "$hit" ] && what="$what (missed: the job had ended)"
  verdict=ok why=""
  # a hang is the 150 s deadline (exit 137 alone is a rank killed by SIGKILL, passed on)
  if [ $((SECONDS - t0)) -ge 149 ]; then verdict=FAIL why="hang (no end within 150 s, exit $rc)"; hangs=$((hangs + 1))
  elif [ "$fault" = kill9-launcher ] && [ -n "$hit" ]; then
    # the launcher is gone: its ranks must notice and end (no orphan keeps training or holds memory)
    for _ in $(seq 100); do
      alive=""; for p in $ranks; do kill -0 "$p" 2>/dev/null && alive="$alive $p"; done
      [ -z "$alive" ] && break; sleep 0.1
    done
    if [ -n "$alive" ]; then verdict=FAIL why="launcher killed, ranks still running 10 s later:$alive"; orphans=$((orphans + 1)); kill -9 $alive 2>/dev/null
    else launcher_gone=$((launcher_gone + 1)); why="launcher killed (exit $rc); its ranks ended"; fi
  elif [ $rc -ne 0 ]; then
    # a failed job must blame the rank that was hit, and no other
    blamed=$(grep -oE "^dtrain train: rank [0-9]+ (was killed|is stopped|exited|failed)" "$L" | head -1 | grep -oE "rank [0-9]+" | grep -oE "[0-9]+")
    if [ -z "$victim" ] || [ "$blamed" = "$victim_rank" ] || { [ "$mode" = ps ] && grep -q "rank $victim_rank\b" "$L"; }; then
      stopped_ok=$((stopped_ok + 1)); why="stopped, exit $rc, names rank ${blamed:-$victim_rank}"
    else verdict=FAIL why="exit $rc blames rank '${blamed}' but rank $victim_rank was hit"; wrong=$((wrong + 1)); fi
  else
    done_ok=$((done_ok + 1)); why="exit $rc$(grep -q 'dtrain: done:' "$L" && echo ", trained to the end")"
  fi
  for f in "$D"/ck/ckpt-*.safetensors "$D/ps.st"; do
    [ -f "$f" ] || continue
    $DT eval --checkpoint "$f" --data "$TMP/train.csv" >/dev/null 2>&1 || { verdict=FAIL why="$why; damaged checkpoint $(basename "$f")"; lost=$((lost + 1)); }
  done
  ls "$D"/ck/*.tmp.* >/dev/null 2>&1 && [ "$fault" != kill9-launcher ] && { verdict=FAIL why="$why; temp file left"; lost=$((lost + 1)); }
  if [ -f "$M" ] && ! python3 -c "import json,sys; e=[json.loads(l)['epoch'] for l in open('$M')]; sys.exit(0 if len(e) == len(set(e)) else 1)"; then
    verdict=FAIL why="$why; an epoch twice in the metrics"; dup=$((dup + 1))
  fi
  left=$(shm_of_us "$stamp")
  [ -n "$left" ] && { verdict=FAIL why="$why; left in /dev/shm: $left"; leaked=$((leaked + 1)); }
  printf '%-4s run %2d %-32s after %ss: %s (%ds)\n' "$verdict" "$run" "$what" "$delay" "$why" $((SECONDS - t0))
  [ "$verdict" = ok ] && ok "soak run $run $what" || { bad "soak run $run $what"; tail -5 "$L" | sed 's/^/      /'; }
done
echo "soak: $RUNS runs (seed $SEED), $landed faults landed while the job ran: $done_ok finished, $stopped_ok stopped naming the culprit, $launcher_gone lost their launcher (kill -9) and ended; $hangs hangs, $wrong wrong culprits, $orphans orphaned ranks, $lost damaged checkpoints, $dup duplicated metrics, $leaked shm leftovers"
finish
