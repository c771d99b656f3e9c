# Architecture check (DESIGN.md "Layers of the system"): a lower layer never includes a higher
# one. Each src/<layer> may include only the internal and public headers of layers below it.
. "$(dirname "$0")/testlib.bash"
ROOT=$(cd "$(dirname "$0")/.." && pwd)
# layer: forbidden include prefixes (internal dirs and the public headers that belong to them)
declare -A FORBID=(
  [core]="backend/ device/ models/ comm/ nn/ optim/ data/ parallel/ run/ cli/ dtrain/comm.h dtrain/nn.h dtrain/optim.h dtrain/data.h dtrain/train.h dtrain/safetensors.h"
  [device]="nn/ models/ comm/ optim/ data/ parallel/ run/ cli/ fl/ dtrain/nn.h dtrain/models.h dtrain/comm.h dtrain/data.h dtrain/train.h"
  [backend]="device/ nn/ models/ comm/ optim/ data/ parallel/ run/ cli/ dtrain/nn.h dtrain/models.h dtrain/comm.h dtrain/data.h dtrain/train.h"
  [comm]="backend/ models/ nn/ optim/ data/ parallel/ run/ cli/ dtrain/nn.h dtrain/optim.h dtrain/data.h dtrain/train.h"
  [nn]="models/ comm/ data/ parallel/ run/ cli/ dtrain/comm.h dtrain/data.h dtrain/train.h"
  [models]="comm/ data/ parallel/ run/ cli/ dtrain/comm.h dtrain/data.h dtrain/train.h"
  [optim]="backend/ models/ nn/ comm/ data/ parallel/ run/ cli/ dtrain/comm.h dtrain/data.h dtrain/train.h"
  [data]="backend/ models/ comm/ nn/ optim/ parallel/ run/ cli/ dtrain/comm.h dtrain/nn.h dtrain/train.h"
  [parallel]="run/ cli/ dtrain/train.h"
  [plan]="run/ cli/"  # the planner: between run/ and parallel/ (uses the public memory plan)
  [run]="cli/"
  [fl]="cli/ parallel/ comm/ dtrain/comm.h"  # federated learning: beside parallel/ and run/ (uses run/checkpoint)
  [cli]="comm/ core/ nn/ optim/ data/ parallel/"  # the CLI uses the public API (and run/'s launcher)
)
for layer in "${!FORBID[@]}"; do
  for f in "$ROOT"/src/"$layer"/*.[ch]; do
    case "$f" in *_test.c | *_testlib.h) continue ;; esac  # tests drive a layer from above
    for bad in ${FORBID[$layer]}; do
      if grep -q "^#include \"$bad" "$f"; then bad "$(basename "$f") (layer $layer) includes $bad"; fi
    done
  done
done
[ $fails -eq 0 ] && ok "no layer includes a higher one"

# Strategy knowledge stays in parallel/ (issue 38): no file above it tests a strategy's name
# (strcmp against "ddp", "ps", ...); it asks the registry (dtrain/train.h dt_strategy_spec_class,
# dt_strategy_spec_takes). name_tests DIR...: the offending lines.
STRATEGY_NAMES=$(grep -h -A3 '^const dt_strategy_entry dt_strategy_[a-z0-9_]*_entry = {' "$ROOT"/src/parallel/*.c |
  sed -n 's/.*\.name = "\([a-z0-9_]*\)".*/\1/p' | sort -u | paste -sd'|')
name_tests() {
  grep -nE "strn?cmp\([^;]*\"($STRATEGY_NAMES)\"" $(find "$@" -name '*.c' ! -name '*_test.c') 2>/dev/null
}
[ -n "$STRATEGY_NAMES" ] && ok "the strategy names, from the registry entries: $STRATEGY_NAMES" \
  || bad "no strategy names found in src/parallel/*.c (.name = \"...\")"
hits=$(name_tests "$ROOT"/src/{run,cli,plan,fl,models,nn,optim,data,comm,device,backend,core})
[ -z "$hits" ] && ok "no file outside parallel/ tests a strategy's name" \
  || bad "strategy names tested outside parallel/ (ask the registry instead): $hits"
mkdir -p "$TMP/plant/run"
printf 'static int f(const char *n) { return !strcmp(n, "localsgd"); }\n' >"$TMP/plant/run/x.c"
[ -n "$(name_tests "$TMP/plant")" ] && ok "a planted strategy-name test outside parallel/ is found" \
  || bad "the strategy-name check misses a planted strcmp(n, \"localsgd\")"

