#!/usr/bin/env python3
"""Writes a small safetensors file with the official `safetensors` library and
the values the C reader must find in it, for tests/cpu/test_safetensors.c.

  python3 scripts/make_safetensors_fixture.py [out_dir]
  (default out_dir: tests/fixtures/safetensors)

Outputs:
  official.safetensors  F32, BF16, F16, I64 tensors, a scalar, an empty
                        tensor, and __metadata__ {"format": "pt", ...}
  official.json         per tensor: dtype, shape, and
                        f32_bits: torch's tensor.float() as fp32 bit patterns
                        src_f32_bits: (BF16/F16) the fp32 values torch rounded,
                                      so the C narrowing can be compared too
                        values: (I64) the integers
Bit patterns keep inf, nan and subnormals exact through JSON.
"""
import json
import os
import sys

import torch
from safetensors.torch import save_file


def bits(t):
    return t.float().contiguous().view(torch.int32).flatten().tolist()


def edge_values():
    """fp32 values that stress rounding to bf16/f16: ties, overflow, subnormals."""
    f = [1.0, -1.0, 0.0, -0.0, 0.5, 3.0, 65504.0, 65519.0, 65520.0, 70000.0, -1e9,
         2.0 ** -14, 2.0 ** -24, 2.0 ** -25, 1.5 * 2.0 ** -25, 2.0 ** -26, 1e-8, 6e-5,
         float("inf"), float("-inf"), float("nan"), 3.4e38, 1e-40]
    t = torch.tensor(f, dtype=torch.float32)
    # bf16 ties: 1 + 2^-8 lies halfway between two bf16 values (round down
    # to even), 1 + 3*2^-8 halfway too (rounds up to even).
    ties = torch.tensor([1 + 2 ** -8, 1 + 3 * 2 ** -8, 1 + 2 ** -11, 1 + 3 * 2 ** -11],
                        dtype=torch.float32)
    return torch.cat([t, ties])


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures/safetensors"
    os.makedirs(out, exist_ok=True)
    g = torch.Generator().manual_seed(1234)
    src16 = torch.cat([edge_values(), torch.randn(37, generator=g) * 3]).reshape(4, 16)
    tensors = {
        "model.f32": torch.cat([edge_values(), torch.randn(13, generator=g)]).reshape(2, 4, 5),
        "model.bf16": src16.to(torch.bfloat16),
        "model.f16": src16.to(torch.float16),
        "model.i64": torch.tensor([0, 1, -1, 2 ** 40, -(2 ** 40), 2 ** 62, 7, 42],
                                  dtype=torch.int64).reshape(2, 4),
        "model.scalar": torch.tensor(2.5, dtype=torch.float32),
        "model.empty": torch.zeros(0, 3, dtype=torch.bfloat16),
    }
    meta = {"format": "pt", "producer": "make_safetensors_fixture.py"}
    save_file(tensors, os.path.join(out, "official.safetensors"), metadata=meta)

    expected = {"metadata": meta, "tensors": {}}
    for name, t in tensors.items():
        e = {"dtype": str(t.dtype).replace("torch.", ""), "shape": list(t.shape)}
        if t.dtype == torch.int64:
            e["values"] = t.flatten().tolist()
        else:
            e["f32_bits"] = bits(t)
        if t.dtype in (torch.bfloat16, torch.float16) and name != "model.empty":
            e["src_f32_bits"] = bits(src16)
        expected["tensors"][name] = e
    with open(os.path.join(out, "official.json"), "w") as fp:
        json.dump(expected, fp, indent=1)
        fp.write("\n")


if __name__ == "__main__":
    main()
