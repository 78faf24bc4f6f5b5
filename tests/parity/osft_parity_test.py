#!/usr/bin/env python3
"""OSFT parity of memplan-agent with the PyTorch reference (tests/python/osft_reference.py), fp32 on
the CPU.

For tiny random checkpoints (written as hf_parity_test.py writes them) the reference loads the
model with transformers, splits the targeted projections by SVD at the rank ratio, and takes two
OSFT steps (two micro-batches each; gradients projected off the frozen subspaces; AdamW on the low
factors). memplan-hf-parity runs the same two steps on the same checkpoint and tokens
(--osft-rank-ratio, --osft-targets, --steps 2) under the plain and the grouped (checkpointed
blocks, swapped and hidden-state-offloaded ones) loss. Compared, each as max |memplan - reference| / max |reference| <= 1e-5: both steps'
losses, every low factor's projected gradient of the first step, every low factor after the second
AdamW update. A run memplan must refuse (rank ratio out of (0, 1)) is checked for the error.

  osft_parity_test.py --tool PATH [--work DIR] [--only NAME]
"""

import os
import sys

import torch
import transformers
from safetensors.torch import load_file, save_file

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "python"))
import hf_parity_test as hf  # noqa: E402  (checkpoints, tokens, tolerance, tally)
import osft_common  # noqa: E402  (command line, checkpoints by name, report)
import osft_reference as ref  # noqa: E402

STEPS, GRAD_ACCUM, ROWS = 2, 2, 4

# name: (checkpoint of hf_parity_test.CHECKPOINTS, rank ratio, targets)
CASES = {
    "llama-all-half": ("llama-untied-theta5e5", 0.5, ref.ALL_TARGETS),
    "qwen2-bias-qv-down-quarter": ("qwen2-tied-bias", 0.25, ["q_proj", "v_proj", "down_proj"]),
}
PLANS = {
    "plain": ["--plain"],
    "grouped-ckpt": ["--block-modes", "ckpt,none,ckpt,none"],
    "grouped-swap-hs-offload": ["--block-modes", "swap,hs_offload,ckpt,none"],
}


def reference(ckpt, ids, targets, ratio, targets_list):
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32).train()
    trainable = ref.apply_osft(model, ratio, targets_list)
    rows = ids.shape[0] // GRAD_ACCUM
    batches = [(ids[i * rows:(i + 1) * rows], targets[i * rows:(i + 1) * rows])
               for i in range(GRAD_ACCUM)]
    return ref.train_steps(model, trainable, batches, STEPS, hf.LR, hf.BETAS, hf.EPS, hf.WD)


def run_case(tally, tool, work, name, seed):
    ckpt_name, ratio, targets_list = CASES[name]
    ckpt = os.path.join(work, ckpt_name)
    if not os.path.isdir(ckpt):
        osft_common.write_checkpoint(ckpt, ckpt_name, seed)
    ids, targets = hf.tokens(seed, ROWS)
    tokens_path = os.path.join(work, f"{name}-tokens.safetensors")
    save_file({"input_ids": ids, "targets": targets}, tokens_path)
    losses, grads, params = reference(ckpt, ids, targets, ratio, targets_list)
    for plan, plan_args in PLANS.items():
        label = f"{name}/{plan}"
        out = os.path.join(work, f"{name}-{plan}.safetensors")
        rc, text = hf.run_tool(tool, [
            "--model", ckpt, "--tokens", tokens_path, "--out", out, "--grad-accum", str(GRAD_ACCUM),
            "--lr", str(hf.LR), "--beta1", str(hf.BETAS[0]), "--beta2", str(hf.BETAS[1]),
            "--eps", str(hf.EPS), "--weight-decay", str(hf.WD), "--steps", str(STEPS),
            "--osft-rank-ratio", str(ratio), "--osft-targets", ",".join(targets_list)] + plan_args)
        if rc != 0:
            tally.check(label, False, f"tool failed ({rc}): {text.strip()[-400:]}")
            continue
        got = load_file(out)
        for step, want in enumerate(losses, start=1):
            key = "loss" if step == 1 else f"loss.{step}"
            err = abs(got[key].item() - want) / abs(want)
            tally.check(f"{label} loss step {step}", err <= hf.REL_TOL,
                        f"{got[key].item():.8f} vs {want:.8f}, rel err {err:.2e}")
        for what, want_all in (("grad", grads), ("param", params)):
            missing = [n for n in want_all if f"{what}.{n}" not in got]
            extra = [k for k in got if k.startswith(what + ".") and k[len(what) + 1:] not in want_all]
            if missing or extra:
                tally.check(f"{label} {what} names", False, f"missing {missing[:3]}, extra {extra[:3]}")
                continue
            worst, worst_name = -1.0, ""
            for n, want in want_all.items():
                err = hf.rel_err(got[f"{what}.{n}"], want)
                if err >= worst:
                    worst, worst_name = err, n
            tally.check(f"{label} {what}s ({len(want_all)})", worst <= hf.REL_TOL,
                        f"max rel err {worst:.2e} ({worst_name})")


def check_refused(tally, tool, work):
    ckpt = os.path.join(work, "llama-untied-theta5e5")
    tokens_path = os.path.join(work, "refuse-tokens.safetensors")
    ids, targets = hf.tokens(1, 2)
    save_file({"input_ids": ids, "targets": targets}, tokens_path)
    rc, text = hf.run_tool(tool, ["--model", ckpt, "--tokens", tokens_path, "--out",
                                  os.path.join(work, "refused.safetensors"),
                                  "--osft-rank-ratio", "1", "--osft-targets", "all"])
    tally.check("refuses rank ratio 1", rc != 0 and "osft-rank-ratio" in text,
                f"rc {rc}: {text.strip()[-200:]}")


def main():
    args, work, tally = osft_common.setup(__doc__, "--tool", "memplan-hf-parity binary",
                                          "memplan-osft-parity-", only=True)
    for seed, case in enumerate(sorted(CASES), start=1):
        if args.only and args.only not in case:
            continue
        run_case(tally, args.tool, work, case, seed)
    if not args.only or "refuse" in args.only:
        ckpt = os.path.join(work, "llama-untied-theta5e5")
        if not os.path.isdir(ckpt):
            osft_common.write_checkpoint(ckpt, "llama-untied-theta5e5", 1)
        check_refused(tally, args.tool, work)
    return osft_common.report(tally)


if __name__ == "__main__":
    sys.exit(main())
