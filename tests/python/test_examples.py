"""The examples check what they need before they work:
examples/train_from_datasets.py without matplotlib stops at once, naming
the package, before it reads the data or trains."""
import subprocess
import sys
import time

from megatrain_testlib import ROOT

BLOCKED = ("import runpy, sys; sys.modules['matplotlib'] = None; "
           "runpy.run_path(sys.argv[1], run_name='__main__')")


def test_train_from_datasets_checks_matplotlib_first():
    start = time.monotonic()
    p = subprocess.run([sys.executable, "-c", BLOCKED,
                        str(ROOT / "examples" / "train_from_datasets.py")],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode != 0
    assert "pip install matplotlib" in p.stderr, p.stderr
    assert p.stdout == "", "nothing read or trained"
    assert time.monotonic() - start < 30
