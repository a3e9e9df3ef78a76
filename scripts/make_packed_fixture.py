#!/usr/bin/env python3
"""Builds the reference for document-masked packing: rows that hold several documents,
run through Hugging Face transformers with per-document position_ids (the padding-free
packing of TRL's DataCollatorWithFlattening), for three of the fixture models
(gemma3_text_sliding: a sliding window shorter than some documents, within each).

For each model it loads the committed tests/fixtures/models/<name>/ (written by
make_fixtures.py) and writes packed.safetensors beside it:
  input_ids, position_ids, labels, targets   (B, T) int64
  logits (B, T, V), loss (1), grad.<name>     fp32, one forward/backward
Positions restart at 0 at each document; transformers then keeps attention inside each
document (masking_utils.find_packed_sequence_indices). The script checks that each
document's logits equal a run of that document alone, and that they differ from one causal
sequence per row, so the fixture can only be met by masking per document. Deterministic
(one CPU thread): a second run writes identical bytes. docs/fixtures.md describes it.

Usage: python scripts/make_packed_fixture.py [--models DIR]
"""
import argparse
import json
import os

import safetensors
import torch
import transformers
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

import make_fixtures as mf

MODELS = ["llama_gqa", "qwen2_bias_tied", "gemma3_text_sliding"]
# Document lengths of each row (each row sums to T = 16): a document cut in three, a
# one-token document, and one filling most of a row.
DOC_LENGTHS = [[5, 7, 4], [1, 11, 4]]
# (row, document, n): the first n labels of that document are -100, an SFT prompt.
PROMPTS = [(0, 1, 3), (1, 1, 4)]
# Same-document logits, packed vs alone, may differ only by summation order (fp32).
ALONE_TOL = 1e-5
# Packed vs one causal sequence per row must differ by far more than that.
CAUSAL_MIN_DIFF = 1e-2


def make_packed_batch(gen, V):
    """input_ids uniform in [3, V); position_ids restart per document; labels = input_ids
    with -100 on each document's first token (no token of another document predicts it)
    and on the prompts."""
    B, T = len(DOC_LENGTHS), sum(DOC_LENGTHS[0])
    ids = torch.randint(3, V, (B, T), generator=gen, dtype=torch.int64)
    pos = torch.zeros(B, T, dtype=torch.int64)
    labels = ids.clone()
    for b, lens in enumerate(DOC_LENGTHS):
        assert sum(lens) == T
        start = 0
        for n in lens:
            pos[b, start:start + n] = torch.arange(n)
            labels[b, start] = mf.IGNORE
            start += n
    for b, d, n in PROMPTS:
        start = sum(DOC_LENGTHS[b][:d])
        labels[b, start:start + n] = mf.IGNORE
    return ids, pos, labels, mf.shift_targets(labels)


def check_against_documents_alone(model, ids, logits):
    """Every document run alone (positions 0..n-1, causal) gives its packed logits."""
    worst = 0.0
    with torch.no_grad():
        for b, lens in enumerate(DOC_LENGTHS):
            start = 0
            for n in lens:
                alone = model(input_ids=ids[b:b + 1, start:start + n]).logits[0]
                worst = max(worst, (alone - logits[b, start:start + n]).abs().max().item())
                start += n
    assert worst < ALONE_TOL, f"packed logits differ from documents run alone by {worst}"
    return worst


def build(name, root):
    out_dir = os.path.join(root, name)
    with open(os.path.join(out_dir, "train.json")) as f:
        seed = json.load(f)["seed"]
    model = AutoModelForCausalLM.from_pretrained(out_dir, attn_implementation="eager",
                                                 dtype=torch.float32)
    model.train()  # as make_fixtures.py: no dropout in these configs
    V = model.config.vocab_size
    ids, pos, labels, targets = make_packed_batch(torch.Generator().manual_seed(seed + 7), V)

    model.zero_grad(set_to_none=True)
    out = model(input_ids=ids, position_ids=pos, labels=labels)
    out.loss.backward()
    logits = out.logits.detach().float().clone()
    loss = out.loss.detach().float().reshape(1)
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    assert torch.equal(mf.ce_from_targets(logits, targets).reshape(1), loss), name

    worst = check_against_documents_alone(model, ids, logits)
    with torch.no_grad():
        causal = model(input_ids=ids).logits
    diff = (causal - logits).abs().max().item()
    assert diff > CAUSAL_MIN_DIFF, f"{name}: packing changes the logits by only {diff}"

    tensors = {"input_ids": ids, "position_ids": pos, "labels": labels, "targets": targets,
               "logits": logits, "loss": loss}
    for n, g in grads.items():
        tensors["grad." + n] = g
    meta = {"model": name, "seed": seed + 7, "doc_lengths": DOC_LENGTHS, "prompts": PROMPTS,
            "torch_version": torch.__version__, "transformers_version": transformers.__version__,
            "safetensors_version": safetensors.__version__}
    path = os.path.join(out_dir, "packed.safetensors")
    tensors = {k: v.contiguous() for k, v in tensors.items()}
    # One metadata key (see make_fixtures.py: several would be written in a varying order).
    save_file(tensors, path, metadata={"packed": json.dumps(meta, sort_keys=True)})
    ref = load_file(path)
    assert torch.equal(ref["targets"], mf.shift_targets(ref["labels"]))
    assert torch.equal(mf.ce_from_targets(ref["logits"], ref["targets"]).reshape(1), ref["loss"])
    print(f"== {name}: loss {loss.item():.6f}, packed vs alone max diff {worst:.3g}, "
          f"packed vs causal rows {diff:.3g}, {os.path.getsize(path)} bytes")


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=os.path.join(here, "..", "tests", "fixtures", "models"))
    args = ap.parse_args()
    torch.set_num_threads(1)  # fixed reduction order: identical bytes on every run
    torch.use_deterministic_algorithms(True)
    transformers.logging.set_verbosity_error()
    print(f"torch {torch.__version__}, transformers {transformers.__version__}")
    for name in MODELS:
        build(name, args.models)


if __name__ == "__main__":
    main()
