"""dtrain: train and evaluate neural networks with libdtrain from Python.

    import dtrain
    r = dtrain.train(data="fashion-mnist", model="mlp", epochs=2, batch=32, optimizer="adam", lr=1e-3)
    r.metrics      # one dict per epoch, the JSON lines of `dtrain train --metrics`
    r.weights      # {"1.weight": numpy array (128, 784), ...}, torch.nn.Sequential names
    dtrain.evaluate("mlp.safetensors", data="fashion-mnist")   # {"loss", "acc", "samples", "split"}

Keyword arguments are the flags of `dtrain train` (max_steps= is --max-steps). Errors raise
dtrain.Error with the library's message, which names the flag or file at fault.
"""
import json
import os
import tempfile

import numpy as np

from ._lib import DT_F32, DT_U8, ffi, lib

__all__ = ["Error", "Trainer", "Result", "train", "evaluate", "load_weights", "option_keys"]
__version__ = "0.1.0"


class Error(RuntimeError):
    """A libdtrain call failed: .status is its dt_status name, the message says what to do."""

    def __init__(self, status, message):
        super().__init__(message)
        self.status = status


def _check(status):
    if status != 0:
        raise Error(ffi.string(lib.dt_status_str(status)).decode(), ffi.string(lib.dt_last_error()).decode())


def option_keys():
    """The option names train() and Trainer() take (the `dtrain train` flags they set)."""
    return ffi.string(lib.dt_train_options_keys()).decode().split()


def _value(v):
    if isinstance(v, bool):
        return "1" if v else "0"
    return repr(v) if isinstance(v, float) else str(v)


def _dataset(x, y, what):
    """A libdtrain data set copied from numpy: x (n, features) or (n, C, H, W) float32 (uint8 pixels
    are scaled by 1/255), y (n,) integer labels."""
    x = np.asarray(x)
    y = np.ascontiguousarray(np.asarray(y), dtype=np.int32)
    if x.ndim not in (2, 3, 4) or y.ndim != 1 or len(x) != len(y):
        raise ValueError("%s: need x of shape (n, features) or (n, C, H, W) and y of shape (n,); got %s and %s"
                         % (what, x.shape, y.shape))
    dtype = DT_U8 if x.dtype == np.uint8 else DT_F32
    x = np.ascontiguousarray(x, dtype=np.uint8 if dtype == DT_U8 else np.float32)
    shape = (1, 1, x.shape[1]) if x.ndim == 2 else (1,) + x.shape[1:] if x.ndim == 3 else x.shape[1:]
    out = ffi.new("dt_dataset **")
    _check(lib.dt_dataset_create(out, dtype, ffi.from_buffer(x), ffi.cast("int32_t *", ffi.from_buffer(y)), len(x),
                                 shape[0], shape[1], shape[2], 0))
    return ffi.gc(out[0], lib.dt_dataset_free)


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


class _Options:
    def __init__(self, opts, x=None, y=None, x_test=None, y_test=None):
        p = ffi.new("dt_train_options **")
        _check(lib.dt_train_options_create(p))
        self.ptr = ffi.gc(p[0], lib.dt_train_options_free)
        self.data = []
        # the optimizer first: it resets the optimizer's settings to its defaults
        for k in sorted(opts, key=lambda k: k != "optimizer"):
            if opts[k] is not None:
                _check(lib.dt_train_options_set(self.ptr, k.encode(), _value(opts[k]).encode()))
        if x is not None:
            train = _dataset(x, y, "x, y")
            test = _dataset(x_test, y_test, "x_test, y_test") if x_test is not None else ffi.NULL
            self.data = [train, test]  # alive as long as the options
            lib.dt_train_options_set_data(self.ptr, train, test)

    @property
    def config(self):
        return lib.dt_train_options_config(self.ptr)