# A strategy's private headers stay in parallel/ (issue 38): run/ reaches a strategy through its
# registry entry (the memory plan: dt_strategy_entry.mem_plan), never through pp.h, tp.h, zero.h,
# zero_internal.h, ps.h or ps_server.h. private_includes DIR...: the offending lines.
private_includes() {
  grep -nE '^#include "parallel/(pp|tp|zero|zero_internal|ps|ps_server)\.h"' \
    $(find "$@" -name '*.[ch]' ! -name '*_test.c' ! -name '*_testlib.h') 2>/dev/null
}
hits=$(private_includes "$ROOT/src/run")
[ -z "$hits" ] && ok "run/ includes no strategy's private header (pp.h, tp.h, zero.h, zero_internal.h, ps.h)" \
  || bad "run/ includes a strategy's private header (add to its registry entry instead): $hits"
mkdir -p "$TMP/plant/run"
sed 's|^#include "parallel/strategy.h"|#include "parallel/zero.h"|' "$ROOT/src/run/memplan.c" >"$TMP/plant/run/memplan.c"
[ -n "$(private_includes "$TMP/plant/run")" ] && ok "a planted #include \"parallel/zero.h\" in run/memplan.c is found" \
  || bad "the private-header check misses a planted #include \"parallel/zero.h\" in run/memplan.c"

# Nothing above the device touches model memory (issue 33 point 6): scripts/model-memory-check
# finds memcpy/memset/memmove on parameters, gradients, activations or optimizer state, and reads
# or writes through such a pointer, in nn/ optim/ parallel/ run/ models/ fl/ plan/ cli/; the
# functions of scripts/model-memory-allow are exempt, each with its reason.
if out=$(python3 "$ROOT/scripts/model-memory-check" --allow "$ROOT/scripts/model-memory-allow" "$ROOT"); then
  ok "no file above the device copies, fills or dereferences model memory ($(grep -c '^src/' "$ROOT/scripts/model-memory-allow") allow-listed host fast paths)"
else
  bad "model memory touched on the host above the device (use the device's upload/download/copy/fill_f32 or a step primitive, or allow-list the function with a reason): $out"
fi
# planted: a memcpy into the run context's parameters in nn/, a memset of the gradients and an
# update through them in parallel/, in copies of real files; each must be found, and nothing else
mm=$TMP/modelmem
mkdir -p "$mm/src/nn" "$mm/src/parallel"
sed '0,/const float \*w = dt_node_param(m, n, c, 0);/{//{p;s/.*/    { const dt_run_ctx *ctx = c; size_t off = 0; memcpy(ctx->params + off, w, sizeof *w); }/}}' \
  "$ROOT/src/nn/op_linear.c" >"$mm/src/nn/op_linear.c"
sed '/float \*g = dt_model_grads(s->model); *\/\* on the optimizer/{p;s/.*/    memset(g, 0, dt_model_num_params(s->model) * sizeof *g);\n    g[0] += 1.0f;/}' \
  "$ROOT/src/parallel/strategy.c" >"$mm/src/parallel/strategy.c"
out=$(python3 "$ROOT/scripts/model-memory-check" --allow "$ROOT/scripts/model-memory-allow" "$mm" | grep -v '^note: ')
if [ "$(echo "$out" | grep -c .)" = 3 ] && echo "$out" | grep -q '^src/nn/op_linear.c:.*memcpy.*ctx->params + off' &&
   echo "$out" | grep -q '^src/parallel/strategy.c:.*memset.*memset(g, 0' && echo "$out" | grep -q '^src/parallel/strategy.c:.*dereference.*g\[0\] += 1'; then
  ok "model-memory-check finds a planted memcpy(ctx->params + off, ...) in nn/, and a memset of and a write through the gradients in parallel/"
else
  bad "model-memory-check on the planted copies of op_linear.c and strategy.c (3 violations) printed: $out"
fi

# scripts/house-figures (issue 38's size figures) on a planted tree whose figures are known:
# 2 public functions, a 3-line function (brace to brace) longer than a 1-line one, and of two
# lines at 120 and 121 columns, 1 over 120; of four unit tests, x_test.c sits beside x.c,
# lonely_test.c beside no module of its name, tagged_test.c is a cross-module test (its first line
# starts "/* Cross-module test") and late_test.c carries the tag on its second line only (misplaced).
fig=$TMP/house  # testlib's TMP: removed on exit
mkdir -p "$fig/include/dtrain" "$fig/src/core"
printf '/* h */\nint dt_a(void);\nvoid dt_b(int x,\n          int y);\ntypedef int (*dt_fn)(void);\n' >"$fig/include/dtrain/x.h"
{ printf 'static int one(void) { return 1; }\nint three(int x)\n{\n    return x;\n}\n'
  printf '/* %0114d */\n/* %0115d */\n' 0 0; } >"$fig/src/core/x.c"  # 120 and 121 columns
