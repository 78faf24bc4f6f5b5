#!/usr/bin/env python3
"""memplan's 8-bit AdamW against bitsandbytes' AdamW8bit, on the CPU.

Writes tensors (fp32 and bf16; sizes below, at and above bitsandbytes' min_8bit_size of 4096,
multiples of 256 and not) and STEPS gradients each, runs memplan-adamw8bit-parity
(tests/parity/adamw8bit_parity_main.cc: memplan's CPU kernel, checked there against its LibTorch
path) and bitsandbytes.optim.AdamW8bit (min_8bit_size=0: every tensor 8-bit, as memplan) on the
same data, with clip_grad_norm_'s scaling in some cases, and compares the parameters after STEPS
updates. Two bitsandbytes runs:

* "default": AdamW8bit with the block quantizer of bitsandbytes' default (pure torch) backend,
  whose rule memplan implements (x * (1 / absmax), clamped, bucketed by the maps' midpoints).
  Required: every parameter bit-identical, except that bitsandbytes divides instead of multiplying
  by the reciprocal in a tensor's last partial block, which may move a value across a midpoint:
  at least MIN_EXACT_DEFAULT of the elements bit-identical and max |diff| <= DEFAULT_LR_FRACTION * lr.
* "native": stock AdamW8bit, whose CPU quantizer (libbitsandbytes_cpu) searches approximately
  and codes values below about 1e-5 of a block's absmax as the +-2.1e-5 entries instead of the
  nearest one. Those elements have tiny moments; the others agree. Required: max |diff| <=
  NATIVE_LR_FRACTION * lr * STEPS (an AdamW step moves an element by about lr) and at most
  NATIVE_FP32_FACTOR times fp32 AdamW's distance from the same run.

Gradients are Gaussian with a per-step scale (0.3 to 1), a few zeros, as real gradients are
within a block; heavy-tailed blocks (spanning more than 7 decades of g^2) underflow exp_avg_sq's
map to 0 in both implementations and are not a parity case.

  adamw8bit_parity_test.py --tool PATH [--work DIR]
"""

import argparse
import os
import subprocess
import sys
import tempfile

import torch
from safetensors.torch import load_file, save_file

STEPS = 8
LR, BETAS, EPS, WD = 1e-3, (0.9, 0.95), 1e-8, 0.1
SHAPES = {"w4096": (4096,), "w5000": (5000,), "m64x100": (64, 100), "w70001": (70001,),
          "small300": (300,), "tiny17": (17,)}
MIN_EXACT_DEFAULT = 0.999
DEFAULT_LR_FRACTION = 0.05
NATIVE_LR_FRACTION = 0.5
NATIVE_FP32_FACTOR = 1.0


def grads_for(shape, dtype, gen):
    out = []
    for k in range(STEPS):
        g = torch.randn(shape, generator=gen) * (0.3 + 0.7 * torch.rand(1, generator=gen).item())
        flat = g.view(-1)
        if flat.numel() > 600:
            flat[300:340] = 0
        out.append(g.to(dtype))
    return out


def use_default_quantizer(bnb_cpu_ops):
    """Makes AdamW8bit's CPU update quantize with bitsandbytes' default-backend kernel."""
    op = torch.ops.bitsandbytes.quantize_blockwise.default
    keys = torch._C.DispatchKeySet(torch._C.DispatchKey.CompositeExplicitAutograd)

    def quantize(A_fp32, code, absmax_out, out_uint8, blocksize):
        out, absmax = op.redispatch(keys, A_fp32, code, blocksize)
        out_uint8.copy_(out)
        absmax_out.copy_(absmax)

    bnb_cpu_ops._quant_blockwise_fp32_direct = quantize


