#!/usr/bin/env python3
"""Reference fixtures for the chat templates (tests/cpu/test_jinja.c,
tests/cpu/test_chat.c), made with transformers' apply_chat_template
machinery (jinja2).

Reads tests/fixtures/chat/templates.json (each template's name, family,
model, public source and special tokens) and templates/NAME.jinja (the
templates themselves, byte for byte as their source has them), and writes:

  jinja_cases.json  small templates (CASES below) rendered by transformers'
                    jinja2 environment: each output, or the error;
  renders.json      every template x every conversation (CONVERSATIONS
                    below) x add_generation_prompt False/True, rendered by
                    transformers.utils.chat_template_utils.render_jinja_template
                    as apply_chat_template does: the text or the error; for
                    templates with {% generation %} blocks, the assistant
                    spans transformers finds (return_assistant_tokens_mask);
                    for templates with a TRL training variant, the spans of
                    that variant when it renders the same text; the byte
                    ranges of each message's content in the text; and, when
                    the shared tokenizers are present, the ids and
                    assistant_masks of apply_chat_template(tokenize=True,
                    return_assistant_tokens_mask=True).

Offsets are UTF-8 byte offsets (Python's character offsets converted).
strftime_now reads a fixed clock (FIXED_TIME, local time), so that
templates that print today's date render the same every time; the C tests
pass the same time.

Usage: scripts/make_chat_template_fixtures.py [SHARED_DATA_DIR] [FIXTURE_DIR]
Needs: pip install transformers jinja2 tokenizers
"""
import datetime
import json
import os
import re
import sys

import transformers.utils.chat_template_utils as ctu

FIXED_TIME = 1721995200  # 2024-07-26 12:00 UTC


class FixedClock(datetime.datetime):
    @classmethod
    def now(cls, tz=None):
        return datetime.datetime.fromtimestamp(FIXED_TIME, tz)


ctu.datetime = FixedClock

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "The city"},
                           "unit": {"type": "string", "enum": ["c", "f"]}},
            "required": ["city"]}}}

