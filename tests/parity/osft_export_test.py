#!/usr/bin/env python3
"""An OSFT checkpoint of memplan-agent loads in transformers as an ordinary model (fp32, CPU).

For tiny random checkpoints (written as hf_parity_test.py writes them) memplan-agent trains three
OSFT steps from --model and saves with --save, evaluating once at the end on a held-out window
(--eval-tokens, one micro-batch of one row). Checked: model.safetensors holds each split weight as
the product of its factors in osft_factors.safetensors (U_high diag(S_high) V_highᵀ + U_low
diag(S_low) V_lowᵀ); transformers loads the directory and its loss on that window equals the
agent's eval loss (relative 2e-5: the log prints six digits); the loss differs from the untrained
source's (the weights are the trained ones).

  osft_export_test.py --agent PATH [--work DIR]
"""

import os
import re
import struct
import subprocess
import sys

import torch
import transformers
from safetensors.torch import load_file

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import hf_parity_test as hf  # noqa: E402  (checkpoints, vocabulary, tally)
import osft_common  # noqa: E402  (command line, checkpoints by name, report)

SEQ = 24
ALL = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"
# name: (checkpoint of hf_parity_test.CHECKPOINTS, rank ratio, targets)
CASES = {
    "llama-all-half": ("llama-untied-theta5e5", "0.5", ALL),
    "qwen2-tied-bias-some": ("qwen2-tied-bias", "0.25", "q_proj,v_proj,up_proj,down_proj"),
}
SUFFIXES = ("u_high", "s_high", "v_high", "u_low", "s_low", "v_low")


def write_tokens(path, ids):
    """A memplan token file (agent/io/README.md): header, then int32 ids."""
    with open(path, "wb") as f:
        f.write(b"MPTOKENS" + struct.pack("<IIQQ", 1, 4, len(ids), hf.VOCAB))
        f.write(struct.pack(f"<{len(ids)}i", *ids))


def window_loss(model_dir, window):
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.eval()
    ids = torch.tensor(window[:SEQ]).unsqueeze(0)
    labels = torch.tensor(window[1:SEQ + 1])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].float()
    return torch.nn.functional.cross_entropy(logits, labels).item()


def run_case(tally, agent, work, name, seed):
    ckpt_name, ratio, targets = CASES[name]
    source = os.path.join(work, f"{name}-source")
    osft_common.write_checkpoint(source, ckpt_name, seed)
    g = torch.Generator().manual_seed(seed)
    train = os.path.join(work, f"{name}-train.tokens")
    held_out = os.path.join(work, f"{name}-eval.tokens")
    write_tokens(train, torch.randint(0, hf.VOCAB, (2000,), generator=g).tolist())
    window = torch.randint(0, hf.VOCAB, (SEQ + 1,), generator=g).tolist()
    write_tokens(held_out, window)  # one window: every evaluation row reads it
    out = os.path.join(work, f"{name}-saved")
    proc = subprocess.run(
        [agent, "train", "--model", source, "--data", train, "--eval-tokens", held_out,
         "--eval-batches", "1", "--batch", "1", "--seq", str(SEQ), "--steps", "3", "--lr", "1e-2",
         "--device", "cpu", "--dtype", "fp32", "--cpu-threads", "2", "--osft-rank-ratio", ratio,
         "--osft-targets", targets, "--save", out],
        capture_output=True, text=True)
    text = proc.stdout + proc.stderr
    if proc.returncode != 0:
        tally.check(f"{name} run", False, f"agent failed ({proc.returncode}): {text[-600:]}")
        return
    found = re.findall(r'msg="eval loss" step=3 loss=(\S+)', text)
    if not found:
        tally.check(f"{name} eval loss logged", False, text[-600:])
        return
    agent_loss = float(found[-1])

    weights = load_file(os.path.join(out, "model.safetensors"))
    factors = load_file(os.path.join(out, "osft_factors.safetensors"))
    paths = sorted({k[:k.rindex(".osft_")] for k in factors})
    expected = 4 * len(targets.split(","))
    tally.check(f"{name} split projections", len(paths) == expected,
                f"{len(paths)} split, {expected} expected")
    tally.check(f"{name} HF names only", not any(".osft_" in k for k in weights),
                f"{len(weights)} tensors")
    worst, worst_name = 0.0, ""
    for path in paths:
        u_h, s_h, v_h, u_l, s_l, v_l = (factors[f"{path}.osft_{s}"] for s in SUFFIXES)
        want = (u_h * s_h) @ v_h.T + (u_l * s_l) @ v_l.T
        err = hf.rel_err(weights[f"{path}.weight"], want)
        if err >= worst:
            worst, worst_name = err, path
    tally.check(f"{name} merged weights = factors' product", worst <= 1e-6,
                f"max rel err {worst:.2e} ({worst_name})")

    hf_loss = window_loss(out, window)
    err = abs(hf_loss - agent_loss) / abs(agent_loss)
    tally.check(f"{name} transformers loss = agent eval loss", err <= 2e-5,
                f"{hf_loss:.7f} vs {agent_loss:.7f}, rel err {err:.2e}")
    untrained = window_loss(source, window)
    tally.check(f"{name} trained weights", abs(untrained - hf_loss) > 1e-4,
                f"source {untrained:.6f}, saved {hf_loss:.6f}")


def main():
    args, work, tally = osft_common.setup(__doc__, "--agent", "memplan-agent binary",
                                          "memplan-osft-export-")
    for seed, case in enumerate(sorted(CASES), start=1):
        run_case(tally, args.agent, work, case, seed)
    return osft_common.report(tally)


if __name__ == "__main__":
    sys.exit(main())
