"""setuptools hooks of the dtrain package (its metadata is in pyproject.toml): the wheel carries
the build's libdtrain.so and dtrain command in dtrain/_native/, so `import dtrain` finds them
with no environment variable. They come from $DTRAIN_BUILD when set (a build directory),
else ../build beside this directory (`make` in the source tree); with neither, the package is
built without them and finds the system's at import (`make install`), saying so here."""
import os
import shutil
import sys

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

HERE = os.path.dirname(os.path.abspath(__file__))
NATIVE = ("libdtrain.so", "dtrain")


def native_dir():
    """The build directory whose libdtrain.so and dtrain the package carries, or None."""
    env = os.environ.get("DTRAIN_BUILD")
    for d in ([env] if env else []) + [os.path.join(HERE, "..", "build")]:
        if all(os.path.isfile(os.path.join(d, f)) for f in NATIVE):
            return os.path.abspath(d)
    if env:
        sys.exit("DTRAIN_BUILD=%s has no libdtrain.so and dtrain: run make there first" % env)
    return None


class BuildPy(build_py):
    def run(self):
        super().run()
        src = native_dir()
        if src is None:
            print("dtrain: no built tree beside python/ (make) and no DTRAIN_BUILD: the package will use the "
                  "system's libdtrain and dtrain (make install)", file=sys.stderr)
            return
        dest = os.path.join(self.build_lib, "dtrain", "_native")
        os.makedirs(dest, exist_ok=True)
        for f in NATIVE:
            shutil.copy2(os.path.join(src, f), os.path.join(dest, f))  # keeps dtrain executable


class NativeDistribution(Distribution):
    """A wheel that carries native code is tagged for this platform, not py3-none-any."""

    def has_ext_modules(self):
        return native_dir() is not None


setup(cmdclass={"build_py": BuildPy}, distclass=NativeDistribution)
