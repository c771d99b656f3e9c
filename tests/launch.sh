#!/usr/bin/env bash
# Integration test of `dtrain launch`: rank environment, prefixed whole-line output, stop on the
# first failing rank (exit status and message), signal forwarding, grace -> SIGKILL, timeout,
# shared-memory cleanup and no leftover processes. Usage: bash tests/launch.sh BUILDDIR
set -u
BUILD=${1:-build}
DT="$BUILD/dtrain"
[ -x "$DT" ] || { echo "FAIL: $DT not built"; exit 1; }
T=$(mktemp -d)
MARK="29.$$"   # unique sleep duration: finds leftover processes of this test
trap 'rm -rf "$T" /dev/shm/dtrain-lt$$*' EXIT
fails=0 checks=0
ok() { checks=$((checks + 1)); if eval "$1"; then :; else fails=$((fails + 1)); echo "FAIL: $2"; fi; }
leftovers() { pgrep -f "sleep $MARK" | wc -l; }

# 1. rank environment for N=1 and N=3; the launcher pid is the ranks' parent; ids agree
for N in 1 3; do
  "$DT" launch -n $N -- sh -c 'echo "env $DTRAIN_RANK $DTRAIN_WORLD_SIZE $DTRAIN_LOCAL_RANK $DTRAIN_LOCAL_WORLD_SIZE $DTRAIN_JOB_ID $([ "$DTRAIN_LAUNCHER_PID" = "$PPID" ] && echo ppid-ok)"' >"$T/env$N" 2>&1
  ok "[ $? -eq 0 ]" "launch -n $N exit status"
  for ((r = 0; r < N; r++)); do
    ok "grep -Eq '^\[$r\] env $r $N $r $N [0-9a-f]{16} ppid-ok$' '$T/env$N'" "rank $r of $N environment: $(cat "$T/env$N")"
  done
  ok "[ \$(awk '{print \$7}' '$T/env$N' | sort -u | wc -l) -eq 1 ]" "one job id per launch (N=$N)"
  ok "[ \$(wc -l <'$T/env$N') -eq $N ]" "exactly $N lines for N=$N"
done
ok "[ \"\$(awk '{print \$7}' '$T/env1' | head -1)\" != \"\$(awk '{print \$7}' '$T/env3' | head -1)\" ]" "job ids differ between launches"

# MPI/Slurm rank variables of an enclosing mpirun/srun do not leak into the local ranks
PMI_RANK=5 OMPI_COMM_WORLD_RANK=5 OMPI_COMM_WORLD_SIZE=8 SLURM_PROCID=5 "$DT" launch -n 2 -- \
  sh -c 'echo "vars ${PMI_RANK:-u}${OMPI_COMM_WORLD_RANK:-u}${OMPI_COMM_WORLD_SIZE:-u}${SLURM_PROCID:-u} $DTRAIN_RANK"' >"$T/nest" 2>&1
ok "grep -qx '\[0\] vars uuuu 0' '$T/nest' && grep -qx '\[1\] vars uuuu 1' '$T/nest' && grep -q 'started by mpirun/srun' '$T/nest'" "launcher strips mpirun/srun rank variables: $(cat "$T/nest")"

# binding: each of N <= CPUs ranks gets a slice of the launcher's CPUs of its own (two ranks of a
# synchronous job never share a core); more ranks than CPUs, or DTRAIN_BIND=none, leave the OS to
# place them; another DTRAIN_BIND value is refused with the choices
cpus() { "$DT" launch -n "$1" -- sh -c 'grep Cpus_allowed_list /proc/self/status' 2>&1 | sort | awk '{print $NF}' | tr '\n' ' '; }
all=$(sh -c 'grep Cpus_allowed_list /proc/self/status' | awk '{print $NF}') nc=$(nproc)
if [ "$nc" -ge 2 ]; then
  b=$(cpus 2)
  ok "[ \$(echo $b | wc -w) -eq 2 ] && [ \"\$(echo $b | cut -d' ' -f1)\" != \"\$(echo $b | cut -d' ' -f2)\" ] && [ \"\$(echo $b | cut -d' ' -f1)\" != '$all' ]" "2 ranks on $nc CPUs bound apart: $b (all: $all)"
  b=$(DTRAIN_BIND=none cpus 2)
  ok "[ \"$b\" = \"$all $all \" ]" "DTRAIN_BIND=none leaves every CPU to both ranks: $b"
  b=$(cpus $((nc + 1)))
  ok "[ \$(echo $b | tr ' ' '\\n' | sort -u) = '$all' ]" "$((nc + 1)) ranks on $nc CPUs are not bound: $b"
else echo "note: one CPU, the binding checks are skipped"; fi
out=$(DTRAIN_BIND=cores "$DT" launch -n 2 -- true 2>&1)
ok "[ $? -ne 0 ] && grep -q 'DTRAIN_BIND=cores: use core' <<<\"\$out\"" "DTRAIN_BIND=cores refused: $out"

