"""`pip install ./python` installs the `megatrain` command (a console
script; also `python -m megatrain`): the program `make build` builds, the
same output and exit status for the same arguments."""
import os
import shutil
import subprocess
import sys

from megatrain_testlib import run_cli

# the console script beside the interpreter of the environment
SCRIPT = os.path.join(os.path.dirname(sys.executable), "megatrain")


def run(cmd, *args):
    return subprocess.run([*cmd, *map(str, args)], capture_output=True, text=True)


def test_the_package_installs_the_command(tmp_path):
    assert os.access(SCRIPT, os.X_OK), f"{SCRIPT}: no console script"
    for cmd in ([SCRIPT], [sys.executable, "-m", "megatrain"]):
        for args in (["--version"], ["plan", "--preset", "7b", "--gpu-mem", "139",
                                      "--host-mem", "125"]):
            got, want = run(cmd, *args), run_cli(*args)
            assert (got.returncode, got.stdout) == (0, want.stdout), got.stderr
        bad = run(cmd, "eval", "--seq-len", "-1")
        assert bad.returncode == 2 and "--seq-len" in bad.stderr and bad.stdout == ""
    # a short run through it
    p = run([SCRIPT], "train", "--device", "cpu", "--steps", 2, "--sample-tokens", 0,
            "--save-every", 0, "--out", tmp_path / "run")
    assert p.returncode == 0, p.stderr
    assert (tmp_path / "run" / "model" / "config.json").exists()
    # the PATH of the environment finds it
    env = dict(os.environ, PATH=os.path.dirname(SCRIPT) + os.pathsep + os.environ["PATH"])
    assert shutil.which("megatrain", path=env["PATH"]) == SCRIPT
