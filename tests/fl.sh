# Federated learning (issue 17) end to end on Fashion-MNIST, small: fl-sim plain and with secure
# aggregation give the same model; faulty clients (killed mid-round, silent, garbage, dropping
# after masking) are logged and the rounds complete; a hostile peer is dropped while the server
# keeps serving; DP reports epsilon; the server is killed mid-run (SIGKILL, at a fixed round), restarted with
# --resume, the fl-client processes reconnect and training finishes; bad flags exit 2.
# Deadlines here are hang guards only; no outcome depends on speed.
. "$(dirname "$0")/testlib.bash"
have_fmnist || { echo "skip: Fashion-MNIST not installed (apt-get install dataset-fashion-mnist)"; exit 77; }
LIMIT=3000; ROUNDS=3; ACC_MIN=0.4
[ -n "${DTRAIN_SANITIZED:-}" ] && { LIMIT=1000; ROUNDS=2; ACC_MIN=0.3; }
SIM=(timeout 300 "$DT" fl-sim --clients 6 --clients-per-round 4 --partition dirichlet:0.5 --train-limit $LIMIT
     --rounds $ROUNDS --lr 0.05 --quiet)

# plain and secure aggregation: the same global model (fixed point to ~1e-8), so the same accuracy
p=$("${SIM[@]}" --checkpoint "$TMP/plain.st" 2>"$TMP/p.err" | tail -1)
s=$("${SIM[@]}" --checkpoint "$TMP/sec.st" --secure-agg 2>"$TMP/s.err" | tail -1)
pa=$(grep -o '"final_acc":[0-9.]*' <<<"$p"); sa=$(grep -o '"final_acc":[0-9.]*' <<<"$s")
if [ -n "$pa" ] && [ "$pa" = "$sa" ] && grep -q '"rounds":'$ROUNDS <<<"$s"; then ok "fl-sim: secure aggregation gives plain FedAvg's model ($pa)"
else bad "fl-sim plain '$p' vs secure '$s': $(tail -3 "$TMP/p.err" "$TMP/s.err")"; fi
acc=$(grep -o '"final_acc":[0-9.]*' <<<"$p" | cut -d: -f2)
python3 -c "import sys; sys.exit(0 if float('${acc:-0}') > $ACC_MIN else 1)" && ok "fl-sim learns (test acc $acc after $ROUNDS rounds)" || bad "fl-sim test acc '$acc'"
b_plain=$(grep -o '"bytes_in_per_update":[0-9]*' <<<"$p" | cut -d: -f2); b_sec=$(grep -o '"bytes_in_per_update":[0-9]*' <<<"$s" | cut -d: -f2)
python3 -c "import sys; sys.exit(0 if 0 < ${b_sec:-0} <= 2 * ${b_plain:-1} else 1)" && ok "secure aggregation bytes per client ${b_sec} <= 2x plain ${b_plain}" || bad "bytes $b_sec vs $b_plain"

# failing clients with secure aggregation: each reason logged, every round completes
out=$("${SIM[@]}" --secure-agg --clients 7 --faults die:1,silent:1,garbage:1,drop-after-mask:1 --clients-per-round 7 \
      --min-clients 3 --round-timeout 3 --sa-threshold 3 2>&1)
if grep -q '"rounds":'$ROUNDS <<<"$out" && grep -q "sent no public keys\|sent no encrypted shares\|sent no masked update\|sent no unmasking" <<<"$out" \
   && grep -q "connection closed" <<<"$out" && grep -q "fl update: .*parameters" <<<"$out"; then ok "rounds complete with killed, silent, garbage and post-mask dropouts (reasons logged)"
else bad "faulty clients: $out"; fi

# DP-FedAvg: epsilon reported and growing
out=$("${SIM[@]}" --dp-clip 1 --dp-noise 1.0 --metrics "$TMP/dp.jsonl" 2>&1)
e1=$(sed -n 1p "$TMP/dp.jsonl" | grep -o '"epsilon":[0-9.e+-]*' | cut -d: -f2); e2=$(tail -1 "$TMP/dp.jsonl" | grep -o '"epsilon":[0-9.e+-]*' | cut -d: -f2)
python3 -c "import sys; sys.exit(0 if 0 < float('${e1:-0}') < float('${e2:-0}') else 1)" && ok "DP-FedAvg reports epsilon per round ($e1 .. $e2 at delta 1e-5)" || bad "DP epsilon '$e1' '$e2': $out"

