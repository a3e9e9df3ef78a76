"""W&B and MLflow callbacks (megatrain.integrations): a run's step metrics
reach the tracker under TensorBoard's tags, at their steps, equal to what
metrics.jsonl holds. W&B in its offline mode, MLflow with a local store;
a tracker that is not installed is skipped, saying so."""
import json
import sys
import time

import pytest

import megatrain
from megatrain.integrations import MLflowCallback, WandbCallback, chain, scalars
from megatrain_testlib import SMALL_RUN


def metrics_rows(out):
    return [json.loads(line) for line in open(out / "metrics.jsonl")]


def test_scalars_use_the_tensorboard_tags():
    s = scalars({"step": 3, "loss": 2.5, "lr": 1e-3, "gpu_mem_gb": None,
                 "tflops": float("nan"), "tokens": 64})
    assert s == {"train/loss": 2.5, "train/lr": 1e-3, "train/tokens": 64.0}


def test_mlflow_gets_every_step(tmp_path, monkeypatch):
    pytest.importorskip("mlflow", reason="mlflow not installed (pip install mlflow-skinny)")
    from mlflow.tracking import MlflowClient
    # a local store without a server: mlflow-skinny has no database
    # backend; its file store asks to be allowed
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    uri = (tmp_path / "mlruns").as_uri()
    seen = []
    with MLflowCallback(tracking_uri=uri, experiment_name="megatrain-test",
                        params={"steps": 6}) as cb:
        megatrain.train(SMALL_RUN, out=tmp_path / "run", on_event=chain(seen.append, cb))
        run_id = cb.run_id
    client = MlflowClient(tracking_uri=uri)
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.data.params == {"steps": "6"}
    rows = metrics_rows(tmp_path / "run")
    history = sorted((m.step, m.value) for m in client.get_metric_history(run_id, "train/loss"))
    # metrics.jsonl prints 9 significant digits: within 5e-9 relative
    assert history == [(r["step"], pytest.approx(r["loss"], rel=1e-8)) for r in rows]
    assert len(history) == 6 and len([e for e in seen if e.kind == "step"]) == 6
    # a run that raises ends FAILED
    with pytest.raises(megatrain.MegatrainError):
        with MLflowCallback(tracking_uri=uri) as cb:
            with megatrain.Run(SMALL_RUN, out=tmp_path / "run2", on_event=cb) as run:
                run.step()
                megatrain.Model("/nonexistent/model")
    assert client.get_run(cb.run_id).info.status == "FAILED"


def wandb_records(path):
    """The records of a W&B offline run file (run-ID.wandb): a 7-byte
    header, then the records in LevelDB's log format (blocks of 32 KiB;
    each piece: CRC 4 bytes, length 2, type 1: full, first, middle, last)."""
    data = open(path, "rb").read()
    assert data[:4] == b":W&B", path
    pos, block, out, parts = 7, 32768, [], b""
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header
            pos += block - pos % block
            continue
        length = int.from_bytes(data[pos + 4:pos + 6], "little")
        kind = data[pos + 6]
        if pos + 7 + length > len(data):  # still being written
            break
        piece = data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind == 0 and length == 0:
            continue
        parts = piece if kind in (1, 2) else parts + piece
        if kind in (1, 4):
            out.append(parts)
    return out


def test_wandb_offline_gets_every_step(tmp_path, monkeypatch):
    pytest.importorskip("wandb", reason="wandb not installed (pip install wandb)")
    from wandb.proto import wandb_internal_pb2
    for k, v in {"WANDB_MODE": "offline", "WANDB_DIR": str(tmp_path), "WANDB_SILENT": "true",
                 "WANDB_CONSOLE": "off"}.items():
        monkeypatch.setenv(k, v)
    with WandbCallback(project="megatrain-test", dir=str(tmp_path)) as cb:
        megatrain.train(SMALL_RUN, out=tmp_path / "run", on_event=chain(None, cb))
    files = list((tmp_path / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(files) == 1, "one offline run"
    # wandb's service writes the file on after finish() returns: read it
    # once it holds the run's exit record
    deadline = time.monotonic() + 60
    while True:
        records = []
        for data in wandb_records(files[0]):
            rec = wandb_internal_pb2.Record()
            rec.ParseFromString(data)
            records.append(rec)
        if any(r.WhichOneof("record_type") == "exit" for r in records):
            break
        assert time.monotonic() < deadline, "the offline run file has no exit record"
        time.sleep(0.2)
    history = []
    for rec in records:
        if rec.WhichOneof("record_type") == "history":
            items = {i.key or "/".join(i.nested_key): json.loads(i.value_json)
                     for i in rec.history.item}
            history.append((rec.history.step.num, items["train/loss"], items["train/lr"]))
    rows = metrics_rows(tmp_path / "run")
    # metrics.jsonl prints 9 significant digits: within 5e-9 relative
    assert history == [(r["step"], pytest.approx(r["loss"], rel=1e-8),
                        pytest.approx(r["lr"], rel=1e-8)) for r in rows]


def test_a_tracker_not_installed_names_the_package(monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)
    monkeypatch.setitem(sys.modules, "mlflow", None)
    with pytest.raises(megatrain.MegatrainError, match="pip install wandb"):
        WandbCallback()
    with pytest.raises(megatrain.MegatrainError, match="pip install mlflow-skinny"):
        MLflowCallback()
