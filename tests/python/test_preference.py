"""Preference objectives from Python: a `datasets.Dataset` (or a list) of
pairs trains as the command does on the same pairs in JSONL, the step
events carry TRL's metrics, and Model.eval reports them on held-out pairs."""
import json

import pytest

import megatrain
from megatrain_testlib import SMALL_RUN, metrics_losses, run_cli, write_jsonl, write_yaml


def pairs(n=24):
    return [{"prompt": f"Q{i}:", "chosen": " yes" * (1 + i % 3), "rejected": " no" * (1 + i % 2)}
            for i in range(n)]


def test_dpo_on_a_dataset_of_pairs_trains_as_the_command_does(tmp_path):
    datasets = pytest.importorskip("datasets")
    opts = dict(SMALL_RUN, objective="dpo", beta=0.5, lr=3e-3, steps=4)
    events = []
    s = megatrain.train(dict(opts, out=tmp_path / "py"), data=datasets.Dataset.from_list(pairs()),
                        on_event=events.append)
    steps = [e.step for e in events if e.kind == "step"]
    assert len(steps) == 4 and all(0 <= m["rewards_accuracies"] <= 1 for m in steps)
    assert steps[0]["rewards_margins"] == 0  # the policy starts as its reference
    rows = [json.loads(line) for line in open(tmp_path / "py" / "metrics.jsonl")]
    # metrics.jsonl writes 9 significant digits
    assert [r["rewards/margins"] for r in rows] == [float(f"{m['rewards_margins']:.9g}")
                                                    for m in steps]

    data = write_jsonl(tmp_path / "pairs.jsonl", pairs())
    run_cli("train", "--config", write_yaml(tmp_path / "run.yaml",
                                            dict(opts, out=tmp_path / "cli", data=data)))
    assert metrics_losses(tmp_path / "py") == metrics_losses(tmp_path / "cli")


def test_orpo_then_eval_of_held_out_pairs(tmp_path):
    opts = dict(SMALL_RUN, objective="orpo", lambda_=0.2, out=tmp_path / "run")
    s = megatrain.train(opts, data=pairs(), on_event=None)
    res = megatrain.eval(s["model"], pairs(8), objective="orpo", lambda_=0.2, seq_len=32,
                         batch_size=2, device="cpu")
    assert res["pairs"] == 8 and 0 <= res["rewards_accuracies"] <= 1
    assert res["logps_chosen"] < 0 and res["loss"] > 0
    with pytest.raises(megatrain.MegatrainError, match="--ref-model"):
        megatrain.eval(s["model"], pairs(8), objective="dpo", seq_len=32, device="cpu")
