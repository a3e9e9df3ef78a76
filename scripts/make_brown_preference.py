#!/usr/bin/env python3
"""Builds a preference set from the Brown corpus (brown.jsonl, {"id", "text"} per line) for
the DPO walk-through of docs/preference.md.

Each pair takes a passage of a document as the prompt, ending inside a word, the text that
really follows it as the chosen answer, and a passage of the same length from another
document, starting at the space before one of its words, as the rejected one: a model that
knows the language and reads the prompt prefers the chosen one. The first documents give the training pairs (and an SFT text file of the same
documents), the last ones the held-out pairs, so that no held-out passage was trained on.
Standard library only; deterministic for a seed.

Usage: python scripts/make_brown_preference.py BROWN.jsonl OUT_DIR
           [--pairs 2000] [--eval-pairs 200] [--eval-docs 50] [--prompt 48] [--answer 8]
Writes OUT_DIR/sft.jsonl ({"text"}), OUT_DIR/pairs.jsonl and OUT_DIR/pairs_eval.jsonl
({"prompt", "chosen", "rejected"}).
"""
import argparse
import json
import os
import random


def passages(docs, n, prompt_len, answer_len, rng):
    """n pairs: a prompt and its continuation from one document, a rejected answer of the
    same length from another."""
    out = []
    span = prompt_len + answer_len
    while len(out) < n:
        d = rng.randrange(len(docs))
        text = docs[d]
        if len(text) < span + 1:
            continue
        at = rng.randrange(len(text) - span)
        # the prompt ends inside a word, which the chosen answer completes
        if not (text[at + prompt_len - 1].isalpha() and text[at + prompt_len].isalpha()):
            continue
        other = rng.randrange(len(docs) - 1)
        other += other >= d
        o = docs[other]
        # the other document's passage starts between two of its words (at a space)
        oat = o.find(" ", rng.randrange(len(o) - 2 * answer_len))
        out.append({"prompt": text[at:at + prompt_len],
                    "chosen": text[at + prompt_len:at + span],
                    "rejected": o[oat:oat + answer_len]})
    return out


def write_jsonl(path, rows):
    with open(path, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("brown")
    ap.add_argument("out")
    ap.add_argument("--pairs", type=int, default=2000)
    ap.add_argument("--eval-pairs", type=int, default=200)
    ap.add_argument("--eval-docs", type=int, default=50)
    ap.add_argument("--prompt", type=int, default=48, help="characters of each prompt")
    ap.add_argument("--answer", type=int, default=8, help="characters of each answer")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    with open(args.brown, encoding="utf-8") as f:
        # one space for every run of white space: passages of running text
        docs = [" ".join(json.loads(line)["text"].split()) for line in f if line.strip()]
    train, held = docs[:-args.eval_docs], docs[-args.eval_docs:]
    rng = random.Random(args.seed)
    os.makedirs(args.out, exist_ok=True)
    write_jsonl(os.path.join(args.out, "sft.jsonl"), [{"text": t} for t in train])
    write_jsonl(os.path.join(args.out, "pairs.jsonl"),
                passages(train, args.pairs, args.prompt, args.answer, rng))
    write_jsonl(os.path.join(args.out, "pairs_eval.jsonl"),
                passages(held, args.eval_pairs, args.prompt, args.answer, rng))
    print(f"{args.out}: {len(train)} SFT documents, {args.pairs} pairs, "
          f"{args.eval_pairs} held-out pairs from {len(held)} other documents")


if __name__ == "__main__":
    main()
