"""numpy data sets for dtrain: features and labels checked here, then written as an IDX directory
(the MNIST format, big-endian; train-images-idxD-*, train-labels-idx1-*, t10k-* for a test set)
that `dtrain train --data DIR` reads exactly: float32 features, or uint8 pixels (scaled by 1/255
as Fashion-MNIST's are), and int32 class labels, or float32 regression targets for a model whose
spec ends in "mse"."""
import os

import numpy as np

from ._command import Error

_IDX_TYPES = {np.dtype(np.uint8): (0x08, ">u1", "ubyte"), np.dtype(np.float32): (0x0D, ">f4", "float"),
              np.dtype(np.int32): (0x0C, ">i4", "int")}


def features(x, what):
    """x as a C-contiguous uint8 or float32 array of shape (n, ...), 2 to 4 dims."""
    x = np.asarray(x)
    if x.ndim not in (2, 3, 4):
        raise Error("EINVAL", "%s: need shape (n, features), (n, H, W) or (n, C, H, W); got %s" % (what, x.shape))
    if x.dtype != np.uint8:
        if not (np.issubdtype(x.dtype, np.floating) or np.issubdtype(x.dtype, np.integer) or x.dtype == bool):
            raise Error("EINVAL", "%s: need numbers; got dtype %s" % (what, x.dtype))
        x = x.astype(np.float32)
        if not np.isfinite(x).all():
            row = int(np.argwhere(~np.isfinite(x.reshape(len(x), -1)))[0][0])
            raise Error("EINVAL", "%s: row %d holds a NaN or infinity (as float32); fix or drop it" % (what, row))
    return np.ascontiguousarray(x)


def regression(model, y=None):
    """Whether a model spec ends in mse: its loss is mean squared error against float targets
    (model None: a checkpoint the command resolves; then y decides, and the command checks)."""
    if model is None:
        return y is not None and np.issubdtype(y.dtype, np.floating) and not (np.isfinite(y) & (y == np.round(y))).all()
    return model.split()[-1] == "mse"


def labels(y, n, what, model):
    """y as the targets of n samples for model: float32 regression targets where its spec ends in
    mse, else int32 class labels; float targets that are not whole numbers are refused there (the
    loss is cross-entropy over classes; the message says what to do)."""
    y = np.asarray(y)
    if y.ndim == 2 and y.shape[1] == 1:
        y = y[:, 0]
    reg = regression(model, y)
    if y.ndim != 1 or len(y) != n:
        raise Error("EINVAL", "%s: need %d %s, shape (%d,); got shape %s" % (what, n, "targets" if reg else "labels", n, y.shape))
    if reg:
        if not (y.dtype == bool or np.issubdtype(y.dtype, np.number)):
            raise Error("EINVAL", "%s: need numbers as regression targets; got dtype %s" % (what, y.dtype))
        t = np.ascontiguousarray(y, dtype=np.float32)
        if not np.isfinite(t).all():
            raise Error("EINVAL", "%s: target %d is %r (as float32); fix or drop it" % (what, int(np.argmin(np.isfinite(t))),
                                                                                      float(t[np.argmin(np.isfinite(t))])))
        return t
    if y.dtype == bool or np.issubdtype(y.dtype, np.integer):
        if len(y) and (y.min() < 0 or y.max() > np.iinfo(np.int32).max):
            raise Error("EINVAL", "%s: class labels must be 0, 1, 2, ...; found %d" % (what, y.min() if y.min() < 0 else y.max()))
        return np.ascontiguousarray(y, dtype=np.int32)
    if not np.issubdtype(y.dtype, np.floating):
        raise Error("EINVAL", "%s: need integer class labels; got dtype %s" % (what, y.dtype))
    whole = np.isfinite(y) & (y == np.round(y)) & (y >= 0)
    if not whole.all():
        i = int(np.argmin(whole))
        raise Error("EINVAL", "%s: float targets (row %d is %r) do not fit model '%s': its loss is softmax "
                    "cross-entropy over classes, which needs class labels 0, 1, 2, ...; for regression end the "
                    "model with one output and the mean-squared-error loss, e.g. model=\"linear(32) relu linear(1) "
                    "mse\"" % (what, i, float(y[i]), model))
    return np.ascontiguousarray(y, dtype=np.int32)


def _write_idx(path, a):
    code, be, _ = _IDX_TYPES[a.dtype]
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(bytes([0, 0, code, a.ndim]))
        f.write(np.asarray(a.shape, dtype=">u4").tobytes())
        f.write(np.ascontiguousarray(a, dtype=be).tobytes())
    os.replace(tmp, path)


def write_dir(directory, x, y, x_test=None, y_test=None, model="mlp"):
    """Writes x, y (and x_test, y_test) as an IDX data directory, replacing what it held, once all
    of them are checked; returns it."""
    if x_test is not None and y_test is None:
        raise Error("EINVAL", "x_test without y_test: give both, or neither")
    sets = [("train", x, y, "x, y")] + ([("t10k", x_test, y_test, "x_test, y_test")] if x_test is not None else [])
    files, shape = [], None
    for prefix, xs, ys, what in sets:
        xs = features(xs, what)
        if shape is not None and xs.shape[1:] != shape:
            raise Error("EINVAL", "%s: samples of shape %s, but x's are %s" % (what, xs.shape[1:], shape))
        shape = xs.shape[1:]
        files.append(("%s-images-idx%d-%s" % (prefix, xs.ndim, _IDX_TYPES[xs.dtype][2]), xs))
        ys = labels(ys, len(xs), what, model)
        files.append(("%s-labels-idx1-%s" % (prefix, _IDX_TYPES[ys.dtype][2]), ys))
    os.makedirs(directory, exist_ok=True)
    for name in os.listdir(directory):
        os.unlink(os.path.join(directory, name))
    for name, a in files:
        _write_idx(os.path.join(directory, name), a)
    return directory
