"""What a run or a generation reports (mt_event), as Python objects handed to
a Python callable. The library calls back on the thread that made the
call, during it; an exception raised by the callable is kept and raised
once the call returns (ctypes cannot carry it through C)."""
import math
import shutil
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


def _duration(s):
    if s is None or s < 0:
        return "?"
    t = int(s + 0.5)
    return f"{t // 3600}h{t // 60 % 60:02d}m" if t >= 3600 else \
        f"{t // 60}m{t % 60:02d}s" if t >= 60 else f"{t}s"


def progress_bar(m, width=80):
    """A step's progress bar, as `megatrain train` draws it in a terminal:
    "42% [####------] 42/100 | loss 2.3456 | 12.3k tok/s | ETA 3m05s"."""
    r = m.get("tokens_per_s")
    rate = "?" if r is None else f"{r / 1e6:.2f}M" if r >= 1e6 else \
        f"{r / 1e3:.1f}k" if r >= 1e3 else f"{r:.0f}"
    total = m.get("total_steps") or 0
    frac = min(1.0, m["step"] / total) if total > 0 else 0.0
    loss = m.get("loss")
    tail = (f" {m['step']}/{total} | loss {'?' if loss is None else f'{loss:.4f}'} | "
            f"{rate} tok/s | ETA {_duration(m.get('eta_s'))}")
    cells = min(30, width - len(tail) - 7)
    bar = f"{100 * frac:3.0f}%"
    if cells >= 5:
        full = int(frac * cells)
        bar += " [" + "#" * full + "-" * (cells - full) + "]"
    return (bar + tail)[:max(1, width - 1)]


class _Printer:
    """print_event: the lines of `megatrain train`, and in a terminal its
    progress bar, redrawn in place at every step."""

    def __init__(self):
        self.shown = False

    def _clear(self):
        if self.shown:
            sys.stdout.write("\r\033[K")
            self.shown = False

    def __call__(self, ev):
        """Prints an event as `megatrain train` does: information and
        progress lines on stdout, warnings on stderr, generated text as it
        comes; in a terminal a progress bar at every step."""
        if ev.kind in ("info", "warning", "text") or (ev.kind == "step" and ev.text):
            self._clear()
        if ev.kind == "info":
            print(ev.text, flush=True)
        elif ev.kind == "warning":
            sys.stdout.flush()
            print(f"megatrain: {ev.text}", file=sys.stderr, flush=True)
        elif ev.kind == "step":
            if ev.text:
                print(ev.text)
            m = ev.step
            if m and m["step"] < (m.get("total_steps") or 0) and sys.stdout.isatty():
                width = shutil.get_terminal_size((80, 24)).columns
                sys.stdout.write("\r" + progress_bar(m, width) + "\033[K")
                self.shown = True
            sys.stdout.flush()
        elif ev.kind == "text":
            print(ev.text, end="", flush=True)


print_event = _Printer()


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
