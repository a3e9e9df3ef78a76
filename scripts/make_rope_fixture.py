#!/usr/bin/env python3
"""Writes the RoPE table fixture used by tests/cpu/test_rope.c.

The tables come from transformers' own LlamaRotaryEmbedding and, for phi3's
longrope, Phi3RotaryEmbedding (fp32, CPU), so the test compares megatrain
against the reference implementation, not against a re-derivation of it.

Output: <outdir>/rope_tables.json, an object
  {"cases": [{"name", "head_dim", "rope_theta", "rope_type" ("default" or
              "llama3"), "factor", "low_freq_factor", "high_freq_factor",
              "original_max_position_embeddings" (llama3 only), "T",
              longrope only: "short_factor", "long_factor" [HD/2 floats],
              "original_max_position_embeddings", "max_position_embeddings",
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
from transformers import LlamaConfig, Phi3Config
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding
from transformers.models.phi3.modeling_phi3 import Phi3RotaryEmbedding

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


# phi3's longrope: (name, head_dim, theta, original and full context, short, long). The
# 64 positions take the short factors when the original context is 128, the long ones
# when it is 32; both scale cos and sin by sqrt(1 + ln(max / orig) / ln(orig)).
LONGROPE_CASES = [
    ("longrope_hd8_short", 8, 10000.0, 128, 512, [1.0, 1.1, 1.3, 1.9], [1.5, 3.0, 6.5, 12.0]),
    ("longrope_hd64_long", 64, 10000.0, 32, 131072, [1.0 + 0.03 * i for i in range(32)],
     [1.0 + 0.9 * i * i / 31 for i in range(32)]),
]


def make_longrope_case(name, hd, theta, orig, max_pos, short, long):
    rope = {"rope_type": "longrope", "rope_theta": theta, "short_factor": short,
            "long_factor": long}
    cfg = Phi3Config(hidden_size=hd * 2, num_attention_heads=2, num_key_value_heads=2,
                     max_position_embeddings=max_pos, original_max_position_embeddings=orig,
                     rope_parameters=rope)
    emb = Phi3RotaryEmbedding(cfg)
    x = torch.zeros(1, T, hd, dtype=torch.float32)
    pos = torch.arange(T).unsqueeze(0)
    cos, sin = emb(x, pos)  # picks the factors for this length, then scales by the factor
    half = hd // 2
    return {"name": name, "head_dim": hd, "rope_theta": theta, "rope_type": "longrope", "T": T,
            "short_factor": short, "long_factor": long,
            "original_max_position_embeddings": orig, "max_position_embeddings": max_pos,
            "inv_freq": emb.inv_freq.float().tolist(),
            "cos": cos[0, :, :half].reshape(-1).tolist(),
            "sin": sin[0, :, :half].reshape(-1).tolist()}


def main():
    outdir = sys.argv[1] if len(sys.argv) > 1 else os.path.join("tests", "fixtures", "rope")
    os.makedirs(outdir, exist_ok=True)
    cases = [make_case(*c) for c in CASES] + [make_longrope_case(*c) for c in LONGROPE_CASES]
    path = os.path.join(outdir, "rope_tables.json")
    with open(path, "w") as f:
        json.dump({"cases": cases}, f)
        f.write("\n")
    print(f"wrote {path} ({len(cases)} cases)")


if __name__ == "__main__":
    main()
