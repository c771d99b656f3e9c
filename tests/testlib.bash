# Shared helpers for the integration scripts: build dir, temp dir, check/expect functions and a
# pass/fail tally. Source it; call `finish` at the end.
set -u
BUILD=${1:-${DTRAIN_BUILD:-build}}
DT="$BUILD/dtrain"
TMP=$(mktemp -d /tmp/dtrain-test.XXXXXX)
export DTRAIN_TOOLS="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/tools"  # tests/tools: helpers the scripts share
trap 'rm -rf "$TMP"' EXIT
checks=0
fails=0

ok() { checks=$((checks + 1)); echo "ok: $*"; }
bad() { checks=$((checks + 1)); fails=$((fails + 1)); echo "FAIL: $*"; }
# expect_fail NAME NEEDLE CMD...: CMD must exit non-zero and print NEEDLE (stdout or stderr).
expect_fail() {
  local name=$1 needle=$2; shift 2
  local out rc
  out=$("$@" 2>&1); rc=$?
  if [ $rc -ne 0 ] && grep -qF -- "$needle" <<<"$out"; then ok "$name"
  else bad "$name (exit $rc, wanted '$needle'): $out"; fi
}
have_fmnist() { [ -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]; }
finish() {
  echo "$(basename "$0" .sh): $checks checks, $fails failures"
  [ $fails -eq 0 ]
}

# wait_rank_pid LAUNCHER-PID SLOT [NOT-PID]: the pid of the launcher's child whose environment says
# DTRAIN_RANK=SLOT (and that is not NOT-PID: a replacement after a kill); waits up to 60 s for it,
# looking every 20 ms (a replacement rank can finish a short job within 100 ms on a fast CPU)
wait_rank_pid() {
  local i c
  for i in $(seq 3000); do
    for c in $(pgrep -P "$1"); do
      [ "$c" = "${3:-}" ] && continue
      tr '\0' '\n' 2>/dev/null <"/proc/$c/environ" | grep -qx "DTRAIN_RANK=$2" && { echo "$c"; return 0; }
    done
    sleep 0.02
  done
  return 1
}
