#!/usr/bin/env python3
"""Reference fixtures for the tokenizer tests (tests/cpu/test_tokenizer.c).

Two parts, both written under tests/fixtures/tokenizer/:

1. Tiny tokenizers trained here with Hugging Face `tokenizers`, committed with
   their full reference ids and decodes for a committed text sample, so that
   a fresh clone tests the same code paths as the real tokenizers:
     tiny_bytelevel.json  byte-level BPE, NFC, Llama-3 regex split,
                          ignore_merges, a BOS template, one non-special
                          added token; merges stored as [a, b] pairs.
     tiny_sp.json         SentencePiece-style BPE: Prepend/Replace
                          normalizer, byte_fallback, fuse_unk, <s> template;
                          merges stored as "a b" strings. Bytes 0xF0..0xF7
                          have no <0xNN> token on purpose, so that 4-byte
                          characters fall back to a fused <unk>.
     sample.jsonl         the text sample (corpus lines plus hand-written
                          edge cases).
     tiny_*.ref.jsonl     per sample line: ids (add_special False / True)
                          and HF decode (skip_special False / True).

2. For the real tokenizers in the shared data (llama2, llama3, qwen3) and the
   two corpora (brown, sentences): a compact hash of the ids of every record,
   `<tok>_<corpus>.ids.bin`:
     "MTTK" u32 version=1, u32 n, u32 n_special, then n records of
     (u32 hash, u16 len) for add_special_tokens=False, then n_special records
     for the first n_special texts with add_special_tokens=True.
   hash = low 32 bits of FNV-1a 64 over the ids as little-endian int32.

Usage: scripts/make_tokenizer_fixtures.py [SHARED_DATA_DIR] [OUT_DIR]
"""
import json
import os
import random
import struct
import sys

from tokenizers import (Regex, Tokenizer, decoders, models, normalizers,
                        pre_tokenizers, processors, trainers)

LLAMA3_RE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|"
             r"\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
N_SPECIAL = 64  # records also checked with add_special_tokens=True


def read_texts(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line)["text"] for line in f]


def fnv1a32_of_ids(ids):
    h = 0xCBF29CE484222325
    for b in struct.pack("<%di" % len(ids), *ids):
        h ^= b
        h = (h * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h & 0xFFFFFFFF


def edge_cases():
    return [
        "", " ", "  ", "\n", "\r\n", "\t\tx", "a\n\n\nb", "   leading spaces",
        "trailing spaces   ", "Hello world", "hello  world   again",
        "I'M HERE, you're there, it'S fine, we'LL see, they'd've",
        "1234567890 12 1,234.56 3.14159", "e\u0301 cafe\u0301 A\u030a",  # NFC
        "caf\u00e9 na\u00efve \u00fcber", "\u4e00\u4e8c\u4e09 \u65e5\u672c\u8a9e",
        "emoji \U0001F600\U0001F44D\U0001F3FD family \U0001F468\u200d\U0001F469\u200d\U0001F467",
        "\u0645\u0631\u062d\u0628\u0627 \u05e9\u05dc\u05d5\u05dd", "tab\tand\vvt\fff",
        "<s>Hello</s>", "x<s>y", "<|bos|>text<|eos|>", "a <think> b</think>",
        "<s><s>", "<|bos|><|bos|>", "<|bos|", "<<s>>", "a\u00a0b\u2003c\u3000d",
        "zero\u200bwidth", "\u2581already\u2581metaspace", "<0x41> literal",
        "!!!??? ... ---", "http://example.com/path?q=1&r=2", "x" * 300,
        "naïve résumé coöperate", "\U0001F600" * 5, "  \n  \n",
    ]


def make_sample(shared):
    rng = random.Random(1234)
    sents = read_texts(os.path.join(shared, "corpus", "sentences.jsonl"))
    brown = read_texts(os.path.join(shared, "corpus", "brown.jsonl"))
    uni = [s for s in sents if any(ord(c) > 127 for c in s)]
    asc = [s for s in sents if all(ord(c) <= 127 for c in s)]
    lines = [ln for d in brown[:50] for ln in d.split("\n") if ln]
    sample = edge_cases() + rng.sample(uni, 150) + rng.sample(asc, 60) + rng.sample(lines, 50)
    return sample, brown[100:250]


def train_bytelevel(train_texts):
    tok = Tokenizer(models.BPE(ignore_merges=True))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_RE), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=256 + 400 + 2, special_tokens=["<|bos|>", "<|eos|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(train_texts, trainer)
    tok.add_tokens(["<think>", "</think>"])  # non-special added tokens
    bos = tok.token_to_id("<|bos|>")
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single="<|bos|> $A", special_tokens=[("<|bos|>", bos)])])
    return tok


