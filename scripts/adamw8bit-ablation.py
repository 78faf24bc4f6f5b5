#!/usr/bin/env python3
"""Where does 8-bit AdamW's loss gap come from? Trains one model on real text under several
optimizer set-ups with transformers + bitsandbytes and prints each loss curve against fp32 AdamW's.

    adamw8bit-ablation.py --data text.tok [--preset qwen2.5-0.5b] [--steps 200] [--batch 8]
                          [--seq 512] [--lr 3e-4] [--variants fp32,8bit-bf16,...] [--out DIR]

The data is a memplan token file (scripts/make-text-tokens.py). Every variant starts from the same
bf16-representable initial weights and sees the same windows in the same order; clip 1.0, weight
decay 0.01, betas (0.9, 0.999), eps 1e-8, constant lr. Variants:

  fp32           fp32 parameters (master), bf16 autocast, torch AdamW (fp32 moments)
  8bit-bf16      bf16 parameters, bitsandbytes AdamW8bit(min_8bit_size=0): memplan's adamw8bit
  8bit-master    fp32 parameters, bf16 autocast, AdamW8bit(min_8bit_size=0): 8-bit moments alone
  8bit-bf16-hf   bf16 parameters, AdamW8bit with its defaults (tensors < 4096 elements in 32-bit)
                 and 32-bit state for embeddings, as the HF Trainer sets it up
  8bit-bf16-sr   bf16 parameters, AdamW8bit(min_8bit_size=0), the fp32 result rounded to bf16
                 stochastically instead of to nearest
  32bit-bf16     bf16 parameters, fp32 moments (torch AdamW), rounded to nearest
  32bit-bf16-sr  bf16 parameters, fp32 moments, rounded stochastically

The bf16-parameter variants other than 8bit-bf16 and 8bit-bf16-hf run the optimizer on an fp32
copy that is reset from the bf16 parameters before every step (so no precision is carried between
steps), then round the result back into the parameters.
"""
import argparse
import json
import os
import struct
import sys
import time

import numpy as np
import torch
import transformers

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from importlib import import_module

PRESETS = import_module("hf-train-baseline").PRESETS

VARIANTS = ["fp32", "8bit-bf16", "8bit-master", "32bit-bf16", "8bit-bf16-sr", "8bit-bf16-hf",
            "32bit-bf16-sr"]


def read_tokens(path):
    with open(path, "rb") as f:
        head = f.read(32)
        if head[:8] != b"MPTOKENS":
            sys.exit(f"{path}: not a memplan token file")
        _, width, count, vocab = struct.unpack("<IIQQ", head[8:])
        dtype = {2: np.uint16, 4: np.uint32}[width]
        return np.frombuffer(f.read(count * width), dtype=dtype).astype(np.int64), vocab


def round_stochastic_(dst_bf16, src_fp32, gen):
    """dst = src rounded to bf16 up or down with probability by distance (bf16 truncates fp32)."""
    bits = src_fp32.view(torch.int32)
    noise = torch.randint(0, 1 << 16, src_fp32.shape, device=src_fp32.device, dtype=torch.int32,
                          generator=gen)
    rounded = (bits + noise) & -65536
    dst_bf16.copy_(rounded.view(torch.float32))


def run(variant, args, config, init_state, tokens, windows):
    import bitsandbytes as bnb
    torch.manual_seed(0)
    master = variant in ("fp32", "8bit-master")
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(init_state)
    model.to("cuda", dtype=torch.float32 if master else torch.bfloat16)
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    hyper = dict(lr=args.lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
    shadow = None
    if variant == "fp32":
        opt = torch.optim.AdamW(params, fused=True, **hyper)
    elif variant in ("8bit-bf16", "8bit-master"):
        opt = bnb.optim.AdamW8bit(params, min_8bit_size=0, **hyper)
    elif variant == "8bit-bf16-hf":
        manager = bnb.optim.GlobalOptimManager.get_instance()
        for module in model.modules():
            if isinstance(module, torch.nn.Embedding):
                manager.register_module_override(module, "weight", {"optim_bits": 32})
        opt = bnb.optim.AdamW8bit(params, **hyper)
    else:
        shadow = [torch.nn.Parameter(p.detach().float()) for p in params]
        opt = (bnb.optim.AdamW8bit(shadow, min_8bit_size=0, **hyper)
               if variant.startswith("8bit") else torch.optim.AdamW(shadow, fused=True, **hyper))
    gen = torch.Generator(device="cuda").manual_seed(1234)
    losses = []
    t0 = time.time()
    for step, starts in enumerate(windows, 1):
        batch = torch.from_numpy(np.stack([tokens[s:s + args.seq] for s in starts])).cuda()
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=master):
            loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        if shadow is None:
            opt.step()
        else:
            with torch.no_grad():
                for p, s in zip(params, shadow):
                    s.copy_(p)
                    s.grad = p.grad.float()
            opt.step()
            with torch.no_grad():
                for p, s in zip(params, shadow):
                    if variant.endswith("-sr"):
                        round_stochastic_(p, s.detach(), gen)
                    else:
                        p.copy_(s)
        opt.zero_grad(set_to_none=True)
        for p in params:
            p.grad = None
        losses.append(loss.item())
        if step % 50 == 0 or step == len(windows):
            print(f"  {variant} step {step}: loss {losses[-1]:.5f} ({time.time() - t0:.1f} s)",
                  flush=True)
    del model, opt, shadow
    torch.cuda.empty_cache()
    return losses


def compare(losses, ref):
    a, r = np.array(losses), np.array(ref)
    rel = a / r - 1
    windows = {}
    for lo, hi in ((1, 50), (51, 100), (101, 150), (151, 200), (191, 200)):
        if hi <= len(a):
            windows[f"{lo}-{hi}"] = float(a[lo - 1:hi].mean() / r[lo - 1:hi].mean() - 1)
    return dict(final=float(rel[-1]), max_step=float(np.abs(rel).max()),
                steps_over_1pct=int((np.abs(rel) > 0.01).sum()), windows=windows)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", required=True)
    p.add_argument("--preset", default="qwen2.5-0.5b", choices=sorted(PRESETS))
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--out", help="directory for curves.json")
    args = p.parse_args()
    variants = args.variants.split(",")
    bad = [v for v in variants if v not in VARIANTS]
    if bad:
        sys.exit(f"--variants: unknown {bad}; allowed: {VARIANTS}")
    if not torch.cuda.is_available():
        sys.exit("needs a CUDA GPU (bitsandbytes' 8-bit optimizers)")
    tokens, vocab = read_tokens(args.data)
    cfg = dict(PRESETS[args.preset])
    config = transformers.AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    init = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    init_state = {k: v.to(torch.bfloat16).float() for k, v in init.state_dict().items()}
    del init
    rng = np.random.default_rng(0)
    windows = [rng.integers(0, len(tokens) - args.seq - 1, args.batch) for _ in range(args.steps)]
    print(f"{args.preset}: {len(tokens)} tokens (vocab {vocab}), {args.steps} steps of "
          f"{args.batch}x{args.seq}, lr {args.lr}")
    curves = {}
    for v in variants:  # each result printed and saved as it comes (long runs may be cut)
        curves[v] = run(v, args, config, init_state, tokens, windows)
        if "fp32" in curves and v != "fp32":
            print("vs fp32:", v, json.dumps(compare(curves[v], curves["fp32"])), flush=True)
        if args.out:
            os.makedirs(args.out, exist_ok=True)
            with open(os.path.join(args.out, "curves.json"), "w") as f:
                json.dump(curves, f)


if __name__ == "__main__":
    main()
