"""The ctypes mirror of megatrain.h: every struct's size and field offsets
as a C compiler lays them out from the header, every call of the header
declared; and where the package finds the library."""
import ctypes
import os
import re
import shutil
import subprocess
import sys

import pytest

from megatrain_testlib import ROOT
from megatrain import _lib

HEADER = ROOT / "include" / "megatrain.h"


def c_layout(tmp_path):
    """{struct: (size, {field: offset})} of the header, by the C compiler."""
    cc = os.environ.get("CC", "cc")
    assert shutil.which(cc), f"no C compiler ({cc})"
    lines = ["#include <stdio.h>", "#include <stddef.h>", '#include "megatrain.h"',
             "int main(void) {"]
    for name, cls in _lib.STRUCTS.items():
        lines.append(f'    printf("{name} size %zu\\n", sizeof({name}));')
        for field, _ in cls._fields_:
            lines.append(f'    printf("{name} {field} %zu\\n", offsetof({name}, {field}));')
    lines += ["    return 0;", "}"]
    src = tmp_path / "layout.c"
    src.write_text("\n".join(lines) + "\n")
    exe = tmp_path / "layout"
    subprocess.run([cc, "-std=c11", f"-I{HEADER.parent}", str(src), "-o", str(exe)], check=True)
    out = {}
    for line in subprocess.run([str(exe)], capture_output=True, text=True,
                               check=True).stdout.splitlines():
        name, what, value = line.split()
        entry = out.setdefault(name, [None, {}])
        if what == "size":
            entry[0] = int(value)
        else:
            entry[1][what] = int(value)
    return out


def test_structs_match_the_header(tmp_path):
    layout = c_layout(tmp_path)
    for name, cls in _lib.STRUCTS.items():
        size, fields = layout[name]
        assert {f: getattr(cls, f).offset for f, _ in cls._fields_} == fields, name
        assert ctypes.sizeof(cls) == size, name


def test_every_call_of_the_header_is_declared():
    calls = set(re.findall(r"\b(mt_[a-z0-9_]+)\s*\(", HEADER.read_text()))
    assert calls == set(_lib.PROTOTYPES), calls ^ set(_lib.PROTOTYPES)


def load_in_child(env):
    code = "import megatrain; print(megatrain.library_path()); print(megatrain.library_version())"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=dict(os.environ, **env))


def test_megatrain_lib_names_the_library(tmp_path):
    built = ROOT / os.environ.get("MEGATRAIN_BUILD", "build") / "libmegatrain.so"
    assert built.exists(), f"{built}: run make build"
    p = load_in_child({"MEGATRAIN_LIB": str(built)})
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines() == [str(built), _lib.lib().mt_version().decode()]
    p = load_in_child({"MEGATRAIN_LIB": str(tmp_path / "libnope.so")})
    assert p.returncode != 0
    assert f"MEGATRAIN_LIB={tmp_path / 'libnope.so'}: cannot load it" in p.stderr


def test_the_package_loads_its_own_copy():
    if os.environ.get("MEGATRAIN_LIB"):
        pytest.skip("MEGATRAIN_LIB is set")
    p = load_in_child({})
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines()[0] == os.path.join(_lib.HERE, "libmegatrain.so")
