#!/usr/bin/env python3
"""Reference token ids and loss masks of the JSONL formats megatrain reads
(tests/cpu/test_data_formats.c), made by TRL's own SFT data preparation
(SFTTrainer._prepare_dataset: the conversion of from/value conversations,
the EOS added to text and completions, the tokenization with
apply_chat_template, the labels) with the real tokenizers of the shared
data.

Each case is a JSONL line as megatrain reads it, the format and text field
megatrain is given, the chat template (a fixture of tests/fixtures/chat, or
null for the tokenizer's own), and what TRL trains on: input_ids and a loss
flag per token (labels != -100).

  text, completion  TRL's language-modeling and prompt/completion paths
                    (completion_only_loss, its default), dataset_text_field
                    for --text-field;
  completion with lists of messages: TRL's conversational prompt/completion;
  chat, sharegpt    TRL's conversational path with assistant_only_loss=True
                    and a TRL training template (its {% generation %} blocks
                    mark the assistant turns); sharegpt lines whose speakers
                    are already user/assistant go through TRL's own
                    maybe_convert_to_chatml; the speaker names human/gpt and
                    the top-level "system", which TRL does not read, are
                    mapped first as LLaMA-Factory's sharegpt reader maps them;
  alpaca            TRL has no alpaca reader: the line is made a conversation
                    as LLaMA-Factory's alpaca reader makes it ([system],
                    history pairs, user = instruction and input joined by a
                    line break, assistant = output), then TRL's
                    conversational path as for chat.

Usage: scripts/make_data_format_fixtures.py [SHARED_DATA_DIR] [OUT_JSON]
Needs: pip install trl (with transformers, datasets, torch)
"""
import json
import os
import sys
import types

from datasets import Dataset
from transformers import AutoTokenizer
from trl import SFTConfig, SFTTrainer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "..", "shared", "data")
OUT = sys.argv[2] if len(sys.argv) > 2 else os.path.join(ROOT, "tests", "fixtures", "data",
                                                         "formats.json")
TEMPLATES = os.path.join(ROOT, "tests", "fixtures", "chat", "templates")

SYSTEM = "You answer in one short sentence."
CHAT = [
    {"messages": [{"role": "user", "content": "Hello!"},
                  {"role": "assistant", "content": "Hi, how can I help?"}]},
    {"messages": [{"role": "system", "content": SYSTEM},
                  {"role": "user", "content": "What is 2+2?"},
                  {"role": "assistant", "content": "It is 4."},
                  {"role": "user", "content": "And caf\u00e9 in Japanese? \u65e5\u672c"},
                  {"role": "assistant", "content": "\u30ab\u30d5\u30a7 (kafe)."}]},
]
SHAREGPT = [
    {"conversations": [{"from": "user", "value": "Name a prime."},
                       {"from": "assistant", "value": "Seven."}]},
    {"conversations": [{"from": "human", "value": "Is the sky blue?"},
                       {"from": "gpt", "value": "Yes, on a clear day."},
                       {"from": "human", "value": "Why?"},
                       {"from": "gpt", "value": "Rayleigh scattering."}], "system": SYSTEM},
]
ALPACA = [
    {"instruction": "Add the numbers.", "input": "2 and 3", "output": "5"},
    {"instruction": "Say hello in French.", "input": "", "output": "Bonjour !"},
    {"instruction": "Translate to German.", "input": "Good morning", "output": "Guten Morgen",
     "system": SYSTEM, "history": [["Translate to German: yes", "Ja"]]},
]
PROMPT_COMPLETION = [
    {"prompt": [{"role": "user", "content": "What color is the sky?"}],
     "completion": [{"role": "assistant", "content": "It is blue."}]},
    {"prompt": [{"role": "system", "content": SYSTEM},
                {"role": "user", "content": "Capital of France?"},
                {"role": "assistant", "content": "Paris."},
                {"role": "user", "content": "And of Italy?"}],
     "completion": [{"role": "assistant", "content": "Rome."}]},
]
PLAIN = [
    ("text", "text", {"text": "The quick brown fox jumps over the lazy dog."}),
    ("text", "body", {"body": "Text under another key, na\u00efve r\u00e9sum\u00e9.", "id": 7}),
    ("completion", "text", {"prompt": "The capital of France is", "completion": " Paris."}),
    ("completion", "text", {"prompt": "Q: 2+2?\nA:", "completion": " 4"}),
]

