#!/usr/bin/env python3
"""PyTorch's scaled_dot_product_attention on the bf16 shapes of attn_bench.cu,
for a side-by-side comparison in the same GPU session.

    python3 bench/attn_sdpa.py            # after build/attn_bench, on the same GPU

Causal, bf16, q (B, NH, T, HD) and k, v (B, NKV, T, HD) drawn N(0, 1). The
flash backend is asked for (torch.nn.attention.sdpa_kernel); grouped kv heads
go in as they are (enable_gqa) when the backend takes them, else expanded to
NH heads before timing (noted in the row). Times: the median of 20 runs after
3 warm-ups, CUDA events; backward = (forward + backward) - forward. TFLOPS
count as attn_bench.cu does: forward 4 * B * NH * (T^2 / 2) * HD, backward 2.5x.
"""
import statistics
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

SHAPES = [  # B, T, NH, NKV, HD: attn_bench.cu's bf16 rows without packed documents
    (8, 2048, 32, 8, 128), (8, 2048, 32, 32, 128), (8, 2048, 32, 8, 64),
    (4, 4096, 32, 8, 128), (16, 1024, 32, 8, 128), (2, 8192, 32, 8, 128),
    (8, 2048, 32, 8, 96), (8, 2048, 32, 8, 80),
]
WARM, REPS = 3, 20


def timed(fn):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for i in range(WARM + REPS):
        start.record()
        fn()
        end.record()
        end.synchronize()
        if i >= WARM:
            times.append(start.elapsed_time(end))
    return statistics.median(times)


def run(B, T, NH, NKV, HD):
    dev = torch.device("cuda")
    q = torch.randn(B, NH, T, HD, device=dev, dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(B, NKV, T, HD, device=dev, dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(B, NKV, T, HD, device=dev, dtype=torch.bfloat16, requires_grad=True)
    dout = torch.randn(B, NH, T, HD, device=dev, dtype=torch.bfloat16)
    note = "gqa"
    kk, vv = k, v
    kwargs = {"is_causal": True}
    if NKV != NH:
        kwargs["enable_gqa"] = True
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        try:
            F.scaled_dot_product_attention(q, kk, vv, **kwargs)
        except RuntimeError:
            kwargs.pop("enable_gqa")
            kk = k.detach().repeat_interleave(NH // NKV, dim=1).requires_grad_()
            vv = v.detach().repeat_interleave(NH // NKV, dim=1).requires_grad_()
            note = "kv expanded"
        fwd = timed(lambda: F.scaled_dot_product_attention(q, kk, vv, **kwargs))

        def both():
            out = F.scaled_dot_product_attention(q, kk, vv, **kwargs)
            out.backward(dout)

        total = timed(both)
    flops = 4.0 * B * NH * (T * T / 2) * HD
    bwd = total - fwd
    print(f"bf16 {T:6d} {B:2d} {B * T:6d} {NH:3d}/{NKV:<3d} {HD:4d} | {fwd:8.3f} "
          f"{flops / fwd * 1e-9:7.1f} | {bwd:8.3f} {2.5 * flops / bwd * 1e-9:7.1f}  "
          f"({note if NKV != NH else 'mha'})")
    sys.stdout.flush()


def main():
    if not torch.cuda.is_available():
        sys.exit("attn_sdpa: no CUDA device")
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}, "
          "scaled_dot_product_attention, flash backend")
    print("mode      T  B    B*T NH/NKV   HD |   fwd ms  TFLOPS |   bwd ms  TFLOPS")
    for shape in SHAPES:
        run(*shape)


if __name__ == "__main__":
    main()
