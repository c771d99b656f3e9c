# make install into a temporary prefix: the command, headers, static and shared libraries (with
# a SONAME and its version), dtrain.pc. Outside the tree an example compiles with
# `cc ex.c $(pkg-config --cflags --libs dtrain)` against the shared library and, statically,
# against libdtrain.a; one example compiles as C++ (the headers are usable from C++).
. "$(dirname "$0")/testlib.bash"
ROOT=${DTRAIN_ROOT:-$(cd "$(dirname "$0")/.." && pwd)}
command -v pkg-config >/dev/null || { echo "skip: pkg-config is missing (apt-get install pkg-config)"; exit 77; }
P="$TMP/prefix"
SANFLAGS=""; [ -n "${DTRAIN_SANITIZED:-}" ] && SANFLAGS="-fsanitize=address,undefined"
# the tree's own configuration: the sanitizer tree is make test-asan's (a make without it would
# rebuild that tree as another, e.g. with the cuda device the sanitizer build leaves out)
TREE=(); [ -n "${DTRAIN_SANITIZED:-}" ] && TREE=(SAN=1 OPT=-O1)
if make -s -C "$ROOT" BUILD="$BUILD" "${TREE[@]}" PREFIX="$P" install >"$TMP/install.log" 2>&1; then ok "make install PREFIX=$P"
else bad "make install: $(tail -5 "$TMP/install.log")"; fi
for f in bin/dtrain include/dtrain/dtrain.h include/dtrain/launch.h include/dtrain/train_options.h lib/libdtrain.a lib/libdtrain.so \
         lib/pkgconfig/dtrain.pc share/man/man1/dtrain.1; do
  [ -e "$P/$f" ] && ok "installed $f" || bad "missing $P/$f"
done
ver=$(sed -n 's/^#define DTRAIN_VERSION "\(.*\)"/\1/p' "$ROOT/include/dtrain/dtrain.h")
[ -f "$P/lib/libdtrain.so.$ver" ] && [ "$(readlink "$P/lib/libdtrain.so")" = "libdtrain.so.${ver%%.*}" ] \
  && ok "libdtrain.so -> libdtrain.so.${ver%%.*} -> libdtrain.so.$ver" || bad "shared library links: $(ls -l "$P/lib")"
soname=$(readelf -d "$P/lib/libdtrain.so.$ver" | sed -n 's/.*SONAME.*\[\(.*\)\]/\1/p')
[ "$soname" = "libdtrain.so.${ver%%.*}" ] && ok "SONAME $soname" || bad "SONAME '$soname'"
export PKG_CONFIG_PATH="$P/lib/pkgconfig"
[ "$(pkg-config --modversion dtrain)" = "$ver" ] && ok "pkg-config --modversion dtrain = $ver" || bad "pkg-config version"

# outside the tree: a copy of the graph example (no data set needed) and the loop example
mkdir -p "$TMP/user" && cp "$ROOT/examples/graph.c" "$ROOT/examples/loop.c" "$TMP/user/"
cd "$TMP/user" || exit 1
if cc $SANFLAGS graph.c $(pkg-config --cflags --libs dtrain) -lm -o graph-shared 2>"$TMP/cc.log"; then
  ok "cc graph.c \$(pkg-config --cflags --libs dtrain)"
  readelf -d graph-shared | grep -q "NEEDED.*libdtrain.so.${ver%%.*}" && ok "the program needs libdtrain.so.${ver%%.*}" \
    || bad "graph-shared does not link libdtrain.so.${ver%%.*}"
  out=$(LD_LIBRARY_PATH="$P/lib" ./graph-shared 2>&1) && grep -q train_acc= <<<"$out" && ok "shared build runs" \
    || bad "shared build: $out"
else bad "shared compile: $(cat "$TMP/cc.log")"; fi
# static: the same flags with libdtrain.a in place of -ldtrain (its dependencies from Libs.private)
libs=$(pkg-config --static --libs dtrain | sed 's/-ldtrain/-l:libdtrain.a/')
if cc $SANFLAGS graph.c $(pkg-config --cflags dtrain) $libs -lm -o graph-static 2>"$TMP/cc.log"; then
  ok "static link with pkg-config --static"
  readelf -d graph-static | grep -q "libdtrain" && bad "graph-static still needs libdtrain.so" || ok "static build needs no libdtrain.so"
  out=$(./graph-static 2>&1) && grep -q train_acc= <<<"$out" && ok "static build runs" || bad "static build: $out"
else bad "static compile: $(cat "$TMP/cc.log")"; fi
# C++: the loop example (launcher, comm, nn, optim, data headers) as C++17
cp loop.c loop.cpp
if g++ -std=c++17 -Wall -Wextra $SANFLAGS loop.cpp $(pkg-config --cflags --libs dtrain) -o loop-cxx 2>"$TMP/cxx.log"; then
  ok "examples/loop.c compiles as C++17"
  have_fmnist && { out=$(LD_LIBRARY_PATH="$P/lib" ./loop-cxx 2 4 2>&1) && grep -q "workers=2 steps=4" <<<"$out" \
    && ok "the C++ build runs on 2 workers" || bad "C++ build: $out"; }
else bad "C++ compile: $(cat "$TMP/cxx.log")"; fi
# every installed header on its own, as C++ and as C (each includes what it needs)
hdr_bad=""
for h in "$P"/include/dtrain/*.h; do
  printf '#include <dtrain/%s>\nint main(void) { return 0; }\n' "$(basename "$h")" >h.cpp
  cp h.cpp h.c
  g++ -std=c++17 -Wall -Wextra -Werror -fsyntax-only $(pkg-config --cflags dtrain) h.cpp 2>>"$TMP/h.log" || hdr_bad+=" $(basename "$h")(C++)"
  cc -std=c11 -Wall -Wextra -Werror -fsyntax-only $(pkg-config --cflags dtrain) h.c 2>>"$TMP/h.log" || hdr_bad+=" $(basename "$h")(C)"
done
[ -z "$hdr_bad" ] && ok "each of the $(ls "$P"/include/dtrain/*.h | wc -l) headers compiles alone as C11 and C++17" \
  || bad "headers that do not compile alone:$hdr_bad: $(head -5 "$TMP/h.log")"
"$P/bin/dtrain" --help 2>&1 | grep -q "train" && ok "installed dtrain runs" || bad "installed dtrain --help"
finish
