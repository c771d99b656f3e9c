"""dtrain: train, evaluate and run neural networks with dtrain from Python.

    import dtrain
    t = dtrain.Trainer(model="linear(64) relu linear(3)", epochs=5, batch=32, lr=1e-3, workers=2)
    t.fit(x, y, x_test=xt, y_test=yt, callback=print)   # numpy in; one metrics dict per epoch
    t.history                                            # every record so far (list of dicts)
    t.evaluate(xt, yt)                                   # {"loss", "acc", "samples", "split"}
    t.predict(xt).argmax(1)                              # numpy in, numpy logits out
    t.save("model.safetensors"); t2 = dtrain.load("model.safetensors")

Keywords are the flags of `dtrain train` (max_steps= is --max-steps), all of them: the binding
reads the command's own flag table (`dtrain man --flags train`), so dtrain.option_keys() is
--help's list. Training runs the dtrain command of this package (every flag with the command's
meaning: --workers, --tp, --zero, --elastic, ...); evaluate, predict and weights run libdtrain in
this process. Errors raise dtrain.Error with dtrain's message, which names the flag or file at fault.
"""
import os
import shutil
import tempfile
import weakref

import numpy as np

from . import _arrays, _command
from ._command import Error
from ._lib import DT_I32, ffi, lib

__all__ = ["Error", "Trainer", "Result", "train", "evaluate", "load", "load_weights", "option_keys", "flags"]
__version__ = "0.1.0"


def _check(status):
    if status != 0:
        raise Error(ffi.string(lib.dt_status_str(status)).decode(), ffi.string(lib.dt_last_error()).decode())


def flags():
    """The flag table of `dtrain train`: dicts {name, type, meta, help, default}, in --help order."""
    return [dict(f) for f in _command.flag_table()]


def option_keys():
    """The keywords Trainer() and train() take: every `dtrain train` flag, '-' written '_'."""
    return [_command.keyword(f["name"]) for f in _command.flag_table()]


def _weights(model):
    """Copies of a model's named tensors (parameters and buffers) as numpy arrays."""
    out = {}
    params, buffers = lib.dt_model_params(model), lib.dt_model_buffers(model)
    for i in range(lib.dt_model_num_tensors(model)):
        t = lib.dt_model_tensor(model, i)
        base = buffers if t.is_buffer else params
        flat = np.frombuffer(ffi.buffer(base + t.offset, t.numel * 4), dtype=np.float32)
        out[ffi.string(t.name).decode()] = flat.reshape([t.shape[k] for k in range(t.ndim)]).copy()
    return out


def load_weights(checkpoint):
    """The tensors of a dtrain checkpoint by name, as numpy arrays (torch.nn.Sequential names)."""
    p = ffi.new("dt_model **")
    _check(lib.dt_model_load(p, os.fsencode(checkpoint)))
    try:
        return _weights(p[0])
    finally:
        lib.dt_model_destroy(p[0])


def evaluate(checkpoint, data=None, batch=256):
    """Evaluates a checkpoint like `dtrain eval`: on `data`'s test split (its training split when it
    has none), by default the data set the checkpoint was trained on. {"loss", "acc", "samples",
    "split"}."""
    loss, acc = ffi.new("float *"), ffi.new("float *")
    n, split = ffi.new("int64_t *"), ffi.new("const char **")
    _check(lib.dt_evaluate_checkpoint(os.fsencode(checkpoint), data.encode() if data is not None else ffi.NULL,
                                      int(batch), loss, acc, n, split))
    return {"loss": float(loss[0]), "acc": float(acc[0]), "samples": int(n[0]), "split": ffi.string(split[0]).decode()}


def _spec_of(checkpoint):
    """The model spec a checkpoint file records, or None (a directory, "auto", not readable: the
    command resolves and checks it)."""
    p = ffi.new("dt_model **")
    if lib.dt_model_load(p, os.fsencode(checkpoint)) != 0:
        return None
    try:
        return ffi.string(lib.dt_model_spec(p[0])).decode()
    finally:
        lib.dt_model_destroy(p[0])


