# make demo's build report (scripts/build-quiet): a build of many compiler lines prints a few
# lines, its warnings in full and the log's path; a failed build shows its errors and keeps the
# exit status. And make demo builds the man page that `man -l build/dtrain.1` then reads.
. "$(dirname "$0")/testlib.bash"
ROOT=${DTRAIN_ROOT:-$(cd "$(dirname "$0")/.." && pwd)}
Q="$ROOT/scripts/build-quiet"
unset MAKEFLAGS MFLAGS MAKELEVEL  # run-tests under make test: these makes are our own
# a fake build: 190 compile lines, one warning
{ echo "all:"; for i in $(seq 190); do printf '\t@echo "cc -std=c11 -Wall -c src/f%d.c -o build/obj/f%d.o"\n' "$i" "$i"; done
  printf '\t@echo "src/f7.c:3:5: warning: unused variable x [-Wunused-variable]" >&2\n'
  echo "bad:"; printf '\t@echo "cc -c src/g.c -o g.o"; echo "src/g.c:1:1: error: expected ; before }" >&2; exit 1\n'
} >"$TMP/Makefile"
out=$("$Q" "$TMP/logs/build.log" make -s -C "$TMP" all); rc=$?
lines=$(wc -l <<<"$out")
[ $rc -eq 0 ] && [ "$lines" -le 4 ] && ok "a build of 190 compiler lines reports in $lines lines" || bad "build-quiet (exit $rc): $out"
grep -q "190 files compiled, 1 warnings" <<<"$out" && grep -q "src/f7.c:3:5: warning: unused variable" <<<"$out" \
  && ok "the count and the warning in full" || bad "build-quiet's report: $out"
grep -q "$TMP/logs/build.log" <<<"$out" && [ "$(grep -c -- '-c src/f' "$TMP/logs/build.log")" = 190 ] \
  && ok "the whole output is in the log it names" || bad "the log: $(wc -l <"$TMP/logs/build.log") lines"
out=$("$Q" "$TMP/fail.log" make -s -C "$TMP" bad); rc=$?
[ $rc -ne 0 ] && grep -q "FAILED" <<<"$out" && grep -q "src/g.c:1:1: error: expected ; before }" <<<"$out" \
  && grep -q "$TMP/fail.log" <<<"$out" && ok "a failed build: exit $rc, its error and the log" || bad "failed build (exit $rc): $out"
# make demo builds dtrain.1 (dry run into a fresh build directory: the recipe's commands, nothing built)
make -s -C "$ROOT" -n demo BUILD="$TMP/b" >"$TMP/demo.out" 2>&1
grep -q "dtrain man -o $TMP/b/dtrain.1" "$TMP/demo.out" "$TMP/b/build.log" 2>/dev/null \
  && ok "make demo makes the man page" || bad "make demo does not build $TMP/b/dtrain.1: $(tail -5 "$TMP/demo.out")"
if command -v man >/dev/null && [ -f "$BUILD/dtrain.1" ]; then
  out=$(MANWIDTH=80 man -l "$BUILD/dtrain.1" 2>&1 | grep -c "EXAMPLES")
  [ "$out" -ge 1 ] && ok "man -l $BUILD/dtrain.1 shows the page" || bad "man -l $BUILD/dtrain.1: $out"
fi
finish
