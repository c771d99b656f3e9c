# The Python binding (python/dtrain) as a user meets it, with Debian's /usr/bin/python3: every flag
# of `dtrain train --help` is a keyword (and the ones the issue saw fail work); a few steps of the
# MLP match `dtrain train`'s losses and saved weights; 2 workers match 1; numpy arrays train like
# the same data read from CSV; dtrain.Trainer fits with a callback (that can stop the run), keeps
# the history, evaluates on the checkpoint's data set like `dtrain eval`, predicts like `dtrain
# predict`, saves, loads and continues; float targets train a regression (mse) model and are
# refused with a clear message by a classifier; and
# `pip install ./python` into a fresh venv gives a package that finds libdtrain and the command
# with no environment variable.
. "$(dirname "$0")/testlib.bash"
ROOT=${DTRAIN_ROOT:-$(cd "$(dirname "$0")/.." && pwd)}
PY=/usr/bin/python3
[ -n "${DTRAIN_SANITIZED:-}" ] && { echo "skip: an ASan libdtrain.so cannot be loaded into an uninstrumented python3"; exit 77; }
$PY -c "import cffi, numpy" 2>/dev/null || { echo "skip: python3-cffi or python3-numpy is missing (apt-get install python3-cffi python3-numpy)"; exit 77; }
have_fmnist || { echo "skip: Fashion-MNIST is missing (apt-get install dataset-fashion-mnist)"; exit 77; }
ABS_BUILD=$(cd "$BUILD" && pwd)
# from the tree: the package finds $BUILD through these (absolute: dlopen reads a relative one from the cwd)
export DTRAIN_LIB="$ABS_BUILD/libdtrain.so" DTRAIN_COMMAND="$ABS_BUILD/dtrain" PYTHONPATH="$ROOT/python"
S=30
$DT train --data fashion-mnist --model mlp --batch 32 --max-steps $S --metrics "$TMP/cli.jsonl" --save "$TMP/cli.safetensors" \
  --quiet >/dev/null 2>&1 || bad "dtrain train failed"
$DT train --help >"$TMP/help.txt" 2>&1

verdicts() {  # reads "WHAT ok|BAD ..." lines
  while read -r what verdict rest; do
    [ "$verdict" = ok ] && ok "python: $what" || bad "python: $what $verdict $rest"
  done
}

# 1. flag coverage, the old API against the command, numpy against CSV, errors
out=$($PY - "$TMP" $S <<'PY' 2>&1
import json, re, sys
import numpy as np
import dtrain
tmp, steps = sys.argv[1], int(sys.argv[2])
# every flag --help prints (read from its text, not from the table the binding reads) is a keyword
helped = set(re.findall(r"^\s+--([a-z][a-z0-9-]*)", open(tmp + "/help.txt").read(), re.M)) - {"help"}
keys = set(k.replace("_", "-") for k in dtrain.option_keys())
print("coverage", "ok" if helped == keys and len(keys) >= 60 else "BAD help-only %s keyword-only %s"
      % (sorted(helped - keys), sorted(keys - helped)))
# and each keyword reaches the command's own parser as its flag, with a value of the flag's type
# (`dtrain train --FLAG=VALUE --help` exits 0 only when the flag and its value parse)
import subprocess
from dtrain import _command
sample = {"bool": True, "int": 2, "float": 0.5, "str": "x"}
refused = []
for f in dtrain.flags():
    k = f["name"].replace("-", "_")
    r = subprocess.run(_command.argv({k: sample[f["type"]]}) + ["--help"], capture_output=True, text=True)
    if r.returncode != 0 or ("--%s=" % f["name"]) not in " ".join(_command.argv({k: sample[f["type"]]})):
        refused.append("%s: %s" % (k, r.stderr.strip()[:120]))
print("keywords_parse", "ok" if not refused and len(dtrain.flags()) == len(keys) else "BAD %s" % refused)
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
print("workers", "ok" if d < 1e-5 and same(r2.test_loss, r.test_loss, 1e-4) and r2.metrics[-1]["world_size"] == 2
      else "BAD diff %g loss %r %r" % (d, r2.test_loss, r.test_loss))
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
for bad, needles in ((dict(epochz=1), ("unknown keyword 'epochz'", "did you mean epochs")), (dict(lr="fast"), ("--lr",)),
                     (dict(data=tmp + "/nope.csv"), (tmp + "/nope.csv",)), (dict(normalize="yes"), ("normalize='yes'",))):
    try:
        dtrain.train(max_steps=1, **bad); print("error", "BAD no error for", bad)
    except dtrain.Error as ex:
        print("error", "ok" if all(n in str(ex) for n in needles) else "BAD %s" % ex)
PY
)
verdicts <<<"$out"
grep -q "^numpy ok" <<<"$out" || bad "python run: $out"
ev=$($DT eval --checkpoint "$TMP/cli.safetensors" --data fashion-mnist 2>&1)
pl=$($PY -c "import json,sys; print('%.4f' % json.load(open(sys.argv[1]))['loss'])" "$TMP/eval.json" 2>/dev/null)
grep -q "loss $pl" <<<"$ev" && ok "evaluate() loss $pl = dtrain eval's" || bad "evaluate() loss $pl vs dtrain eval: $ev"