class _Model:
    """A checkpoint's model opened in this process for inputs of shape (C, H, W), with the input
    normalisation it was trained with."""

    def __init__(self, checkpoint, shape):
        src = ffi.new("dt_model_source *")
        path = ffi.new("char[]", os.fsencode(checkpoint))
        src.checkpoint = path
        p, self.norm = ffi.new("dt_model **"), ffi.new("dt_input_norm *")
        C, H, W = shape
        _check(lib.dt_model_open(p, src, C, H, W, self.norm))
        self.ptr = ffi.gc(p[0], lib.dt_model_destroy)
        self.tokens = lib.dt_model_in_dtype(self.ptr) == DT_I32

    def predict(self, x):
        n, ins, outs = len(x), lib.dt_model_in_size(self.ptr), lib.dt_model_out_size(self.ptr)
        if x[0].size != ins:
            raise Error("EINVAL", "predict: samples of %d values (shape %s), but the model takes %d"
                        % (x[0].size, x.shape[1:], ins))
        logits = np.empty((n, outs), dtype=np.float32)
        _check(lib.dt_model_predict(self.ptr, ffi.from_buffer(x), n, ffi.from_buffer("float[]", logits)))
        if self.tokens:  # a language model: logits per position
            return logits.reshape(n, ins, lib.dt_model_classes(self.ptr))
        return logits


def _shape(x):
    """The (C, H, W) of samples shaped like x[0], as data sets fold them."""
    s = x.shape[1:]
    return (1, 1, s[0]) if len(s) == 1 else (1,) + s if len(s) == 2 else s


class Trainer:
    """A model trained by `dtrain train` with these flags (Trainer(model="cnn", epochs=3,
    workers=2, ...)); fit() trains (numpy arrays or data=), a second fit() continues from where the
    first stopped; evaluate, predict, save, load, weights; history holds every metrics record."""

    def __init__(self, **flags):
        _command.check_keywords(flags)
        self.flags = {_command.keyword(k): v for k, v in flags.items()}
        self.history = []
        self.checkpoint = None  # the checkpoint of the current model (fit writes it, load sets it)
        self._dir = tempfile.mkdtemp(prefix="dtrain-py.")
        self._cleanup = weakref.finalize(self, shutil.rmtree, self._dir, True)
        self._models = {}

    def _tmp(self, name):
        return os.path.join(self._dir, name)

    def fit(self, x=None, y=None, x_test=None, y_test=None, callback=None, echo=True, **flags):
        """Trains: on numpy arrays x (n, features) or (n, C, H, W) float32 or uint8 pixels and y (n,)
        class labels (x_test, y_test: the test set), or on the flags' data=. More flags override the
        constructor's for this call. callback(record) gets each metrics record as it is written (one
        per epoch, or per --log-every steps); returning False stops the run cleanly (as Ctrl-C does;
        Ctrl-C here stops it so too, keeps its records and checkpoint, and raises KeyboardInterrupt).
        echo=False keeps dtrain's output off stdout/stderr. Returns this call's records."""
        _command.check_keywords(flags)
        flags = {_command.keyword(k): v for k, v in flags.items()}
        opts = dict(self.flags, **flags)
        if self.checkpoint and flags.get("resume") is None:
            opts["resume"] = self.checkpoint  # continue; the flags left out are the checkpoint's
        if x is not None:
            if y is None:
                raise Error("EINVAL", "fit(x) needs y, the labels")
            model = opts.get("model") or (_spec_of(opts["resume"]) if opts.get("resume") else "mlp")
            opts["data"] = _arrays.write_dir(self._tmp("data"), x, y, x_test, y_test, model)
        elif y is not None or x_test is not None:
            raise Error("EINVAL", "y or x_test without x: give x and y (or data=)")
        save = opts.get("save") or self._tmp("model.safetensors")
        opts["save"] = save
        metrics = opts.get("metrics") or self._tmp("metrics.jsonl")
        opts["metrics"] = metrics
        # the records of this run: a resumed run appends to the file, a new one starts it again
        # (the command truncates it; removed here first, so no old record is read as new)
        old = ()
        if os.path.exists(metrics):
            if opts.get("resume") is None and not opts.get("dry_run"):
                os.unlink(metrics)
            else:
                with open(metrics, "rb") as f:
                    old = f.read().split(b"\n")
        try:
            records = _command.run(_command.argv(opts), metrics, callback, echo=echo, old=old)
        except KeyboardInterrupt as e:  # stopped as Ctrl-C stops the command: keep what it wrote
            self._took(getattr(e, "records", []), save)
            raise
        self._took(records, save)
        return records

    def _took(self, records, save):
        self.history.extend(records)
        if os.path.exists(save):
            self.checkpoint = os.path.abspath(save)
            self._models = {}

    run = fit

    def _need_checkpoint(self):
        if not self.checkpoint:
            raise Error("EINVAL", "no model yet: call fit() or load(checkpoint) first")
        return self.checkpoint

    def evaluate(self, x=None, y=None, data=None, batch=256):
        """Loss and accuracy of the model: on arrays x, y, on a data set (data=), or by default on the
        data set it was trained on (its test split), as `dtrain eval`. {"loss", "acc", "samples",
        "split"}."""
        ckpt = self._need_checkpoint()
        if x is not None:
            if y is None or data is not None:
                raise Error("EINVAL", "evaluate: give x and y, or data=, or neither (the training data set)")
            d = _arrays.write_dir(self._tmp("eval"), x, y, model=self.spec)
            r = evaluate(ckpt, d, batch)
            r["split"] = "x, y"
            return r
        return evaluate(ckpt, data, batch)

    def predict(self, x):
        """The model's outputs (logits) for x, a numpy array of samples shaped as in training
        (float32 features, uint8 pixels, or int32 token ids (n, T) for a GPT): (n, classes), or
        (n, T, vocabulary) for a GPT. Inputs are normalised as in training (--normalize)."""
        ckpt = self._need_checkpoint()
        x = np.asarray(x)
        if x.ndim < 2:
            raise Error("EINVAL", "predict: need a batch of samples, shape (n, ...); got %s" % (x.shape,))
        shape = _shape(x)
        model = self._models.get(shape) or self._models.setdefault(shape, _Model(ckpt, shape))
        if model.tokens:
            if not np.issubdtype(x.dtype, np.integer):
                raise Error("EINVAL", "predict: this model reads token ids; give integers, not %s" % x.dtype)
            return model.predict(np.ascontiguousarray(x, dtype=np.int32))
        v = _arrays.features(x, "predict")
        if v.dtype == np.uint8:
            v = v.astype(np.float32) * np.float32(1 / 255.0)
        if model.norm.on:
            v = (v - np.float32(model.norm.mean)) / np.float32(model.norm.std)
        return model.predict(np.ascontiguousarray(v, dtype=np.float32))

    def save(self, path):
        """Copies the current checkpoint (weights, optimizer state, settings) to path, atomically."""
        src = self._need_checkpoint()
        tmp = "%s.tmp.%d" % (path, os.getpid())
        try:
            shutil.copyfile(src, tmp)
            os.replace(tmp, path)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
        return path

    def load(self, path):
        """Takes the model of a checkpoint: predict and evaluate use it, and fit() continues it."""
        path = os.path.abspath(os.fspath(path))
        p = ffi.new("dt_model **")
        _check(lib.dt_model_load(p, os.fsencode(path)))  # a file that is no checkpoint fails here
        lib.dt_model_destroy(p[0])
        self.checkpoint, self._models = path, {}
        return self

    def weights(self):
        """The model's tensors by name, as numpy float32 arrays (copies)."""
        return load_weights(self._need_checkpoint())

    @property
    def spec(self):
        """The model spec (the canonical form of model=)."""
        spec = _spec_of(self._need_checkpoint())
        if spec is None:
            _check(lib.dt_model_load(ffi.new("dt_model **"), os.fsencode(self.checkpoint)))  # raises its error
        return spec

    @property
    def step(self):
        """The global step of the last record (0 before any)."""
        return int(self.history[-1].get("step", 0)) if self.history else 0


