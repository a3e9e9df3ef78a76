"""Records, Parquet or JSONL -> a .mtok token file, through the library's
tokenizer (the file `megatrain tokenize` writes from the same records in
JSONL, byte for byte; docs/data.md describes it).

    python -m megatrain.tokenize --tokenizer tokenizer.json --data DATA --out OUT.mtok
        [--split train] [--format auto|text|completion|chat]
        [--chat-template auto|llama3|qwen|llama2|mistral|chatml|phi3|gemma] [--skip-bad-lines]

DATA: a Hugging Face Hub-style dataset folder of Parquet files
(data/train-00000-of-00001.parquet; read with pyarrow), a .parquet file, a
folder written by `datasets` save_to_disk, or a .jsonl file. From Python,
tokenize() also takes a datasets.Dataset or any iterable of dicts.
"""
import argparse
import os
import sys
import time

from . import _lib
from .data import Dataset

FORMATS = ("auto", "text", "completion", "chat")
TEMPLATES = ("auto", "llama3", "qwen", "llama2", "mistral", "chatml", "phi3", "gemma")


def tokenize(data, tokenizer, out, *, format=None, chat_template=None, skip_bad_lines=False,
             split=None):
    """Tokenizes data (a path or records: megatrain.data) with tokenizer (a
    tokenizer.json, "bytes" or a Tokenizer) into the .mtok file out; returns
    what was written (documents, tokens, trainable, skipped_lines, format,
    chat_template)."""
    if format == "tokens":
        raise _lib.MegatrainError("format tokens: the input is already tokenized")
    with Dataset(data, tokenizer, format=format, chat_template=chat_template,
                 skip_bad_lines=skip_bad_lines, split=split) as d:
        info = d.info
        if info["format"] == "tokens":
            raise _lib.MegatrainError(f"{os.fspath(data)} is already a .mtok file")
        d.save(out)
        return info


class _OlderSpelling(argparse.Action):
    """--data-format, also read as --format (its older spelling, as `megatrain
    tokenize` reads it) with a note on stderr."""

    def __call__(self, parser, namespace, values, option_string=None):
        if option_string == "--format":
            print(f"{parser.prog}: --format is deprecated: it is now spelt --data-format (the "
                  "same option)", file=sys.stderr)
        setattr(namespace, self.dest, values)


def main(argv=None):
    ap = argparse.ArgumentParser(
        prog="python -m megatrain.tokenize",
        description="Tokenize a Parquet dataset folder, a .parquet or a .jsonl file into a .mtok "
                    "token file with the library's tokenizer.")
    ap.add_argument("--tokenizer", required=True,
                    help="tokenizer.json, or 'bytes' for the built-in byte tokenizer")
    ap.add_argument("--data", required=True,
                    help="Hub-style folder of .parquet files, a .parquet, a save_to_disk folder "
                         "or a .jsonl file")
    ap.add_argument("--out", required=True, help="the .mtok file to write")
    ap.add_argument("--split", help="which split of a dataset folder (default: train when there "
                                    "is one, else every file)")
    ap.add_argument("--data-format", "--format", dest="data_format", choices=FORMATS,
                    default="auto", action=_OlderSpelling,
                    help="the records' layout (default: detected)")
    ap.add_argument("--chat-template", choices=TEMPLATES, default="auto")
    ap.add_argument("--skip-bad-lines", action="store_true",
                    help="skip (and count) malformed records instead of failing")
    a = ap.parse_args(argv)
    t0 = time.monotonic()
    try:
        info = tokenize(a.data, a.tokenizer, a.out, format=a.data_format,
                        chat_template=a.chat_template, skip_bad_lines=a.skip_bad_lines,
                        split=a.split)
    except _lib.MegatrainError as e:
        print(f"python -m megatrain.tokenize: {e}", file=sys.stderr)
        return 1
    s = time.monotonic() - t0
    chat = {None: "", "model": " with the model's chat template"}.get(
        info["chat_template"], f" with the built-in chat template {info['chat_template']}")
    print(f"{a.out}: {info['documents']} documents, {info['tokens']} tokens, "
          f"{info['trainable']} trainable, format {info['format']}{chat}, "
          f"{info['skipped_lines']} records skipped")
    print(f"{s:.2f} s: {info['tokens'] / s:.0f} tokens/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
