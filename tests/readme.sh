# The README as a user reads it: every command of its fenced ```sh blocks runs and exits 0, in
# order, in one scratch directory (so `eval` reads the checkpoint `train` wrote). A block whose
# fence says "```sh norun" is not run (make, mpirun, the long examples). `build/dtrain` is this
# build's dtrain; each `dtrain train` gets --max-steps 20 (40 when it resumes) in place of its
# own, and a text run validates on 1% of its text (--val-fraction 0.01), to stay short. Also: the README stays short (at most 160 lines) and its links lead to files.
. "$(dirname "$0")/testlib.bash"
ROOT=${DTRAIN_ROOT:-$(cd "$(dirname "$0")/.." && pwd)}
README=${README:-$ROOT/README.md}
DT=$(cd "$(dirname "$DT")" && pwd)/dtrain
n=$(wc -l <"$README")
[ "$n" -le 160 ] && ok "the README is $n lines" || bad "the README is $n lines (at most about 150: move the rest to docs/)"
missing=$(grep -o '](\(docs/\|\.\./\)\?[A-Za-z0-9_./-]*\(#[a-z0-9-]*\)\?)' "$README" | sed 's/^](\(.*\))$/\1/; s/#.*//' \
  | while read -r f; do [ -e "$ROOT/$f" ] || echo "$f"; done)
[ -z "$missing" ] && ok "the README's links lead to files" || bad "the README links to missing files: $missing"
if ! have_fmnist; then
  echo "skip: Fashion-MNIST not installed (apt-get install dataset-fashion-mnist)"
  finish; exit 77
fi
# the commands, one per line, NUL-separated words (shlex: quotes and comments as sh reads them)
python3 - "$README" "$DT" >"$TMP/cmds" <<'PY' || bad "the README's sh blocks could not be read"
import re, shlex, sys
text, dt = open(sys.argv[1]).read(), sys.argv[2]
blocks = re.findall(r"^```(\S*)([^\n]*)\n(.*?)^```$", text, re.M | re.S)
for lang, rest, body in blocks:
    if lang != "sh" or "norun" in rest.split():
        continue
    for line in body.replace("\\\n", " ").splitlines():
        words = [dt if w == "build/dtrain" else w for w in shlex.split(line, comments=True)]
        if not words:
            continue
        assert words[0] == dt, "a runnable README command that is not build/dtrain: %s (mark its block norun)" % line
        if "train" in words and words[words.index("train") - 1] == dt:
            while "--max-steps" in words:
                i = words.index("--max-steps"); del words[i:i + 2]
            words += ["--max-steps", "40" if "--resume" in words else "20"]
            if "kjv" in words or any(w.startswith("text:") for w in words):
                words += ["--val-fraction", "0.01"]  # the evaluation at the end: 1% of the text
        print("\x1f".join(words))
PY
ran=0
cd "$TMP" || exit 1
while IFS=$'\x1f' read -r -a cmd; do
  line="${cmd[*]}"
  if [ "${cmd[1]}" = plot ] && ! command -v gnuplot >/dev/null; then echo "note: no gnuplot, not run: $line"; continue; fi
  if grep -qw kjv <<<"$line" && ! command -v bible >/dev/null && [ ! -f "${DTRAIN_DATASETS:-/nonexistent}/kjv.txt" ]; then
    echo "note: no bible-kjv, not run: $line"; continue
  fi
  out=$("${cmd[@]}" 2>&1 </dev/null); rc=$?
  if [ $rc -ne 0 ] && grep -q "built without" <<<"$out"; then echo "note: $(grep -m1 'built without' <<<"$out"): $line"; continue; fi
  ran=$((ran + 1))
  [ $rc -eq 0 ] && ok "README: ${line#"$DT "}" || bad "README: ${line#"$DT "} (exit $rc): $(tail -n 5 <<<"$out")"
done <"$TMP/cmds"
[ "$ran" -ge 10 ] && ok "$ran README commands ran" || bad "only $ran README commands ran"
[ -s preds.csv ] && [ -s mlp.safetensors ] && ok "they wrote what the README says" || bad "no preds.csv or mlp.safetensors in $TMP"
finish