printf '/* t */\n' >"$fig/src/core/x_test.c"
printf '/* t */\n' >"$fig/src/core/lonely_test.c"
printf '/* Cross-module test: t */\n' >"$fig/src/core/tagged_test.c"
printf '/* t\n * Cross-module test: t */\n' >"$fig/src/core/late_test.c"
line=$(python3 "$ROOT/scripts/house-figures" "$fig" | grep '^house-figures: ')
if echo "${line#house-figures: }" | python3 -c 'import json,sys; f=json.load(sys.stdin)
sys.exit(not (f["public_functions"] == 2 and f["lines_over_120"] == 1 and f["functions"] == 2
              and f["longest"][0]["name"] == "three" and f["longest"][0]["lines"] == 3
              and f["misplaced_tests"] == ["src/core/late_test.c", "src/core/lonely_test.c"]
              and f["cross_module_tests"] == ["src/core/tagged_test.c"]))'; then
  ok "house-figures counts a planted tree right: $line"
else
  bad "house-figures on a planted tree (2 public functions, longest 'three' 3 lines, 1 wide line, late_test.c and lonely_test.c misplaced, tagged_test.c cross-module) printed: '$line'"
fi
line=$(python3 "$ROOT/scripts/house-figures" "$ROOT" | grep '^house-figures: {"public_functions":[1-9]')
if [ -n "$line" ]; then ok "house-figures on this tree: ${line:0:120}..."; else bad "scripts/house-figures printed no figures for $ROOT"; fi
# this tree's unit tests all sit beside their module or say they are cross-module (docs/development.md)
misplaced=$(echo "${line#house-figures: }" | python3 -c 'import json,sys; print(" ".join(json.load(sys.stdin)["misplaced_tests"]))')
if [ -z "$misplaced" ]; then
  ok "every unit test sits beside a module of its name or starts '/* Cross-module test'"
else
  bad "unit tests beside no module of their name: $misplaced; rename each after the module it tests, or start its first line with '/* Cross-module test' when it tests several (docs/development.md)"
fi

# every registry entry has its help and options (issue 38: one registry style): the real tree
# passes (transports, devices, compressors, strategies), and a planted tree whose transport 'bad'
# lacks its help (and device 'nohelp' its options) fails, naming them
if out=$(python3 "$ROOT/scripts/registry-check" "$ROOT"); then
  ok "every registry entry has its help and options ($(echo "$out" | wc -l) entries)"
else
  bad "scripts/registry-check found an incomplete registry entry: $(echo "$out" | grep -v ': help and options$')"
fi
reg=$TMP/registry
mkdir -p "$reg/src/comm" "$reg/src/device"
printf '#define DT_TRANSPORT_KINDS(X) X(good) X(bad)\n' >"$reg/src/comm/transports.c"
printf 'const dt_transport_kind dt_transport_kind_good = {.name = "good", .help = "g", .options = ""};\n' >"$reg/src/comm/transport_good.c"
printf 'const dt_transport_kind dt_transport_kind_bad = {.name = "bad", .options = ""};\n' >"$reg/src/comm/transport_bad.c"
printf 'static const dt_device_kind *const KINDS[] = {&dt_device_kind_nohelp};\n' >"$reg/src/device/device.c"
printf 'const dt_device_kind dt_device_kind_nohelp = {.name = "nohelp", .help = "h"};\n' >>"$reg/src/device/device.c"
# ... and compressor 'noopts' its options, strategy 'nohelp' its help, strategy 'hidden' shows
# its key 'k2' nowhere in its options (strategy 'fine' and compressor 'good' are complete)
mkdir -p "$reg/src/parallel"
printf '#define DT_COMPRESSORS(X) X(good) X(noopts)\n' >"$reg/src/parallel/compress.c"
printf 'const dt_compressor dt_compress_good = {.name = "good", .help = "g" "h", .options = "K"};\n' >>"$reg/src/parallel/compress.c"
printf 'const dt_compressor dt_compress_noopts = {.name = "noopts", .help = "h"};\n' >>"$reg/src/parallel/compress.c"
printf '#define DT_STRATEGIES(X) X(fine) X(nohelp) X(hidden)\n' >"$reg/src/parallel/registry.c"
{ printf 'const dt_strategy_entry dt_strategy_fine_entry = {.name = "fine", .help = "h", .options = "k1=A,k2=B", .keys = "k1, k2"};\n'
  printf 'const dt_strategy_entry dt_strategy_nohelp_entry = {.name = "nohelp", .options = "", .keys = ""};\n'
  printf 'const dt_strategy_entry dt_strategy_hidden_entry = {.name = "hidden", .help = "h", .options = "k1=A", .keys = "k1,k2"};\n'
} >"$reg/src/parallel/s.c"
out=$(python3 "$ROOT/scripts/registry-check" "$reg")
if [ $? -ne 0 ] && echo "$out" | grep -q "transport 'bad'.*no .help" && echo "$out" | grep -q "device 'nohelp'.*no .options" &&
   echo "$out" | grep -q "compressor 'noopts'.*no .options" && echo "$out" | grep -q "strategy 'nohelp'.*no .help" &&
   echo "$out" | grep -q "strategy 'hidden'.*key k2" && ! echo "$out" | grep -q "'good'.*no \|'fine'.*: [^h]"; then
  ok "registry-check fails on planted entries without help (transport, strategy), without options (device, compressor) and with a key its options do not show (strategy)"
