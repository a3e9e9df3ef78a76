"""The data adapter: records (lists of dicts, pyarrow tables, Parquet
folders) give the library the tokens the same records give it as JSONL,
in each of the shapes (text, also under another key, prompt/completion as
texts and as lists of messages, chat, sharegpt, alpaca); `python -m megatrain.tokenize` on a Parquet
dataset folder writes the .mtok `megatrain tokenize` writes from JSONL."""
import datetime
import filecmp
import subprocess
import sys

import pytest

import megatrain
from megatrain.tokenize import tokenize
from megatrain_testlib import SP_TOKENIZER, TOKENIZER, run_cli, sft_records, write_jsonl

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

SHAPES = {
    "text": [{"text": f"Document number {i}: the quick brown fox, {'again ' * (i % 4)}é."}
             for i in range(30)],
    "completion": sft_records(30),
    "chat": [{"messages": [{"role": "system", "content": "Answer briefly."},
                           {"role": "user", "content": f"What is {i} plus {i}?"},
                           {"role": "assistant", "content": f"{2 * i}."}]} for i in range(20)],
    "conversational": [{"prompt": [{"role": "user", "content": f"Double {i}?"}],
                        "completion": [{"role": "assistant", "content": f"{2 * i}."}]}
                       for i in range(20)],
    "sharegpt": [{"conversations": [{"from": "human", "value": f"What is {i} times 3?"},
                                    {"from": "gpt", "value": f"{3 * i}."}],
                  "system": "Answer briefly."} for i in range(20)],
    "alpaca": [{"instruction": f"Add {i} and {i + 1}.", "input": "" if i % 2 else "Show it.",
                "output": f"{2 * i + 1}"} for i in range(20)],
}
# the tokenizer of each shape (SP_TOKENIZER has the <s> </s> of the llama2
# chat template that conversations get), and the format the library reports
TOKENIZERS = {k: TOKENIZER if k in ("text", "completion") else SP_TOKENIZER for k in SHAPES}
FORMATS = dict({k: k for k in SHAPES}, conversational="completion")


def stream(data, tokenizer=TOKENIZER, **kw):
    """Every batch of a data set, and what it says of itself."""
    with megatrain.Dataset(data, tokenizer, **kw) as d:
        return d.info, list(d.batches(2, 16))


@pytest.mark.parametrize("shape", SHAPES)
def test_records_give_the_token_stream_of_the_same_jsonl(tmp_path, shape):
    records, tok = SHAPES[shape], TOKENIZERS[shape]
    jsonl = write_jsonl(tmp_path / "data.jsonl", records)
    info, batches = stream(records, tok, seed=3, epochs=2)
    assert info["format"] == FORMATS[shape] and info["documents"] == len(records)
    assert (info, batches) == stream(jsonl, tok, seed=3, epochs=2)
    assert len(batches) > 4
    # a pyarrow table of the same records, and the records with other fields
    assert stream(pa.Table.from_pylist(records), tok, seed=3, epochs=2) == (info, batches)
    extra = [dict(r, id=i, when=datetime.date(2024, 1, 1)) for i, r in enumerate(records)]
    assert stream(extra, tok, seed=3, epochs=2) == (info, batches)

    with megatrain.Dataset(records, tok) as d:
        d.save(tmp_path / "py.mtok")
    run_cli("tokenize", "--tokenizer", tok, "--data", jsonl, "--out", tmp_path / "cli.mtok")
    assert filecmp.cmp(tmp_path / "py.mtok", tmp_path / "cli.mtok", shallow=False)


