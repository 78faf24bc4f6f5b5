#!/usr/bin/env python3
"""Parity of memplan-agent with Hugging Face transformers, in fp32 on the CPU.

For every architecture option the agent accepts (Llama tied and untied, Qwen2 q/k/v biases, Qwen3
q/k norms, Mistral, sliding windows shorter than the sequence on every layer (Mistral) or on some
(Qwen2/Qwen3), the mixtures of experts Qwen3-MoE and Mixtral with and without their router
load-balancing loss, every RoPE scaling type in both config layouts, Gemma 2 with both soft caps,
Gemma 3 with q/k norms and a RoPE per layer type,
its query scalar, a head_dim apart from the width, alternating sliding layers and a padding row
that the batch uses) this writes a tiny random
checkpoint with transformers' save_pretrained, computes logits, loss, every parameter's gradient
and the parameters after one torch.optim.AdamW step with transformers, then runs
memplan-hf-parity (tests/parity/hf_parity_main.cc) on the same checkpoint and tokens under several
residency plans (plain autograd, grouped, every block mode, offloaded chunks with persistent ones,
two micro-batches) and compares: each tensor's max |memplan - transformers| / max |transformers|
must be <= 1e-5. The checkpoint memplan saves after the step must load in transformers and give
memplan's post-step logits. Config variants the agent must refuse are checked for the error.
SGD is compared with torch.optim.SGD, pure-bf16 AdamW (adamw_bf16) with torch.optim.AdamW(fused=True)
on bf16 parameters.

bf16 (--dtype bf16, e.g. on a GPU with --device cuda): rounding makes exact agreement meaningless,
so each quantity is judged against the fp32 result of transformers on the same device: memplan's
bf16 error must be at most BF16_FACTOR times transformers' own bf16 error plus BF16_FLOOR (a fraction
of one bf16 unit at the tensor's largest magnitude, for tensors transformers happens to round
exactly). A wrong bias, head or RoPE gives errors of order 1, far above either.

  hf_parity_test.py --tool PATH [--work DIR] [--only NAME] [--dtype bf16] [--device cuda]
Prints one line per comparison and ends with "N passed, M failed"; exits non-zero on a failure.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

import torch
import transformers
from safetensors.torch import load_file, save_file

REL_TOL = 1e-5
BF16_FACTOR = 2.0
BF16_FLOOR = 2.0 ** -9  # half a bf16 unit in the last place, relative to the largest magnitude
VOCAB = 96
SEQ = 24
ROWS = 2
LR, BETAS, EPS, WD = 1e-3, (0.9, 0.95), 1e-8, 0.1


def base_config(family, **over):
    c = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=112, num_hidden_layers=4,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
             rms_norm_eps=1e-5, tie_word_embeddings=False)
    if family == "qwen3":
        c["head_dim"] = 16
    if family in ("mistral", "mixtral"):
        c["sliding_window"] = None
    if family == "qwen3_moe":
        c.update(head_dim=16, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=40)
    if family == "mixtral":
        c.update(num_local_experts=4, num_experts_per_tok=2)
    if family in GEMMA_FAMILIES:
        # head_dim 24 against a width of 64 over 4 heads; scores scaled by 20^-1/2.
        c.update(head_dim=24, query_pre_attn_scalar=20)
    c.update(over)
    classes = {"llama": transformers.LlamaConfig, "qwen2": transformers.Qwen2Config,
               "qwen3": transformers.Qwen3Config, "mistral": transformers.MistralConfig,
               "qwen3_moe": transformers.Qwen3MoeConfig, "mixtral": transformers.MixtralConfig,
               "gemma2": transformers.Gemma2Config, "gemma3_text": transformers.Gemma3TextConfig}
    return classes[family](**c)


GEMMA_FAMILIES = ("gemma2", "gemma3_text")


def rope(rope_type, theta, **params):
    return dict(rope_type=rope_type, rope_theta=theta, **params)


# name -> (family, config overrides, edit of the saved config.json or None)
def legacy_layout(rope_scaling, theta):
    """Rewrites config.json the way published checkpoints and older releases store RoPE."""
    def edit(cfg):
        cfg.pop("rope_parameters", None)
        cfg["rope_theta"] = theta
        cfg["rope_scaling"] = rope_scaling
        return cfg
    return edit


CHECKPOINTS = {
    "llama-untied-theta5e5": ("llama", dict(rope_parameters=rope("default", 5e5)), None),
    "llama-tied-llama3": ("llama", dict(tie_word_embeddings=True, rope_parameters=rope(
        "llama3", 5e5, factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0,
        original_max_position_embeddings=8)), None),
    "llama-linear-legacy": ("llama", dict(), legacy_layout({"type": "linear", "factor": 2.5}, 1e4)),
    "llama-llama3-legacy": ("llama", dict(), legacy_layout(
        {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
         "original_max_position_embeddings": 8}, 5e5)),
    # max_position_embeddings below SEQ: the run-time (rescaled base) branch of dynamic NTK.
    "llama-dynamic-beyond": ("llama", dict(max_position_embeddings=16, rope_parameters=rope(
        "dynamic", 1e4, factor=2.0)), None),
    "llama-dynamic-within": ("llama", dict(rope_parameters=rope("dynamic", 1e4, factor=3.0)), None),
    "llama-yarn": ("llama", dict(rope_parameters=rope(
        "yarn", 1e4, factor=4.0, original_max_position_embeddings=16)), None),
    "qwen2-tied-bias": ("qwen2", dict(tie_word_embeddings=True), None),
    "qwen2-yarn-legacy": ("qwen2", dict(), legacy_layout(
        {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16}, 1e6)),
    "qwen3-qknorm": ("qwen3", dict(rope_parameters=rope("default", 1e6)), None),
    "mistral": ("mistral", dict(), None),
    "mistral-window-above-seq": ("mistral", dict(sliding_window=SEQ), None),
    # Sliding windows shorter than the sequence: Mistral's on every layer (tiles of 5 queries, the
    # last one shorter); Qwen2's on the layers layer_types marks; Qwen3's from max_window_layers
    # on (config.json without layer_types, as older checkpoints have it).
    "mistral-window-below-seq": ("mistral", dict(sliding_window=5), None),
    "qwen2-sliding-layer-types": ("qwen2", dict(use_sliding_window=True, sliding_window=7,
                                                layer_types=["full_attention", "sliding_attention",
                                                             "full_attention",
                                                             "sliding_attention"]), None),
    "qwen3-sliding-max-window-layers": ("qwen3", dict(use_sliding_window=True, sliding_window=6,
                                                      max_window_layers=2),
                                        lambda c: {k: v for k, v in c.items()
                                                   if k != "layer_types"}),
    # Mixtures of experts, 4 experts: the load-balancing loss on with a coefficient large enough
    # that its share of the router gradients is far above the tolerance; Qwen3-MoE with a dense
    # layer (mlp_only_layers) and, in a second checkpoint, renormalised top-3 weights, sparse
    # layers every second layer and no aux loss.
    "qwen3moe-aux": ("qwen3_moe", dict(mlp_only_layers=[2], output_router_logits=True,
                                       router_aux_loss_coef=0.3), None),
    "qwen3moe-norm-topk3": ("qwen3_moe", dict(num_experts_per_tok=3, norm_topk_prob=True,
                                              decoder_sparse_step=2), None),
    "mixtral-aux": ("mixtral", dict(output_router_logits=True, router_aux_loss_coef=0.3), None),
    # Gemma 2: caps small enough to bend the scores and logits of this tiny model (about 1 in
    # magnitude), windows of 5 and 7 tokens on the even layers (the default) or on the layers
    # layer_types marks, tied and untied heads, and a padding row (pad_token_id) that the
    # batch's inputs contain, whose embedding gets no gradient from the lookup.
    "gemma2-softcap-window": ("gemma2", dict(sliding_window=5, attn_logit_softcapping=1.5,
                                             final_logit_softcapping=1.0,
                                             tie_word_embeddings=True, pad_token_id=0), None),
    "gemma2-layer-types-untied": ("gemma2", dict(
        sliding_window=7, attn_logit_softcapping=None, final_logit_softcapping=2.0,
        pad_token_id=7, layer_types=["full_attention", "sliding_attention", "sliding_attention",
                                     "full_attention"]), None),
    # Gemma 3: q/k norms, two RoPEs (the sliding layers' own base, the full layers' rope_theta
    # with a linear factor as the 4B+ checkpoints have), windows shorter than the sequence, no
    # attention cap; the sliding layers from layer_types, from rope_parameters per layer type,
    # or (published layout) from sliding_window_pattern with rope_scaling and
    # rope_local_base_freq at the top level.
    "gemma3-pattern-tied-cap": ("gemma3_text", dict(
        sliding_window=5, final_logit_softcapping=1.0, tie_word_embeddings=True, pad_token_id=0),
        lambda c: dict({k: v for k, v in c.items() if k not in ("layer_types", "rope_parameters")},
                       sliding_window_pattern=2, rope_theta=5e4, rope_local_base_freq=100.0)),
    "gemma3-layer-types-linear": ("gemma3_text", dict(
        sliding_window=7, pad_token_id=7, rope_parameters={
            "full_attention": rope("linear", 1e6, factor=8.0),
            "sliding_attention": rope("default", 1e4)},
        layer_types=["full_attention", "sliding_attention", "sliding_attention",
                     "full_attention"]), None),
    "gemma3-published-layout": ("gemma3_text", dict(sliding_window=6), lambda c: dict(
        {k: v for k, v in c.items() if k not in ("layer_types", "rope_parameters")},
        sliding_window_pattern=3, rope_theta=1e6, rope_local_base_freq=1e3,
        rope_scaling={"rope_type": "linear", "factor": 8.0})),
}

# Plans: (name, memplan-hf-parity arguments). The first group runs for every checkpoint.
PLANS_ALL = [
    ("plain", ["--plain"]),
    ("plain-chunked-head", ["--plain", "--head-chunk-rows", "5"]),
    ("managed-offload", ["--chunk-kib", "96", "--n-persist", "1", "--n-buffer", "2",
                         "--block-modes", "ckpt,swap,hs_offload,none"]),
]
PLANS_FULL = PLANS_ALL + [
    ("sgd", ["--optimizer", "sgd"]),
    ("managed-sgd", ["--optimizer", "sgd", "--chunk-kib", "96", "--n-persist", "1"]),
    ("grouped-none", []),
    ("grouped-ckpt", ["--block-modes", "ckpt,ckpt,ckpt,ckpt"]),
    ("grouped-swap", ["--block-modes", "swap,swap,swap,swap"]),
    ("grouped-hs-offload", ["--block-modes", "hs_offload,hs_offload,hs_offload,hs_offload"]),
    ("managed-all-offloaded", ["--chunk-kib", "64", "--n-persist", "0", "--n-buffer", "2"]),
    ("managed-grad-accum-2", ["--chunk-kib", "96", "--n-persist", "1", "--grad-accum", "2",
                              "--block-modes", "none,ckpt,none,hs_offload"]),
    ("managed-clip", ["--chunk-kib", "96", "--n-persist", "2", "--clip", "0.05"]),
    # The chunked LM head + loss (common/head_chunking.h) over 7 tokens at a time.
    ("chunked-head", ["--head-chunk-rows", "7"]),
    ("managed-chunked-head", ["--head-chunk-rows", "7", "--chunk-kib", "96", "--n-persist", "1",
                             "--block-modes", "ckpt,swap,hs_offload,none"]),
]
MOE_FAMILIES = ("qwen3_moe", "mixtral")
# Seeds of the mixture-of-experts checkpoints, apart from the others' (their position in the
# sorted list), so that adding these left the others' data unchanged.
MOE_SEEDS = {"mixtral-aux": 41, "qwen3moe-aux": 42, "qwen3moe-norm-topk3": 43}
# Gemma 2's likewise; their inputs contain the padding token (0 for seed 51, 7 for seed 52).
FIXED_SEEDS = dict(MOE_SEEDS, **{"gemma2-softcap-window": 51, "gemma2-layer-types-untied": 52,
                                  "gemma3-pattern-tied-cap": 61, "gemma3-layer-types-linear": 62,
                                  "gemma3-published-layout": 63})
# The checkpoints whose attention runs in sliding-window tiles: every block mode (recompute, swap,
# host offload) for them.
PLANS_MODES = PLANS_ALL + [p for p in PLANS_FULL
                           if p[0] in ("grouped-ckpt", "grouped-swap", "grouped-hs-offload")]
TILED_ATTENTION_CHECKPOINTS = {"mistral-window-below-seq", "qwen2-sliding-layer-types",
                               "qwen3-sliding-max-window-layers", "gemma2-layer-types-untied",
                               "gemma3-layer-types-linear"}
FULL_PLAN_CHECKPOINTS = {"llama-untied-theta5e5", "llama-tied-llama3", "qwen2-tied-bias",
                         "qwen3moe-aux", "mixtral-aux", "gemma2-softcap-window",
                         "gemma3-pattern-tied-cap"}

# Configs the agent must refuse at load, with a word its error must contain.
REFUSED = {
    "longrope": ("llama", dict(rope_parameters=rope(
        "longrope", 1e4, short_factor=[1.0] * 8, long_factor=[1.0] * 8,
        original_max_position_embeddings=16)), None, "rope_type"),
    "unknown-rope-key": ("llama", dict(), legacy_layout(
        {"type": "linear", "factor": 2.0, "beta_fast": 3.0}, 1e4), "beta_fast"),
    "partial-rotary": ("llama", dict(), lambda c: dict(c, partial_rotary_factor=0.5),
                       "partial_rotary_factor"),
    "llama-attention-bias": ("llama", dict(attention_bias=True), None, "attention_bias"),
    "mixtral-router-jitter": ("mixtral", dict(router_jitter_noise=0.1), None,
                              "router_jitter_noise"),
    "gemma2-erf-gelu": ("gemma2", dict(hidden_activation="gelu"), None, "hidden_activation"),
    "gemma3-sliding-linear-rope": ("gemma3_text", dict(rope_parameters={
        "full_attention": rope("default", 1e6),
        "sliding_attention": rope("linear", 1e4, factor=2.0)}), None, "sliding_attention"),
}


# transformers 5 keeps a sparse layer's experts as two fused tensors in memory,
# mlp.experts.gate_up_proj [E, 2F, H] (gate rows first) and mlp.experts.down_proj [E, H, F], while
# checkpoints (and memplan) name every expert's projections. Mixtral's checkpoints also call the
# layer block_sparse_moe and the projections w1 (gate), w3 (up), w2 (down).
def expert_names(name, experts):
    """For an in-memory fused expert tensor: [(checkpoint name, index into it)]; else None."""
    for fused, parts in ((".mlp.experts.gate_up_proj", ("gate_proj", "up_proj")),
                         (".mlp.experts.down_proj", ("down_proj",))):
        if name.endswith(fused):
            prefix = name[: -len(fused)]
            out = []
            for e in range(experts):
                for i, part in enumerate(parts):
                    out.append((f"{prefix}.mlp.experts.{e}.{part}.weight", (e, i, len(parts))))
            return out
    return None


def disk_name(name, family):
    if family != "mixtral":
        return name
    mixtral = {"gate_proj": "w1", "up_proj": "w3", "down_proj": "w2"}
    name = name.replace(".mlp.", ".block_sparse_moe.")
    for hf, mx in mixtral.items():
        name = name.replace(f".{hf}.weight", f".{mx}.weight")
    return name


def to_checkpoint_names(tensors, family, experts):
    """{in-memory name: tensor} -> {checkpoint name: tensor}, fused experts split."""
    out = {}
    for n, t in tensors.items():
        parts = expert_names(n, experts) if experts else None
        if parts is None:
            out[disk_name(n, family) if ".mlp.gate.weight" in n else n] = t
            continue
        for name, (e, i, count) in parts:
            rows = t.shape[1] // count
            out[disk_name(name, family)] = t[e, i * rows:(i + 1) * rows].clone()
    return out


def from_checkpoint_names(get, name, family, experts):
    """The in-memory tensor `name` assembled from checkpoint-named tensors (get(name))."""
    parts = expert_names(name, experts) if experts else None
    if parts is None:
        return get(disk_name(name, family) if ".mlp.gate.weight" in name else name)
    by_expert = {}
    for n, (e, _, _) in parts:
        by_expert.setdefault(e, []).append(get(disk_name(n, family)))
    return torch.stack([torch.cat(by_expert[e], 0) for e in sorted(by_expert)])


def moe_of(model):
    """(family, expert count) of a transformers model; expert count 0 for a dense one."""
    c = model.config
    return c.model_type, getattr(c, "num_local_experts", 0) or getattr(c, "num_experts", 0)


def randomise(model, seed):
    """Every parameter random (biases and norm weights too), so a misplaced one shows."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.2 * torch.randn(p.shape, generator=g))
            elif name.endswith(".bias"):
                p.copy_(0.2 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(0.05 * torch.randn(p.shape, generator=g))


def write_checkpoint(directory, family, overrides, edit, seed):
    config = base_config(family, **overrides)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    randomise(model, seed)
    model.save_pretrained(directory)
    if edit is not None:
        path = os.path.join(directory, "config.json")
        with open(path) as f:
            cfg = json.load(f)
        with open(path, "w") as f:
            json.dump(edit(cfg), f, indent=2)


def load_hf(directory, dtype=torch.float32, device="cpu"):
    # Gemma 2 pinned to eager attention, the math memplan implements: some transformers 5.x
    # releases (5.17) default it to sdpa, which drops attn_logit_softcapping without a word.
    config = transformers.AutoConfig.from_pretrained(directory)
    pin = {"attn_implementation": "eager"} if config.model_type in GEMMA_FAMILIES else {}
    model = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=dtype, **pin)
    return model.to(device).train()


