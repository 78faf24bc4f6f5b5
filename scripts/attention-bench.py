#!/usr/bin/env python3
"""Causal SDPA (bf16) achieved flop rate against an 8192^3 bf16 matmul, by head_dim and length.

Counts 2*heads*head_dim*s^2*batch flops forward and 2.5x that backward, as the analytic trace
(planner/cost/analytic_trace.cc) does; about 16 K tokens per call. Needs a CUDA GPU.
  python3 scripts/attention-bench.py
"""
import sys
import time

import torch
import torch.nn.functional as F

if not torch.cuda.is_available():
    sys.exit("attention-bench: no CUDA GPU here (it times the GPU's attention kernels)")
dev = "cuda"
def timeit(fn, n=5):
    fn(); torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n): fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / n
a = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16); b = torch.randn_like(a)
mm = 2 * 8192**3 / timeit(lambda: a @ b, 20)
print(f"matmul 8192^3 bf16: {mm/1e12:.1f} TFLOP/s", flush=True)
del a, b
for hd, hq, hkv in ((64, 14, 2), (128, 16, 8), (128, 32, 8), (128, 40, 8)):
    for seq in (1024, 2048, 4096, 8192, 16384, 32768, 65536):
        bsz = max(1, 16384 // seq)
        q = torch.randn(bsz, hq, seq, hd, device=dev, dtype=torch.bfloat16, requires_grad=True)
        k = torch.randn(bsz, hkv, seq, hd, device=dev, dtype=torch.bfloat16, requires_grad=True)
        v = torch.randn_like(k, requires_grad=True)
        def fwd():
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        o = fwd(); g = torch.randn_like(o)
        tf = timeit(lambda: fwd())
        def fb():
            out = fwd(); out.backward(g)
        tfb = timeit(fb)
        flops = 2.0 * hq * hd * seq * seq * bsz  # causal: half of 4*hq*hd*s^2
        print(f"hd {hd} heads {hq}/{hkv} seq {seq} batch {bsz}: fwd {tf*1e3:.2f} ms "
              f"{flops/tf/1e12:.0f} TF/s ({flops/tf/mm:.3f} of matmul); bwd {(tfb-tf)*1e3:.2f} ms "
              f"{2.5*flops/(tfb-tf)/1e12:.0f} TF/s ({2.5*flops/(tfb-tf)/mm:.3f})", flush=True)
        del q, k, v, o, g
        torch.cuda.empty_cache()
