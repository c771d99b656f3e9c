# The libFuzzer targets in short form (issue 11): builds them (clang, ASan+UBSan, build-fuzz/) and
# runs each for DTRAIN_FUZZ_SECONDS (default 2; as many at once as there are cores) from its
# committed seeds; a crash, leak or hang (-timeout 10) fails. Runs in the optimized pass only (the
# targets carry their own sanitizers). `make fuzz FUZZ_SECONDS=N` is the long form.
. "$(dirname "$0")/testlib.bash"
ROOT=$(cd "$(dirname "$0")/.." && pwd)
if [ -n "${DTRAIN_SANITIZED:-}" ]; then echo "skip: the fuzz targets run in the optimized pass (they are sanitized builds)"; exit 77; fi
if ! command -v clang >/dev/null || ! ls /usr/lib/llvm-*/lib/clang/*/lib/linux/libclang_rt.fuzzer-x86_64.a >/dev/null 2>&1; then
  echo "skip: clang with libFuzzer not installed (apt-get install clang libclang-rt-14-dev, or scripts/install-deps)"; exit 77
fi
if make -C "$ROOT" --no-print-directory fuzz-build >"$TMP/build.log" 2>&1; then ok "fuzz targets build"
else bad "fuzz targets do not build: $(tail -20 "$TMP/build.log")"; finish; exit 1; fi
targets=$(make -s -C "$ROOT" --no-print-directory print-fuzz-targets)
out=$("$ROOT/tests/fuzz-run" "$ROOT/build-fuzz" "${DTRAIN_FUZZ_SECONDS:-2}" 10 $targets 2>&1)
rc=$?
echo "$out"
[ $rc -eq 0 ] && ok "$(wc -w <<<"$targets") fuzz targets ($targets): no crash, leak or hang" || bad "a fuzz target failed (inputs saved in build-fuzz/)"
finish