def tokens(seed, rows):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (rows, SEQ + 1), generator=g)
    targets = ids[:, 1:].clone()
    targets[0, 3] = -100  # an ignored position
    return ids[:, :-1].contiguous(), targets.contiguous()


def hf_reference(directory, ids, targets, grad_accum, clip, optimizer="adamw",
                 dtype=torch.float32, device="cpu"):
    """Logits, loss, grads and parameters after one optimizer step, as transformers computes
    them (on the CPU, in fp32 unless asked otherwise)."""
    model = load_hf(directory, dtype, device)
    ids, targets = ids.to(device), targets.to(device)
    with torch.no_grad():
        logits = model(input_ids=ids).logits.float().cpu()
    params = dict(model.named_parameters())
    rows = ids.shape[0] // grad_accum
    loss_sum = 0.0
    for i in range(grad_accum):
        sl = slice(i * rows, (i + 1) * rows)
        out = model(input_ids=ids[sl], labels=targets[sl], shift_labels=targets[sl])
        (out.loss / grad_accum).backward()
        loss_sum += out.loss.item()
    grads = {n: p.grad.detach().float().cpu().clone() for n, p in params.items()}
    family, experts = moe_of(model)
    return (logits, loss_sum / grad_accum, to_checkpoint_names(grads, family, experts),
            to_checkpoint_names(optimizer_step(params, clip, optimizer), family, experts))


