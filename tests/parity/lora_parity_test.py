#!/usr/bin/env python3
"""LoRA parity of memplan-agent with peft + transformers, in fp32 on the CPU.

For tiny random checkpoints (written as hf_parity_test.py writes them) and several target sets,
peft wraps the transformers model (LoraConfig r=4, lora_alpha=8, the given dropout), its adapters
are randomised (B non-zero, so A gets a gradient) and saved with save_pretrained. memplan-hf-parity
loads that adapter (--load-adapter: memplan reads peft's format), runs one step of the same tokens
under a residency plan (plain, grouped block modes, offloaded and persistent base and adapter
chunks, two micro-batches) with the same torch.manual_seed before the step (so LoRA dropout draws
the same masks), and writes the adapter it trained (--save-adapter) and the merged model
(--merge-export). Compared, each as max |memplan - peft| / max |peft| <= 1e-5:
  * logits before the step (eval: no dropout), the loss, every adapter gradient, every adapter
    after one torch.optim.AdamW step over peft's trainable parameters;
  * the adapter memplan saved, loaded by peft's PeftModel.from_pretrained: same logits as peft's
    model holding memplan's post-step adapter values;
  * memplan's merged export: equal to peft's merge_and_unload() of that model, tensor by tensor,
    and transformers loads it.
Adapters that memplan must refuse (rsLoRA, DoRA, a bias) are checked for the error naming the field.

QLoRA cases (--qlora 1): memplan loads the same fp32 checkpoint and quantizes every projection
weight to NF4 itself; the reference is peft on the transformers model whose projection weights are
bitsandbytes' NF4 round trip of the checkpoint's (quantize_4bit(quant_type="nf4", blocksize=64,
compress_statistics=True) then dequantize_4bit, on the flattened weight as bitsandbytes' Linear4bit
stores it), so the same comparisons hold at the same tolerance: memplan's NF4 must be bitsandbytes'
to within fp32 rounding, and its QLoRA step PEFT's LoRA step on that base.

  lora_parity_test.py --tool PATH [--work DIR] [--only NAME]
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

import bitsandbytes.functional as bnbf
import peft
import torch
import transformers
from safetensors.torch import load_file, save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_parity_test as hf  # noqa: E402  (the checkpoints, tokens, tolerances and tally)

RANK, ALPHA = 4, 8
ALL = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]

# (checkpoint of hf_parity_test.CHECKPOINTS, targets, dropout, NF4 base)
CASES = {
    "qv": ("llama-untied-theta5e5", ["q_proj", "v_proj"], 0.0, False),
    "all-dropout": ("llama-untied-theta5e5", ALL, 0.1, False),
    "mlp-tied-bias": ("qwen2-tied-bias", ["gate_proj", "up_proj", "down_proj", "o_proj"], 0.05,
                      False),
    "qlora-all-dropout": ("llama-untied-theta5e5", ALL, 0.1, True),
    "qlora-qv-tied-bias": ("qwen2-tied-bias", ["q_proj", "v_proj"], 0.0, True),
    # Gemma 2 (soft caps, sliding layers, four norms, GeGLU): the same PEFT names.
    "gemma2-all-dropout": ("gemma2-softcap-window", ALL, 0.1, False),
    # Gemma 3 (q/k norms, a RoPE per layer type, linear scaling on the full layers).
    "gemma3-all-dropout": ("gemma3-layer-types-linear", ALL, 0.1, False),
}
# Seeds of cases added later, apart from the others' (their position in the sorted list).
FIXED_SEEDS = {"gemma2-all-dropout": 11, "gemma3-all-dropout": 12}
# QLoRA runs these plans only (the others exercise nothing the NF4 base changes).
QLORA_PLANS = ("plain", "grouped-ckpt", "managed-base-offloaded",
               "managed-base-persistent-adapters-offloaded")
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")

PLANS = [
    ("plain", ["--plain"]),
    ("grouped-none", []),
    ("grouped-ckpt", ["--block-modes", "ckpt,ckpt,ckpt,ckpt"]),
    ("grouped-swap", ["--block-modes", "swap,swap,swap,swap"]),
    ("grouped-hs-offload", ["--block-modes", "hs_offload,hs_offload,hs_offload,hs_offload"]),
    ("managed-base-offloaded", ["--chunk-kib", "96", "--n-persist", "0", "--n-buffer", "2",
                                "--block-modes", "ckpt,swap,hs_offload,none"]),
    ("managed-base-persistent-adapters-offloaded",
     ["--chunk-kib", "96", "--n-persist", "2", "--adapter-n-persist", "0",
      "--block-modes", "none,ckpt,none,hs_offload"]),
    ("managed-grad-accum-2", ["--chunk-kib", "64", "--n-persist", "1", "--adapter-n-persist", "1",
                              "--grad-accum", "2"]),
]
SEED = 1234


def peft_key(name):
    """peft's parameter name -> memplan's adapter name."""
    return name.removeprefix("base_model.model.").replace(".default.weight", ".weight")


def nf4_round_trip(w):
    """bitsandbytes' NF4 (double quantization, blocks of 64) of w, dequantized."""
    q, state = bnbf.quantize_4bit(w.detach().reshape(-1).contiguous(), blocksize=64,
                                  compress_statistics=True, quant_type="nf4")
    return bnbf.dequantize_4bit(q, state).reshape(w.shape).to(w.dtype)