def test_bad_records_are_named_by_their_index():
    with pytest.raises(megatrain.MegatrainError, match=r'^record 1: field "text" is not a string'):
        megatrain.Dataset([{"text": "a"}, {"text": 5}], TOKENIZER)
    with pytest.raises(megatrain.MegatrainError, match=r"^record 0: .*messages\[1\]"):
        megatrain.Dataset([{"messages": [{"role": "user", "content": "x"}, "nope"]}], SP_TOKENIZER)
    with pytest.raises(megatrain.MegatrainError, match="record 2: expected a dict like .*, got int 3"):
        megatrain.Dataset([{"text": "a"}, {"text": "b"}, 3], TOKENIZER)
    with pytest.raises(megatrain.MegatrainError, match="no records"):
        megatrain.Dataset([], TOKENIZER)
    with pytest.raises(megatrain.MegatrainError, match="one dict is not a data set"):
        megatrain.Dataset({"text": "a"}, TOKENIZER)
    # skip_bad_lines counts the bad ones, as for a JSONL file
    with megatrain.Dataset([{"text": "a"}, {"text": None}, {"text": "c"}], TOKENIZER,
                           skip_bad_lines=True) as d:
        assert d.info["documents"] == 2 and d.info["skipped_lines"] == 1


def test_text_under_another_key(tmp_path):
    records = [{"body": r["text"], "id": i} for i, r in enumerate(SHAPES["text"])]
    assert stream(records, text_field="body") == stream(SHAPES["text"])
    with pytest.raises(megatrain.MegatrainError, match="--data-format, or --text-field FIELD"):
        megatrain.Dataset(records, TOKENIZER)
    pq.write_table(pa.Table.from_pylist(records), tmp_path / "body.parquet")
    assert stream(tmp_path / "body.parquet", text_field="body") == stream(SHAPES["text"])
    # a run takes the option, its records written under the key
    opts = {"device": "cpu", "steps": 2, "seq_len": 16, "batch_size": 2, "micro_batches": 1,
            "save_every": 0, "sample_tokens": 0}
    with megatrain.Run(opts, out=tmp_path / "a", data=records, text_field="body") as a, \
            megatrain.Run(opts, out=tmp_path / "b", data=SHAPES["text"]) as b:
        assert [m["loss"] for m in a.metrics()] == [m["loss"] for m in b.metrics()]


def test_a_nul_in_a_record_is_refused_not_cut():
    # JSON writes it \u0000, which used to end the text there without a word
    with pytest.raises(megatrain.MegatrainError, match=r"^record 1: a NUL character"):
        megatrain.Dataset([{"text": "a"}, {"text": "b\x00c"}], TOKENIZER)
    with pytest.raises(megatrain.MegatrainError, match=r"^record 0: a NUL character"):
        megatrain.Dataset([{"messages": [{"role": "user", "content": "x\x00"},
                                         {"role": "assistant", "content": "y"}]}], SP_TOKENIZER)


