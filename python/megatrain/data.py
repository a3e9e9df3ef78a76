"""Training data from Python: any iterable of dicts (a `datasets.Dataset`, a
list, a generator), a pyarrow Table, a Hugging Face Hub-style folder of
Parquet files, or a JSONL / .mtok path that the library reads itself.

A Hugging Face Hub dataset name ("org/name", not a path here) is loaded
with the `datasets` package (megatrain.hub). Records take the shapes the library's JSONL loader accepts (docs/data.md):
    {"text": "..."}                  (or the text under another key: text_field)
    {"prompt": "...", "completion": "..."}   (or lists of messages, TRL's)
    {"messages": [{"role": "system"|"user"|"assistant", "content": "..."}, ...]}
    {"conversations": [{"from": "human"|"gpt", "value": "..."}, ...]}   (sharegpt)
    {"instruction": "...", "input": "...", "output": "..."}             (alpaca)
The adapter writes them as JSONL (only these fields; the loader ignores the
others) and hands the file to the library, so a list of dicts and the same
records in a JSONL file give the same tokens. Errors name the record by its
index (0-based) in the iterable.
"""
import ctypes
import os
import re
from collections.abc import Iterable, Mapping

from . import _lib, hub
from .records import SHAPES, TempJsonl, fields
from .tokenizer import as_tokenizer

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


def _parquet_records(files, text_field=None):
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise _lib.MegatrainError("reading Parquet needs pyarrow: pip install pyarrow") from None
    for f in files:
        pf = pq.ParquetFile(f)
        want = fields(text_field)
        cols = [c for c in pf.schema_arrow.names if c in want]
        if not cols:
            raise _lib.MegatrainError(
                f"{f}: no column named {', '.join(want)}; give text_field= the text column's "
                f"name, or rename it (records look like {SHAPES})")
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


def source(data, split=None, text_field=None):
    """("path", p) for what the library reads itself (JSONL, .mtok), else
    ("records", iterable of dicts)."""
    if is_path(data):
        p = os.fsdecode(data)
        if os.path.isdir(p):
            if _is_saved_dataset(p):
                return "records", _load_saved(p, split)
            return "records", _parquet_records(parquet_files(p, split), text_field)
        if p.endswith(".parquet"):
            return "records", _parquet_records([p], text_field)
        if hub.is_hub_name(p):
            return "records", hub.load_dataset(p, split)
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


# ---- data sets (mt_dataset) ---------------------------------------------

class Dataset(_lib.Handle):
    """Data as the trainer sees it: documents tokenized (JSONL, records) or
    mapped (.mtok), packed into rows. `data` is anything `source` takes;
    `tokenizer` a Tokenizer, a tokenizer.json path or "bytes" (None for a
    .mtok, then give vocab_size). Close it (or use `with`) to release it."""
    _kind = "dataset"

    def __init__(self, data, tokenizer=None, *, format=None, chat_template=None, packing=None,
                 skip_bad_lines=False, seed=1, epochs=1, vocab_size=0, split=None,
                 text_field=None):
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
        o.text_field = _lib.enc(text_field)  # NULL: "text"
        # the library keeps no pointer to the tokenizer after loading
        tok, owned = (None, False) if tokenizer is None else as_tokenizer(tokenizer)
        try:
            kind, src = source(data, split, text_field)

            def load(path):
                if tok is None:
                    return _lib.check(L.mt_dataset_load(_lib.enc(path), None, ctypes.byref(o)))
                with tok.use() as th:
                    return _lib.check(L.mt_dataset_load(_lib.enc(path), th, ctypes.byref(o)))

            if kind == "path":
                self._h = load(src)
            else:
                with TempJsonl(src, text_field) as path:
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
