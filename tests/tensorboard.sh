# dtrain train --tensorboard DIR: the event file is decoded here against the public field numbers
# of tensorflow's event.proto / summary.proto (Event: wall_time 1, step 2, file_version 3,
# summary 5; Summary: value 1; Value: tag 1, simple_value 2) by a wire-format reader written in
# this test, its TFRecord frames checked with Debian's python3-crc32c (masked CRC32C); the
# scalars equal the run's --metrics records. 2 workers write one file (rank 0); a bad DIR fails.
# A run with --log-every / --eval-every writes train/* and eval/* scalars at those steps.
. "$(dirname "$0")/testlib.bash"
have_fmnist || { echo "skip: Fashion-MNIST is missing (apt-get install dataset-fashion-mnist)"; exit 77; }
/usr/bin/python3 -c "import crc32c" 2>/dev/null || { echo "skip: python3-crc32c is missing (apt-get install python3-crc32c)"; exit 77; }
run() { $DT train --model mlp --epochs 2 --epoch-windows 640 --batch 32 --quiet "$@" >/dev/null 2>&1; }
run --tensorboard "$TMP/tb/one" --metrics "$TMP/one.jsonl" || bad "train with --tensorboard failed"
run --workers 2 --batch 16 --tensorboard "$TMP/tb/two" --metrics "$TMP/two.jsonl" || bad "2 workers with --tensorboard failed"
run --log-every 5 --eval-every 10 --eval-batches 2 --tensorboard "$TMP/tb/steps" --metrics "$TMP/steps.jsonl" \
  || bad "--log-every with --tensorboard failed"
out=$(/usr/bin/python3 - "$TMP" <<'PY' 2>&1
import glob, json, struct, sys
import crc32c
tmp = sys.argv[1]
def masked(b):
    c = crc32c.crc32c(b)
    return (((c >> 15) | (c << 17)) + 0xa282ead8) & 0xffffffff
def records(path):
    data, i, out = open(path, "rb").read(), 0, []
    while i < len(data):
        head = data[i:i + 8]
        (n,) = struct.unpack("<Q", head)
        (hc,) = struct.unpack("<I", data[i + 8:i + 12])
        body = data[i + 12:i + 12 + n]
        (bc,) = struct.unpack("<I", data[i + 12 + n:i + 16 + n])
        if hc != masked(head) or bc != masked(body) or len(body) != n:
            raise ValueError("bad frame at byte %d" % i)
        out.append(body)
        i += 16 + n
    return out
def varint(b, i):
    v = s = 0
    while True:
        x = b[i]; i += 1; v |= (x & 0x7f) << s; s += 7
        if x < 0x80: return v, i
def fields(b):  # (field number, wire type, value) of one message
    i, out = 0, []
    while i < len(b):
        key, i = varint(b, i)
        num, wt = key >> 3, key & 7
        if wt == 0: v, i = varint(b, i)
        elif wt == 1: v = b[i:i + 8]; i += 8
        elif wt == 5: v = b[i:i + 4]; i += 4
        elif wt == 2: n, i = varint(b, i); v = b[i:i + n]; i += n
        else: raise ValueError("wire type %d" % wt)
        out.append((num, wt, v))
    return out
def event(b):
    e = {"scalars": {}}
    for num, wt, v in fields(b):
        if num == 1 and wt == 1: e["wall_time"] = struct.unpack("<d", v)[0]
        elif num == 2 and wt == 0: e["step"] = v
        elif num == 3 and wt == 2: e["file_version"] = v.decode()
        elif num == 5 and wt == 2:
            for vn, vw, val in fields(v):
                assert vn == 1 and vw == 2, (vn, vw)          # Summary.value
                d = {n: x for n, _, x in fields(val)}
                e["scalars"][d[1].decode()] = struct.unpack("<f", d[2])[0]   # Value.tag, simple_value
        else: raise ValueError("unexpected field %d (wire type %d)" % (num, wt))
    return e
def same(s, tag, m, key, tol=1e-5):
    return abs(s[tag] - m[key]) <= tol * abs(m[key])
for run in ("one", "two", "steps"):
    files = glob.glob("%s/tb/%s/events.out.tfevents.*" % (tmp, run))
    print(run, "files", "ok" if len(files) == 1 else "BAD %r" % files)
    evs = [event(r) for r in records(files[0])]
    metrics = [json.loads(l) for l in open("%s/%s.jsonl" % (tmp, run))]
    print(run, "version", "ok" if evs[0].get("file_version") == "brain.Event:2" else "BAD %r" % evs[0])
    kinds = [m.get("kind", "epoch") for m in metrics]
    want = {"epoch": 2, "step": 8, "eval": 4} if run == "steps" else {"epoch": 2}
    good = len(evs) == 1 + len(metrics) and all(kinds.count(k) == n for k, n in want.items())
    for e, m in zip(evs[1:], metrics):
        s = e["scalars"]
        good &= e["step"] == m["step"] and e["wall_time"] > 1.6e9
        if "kind" not in m:
            for tag, key in (("loss/train", "train_loss"), ("loss/test", "test_loss"), ("accuracy/test", "test_acc"), ("lr", "lr")):
                good &= same(s, tag, m, key)
            good &= same(s, "throughput/samples_per_s", m, "samples_per_s", 1e-3)
        elif m["kind"] == "step":
            for tag, key in (("train/loss", "train_loss"), ("train/lr", "lr"), ("train/grad_norm", "grad_norm")):
                good &= same(s, tag, m, key)
            good &= same(s, "train/samples_per_s", m, "samples_per_s", 1e-3) and len(s) == 4
        else:
            good &= same(s, "eval/loss_test", m, "test_loss") and same(s, "eval/accuracy_test", m, "test_acc") and len(s) == 2
    print(run, "scalars", "ok" if good else "BAD %r vs %r" % (evs, metrics))
PY
)
while read -r run what verdict rest; do
  [ "$verdict" = ok ] && ok "tensorboard $run: $what" || bad "tensorboard $run: $what $verdict $rest"
done <<<"$out"
[ "$(grep -c ' ok$' <<<"$out")" -eq 9 ] || bad "decoder: $out"
touch "$TMP/afile"
expect_fail "a --tensorboard path that is a file is refused" "--tensorboard $TMP/afile" $DT train --max-steps 1 --tensorboard "$TMP/afile"
run --tensorboard "$TMP/afile"; [ $? -eq 73 ] && ok "it exits 73 (an output that cannot be written)" || bad "bad --tensorboard exit status"
finish