# 2. prefixes and whole lines: lines written in pieces, on stdout and stderr, plus a long line
#    and a partial last line; every line must come out intact with its own rank's prefix
cat >"$T/talk.sh" <<'EOF'
r=$DTRAIN_RANK; i=0
long=$(printf '%*s' 5000 '' | tr ' ' L)
while [ $i -lt 200 ]; do
  printf 'r%s:%s:' "$r" "$i"; printf 'abcdefghij%s\n' "$r"
  printf 'e%s:%s:xyz\n' "$r" "$i" >&2
  i=$((i + 1))
done
echo "r$r:long:$long"
printf 'r%s:tail-without-newline' "$r"
EOF
"$DT" launch -n 3 -- sh "$T/talk.sh" >"$T/out" 2>"$T/err"
ok "[ $? -eq 0 ]" "talk exit status"
for r in 0 1 2; do
  ok "[ \$(grep -Ec '^\[$r\] r$r:[0-9]+:abcdefghij$r$' '$T/out') -eq 200 ]" "200 intact stdout lines of rank $r"
  ok "[ \$(grep -Ec '^\[$r\] e$r:[0-9]+:xyz$' '$T/err') -eq 200 ]" "200 intact stderr lines of rank $r"
  ok "grep -Eq '^\[$r\] r$r:long:L{5000}$' '$T/out'" "long line of rank $r intact"
  ok "grep -qx '\[$r\] r$r:tail-without-newline' '$T/out'" "partial last line of rank $r flushed"
done
ok "[ \$(wc -l <'$T/out') -eq 606 ] && [ \$(wc -l <'$T/err') -eq 600 ]" "no extra or split lines ($(wc -l <"$T/out") out, $(wc -l <"$T/err") err)"
ok "! grep -Ev '^\[[0-2]\] ' '$T/out' '$T/err' | grep -q ." "every line has a rank prefix"
"$DT" launch -n 2 echo --passed-through >"$T/pt" 2>&1
ok "[ \$(grep -c -- '--passed-through' '$T/pt') -eq 2 ]" "program flags after PROGRAM reach the ranks"

# 3. a failing rank stops the others (children of ranks included), exit status and message. With
# a 60 s grace, "stopped by SIGTERM, not by the SIGKILL after the grace" is what the launcher says
# (no wall-clock assertion: a loaded machine only makes it slower)
"$DT" launch -n 4 --grace 60 -- sh -c '[ $DTRAIN_RANK = 2 ] && { sleep 0.2; exit 3; }; sleep '$MARK'; echo never' >"$T/f3" 2>&1
rc=$?
ok "[ $rc -eq 3 ]" "exit status of a failing rank (got $rc)"
ok "grep -qx 'dtrain launch: rank 2 exited with status 3; stopping 3 other ranks' '$T/f3'" "failure message: $(cat "$T/f3")"
ok "! grep -q never '$T/f3'" "other ranks did not finish"
ok "! grep -q 'sending SIGKILL' '$T/f3'" "the others stopped on SIGTERM, before the grace ran out"
ok "[ \$(leftovers) -eq 0 ]" "no leftover processes after a failure"

"$DT" launch -n 2 -- sh -c '[ $DTRAIN_RANK = 1 ] && { sleep 0.2; kill -9 $$; }; sleep '$MARK >"$T/f9" 2>&1
rc=$?
ok "[ $rc -eq 137 ]" "exit status 128+9 for a killed rank (got $rc)"
ok "grep -qx 'dtrain launch: rank 1 was killed by signal 9 (SIGKILL); stopping 1 other rank' '$T/f9'" "signal message: $(cat "$T/f9")"

# 4. a rank that ignores SIGTERM is killed after the grace period
"$DT" launch -n 2 --grace 0.5 -- sh -c '[ $DTRAIN_RANK = 0 ] && { sleep 0.3; exit 1; }; trap "" TERM; sleep '$MARK >"$T/g" 2>&1
rc=$?
ok "[ $rc -eq 1 ] && grep -q 'sending SIGKILL' '$T/g'" "grace period then SIGKILL (rc $rc): $(cat "$T/g")"
ok "[ \$(leftovers) -eq 0 ]" "no leftover processes after SIGKILL"

# 5. SIGTERM (and SIGINT) to the launcher stops every rank promptly
for sig in TERM INT; do
  "$DT" launch -n 3 --grace 60 -- sh -c 'sleep '$MARK'; echo never' >"$T/s$sig" 2>&1 &
  pid=$!
  sleep 0.3
  kill -$sig $pid
  wait $pid
  rc=$?
  want=$((128 + $(kill -l $sig)))
  ok "[ $rc -eq $want ]" "launcher exit status after SIG$sig (got $rc, want $want)"
  ok "grep -qx 'dtrain launch: got SIG$sig; stopping 3 ranks' '$T/s$sig'" "SIG$sig message: $(cat "$T/s$sig")"
  ok "! grep -q 'sending SIGKILL' '$T/s$sig' && ! grep -q never '$T/s$sig'" "ranks stopped on SIG$sig, before the grace ran out"
  ok "[ \$(leftovers) -eq 0 ]" "no leftover processes after SIG$sig"
