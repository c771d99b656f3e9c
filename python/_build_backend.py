"""The PEP 517 build backend of python/: setuptools' own (setuptools.build_meta). pip builds in
an isolated environment that hides the installed setuptools and would download one from PyPI,
which fails offline; with no build requirements, this backend finds the system's setuptools
(Debian's python3-setuptools) instead, so `pip install ./python` works without a network."""
import site
import sys

try:
    from setuptools import build_meta as _meta
except ImportError:  # pip's isolated build environment: look in the interpreter's own site dirs
    extra = list(getattr(site, "getsitepackages", lambda: [])())
    extra += ["/usr/lib/python3/dist-packages", "/usr/local/lib/python3/dist-packages"]
    extra += ["%s/lib/python3/dist-packages" % p for p in (sys.base_prefix, sys.prefix)]
    sys.path.extend(p for p in extra if p not in sys.path)
    from setuptools import build_meta as _meta

build_wheel = _meta.build_wheel
build_sdist = _meta.build_sdist


def _present(reqs):
    """The requirements not importable here (setuptools asks for `wheel`; the system has it)."""
    missing = []
    for r in reqs:
        try:
            __import__(r.split(">")[0].split("=")[0].split("<")[0].strip())
        except ImportError:
            missing.append(r)
    return missing


def get_requires_for_build_wheel(config_settings=None):
    return _present(_meta.get_requires_for_build_wheel(config_settings))


def get_requires_for_build_sdist(config_settings=None):
    return _present(_meta.get_requires_for_build_sdist(config_settings))


prepare_metadata_for_build_wheel = _meta.prepare_metadata_for_build_wheel
