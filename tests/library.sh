# The library as an embedder meets it: dtrain/dtrain.h includes every public header, and a
# program that includes only it (tests/tools/embed_check.c: dt_model_build, a trainer, evaluation)
# compiles as C11 and as C++17 with -Wall -Wextra -Werror, links against libdtrain.a and keeps
# the contracts docs/library.md states (dt_model_build initialises; dt_trainer_evaluate without a
# test set is an error). docs/library.md documents every public function with its signature and
# contract, and shows examples/custom_loop.c as it is (scripts/library-ref --check).
. "$(dirname "$0")/testlib.bash"
ROOT=${DTRAIN_ROOT:-$(cd "$(dirname "$0")/.." && pwd)}
[ -f "$BUILD/libdtrain.a" ] || { echo "skip: $BUILD/libdtrain.a is not built"; exit 77; }
SANFLAGS=""; [ -n "${DTRAIN_SANITIZED:-}" ] && SANFLAGS="-fsanitize=address,undefined"

# ---- dtrain/dtrain.h includes every public header ----
missing=""
for h in "$ROOT"/include/dtrain/*.h; do
  b=$(basename "$h"); [ "$b" = dtrain.h ] && continue
  grep -q "^#include \"dtrain/$b\"" "$ROOT/include/dtrain/dtrain.h" || missing+=" $b"
done
[ -z "$missing" ] && ok "dtrain/dtrain.h includes all $(ls "$ROOT"/include/dtrain/*.h | wc -l) public headers" \
  || bad "dtrain/dtrain.h does not include:$missing"

# ---- a program that includes only dtrain/dtrain.h, as C and as C++ ----
TREE=(); [ -n "${DTRAIN_SANITIZED:-}" ] && TREE=(SAN=1 OPT=-O1)  # the sanitizer tree's configuration (test-asan's)
LIBS=$(make -s -C "$ROOT" BUILD="$BUILD" "${TREE[@]}" print-ldlibs)
cp "$ROOT/tests/tools/embed_check.c" "$TMP/embed.c"; cp "$TMP/embed.c" "$TMP/embed.cpp"
if cc -std=c11 -Wall -Wextra -Werror $SANFLAGS -I"$ROOT/include" "$TMP/embed.c" "$BUILD/libdtrain.a" $LIBS -o "$TMP/embed-c" \
   2>"$TMP/cc.log"; then ok "a program including only dtrain/dtrain.h compiles as C11 with -Werror"
else bad "C11 compile: $(head -20 "$TMP/cc.log")"; fi
if g++ -std=c++17 -Wall -Wextra -Werror $SANFLAGS -I"$ROOT/include" "$TMP/embed.cpp" "$BUILD/libdtrain.a" $LIBS \
   -o "$TMP/embed-cxx" 2>"$TMP/cxx.log"; then ok "the same program compiles as C++17 with -Werror"
else bad "C++17 compile: $(head -20 "$TMP/cxx.log")"; fi
for p in embed-c embed-cxx; do
  [ -x "$TMP/$p" ] || continue
  out=$("$TMP/$p" 2>&1); rc=$?
  while IFS= read -r line; do
    case $line in ok:*) ok "$p ${line#ok: }" ;; FAIL:*) bad "$p ${line#FAIL: }" ;; esac
  done <<<"$out"
  [ $rc -eq 0 ] && grep -q "^ok:" <<<"$out" || bad "$p exited $rc: $(tail -5 <<<"$out")"
done

# ---- dtrain --version reports the library's version (dt_version) ----
ver=$(sed -n 's/^#define DTRAIN_VERSION "\(.*\)"/\1/p' "$ROOT/include/dtrain/dtrain.h")
out=$($DT --version 2>&1)
[ "$out" = "dtrain $ver" ] && ok "dtrain --version prints '$out'" || bad "dtrain --version printed '$out', not 'dtrain $ver'"

# ---- docs/library.md: every public function, with its signature and contract ----
out=$(python3 "$ROOT/scripts/library-ref" --check "$ROOT" 2>&1) && ok "docs/library.md: $out" || bad "$out"
finish
