# The federated-learning protocol's libFuzzer target (fuzz/fuzz_fl.c, issue 17) in short form:
# builds the fuzz targets (clang, ASan+UBSan, build-fuzz/) and runs fuzz_fl for
# DTRAIN_FUZZ_SECONDS (default 4) from its committed seeds (fuzz/corpus/fl); a crash, leak or
# hang (-timeout 10) fails. Optimized pass only (the target carries its own sanitizers).
. "$(dirname "$0")/testlib.bash"
ROOT=$(cd "$(dirname "$0")/.." && pwd)
if [ -n "${DTRAIN_SANITIZED:-}" ]; then echo "skip: the fuzz targets run in the optimized pass (they are sanitized builds)"; exit 77; fi
if ! command -v clang >/dev/null || ! ls /usr/lib/llvm-*/lib/clang/*/lib/linux/libclang_rt.fuzzer-x86_64.a >/dev/null 2>&1; then
  echo "skip: clang with libFuzzer not installed (apt-get install clang libclang-rt-14-dev, or scripts/install-deps)"; exit 77
fi
if make -C "$ROOT" --no-print-directory fuzz-build >"$TMP/build.log" 2>&1; then ok "fuzz targets build"
else bad "fuzz targets do not build: $(tail -20 "$TMP/build.log")"; finish; exit 1; fi
out=$("$ROOT/tests/fuzz-run" "$ROOT/build-fuzz" "${DTRAIN_FUZZ_SECONDS:-4}" 10 fl 2>&1)
rc=$?
echo "$out"
[ $rc -eq 0 ] && ok "fuzz_fl: no crash, leak or hang" || bad "fuzz_fl failed (inputs saved in build-fuzz/)"
finish
