#!/usr/bin/env python3
"""Writes the RoPE table fixture used by tests/cpu/test_rope.c.

The tables come from transformers' own LlamaRotaryEmbedding (fp32, CPU), so
the test compares megatrain against the reference implementation, not
against a re-derivation of it.

Output: <outdir>/rope_tables.json, an object
  {"cases": [{"name", "head_dim", "rope_theta", "rope_type" ("default" or
              "llama3"), "factor", "low_freq_factor", "high_freq_factor",
              "original_max_position_embeddings" (llama3 only), "T",
              "inv_freq": [HD/2 floats],
              "cos", "sin": [T*HD/2 floats, row-major (T, HD/2)]}]}
Every number is an fp32 value written as the shortest decimal that reads
back as the same double, so the fixture is exact.

usage: python3 scripts/make_rope_fixture.py [outdir]   (default tests/fixtures/rope)
"""
import json
import os
import sys

import torch
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

T = 64

# (name, head_dim, theta, llama3 parameters or None)
CASES = [
    ("default_hd8_theta1e4", 8, 10000.0, None),
    ("default_hd64_theta1e4", 64, 10000.0, None),
    ("default_hd64_theta5e5", 64, 500000.0, None),
    # Llama 3.1's published scaling.
    ("llama3_hd8_theta5e5", 8, 500000.0, dict(factor=8.0, low_freq_factor=1.0,
                                              high_freq_factor=4.0,
                                              original_max_position_embeddings=8192)),
    ("llama3_hd64_theta5e5", 64, 500000.0, dict(factor=8.0, low_freq_factor=1.0,
                                                high_freq_factor=4.0,
                                                original_max_position_embeddings=8192)),
    # A short original context so that HD=8 has pairs in all three bands.
    ("llama3_hd8_theta1e4_ctx64", 8, 10000.0, dict(factor=4.0, low_freq_factor=1.0,
                                                   high_freq_factor=4.0,
                                                   original_max_position_embeddings=64)),
]


def make_case(name, hd, theta, llama3):
    rope = {"rope_type": "llama3" if llama3 else "default", "rope_theta": theta}
    if llama3:
        rope.update(llama3)
    cfg = LlamaConfig(hidden_size=hd * 2, num_attention_heads=2, num_key_value_heads=2,
                      head_dim=hd, max_position_embeddings=131072, rope_parameters=rope)
    emb = LlamaRotaryEmbedding(cfg)
    x = torch.zeros(1, T, hd, dtype=torch.float32)
    pos = torch.arange(T).unsqueeze(0)
    cos, sin = emb(x, pos)  # (1, T, HD), second half repeats the first
    half = hd // 2
    assert torch.equal(cos[..., :half], cos[..., half:])
    out = {"name": name, "head_dim": hd, "rope_theta": theta, "rope_type": rope["rope_type"],
           "T": T, "inv_freq": emb.inv_freq.float().tolist(),
           "cos": cos[0, :, :half].reshape(-1).tolist(),
           "sin": sin[0, :, :half].reshape(-1).tolist()}
    if llama3:
        out.update(llama3)
    return out


def main():
    outdir = sys.argv[1] if len(sys.argv) > 1 else os.path.join("tests", "fixtures", "rope")
    os.makedirs(outdir, exist_ok=True)
    cases = [make_case(*c) for c in CASES]
    path = os.path.join(outdir, "rope_tables.json")
    with open(path, "w") as f:
        json.dump({"cases": cases}, f)
        f.write("\n")
    print(f"wrote {path} ({len(cases)} cases)")


if __name__ == "__main__":
    main()
