# ONNX export round trip (issue 16): `dtrain export` of the MLP (with --normalize: Sub/Div at the
# input), the CNN preset, a spec using every sequential layer and a GPT passes python3-onnx's
# full checker, and onnxruntime-node (npm) gives the logits `dtrain predict --logits` gives, to a
# max abs difference of 1e-4, on the first 1000 Fashion-MNIST test images (200 under the
# sanitizers, which also train fewer steps) and 20 text windows. Skips, saying why, without node, onnxruntime-node (installed by
# scripts/install-deps into ~/.cache/dtrain/npm, or DTRAIN_NODE_MODULES), python3-onnx or the data.
. "$(dirname "$0")/testlib.bash"
ROOT=${DTRAIN_ROOT:-$(cd "$(dirname "$0")/.." && pwd)}
PY=/usr/bin/python3
MODS=${DTRAIN_NODE_MODULES:-${XDG_CACHE_HOME:-$HOME/.cache}/dtrain/npm/node_modules}
command -v node >/dev/null || { echo "skip: node is not installed (apt-get install nodejs)"; exit 77; }
[ -d "$MODS/onnxruntime-node" ] || { echo "skip: onnxruntime-node not in $MODS (scripts/install-deps installs it: npm install --ignore-scripts onnxruntime-node)"; exit 77; }
$PY -c "import onnx" 2>/dev/null || { echo "skip: $PY has no onnx (apt-get install python3-onnx)"; exit 77; }
have_fmnist || { echo "skip: Fashion-MNIST not installed (apt-get install dataset-fashion-mnist)"; exit 77; }
out=$($DT export --checkpoint /nonexistent.st -o "$TMP/x.onnx" 2>&1)
if grep -q "built without ONNX" <<<"$out"; then echo "skip: $out"; exit 77; fi
SAN=${DTRAIN_SANITIZED:+1}
N=$([ -n "$SAN" ] && echo 200 || echo 1000)
S=$([ -n "$SAN" ] && echo 4 || echo 1)  # fewer training steps under the sanitizers
# a Fashion-MNIST subset keeps training and its end-of-epoch test pass short: the first 2000
# training images and the first N test images (not cached: DTRAIN_DATA_CACHE=0)
export DTRAIN_DATA_CACHE=0
$PY "$ROOT/tests/tools/fmnist_subset.py" /usr/share/datasets/fashion-mnist "$TMP/fm" 2000 $N || bad "fmnist subset"
IMG="$TMP/fm/t10k-images-idx3-ubyte.gz"
export NODE_PATH="$MODS"

# round_trip NAME INPUT N TRAIN-ARGS...: train briefly, export, check, predict, run, compare
round_trip() {
  local name=$1 input=$2 n=$3; shift 3
  $DT train "$@" --quiet --save "$TMP/$name.st" >/dev/null 2>&1 || { bad "$name: train $*"; return; }
  $DT export --checkpoint "$TMP/$name.st" -o "$TMP/$name.onnx" >/dev/null || { bad "$name: export"; return; }
  local chk
  chk=$($PY -c "import onnx,sys; m=onnx.load(sys.argv[1]); onnx.checker.check_model(m, full_check=True); print(len(m.graph.node), 'nodes, opset', m.opset_import[0].version)" "$TMP/$name.onnx" 2>&1) \
    || { bad "$name: onnx checker: $chk"; return; }
  local data=(--data "$TMP/fm")
  [ "$input" = ids ] && data=(--data "text:$TMP/c.txt")
  $DT predict --checkpoint "$TMP/$name.st" "${data[@]}" --limit "$n" --logits -o "$TMP/$name.jsonl" >/dev/null \
    || { bad "$name: predict"; return; }
  local res
  res=$(node "$ROOT/tests/tools/onnx_run.js" "$TMP/$name.onnx" "$TMP/$name.jsonl" "$input" "$n" 2>&1) \
    && ok "$name: checker ok ($chk); onnxruntime vs dtrain: $res" || bad "$name: $res"
}
round_trip mlp "$IMG" $N --data "$TMP/fm" --model mlp --normalize --max-steps $((60 / S))
round_trip cnn "$IMG" $N --data "$TMP/fm" --model cnn --max-steps $((8 / S)) --batch $((16 / S))
round_trip spec "$IMG" $N --data "$TMP/fm" --max-steps $((20 / S)) --model \
  "conv(6,3,pad=1) batchnorm gelu maxpool(2) conv(8,3,stride=2,bias=0) tanh avgpool(2) flatten dropout(0.2) layernorm linear(24,bias=0) sigmoid linear(10)"
python3 -c "
import random; random.seed(5); w='in the beginning god created the heaven and the earth .'.split()
open('$TMP/c.txt','w').write(' '.join(random.choice(w) for _ in range(3000)))"
round_trip gpt ids 20 --data "text:$TMP/c.txt" --model "gpt:L=2,H=2,C=32,T=16" --max-steps $((12 / S))
expect_fail "export needs -o" "no -o FILE given" $DT export --checkpoint "$TMP/mlp.st"
expect_fail "export of a missing checkpoint names it" "/nonexistent.st" $DT export --checkpoint /nonexistent.st -o "$TMP/x.onnx"
[ ! -e "$TMP/x.onnx" ] && ok "no ONNX file after a failed export" || bad "a failed export left $TMP/x.onnx"
finish
