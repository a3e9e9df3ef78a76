"""Records from an iterable are taken as far as the run needs them: an
endless generator with steps set trains (its data file holds the first
records only, counted in the run's tokens), the records taken are those a
list of them gives; and what is written on the way is removed on every
way out: an exception from the generator, Ctrl-C, SIGTERM."""
import itertools
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

import megatrain
from megatrain_testlib import SMALL_RUN

OPTS = dict(SMALL_RUN, steps=2)


def endless(pulled):
    for i in itertools.count():
        pulled.append(i)
        yield {"text": f"Record {i}: the quick brown fox jumps over the lazy dog."}


def files_in(folder):
    return sorted(os.listdir(folder)) if os.path.isdir(folder) else []


def test_an_endless_generator_trains_on_what_the_steps_need(tmp_path):
    pulled = []
    with megatrain.Run(OPTS, out=tmp_path / "run", data=endless(pulled)) as run:
        losses = [m["loss"] for m in run.metrics()]
        data = run.data
    assert len(losses) == 2
    # 2 steps of 2 rows of 33 tokens: the first chunk (64 records) covers them
    assert 0 < len(pulled) <= 64
    with open(data) as f:
        lines = f.readlines()
    assert len(lines) == len(pulled)
    # the same records as a list give the same file, and the same losses
    records = [{"text": f"Record {i}: the quick brown fox jumps over the lazy dog."}
               for i in range(len(pulled))]
    with megatrain.Run(OPTS, out=tmp_path / "list", data=records) as run:
        assert [m["loss"] for m in run.metrics()] == losses
        assert os.path.basename(run.data) == os.path.basename(data)
    assert [f for f in files_in(tmp_path / "run") if f.startswith((".data-", ".count-"))] == []


def test_the_records_taken_fill_the_steps(tmp_path):
    # 200 steps need more than the first chunk: the chunks grow until the
    # tokens cover 200 x 2 rows of 33 tokens; the run then does all its steps
    pulled = []
    opts = dict(OPTS, steps=200, log_every=100)
    summary = megatrain.train(opts, out=tmp_path / "run", data=endless(pulled), on_event=None)
    assert summary["steps"] == 200
    with megatrain.Dataset(summary["data"], "bytes") as d:
        assert d.info["tokens"] >= 200 * 2 * 33
    # a record is 59 tokens or so: chunks of 64, 128 and 256 records reach it
    assert len(pulled) == 64 + 128 + 256


def test_a_failing_generator_leaves_no_file(tmp_path):
    def failing():
        yield from ({"text": f"record {i}"} for i in range(100))
        raise RuntimeError("the source broke")

    with pytest.raises(RuntimeError, match="the source broke"):
        megatrain.Run(dict(OPTS, steps=0), out=tmp_path / "run", data=failing())
    assert files_in(tmp_path / "run") == []


# The child takes Python's own Ctrl-C handler even when started with SIGINT
# ignored (as a shell's background jobs are), like a program in a terminal.
SLOW = textwrap.dedent("""
    import itertools, signal, sys, time
    signal.signal(signal.SIGINT, signal.default_int_handler)
    import megatrain
    def slow():
        for i in itertools.count():
            if i == 50:
                print("writing", flush=True)
            time.sleep(0.001)
            yield {"text": f"record {i}"}
    megatrain.train({"device": "cpu", "steps": 0, "out": sys.argv[1]}, data=slow())
""")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_while_writing_leaves_no_file(tmp_path, sig):
    out = tmp_path / "run"
    p = subprocess.Popen([sys.executable, "-c", SLOW, str(out)], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "writing"
    time.sleep(0.2)
    assert any(f.startswith(".data-") for f in files_in(out)), "the data file is being written"
    p.send_signal(sig)
    _, err = p.communicate(timeout=60)
    assert p.returncode != 0
    assert [f for f in files_in(out) if f != ".megatrain.lock"] == [], err
