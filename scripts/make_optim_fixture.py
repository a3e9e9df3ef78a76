#!/usr/bin/env python3
"""Reference values for the CPU optimizer tests (tests/cpu/test_optim.c),
produced with torch.optim.AdamW, torch.nn.utils.clip_grad_norm_, LambdaLR
and transformers' schedules.

usage: python3 scripts/make_optim_fixture.py tests/fixtures/optim

Writes two files:
  adamw.bin   raw little-endian float32 arrays, back to back.
  adamw.json  the index and the scalars:
    tensors: [{numel, weight_decay}]   parameters, in the order they are
             concatenated in every array below
    hparams: {lr, beta1, beta2, eps, max_norm, warmup_steps, total_steps,
              schedule}
    arrays:  {name: {offset, count}}   offset and count in float32 elements;
             "p0" the initial parameters, and for step s = 1..steps: "g/s"
             the raw gradients (before clipping), "p/s" "m/s" "v/s" params,
             exp_avg, exp_avg_sq after the step
    steps:   [{lr, norm, coef}]  lr used by step s (Python double), the total
             norm returned by clip_grad_norm_ and the clamped coefficient it
             multiplied the gradients by (float32 values, exact in JSON)
    schedules: [{kind, warmup, total, min_lr_ratio, lambdas: [lambda(k) for
             k = 0..total+2]}] from transformers' lambdas
    bf16: {f32_bits: [...], bf16_bits: [...]}  torch's float32 -> bfloat16
             conversion of special values
Doubles are written with repr(), which round-trips exactly.
"""
import json
import math
import os
import struct
import sys

import torch
from transformers import optimization as hfopt

SIZES = [1, 7, 1000, 1537]  # odd sizes: vector tails and a single element
DECAY = [0.0, 0.1, 0.0, 0.1]  # 0: a norm/bias group
GRAD_SCALES = [1.0, 0.05, 3.0, 0.1]  # with max_norm 10: clip, no, clip, no
HP = dict(lr=1e-2, beta1=0.9, beta2=0.95, eps=1e-8, max_norm=10.0,
          warmup_steps=2, total_steps=6, schedule="cosine")


def main(out_dir):
    torch.manual_seed(1234)
    params = [torch.nn.Parameter(torch.randn(n) * 0.5) for n in SIZES]
    groups = [
        {"params": [p for p, wd in zip(params, DECAY) if wd != 0], "weight_decay": 0.1},
        {"params": [p for p, wd in zip(params, DECAY) if wd == 0], "weight_decay": 0.0},
    ]
    opt = torch.optim.AdamW(groups, lr=HP["lr"], betas=(HP["beta1"], HP["beta2"]),
                            eps=HP["eps"])
    sched = hfopt.get_cosine_schedule_with_warmup(opt, HP["warmup_steps"], HP["total_steps"])

    blob = bytearray()
    arrays = {}

    def put(name, tensors):
        flat = torch.cat([t.detach().reshape(-1) for t in tensors]).to(torch.float32)
        arrays[name] = {"offset": len(blob) // 4, "count": flat.numel()}
        blob.extend(flat.numpy().astype("<f4").tobytes())

    put("p0", params)
    steps = []
    for s, scale in enumerate(GRAD_SCALES, start=1):
        grads = [torch.randn(n) * scale for n in SIZES]
        put(f"g/{s}", grads)
        for p, g in zip(params, grads):
            p.grad = g.clone()
        lr = opt.param_groups[0]["lr"]
        norm = torch.nn.utils.clip_grad_norm_(params, HP["max_norm"])
        coef = torch.clamp(HP["max_norm"] / (norm + 1e-6), max=1.0)
        opt.step()
        sched.step()
        put(f"p/{s}", params)
        put(f"m/{s}", [opt.state[p]["exp_avg"] for p in params])
        put(f"v/{s}", [opt.state[p]["exp_avg_sq"] for p in params])
        steps.append({"lr": lr, "norm": norm.item(), "coef": coef.item()})

    schedules = []
    for kind, warmup, total, min_ratio in [("cosine", 3, 10, 0.0), ("cosine", 0, 7, 0.0),
                                           ("cosine", 2, 9, 0.1), ("linear", 3, 10, 0.0),
                                           ("linear", 0, 1, 0.0), ("constant", 4, 10, 0.0)]:
        if kind == "cosine" and min_ratio:
            f = hfopt.get_cosine_with_min_lr_schedule_with_warmup(
                torch.optim.SGD([torch.zeros(1)], lr=1.0), warmup, total,
                min_lr_rate=min_ratio).lr_lambdas[0]
        elif kind == "cosine":
            f = lambda k, w=warmup, t=total: hfopt._get_cosine_schedule_with_warmup_lr_lambda(
                k, num_warmup_steps=w, num_training_steps=t, num_cycles=0.5)
        elif kind == "linear":
            f = lambda k, w=warmup, t=total: hfopt._get_linear_schedule_with_warmup_lr_lambda(
                k, num_warmup_steps=w, num_training_steps=t)
        else:
            f = lambda k, w=warmup: hfopt._get_constant_schedule_with_warmup_lr_lambda(
                k, num_warmup_steps=w)
        schedules.append({"kind": kind, "warmup": warmup, "total": total,
                          "min_lr_ratio": min_ratio,
                          "lambdas": [float(f(k)) for k in range(total + 3)]})

    specials = [0.0, -0.0, 1.0, -1.0, 1.00390625, 1.01171875, 3.0e38, -3.4028235e38,
                1e-40, -1e-45, 1.17549435e-38, float("inf"), float("-inf"), float("nan"),
                0.1, -0.3, 65504.0, 1.0 + 2**-8, 1.0 + 3 * 2**-8, 1.0 + 2**-8 + 2**-20]
    x = torch.tensor(specials, dtype=torch.float32)
    f32_bits = [struct.unpack("<I", struct.pack("<f", v))[0] for v in x.tolist()]
    bf16_bits = [b & 0xFFFF for b in x.to(torch.bfloat16).view(torch.int16).tolist()]

    index = {
        "tensors": [{"numel": n, "weight_decay": wd} for n, wd in zip(SIZES, DECAY)],
        "hparams": HP,
        "arrays": arrays,
        "steps": steps,
        "schedules": schedules,
        "bf16": {"f32_bits": f32_bits, "bf16_bits": bf16_bits},
        "generated_with": {"torch": torch.__version__.split("+")[0]},
    }
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "adamw.bin"), "wb") as f:
        f.write(blob)
    with open(os.path.join(out_dir, "adamw.json"), "w") as f:
        json.dump(index, f, indent=1)
        f.write("\n")
    print(f"wrote {len(blob)} bytes of arrays, steps: {steps}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures/optim")
