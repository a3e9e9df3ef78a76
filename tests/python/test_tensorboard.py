"""TensorBoard event files of `megatrain train`, read back by the tensorboard
package's own readers and checked against metrics.jsonl: every tag, step and
value; the TFRecord framing and its CRC32C (with tensorboard's CRC code);
a resumed run (TensorBoard drops what the first run logged past the resume
step, as metrics.jsonl does); and the eval rows against `megatrain eval` on
the checkpoint of the same step.

The binary is $MEGATRAIN (make test sets it), else build/megatrain."""

import json
import math
import os
import re
import shutil
import struct
import subprocess
from pathlib import Path

import pytest
from tensorboard.backend.event_processing import event_accumulator
from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c

ROOT = Path(__file__).resolve().parents[2]
MEGATRAIN = os.environ.get("MEGATRAIN", str(ROOT / "build" / "megatrain"))

# metrics.jsonl key -> TensorBoard tag, as docs/metrics.md lists them.
TAGS = {
    "loss": "train/loss",
    "lr": "train/lr",
    "grad_norm": "train/grad_norm",
    "epoch": "train/epoch",
    "tokens": "train/tokens",
    "tokens_per_s": "perf/tokens_per_s",
    "tflops": "perf/tflops",
    "step_time_s": "perf/step_time_s",
    "h2d_gbps": "perf/h2d_gbps",
    "d2h_gbps": "perf/d2h_gbps",
    "gpu_mem_gb": "memory/gpu_gb",
    "host_mem_gb": "memory/host_gb",
    "eval_loss": "eval/loss",
    "eval_tokens": "eval/tokens",
}
# Keys of metrics.jsonl that are not scalar series.
NOT_SCALARS = {"step", "eta_s", "eval_time_s", "skipped", "loss_text", "grad_norm_text", "nonfinite"}

# The tiny built-in model's shape (its defaults): rows of seq_len 64,
# batch_size 8, micro_batches 2.
SHAPE = ["--seq-len", "64", "--batch-size", "8", "--micro-batches", "2"]


def float32_close(tb_value, json_value):
    """TensorBoard holds float32 (simple_value); metrics.jsonl prints the
    double to 9 significant digits, whose rounding to float32 may land one
    float32 ulp (2^-23 relative) away from rounding the double itself."""
    return math.isclose(tb_value, json_value, rel_tol=2.0**-23, abs_tol=0.0)


def held_out_text(path, lines=60):
    """Deterministic English-like JSONL text (about 4 KB, > 16 rows of 65 bytes)."""
    words = "the jury said that the city was fine and the old man went home".split()
    with open(path, "w") as f:
        for i in range(lines):
            doc = " ".join(words[(i * 7 + k) % len(words)] for k in range(12))
            f.write(json.dumps({"text": f"{doc} ({i})."}) + "\n")


def train(out, *args):
    cmd = [MEGATRAIN, "train", "--device", "cpu", "--out", str(out), "--sample-tokens", "0",
           "--log-every", "1000", *SHAPE, *args]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, f"{' '.join(cmd)}\n{r.stdout}\n{r.stderr}"
    return r.stdout


def metrics_rows(out):
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def scalars(logdir):
    """{tag: {step: value}} as TensorBoard shows it (restarts purged)."""
    acc = event_accumulator.EventAccumulator(str(logdir), size_guidance={"scalars": 0})
    acc.Reload()
    result = {}
    for tag in acc.Tags()["scalars"]:
        events = acc.Scalars(tag)
        steps = [e.step for e in events]
        assert len(steps) == len(set(steps)), f"{tag}: a step logged twice: {steps}"
        result[tag] = {e.step: e.value for e in events}
    return result


def expected_scalars(rows):
    want = {}
    for row in rows:
        for key, value in row.items():
            if key in NOT_SCALARS:
                continue
            assert key in TAGS, f"metrics.jsonl key {key} has no TensorBoard tag in this test"
            want.setdefault(TAGS[key], {})[row["step"]] = value
    return want


def assert_same(got, want):
    assert set(got) == set(want), f"tags {sorted(got)} != {sorted(want)}"
    for tag in want:
        assert sorted(got[tag]) == sorted(want[tag]), f"{tag}: steps differ"
        for step, value in want[tag].items():
            assert float32_close(got[tag][step], value), f"{tag} at step {step}: {got[tag][step]} vs {value}"