done

# 6. timeout, missing program, usage errors
"$DT" launch -n 2 --timeout 0.3 -- sleep $MARK >"$T/to" 2>&1
rc=$?
ok "[ $rc -eq 124 ] && grep -q 'timeout after 0.3 s' '$T/to'" "timeout exit 124 (got $rc): $(cat "$T/to")"
"$DT" launch -n 2 -- /nonexistent/prog >"$T/ne" 2>&1
rc=$?
ok "[ $rc -eq 127 ] && grep -q \"cannot run '/nonexistent/prog'\" '$T/ne'" "missing program (rc $rc): $(cat "$T/ne")"
"$DT" launch -- true >"$T/u" 2>&1
ok "[ $? -ne 0 ] && grep -q 'missing -n N' '$T/u'" "missing -n is an error"
"$DT" launch -n 0 -- true >"$T/n0" 2>&1
ok "[ $? -eq 2 ] && grep -q -- '-n 0: need at least 1 rank' '$T/n0'" "-n 0 is a bad value, not a missing flag: $(cat "$T/n0")"

# 7. leftover shared memory of the job is removed, other jobs' is kept; job id "data" does not
#    touch the data-set cache (/dev/shm/dtrain-data-<key>.v1)
J=lt$$
touch /dev/shm/dtrain-${J}x-keep /dev/shm/dtrain-$J-notours
"$DT" launch -n 2 --job-id $J -- sh -c 'touch /dev/shm/dtrain-$DTRAIN_JOB_ID /dev/shm/dtrain-$DTRAIN_JOB_ID.3.$DTRAIN_RANK' >"$T/shm" 2>&1
ok "[ $? -eq 0 ]" "shm job exit status"
ok "[ ! -e /dev/shm/dtrain-$J ] && [ ! -e /dev/shm/dtrain-$J.3.0 ] && [ ! -e /dev/shm/dtrain-$J.3.1 ]" "job shm removed (split segments too)"
ok "[ -e /dev/shm/dtrain-${J}x-keep ] && [ -e /dev/shm/dtrain-$J-notours ]" "other names kept"
rm -f /dev/shm/dtrain-${J}x-keep /dev/shm/dtrain-$J-notours
CACHE=/dev/shm/dtrain-data-lt$$.v1
touch "$CACHE"
"$DT" launch -n 1 --job-id data -- true >"$T/data" 2>&1
ok "[ $? -eq 0 ] && [ -e '$CACHE' ]" "--job-id data keeps the data-set cache: $(cat "$T/data")"
rm -f "$CACHE"
"$DT" launch -n 1 --job-id data-x -- true >"$T/dash" 2>&1
ok "[ $? -ne 0 ] && grep -q \"job id 'data-x'\" '$T/dash'" "job id with '-' rejected: $(cat "$T/dash")"

# 8. the culprit is named: rank 1 exits 75 (stopped because a peer failed) just before rank 0
#    is killed; the launcher blames rank 0
"$DT" launch -n 2 -- sh -c '[ $DTRAIN_RANK = 1 ] && { sleep 0.2; exit 75; }; sleep 0.3; kill -9 $$' >"$T/cul" 2>&1
rc=$?
ok "[ $rc -eq 137 ] && grep -q 'rank 0 was killed by signal 9' '$T/cul'" "culprit named (rc $rc): $(cat "$T/cul")"

# 9. inside an sbatch script (SLURM_PROCID without SLURM_NTASKS) --workers still starts ranks;
#    a set-up error exits 78 and --elastic does not restart it
SLURM_PROCID=0 "$DT" train --workers 2 --data /nonexistent/dt-data --model mlp >"$T/sb" 2>&1
rc=$?
ok "[ $rc -eq 78 ] && grep -q 'exited with status 78' '$T/sb' && grep -q 'no such data set' '$T/sb'" "sbatch --workers 2, bad data -> 78 (rc $rc): $(cat "$T/sb")"
SLURM_PROCID=0 "$DT" train --workers 2 --data /nonexistent/dt-data --model mlp --elastic 1:2 --checkpoint-dir "$T/ck" \
  --checkpoint-every 10 >"$T/el" 2>&1
rc=$?
ok "[ $rc -eq 78 ] && grep -q 'not restarting' '$T/el' && ! grep -q 'restart 1 of' '$T/el'" "elastic does not restart a config error (rc $rc): $(cat "$T/el")"

echo "launch: $checks checks, $fails failures"
[ $fails -eq 0 ]