def optimizer_step(params, clip, optimizer):
    """torch's optimizer step on `params` (their .grad set), clipped first when clip > 0; the
    parameters after it, in fp32 on the CPU."""
    if clip > 0:
        torch.nn.utils.clip_grad_norm_(list(params.values()), clip)
    if optimizer == "sgd":
        opt = torch.optim.SGD(list(params.values()), lr=LR, weight_decay=WD)
    else:
        # adamw_bf16: the same AdamW on bf16 parameters and moments, fused (fp32 arithmetic).
        opt = torch.optim.AdamW(list(params.values()), lr=LR, betas=BETAS, eps=EPS,
                                weight_decay=WD, fused=optimizer == "adamw_bf16")
    opt.step()
    return {n: p.detach().float().cpu().clone() for n, p in params.items()}


def hf_step_with(directory, grads, clip, optimizer):
    """transformers' parameters after one optimizer step taken with the given gradients (fp32)."""
    model = load_hf(directory)
    params = dict(model.named_parameters())
    family, experts = moe_of(model)
    for n, p in params.items():
        p.grad = from_checkpoint_names(lambda k: grads["grad." + k], n, family, experts).clone()
    return to_checkpoint_names(optimizer_step(params, clip, optimizer), family, experts)


def rel_err(got, want):
    scale = want.abs().max().item()
    return (got - want).abs().max().item() / (scale if scale > 0 else 1.0)


