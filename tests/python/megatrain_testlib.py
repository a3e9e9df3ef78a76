"""Shared pieces of the Python tests of the megatrain package: the
repository, the `megatrain` command they compare with (MEGATRAIN_CLI, else
build/megatrain), the fixture tokenizers, a small run's options.
scripts/test_python.sh runs them (make test)."""
import json
import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CLI = Path(os.environ.get("MEGATRAIN_CLI", ROOT / "build" / "megatrain"))
TOKENIZER = ROOT / "tests" / "fixtures" / "tokenizer" / "tiny_bytelevel.json"
# with <s> and </s>: what the llama2 chat template (the one picked for it) needs
SP_TOKENIZER = ROOT / "tests" / "fixtures" / "tokenizer" / "tiny_sp.json"

# A short CPU run: 6 steps of 2 rows of 32 tokens, a short warmup so that
# the loss moves, fp32 weights so that they can be compared byte for byte.
SMALL_RUN = {"device": "cpu", "steps": 6, "seq_len": 32, "batch_size": 2, "micro_batches": 1,
             "warmup_steps": 2, "save_every": 0, "sample_tokens": 0, "save_dtype": "fp32",
             "log_every": 1}


def run_cli(*args, check=True):
    """The megatrain command with args; its CompletedProcess (text)."""
    assert CLI.exists(), f"{CLI} is missing: run make build (or set MEGATRAIN_CLI)"
    p = subprocess.run([str(CLI), *map(str, args)], capture_output=True, text=True)
    if check and p.returncode != 0:
        raise AssertionError(f"megatrain {' '.join(map(str, args))} failed ({p.returncode}):\n"
                             f"{p.stdout}\n{p.stderr}")
    return p


def write_yaml(path, options):
    """options as a flat YAML mapping (strings double-quoted, as JSON: YAML
    reads them so)."""
    with open(path, "w") as f:
        for k, v in options.items():
            f.write(f"{k}: {json.dumps(str(v) if isinstance(v, Path) else v)}\n")
    return path


def write_jsonl(path, records):
    with open(path, "w", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    return path


def metrics_losses(out):
    """The loss of each step of out/metrics.jsonl, as the text written."""
    rows = [json.loads(line, parse_float=str) for line in open(Path(out) / "metrics.jsonl")]
    return [r["loss"] for r in rows]


def sft_records(n=40):
    return [{"prompt": f"What is {i} plus {i + 1}? ", "completion": f"It is {2 * i + 1}."}
            for i in range(n)]
