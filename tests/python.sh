# The Python binding (python/dtrain, cffi in ABI mode over build/libdtrain.so) with Debian's
# /usr/bin/python3: a few steps of the MLP match `dtrain train`'s losses and its saved weights;
# 2 workers match 1; numpy arrays train like the same data read from CSV; evaluate() matches
# `dtrain eval`; errors carry the library's message; `pip install ./python` works offline.
. "$(dirname "$0")/testlib.bash"
ROOT=${DTRAIN_ROOT:-$(cd "$(dirname "$0")/.." && pwd)}
PY=/usr/bin/python3
[ -n "${DTRAIN_SANITIZED:-}" ] && { echo "skip: an ASan libdtrain.so cannot be loaded into an uninstrumented python3"; exit 77; }
$PY -c "import cffi, numpy" 2>/dev/null || { echo "skip: python3-cffi or python3-numpy is missing (apt-get install python3-cffi python3-numpy)"; exit 77; }
have_fmnist || { echo "skip: Fashion-MNIST is missing (apt-get install dataset-fashion-mnist)"; exit 77; }
export DTRAIN_LIB="$(cd "$BUILD" && pwd)/libdtrain.so" PYTHONPATH="$ROOT/python"  # absolute: dlopen reads a relative one from the cwd
S=30
$DT train --data fashion-mnist --model mlp --batch 32 --max-steps $S --metrics "$TMP/cli.jsonl" --save "$TMP/cli.safetensors" \
  --quiet >/dev/null 2>&1 || bad "dtrain train failed"

out=$($PY - "$TMP" $S <<'PY' 2>&1
import json, math, sys
import numpy as np
import dtrain
tmp, steps = sys.argv[1], int(sys.argv[2])
cli = json.loads(open(tmp + "/cli.jsonl").readlines()[-1])
r = dtrain.train(data="fashion-mnist", model="mlp", batch=32, max_steps=steps)
m = r.metrics[-1]
def same(a, b, tol): return abs(a - b) <= tol * abs(b)
print("train_loss", "ok" if same(m["train_loss"], cli["train_loss"], 1e-6) else "BAD %r %r" % (m["train_loss"], cli["train_loss"]))
print("test_loss", "ok" if same(r.test_loss, cli["test_loss"], 1e-5) else "BAD %r %r" % (r.test_loss, cli["test_loss"]))
w = dtrain.load_weights(tmp + "/cli.safetensors")
# to rounding: the command may re-exec itself with another OpenBLAS kernel set (README)
print("weights", "ok" if w.keys() == r.weights.keys() and all(np.abs(w[k] - r.weights[k]).max() < 1e-5 for k in w)
      and r.weights["1.weight"].shape == (128, 784) else "BAD")
r2 = dtrain.train(data="fashion-mnist", model="mlp", batch=16, max_steps=steps, workers=2)
d = max(float(np.abs(r2.weights[k] - r.weights[k]).max()) for k in w)
print("workers", "ok" if d < 1e-5 and same(r2.test_loss, r.test_loss, 1e-4) else "BAD diff %g loss %r %r" % (d, r2.test_loss, r.test_loss))
e = dtrain.evaluate(tmp + "/cli.safetensors", data="fashion-mnist")
print("evaluate", "ok" if e["split"] == "test" and e["samples"] == 10000 else "BAD %r" % e)
json.dump(e, open(tmp + "/eval.json", "w"))
# numpy arrays versus the same data as CSV files read by the command
rng = np.random.default_rng(3)
x = rng.standard_normal((120, 5)).astype(np.float32); y = (x[:, 0] + x[:, 1] > 0).astype(np.int32)
for name in ("train", "test"):
    with open("%s/%s.csv" % (tmp, name), "w") as f:
        for i in range(120): f.write("%d,%s\n" % (y[i], ",".join("%.9g" % v for v in x[i])))
rn = dtrain.train(x=x, y=y, x_test=x, y_test=y, model="linear(8) relu linear(2)", batch=10, epochs=2,
                  optimizer="sgd", momentum=0.9, lr=0.05)
rc = dtrain.train(data=tmp + "/train.csv", model="linear(8) relu linear(2)", batch=10, epochs=2,
                  optimizer="sgd", momentum=0.9, lr=0.05)
print("numpy", "ok" if all(np.array_equal(rn.weights[k], rc.weights[k]) for k in rn.weights)
      and rn.metrics[-1]["test_loss"] == rc.metrics[-1]["test_loss"] else "BAD")
for bad, needle in ((dict(epochz=1), "unknown training option 'epochz'"), (dict(lr="fast"), "--lr fast"),
                    (dict(data=tmp + "/nope.csv"), tmp + "/nope.csv")):
    try:
        dtrain.train(max_steps=1, **bad); print("error", "BAD no error for", bad)
    except dtrain.Error as ex:
        print("error", "ok" if needle in str(ex) else "BAD %s" % ex)
PY
)
while read -r what verdict rest; do
  [ "$verdict" = ok ] && ok "python: $what" || bad "python: $what $verdict $rest"
done <<<"$out"
grep -q "^numpy ok" <<<"$out" || bad "python run: $out"
ev=$($DT eval --checkpoint "$TMP/cli.safetensors" --data fashion-mnist 2>&1)
pl=$($PY -c "import json,sys; print('%.4f' % json.load(open(sys.argv[1]))['loss'])" "$TMP/eval.json" 2>/dev/null)
grep -q "loss $pl" <<<"$ev" && ok "evaluate() loss $pl = dtrain eval's" || bad "evaluate() loss $pl vs dtrain eval: $ev"

# pip install ./python, offline, into a venv over Debian's packages; then import it from elsewhere
# (from a copy: setuptools writes build/ and *.egg-info beside the sources)
cp -r "$ROOT/python" "$TMP/python-src" && rm -rf "$TMP/python-src/build" "$TMP"/python-src/*.egg-info
if $PY -m venv --system-site-packages --without-pip "$TMP/venv" 2>/dev/null; then
  # plain `pip install` (build isolation on); --no-index makes sure nothing is fetched
  if "$TMP/venv/bin/python" -m pip install -q --no-index --no-deps "$TMP/python-src" >"$TMP/pip.log" 2>&1; then
    ok "pip install ./python (offline, build isolation on)"
    got=$(cd "$TMP" && PYTHONPATH= "$TMP/venv/bin/python" -c "import dtrain; print(dtrain.__file__); print(dtrain.train(max_steps=2).metrics[-1]['step'])" 2>&1)
    grep -q "$TMP/venv" <<<"$got" && grep -qx 2 <<<"$got" && ok "the installed package trains" || bad "installed package: $got"
  else bad "pip install: $(tail -3 "$TMP/pip.log")"; fi
else echo "note: python3 -m venv is unavailable (apt-get install python3-venv): pip install not checked"; fi
finish