class Tally:
    def __init__(self):
        self.passed = 0
        self.failed = []

    def check(self, label, ok, detail):
        print(f"{'ok  ' if ok else 'FAIL'} {label}: {detail}", flush=True)
        if ok:
            self.passed += 1
        else:
            self.failed.append(label)


def run_tool(tool, args):
    proc = subprocess.run([tool] + args, capture_output=True, text=True)
    return proc.returncode, proc.stdout + proc.stderr


def fp32_judge(got, want, _hf_low):
    """(err / bound, detail): memplan against transformers in fp32; <= 1 passes."""
    err = rel_err(got, want)
    return err / REL_TOL, f"rel err {err:.2e}"


def bf16_judge(got, want32, hf_low):
    """(err / bound, detail): memplan's bf16 error against transformers' fp32 result, bounded by
    transformers' own bf16 error (see the module docstring); <= 1 passes."""
    err, hf_err = rel_err(got, want32), rel_err(hf_low, want32)
    bound = BF16_FACTOR * hf_err + BF16_FLOOR
    return err / bound, (f"err vs fp32 {err:.2e}, transformers bf16 {hf_err:.2e}, bound "
                         f"{bound:.2e}; memplan vs transformers bf16 {rel_err(got, hf_low):.2e}")


def compare_run(tally, label, out_path, ref, judge, hf_low=None):
    """Compares one memplan run with the reference: logits, loss, every gradient and every
    parameter after the step. hf_low is transformers' run at the tested precision (bf16 judging;
    fp32 judging ignores it)."""
    got = load_file(out_path)
    low = hf_low or ref
    ratio, detail = judge(got["logits"], ref[0], low[0])
    tally.check(f"{label} logits", ratio <= 1, detail)
    ratio, detail = judge(got["loss"], torch.tensor([ref[1]]), torch.tensor([low[1]]))
    tally.check(f"{label} loss", ratio <= 1,
                f"memplan {got['loss'].item():.8f} transformers {ref[1]:.8f}, {detail}")
    for index, prefix, what in ((2, "grad.", "grads"), (3, "param.", "params after the step")):
        missing = [n for n in ref[index] if prefix + n not in got]
        judged = [judge(got[prefix + n], want, low[index][n]) + (n,)
                  for n, want in ref[index].items() if prefix + n in got]
        ratio, detail, name = max(judged, key=lambda r: r[0], default=(0.0, "", ""))
        tally.check(f"{label} {what}", not missing and ratio <= 1,
                    f"{len(ref[index])} tensors, worst {name}: {detail}"
                    + (f", missing {missing}" if missing else ""))


