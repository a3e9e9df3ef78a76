"""Records (dicts) -> the JSONL the library reads: each record's fields of
the formats (docs/data.md) as one line; errors in terms of the records.

A run takes from an iterable only the records it needs (save_records with
a Budget): they are written, and counted in tokens as the run will
tokenize them, in chunks of growing size until the tokens fill the run's
steps; an endless generator is read no further. Files written here are
removed on every way out, an exception, Ctrl-C or SIGTERM included, except
the run's data file once complete."""
import contextlib
import hashlib
import io
import itertools
import json
import os
import re
import signal
import tempfile
import threading
from collections.abc import Mapping

from . import _lib

FIELDS = ("text", "prompt", "completion", "messages", "conversations", "instruction", "input",
          "output", "system", "history", "tools", "documents", "chat_template_kwargs", "chosen",
          "rejected")
SHAPES = ("{'text': ...}, {'prompt': ..., 'completion': ...}, "
          "{'prompt': ..., 'chosen': ..., 'rejected': ...} (preference pairs), "
          "{'messages': [{'role': ..., 'content': ...}, ...]}, "
          "{'conversations': [{'from': ..., 'value': ...}, ...]} or "
          "{'instruction': ..., 'input': ..., 'output': ...}")


def fields(text_field=None):
    """The fields of a record the library reads."""
    return FIELDS + ((text_field,) if text_field and text_field not in FIELDS else ())


def _project(rec, i, keep):
    if not isinstance(rec, Mapping):
        raise _lib.MegatrainError(f"record {i}: expected a dict like {SHAPES}, got "
                                  f"{type(rec).__name__} {rec!r:.40}")
    return {k: rec[k] for k in keep if k in rec}


def _lines(records, text_field=None, start=0):
    """(index, JSONL line) of each record."""
    keep = fields(text_field)
    for i, rec in enumerate(records, start):
        try:
            yield i, json.dumps(_project(rec, i, keep), ensure_ascii=False) + "\n"
        except (TypeError, ValueError) as e:
            raise _lib.MegatrainError(f"record {i}: {e}; its fields must be text, numbers, lists "
                                      "and dicts (messages a list of {'role', 'content', ...} "
                                      "dicts)") from None


def explain(msg, path, first=0):
    """A library message about a JSONL written from records (the first of
    them record `first`), in terms of the records: "PATH:LINE:" becomes
    "record N:"."""
    msg = re.sub(re.escape(path) + r":(\d+):",
                 lambda m: f"record {first + int(m.group(1)) - 1}:", msg)
    return msg.replace(path, "the records").replace("--skip-bad-lines", "skip_bad_lines=True")


@contextlib.contextmanager
def removed_on_signals():
    """SIGTERM and SIGHUP raise SystemExit in the main thread while inside,
    so that `finally` blocks remove what they wrote (Python's default for
    them is to die at once); the handlers are restored on the way out."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum, frame):
        raise SystemExit(128 + signum)

    old = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def write_jsonl(records, f, text_field=None):
    """Writes records to the text file f, one JSON object per line; returns
    (count, sha256 hex of what was written)."""
    h = hashlib.sha256()
    n = 0
    for _, line in _lines(records, text_field):
        f.write(line)
        h.update(line.encode("utf-8"))
        n += 1
    if n == 0:
        raise _lib.MegatrainError(f"data: no records; give at least one, like {SHAPES}")
    return n, h.hexdigest()


class TempJsonl:
    """Records written to a temporary JSONL file for one library call,
    removed on exit: `with TempJsonl(records) as path:`."""

    def __init__(self, records, text_field=None):
        self.records, self.text_field = records, text_field

    def __enter__(self):
        self._signals = removed_on_signals()
        self._signals.__enter__()
        fd, self.path = tempfile.mkstemp(prefix="megatrain-records-", suffix=".jsonl")
        try:
            with io.open(fd, "w", encoding="utf-8") as f:
                self.count, self.sha = write_jsonl(self.records, f, self.text_field)
        except BaseException:
            os.unlink(self.path)
            self._signals.__exit__(None, None, None)
            raise
        return self.path

    def __exit__(self, exc_type, exc, tb):
        try:
            os.unlink(self.path)
        finally:
            self._signals.__exit__(None, None, None)
        if isinstance(exc, _lib.MegatrainError):
            raise _lib.MegatrainError(explain(str(exc), self.path)) from None


class Budget:
    """What a run needs of its records: `tokens` tokens as count(path)
    measures those of a JSONL file (the run's tokenizer and format)."""

    def __init__(self, tokens, count):
        self.tokens, self.count = tokens, count


def _count_chunk(budget, lines, first, folder):
    fd, path = tempfile.mkstemp(prefix=".count-", suffix=".jsonl", dir=folder)
    try:
        with io.open(fd, "w", encoding="utf-8") as f:
            f.writelines(lines)
        return budget.count(path)
    except _lib.MegatrainError as e:
        raise _lib.MegatrainError(explain(str(e), path, first)) from None
    finally:
        os.unlink(path)


def _write_bounded(records, f, text_field, budget, folder):
    """Writes records until their tokens reach the budget; returns (count,
    sha256 hex)."""
    h, n, have, size = hashlib.sha256(), 0, 0, 64
    it = _lines(records, text_field)
    while have < budget.tokens:
        chunk = [line for _, line in itertools.islice(it, size)]
        if not chunk:
            break
        have += _count_chunk(budget, chunk, n, folder)
        f.writelines(chunk)
        for line in chunk:
            h.update(line.encode("utf-8"))
        n, size = n + len(chunk), min(2 * size, 1 << 16)
    if n == 0:
        raise _lib.MegatrainError(f"data: no records; give at least one, like {SHAPES}")
    return n, h.hexdigest()


def save_records(records, folder, text_field=None, budget=None):
    """Writes records to FOLDER/data-HASH.jsonl (HASH: of the content, so
    the same records give the same file, and a run resumed with them reads
    the file it started with); returns its path. With a budget, only the
    records that fill it are taken."""
    os.makedirs(folder, exist_ok=True)
    with removed_on_signals():
        fd, tmp = tempfile.mkstemp(prefix=".data-", suffix=".jsonl.tmp", dir=folder)
        try:
            with io.open(fd, "w", encoding="utf-8") as f:
                if budget is None:
                    _, sha = write_jsonl(records, f, text_field)
                else:
                    _, sha = _write_bounded(records, f, text_field, budget, folder)
                f.flush()
                os.fsync(f.fileno())
            path = os.path.join(folder, f"data-{sha[:16]}.jsonl")
            os.replace(tmp, path)
            return path
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
