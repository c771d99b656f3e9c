"""Writes .npy data sets with numpy for tests/npy.sh: npy_files.py DIR
  DIR/x_train.npy (float32 (600, 2)), y_train.npy (int64), x_test.npy, y_test.npy (int32, shape (n, 1)):
      three Gaussian blobs; and the same train/test data as DIR/blobs_train.csv / blobs_test.csv
      (label first, features printed with repr: exact float32 values)
  DIR/img/x_train.npy: uint8 (300, 4, 4) images written with format version 2.0, y_train.npy uint8
  DIR/bad/*.npy: files the reader must refuse (see tests/npy.sh)"""
import os, sys
import numpy as np

d = sys.argv[1]
os.makedirs(d + "/img", exist_ok=True)
os.makedirs(d + "/bad", exist_ok=True)
rng = np.random.default_rng(3)

def blobs(n):
    y = rng.integers(0, 3, n)
    c = np.array([[0, 0], [3, 0], [0, 3]], dtype=np.float32)
    return (c[y] + rng.normal(0, 0.7, (n, 2))).astype(np.float32), y

x, y = blobs(600)
xt, yt = blobs(200)
np.save(d + "/x_train.npy", x)
np.save(d + "/y_train.npy", y.astype(np.int64))
np.save(d + "/x_test.npy", xt)
np.save(d + "/y_test.npy", yt.astype(np.int32).reshape(-1, 1))
for name, xs, ys in (("train", x, y), ("test", xt, yt)):
    with open(d + "/blobs_%s.csv" % name, "w") as f:
        for row, lab in zip(xs, ys):
            f.write("%d,%s\n" % (lab, ",".join(repr(float(v)) for v in row)))

imgs = rng.integers(0, 256, (300, 4, 4)).astype(np.uint8)
labs = (imgs[:, 0, 0] > 127).astype(np.uint8)
with open(d + "/img/x_train.npy", "wb") as f:
    np.lib.format.write_array(f, imgs, version=(2, 0))
np.save(d + "/img/y_train.npy", labs)

b = d + "/bad/"
np.save(b + "fortran.npy", np.asfortranarray(x))
np.save(b + "bigendian.npy", x.astype(">f4"))
np.save(b + "float_labels.npy", y.astype(np.float32))
np.save(b + "short_labels.npy", y[:10])
np.save(b + "struct.npy", np.zeros(600, dtype=[("a", "<f4"), ("b", "<i4")]))
np.save(b + "int64_x.npy", x.astype(np.int64))
np.save(b + "neg_labels.npy", y - 1)
raw = open(d + "/x_train.npy", "rb").read()
open(b + "cut.npy", "wb").write(raw[:-100])
open(b + "notnpy.npy", "wb").write(b"x,y\n1,2\n")