# tokenizer folder of the shared data, TRL training template of its family
TOKENIZERS = {"qwen3": "qwen3-trl-training", "llama3": "llama3-trl-training"}

LLAMA_FACTORY_ROLES = {"human": "user", "gpt": "assistant", "user": "user",
                       "assistant": "assistant", "system": "system"}


def sharegpt_for_trl(line):
    """TRL reads from/value with the speakers as roles; the names it does not
    map (human, gpt) and the top-level system are mapped as LLaMA-Factory
    does."""
    if all(t["from"] in ("user", "assistant", "system") for t in line["conversations"]) and \
            "system" not in line:
        return line  # TRL's maybe_convert_to_chatml does it all
    msgs = [{"role": "system", "content": line["system"]}] if line.get("system") else []
    msgs += [{"role": LLAMA_FACTORY_ROLES[t["from"]], "content": t["value"]}
             for t in line["conversations"]]
    return {"messages": msgs}


def alpaca_for_trl(line):
    msgs = [{"role": "system", "content": line["system"]}] if line.get("system") else []
    for q, a in line.get("history") or []:
        msgs += [{"role": "user", "content": q}, {"role": "assistant", "content": a}]
    user = "\n".join(x for x in (line["instruction"], line.get("input")) if x)
    msgs += [{"role": "user", "content": user}, {"role": "assistant", "content": line["output"]}]
    return {"messages": msgs}


def trl_prepare(tok, template, record, text_field, assistant_only):
    """TRL's SFT preparation of one record: (input_ids, loss flags)."""
    args = SFTConfig(output_dir="/tmp/megatrain-trl-fixture", assistant_only_loss=assistant_only,
                     dataset_text_field=text_field, max_length=None, report_to=[],
                     use_cpu=True, bf16=False)
    # _prepare_dataset reads these three attributes of the trainer
    trainer = types.SimpleNamespace(_tokenizer=tok, completion_only_loss=True,
                                    chat_template=template)
    ds = SFTTrainer._prepare_dataset(trainer, Dataset.from_list([record]), tok, args, False,
                                     None, "train")
    row = ds[0]
    return row["input_ids"], [int(label != -100) for label in row["labels"]]


def case(tok, name, template_name, fmt, text_field, line, record, assistant_only):
    template = None
    if template_name:
        with open(os.path.join(TEMPLATES, template_name + ".jinja"), encoding="utf-8") as f:
            template = f.read()
    ids, loss = trl_prepare(tok, template, record, text_field, assistant_only)
    return {"tokenizer": name, "template": template_name, "format": fmt,
            "text_field": text_field, "line": line, "input_ids": ids, "loss": loss}


def main():
    cases = []
    for name, training in TOKENIZERS.items():
        tok = AutoTokenizer.from_pretrained(os.path.join(SHARED, "tokenizers", name))
        for fmt, field, line in PLAIN:
            cases.append(case(tok, name, None, fmt, field, line, line, False))
        for line in PROMPT_COMPLETION:
            cases.append(case(tok, name, None, "completion", "text", line, line, False))
            cases.append(case(tok, name, training, "completion", "text", line, line, False))
        for line in CHAT:
            cases.append(case(tok, name, training, "chat", "text", line, line, True))
        for line in SHAREGPT:
            cases.append(case(tok, name, training, "sharegpt", "text", line,
                              sharegpt_for_trl(line), True))
        for line in ALPACA:
            cases.append(case(tok, name, training, "alpaca", "text", line,
                              alpaca_for_trl(line), True))
    import trl
    out = {"made_by": f"scripts/make_data_format_fixtures.py, trl {trl.__version__}",
           "cases": cases}
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"{OUT}: {len(cases)} cases")


if __name__ == "__main__":
    main()
