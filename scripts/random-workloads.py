#!/usr/bin/env python3
"""Draws the held-out random loop's workloads (scripts/gpu-random-loop.sh): one line per draw,
"ARCH BATCH SEQ MARGIN BUDGET_GIB [FLAG ...]" as scripts/gpu-loop.sh reads them, ';'-joined.

  random-workloads.py SEED N CARD_GIB [--knobs] [--envelope] [--host-gib G] [--gpus N] [MODEL ...]

Default (the draws of earlier loops, unchanged for a given seed): a model from MODEL ...
(full fine-tune, fp32-master AdamW), a sequence log-uniform in [512, 32768] rounded to 256, a
micro-batch of 1..8 with at most 32768 tokens, a budget uniform in [16 GiB, the card], a safety
margin in [0.02, 0.30]. --knobs also draws, from a second generator, --host-memory pageable (a
third) or --n-swap 1..4 (another third).

--envelope draws from the envelope users run instead (MODEL ... ignored):
  method     full fine-tune (0.5 B-14 B, only where the host holds the model's state at the
             optimizer's bytes per parameter: --host-gib, default 120), LoRA or QLoRA
             (7 B-32 B; rank 8, 16 or 64; every linear layer or attention only);
  optimizer  full fine-tune: adamw, adamw_bf16, adamw8bit or sgd; adapters: adamw;
  clipping   --clip 0 or 1, half each;
  sequence   log-uniform in [512, 65536] rounded to 256; micro-batch 1..8 with at most 32768
             tokens (one row above that);
  ranks      with --gpus N > 1, a third of the draws train on N ranks (--ranks N);
  budget, margin as above; --knobs as above, full fine-tunes only.
"""
import math
import random
import sys

FULL = {  # preset: parameters in billions
    "qwen2.5-0.5b": 0.49, "qwen3-0.6b": 0.6, "llama-3.2-1b": 1.24, "qwen2.5-1.5b": 1.54,
    "qwen3-1.7b": 1.7, "llama-3.2-3b": 3.21, "qwen2.5-3b": 3.09, "qwen3-4b": 4.02,
    "qwen2.5-7b": 7.62, "mistral-7b": 7.25, "llama-3.1-8b": 8.03, "qwen3-8b": 8.19,
    "qwen2.5-14b": 14.8, "qwen3-14b": 14.8,
}
ADAPTER = ["mistral-7b", "qwen2.5-7b", "llama-3.1-8b", "qwen3-8b", "qwen2.5-14b", "qwen3-14b",
           "qwen2.5-32b", "qwen3-32b"]
# Host bytes per parameter of a full fine-tune whose state lives on the host: bf16 parameters and
# gradients plus the optimizer's state (fp32 master + two fp32 moments; bf16 moments; 8-bit
# moments with an fp32 master; none), with room for the loader.
HOST_BYTES_PER_PARAM = {"adamw": 16, "adamw_bf16": 8, "adamw8bit": 10, "sgd": 8}


def log_uniform_seq(rng, hi):
    seq = int(round(math.exp(rng.uniform(math.log(512), math.log(hi))) / 256)) * 256
    return min(max(seq, 512), hi)


def legacy(rng, knob_rng, n, card, knobs, models):
    rows = []
    for _ in range(n):
        model = rng.choice(models)
        seq = log_uniform_seq(rng, 32768)
        batch = rng.randint(1, max(1, min(8, 32768 // seq)))
        budget = rng.uniform(16.0, card)
        margin = rng.uniform(0.02, 0.30)
        row = f"{model} {batch} {seq} {margin:.3f} {budget:.1f}"
        if knobs:
            draw = knob_rng.random()
            if draw < 1 / 3:
                row += " --host-memory pageable"
            elif draw < 2 / 3:
                row += f" --n-swap {knob_rng.randint(1, 4)}"
        rows.append(row)
    return rows


def envelope(rng, n, card, knobs, host_gib, gpus):
    rows = []
    while len(rows) < n:
        method = rng.choices(["full", "lora", "qlora"], weights=[0.55, 0.25, 0.20])[0]
        flags = []
        if method == "full":
            optimizer = rng.choice(sorted(HOST_BYTES_PER_PARAM))
            model = rng.choice(sorted(FULL))
            if FULL[model] * HOST_BYTES_PER_PARAM[optimizer] > 0.8 * host_gib * 1.0737:
                continue  # the host cannot hold this model's state: draw again
            flags += ["--optimizer", optimizer]
        else:
            model = rng.choice(ADAPTER)
            r = rng.choice([8, 16, 64])
            targets = rng.choice(["all", "q_proj,k_proj,v_proj,o_proj"])
            flags += ["--lora-rank", str(r), "--lora-alpha", str(2 * r), "--lora-targets", targets]
            if method == "qlora":
                flags.append("--qlora")
        flags += ["--clip", rng.choice(["0", "1"])]
        seq = log_uniform_seq(rng, 65536)
        batch = rng.randint(1, max(1, min(8, 32768 // seq)))
        budget = rng.uniform(16.0, card)
        margin = rng.uniform(0.02, 0.30)
        if knobs and method == "full":
            draw = rng.random()
            if draw < 1 / 3:
                flags += ["--host-memory", "pageable"]
            elif draw < 2 / 3:
                flags += ["--n-swap", str(rng.randint(1, 4))]
        if gpus > 1 and rng.random() < 1 / 3:
            flags += ["--ranks", str(gpus)]
        rows.append(f"{model} {batch} {seq} {margin:.3f} {budget:.1f} " + " ".join(flags))
    return rows


def main(argv):
    if len(argv) < 3 or argv[0] in ("-h", "--help"):
        sys.exit(__doc__)
    seed, n, card = int(argv[0]), int(argv[1]), float(argv[2])
    rest = argv[3:]
    opts = {"--host-gib": "120", "--gpus": "1"}
    models, flags = [], set()
    i = 0
    while i < len(rest):
        if rest[i] in opts:
            opts[rest[i]] = rest[i + 1]
            i += 2
        elif rest[i].startswith("--"):
            flags.add(rest[i])
            i += 1
        else:
            models.append(rest[i])
            i += 1
    rng = random.Random(seed)
    if "--envelope" in flags:
        rows = envelope(rng, n, card, "--knobs" in flags, float(opts["--host-gib"]),
                        int(opts["--gpus"]))
    else:
        rows = legacy(rng, random.Random(f"knobs-{seed}"), n, card, "--knobs" in flags, models)
    print(";".join(rows))


if __name__ == "__main__":
    main(sys.argv[1:])
