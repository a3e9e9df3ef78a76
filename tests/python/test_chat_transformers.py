"""A model whose tokenizer carries Zephyr's chat template (which
megatrain has no built-in for), fine-tuned by megatrain on chat data and
saved: `transformers` loads the saved folder, and its apply_chat_template
gives, for every conversation, the very token ids megatrain trained on (the
tokenizer's files and the template travel with the model)."""
import json
import os
from pathlib import Path

import pytest
import transformers

import megatrain
from megatrain_testlib import ROOT, SMALL_RUN, write_jsonl

SHARED = Path(os.environ.get("MEGATRAIN_SHARED", ROOT.parent / "shared"))
LLAMA3 = SHARED / "data" / "tokenizers" / "llama3" / "tokenizer.json"
ZEPHYR = ROOT / "tests" / "fixtures" / "chat" / "templates" / "zephyr.jinja"


def conversations(n=12):
    return [{"messages": [{"role": "system", "content": "Answer in words."},
                          {"role": "user", "content": f"What is {i} plus {i}?"},
                          {"role": "assistant", "content": f"It is {2 * i}, twice {i}."}]}
            for i in range(n)]


def trained_tokens(data, tokenizer):
    """The ids megatrain trains on, one list per conversation: a data set of
    that one line, its single document read back whole."""
    out = []
    for i, line in enumerate(open(data)):
        one = data.parent / f"one-{i}.jsonl"
        one.write_text(line)
        with megatrain.Dataset(one, tokenizer, format="chat", packing="documents") as d:
            n = d.info["tokens"]
            tokens, targets, _ = d.next_batch(1, n - 1)
        out.append(tokens[0] + [targets[0][-1]])
    return out


def test_transformers_renders_the_saved_model_as_it_was_trained(tmp_path):
    if not LLAMA3.exists():
        pytest.skip(f"needs the Llama-3 tokenizer of the shared data ({LLAMA3}; set MEGATRAIN_SHARED)")
    model = tmp_path / "model"
    megatrain.init(model, LLAMA3, hidden=32, layers=1, heads=2, kv_heads=2, ffn=64, max_positions=64)
    cfg_path = model / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["chat_template"] = ZEPHYR.read_text()
    cfg_path.write_text(json.dumps(cfg))
    data = write_jsonl(tmp_path / "chat.jsonl", conversations())

    s = megatrain.train(dict(SMALL_RUN, model=model, data=data, out=tmp_path / "run", steps=2,
                             seq_len=48, batch_size=1), on_event=None)
    saved = Path(s["model"])
    trained = trained_tokens(data, model / "tokenizer.json")

    tok = transformers.AutoTokenizer.from_pretrained(saved)
    assert tok.chat_template == ZEPHYR.read_text()
    for i, record in enumerate(conversations()):
        ids = tok.apply_chat_template(record["messages"], tokenize=True, return_dict=False)
        assert list(ids) == trained[i], (i, tok.decode(ids), tok.decode(trained[i]))