# Each: the JSONL line a user would write ("messages", and "tools" or
# "chat_template_kwargs" where the conversation has them).
CONVERSATIONS = {
    "basic": {"messages": [
        {"role": "user", "content": "Hello!"},
        {"role": "assistant", "content": "Hi, how can I help?"}]},
    "system": {"messages": [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "  What is 2+2?  \n"},
        {"role": "assistant", "content": "\n4\n"},
        {"role": "user", "content": "And 3*3?"},
        {"role": "assistant", "content": " 9 "}]},
    "unicode": {"messages": [
        {"role": "user", "content": "Unicode: caf\u00e9 \u65e5\u672c \U0001F600 \"quoted\" {braces}"},
        {"role": "assistant", "content": "na\u00efve r\u00e9sum\u00e9\u00a0\u2003 it's"}]},
    "think": {"messages": [
        {"role": "user", "content": "Is 7 prime?"},
        {"role": "assistant", "content": "<think>\nIt has no divisors.\n</think>\n\nYes."},
        {"role": "user", "content": "And 9?"},
        {"role": "assistant", "content": "No, 9 = 3 x 3.", "reasoning_content": "3 divides it."}]},
    "open": {"messages": [
        {"role": "system", "content": "You answer in French."},
        {"role": "user", "content": "one"},
        {"role": "assistant", "content": "un"},
        {"role": "user", "content": "two"}]},
    "tools": {"tools": [WEATHER_TOOL], "messages": [
        {"role": "system", "content": "You can call tools."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "tool_calls": [
            {"id": "call12345", "type": "function",
             "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}}]},
        {"role": "tool", "tool_call_id": "call12345", "name": "get_weather",
         "content": "{\"temperature\": 21.5}"},
        {"role": "assistant", "content": "It is 21.5 C in Paris."}]},
    "parts": {"messages": [
        {"role": "user", "content": [{"type": "text", "text": "Describe this."}]},
        {"role": "assistant", "content": [{"type": "text", "text": "A cat on a mat."}]}]},
    "nothink": {"chat_template_kwargs": {"enable_thinking": False}, "messages": [
        {"role": "user", "content": "Quick: 1+1?"},
        {"role": "assistant", "content": "2"},
        {"role": "user", "content": "2+2?"}]},
}

# Small templates for the engine's semantics: (template, variables).
CASES = [
    ("{% set x = 0 %}{% for i in [1,2] %}{{ x }}{% set x = i %}{{ x }}{% endfor %}{{ x }}", {}),
    ("{% for i in [1,2] %}{% if i == 2 %}{{ y }}{% endif %}{% set y = i %}{% endfor %}[{{ y }}]", {}),
    ("{% if true %}{% set z = 5 %}{% endif %}{{ z }}", {}),
    ("{{ [1, 'a', 1.5, none, true, {'k': [2]}] }}", {}),
    ("{{ {'a': 1.0, 'b': 1e20, 'c': 1e-5, 'd': 0.1, 'e': -0.0, 'f': 123456789012345678.0} }}", {}),
    ("{{ {'a': 1.0, 'b': 1e20, 'c': 1e-5, 'd': 0.1, 'e': -0.0} | tojson }}", {}),
    ("{{ x | tojson }}", {"x": {"a": "\u00e9<>&'\"\n\u2028\t\u0001", "b": [1, 2.5, None, True], "c": {}}}),
    ("{{ x | tojson(indent=2) }}", {"x": {"a": [1, {"b": 2}], "c": [], "d": {}}}),
    ("{{ x | tojson(indent=4, sort_keys=true) }}", {"x": {"b": [1, {"d": 2, "c": 3}], "a": "z"}}),
    ("{{ 'abc'[1:] }} {{ 'h\u00e9llo'[1] }} {{ 'h\u00e9llo'|length }} {{ [1,2,3][::-1] }} {{ 'abc'[-1] }}"
     " {{ 'h\u00e9llo'[::-1] }} {{ 'h\u00e9llo'[1:4] }}", {}),
    ("{{ 7 // 2 }} {{ 7 / 2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 2 ** 10 }} {{ 4 / 2 }} {{ 1 ~ 2 }}"
     " {{ 7.5 // 2 }} {{ -7.5 % 2 }} {{ 2 ** -1 }}", {}),
    ("{{ undefined_var }}|{{ none }}|{{ true }}|{{ 'a' + 'b' }}|{{ [1] + [2] }}|{{ (1,) + (2,) }}", {}),
    ("{{ x.foo }}|{{ x.a.b }}|{{ x['foo'] is defined }}|{{ x.get('foo', 3) }}|{{ x.get('a') }}"
     "|{{ x.items() | list }}", {"x": {"a": None}}),
    ("{{ ' a b  c '.split() }} {{ 'a,b,,c'.split(',') }} {{ 'a,b,c'.split(',', 1) }} {{ ' x '.strip() }}"
     "|{{ 'xxaxx'.strip('x') }}|{{ 'a,b,c'.rsplit(',', 1) }}|{{ '  a b  c '.split(None, 1) }}"
     "|{{ '  a b  c '.rsplit(None, 1) }}", {}),
    ("{{ 'hello world'.title() }} {{ 'hello World'.capitalize() }} {{ 'ab' | upper }}"
     " {{ 'hello wORld-foo(bar' | title }} {{ 'hELLO' | capitalize }} {{ \"they're bill's\".title() }}", {}),
    ("{% for a, b in x.items() %}{{ a }}={{ b }};{% endfor %}{% for k in x %}{{ k }}{% endfor %}",
     {"x": {"a": 1, "b": 2}}),
    ("{% for i in range(3) %}{{ loop.index }}{{ loop.first }}{{ loop.last }}{{ loop.length }}"
     "{{ loop.revindex }}{{ loop.revindex0 }}{% endfor %}", {}),
    ("{% for i in [1,2,3] if i != 2 %}{{ loop.index0 }}{{ i }}{{ loop.last }}{% else %}E{% endfor %}"
     "{% for i in [] %}x{% else %}E{% endfor %}", {}),
    ("{% for x in [1,2,3] %}{{ loop.previtem }}|{{ loop.nextitem }};{% endfor %}", {}),
    ("{{ 'x' if false }}|{{ (1, 2) }}|{{ 3.0 }}|{{ 10 / 4 }}|{{ 1e3 }}|{{ (1,) }}|{{ () }}", {}),
    ("{{ 'a' * 3 }}{{ [1] * 2 }}{{ 2 * 'b' }}", {}),
    ("{{ x|string }} {{ x|length }} {{ x|join(', ') }} {{ x|first }} {{ x|last }} {{ x|list }}"
     " {{ 'ab'|list }} {{ x|reverse|list }} {{ 'abc'|reverse }}", {"x": ["a", "b"]}),
    ("{% macro f(a, b='d') %}[{{ a }}{{ b }}]{% endmacro %}{{ f(1) }}{{ f(1, b=2) }}{{ f(b=3, a=4) }}", {}),
    ("{% macro f(x) %}<{{ caller() }}|{{ x }}>{% endmacro %}{% call f(1) %}in{% endcall %}", {}),
    ("{% filter upper %}abc {{ 'd' }}{% endfilter %}", {}),
    ("  {% if true %}\n  x\n  {% endif %}\n  y  \n", {}),
    ("a\n{%- if true %}\n b {{- ' c ' -}} d\n{% endif -%}\n e", {}),
    ("a  {# c #}\nb|a\n  {# c #}\nb|a\n  {{ 'x' }}\nb|x {% if true %}  \n y{% endif %}", {}),
    ("{% if true +%}\nA{%+ endif %}|line\n\t {%- if true %}X{% endif %}|a\n\u00a0{% if true %}X{% endif %}", {}),
    ("{{ 'a' 'b' }} {{ '\\x41\\u00e9\\n\\d' }} {{ \"it's\" }} {{ 'a\\'b' }} {{ 1_000 }} {{ 1.5e3 }}", {}),
    ("{{ x is string }} {{ x is iterable }} {{ x is mapping }} {{ 3 is number }} {{ none is none }}"
     " {{ x is sequence }} {{ y is defined }} {{ y is undefined }} {{ 3 is integer }} {{ 3.0 is float }}"
     " {{ true is boolean }} {{ 4 is even }} {{ 3 is odd }} {{ 6 is divisibleby 3 }} {{ 3 is in [3] }}"
     " {{ 3 is eq 3 }} {{ 3 is ne 3 }} {{ 2 is lt 3 }} {{ 2 is gt 3 }} {{ 2 is ge 2 }} {{ 2 is le 1 }}",
     {"x": "s"}),
    ("{{ 1 == 1.0 }} {{ true == 1 }} {{ '1' == 1 }} {{ none == none }} {{ [1,2] == [1,2] }}"
     " {{ [1] == (1,) }} {{ {'a':1} == {'a':1} }} {{ 'a' < 'b' }} {{ 3 > 2 > 1 }} {{ 1 < 2 < 2 }}"
     " {{ 'ab' in ['ab'] }} {{ 'x' not in 'abc' }} {{ 'k' in {'k':1} }}", {}),
    ("{{ true and 'x' }} {{ false or 'y' }} {{ 0 or [] }} {{ not '' }} {{ none or 'd' }} {{ 'a' and none }}", {}),
    ("{{ x.content }}|{{ x.content|trim }}|{{ x.content ~ '!' }}", {"x": {"content": None}}),
    ("{{ x | selectattr('a') | list }} {{ x | selectattr('a', 'equalto', 2) | list }}"
     " {{ x | rejectattr('a', 'defined') | list }} {{ x | map(attribute='a', default=0) | list }}",
     {"x": [{"a": 1}, {"a": 2}, {"b": 3}]}),
    ("{{ [1,2,3] | reject('equalto', 2) | list }} {{ [1,2,3] | select('odd') | list }}"
     " {{ ['a','B'] | map('upper') | list }} {{ [0, 1, ''] | select | list }}", {}),
    ("{{ 'a\nb' | indent(2) }}|{{ 'a\nb\n' | indent(2, true) }}|{{ 'a\n\nb' | indent(width=4, first=True) }}"
     "|{{ 'a\n\nb' | indent(2, blank=true) }}|{{ 'x' | indent }}", {}),
    ("{{ 3.7 | int }} {{ '42' | int }} {{ 'x' | int }} {{ 2 | float }} {{ '2.5' | float }} {{ -3 | abs }}", {}),
    ("{{ x | default('d') }} {{ none | default('d') }} {{ none | default('d', true) }}"
     " {{ '' | default('d', true) }} {{ y | d('e') }}", {"y": 0}),
    ("{{ 'aXbX'.replace('X', 'y') }} {{ 'aXbX' | replace('X', 'y') }} {{ 'aXbX'.replace('X', 'y', 1) }}"
     " {{ 'ab'.replace('', '-') }}", {}),
    ("{% set a, b = 1, 2 %}{{ a }}{{ b }}{% set c = 1, 2 %}{{ c }}", {}),
    ("{% set ns = namespace(a=1) %}{% for i in [1,2] %}{% set ns.a = ns.a + i %}{% endfor %}"
     "{{ ns.a }} {{ ns }} {{ namespace({'b': 2}).b }}", {}),
    ("{{ dict(a=1) }} {{ dict(a=1)|tojson }} {{ dict({'x': 1}, y=2) }}", {}),
    ("{{ x[5] }}|{{ x['q'] }}|{{ x[-1] }}", {"x": [1]}),
    ("{{ x.keys() | list }} {{ x.values() | list }} {{ x | items | list }} {{ x | dictsort }}",
     {"x": {"b": 1, "A": 2, "a": 3}}),
    ("{{ 'abc'.upper() }}{{ 'ABC'.lower() }}{{ 'a-b'.find('-') }}{{ 'abcb'.count('b') }}"
     "{{ ','.join(['a','b']) }}{{ 'h\u00e9llo'.find('l') }}{{ 'hello'.rfind('l') }}", {}),
    ("{% set x %}inner {{ 1 }}{% endset %}[{{ x }}]{% set y | upper %}up{% endset %}{{ y }}", {}),
    ("{{ 1.0 | tojson }} {{ 1e16 | tojson }} {{ 1e-7|tojson }} {{ 100.0 }} {{ 1e16 }} {{ 0.0001 }}"
     " {{ 0.00001 }} {{ 1/3 }} {{ 0.1+0.2 }} {{ 123456789.123 }} {{ 5e-324 }} {{ 1.7976931348623157e308 }}", {}),
    ("{{ [1,[2,'a\\'b\"c']] }} {{ ['it\\'s'] }} {{ ['\\n\\t\\x00\\u2028\u00e9'] }}"
     " {{ ['\\xa0\\u200b\\U0001F600'] }} {{ {'a': none, 1: 2, (1,2): 3} }}", {}),
    ("{{ x | tojson }}", {"x": {"1": 4, "b": [True, False, None, 1.5, -2]}}),
    ("{{ x | tojson(separators=(',', ':')) }} {{ x | tojson(sort_keys=true) }} {{ x | tojson(indent='\\t') }}",
     {"x": {"b": [1, 2], "a": {"c": None}}}),
    ("{{ range(2, 10, 3) | list }} {{ range(5)|length }} {{ range(5, 0, -2)|list }}", {}),
    ("{{ 'abc'[5:] }}|{{ 'abc'[-10:2] }}|{{ [1,2,3,4,5][::2] }}|{{ [1,2,3,4,5][4:1:-1] }}|{{ [1,2,3][:-1] }}", {}),
    ("{% for x in [1,2,3,4] %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 4 %}{% break %}{% endif %}"
     "{{ x }}{% endfor %}", {}),
    ("{% for a in [1,2] %}{% for b in [3] %}{{ loop.index }}{{ a }}{% endfor %}{{ loop.index }}{% endfor %}", {}),
    ("{{ 'Hello'.startswith(('He', 'x')) }} {{ 'Hello'.endswith('lo') }} {{ 'a b'.split(' ') }}"
     " {{ '12'.isdigit() }} {{ ' '.isspace() }}", {}),
    ("{{ x['a']['b'] }}|{{ loop }}|{{ x.a.get('z', 'q') }}", {"x": {"a": {}}}),
    ("{% for m in msgs %}{{ m.role }}:{{ m['content'] }}{% if not loop.last %}, {% endif %}{% endfor %}",
     {"msgs": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}),
    ("{{ strftime_now('%Y-%m-%d') }}", {}),
    ("{{ messages[0]['content'] | trim + '!' }} {{ -1 | abs }} {{ -2 ** 2 }} {{ not 1 == 2 }} {{ 2 * 3 ~ 4 }}",
     {"messages": [{"content": " hi "}]}),
    ("{{ 'a' ~ none ~ 1 ~ [1] ~ undefined_thing }}", {}),
    ("{%- for message in messages -%}\n{{- message['role'] -}}\n{%- endfor -%}\n", {"messages": [{"role": "a"}, {"role": "b"}]}),
    ("{% raw %}{{ not rendered }}{% endraw %}|{%- raw -%}  x  {%- endraw -%}  |", {}),
    ("{#- comment -#}  a  {#+ c +#} b", {}),
    ("{{ x is none }} {{ x is not none }} {{ x is false }} {{ x is true }}", {"x": False}),
    ("{{ [3,1,2] | length }} {{ {'a': 1} | length }} {{ 'h\u00e9llo' | count }}", {}),
    ("{{ '{}' }}{{ '\\\\' }}{{ 'tab\\there' }}", {}),
    ("x\r\ny\r\n", {}),
    # errors: the C side must fail too
    ("{{ raise_exception('boom') }}", {}),
    ("{{ x.y.z }}", {"x": {}}),
    ("{{ 1 < 'a' }}", {}),
    ("{{ 'a' + 1 }}", {}),
    ("{{ none | length }}", {}),
    ("{% for m in none %}{% endfor %}", {}),
    ("{{ foo() }}", {}),
    ("{{ 5 // 0 }}", {}),
]


def byte_off(s, i):
    return len(s[:i].encode("utf-8"))


def byte_spans(text, spans):
    return [[byte_off(text, a), byte_off(text, b)] for a, b in spans]


def template_data(line, add_generation_prompt, special):
    """The variables apply_chat_template hands a template for a JSONL line."""
    chat = [{k: v for k, v in m.items() if v is not None} for m in line["messages"]]
    chat = ctu._alias_reasoning_fields(ctu._plain_template_data(chat))
    kwargs = dict(special)
    kwargs.update(line.get("chat_template_kwargs", {}))
    return chat, kwargs


def render(src, line, gen, special, mask=False):
    chat, kwargs = template_data(line, gen, special)
    out, spans = ctu.render_jinja_template(
        conversations=[chat], tools=line.get("tools"), chat_template=src,
        add_generation_prompt=gen, return_assistant_tokens_mask=mask, **kwargs)
    return out[0], (spans[0] if mask else None)


def content_ranges(text, line):
    """Byte ranges where each message's (stripped) string content appears,
    searched in order: [message index, start, end]."""
    out, pos = [], 0
    for i, m in enumerate(line["messages"]):
        c = m.get("content")
        if not isinstance(c, str) or not c.strip():
            continue
        k = text.find(c.strip(), pos)
        if k < 0:
            continue
        out.append([i, byte_off(text, k), byte_off(text, k + len(c.strip()))])
        pos = k + len(c.strip())
    return out


def load_tokenizer(shared, name):
    """A shared tokenizer without special tokens of its own: the template's
    come as variables, so a token the vocabulary lacks is not added to it."""
    from transformers import PreTrainedTokenizerFast
    path = os.path.join(shared, "tokenizers", name, "tokenizer.json")
    return PreTrainedTokenizerFast(tokenizer_file=path) if os.path.exists(path) else None


def tokens(tok, src, line, special):
    """ids and assistant_masks as apply_chat_template(tokenize=True) gives them."""
    chat, kwargs = template_data(line, False, special)
    out = tok.apply_chat_template(chat, tools=line.get("tools"), chat_template=src, tokenize=True,
                                  return_dict=True, return_assistant_tokens_mask=True, **kwargs)
    return list(out["input_ids"]), list(out["assistant_masks"])


def make_cases(out_dir):
    cases = []
    for tpl, variables in CASES:
        case = {"template": tpl, "vars": variables}
        try:
            case["output"] = ctu._compile_jinja_template(tpl).render(**variables)
        except Exception as e:
            case["error"] = f"{type(e).__name__}: {e}"
        cases.append(case)
    with open(os.path.join(out_dir, "jinja_cases.json"), "w", encoding="utf-8") as f:
        json.dump({"time": FIXED_TIME, "cases": cases}, f, ensure_ascii=False, indent=1)
        f.write("\n")


def make_renders(shared, out_dir):
    with open(os.path.join(out_dir, "templates.json"), encoding="utf-8") as f:
        manifest = json.load(f)
    sources = {}
    for t in manifest:
        with open(os.path.join(out_dir, "templates", t["name"] + ".jinja"), encoding="utf-8", newline="") as f:
            sources[t["name"]] = f.read()
    tokenizers = {}
    renders = []
    for t in manifest:
        src, special = sources[t["name"]], t["special"]
        twin = t.get("trl_training")
        has_gen = re.search(r"\{%-?\s*generation\s*-?%\}", src) is not None
        for conv_name, line in CONVERSATIONS.items():
            for gen in (False, True):
                r = {"template": t["name"], "conversation": conv_name, "add_generation_prompt": gen}
                renders.append(r)
                try:
                    text, spans = render(src, line, gen, special, mask=bool(has_gen) and not gen)
                except Exception as e:
                    r["error"] = f"{type(e).__name__}: {e}"
                    continue
                r["text"] = text
                if gen:
                    continue
                r["contents"] = content_ranges(text, line)
                if has_gen:
                    r["generation_spans"] = byte_spans(text, spans)
                ref_src = src if has_gen else sources.get(twin)
                if twin:
                    try:
                        twin_text, twin_spans = render(sources[twin], line, False, special, mask=True)
                    except Exception:
                        twin_text = None
                    if twin_text == text:
                        r["trl_spans"] = byte_spans(text, twin_spans)
                    else:
                        ref_src = None
                if ref_src and shared:
                    if t["tokenizer"] not in tokenizers:
                        tokenizers[t["tokenizer"]] = load_tokenizer(shared, t["tokenizer"])
                    tok = tokenizers[t["tokenizer"]]
                    if tok is not None:
                        r["tokenizer"] = t["tokenizer"]
                        r["ids"], r["assistant_masks"] = tokens(tok, ref_src, line, special)
    with open(os.path.join(out_dir, "renders.json"), "w", encoding="utf-8") as f:
        json.dump({"time": FIXED_TIME, "conversations": CONVERSATIONS, "renders": renders}, f,
                  ensure_ascii=False, indent=0)
        f.write("\n")
    return len(renders)


def main():
    shared = sys.argv[1] if len(sys.argv) > 1 else "../shared/data"
    out_dir = sys.argv[2] if len(sys.argv) > 2 else "tests/fixtures/chat"
    if not os.path.isdir(shared):
        print(f"{shared}: no shared data; the token-level fixtures are left out", file=sys.stderr)
        shared = None
    make_cases(out_dir)
    n = make_renders(shared, out_dir)
    print(f"{len(CASES)} template cases, {n} renders")


if __name__ == "__main__":
    main()
