"""Builds libmegatrain.so and the megatrain command with the repository's
Makefile and puts a copy of each in the package (the command is installed
as the console script `megatrain`: megatrain/cli.py), so that `pip install
./python` is the one command. The
version is the library's (include/megatrain.h). Environment:
  MEGATRAIN_BUILD  the make build folder, relative to the repository root
                   (default: build, the one `make build` uses)
  MAKEFLAGS        as for make (-j is set to the number of CPUs otherwise)
"""
import os
import re
import shutil
import subprocess

from setuptools import setup
from setuptools.command.build_py import build_py

try:
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:  # setuptools < 70.1
    from wheel.bdist_wheel import bdist_wheel

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
HEADER = os.path.join(ROOT, "include", "megatrain.h")


def version():
    if not os.path.exists(HEADER):
        raise SystemExit(f"{HEADER} not found: build the package from a megatrain checkout "
                         "(pip install ./python in the repository root)")
    with open(HEADER) as f:
        return re.search(r'#define MT_VERSION "([^"]+)"', f.read()).group(1)


class BuildWithLibrary(build_py):
    """build_py, plus `make BUILD/libmegatrain.so BUILD/megatrain` and a copy
    of each (the command as megatrain/bin/megatrain, executable)."""

    def run(self):
        super().run()
        build = os.environ.get("MEGATRAIN_BUILD", "build")
        lib, exe = os.path.join(build, "libmegatrain.so"), os.path.join(build, "megatrain")
        cmd = ["make", "-C", ROOT, f"BUILD={build}", lib, exe]
        if "-j" not in os.environ.get("MAKEFLAGS", ""):
            cmd.insert(1, f"-j{os.cpu_count() or 1}")
        print("megatrain: " + " ".join(cmd))
        subprocess.check_call(cmd)
        dest = os.path.join(self.build_lib, "megatrain")
        os.makedirs(os.path.join(dest, "bin"), exist_ok=True)
        shutil.copyfile(os.path.join(ROOT, lib), os.path.join(dest, "libmegatrain.so"))
        shutil.copyfile(os.path.join(ROOT, exe), os.path.join(dest, "bin", "megatrain"))
        os.chmod(os.path.join(dest, "bin", "megatrain"), 0o755)


class PlatformWheel(bdist_wheel):
    """The wheel holds a shared library for this platform, but no CPython
    extension: any Python 3 of this platform loads it (py3-none-PLATFORM)."""

    def finalize_options(self):
        super().finalize_options()
        self.root_is_pure = False

    def get_tag(self):
        _, _, plat = super().get_tag()
        return "py3", "none", plat


setup(version=version(), cmdclass={"build_py": BuildWithLibrary, "bdist_wheel": PlatformWheel})
