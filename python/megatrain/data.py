"""Training data from Python: any iterable of dicts (a `datasets.Dataset`, a
list, a generator), a pyarrow Table, a Hugging Face Hub-style folder of
Parquet files, or a JSONL / .mtok path that the library reads itself.

Records take the three shapes the library's JSONL loader accepts
(docs/data.md):
    {"text": "..."}
    {"prompt": "...", "completion": "..."}
    {"messages": [{"role": "system"|"user"|"assistant", "content": "..."}, ...]}
The adapter writes them as JSONL (only these fields; the loader ignores the
others) and hands the file to the library, so a list of dicts and the same
records in a JSONL file give the same tokens. Errors name the record by its
index (0-based) in the iterable.
"""
import ctypes
import hashlib
import io
import json
import os
import re
import tempfile
from collections.abc import Iterable, Mapping

from . import _lib
from .tokenizer import as_tokenizer

FIELDS = ("text", "prompt", "completion", "messages")
MESSAGE_FIELDS = ("role", "content")
SHAPES = ("{'text': ...}, {'prompt': ..., 'completion': ...} or "
          "{'messages': [{'role': ..., 'content': ...}, ...]}")


def is_path(data):
    return isinstance(data, (str, bytes, os.PathLike))


# ---- where records come from ------------------------------------------

def _is_saved_dataset(path):
    """A folder written by `datasets` save_to_disk."""
    return any(os.path.exists(os.path.join(path, f)) for f in ("state.json", "dataset_dict.json"))


def _split_of(rel):
    """The split a Hub file belongs to: a folder named after it
    (default/train/0000.parquet) or a name starting with it
    (data/train-00000-of-00001.parquet)."""
    parts = rel.split(os.sep)
    m = re.match(r"([A-Za-z0-9_.]+?)[-.]", parts[-1])
    return parts, (m.group(1) if m else None)


def _in_split(rel, split):
    parts, name_split = _split_of(rel)
    return split in parts[:-1] or name_split == split


def parquet_files(path, split=None):
    """The Parquet files of path (a file, or a Hub-style dataset folder),
    those of `split` when given; with no split, those of "train" when the
    folder has one, else all."""
    path = os.fspath(path)
    if os.path.isfile(path):
        return [path]
    rels = sorted(os.path.relpath(os.path.join(d, f), path)
                  for d, _, fs in os.walk(path) for f in fs if f.endswith(".parquet"))
    if not rels:
        raise _lib.MegatrainError(
            f"{path}: no .parquet files in it; give a Hugging Face dataset folder "
            "(data/train-00000-of-00001.parquet), a .parquet, .jsonl or .mtok file")
    want = split if split is not None else ("train" if any(_in_split(r, "train") for r in rels)
                                             else None)
    if want is None:
        return [os.path.join(path, r) for r in rels]
    chosen = [r for r in rels if _in_split(r, want)]
    if not chosen:
        found = sorted({_split_of(r)[1] or r for r in rels})
        raise _lib.MegatrainError(f"{path}: no Parquet files of split '{want}' (found: "
                                  f"{', '.join(found)}); give split= one of them")
    return [os.path.join(path, r) for r in chosen]


def _parquet_records(files):
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise _lib.MegatrainError("reading Parquet needs pyarrow: pip install pyarrow") from None
    for f in files:
        pf = pq.ParquetFile(f)
        cols = [c for c in pf.schema_arrow.names if c in FIELDS]
        if not cols:
            raise _lib.MegatrainError(
                f"{f}: no column named {', '.join(FIELDS)}; rename the text column (records "
                f"look like {SHAPES})")
        for batch in pf.iter_batches(batch_size=1024, columns=cols):
            yield from batch.to_pylist()


def _load_saved(path, split):
    try:
        import datasets
    except ImportError:
        raise _lib.MegatrainError(f"{path} was written by `datasets` (save_to_disk): reading it "
                                  "needs it: pip install datasets") from None
    ds = datasets.load_from_disk(path)
    return _pick_split(ds, split, path)