else
  bad "registry-check on a planted tree (transport 'bad' and strategy 'nohelp' without .help, device 'nohelp' and compressor 'noopts' without .options, strategy 'hidden' without k2=) printed: $out"
fi
# ops: each has its help and its spec syntax (NULL or a dt_op_syntax with .args); a planted op
# 'nohelp' without .help, 'nosyntax' without .syntax and 'noargs' whose syntax has no .args fail
mkdir -p "$reg/src/nn"
printf '#define DT_OPS(X) X(good) X(graphonly) \\\n    X(nohelp) X(nosyntax) X(noargs)\n' >"$reg/src/nn/ops.c"
{ printf 'static const dt_op_syntax good_syntax = {.args = "out | bias", .usage = "good(out)"};\n'
  printf 'const dt_op dt_op_good = {.name = "good", .help = "g", .syntax = &good_syntax};\n'
  printf 'const dt_op dt_op_graphonly = {.name = "graphonly", .help = "g", .syntax = NULL};\n'
  printf 'const dt_op dt_op_nohelp = {.name = "nohelp", .syntax = NULL};\n'
  printf 'const dt_op dt_op_nosyntax = {.name = "nosyntax", .help = "h"};\n'
  printf 'static const dt_op_syntax noargs_syntax = {.usage = "noargs"};\n'
  printf 'const dt_op dt_op_noargs = {.name = "noargs", .help = "h", .syntax = &noargs_syntax};\n'
} >"$reg/src/nn/op_x.c"
out=$(python3 "$ROOT/scripts/registry-check" "$reg")
if [ $? -ne 0 ] && echo "$out" | grep -q "op 'nohelp'.*no .help" && echo "$out" | grep -q "op 'nosyntax'.*no .syntax" &&
   echo "$out" | grep -q "op 'noargs'.*sets no .args" && echo "$out" | grep -q "op 'good'.*: help and syntax$" &&
   echo "$out" | grep -q "op 'graphonly'.*: help and syntax$"; then
  ok "registry-check fails on planted ops without help, without syntax and with a syntax without args"
else
  bad "registry-check on planted ops (nohelp, nosyntax, noargs bad; good, graphonly fine) printed: $out"
fi
# library errors in the library's terms (issue 38): no "--flag" in a library message, and every
# `term` one names has its flag in the CLI's table; the real tree passes, a planted tree with a
# flag in a dt_error and a term the table lacks fails naming both, and its .help text passes
if out=$(python3 "$ROOT/scripts/lib-flag-check" "$ROOT"); then ok "lib-flag-check: $out"
else bad "scripts/lib-flag-check: flags or unknown terms in library messages: $out"; fi
lf=$TMP/libflag
mkdir -p "$lf/src/run" "$lf/src/device" "$lf/src/cli"
printf 'static const char *const TERMS[] = {\n    "batch",\n};\n' >"$lf/src/cli/flag_terms.c"
printf 'int f(int b) { return dt_error(DT_EINVAL, "--batch %%d: need at least 1", b); }\n' >"$lf/src/run/x.c"
printf 'int g(void) { return dt_error(DT_EINVAL, "`batch` and `frobs`: unknown"); }\n' >>"$lf/src/run/x.c"
printf 'void h(char *w, const char *k) { sprintf(w, "%%s--%%s 1 (was 2)", "; ", k); }\n' >>"$lf/src/run/x.c"
printf 'const k K = {.name = "cpu", .help = "uses --kernels",\n .options = ""};\n' >"$lf/src/device/d.c"
out=$(python3 "$ROOT/scripts/lib-flag-check" "$lf")
if [ $? -ne 0 ] && grep -q 'src/run/x.c:1: a flag' <<<"$out" && grep -q 'src/run/x.c:2: `frobs` is no term' <<<"$out" &&
   grep -q 'src/run/x.c:3: a flag' <<<"$out" &&
   ! grep -q 'd.c\|`batch` is no term' <<<"$out"; then
  ok "lib-flag-check fails on a planted --batch in a dt_error, a \"%s--%s\" and an unknown term, not on help text"
else
  bad "lib-flag-check on a planted tree printed: $out"
fi
finish