def train_sp(train_texts):
    # Train with a Metaspace pre-tokenizer so merges stay inside words, then
    # rebuild the file the Llama-2 way: no pre-tokenizer, a Prepend/Replace
    # normalizer, <0xNN> byte tokens in the model vocab.
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"),
                                           normalizers.Replace(" ", "\u2581")])
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="never")
    trainer = trainers.BpeTrainer(vocab_size=500, special_tokens=["<unk>", "<s>", "</s>"],
                                  limit_alphabet=80, show_progress=False)
    tok.train_from_iterator(train_texts, trainer)
    j = json.loads(tok.to_str())
    trained = sorted(j["model"]["vocab"].items(), key=lambda kv: kv[1])
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for b in range(256):
        if not 0xF0 <= b <= 0xF7:
            vocab["<0x%02X>" % b] = len(vocab)
    for t, _ in trained:
        if t not in vocab:
            vocab[t] = len(vocab)
    merges = [" ".join(m) if isinstance(m, list) else m for m in j["model"]["merges"]]
    j["model"].update(vocab=vocab, merges=merges, byte_fallback=True, fuse_unk=True)
    for a in j["added_tokens"]:
        a["id"] = vocab[a["content"]]
    j["pre_tokenizer"] = None
    j["decoder"] = {"type": "Sequence", "decoders": [
        {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
        {"type": "ByteFallback"}, {"type": "Fuse"},
        {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}
    j["post_processor"] = {
        "type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                 {"SpecialToken": {"id": "<s>", "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}}
    return Tokenizer.from_str(json.dumps(j, ensure_ascii=False)), j


def write_ref(tok, sample, path):
    with open(path, "w", encoding="utf-8") as f:
        for text in sample:
            ids = tok.encode(text, add_special_tokens=False).ids
            ids_s = tok.encode(text, add_special_tokens=True).ids
            rec = {"ids": ids, "ids_special": ids_s,
                   "dec": tok.decode(ids_s, skip_special_tokens=False),
                   "dec_skip": tok.decode(ids_s, skip_special_tokens=True)}
            f.write(json.dumps(rec, ensure_ascii=False) + "\n")


def write_hashes(tok, texts, path):
    enc = tok.encode_batch(texts, add_special_tokens=False)
    enc_s = tok.encode_batch(texts[:N_SPECIAL], add_special_tokens=True)
    with open(path, "wb") as f:
        f.write(b"MTTK" + struct.pack("<III", 1, len(texts), len(enc_s)))
        for e in list(enc) + list(enc_s):
            assert len(e.ids) < 65536
            f.write(struct.pack("<IH", fnv1a32_of_ids(e.ids), len(e.ids)))


def main():
    shared = sys.argv[1] if len(sys.argv) > 1 else "../shared/data"
    out = sys.argv[2] if len(sys.argv) > 2 else "tests/fixtures/tokenizer"
    os.makedirs(out, exist_ok=True)
    sample, train_texts = make_sample(shared)
    with open(os.path.join(out, "sample.jsonl"), "w", encoding="utf-8") as f:
        for t in sample:
            f.write(json.dumps({"text": t}, ensure_ascii=False) + "\n")

    bl = train_bytelevel(train_texts)
    bl.save(os.path.join(out, "tiny_bytelevel.json"), pretty=False)
    write_ref(bl, sample, os.path.join(out, "tiny_bytelevel.ref.jsonl"))
    sp, sp_json = train_sp(train_texts)
    with open(os.path.join(out, "tiny_sp.json"), "w", encoding="utf-8") as f:
        json.dump(sp_json, f, ensure_ascii=False)
    write_ref(sp, sample, os.path.join(out, "tiny_sp.ref.jsonl"))

    for name in ["llama2", "llama3", "qwen3"]:
        tok = Tokenizer.from_file(os.path.join(shared, "tokenizers", name, "tokenizer.json"))
        for corpus in ["brown", "sentences"]:
            texts = read_texts(os.path.join(shared, "corpus", corpus + ".jsonl"))
            write_hashes(tok, texts, os.path.join(out, "%s_%s.ids.bin" % (name, corpus)))
            print("wrote", name, corpus, len(texts))


if __name__ == "__main__":
    main()
