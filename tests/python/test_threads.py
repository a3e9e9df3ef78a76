"""A run (or a model) used from several threads: every call on one handle
runs alone (the library takes a handle from one thread at a time), close()
from another thread waits for the step in progress, and a callback that
calls back into its run is refused. Each case runs in a child interpreter:
before these rules, two threads stepping one run corrupted it silently and
a close() during a step crashed the interpreter (SIGSEGV)."""
import json
import subprocess
import sys
import textwrap

from megatrain_testlib import SMALL_RUN


def run_child(code, tmp_path):
    """Runs code in a child Python with `megatrain`, `opts` (a small run in
    tmp_path/run) and `out`; returns what it printed as JSON on its last
    line. A crash is a failure naming the signal."""
    prelude = textwrap.dedent(f"""
        import json, threading, time
        import megatrain
        from pathlib import Path
        out = Path({str(tmp_path / "run")!r})
        opts = {json.dumps(dict(SMALL_RUN))}
        opts["out"] = str(out)
    """)
    p = subprocess.run([sys.executable, "-c", prelude + textwrap.dedent(code)],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, f"the child exited with {p.returncode}:\n{p.stdout}\n{p.stderr}"
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_two_threads_stepping_one_run_take_turns(tmp_path):
    r = run_child("""
        opts.update(steps=40, save_every=0)
        with megatrain.Run(dict(opts, out=str(out) + "-alone")) as run:
            alone = {m["step"]: m["loss"] for m in run.metrics()}
            run.finish()
        got, errors = [], []

        def slow(ev):  # a step event comes inside the step: make the steps overlap
            if ev.kind == "step":
                time.sleep(0.005)

        with megatrain.Run(opts, on_event=slow) as run:
            def worker():
                try:
                    got.extend((m["step"], m["loss"]) for m in run.metrics())
                except Exception as e:
                    errors.append(repr(e))
            threads = [threading.Thread(target=worker) for _ in range(2)]
            [t.start() for t in threads]
            [t.join() for t in threads]
            done = run.steps_done
            run.finish()
        same = open(out / "model" / "model.safetensors", "rb").read() == \\
            open(str(out) + "-alone/model/model.safetensors", "rb").read()
        print(json.dumps({"steps": sorted(s for s, _ in got), "errors": errors, "done": done,
                          "losses_match": all(alone[s] == l for s, l in got), "same": same}))
    """, tmp_path)
    assert r["errors"] == []
    assert r["steps"] == list(range(1, 41)) and r["done"] == 40, "each step exactly once"
    assert r["losses_match"] and r["same"], "the run of two threads is the run of one"


def test_close_from_another_thread_during_a_step_waits_for_it(tmp_path):
    r = run_child("""
        inside, outcome = threading.Event(), {}

        def on_event(ev):  # inside the step: hold it while the main thread closes
            if ev.kind == "step":
                inside.set()
                time.sleep(0.3)

        # save_every 1: after its event the step saves a checkpoint from the
        # host store, which a close() that did not wait would have freed
        run = megatrain.Run(dict(opts, steps=100, save_every=1), on_event=on_event)

        def worker():
            try:
                for m in run.metrics():
                    outcome["last"] = m["step"]
            except megatrain.MegatrainError as e:
                outcome["error"] = str(e)

        t = threading.Thread(target=worker)
        t.start()
        inside.wait()
        run.close()  # the step in progress ends first; the next one finds the run closed
        t.join()
        print(json.dumps(outcome))
    """, tmp_path)
    assert r["last"] == 1 and "it was closed" in r["error"], r


def test_a_callback_calling_its_own_run_is_refused(tmp_path):
    r = run_child("""
        msgs = []
        holder = {}

        def on_event(ev):
            if ev.kind == "step" and not msgs:
                holder["run"].close()

        with megatrain.Run(opts, on_event=on_event) as run:
            holder["run"] = run
            try:
                run.step()
            except megatrain.MegatrainError as e:
                msgs.append(str(e))
            msgs.append(run.step()["step"])  # still open, and it goes on
        print(json.dumps(msgs))
    """, tmp_path)
    assert "not re-entrant" in r[0] and r[1] == 2, r


def test_a_models_tokenizer_dies_with_the_model(tmp_path):
    r = run_child("""
        megatrain.train(dict(opts, steps=1), on_event=None)
        m = megatrain.Model(out / "model", tokenizer="bytes")
        tok = m.tokenizer
        pieces = []  # its tokenizer inside a call on the model: allowed
        m.generate("ab", max_new_tokens=2, device="cpu",
                   on_text=lambda t: pieces.append(tok.encode(t)))
        assert pieces, "on_text was not called"
        ids = tok.encode("ab")
        m.close()
        try:
            tok.encode("ab")
            err = None
        except megatrain.MegatrainError as e:
            err = str(e)
        print(json.dumps([ids, err]))
    """, tmp_path)
    assert r[0] == [97, 98] and "closed" in r[1], r
