#!/usr/bin/env python3
"""Checks megatrain against transformers end to end for one dense model family.

`megatrain init --model-type TYPE` makes a tiny model, `megatrain train` trains it on the
CPU (the loss must go down) and saves it; transformers' from_pretrained loads the saved
directory and its fp32 logits must match those of `megatrain eval --dump-logits` within
1e-5 relative (both sides are fp32: they differ by summation order only, ~1e-7).
Nothing is written outside a temporary directory; `make test` does not run this (it
needs torch).

Usage: python scripts/check_hf_roundtrip.py BUILD/megatrain [--model-type gpt_neox] [--kv-heads 2]
                                           [--sliding-window N] [--longrope]
(falcon: --kv-heads 1 makes Falcon-7B's architecture, more the new decoder's; gemma2,
gemma3_text: --sliding-window 8 sets the window of init's config.json, shorter than the
sequences, so that it bites in training and in the compared logits; phi3 with
--longrope gives the model Phi-3.5's rope_scaling with a pretraining length of 16 of its
64 positions: training at 32 tokens uses the long factors, and the logits are compared at
16 tokens (short factors) and at 32 (long ones))
"""
import argparse
import json
import os
import subprocess
import tempfile

import torch
import transformers
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM


def run(*cmd):
    print("   $", " ".join(cmd))
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("binary")
    ap.add_argument("--model-type", default="gpt_neox")
    ap.add_argument("--kv-heads", default="2")
    ap.add_argument("--sliding-window", type=int, default=0)
    ap.add_argument("--longrope", action="store_true", help="phi3: Phi-3.5's longrope scaling")
    args = ap.parse_args()
    transformers.logging.set_verbosity_error()
    tok = os.path.join(here, "..", "tests", "fixtures", "tokenizer", "tiny_bytelevel.json")
    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, "data.jsonl")
        gen = torch.Generator().manual_seed(3)
        words = "the a river boat old man woman walked saw near by city morning night red green".split()
        with open(data, "w") as f:
            for _ in range(200):
                idx = torch.randint(0, len(words), (40,), generator=gen).tolist()
                f.write(json.dumps({"text": " ".join(words[i] for i in idx)}) + "\n")
        init, out = os.path.join(tmp, "init"), os.path.join(tmp, "run")
        run(args.binary, "init", "--tokenizer", tok, "--out", init, "--model-type", args.model_type,
            "--hidden", "64", "--layers", "2", "--heads", "4", "--kv-heads", args.kv_heads, "--ffn", "128",
            "--max-pos", "64", "--std", "0.1", "--seed", "3")
        if args.sliding_window:
            with open(os.path.join(init, "config.json")) as f:
                cfg = json.load(f)
            cfg["sliding_window"] = args.sliding_window
            with open(os.path.join(init, "config.json"), "w") as f:
                json.dump(cfg, f, indent=2)
        if args.longrope:
            add_longrope(os.path.join(init, "config.json"))
        run(args.binary, "train", "--model", init, "--data", data, "--out", out, "--device", "cpu",
            "--seq-len", "32", "--batch-size", "4", "--micro-batches", "2", "--steps", "30",
            "--lr", "3e-3", "--warmup-steps", "2", "--save-dtype", "fp32", "--log-every", "1",
            "--save-every", "0", "--sample-tokens", "0")
        with open(os.path.join(out, "metrics.jsonl")) as f:
            losses = [json.loads(line)["loss"] for line in f if '"loss"' in line]
        print(f"   megatrain train: loss {losses[0]:.4f} -> {losses[-1]:.4f} in {len(losses)} steps")
        assert losses[-1] < losses[0] - 0.1, f"the loss did not go down: {losses}"
        model_dir = os.path.join(out, "model")
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32,
                                                     attn_implementation="eager").eval()
        assert model.config.model_type == args.model_type, model.config.model_type
        for seq_len in ("16", "32") if args.longrope else ("16",):
            ours_path = os.path.join(tmp, f"ours{seq_len}.safetensors")
            run(args.binary, "eval", "--model", model_dir, "--data", data, "--device", "cpu",
                "--seq-len", seq_len, "--batch-size", "1", "--max-batches", "1",
                "--dump-logits", ours_path)
            ours = load_file(ours_path)
            ids = ours["input_ids"].long()[None]
            with torch.no_grad():
                ref = model(ids).logits[0].float()
            err = ((ours["logits"] - ref).norm() / ref.norm()).item()
            print(f"   {type(model).__name__} from_pretrained vs megatrain logits at {seq_len} "
                  f"tokens: rel err {err:.2e}")
            assert err <= 1e-5, err


def add_longrope(path):
    """Phi-3.5-mini's kind of rope_scaling on the model that init wrote: 8 factors for its
    16-dim heads, a pretraining length of 16 of the 64 positions."""
    with open(path) as f:
        cfg = json.load(f)
    assert cfg["model_type"] == "phi3", "--longrope is for --model-type phi3"
    cfg["original_max_position_embeddings"] = 16
    cfg["rope_scaling"] = {"type": "longrope",
                           "short_factor": [1.0, 1.0, 1.1, 1.2, 1.4, 1.7, 2.0, 2.5],
                           "long_factor": [1.0, 1.5, 2.5, 4.0, 7.0, 11.0, 17.0, 25.0]}
    with open(path, "w") as f:
        json.dump(cfg, f, indent=2)


if __name__ == "__main__":
    main()
