"""Installs dmove with the libdmove.so that `make python` built (no compiler here, none at
import time: the package loads it with ctypes). Which library: $DMOVE_LIB if set, else
python/dmove/libdmove.so (what `make python` copies), else ../build/libdmove.so."""
import os
import shutil

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

HERE = os.path.dirname(os.path.abspath(__file__))


def find_lib():
    for path in (os.environ.get("DMOVE_LIB"), os.path.join(HERE, "dmove", "libdmove.so"),
                 os.path.join(HERE, "..", "build", "libdmove.so")):
        if path and os.path.exists(path):
            return path
    raise SystemExit("dmove: no libdmove.so: run `make python` in dmove's source tree first "
                     "(or set DMOVE_LIB to a libdmove.so)")


class BuildPy(build_py):
    def run(self):
        super().run()
        dst = os.path.join(self.build_lib, "dmove", "libdmove.so")
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        shutil.copyfile(find_lib(), dst)


class BinaryDistribution(Distribution):
    def has_ext_modules(self):  # a platform wheel: it carries a shared library
        return True


setup(cmdclass={"build_py": BuildPy}, distclass=BinaryDistribution)
