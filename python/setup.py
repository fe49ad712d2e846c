"""Installs dmove with the libdmove.so that `make python` built (no compiler here, none at
import time: the package loads it with ctypes). Which library: $DMOVE_LIB if set, else
python/dmove/libdmove.so (what `make python` copies), else ../build/libdmove.so. With it
the `dmove` program of the same build, which the whole-model commands run (dmove.pretrain,
dmove.embed, ...): $DMOVE_BIN if set, else the dmove beside the library taken, else
python/dmove/bin/dmove; without one those commands look for dmove on the PATH."""
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


def find_program(lib):
    # the program of the library's build first: DMOVE_LIB's, then make python's copy
    for path in (os.environ.get("DMOVE_BIN"), os.path.join(os.path.dirname(lib), "dmove"),
                 os.path.join(HERE, "dmove", "bin", "dmove")):
        if path and os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    print("dmove: no dmove program beside the library (make python copies it): "
          "dmove.pretrain and the other commands will look for dmove on the PATH")
    return None


class BuildPy(build_py):
    def run(self):
        super().run()
        lib = find_lib()
        dst = os.path.join(self.build_lib, "dmove", "libdmove.so")
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        shutil.copyfile(lib, dst)
        prog = find_program(lib)
        if prog:
            pdst = os.path.join(self.build_lib, "dmove", "bin", "dmove")
            os.makedirs(os.path.dirname(pdst), exist_ok=True)
            shutil.copyfile(prog, pdst)
            os.chmod(pdst, 0o755)


class BinaryDistribution(Distribution):
    def has_ext_modules(self):  # a platform wheel: it carries a shared library
        return True


setup(cmdclass={"build_py": BuildPy}, distclass=BinaryDistribution)