def _pick_split(ds, split, name):
    """A datasets.DatasetDict's split (train when none is given)."""
    if not (isinstance(ds, Mapping) and ds and all(hasattr(v, "column_names")
                                                   for v in ds.values())):
        return ds
    want = split or ("train" if "train" in ds else None)
    if want not in ds:
        raise _lib.MegatrainError(f"{name}: a dataset with splits {', '.join(ds)}; give "
                                  "split= one of them (or data=dataset['train'])")
    return ds[want]


def source(data, split=None):
    """("path", p) for what the library reads itself (JSONL, .mtok), else
    ("records", iterable of dicts)."""
    if is_path(data):
        p = os.fsdecode(data)
        if os.path.isdir(p):
            if _is_saved_dataset(p):
                return "records", _load_saved(p, split)
            return "records", _parquet_records(parquet_files(p, split))
        if p.endswith(".parquet"):
            return "records", _parquet_records([p])
        return "path", p
    data = _pick_split(data, split, "data")
    if isinstance(data, Mapping):
        raise _lib.MegatrainError(
            f"data: one dict is not a data set; give a list of records like {SHAPES}")
    if hasattr(data, "to_batches") and hasattr(data, "schema"):  # a pyarrow Table
        return "records", (r for b in data.to_batches() for r in b.to_pylist())
    if not isinstance(data, Iterable):
        raise _lib.MegatrainError(
            f"data: a {type(data).__name__} is neither a path nor an iterable of records; give "
            f"a JSONL/.mtok/Parquet path, a datasets.Dataset or a list of records like {SHAPES}")
    return "records", data


# ---- records -> JSONL ---------------------------------------------------

def _project(rec, i):
    if not isinstance(rec, Mapping):
        raise _lib.MegatrainError(f"record {i}: expected a dict like {SHAPES}, got "
                                  f"{type(rec).__name__} {rec!r:.40}")
    out = {k: rec[k] for k in FIELDS if k in rec}
    msgs = out.get("messages")
    if isinstance(msgs, (list, tuple)):
        out["messages"] = [{k: m[k] for k in MESSAGE_FIELDS if k in m}
                           if isinstance(m, Mapping) else m for m in msgs]
    return out


def write_jsonl(records, f):
    """Writes records to the text file f, one JSON object per line; returns
    (count, sha256 hex of what was written)."""
    h = hashlib.sha256()
    n = 0
    for i, rec in enumerate(records):
        try:
            line = json.dumps(_project(rec, i), ensure_ascii=False) + "\n"
        except (TypeError, ValueError) as e:
            raise _lib.MegatrainError(f"record {i}: {e}; its fields must be text (and messages "
                                      "a list of {'role', 'content'} dicts)") from None
        f.write(line)
        h.update(line.encode("utf-8"))
        n += 1
    if n == 0:
        raise _lib.MegatrainError(f"data: no records; give at least one, like {SHAPES}")
    return n, h.hexdigest()


def explain(msg, path):
    """A library message about the JSONL written from records, in terms of
    the records: "PATH:LINE:" becomes "record LINE-1:"."""
    msg = re.sub(re.escape(path) + r":(\d+):", lambda m: f"record {int(m.group(1)) - 1}:", msg)
    return msg.replace(path, "the records").replace("--skip-bad-lines", "skip_bad_lines=True")


class TempJsonl:
    """Records written to a temporary JSONL file for one library call,
    removed on exit: `with TempJsonl(records) as path:`."""

    def __init__(self, records):
        self.records = records

    def __enter__(self):
        fd, self.path = tempfile.mkstemp(prefix="megatrain-records-", suffix=".jsonl")
        try:
            with io.open(fd, "w", encoding="utf-8") as f:
                self.count, self.sha = write_jsonl(self.records, f)
        except BaseException:
            os.unlink(self.path)
            raise
        return self.path

    def __exit__(self, exc_type, exc, tb):
        os.unlink(self.path)
        if isinstance(exc, _lib.MegatrainError):
            raise _lib.MegatrainError(explain(str(exc), self.path)) from None


def save_records(records, folder):
    """Writes records to FOLDER/data-HASH.jsonl (HASH: of the content, so
    the same records give the same file, and a run resumed with them reads
    the file it started with); returns its path."""
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".data-", suffix=".jsonl.tmp", dir=folder)
    try:
        with io.open(fd, "w", encoding="utf-8") as f:
            _, sha = write_jsonl(records, f)
            f.flush()
            os.fsync(f.fileno())
        path = os.path.join(folder, f"data-{sha[:16]}.jsonl")
        os.replace(tmp, path)
        return path
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


