#!/usr/bin/env python3
"""Reference fixture for the data pipeline tests (tests/cpu/test_dataset.c).

Writes tests/fixtures/data/brown_llama3_count.json: the number of Llama-3 ids
of every record of brown.jsonl (add_special_tokens=False), for the C test of
the "text" format (which adds BOS and EOS per document). The chat templates'
fixtures are scripts/make_chat_template_fixtures.py's.

Usage: scripts/make_data_fixture.py [SHARED_DATA_DIR] [OUT_DIR]
"""
import json
import os
import sys

from transformers import PreTrainedTokenizerFast


def main():
    shared = sys.argv[1] if len(sys.argv) > 1 else "../shared/data"
    out_dir = sys.argv[2] if len(sys.argv) > 2 else "tests/fixtures/data"
    llama3 = PreTrainedTokenizerFast(
        tokenizer_file=os.path.join(shared, "tokenizers", "llama3", "tokenizer.json"))
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