def load_base(ckpt, qlora):
    """The transformers model; with qlora its projection weights NF4 round-tripped."""
    model = hf.load_hf(ckpt)
    if qlora:
        with torch.no_grad():
            for name, module in model.named_modules():
                if name.split(".")[-1] in PROJECTIONS and ".layers." in f".{name}":
                    module.weight.copy_(nf4_round_trip(module.weight))
    return model


def peft_model(ckpt, targets, dropout, adapter_dir=None, qlora=False):
    base = load_base(ckpt, qlora)
    if adapter_dir is not None:
        return peft.PeftModel.from_pretrained(base, adapter_dir, is_trainable=True).train()
    config = peft.LoraConfig(r=RANK, lora_alpha=ALPHA, lora_dropout=dropout,
                             target_modules=targets, task_type="CAUSAL_LM")
    return peft.get_peft_model(base, config).train()


def write_initial_adapter(ckpt, targets, dropout, directory, seed):
    model = peft_model(ckpt, targets, dropout)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(0.05 * torch.randn(p.shape, generator=g))
    model.save_pretrained(directory)


def peft_reference(ckpt, adapter_dir, ids, targets, grad_accum, dropout, qlora):
    model = peft_model(ckpt, None, dropout, adapter_dir, qlora)
    with torch.no_grad():
        model.eval()
        logits = model(input_ids=ids).logits.float().clone()
        model.train()
    params = {peft_key(n): p for n, p in model.named_parameters() if p.requires_grad}
    rows = ids.shape[0] // grad_accum
    loss_sum = 0.0
    torch.manual_seed(SEED)
    for i in range(grad_accum):
        sl = slice(i * rows, (i + 1) * rows)
        out = model(input_ids=ids[sl], labels=targets[sl], shift_labels=targets[sl])
        (out.loss / grad_accum).backward()
        loss_sum += out.loss.item()
    grads = {n: p.grad.detach().clone() for n, p in params.items()}
    opt = torch.optim.AdamW(list(params.values()), lr=hf.LR, betas=hf.BETAS, eps=hf.EPS,
                            weight_decay=hf.WD)
    opt.step()
    after = {n: p.detach().clone() for n, p in params.items()}
    return logits, loss_sum / grad_accum, grads, after


def check_saved_adapter(tally, label, ckpt, saved_adapter, merged_dir, post, ids, qlora):
    """peft loads memplan's adapter; memplan's merged export equals peft's merge_and_unload."""
    with torch.no_grad():
        loaded = peft.PeftModel.from_pretrained(load_base(ckpt, qlora), saved_adapter).eval()
        got = loaded(input_ids=ids).logits
        ref = peft_model(ckpt, None, 0.0, saved_adapter, qlora).eval()
        for n, p in ref.named_parameters():
            if p.requires_grad:
                p.copy_(post["param." + peft_key(n)])
        want = ref(input_ids=ids).logits
    err = hf.rel_err(got, want)
    tally.check(f"{label} peft loads the saved adapter", err <= hf.REL_TOL,
                f"logits rel err {err:.2e}")
    with open(os.path.join(saved_adapter, "adapter_config.json")) as f:
        cfg = json.load(f)
    tally.check(f"{label} adapter_config.json", cfg["peft_type"] == "LORA" and cfg["r"] == RANK
                and cfg["lora_alpha"] == ALPHA and cfg["task_type"] == "CAUSAL_LM"
                and cfg["bias"] == "none", json.dumps({k: cfg.get(k) for k in (
                    "peft_type", "r", "lora_alpha", "lora_dropout", "target_modules")}))
    merged_ref = ref.merge_and_unload().state_dict()
    merged = load_file(os.path.join(merged_dir, "model.safetensors"))
    worst, worst_name = 0.0, ""
    missing = [n for n in merged_ref if n not in merged and n != "lm_head.weight"]
    for n, want_t in merged_ref.items():
        if n in merged:
            e = hf.rel_err(merged[n], want_t)
            if e > worst:
                worst, worst_name = e, n
    tally.check(f"{label} merged export equals merge_and_unload", not missing and worst <= 1e-6,
                f"worst {worst_name}: rel err {worst:.2e}" + (f", missing {missing}" if missing else ""))
    with torch.no_grad():
        got = hf.load_hf(merged_dir).eval()(input_ids=ids).logits
    err = hf.rel_err(got, want)
    tally.check(f"{label} merged export loads in transformers", err <= hf.REL_TOL,
                f"logits rel err {err:.2e}")