def write_hub_folder(root, splits):
    """A dataset folder laid out as on the Hugging Face Hub:
    data/SPLIT-0000i-of-0000n.parquet, two files for train."""
    (root / "data").mkdir(parents=True)
    for split, records in splits.items():
        parts = [records[: len(records) // 2], records[len(records) // 2:]]
        if split != "train":
            parts = [records]
        for i, part in enumerate(parts):
            pq.write_table(pa.Table.from_pylist(part),
                           root / "data" / f"{split}-{i:05d}-of-{len(parts):05d}.parquet")
    return root


def tokenize_module(*args):
    p = subprocess.run([sys.executable, "-m", "megatrain.tokenize", *map(str, args)],
                       capture_output=True, text=True)
    return p


@pytest.mark.parametrize("shape", SHAPES)
def test_a_parquet_folder_tokenizes_to_the_mtok_of_the_same_jsonl(tmp_path, shape):
    records, tok = SHAPES[shape], TOKENIZERS[shape]
    held_out = records[:3]
    hub = write_hub_folder(tmp_path / "hub", {"train": records, "test": held_out})
    p = tokenize_module("--tokenizer", tok, "--data", hub, "--out", tmp_path / "py.mtok")
    assert p.returncode == 0, p.stderr
    assert f"{len(records)} documents" in p.stdout

    jsonl = write_jsonl(tmp_path / "train.jsonl", records)
    run_cli("tokenize", "--tokenizer", tok, "--data", jsonl, "--out", tmp_path / "cli.mtok")
    assert filecmp.cmp(tmp_path / "py.mtok", tmp_path / "cli.mtok", shallow=False)

    # the other split, and a single file
    p = tokenize_module("--tokenizer", tok, "--data", hub, "--split", "test", "--out",
                        tmp_path / "test.mtok")
    assert p.returncode == 0 and f"{len(held_out)} documents" in p.stdout, p.stderr
    one = next((hub / "data").glob("test-*.parquet"))
    tokenize(one, tok, tmp_path / "one.mtok")
    assert filecmp.cmp(tmp_path / "test.mtok", tmp_path / "one.mtok", shallow=False)


def test_the_older_spelling_of_data_format_is_read_with_a_note(tmp_path):
    jsonl = write_jsonl(tmp_path / "sft.jsonl", SHAPES["completion"])
    outs = []
    for flag in ("--data-format", "--format"):
        args = ["--tokenizer", TOKENIZER, "--data", jsonl, flag, "completion", "--out"]
        outs += [tmp_path / f"py{flag}.mtok", tmp_path / f"cli{flag}.mtok"]
        p = tokenize_module(*args, outs[-2])
        c = run_cli("tokenize", *args, outs[-1])
        assert p.returncode == 0, p.stderr
        for err in (p.stderr, c.stderr):
            assert ("--format is deprecated: it is now spelt --data-format" in err) == \
                (flag == "--format"), err
    assert all(filecmp.cmp(outs[0], o, shallow=False) for o in outs[1:])


def test_tokenize_says_what_is_wrong(tmp_path):
    hub = write_hub_folder(tmp_path / "hub", {"train": SHAPES["text"]})
    p = tokenize_module("--tokenizer", TOKENIZER, "--data", hub, "--split", "validation",
                        "--out", tmp_path / "x.mtok")
    assert p.returncode == 1 and "no Parquet files of split 'validation' (found: train)" in p.stderr
    (tmp_path / "empty").mkdir()
    p = tokenize_module("--tokenizer", TOKENIZER, "--data", tmp_path / "empty", "--out",
                        tmp_path / "x.mtok")
    assert p.returncode == 1 and "no .parquet files" in p.stderr
    pq.write_table(pa.Table.from_pylist([{"body": "x"}]), tmp_path / "odd.parquet")
    p = tokenize_module("--tokenizer", TOKENIZER, "--data", tmp_path / "odd.parquet", "--out",
                        tmp_path / "x.mtok")
    assert p.returncode == 1 and "no column named text" in p.stderr
    p = tokenize_module("--tokenizer", tmp_path / "none.json", "--data", hub, "--out",
                        tmp_path / "x.mtok")
    assert p.returncode == 1 and str(tmp_path / "none.json") in p.stderr


def test_train_reads_a_parquet_folder_as_its_records(tmp_path):
    records = SHAPES["text"]
    hub = write_hub_folder(tmp_path / "hub", {"train": records})
    opts = {"device": "cpu", "steps": 2, "seq_len": 16, "batch_size": 2, "micro_batches": 1,
            "save_every": 0, "sample_tokens": 0}
    with megatrain.Run(opts, out=tmp_path / "a", data=hub) as a, \
            megatrain.Run(opts, out=tmp_path / "b", data=records) as b:
        assert a.data == b.data.replace(str(tmp_path / "b"), str(tmp_path / "a"))
        assert [m["loss"] for m in a.metrics()] == [m["loss"] for m in b.metrics()]


def test_a_datasets_dataset_is_taken_as_it_is(tmp_path):
    import datasets  # tests/python/requirements.txt
    records = SHAPES["completion"]
    ds = datasets.Dataset.from_list(records)
    assert stream(ds) == stream(records)
    dd = datasets.DatasetDict({"train": ds, "test": ds.select(range(3))})
    assert stream(dd) == stream(records)
    assert stream(dd, split="test") == stream(records[:3])