# 2. dtrain.Trainer on numpy data, and the flags the issue saw fail through the binding
out=$($PY - "$TMP" <<'PY' 2>&1
import contextlib, glob, io, json, os, subprocess, sys
import numpy as np
import dtrain
tmp = sys.argv[1]
rng = np.random.default_rng(7)
# uint8 "images" (n, 1, 6, 6) whose class is which quarter is brightest; --normalize on
x = rng.integers(0, 120, size=(400, 1, 6, 6), dtype=np.uint8); y = rng.integers(0, 4, size=400).astype(np.int64)
for i in range(400):
    r, c = divmod(int(y[i]), 2); x[i, 0, 3 * r:3 * r + 3, 3 * c:3 * c + 3] += 120
xt, yt = x[300:], y[300:]
seen = []
t = dtrain.Trainer(model="flatten linear(16) relu linear(4)", epochs=3, batch=25, lr=0.01, normalize=True)
recs = t.fit(x[:300], y[:300], xt, yt, callback=seen.append, echo=False)
print("fit", "ok" if len(recs) == 3 and seen == recs == t.history and [r["epoch"] for r in recs] == [1, 2, 3]
      and recs[-1]["test_acc"] > 0.9 else "BAD %r" % recs)
ev = t.evaluate()  # the data set the checkpoint trained on (its test split), as dtrain eval
ea = t.evaluate(xt, yt)
print("evaluate", "ok" if ev["split"] == "test" and ev["samples"] == 100 and ev["loss"] == ea["loss"]
      and abs(ev["loss"] - recs[-1]["test_loss"]) < 1e-5 else "BAD %r %r %r" % (ev, ea, recs[-1]))
cli = subprocess.run([os.environ["DTRAIN_COMMAND"], "eval", "--checkpoint", t.checkpoint], capture_output=True, text=True)
print("evaluate_cli", "ok" if cli.returncode == 0 and ("loss %.4f" % ev["loss"]) in cli.stdout else "BAD %r" % cli)
p = t.predict(xt)
acc = float((p.argmax(1) == yt).mean())
print("predict_acc", "ok" if p.shape == (100, 4) and p.dtype == np.float32 and abs(acc - ev["acc"]) < 1e-6
      else "BAD %r vs %r" % (acc, ev["acc"]))
subprocess.run([os.environ["DTRAIN_COMMAND"], "predict", "--checkpoint", t.checkpoint, "--logits", "-o", tmp + "/p.jsonl"],
               check=True, capture_output=True)
lg = np.array([json.loads(l)["logits"] for l in open(tmp + "/p.jsonl")], dtype=np.float32)
print("predict_cli", "ok" if lg.shape == p.shape and np.abs(lg - p).max() < 1e-4 else "BAD max diff %g" % np.abs(lg - p).max())
t.save(tmp + "/t.safetensors")
t2 = dtrain.load(tmp + "/t.safetensors")
print("load", "ok" if np.array_equal(t2.predict(xt), p) and t2.evaluate()["loss"] == ev["loss"] else "BAD")
more = t2.fit(epochs=5, echo=False)  # continues (--resume): epochs count from the start, as the command's
print("continue", "ok" if [r["epoch"] for r in more] == [4, 5] and more[-1]["step"] == 5 * 12 else "BAD %r" % more)
# a per-step callback: with --log-every / --eval-every (where the command has them) the callback
# gets a record every N steps as the run writes them, in order, and can stop the run from one
if "log_every" in dtrain.option_keys() and "eval_every" in dtrain.option_keys():
    steps = []
    t6 = dtrain.Trainer(model="flatten linear(4)", batch=25, epochs=2, log_every=4, eval_every=8)
    r6 = t6.fit(x[:300], y[:300], xt, yt, callback=steps.append, echo=False)
    kinds = [(r.get("kind", "epoch"), r["step"]) for r in r6]
    print("per_step", "ok" if steps == r6 and [s for k, s in kinds if k == "step"] == list(range(4, 25, 4))
          and [s for k, s in kinds if k == "eval"] == [8, 16, 24] and [s for k, s in kinds if k == "epoch"] == [12, 24]
          else "BAD %r" % kinds)
else:
    print("per_step", "ok (skipped: this dtrain has no --log-every)")
# a metrics= file of the user's: a resumed run appends to it, a new one starts it again; fit returns
# this run's records only
m4 = dict(model="flatten linear(4)", batch=50, metrics=tmp + "/user.jsonl")
t4 = dtrain.Trainer(epochs=2, **m4)
a, b = t4.fit(x, y, echo=False), t4.fit(epochs=3, echo=False)
c = dtrain.Trainer(epochs=1, **m4).fit(x, y, echo=False)
print("user_metrics", "ok" if [r["epoch"] for r in a + b + c] == [1, 2, 3, 1] and len(open(tmp + "/user.jsonl").readlines()) == 1
      else "BAD %r" % [r["epoch"] for r in a + b + c])
# the reader of a metrics file that a resumed run rewrites without its records after the checkpoint
# (then appends): only the records that were not there before, once each
from dtrain._command import _Records
path = tmp + "/rw.jsonl"
old = [b'{"step": 1}', b'{"step": 2}', b'{"step": 3}']
open(path, "wb").write(b"\n".join(old) + b"\n")
rd = _Records(path, old)
first = rd.read()
open(path, "wb").write(b'{"step": 1}\n{"step": 2}\n{"step": 3, "again": 1}\n{"step": 4')
second = rd.read()
open(path, "ab").write(b'}\n')
print("records_reader", "ok" if first == [] and second == [{"step": 3, "again": 1}] and rd.read() == [{"step": 4}]
      else "BAD %r %r" % (first, second))
# a callback that returns False stops the run as Ctrl-C does: the step ends, the checkpoint is written
t3 = dtrain.Trainer(model="flatten linear(16) relu linear(4)", epochs=2000, batch=25)
got = t3.fit(x, y, callback=lambda r: r["epoch"] < 2, echo=False)
print("callback_stop", "ok" if 2 <= len(got) < 2000 and t3.checkpoint and t3.step >= 2 * 16 else "BAD %r" % got)
# Ctrl-C (here raised by a callback, the same path) stops the command cleanly: the records so far
# and the checkpoint it writes on the way out are kept, fit continues from it, then it is re-raised
t5 = dtrain.Trainer(model="flatten linear(4)", epochs=2000, batch=25)
def interrupt(r):
    if r["epoch"] >= 2:
        raise KeyboardInterrupt
try:
    t5.fit(x, y, callback=interrupt, echo=False)
    print("ctrl_c", "BAD not raised")
except KeyboardInterrupt:
    e5 = t5.history[-1]["epoch"]
    more = t5.fit(epochs=e5 + 1, echo=False)  # the checkpoint of the stop (maybe mid-epoch) to the next epoch's end
    print("ctrl_c", "ok" if e5 >= 2 and t5.checkpoint and [r["epoch"] for r in more] == [e5 + 1]
          and more[-1]["step"] == 16 * (e5 + 1) else "BAD %r %r" % (e5, more))
# float targets: regression with a model that ends in mse; refused, naming the row and the fix, by
# a cross-entropy model (they were cast to int32, and the loss ended as NaN)
xr = rng.standard_normal((500, 3)).astype(np.float32)
yr = 2 * xr[:, 0] - xr[:, 1] + 0.5
tr = dtrain.Trainer(model="linear(16) relu linear(1) mse", epochs=20, batch=20, lr=0.01)
hr = tr.fit(xr[:400], yr[:400], xr[400:], yr[400:], echo=False)
er, pr = tr.evaluate(), tr.predict(xr[400:])
mse = float(np.mean((pr[:, 0] - yr[400:]) ** 2))
print("regression", "ok" if pr.shape == (100, 1) and hr[-1]["test_loss"] < hr[0]["test_loss"] / 20 and hr[-1]["test_acc"] is None
      and np.isnan(er["acc"]) and abs(mse - er["loss"]) < 1e-5 * max(1, mse) else "BAD %r %r mse %g" % (hr[-1], er, mse))
subprocess.run([os.environ["DTRAIN_COMMAND"], "predict", "--checkpoint", tr.checkpoint, "-o", tmp + "/r.csv"],
               check=True, capture_output=True)
rows = np.loadtxt(tmp + "/r.csv", delimiter=",", skiprows=1, dtype=np.float64)
print("regression_cli", "ok" if open(tmp + "/r.csv").readline().strip() == "index,target,prediction" and rows.shape == (100, 3)
      and np.array_equal(rows[:, 1].astype(np.float32), yr[400:].astype(np.float32)) and np.abs(rows[:, 2] - pr[:, 0]).max() < 1e-4
      else "BAD %r" % open(tmp + "/r.csv").read()[:300])
try:
    dtrain.Trainer(model="linear(1)").fit(xr, yr, echo=False)
    print("float_targets", "BAD accepted")
except dtrain.Error as e:
    print("float_targets", "ok" if "float targets (row 0" in str(e) and "cross-entropy" in str(e) and "linear(1) mse" in str(e)
          else "BAD %s" % e)
# labels that are whole floats (0.0, 1.0, ...) are class labels
tf = dtrain.Trainer(model="flatten linear(4)", epochs=1, batch=50)
print("float_labels", "ok" if tf.fit(x, y.astype(np.float64), echo=False)[-1]["epoch"] == 1 else "BAD")
# the flags the issue saw fail, with their effect: a validation split, TensorBoard events,
# ZeRO and gradient compression on 2 workers, bf16 GEMM inputs
base = dict(model="flatten linear(16) relu linear(4)", batch=25, epochs=1)
r = dtrain.train(x=x, y=y, val_split=0.2, **base)
print("val_split", "ok" if "val_loss" in r.metrics[-1] else "BAD %r" % r.metrics[-1])
dtrain.train(x=x, y=y, tensorboard=tmp + "/tb", **base)
print("tensorboard", "ok" if glob.glob(tmp + "/tb/events.out.tfevents.*") else "BAD %r" % os.listdir(tmp))
for kw, said in ((dict(zero=1), "strategy ddp(bucket_mb=1,zero=1)"), (dict(compress="bf16"), ",compress=bf16)")):
    buf = io.StringIO()  # the command's output (echo=True) names the strategy it runs
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(io.StringIO()):
        r = dtrain.train(x=x, y=y, workers=2, echo=True, **kw, **base)
    print(list(kw)[0], "ok" if r.metrics[-1]["world_size"] == 2 and said in buf.getvalue() else "BAD %r" % buf.getvalue())
r = dtrain.train(x=x, y=y, precision="bf16", **base)
print("precision", "ok" if np.isfinite(r.metrics[-1]["train_loss"]) and "bf16" in r.metrics[-1]["kernels"]
      else "BAD %r" % r.metrics[-1])
PY
)
verdicts <<<"$out"
grep -q "^predict_cli ok" <<<"$out" || bad "python Trainer run: $out"