def run_case(tally, tool, work, case, seed):
    name, targets, dropout, qlora = CASES[case]
    ckpt = os.path.join(work, name)
    if not os.path.isdir(ckpt):
        family, overrides, edit = hf.CHECKPOINTS[name]
        hf.write_checkpoint(ckpt, family, overrides, edit, seed)
    adapter = os.path.join(work, f"{case}.initial-adapter")
    write_initial_adapter(ckpt, targets, dropout, adapter, 50 + seed)
    lora = ["--lora-rank", str(RANK), "--lora-alpha", str(ALPHA), "--lora-dropout", str(dropout),
            "--lora-targets", ",".join(targets), "--load-adapter", adapter, "--seed", str(SEED)]
    if qlora:
        lora += ["--qlora", "1"]
    hyper = ["--lr", str(hf.LR), "--beta1", str(hf.BETAS[0]), "--beta2", str(hf.BETAS[1]),
             "--eps", str(hf.EPS), "--weight-decay", str(hf.WD)]
    refs = {}
    for plan, plan_args in PLANS:
        if qlora and plan not in QLORA_PLANS:
            continue
        grad_accum = hf.plan_value(plan_args, "--grad-accum", 1, int)
        rows = hf.ROWS * grad_accum
        ids, tgt = hf.tokens(200 + seed, rows)
        tok_path = os.path.join(work, f"{case}.tokens{rows}.safetensors")
        save_file({"input_ids": ids, "targets": tgt}, tok_path)
        if grad_accum not in refs:
            refs[grad_accum] = peft_reference(ckpt, adapter, ids, tgt, grad_accum, dropout, qlora)
        ref = refs[grad_accum]
        tag = f"{case}.{plan}"
        out = os.path.join(work, f"{tag}.out.safetensors")
        saved = os.path.join(work, f"{tag}.adapter")
        merged = os.path.join(work, f"{tag}.merged")
        rc, log = hf.run_tool(tool, ["--model", ckpt, "--tokens", tok_path, "--out", out,
                                     "--save-adapter", saved, "--merge-export", merged]
                              + hyper + lora + plan_args)
        label = f"{'qlora' if qlora else 'lora'} {case} [{plan}]"
        tally.check(f"{label} runs", rc == 0, log.strip().splitlines()[-1] if log.strip() else "")
        if rc != 0:
            continue
        hf.compare_run(tally, label, out, ref, hf.fp32_judge)
        if plan in ("plain", "managed-base-offloaded"):
            check_saved_adapter(tally, label, ckpt, saved, merged, load_file(out), ids, qlora)


def check_refused(tally, tool, work):
    ckpt = os.path.join(work, "llama-untied-theta5e5")
    ids, tgt = hf.tokens(7, hf.ROWS)
    tok_path = os.path.join(work, "refused.tokens.safetensors")
    save_file({"input_ids": ids, "targets": tgt}, tok_path)
    for field, extra in (("use_rslora", dict(use_rslora=True)), ("use_dora", dict(use_dora=True)),
                         ("bias", dict(bias="all"))):
        base = hf.load_hf(ckpt)
        model = peft.get_peft_model(base, peft.LoraConfig(
            r=RANK, lora_alpha=ALPHA, target_modules=["q_proj"], task_type="CAUSAL_LM", **extra))
        directory = os.path.join(work, f"refused-{field}")
        model.save_pretrained(directory)
        rc, log = hf.run_tool(tool, ["--model", ckpt, "--tokens", tok_path,
                                     "--out", os.path.join(work, "refused.out"),
                                     "--lora-rank", str(RANK), "--lora-alpha", str(ALPHA),
                                     "--lora-targets", "q_proj", "--load-adapter", directory])
        tally.check(f"lora refuses {field}", rc != 0 and field in log,
                    log.strip().splitlines()[-1] if log.strip() else f"exit {rc}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tool", required=True, help="memplan-hf-parity binary")
    parser.add_argument("--work", help="scratch directory (default: a temporary one)")
    parser.add_argument("--only", help="run only cases whose name contains this")
    args = parser.parse_args()
    torch.set_num_threads(2)
    work = args.work or tempfile.mkdtemp(prefix="memplan-lora-parity-")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    print(f"peft {peft.__version__}, transformers {transformers.__version__}, "
          f"torch {torch.__version__}, work dir {work}")
    tally = hf.Tally()
    seeds = dict(enumerate(sorted(c for c in CASES if c not in FIXED_SEEDS), start=1))
    seeds = dict({case: seed for seed, case in seeds.items()}, **FIXED_SEEDS)
    for case, seed in sorted(seeds.items(), key=lambda cs: cs[1]):
        if args.only and args.only not in case:
            continue
        run_case(tally, args.tool, work, case, seed)
    if not args.only or "refuse" in args.only:
        ckpt = os.path.join(work, "llama-untied-theta5e5")
        if not os.path.isdir(ckpt):
            family, overrides, edit = hf.CHECKPOINTS["llama-untied-theta5e5"]
            hf.write_checkpoint(ckpt, family, overrides, edit, 1)
        check_refused(tally, args.tool, work)
    print(f"{tally.passed} passed, {len(tally.failed)} failed")
    if tally.failed:
        print("failed: " + ", ".join(tally.failed))
    return 1 if tally.failed else 0


if __name__ == "__main__":
    sys.exit(main())