@pytest.fixture
def run(tmp_path):
    held_out_text(tmp_path / "valid.jsonl")
    out = tmp_path / "run"
    train(out, "--steps", "8", "--save-every", "4", "--keep-last", "5",
          "--eval-data", str(tmp_path / "valid.jsonl"), "--eval-every", "3")
    return tmp_path, out


def test_scalars_equal_metrics_jsonl(run):
    _, out = run
    rows = metrics_rows(out)
    files = list((out / "tensorboard").iterdir())
    assert len(files) == 1 and re.fullmatch(r"events\.out\.tfevents\.\d{10}\..+", files[0].name)
    assert_same(scalars(out / "tensorboard"), expected_scalars(rows))
    # every training step once, evaluations at 3, 6 and after the last step (8)
    assert [r["step"] for r in rows if "loss" in r] == list(range(1, 9))
    assert [r["step"] for r in rows if "eval_loss" in r] == [3, 6, 8]


def test_event_file_framing_and_first_event(run):
    _, out = run
    (path,) = (out / "tensorboard").iterdir()
    data = path.read_bytes()
    pos, records = 0, 0
    while pos < len(data):
        header = data[pos:pos + 8]
        (length,) = struct.unpack("<Q", header)
        (len_crc,) = struct.unpack("<I", data[pos + 8:pos + 12])
        body = data[pos + 12:pos + 12 + length]
        (body_crc,) = struct.unpack("<I", data[pos + 12 + length:pos + 16 + length])
        assert len_crc == masked_crc32c(header), f"record {records}: length CRC"
        assert body_crc == masked_crc32c(body), f"record {records}: data CRC"
        pos += 16 + length
        records += 1
    assert pos == len(data)
    events = list(EventFileLoader(str(path)).Load())
    assert len(events) == records
    assert events[0].file_version == "brain.Event:2"
    # a fresh run marks its start: TensorBoard drops older steps >= 1 of this logdir
    assert events[1].session_log.status == events[1].session_log.START and events[1].step == 1
    assert all(e.wall_time > 1.6e9 for e in events)


def test_resume_drops_the_lost_steps(run):
    tmp, out = run
    first = metrics_rows(out)
    # the end of the run is lost; it resumes from step 4 (a new event file)
    shutil.rmtree(out / "checkpoints" / "step-00000008")
    shutil.rmtree(out / "model")
    train(out, "--steps", "8", "--save-every", "4", "--keep-last", "5",
          "--eval-data", str(tmp / "valid.jsonl"), "--eval-every", "3", "--resume", "auto")
    assert len(list((out / "tensorboard").iterdir())) == 2
    rows = metrics_rows(out)
    assert_same(scalars(out / "tensorboard"), expected_scalars(rows))
    # CPU resume is exact: the same losses as the uninterrupted run
    assert [r.get("loss") for r in rows] == [r.get("loss") for r in first]
    assert [r.get("eval_loss") for r in rows] == [r.get("eval_loss") for r in first]


def test_eval_loss_equals_megatrain_eval_on_the_checkpoint(tmp_path):
    held_out_text(tmp_path / "valid.jsonl")
    out = tmp_path / "run"
    train(out, "--steps", "8", "--save-every", "4", "--keep-last", "5",
          "--eval-data", str(tmp_path / "valid.jsonl"), "--eval-every", "4")
    evals = {r["step"]: r["eval_loss"] for r in metrics_rows(out) if "eval_loss" in r}
    assert sorted(evals) == [4, 8]
    for step, loss in evals.items():
        ckpt = out / "checkpoints" / f"step-{step:08d}"
        r = subprocess.run([MEGATRAIN, "eval", "--model", str(ckpt), "--tokenizer", "bytes",
                            "--data", str(tmp_path / "valid.jsonl"), "--device", "cpu", *SHAPE],
                           capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        printed = float(re.search(r"loss (\d+\.\d+)", r.stdout).group(1))
        # megatrain eval prints 6 decimals: equal up to that rounding
        assert abs(printed - loss) <= 5e-7, f"step {step}: eval {printed} vs run {loss}"
