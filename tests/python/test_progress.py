"""megatrain.print_event shows a run as `megatrain train` does
(tests/cpu/test_progress.c): in a terminal a progress bar redrawn in place
at every step between the lines of every log_every steps; in a pipe the
lines only, no carriage return."""
import os
import pty
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent("""
    import sys
    import megatrain
    megatrain.train({"device": "cpu", "steps": 6, "log_every": 3, "save_every": 0,
                     "sample_tokens": 0, "tensorboard": False, "out": sys.argv[1]})
""")


def run(out, terminal):
    """The output of SCRIPT, its stdout a pseudo-terminal or a pipe."""
    if not terminal:
        p = subprocess.run([sys.executable, "-c", SCRIPT, str(out)], capture_output=True,
                           text=True, check=True)
        return p.stdout
    master, slave = pty.openpty()
    p = subprocess.Popen([sys.executable, "-c", SCRIPT, str(out)], stdout=slave,
                         stderr=subprocess.PIPE, env=dict(os.environ, COLUMNS="100"))
    os.close(slave)
    chunks = []
    while True:
        try:
            b = os.read(master, 4096)
        except OSError:  # EIO: the child closed the terminal
            break
        if not b:
            break
        chunks.append(b)
    os.close(master)
    assert p.wait() == 0, p.stderr.read()
    return b"".join(chunks).decode("utf-8")


def test_a_bar_in_a_terminal_lines_in_a_pipe(tmp_path):
    tty = run(tmp_path / "a", True)
    for s in range(1, 6):
        assert tty.count(f"] {s}/6 | loss ") == 1, tty
    assert "\r 17% [#" in tty and "tok/s | ETA " in tty, tty
    assert tty.count("step 3/6 | loss") == 1 and tty.count("step 6/6 | loss") == 1, tty
    assert tty.count("6/6 | loss") == 1, "no bar after the last step"
    piped = run(tmp_path / "b", False)
    assert "\r" not in piped
    assert piped.count("| loss") == 2, piped