def plan_value(plan_args, flag, default, kind):
    return kind(plan_args[plan_args.index(flag) + 1]) if flag in plan_args else default


def run_checkpoint(tally, tool, work, name, seed, plans, dtype, device):
    """Writes checkpoint `name`, then runs and judges every plan at `dtype` on `device`."""
    family, overrides, edit = CHECKPOINTS[name]
    ckpt = os.path.join(work, name)
    if not os.path.isdir(ckpt):
        write_checkpoint(ckpt, family, overrides, edit, seed)
    bf16 = dtype == "bf16"
    hyper = ["--lr", str(LR), "--beta1", str(BETAS[0]), "--beta2", str(BETAS[1]),
             "--eps", str(EPS), "--weight-decay", str(WD), "--dtype", dtype, "--device", device]
    refs = {}
    for plan, plan_args in plans:
        grad_accum = plan_value(plan_args, "--grad-accum", 1, int)
        clip = plan_value(plan_args, "--clip", 0.0, float)
        optimizer = plan_value(plan_args, "--optimizer", "adamw_bf16" if bf16 else "adamw", str)
        if "--optimizer" not in plan_args:
            plan_args = plan_args + ["--optimizer", optimizer]
        rows = ROWS * grad_accum
        ids, targets = tokens(100 + seed, rows)
        tok_path = os.path.join(work, f"{name}.tokens{rows}.safetensors")
        save_file({"input_ids": ids, "targets": targets}, tok_path)
        key = (grad_accum, clip, optimizer)
        if key not in refs:
            # fp32 truth; at bf16 also transformers' own bf16 run, the yardstick.
            ref32 = hf_reference(ckpt, ids, targets, grad_accum, clip,
                                 "adamw" if optimizer == "adamw_bf16" else optimizer,
                                 torch.float32, device)
            low = hf_reference(ckpt, ids, targets, grad_accum, clip, optimizer, torch.bfloat16,
                               device) if bf16 else None
            refs[key] = (ref32, low)
        tag = f"{name}.{dtype}.{plan}"
        out = os.path.join(work, f"{tag}.out.safetensors")
        save_hf = os.path.join(work, f"{tag}.saved")
        rc, log = run_tool(tool, ["--model", ckpt, "--tokens", tok_path, "--out", out,
                                  "--save-hf", save_hf] + hyper + plan_args)
        label = f"{name} [{plan}{', ' + dtype + ' ' + device if bf16 or device != 'cpu' else ''}]"
        tally.check(f"{label} runs", rc == 0, log.strip().splitlines()[-1] if log.strip() else "")
        if rc != 0:
            continue
        ref32, low = refs[key]
        if ("--head-chunk-rows" in plan_args or family in MOE_FAMILIES or family in GEMMA_FAMILIES
                or name in TILED_ATTENTION_CHECKPOINTS) and not bf16:
            # The chunked head sums the loss and the head's gradients in another order, a sparse
            # layer groups tokens per expert and sums their outputs in another order than
            # transformers, and so does attention in tiles (sliding windows; Gemma 2's every
            # layer: a tile's scores, the key and value gradients over tiles): gradients agree within fp32 rounding, not bit
            # for bit, and AdamW's first step (about lr * sign(g)) turns rounding-level
            # differences of near-zero gradients into full steps. So the step is checked as
            # torch's optimizer applied to memplan's gradients, which are themselves checked
            # against transformers'.
            got = load_file(out)
            ref32 = ref32[:3] + (hf_step_with(ckpt, got, clip, optimizer),)
        compare_run(tally, label, out, ref32, bf16_judge if bf16 else fp32_judge, low)
        if plan == "plain":
            # The checkpoint memplan saved loads in transformers and gives the logits that
            # memplan's post-step parameters give in transformers' own model.
            torch_dtype = torch.bfloat16 if bf16 else torch.float32
            with torch.no_grad():
                got = load_hf(save_hf, torch_dtype, device)(input_ids=ids.to(device)).logits
                ref_model = load_hf(ckpt, torch_dtype, device)
                post = load_file(out)
                family, experts = moe_of(ref_model)
                for n, p in ref_model.named_parameters():
                    p.copy_(from_checkpoint_names(lambda k: post["param." + k], n, family,
                                                  experts))
                want = ref_model(input_ids=ids.to(device)).logits
            err = rel_err(got.float().cpu(), want.float().cpu())
            tally.check(f"{label} saved checkpoint loads in transformers", err <= REL_TOL,
                        f"logits rel err {err:.2e}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tool", required=True, help="memplan-hf-parity binary")
    parser.add_argument("--work", help="scratch directory (default: a temporary one)")
    parser.add_argument("--only", help="run only checkpoints whose name contains this")
    parser.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32",
                        help="fp32 (default): every checkpoint and plan, plus pure-bf16 AdamW on "
                        "one checkpoint; bf16: every checkpoint in bf16 with pure-bf16 AdamW")
    parser.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    args = parser.parse_args()
    if args.device == "cpu":
        torch.set_num_threads(2)
    work = args.work or tempfile.mkdtemp(prefix="memplan-parity-")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    print(f"transformers {transformers.__version__}, torch {torch.__version__}, work dir {work}")
    tally = Tally()

    dense = sorted(n for n in CHECKPOINTS if n not in FIXED_SEEDS)
    seeds = dict(zip(dense, range(1, len(dense) + 1)), **FIXED_SEEDS)
    for name, seed in sorted(seeds.items()):
        if args.only and args.only not in name:
            continue
        if args.dtype == "bf16":
            run_checkpoint(tally, args.tool, work, name, seed, PLANS_ALL, "bf16", args.device)
            continue
        plans = (PLANS_FULL if name in FULL_PLAN_CHECKPOINTS
                 else PLANS_MODES if name in TILED_ATTENTION_CHECKPOINTS else PLANS_ALL)
        run_checkpoint(tally, args.tool, work, name, seed, plans, "fp32", args.device)
        if name == "llama-tied-llama3":
            run_checkpoint(tally, args.tool, work, name, seed, PLANS_ALL, "bf16", args.device)

    for name, (family, overrides, edit, word) in sorted(REFUSED.items()):
        if args.only and args.only not in name:
            continue
        ckpt = os.path.join(work, "refused-" + name)
        try:
            write_checkpoint(ckpt, family, overrides, edit, 7)
        except Exception as e:  # noqa: BLE001 - transformers itself refuses the config
            tally.check(f"refuse {name}", False, f"transformers could not write it: {e}")
            continue
        ids, targets = tokens(7, ROWS)
        tok_path = os.path.join(work, f"refused-{name}.tokens.safetensors")
        save_file({"input_ids": ids, "targets": targets}, tok_path)
        rc, log = run_tool(args.tool, ["--model", ckpt, "--tokens", tok_path,
                                       "--out", os.path.join(work, "refused.out")])
        tally.check(f"refuse {name}", rc != 0 and word in log,
                    log.strip().splitlines()[-1] if log.strip() else f"exit {rc}")

    print(f"{tally.passed} passed, {len(tally.failed)} failed")
    if tally.failed:
        print("failed: " + ", ".join(tally.failed))
    return 1 if tally.failed else 0


if __name__ == "__main__":
    sys.exit(main())
