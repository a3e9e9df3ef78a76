"""What a run or a generation reports (mt_event), as Python objects handed to
a Python callable. The library calls back on the thread that made the
call, during it; an exception raised by the callable is kept and raised
once the call returns (ctypes cannot carry it through C)."""
import math
import sys
from dataclasses import dataclass
from typing import Callable, Optional

from . import _lib

KINDS = {_lib.EVENT_INFO: "info", _lib.EVENT_WARNING: "warning", _lib.EVENT_STEP: "step",
         _lib.EVENT_TEXT: "text"}


@dataclass
class Event:
    """kind: "info" (a line of information), "warning", "step" (an optimizer
    step finished: `step` holds its metrics; `text` its progress line on the
    steps `log_every` asks for, else None) or "text" (generated text, a
    piece as it comes)."""
    kind: str
    text: Optional[str] = None
    step: Optional[dict] = None


def metrics_dict(m):
    """An mt_step_metrics as a dict; a value that does not apply (no GPU,
    no ETA yet) is None."""
    d = _lib.struct_dict(m)
    for k, v in d.items():
        if isinstance(v, float) and math.isnan(v):
            d[k] = None
    for k in ("tokens", "skipped"):
        if d[k] == -1:
            d[k] = None
    return d


def print_event(ev):
    """Prints an event as `megatrain train` does: information and progress
    lines on stdout, warnings on stderr, generated text as it comes."""
    if ev.kind == "info":
        print(ev.text, flush=True)
    elif ev.kind == "warning":
        print(f"megatrain: {ev.text}", file=sys.stderr, flush=True)
    elif ev.kind == "step" and ev.text:
        print(ev.text, flush=True)
    elif ev.kind == "text":
        print(ev.text, end="", flush=True)


class Callback:
    """An mt_event_fn that calls hook(event) then fn(event) (each may be
    None). Its owner keeps it, and with it the ctypes function, alive as
    long as the library may call it."""

    def __init__(self, fn: Optional[Callable] = None, hook: Optional[Callable] = None):
        self.fn, self.hook = fn, hook
        self.pending = None
        self.c_fn = _lib.EventFn(self._call)

    def _call(self, ev_p, user):
        if self.pending is not None:
            return
        try:
            e = ev_p.contents
            text = e.text.decode("utf-8", "replace") if e.text is not None else None
            step = metrics_dict(e.step.contents) if e.step else None
            ev = Event(KINDS.get(e.kind, str(e.kind)), text, step)
            if self.hook:
                self.hook(ev)
            if self.fn:
                self.fn(ev)
        except BaseException as exc:  # raised again by raise_pending
            self.pending = exc

    def raise_pending(self):
        """Raises what the callable raised during the last call, if anything."""
        exc, self.pending = self.pending, None
        if exc is not None:
            raise exc