# bad command lines
expect_fail "fl-client without --server exits 2" "needs --server" "$DT" fl-client --data fashion-mnist
expect_fail "fl-server --listen without a port" "expected HOST:PORT" "$DT" fl-server --listen localhost --rounds 1
expect_fail "fl-sim --partition unknown" "expected iid, shards:S or dirichlet:A" "$DT" fl-sim --clients 4 --clients-per-round 2 --partition zipf:1 --train-limit 500
"$DT" fl-client --server 127.0.0.1:1 --data fashion-mnist --connect-timeout 0.5 >/dev/null 2>&1; rc=$?
[ $rc -eq 75 ] && ok "fl-client gives up on an unreachable server with exit 75" || bad "unreachable server: exit $rc"

# server killed mid-run, restarted with --resume; fl-client processes reconnect and finish
R=4; [ -n "${DTRAIN_SANITIZED:-}" ] && R=3
SRV=(fl-server --clients-per-round 3 --rounds $R --checkpoint "$TMP/g.st"
     --metrics "$TMP/m.jsonl" --round-timeout 60 --wait-timeout 120 --eval-every 100)
# a free port (the restart reuses it); the server SIGKILLs itself right after round 2's checkpoint
DTRAIN_FL_KILL_AFTER_ROUND=2 "$DT" "${SRV[@]}" --listen 127.0.0.1:0 >"$TMP/srv1.log" 2>&1 & spid=$!
for _ in $(seq 600); do grep -q listening "$TMP/srv1.log" && break; sleep 0.1; done
PORT=$(grep -o '(port [0-9]*)' "$TMP/srv1.log" | grep -o '[0-9]*')
# a hostile peer before any client: the server drops it and goes on to serve the clients
( exec 3<>/dev/tcp/127.0.0.1/$PORT && printf 'GET / HTTP/1.0\r\nHost: x\r\n\r\n' >&3 && sleep 0.5 ) 2>/dev/null
cpids=()
ROOT=$(cd "$(dirname "$0")/.." && pwd)
for i in 0 1 2; do
  CL=("$DT" fl-client)  # the stand-alone client of `make client` (no MPI) plays client 2 when built
  [ $i -eq 2 ] && [ -x "$ROOT/build-client/dtrain-fl-client" ] && [ -z "${DTRAIN_SANITIZED:-}" ] && CL=("$ROOT/build-client/dtrain-fl-client")
  timeout 300 "${CL[@]}" --server 127.0.0.1:$PORT --data fashion-mnist --partition iid --clients 30 --client-index $i \
    >"$TMP/c$i.log" 2>&1 & cpids+=($!)
done
wait $spid; krc=$?
done1=$(wc -l <"$TMP/m.jsonl" 2>/dev/null || echo 0)
[ $krc -eq 137 ] && [ "$done1" -eq 2 ] && ok "the server was killed (SIGKILL) after round 2" || bad "server kill: exit $krc after $done1 rounds"
grep -q "dropping peer.*bad magic" "$TMP/srv1.log" && ok "a hostile peer is dropped with a log line" || bad "hostile peer: $(cat "$TMP/srv1.log")"
timeout 300 "$DT" "${SRV[@]}" --listen 127.0.0.1:$PORT --resume >"$TMP/srv2.log" 2>&1; src=$?
crc=0; for p in "${cpids[@]}"; do wait "$p" || crc=$?; done
last=$(tail -1 "$TMP/m.jsonl" | grep -o '"round":[0-9]*' | cut -d: -f2)
if [ $src -eq 0 ] && [ $crc -eq 0 ] && [ "$last" = "$R" ] && grep -q "resumed from .* after round 2" "$TMP/srv2.log" \
   && grep -q '"test_acc":0\.' <(tail -1 "$TMP/m.jsonl"); then
  ok "server killed after round $done1, resumed; 3 fl-client processes reconnected; round $R done"
else bad "resume: server $src clients $crc last round '$last' (killed after $done1): $(cat "$TMP/srv2.log" "$TMP"/c*.log | tail -20)"; fi
python3 -c "import json,sys; [json.loads(l) for l in open(sys.argv[1])]" "$TMP/m.jsonl" 2>/dev/null && ok "every --metrics line is JSON" || bad "metrics not JSON: $(cat "$TMP/m.jsonl")"
grep -q "reconnecting" "$TMP/c0.log" && ok "the client logged its reconnect" || bad "no reconnect line: $(cat "$TMP/c0.log")"
finish
