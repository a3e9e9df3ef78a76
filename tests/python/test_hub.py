"""Hugging Face Hub names: a model name is found in the cache laid out as
huggingface_hub lays it out (HF_HOME/hub/models--ORG--NAME), through
huggingface_hub when it is installed (which would download it) and by the
library itself when it is not; a name found nowhere says how to download
it. A dataset name is loaded with the datasets package (its streaming
load), or refused naming the package."""
import os
import sys

import pytest

import megatrain
from megatrain_testlib import SMALL_RUN

OPTS = dict(SMALL_RUN, steps=2, tokenizer="bytes",
            data=[{"text": f"Record {i}: the quick brown fox jumps."} for i in range(50)])


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """HF_HOME with the model acme/tiny (a small random llama) at commit c0ffee."""
    home = tmp_path / "hf"
    snap = home / "hub" / "models--acme--tiny" / "snapshots" / "c0ffee"
    megatrain.init(snap, "bytes", hidden=64, layers=2, heads=4, kv_heads=2, ffn=128,
                   max_positions=64)
    (home / "hub" / "models--acme--tiny" / "refs").mkdir()
    (home / "hub" / "models--acme--tiny" / "refs" / "main").write_text("c0ffee")
    for v in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "XDG_CACHE_HOME"):
        monkeypatch.delenv(v, raising=False)
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # no network here: the cache only
    return snap


@pytest.mark.parametrize("with_hub", [True, False])
def test_a_cached_model_is_found_by_its_name(cache, tmp_path, monkeypatch, with_hub):
    if with_hub:
        pytest.importorskip("huggingface_hub")
    else:
        monkeypatch.setitem(sys.modules, "huggingface_hub", None)  # import fails
    run = megatrain.train(OPTS, model="acme/tiny", out=tmp_path / "run", on_event=None)
    direct = megatrain.train(OPTS, model=cache, out=tmp_path / "direct", on_event=None)
    assert run["losses"] == direct["losses"] and len(run["losses"]) == 2
    with megatrain.Model("acme/tiny", "bytes") as m:
        assert m.path == "acme/tiny" or os.path.samefile(m.path, cache)
        assert m.info["layers"] == 2


@pytest.mark.parametrize("with_hub", [True, False])
def test_a_model_found_nowhere_says_how_to_get_it(cache, tmp_path, monkeypatch, with_hub):
    if with_hub:
        pytest.importorskip("huggingface_hub")
        want = "could not be downloaded from the Hugging Face Hub"
    else:
        monkeypatch.setitem(sys.modules, "huggingface_hub", None)
        want = "download it with `hf download acme/missing`"
    with pytest.raises(megatrain.MegatrainError, match="model 'acme/missing'") as e:
        megatrain.train(OPTS, model="acme/missing", out=tmp_path / "run", on_event=None)
    assert want in str(e.value)


def test_a_dataset_name_is_loaded_with_datasets(tmp_path, monkeypatch):
    import datasets  # tests/python/requirements.txt
    calls = []
    records = [{"text": f"Hub record {i}: the quick brown fox."} for i in range(300)]

    def load_dataset(name, split=None, streaming=False):
        calls.append((name, split, streaming))
        return iter(records)

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    a = megatrain.train(SMALL_RUN, data="acme/corpus", out=tmp_path / "a", on_event=None)
    assert calls == [("acme/corpus", "train", True)]
    b = megatrain.train(SMALL_RUN, data=records, out=tmp_path / "b", on_event=None)
    assert a["losses"] == b["losses"]
    megatrain.train(SMALL_RUN, data="acme/corpus", split="validation", out=tmp_path / "c",
                    on_event=None)
    assert calls[-1] == ("acme/corpus", "validation", True)


def test_a_dataset_name_without_datasets_names_the_package(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)
    with pytest.raises(megatrain.MegatrainError, match=r"pip install datasets"):
        megatrain.train(SMALL_RUN, data="acme/corpus", out=tmp_path / "a", on_event=None)
    # a path that exists is a path, whatever its shape
    os.makedirs(tmp_path / "acme", exist_ok=True)
    (tmp_path / "acme" / "c.jsonl").write_text('{"text": "a file here"}\n' * 50)
    monkeypatch.chdir(tmp_path)
    megatrain.train(SMALL_RUN, data="acme/c.jsonl", out=tmp_path / "b", on_event=None)
