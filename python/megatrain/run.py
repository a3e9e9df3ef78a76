"""Training runs (mt_options, mt_run): `train(config)` and `Run`.

A config is what `megatrain train --config` reads (docs/config.md): a dict
of those keys, the path of a YAML file, or YAML text; keyword arguments
override it. Its `data` may also be records (a `datasets.Dataset`, a list
of dicts, a generator, a Parquet folder, a Hub dataset name:
megatrain.data), which are written as JSONL into the run directory
(out/data-HASH.jsonl) for the library to read: with `steps` set, only as
many records as the steps need (megatrain.records). Its `model` may be a
Hub name (megatrain.hub).
"""
import ctypes
import json
import numbers
import os
import tempfile
from collections.abc import Mapping

from . import _events, _lib, hub
from .data import Dataset, is_path, source
from .records import Budget, explain, save_records
from .tokenizer import Tokenizer


def _option_text(key, v):
    """A value as the text mt_options_set takes (what YAML would say)."""
    if v is None:
        return ""  # empty: "none", as `resume:` in YAML
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, os.PathLike):
        return os.fspath(v)
    if isinstance(v, (str, numbers.Real)):
        return str(v)  # a float's repr reads back as the same double
    raise _lib.MegatrainError(f"{key}: a {type(v).__name__} is not an option value; give text, "
                              "a number or True/False")


def _load_yaml(o, config):
    """config: a YAML file's path, or YAML text (which has a ':' or a line
    break and names no file)."""
    L = _lib.lib()
    text = os.fspath(config)
    if os.path.exists(text) or not (":" in text or "\n" in text):
        _lib.check(L.mt_options_load_yaml(o, _lib.enc(text)))
        return
    fd, path = tempfile.mkstemp(prefix="megatrain-config-", suffix=".yaml")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        if L.mt_options_load_yaml(o, _lib.enc(path)):
            raise _lib.MegatrainError(_lib.last_error().replace(path, "config"))
    finally:
        os.unlink(path)


def get_option(o, key):
    L = _lib.lib()
    n = _lib.check(L.mt_options_get(o, _lib.enc(key), None, 0))
    buf = ctypes.create_string_buffer(n + 1)
    L.mt_options_get(o, _lib.enc(key), buf, n + 1)
    return buf.value.decode("utf-8")