class Trainer:
    """A trainer in this process: Trainer(data=..., model=..., **flags); run(), evaluate(),
    weights(), save(path). x=, y= (x_test=, y_test=) train on numpy arrays instead of data=."""

    def __init__(self, x=None, y=None, x_test=None, y_test=None, **opts):
        self._opts = _Options(opts, x, y, x_test, y_test)
        p = ffi.new("dt_trainer **")
        _check(lib.dt_trainer_create(p, self._opts.config))
        self._t = ffi.gc(p[0], lib.dt_trainer_free)

    def run(self):
        """Runs the remaining epochs (or up to max_steps)."""
        _check(lib.dt_trainer_run(self._t))

    def evaluate(self):
        """{"loss", "acc"} of the current model on the test set (NaN without one)."""
        loss, acc = ffi.new("float *"), ffi.new("float *")
        _check(lib.dt_trainer_evaluate(self._t, loss, acc))
        return {"loss": float(loss[0]), "acc": float(acc[0])}

    def weights(self):
        """The model's tensors by name, as numpy float32 arrays (copies)."""
        return _weights(lib.dt_trainer_model(self._t))

    def save(self, path):
        """Writes a checkpoint (safetensors; loads into the equivalent PyTorch model)."""
        _check(lib.dt_trainer_save(self._t, os.fsencode(path)))

    @property
    def step(self):
        return int(lib.dt_trainer_step(self._t))

    @property
    def spec(self):
        return ffi.string(lib.dt_model_spec(lib.dt_trainer_model(self._t))).decode()


class Result:
    """What train() returns: metrics (one dict per epoch), weights (name -> numpy array), the final
    test_loss and test_acc, and the checkpoint path when save= was given."""

    def __init__(self, metrics, weights, test_loss, test_acc, checkpoint):
        self.metrics, self.weights = metrics, weights
        self.test_loss, self.test_acc, self.checkpoint = test_loss, test_acc, checkpoint

    def __repr__(self):
        return "Result(epochs=%d, test_loss=%.6g, test_acc=%.4g)" % (len(self.metrics), self.test_loss, self.test_acc)


def _read_metrics(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def load_weights(checkpoint):
    """The tensors of a dtrain checkpoint by name, as numpy arrays."""
    p = ffi.new("dt_model **")
    _check(lib.dt_model_load(p, os.fsencode(checkpoint)))
    try:
        return _weights(p[0])
    finally:
        lib.dt_model_free(p[0])


def train(workers=1, timeout=0, x=None, y=None, x_test=None, y_test=None, **opts):
    """Trains like `dtrain train` with these flags (data="fashion-mnist", model="mlp", epochs=1,
    batch=32, optimizer="adam", lr=1e-3 by default), on `workers` local processes; returns a Result."""
    opts = {k.replace("_", "-"): v for k, v in opts.items()}
    with tempfile.TemporaryDirectory(prefix="dtrain-py.") as tmp:
        user_metrics = opts.get("metrics")
        opts["metrics"] = user_metrics or os.path.join(tmp, "metrics.jsonl")
        if workers == 1:
            t = Trainer(x=x, y=y, x_test=x_test, y_test=y_test, **opts)
            t.run()
            ev = t.evaluate()
            weights = t.weights()
        else:
            opts["save"] = opts.get("save") or os.path.join(tmp, "final.safetensors")
            o = _Options(opts, x, y, x_test, y_test)
            _check(lib.dt_train_local(o.config, int(workers), float(timeout)))
            weights = load_weights(opts["save"])
        metrics = _read_metrics(opts["metrics"])
        if workers != 1:
            last = metrics[-1] if metrics else {}
            ev = {"loss": last.get("test_loss") or float("nan"), "acc": last.get("test_acc") or float("nan")}
        return Result(metrics, weights, ev["loss"], ev["acc"], opts.get("save"))


def evaluate(checkpoint, data="fashion-mnist", batch=256):
    """Evaluates a checkpoint like `dtrain eval`: {"loss", "acc", "samples", "split"} ("test", or
    "train" for a data set without a test split)."""
    loss, acc = ffi.new("float *"), ffi.new("float *")
    n, split = ffi.new("int64_t *"), ffi.new("const char **")
    _check(lib.dt_evaluate_checkpoint(os.fsencode(checkpoint), data.encode(), int(batch), loss, acc, n, split))
    return {"loss": float(loss[0]), "acc": float(acc[0]), "samples": int(n[0]), "split": ffi.string(split[0]).decode()}
