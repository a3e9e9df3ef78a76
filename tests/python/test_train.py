"""megatrain.train and megatrain.Run against the `megatrain` command: the
same options give the same run (the same library does the work: the loss
of every step as metrics.jsonl writes it, and the final weights byte for
byte); a run stepped, saved, closed and resumed gives the losses of one that
never stopped; errors carry the library's message."""
import filecmp
import json
import shutil
from pathlib import Path

import pytest

import megatrain
from megatrain_testlib import (SMALL_RUN, TOKENIZER, metrics_losses, run_cli, sft_records, write_jsonl,
                      write_yaml)


@pytest.fixture(scope="module")
def hf_model(tmp_path_factory):
    """A small Llama made by the library's init, with the fixture tokenizer."""
    d = tmp_path_factory.mktemp("init") / "model"
    megatrain.init(d, TOKENIZER, hidden=64, layers=2, heads=4, kv_heads=2, ffn=128,
                   max_positions=64)
    return d


def same_run(a, b):
    """Two run directories hold the same run: the loss of every step, and
    the final model's weights, byte for byte."""
    assert metrics_losses(a) == metrics_losses(b)
    assert filecmp.cmp(a / "model" / "model.safetensors", b / "model" / "model.safetensors",
                       shallow=False)


def test_tiny_model_trains_as_the_command_does(tmp_path):
    events = []
    s = megatrain.train(dict(SMALL_RUN, out=tmp_path / "py"), on_event=events.append)
    assert s["steps"] == 6 and len(s["losses"]) == 6
    assert s["final_loss"] < s["first_loss"], s["losses"]
    assert s["model"] == str(tmp_path / "py" / "model")
    assert [e.step["step"] for e in events if e.kind == "step"] == list(range(1, 7))
    assert any(e.kind == "info" and e.text.startswith("model: built-in") for e in events)
    # the step events carry the losses metrics.jsonl writes (%.9g)
    assert metrics_losses(tmp_path / "py") == [f"{x:.9g}" for x in s["losses"]]

    cfg = write_yaml(tmp_path / "run.yaml", dict(SMALL_RUN, out=tmp_path / "cli"))
    run_cli("train", "--config", cfg)
    same_run(tmp_path / "py", tmp_path / "cli")


def test_a_model_made_by_init_fine_tunes_on_records_as_on_jsonl(tmp_path, hf_model):
    opts = dict(SMALL_RUN, model=hf_model, lr=1e-3, seed=7)
    s = megatrain.train(dict(opts, out=tmp_path / "py"), data=sft_records(), on_event=None)
    assert s["final_loss"] < s["first_loss"], s["losses"]
    # the records were written into the run directory, where a resume finds them
    assert s["data"].startswith(str(tmp_path / "py" / "data-")) and s["data"].endswith(".jsonl")

    data = write_jsonl(tmp_path / "sft.jsonl", sft_records())
    cfg = write_yaml(tmp_path / "run.yaml", dict(opts, out=tmp_path / "cli", data=data))
    run_cli("train", "--config", cfg)
    same_run(tmp_path / "py", tmp_path / "cli")


def test_config_from_yaml_text_a_yaml_file_and_overrides(tmp_path):
    path = write_yaml(tmp_path / "run.yaml", dict(SMALL_RUN, out=tmp_path / "a"))
    a = megatrain.train(path, steps=2, on_event=None)
    text = "".join(f"{k}: {v}\n" for k, v in dict(SMALL_RUN, out=tmp_path / "b").items())
    b = megatrain.train(text, steps=2, on_event=None)
    assert a["steps"] == b["steps"] == 2
    assert a["losses"] == b["losses"]
    opts = megatrain.options_dict(path, lr=0.5)
    assert opts["lr"] == 0.5 and opts["seq_len"] == 32 and opts["out"] == str(tmp_path / "a")
    assert megatrain.options_dict()["out"] == "runs/tiny", "no model: the tiny model's defaults"