def load(checkpoint, **flags):
    """A Trainer holding a checkpoint's model (its flags: those of a later fit())."""
    return Trainer(**flags).load(checkpoint)


class Result:
    """What train() returns: metrics (the records), weights (name -> numpy array), the last
    test_loss and test_acc, and the checkpoint path when save= was given."""

    def __init__(self, metrics, weights, test_loss, test_acc, checkpoint):
        self.metrics, self.weights = metrics, weights
        self.test_loss, self.test_acc, self.checkpoint = test_loss, test_acc, checkpoint

    def __repr__(self):
        return "Result(records=%d, test_loss=%.6g, test_acc=%.4g)" % (len(self.metrics), self.test_loss, self.test_acc)


def train(x=None, y=None, x_test=None, y_test=None, callback=None, echo=False, **flags):
    """Trains like `dtrain train` with these flags (all of them: workers=4, val_split=0.1, ...) in
    one call; returns a Result."""
    t = Trainer(**flags)
    records = t.fit(x, y, x_test, y_test, callback=callback, echo=echo)
    tests = [r for r in records if "test_loss" in r]
    last = tests[-1] if tests else {}
    nan = float("nan")
    return Result(records, t.weights() if t.checkpoint else {}, last.get("test_loss", nan), last.get("test_acc", nan),
                  flags.get("save"))