def run_case(tool, work, dtype, clip, quantizer):
    import bitsandbytes as bnb  # imported here: its import prints noise on stderr
    import bitsandbytes.backends.cpu.ops as bnb_cpu_ops

    native = bnb_cpu_ops._quant_blockwise_fp32_direct
    if quantizer == "default":
        use_default_quantizer(bnb_cpu_ops)

    gen = torch.Generator().manual_seed(1234)
    init = {n: torch.randn(s, generator=gen).to(dtype) for n, s in SHAPES.items()}
    grads = {n: grads_for(s, dtype, gen) for n, s in SHAPES.items()}
    tensors = {"hparams": torch.tensor([LR, BETAS[0], BETAS[1], EPS, WD, STEPS, clip],
                                       dtype=torch.float64)}
    for n in SHAPES:
        tensors[n] = init[n].contiguous()
        for k, g in enumerate(grads[n], 1):
            tensors[f"{n}.grad{k}"] = g.contiguous()
    src, dst = os.path.join(work, "in.safetensors"), os.path.join(work, "out.safetensors")
    save_file(tensors, src)
    r = subprocess.run([tool, src, dst], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{tool} failed: {r.stderr}")
    ours = load_file(dst)

    params = {n: torch.nn.Parameter(init[n].clone()) for n in SHAPES}
    opt = bnb.optim.AdamW8bit(list(params.values()), lr=LR, betas=BETAS, eps=EPS,
                              weight_decay=WD, min_8bit_size=0)
    masters = {n: torch.nn.Parameter(init[n].float().clone()) for n in SHAPES}
    fp32 = torch.optim.AdamW(list(masters.values()), lr=LR, betas=BETAS, eps=EPS, weight_decay=WD)
    coef = torch.tensor(clip, dtype=torch.float32)
    for k in range(STEPS):
        for n in SHAPES:
            params[n].grad = grads[n][k].clone()
            masters[n].grad = grads[n][k].float().clone()
            if clip != 1.0:  # clip_grad_norm_'s grad.mul_(coef), in the grad's dtype
                params[n].grad.mul_(coef)
                masters[n].grad = (grads[n][k] * coef).float()
        opt.step()
        fp32.step()
    bnb_cpu_ops._quant_blockwise_fp32_direct = native

    failures = 0
    for n in SHAPES:
        got = ours[n].float()
        want = params[n].detach().float()
        ref32 = masters[n].detach().to(dtype).float()
        diff = (got - want).abs().max().item()
        exact = (got == want).float().mean().item()
        fp32_diff = (ref32 - want).abs().max().item()
        state = opt.state[params[n]]
        codes_equal = (ours[f"{n}.exp_avg.q8"].view(-1) == state["state1"].view(-1)).float().mean()
        if quantizer == "default":
            whole_blocks = init[n].numel() % 256 == 0
            ok = (exact == 1.0 if whole_blocks else
                  exact >= MIN_EXACT_DEFAULT and diff <= DEFAULT_LR_FRACTION * LR)
        else:
            ok = diff <= NATIVE_LR_FRACTION * LR * STEPS and diff <= NATIVE_FP32_FACTOR * fp32_diff
        failures += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {quantizer:7s} {str(dtype):14s} clip={clip:<4} {n:9s} "
              f"max|memplan-bnb|={diff:.3e} ({diff / LR:.3f} lr) bit-identical={exact:.4f} "
              f"max|fp32-bnb|={fp32_diff:.3e} exp_avg codes equal={codes_equal:.4f}")
    return failures


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tool", required=True)
    ap.add_argument("--work")
    args = ap.parse_args()
    work = args.work or tempfile.mkdtemp(prefix="adamw8bit_parity_")
    os.makedirs(work, exist_ok=True)
    failures = 0
    cases = [(q, dtype, clip) for q in ("default", "native")
             for dtype, clip in ((torch.float32, 1.0), (torch.bfloat16, 1.0),
                                 (torch.float32, 0.5), (torch.bfloat16, 0.5))]
    for quantizer, dtype, clip in cases:
        failures += run_case(args.tool, work, dtype, clip, quantizer)
    total = len(cases) * len(SHAPES)
    print(f"{total - failures} passed, {failures} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