def test_step_save_close_resume_gives_the_uninterrupted_losses(tmp_path):
    opts = dict(SMALL_RUN, steps=6)
    with megatrain.Run(opts, out=tmp_path / "whole") as run:
        whole = [m["loss"] for m in run.metrics()]
        assert run.steps_done == 6 and run.step() is None
        run.finish()

    with megatrain.Run(opts, out=tmp_path / "parts") as run:
        first = [run.step()["loss"] for _ in range(3)]
        run.save()
    with megatrain.Run(opts, out=tmp_path / "parts", resume="auto") as run:
        assert run.steps_done == 3
        steps = list(run.metrics())
        run.finish()
    assert [m["step"] for m in steps] == [4, 5, 6]
    # the same library in the same process: the same doubles, bit for bit
    assert first + [m["loss"] for m in steps] == whole
    assert filecmp.cmp(tmp_path / "whole" / "model" / "model.safetensors",
                       tmp_path / "parts" / "model" / "model.safetensors", shallow=False)


def cli_error(*args):
    """What `megatrain train ARGS` prints on failure, less its prefix."""
    p = run_cli("train", *args, check=False)
    assert p.returncode != 0
    return p.stderr.strip().removeprefix("megatrain train: ")


def test_errors_raise_with_the_library_message(tmp_path):
    # the message of a config file's mistake, less its FILE:LINE
    for key, value in [("lr", "fast"), ("learning_rate", 1e-4), ("schedule", "cosin")]:
        with pytest.raises(megatrain.MegatrainError) as e:
            megatrain.Run({key: value})
        cfg = write_yaml(tmp_path / "bad.yaml", {key: value})
        assert str(e.value) == cli_error("--config", cfg).removeprefix(f"{cfg}:1: ")
    with pytest.raises(megatrain.MegatrainError, match="did you mean 'lr'"):
        megatrain.Run({"learning_rate": 1e-4})

    missing = tmp_path / "nope.jsonl"
    opts = dict(SMALL_RUN, out=tmp_path / "run", data=missing)
    with pytest.raises(megatrain.MegatrainError) as e:
        megatrain.train(opts, on_event=None)
    cfg = write_yaml(tmp_path / "bad.yaml", dict(opts, out=tmp_path / "cli"))
    assert str(e.value) == cli_error("--config", cfg).replace(str(tmp_path / "cli"),
                                                               str(tmp_path / "run"))
    assert str(missing) in str(e.value)

    # a bad record is named by its index in the records
    bad = [{"text": "fine"}, {"text": "fine too"}, {"txt": "a typo"}]
    with pytest.raises(megatrain.MegatrainError, match=r'^record 2: field "text" is missing'):
        megatrain.train(dict(SMALL_RUN, out=tmp_path / "r"), data=bad, on_event=None)
    with pytest.raises(megatrain.MegatrainError, match="record 1: expected a dict like .*, got str 'b'"):
        megatrain.train(dict(SMALL_RUN, out=tmp_path / "r"), data=[{"text": "a"}, "b"])


def test_an_exception_in_the_callback_is_raised_after_the_call(tmp_path):
    class Stop(Exception):
        pass

    def on_event(ev):
        if ev.kind == "step":
            raise Stop(ev.step["step"])

    with megatrain.Run(dict(SMALL_RUN, out=tmp_path / "run"), on_event=on_event) as run:
        with pytest.raises(Stop) as e:
            run.step()
        assert e.value.args == (1,)
        assert run.steps_done == 1


def test_generate_and_eval_as_the_command_does(tmp_path, hf_model):
    text = megatrain.generate(hf_model, "What is 3 plus 4? ", max_new_tokens=12, temperature=0,
                              device="cpu")
    p = run_cli("generate", "--model", hf_model, "--prompt", "What is 3 plus 4? ",
                "--max-new-tokens", 12, "--temperature", 0, "--device", "cpu")
    assert text.startswith("What is 3 plus 4? ") and text in p.stdout

    pieces = []
    with megatrain.Model(hf_model) as m:
        assert m.info["layers"] == 2 and m.info["hidden"] == 64
        assert m.tokenizer.vocab_size == m.info["vocab_size"]
        assert m.generate("What is 3 plus 4? ", max_new_tokens=12, temperature=0, device="cpu",
                          on_text=pieces.append) == text
    # streamed as the command prints it: a line break after the last piece
    assert "".join(pieces) == text + "\n"

    data = write_jsonl(tmp_path / "sft.jsonl", sft_records())
    r = megatrain.eval(hf_model, data, seq_len=32, batch_size=2, device="cpu")
    p = run_cli("eval", "--model", hf_model, "--data", data, "--seq-len", 32, "--batch-size", 2,
                "--device", "cpu")
    assert f"loss {r['loss']:.6f}, perplexity {r['perplexity']:.4f}" in p.stdout
    assert megatrain.eval(hf_model, sft_records(), seq_len=32, batch_size=2, device="cpu") == r

    with pytest.raises(megatrain.MegatrainError, match="/nonexistent/model"):
        megatrain.generate("/nonexistent/model", "x")
    with pytest.raises(TypeError, match="unknown argument 'max_tokens'"):
        megatrain.generate(hf_model, "x", max_tokens=3)