# the command dies with the Python process: python killed with SIGKILL mid-fit leaves no training behind
$PY -c "
import numpy as np, dtrain
x = np.random.default_rng(2).standard_normal((400, 4)).astype(np.float32)
dtrain.Trainer(model='linear(2)', epochs=1000000, batch=10).fit(x, (x[:, 0] > 0).astype(np.int32), echo=False)" &
pypid=$!
child=""
for i in $(seq 600); do child=$(pgrep -P $pypid -f "train" | head -1); [ -n "$child" ] && break; sleep 0.1; done
if [ -z "$child" ]; then bad "python: no dtrain child of the fitting python appeared"; kill -9 $pypid 2>/dev/null
else
  kill -9 $pypid; wait $pypid 2>/dev/null
  for i in $(seq 600); do kill -0 "$child" 2>/dev/null || break; sleep 0.1; done
  kill -0 "$child" 2>/dev/null && { bad "python: dtrain (pid $child) outlived the python that started it"; kill -9 "$child"; } \
    || ok "python: dtrain ends with the python that started it"
fi

# 3. pip install ./python, offline, into a fresh venv over Debian's packages; then import it from
# elsewhere with no DTRAIN_* variable: the package carries libdtrain.so and the dtrain command
# (from a copy beside a link to the build: setuptools writes build/ and *.egg-info beside the sources)
mkdir "$TMP/src" && cp -r "$ROOT/python" "$TMP/src/python" && ln -s "$ABS_BUILD" "$TMP/src/build"
rm -rf "$TMP/src/python/build" "$TMP"/src/python/*.egg-info
if $PY -m venv --system-site-packages --without-pip "$TMP/venv" 2>/dev/null; then
  # plain `pip install` (build isolation on); --no-index makes sure nothing is fetched
  if env -u DTRAIN_BUILD "$TMP/venv/bin/python" -m pip install -q --no-index --no-deps "$TMP/src/python" >"$TMP/pip.log" 2>&1; then
    ok "pip install ./python (offline, build isolation on)"
    got=$(cd / && env -u DTRAIN_LIB -u DTRAIN_COMMAND -u DTRAIN_BUILD -u PYTHONPATH "$TMP/venv/bin/python" -c "
import numpy as np, dtrain, dtrain._lib, dtrain._command
print(dtrain.__file__); print(dtrain._lib.path); print(dtrain._command.command())
x = np.random.default_rng(1).standard_normal((64, 3)).astype(np.float32)
t = dtrain.Trainer(model='linear(2)', batch=16, workers=2)
print('steps', t.fit(x, (x[:, 0] > 0).astype(np.int32), echo=False)[-1]['step'], t.predict(x).shape)" 2>&1)
    [ "$(grep -c "^$TMP/venv/" <<<"$got")" = 3 ] && ok "the installed package uses its own libdtrain.so and dtrain" \
      || bad "installed package paths: $got"
    grep -qx "steps 2 (64, 2)" <<<"$got" && ok "the installed package trains on 2 workers and predicts" || bad "installed package: $got"
  else bad "pip install: $(tail -3 "$TMP/pip.log")"; fi
else echo "note: python3 -m venv is unavailable (apt-get install python3-venv): pip install not checked"; fi
finish
