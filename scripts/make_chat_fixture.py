#!/usr/bin/env python3
"""Reference fixtures for the data pipeline tests (tests/cpu/test_dataset.c).

Writes tests/fixtures/data/chat_render.json: a few conversations rendered with
transformers' apply_chat_template for each chat family megatrain implements
in C (src/data/chat.c):
  llama3   the chat_template of the shared Llama-3 tokenizer_config.json
  qwen     the chat_template of the shared Qwen3 tokenizer_config.json
  llama2   Meta's published Llama-2-chat template (the shared Llama-2
           tokenizer_config.json has none), written out below
  mistral  Mistral-7B-Instruct-v0.1's published template, written out below
For each (family, conversation): the rendered string, the character spans
(Python str offsets turned into UTF-8 byte offsets) that carry the loss, and,
when the shared tokenizers are present, the HF ids of the whole rendered
string (add_special_tokens=False) so that the C test can prove that the
piece-wise encoding gives the same ids.

Loss spans are found here by searching the rendered text, independently of
the C renderer: each assistant turn's span runs from the end of its header
to the end of its end-of-turn token:
  llama3   after "<|start_header_id|>assistant<|end_header_id|>\\n\\n" .. "<|eot_id|>"
  qwen     after "<|im_start|>assistant\\n" .. "<|im_end|>"
  llama2   after "[/INST]" .. "</s>"
  mistral  after "[/INST]" .. "</s>"

Also writes tests/fixtures/data/brown_llama3_count.json: the number of
Llama-3 ids of every record of brown.jsonl (add_special_tokens=False), for
the C test of the "text" format (which adds BOS and EOS per document).

Usage: scripts/make_chat_fixture.py [SHARED_DATA_DIR] [OUT_DIR]
"""
import json
import os
import sys

from transformers import PreTrainedTokenizerFast

LLAMA2_TEMPLATE = (
    "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}"
    "{% set system_message = messages[0]['content'] %}{% else %}"
    "{% set loop_messages = messages %}{% set system_message = false %}{% endif %}"
    "{% for message in loop_messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{% endif %}"
    "{% if loop.index0 == 0 and system_message != false %}"
    "{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}"
    "{% else %}{% set content = message['content'] %}{% endif %}"
    "{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}"
    "{% endif %}{% endfor %}")

MISTRAL_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{% endif %}"
    "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token}}"
    "{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}"
    "{% endif %}{% endfor %}")

CONVERSATIONS = [
    [{"role": "user", "content": "Hello!"},
     {"role": "assistant", "content": "Hi, how can I help?"}],
    [{"role": "system", "content": "You are terse."},
     {"role": "user", "content": "  What is 2+2?  \n"},
     {"role": "assistant", "content": "\n4\n"},
     {"role": "user", "content": "And 3*3?"},
     {"role": "assistant", "content": " 9 "}],
    [{"role": "user", "content": "Unicode: caf\u00e9 \u65e5\u672c \U0001F600"},
     {"role": "assistant", "content": "na\u00efve r\u00e9sum\u00e9\u00a0\u2003"},
     {"role": "user", "content": "tabs\tand\nnewlines"},
     {"role": "assistant", "content": "<think>\nhmm\n</think>\n\nok"}],
    [{"role": "system", "content": "\n sys with spaces \n"},
     {"role": "user", "content": "q"},
     {"role": "assistant", "content": ""}],
    [{"role": "user", "content": "one"},
     {"role": "assistant", "content": "two"},
     {"role": "user", "content": "three"}],
]

HEADERS = {
    "llama3": ("<|start_header_id|>assistant<|end_header_id|>\n\n", "<|eot_id|>"),
    "qwen": ("<|im_start|>assistant\n", "<|im_end|>"),
    "llama2": ("[/INST]", "</s>"),
    "mistral": ("[/INST]", "</s>"),
}


def byte_off(s, i):
    return len(s[:i].encode("utf-8"))


def spans(family, text, conv):
    head, end = HEADERS[family]
    out, pos = [], 0
    n_assist = sum(m["role"] == "assistant" for m in conv)
    for _ in range(n_assist):
        a = text.index(head, pos) + len(head)
        b = text.index(end, a) + len(end)
        out.append([byte_off(text, a), byte_off(text, b)])
        pos = b
    return out


def load(shared, name, template, bos, eos):
    tok = PreTrainedTokenizerFast(
        tokenizer_file=os.path.join(shared, "tokenizers", name, "tokenizer.json"),
        bos_token=bos, eos_token=eos)
    tok.chat_template = template
    return tok


def config_template(shared, name):
    with open(os.path.join(shared, "tokenizers", name, "tokenizer_config.json")) as f:
        return json.load(f)["chat_template"]


def main():
    shared = sys.argv[1] if len(sys.argv) > 1 else "../shared/data"
    out_dir = sys.argv[2] if len(sys.argv) > 2 else "tests/fixtures/data"
    fams = {
        "llama3": load(shared, "llama3", config_template(shared, "llama3"),
                       "<|begin_of_text|>", "<|end_of_text|>"),
        "qwen": load(shared, "qwen3", config_template(shared, "qwen3"), None, "<|im_end|>"),
        "llama2": load(shared, "llama2", LLAMA2_TEMPLATE, "<s>", "</s>"),
        "mistral": load(shared, "llama2", MISTRAL_TEMPLATE, "<s>", "</s>"),
    }
    cases = []
    for family, tok in fams.items():
        for ci, conv in enumerate(CONVERSATIONS):
            try:
                text = tok.apply_chat_template(conv, tokenize=False)
            except Exception as e:  # roles the template refuses
                cases.append({"family": family, "conversation": ci, "error": str(e)})
                continue
            ids = tok(text, add_special_tokens=False)["input_ids"]
            cases.append({"family": family, "conversation": ci, "text": text,
                          "spans": spans(family, text, conv), "ids": ids})
    with open(os.path.join(out_dir, "chat_render.json"), "w", encoding="utf-8") as f:
        json.dump({"conversations": CONVERSATIONS, "cases": cases}, f,
                  ensure_ascii=False, indent=1)

    llama3 = fams["llama3"]
    n_docs = n_ids = 0
    with open(os.path.join(shared, "corpus", "brown.jsonl"), encoding="utf-8") as f:
        for line in f:
            n_ids += len(llama3(json.loads(line)["text"], add_special_tokens=False)["input_ids"])
            n_docs += 1
    with open(os.path.join(out_dir, "brown_llama3_count.json"), "w") as f:
        json.dump({"documents": n_docs, "ids_without_special": n_ids}, f)
        f.write("\n")


if __name__ == "__main__":
    main()