def _budget(o):
    """What the run of options o needs of its records, in tokens (None:
    all of them, for steps = 0), counted with its tokenizer and format."""
    steps, epochs = int(get_option(o, "steps")), int(get_option(o, "epochs"))
    if steps == 0 or get_option(o, "objective") != "sft":  # pairs: all of them
        return None
    rows = steps * int(get_option(o, "micro_batches")) * int(get_option(o, "batch_size"))
    tokens = -(-rows // epochs) * (int(get_option(o, "seq_len")) + 1)
    opts = {k: get_option(o, k) or None for k in ("chat_template", "text_field")}
    opts["format"] = get_option(o, "data_format")
    opts["skip_bad_lines"] = get_option(o, "skip_bad_lines") == "true"
    tok = get_option(o, "tokenizer") or "bytes"

    def count(path):
        with Tokenizer(tok) as t, Dataset(path, t, **opts) as d:
            return d.info["tokens"]
    return Budget(tokens, count)


def make_options(config=None, overrides=None):
    """(an mt_options handle the caller frees, the path records were saved
    to or None): the options of config and overrides, resolved as the run
    will use them, their `data` records (if any) saved into the run
    directory."""
    L = _lib.lib()
    o = L.mt_options_new()
    try:
        values = {}
        if isinstance(config, Mapping):
            values.update(config)
        elif config is not None:
            if not is_path(config):
                raise _lib.MegatrainError(
                    f"config: a {type(config).__name__}; give a dict, a YAML file's path or "
                    "YAML text")
            _load_yaml(o, config)
        values.update(overrides or {})
        if "lambda_" in values:  # `lambda` is a Python keyword
            values["lambda"] = values.pop("lambda_")
        data = values.pop("data", None)
        if data is not None and is_path(data) and not hub.is_hub_name(os.fsdecode(data)):
            values["data"], data = os.fsdecode(data), None
        split = values.pop("split", None)
        if isinstance(values.get("model"), (str, os.PathLike)):
            values["model"] = hub.model_dir(os.fspath(values["model"]))
        for k, v in values.items():
            _lib.check(L.mt_options_set(o, _lib.enc(k), _lib.enc(_option_text(k, v))))
        # a Parquet folder or a saved dataset named by the config file too
        path = get_option(o, "data")
        if data is None and path and (os.path.isdir(path) or path.endswith(".parquet")):
            data = path
        _lib.check(L.mt_options_resolve(o))
        saved = None
        if data is not None:
            field = get_option(o, "text_field")
            kind, src = source(data, split, field)
            if kind == "records":
                src = saved = save_records(src, get_option(o, "out"), field, _budget(o))
            _lib.check(L.mt_options_set(o, b"data", _lib.enc(src)))
        return o, saved
    except BaseException:
        L.mt_options_free(o)
        raise


def options_dict(config=None, **overrides):
    """Every option as the run would use it (after defaults, config and
    overrides), as a dict (what out/config.yaml will say)."""
    L = _lib.lib()
    o, _ = make_options(config, overrides)
    try:
        return json.loads(_lib.take_string(L.mt_options_to_json(o)))
    finally:
        L.mt_options_free(o)


class Run(_lib.Handle):
    """A training run, stepped by the caller:

        with megatrain.Run({"steps": 20, "device": "cpu"}) as run:
            for m in run.metrics():
                print(m["step"], m["loss"])
            run.finish()

    Opening takes the run directory `out` (refused while another run holds
    it), loads the model, tokenizer and data, and resumes when `resume`
    says so. on_event(event) gets what the run reports (megatrain.Event;
    megatrain.print_event prints it as the command line does). Closing
    releases everything; what was saved stays, steps since the last
    checkpoint are lost.

    Threads: the calls on a run (step, save, close, ...) run one at a time;
    close() from another thread waits for the step in progress (for
    train(), for the whole training), and a step after it raises "it was
    closed". The callback must not call the run (refused)."""
    _kind = "run"

    def __init__(self, config=None, *, on_event=None, **options):
        L = _lib.lib()
        self._h = None
        self.losses = []
        self._cb = _events.Callback(on_event, self._hook)  # kept: the library calls it
        o, saved = make_options(config, options)
        try:
            self.out = get_option(o, "out")
            self.data = get_option(o, "data") or None
            self._h = L.mt_run_open(o, self._cb.c_fn, None)
            err = None if self._h else _lib.last_error()
        finally:
            L.mt_options_free(o)
        self._cb.raise_pending()
        if err is not None:
            raise _lib.MegatrainError(explain(err, saved) if saved else err)

    def _hook(self, ev):
        if ev.kind == "step" and ev.step["loss"] is not None:
            self.losses.append(ev.step["loss"])


    def _call(self, fn):
        with self.use() as h:  # one call at a time, whatever the thread (_lib.Handle)
            rc = fn(h)
            self._cb.raise_pending()
        return _lib.check(rc)

    def step(self):
        """One optimizer step: its metrics as a dict (step, total_steps,
        epoch, loss, lr, grad_norm, tokens, tokens_per_s, ...; None where a
        value does not apply), or None when there is no step to do."""
        m = _lib.StepMetrics()
        rc = self._call(lambda h: _lib.lib().mt_run_step(h, ctypes.byref(m)))
        return None if rc == 1 else _events.metrics_dict(m)

    def metrics(self):
        """Steps until there is none, yielding each step's metrics."""
        while (m := self.step()) is not None:
            yield m

    def save(self):
        """A resume checkpoint of the current step in out/checkpoints; a run
        opened with resume="auto" continues from it, bit for bit."""
        self._call(_lib.lib().mt_run_save)

    def finish(self):
        """Ends the training: a last checkpoint (when save_every > 0), the
        final Hugging Face model in out/model, the sample. No step after."""
        self._call(_lib.lib().mt_run_finish)

    def train(self):
        """The whole of `megatrain train` from here: steps until there is
        none, then finish. Ctrl-C (SIGINT) or SIGTERM saves a checkpoint and
        stops; the summary then says interrupted. Returns summary()."""
        rc = self._call(_lib.lib().mt_run_train)
        return self.summary(interrupted=rc == 1)

    @property
    def steps_done(self):
        return self._call(_lib.lib().mt_run_steps_done)

    @property
    def total_steps(self):
        return self._call(_lib.lib().mt_run_total_steps)

    def summary(self, interrupted=False):
        """steps, total_steps, first_loss and final_loss (of the steps this
        object ran), losses, interrupted, and the paths: out, model (when
        written), metrics, config, data."""
        model = os.path.join(self.out, "model")
        return {
            "steps": self.steps_done, "total_steps": self.total_steps,
            "first_loss": self.losses[0] if self.losses else None,
            "final_loss": self.losses[-1] if self.losses else None,
            "losses": list(self.losses), "interrupted": interrupted, "out": self.out,
            "model": model if os.path.exists(os.path.join(model, "config.json")) else None,
            "metrics": os.path.join(self.out, "metrics.jsonl"),
            "config": os.path.join(self.out, "config.yaml"), "data": self.data,
        }

    def _release(self, h):
        _lib.lib().mt_run_close(h)


def train(config=None, *, on_event=_events.print_event, **options):
    """Trains as `megatrain train --config` does and returns a summary
    (final_loss, losses, steps, paths: see Run.summary). config: a dict of
    the YAML keys of docs/config.md, a YAML file's path or YAML text;
    options override it (train("run.yaml", steps=10)). data may be records
    (a datasets.Dataset, a list of dicts, a Parquet folder). on_event
    prints progress as the command line does; None for silence."""
    with Run(config, on_event=on_event, **options) as run:
        return run.train()
