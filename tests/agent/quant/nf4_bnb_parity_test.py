#!/usr/bin/env python3
"""NF4 of memplan (agent/quant/nf4.h) against bitsandbytes on the CPU.

Writes weights of several shapes and dtypes (odd sizes, partial blocks, several double-quant
blocks, a zero block, blocksizes 64 and 128), runs memplan-nf4-dump on them and compares with
bitsandbytes.functional.quantize_4bit(quant_type="nf4", compress_statistics=True) and
dequantize_4bit: the packed bytes, the absmax codes, scales and offset, the dynamic map, and the
dequantized values in fp32 and bf16 must be identical (bit for bit). Where bitsandbytes' CPU
dequantization kernel mis-indexes the absmax (rows that are not a whole number of blocks) the
reference is that kernel on the flattened tensor.

  nf4_bnb_parity_test.py --tool PATH
"""

import argparse
import os
import subprocess
import sys
import tempfile

import torch
import bitsandbytes.functional as F
from safetensors.torch import load_file, save_file


def weights():
    g = torch.Generator().manual_seed(7)
    w = {}
    w["gauss_fp32"] = torch.randn(256, 1024, generator=g)
    w["gauss_bf16"] = (torch.randn(512, 640, generator=g) * 0.02).to(torch.bfloat16)
    w["gauss_fp16"] = (torch.randn(96, 320, generator=g) * 3).to(torch.float16)
    w["odd_tail"] = torch.randn(37, 301, generator=g)  # 11137 elements: partial block, odd count
    w["tiny"] = torch.randn(7, 9, generator=g)
    rows = torch.linspace(0.001, 10.0, 300).unsqueeze(1)
    w["scaled_rows_bf16"] = (torch.randn(300, 2048, generator=g) * rows).to(torch.bfloat16)
    z = torch.randn(64, 256, generator=g)
    z[3].zero_()
    w["zero_block"] = z
    w["big"] = torch.randn(4200, 1100, generator=g).to(torch.bfloat16)  # > 4M: several passes
    return w


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tool", required=True)
    args = ap.parse_args()
    failed = passed = 0
    with tempfile.TemporaryDirectory(prefix="nf4_parity_") as work:
        src = {k: v.contiguous() for k, v in weights().items()}
        inp = os.path.join(work, "in.safetensors")
        save_file(src, inp)
        for bs in (64, 128):
            out = os.path.join(work, f"out{bs}.safetensors")
            subprocess.run([args.tool, inp, out, str(bs)], check=True)
            got = load_file(out)
            checks = []
            for name, w in src.items():
                q, st = F.quantize_4bit(w, blocksize=bs, compress_statistics=True, quant_type="nf4")
                checks.append((f"{name}/{bs} data", got[f"{name}.data"], q.view(-1)))
                checks.append((f"{name}/{bs} absmax_code", got[f"{name}.absmax_code"], st.absmax))
                checks.append((f"{name}/{bs} absmax_scale", got[f"{name}.absmax_scale"],
                               st.state2.absmax))
                checks.append((f"{name}/{bs} absmax_offset", got[f"{name}.absmax_offset"],
                               st.offset.reshape(1).float()))
                checks.append((f"{name}/{bs} dynamic_map", got["dynamic_map"], st.state2.code))
                # bitsandbytes' CPU kernel indexes the absmax per row when the last dimension is
                # even, which is wrong when rows are not a whole number of blocks (e.g. 320
                # columns, blocksize 128: every element after the first row is scaled by the
                # wrong absmax). There the reference is the same kernel on the flattened tensor,
                # one row, where the block index is the definition's.
                flat = w.shape[-1] % 2 == 0 and w.shape[-1] % bs != 0
                if flat:
                    st.shape = torch.Size([w.numel()])
                for dtype, key in ((torch.float32, "deq_fp32"), (torch.bfloat16, "deq_bf16")):
                    st.dtype = dtype
                    want = F.dequantize_4bit(q, st).reshape(w.shape)
                    checks.append((f"{name}/{bs} {key}", got[f"{name}.{key}"], want))
            for label, a, b in checks:
                same = a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
                if same:
                    passed += 1
                    continue
                failed += 1
                detail = f"dtype {a.dtype} vs {b.dtype}, shape {tuple(a.shape)} vs {tuple(b.shape)}"
                if a.shape == b.shape and a.dtype == b.dtype:
                    diff = (a != b)
                    detail = f"{int(diff.sum())} of {a.numel()} differ"
                    if a.is_floating_point():
                        detail += f", max |diff| {float((a.float() - b.float()).abs().max()):.3g}"
                print(f"FAIL {label}: {detail}")
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