CHAT_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>{% endif %}")


def test_generate_a_chat_reply_as_the_command_does(tmp_path, hf_model):
    model = tmp_path / "chat"
    shutil.copytree(hf_model, model)
    (model / "tokenizer_config.json").write_text(json.dumps({"chat_template": CHAT_TEMPLATE}))
    opts = dict(max_new_tokens=12, temperature=0, device="cpu")
    messages = [{"role": "system", "content": "Be brief."},
                {"role": "user", "content": "What is 3 plus 4?"}]
    reply = megatrain.generate(model, messages=messages, **opts)
    p = run_cli("generate", "--model", model, "--chat", "--system", "Be brief.",
                "What is 3 plus 4?", "--max-new-tokens", 12, "--temperature", 0,
                "--device", "cpu")
    assert p.stdout.endswith(reply + "\n") and "<|user|>" not in p.stdout, p.stdout
    # the reply continues the conversation as the template renders it
    rendered = "<|system|>Be brief.\n<|user|>What is 3 plus 4?\n<|assistant|>"
    plain = megatrain.generate(model, rendered, add_special=False, **opts)
    assert plain.startswith(rendered + reply)
    with pytest.raises(TypeError, match="a prompt or messages"):
        megatrain.generate(model, "x", messages=messages)
    with pytest.raises(megatrain.MegatrainError, match="messages"):
        megatrain.generate(model, messages=[{"content": "no role"}], **opts)


def test_eval_takes_the_model_length(tmp_path, hf_model):
    data = write_jsonl(tmp_path / "sft.jsonl", sft_records())
    r = megatrain.eval(hf_model, data, device="cpu")
    assert r == megatrain.eval(hf_model, data, seq_len=64, device="cpu")  # its max_positions
    p = run_cli("eval", "--model", hf_model, "--data", data, "--device", "cpu")
    assert f"loss {r['loss']:.6f}" in p.stdout


def test_a_saved_model_has_a_generation_config(tmp_path, hf_model):
    # as transformers derives it from config.json when a model has none
    for d in (hf_model, megatrain.train(dict(SMALL_RUN, out=tmp_path / "run"),
                                        on_event=None)["model"]):
        config = json.loads((Path(d) / "config.json").read_text())
        gen = json.loads((Path(d) / "generation_config.json").read_text())
        ids = {k: config[k] for k in ("bos_token_id", "eos_token_id") if k in config}
        assert gen == {"_from_model_config": True, **ids} and "bos_token_id" in ids


def test_init_refuses_an_existing_directory(tmp_path):
    with pytest.raises(megatrain.MegatrainError) as e:
        megatrain.init(tmp_path, TOKENIZER, hidden=64, layers=2, heads=4, kv_heads=2, ffn=128)
    assert str(tmp_path) in str(e.value)


def metrics_steps(out):
    return [json.loads(line)["step"] for line in open(out / "metrics.jsonl")]


def test_a_run_in_an_out_that_holds_one_needs_resume_or_overwrite(tmp_path):
    opts = dict(SMALL_RUN, out=tmp_path / "run", save_every=3)
    megatrain.train(opts, on_event=None)
    with pytest.raises(megatrain.MegatrainError, match="already holds a run") as e:
        megatrain.Run(dict(opts, steps=3))
    assert "--resume auto" in str(e.value) and "--overwrite" in str(e.value)
    assert metrics_steps(tmp_path / "run") == [1, 2, 3, 4, 5, 6], "the refused run wrote"

    s = megatrain.train(dict(opts, steps=3), overwrite=True, on_event=None)
    assert s["steps"] == 3 and metrics_steps(tmp_path / "run") == [1, 2, 3]
    assert sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir()) == ["step-00000003"]
    with megatrain.Run(dict(opts, steps=4), resume="auto") as run:
        assert run.steps_done == 3, "resume auto continues the run that replaced the first"
        assert [m["step"] for m in run.metrics()] == [4]
    with pytest.raises(megatrain.MegatrainError, match="overwrite and resume"):
        megatrain.Run(opts, resume="auto", overwrite=True)