# ---- data sets (mt_dataset) ---------------------------------------------

class Dataset(_lib.Handle):
    """Data as the trainer sees it: documents tokenized (JSONL, records) or
    mapped (.mtok), packed into rows. `data` is anything `source` takes;
    `tokenizer` a Tokenizer, a tokenizer.json path or "bytes" (None for a
    .mtok, then give vocab_size). Close it (or use `with`) to release it."""
    _kind = "dataset"

    def __init__(self, data, tokenizer=None, *, format=None, chat_template=None, packing=None,
                 skip_bad_lines=False, seed=1, epochs=1, vocab_size=0, split=None):
        L = _lib.lib()
        self._h = None
        o = _lib.DatasetOpts()
        L.mt_dataset_opts_defaults(ctypes.byref(o))
        o.format, o.chat_template = _lib.enc(format), _lib.enc(chat_template)  # NULL: auto
        o.packing = _lib.enc(packing)  # NULL: auto (documents for completion and chat data)
        o.skip_bad_lines = _lib.to_c("skip_bad_lines", ctypes.c_bool, skip_bad_lines)
        o.seed = _lib.to_c("seed", ctypes.c_uint64, seed)
        o.epochs = _lib.to_c("epochs", ctypes.c_int64, epochs)
        o.vocab_size = _lib.to_c("vocab_size", ctypes.c_int64, vocab_size)
        # the library keeps no pointer to the tokenizer after loading
        tok, owned = (None, False) if tokenizer is None else as_tokenizer(tokenizer)
        try:
            kind, src = source(data, split)
            def load(path):
                if tok is None:
                    return _lib.check(L.mt_dataset_load(_lib.enc(path), None, ctypes.byref(o)))
                with tok.use() as th:
                    return _lib.check(L.mt_dataset_load(_lib.enc(path), th, ctypes.byref(o)))

            if kind == "path":
                self._h = load(src)
            else:
                with TempJsonl(src) as path:
                    self._h = load(path)
        finally:
            if owned:
                tok.close()


    @property
    def info(self):
        """documents, tokens, trainable, skipped_lines, format, chat_template,
        packing."""
        i = _lib.DatasetInfo()
        with self.use() as h:
            _lib.lib().mt_dataset_describe(h, ctypes.byref(i))
        return _lib.struct_dict(i)

    def next_batch(self, rows, seq_len):
        """The next rows of seq_len+1 tokens, packed: (tokens, targets, pos),
        each a list of `rows` lists of seq_len ids (targets -100 where a
        token carries no loss; pos each token's position within its
        document when documents are packed, else None); None at the end of
        the data."""
        rows = _lib.to_c("rows", ctypes.c_int64, rows)
        seq_len = _lib.to_c("seq_len", ctypes.c_int64, seq_len)
        if rows < 1 or seq_len < 1:
            raise ValueError(f"rows {rows} and seq_len {seq_len}: both must be at least 1")
        n = rows * seq_len
        tokens, targets = (ctypes.c_int32 * n)(), (ctypes.c_int32 * n)()
        pos = (ctypes.c_int32 * n)() if self.info["packing"] == "documents" else None
        with self.use() as h:
            end = _lib.lib().mt_dataset_next_batch(h, rows, seq_len, tokens, targets, pos)
        if end:
            return None
        split = lambda a: [a[r * seq_len:(r + 1) * seq_len] for r in range(rows)]  # noqa: E731
        return split(tokens), split(targets), split(pos) if pos is not None else None

    def batches(self, rows, seq_len):
        """next_batch until the end of the data."""
        while (b := self.next_batch(rows, seq_len)) is not None:
            yield b

    def save(self, path):
        """Writes the documents as tokenized to a .mtok file (what `megatrain
        tokenize` writes)."""
        with self.use() as h:
            rc = _lib.lib().mt_dataset_save(h, _lib.enc(os.fspath(path)))
        _lib.check(rc)

    def _release(self, h):
        _lib.lib().mt_dataset_free(h)
