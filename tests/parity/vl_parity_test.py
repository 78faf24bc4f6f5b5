#!/usr/bin/env python3
"""Parity of memplan-agent's Qwen2.5-VL with Hugging Face transformers, in fp32 on the CPU.

Writes a tiny random Qwen2_5_VLForConditionalGeneration with save_pretrained (3 vision blocks, one
of them full attention, windows of 2x2 merged patches; 3 language layers with M-RoPE), and a batch
of two rows holding three images of two sizes between text: row 0 one 6x10-patch image (windows
cut by its edge), row 1 a 4x4- and a 4x8-patch image. pixel_values and image_grid_thw are made
directly (no image processor: pillow/torchvision are not needed), mm_token_type_ids marks the
image tokens as the processor does. transformers computes logits, the loss, every parameter's
gradient (vision tower included) and one torch.optim.AdamW step; memplan-hf-parity
(tests/parity/hf_parity_main.cc, --images) runs the same under several residency plans, two of
them with the vision tower's blocks checkpointed (--vision-checkpoint). Each
tensor's max |memplan - transformers| / max |transformers| must be <= 1e-5. The patch embedding
(transformers' Conv3d, memplan's matrix product over flattened patches) and the attention kernels
sum in other orders, so gradients agree within fp32 rounding, not bit for bit, and AdamW's first
step (about lr * sign(g)) turns rounding-level differences of near-zero gradients into full steps:
the step is judged as torch's AdamW applied to memplan's gradients, which are themselves judged
against transformers' (as hf_parity_test.py does for its tiled and sparse checkpoints). The
checkpoint memplan saves after the step must load in transformers and give memplan's post-step
logits.
LoRA (peft 0.21, r 4, alpha 8, q_proj and v_proj: names that only the language model has) from a
random peft adapter (--load-adapter): logits, loss, every adapter gradient and the step, and the
adapter memplan saves loads in peft with memplan's post-step logits.
The same checks, untied and with LoRA, for a tiny Qwen2VLForConditionalGeneration (qwen2_vl: the
tower's LayerNorm, QuickGELU MLP and full attention over each image) on the same batch layout.

bf16 (--dtype bf16, e.g. on a GPU with --device cuda): the bound of hf_parity_test.py (bf16_judge):
memplan's bf16 error against transformers' fp32 result on the same device must be at most
BF16_FACTOR times transformers' own bf16 error plus BF16_FLOOR. memplan steps with pure-bf16 AdamW
(adamw_bf16), transformers' bf16 run with torch.optim.AdamW(fused=True) on its bf16 parameters and
the fp32 truth with torch.optim.AdamW. peft's adapters stay bf16 as memplan's do
(autocast_adapter_dtype=False). Saved checkpoints and adapters load in bf16 and give, within 1e-5,
the logits of transformers' bf16 model holding memplan's post-step values.

  vl_parity_test.py --tool PATH [--work DIR] [--arch qwen2_5_vl|qwen2_vl] [--dtype fp32|bf16]
                    [--device cpu|cuda]
Prints one line per comparison and ends with "N passed, M failed"; exits non-zero on a failure.
"""

import argparse
import json
import os
import shutil
import sys
import tempfile

import peft
import torch
import transformers
from safetensors.torch import load_file, save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hf_parity_test import (BETAS, EPS, LR, REL_TOL, WD, Tally, bf16_judge,  # noqa: E402
                            fp32_judge, optimizer_step, randomise, rel_err, run_tool)

VOCAB = 96
SEQ = 40
IMAGE, VIDEO, START, END = 90, 91, 92, 93
PATCH, MERGE, TEMPORAL, CHANNELS = 2, 2, 2, 3
# (t, h, w) in patches, per row.
ROW_IMAGES = [[(1, 6, 10)], [(1, 4, 4), (1, 4, 8)]]

PLANS = [
    ("plain", ["--plain"]),
    ("grouped-none", []),
    ("grouped-ckpt", ["--block-modes", "ckpt,ckpt,ckpt"]),
    ("grouped-swap", ["--block-modes", "swap,swap,swap"]),
    ("grouped-hs-offload", ["--block-modes", "hs_offload,hs_offload,hs_offload"]),
    ("managed-offload", ["--chunk-kib", "96", "--n-persist", "1", "--n-buffer", "2",
                         "--block-modes", "ckpt,swap,none"]),
    ("managed-all-offloaded", ["--chunk-kib", "64", "--n-persist", "0", "--n-buffer", "2"]),
    ("managed-grad-accum-2", ["--chunk-kib", "96", "--n-persist", "1", "--grad-accum", "2",
                              "--block-modes", "none,ckpt,hs_offload"]),
    # The vision tower's blocks recomputed in backward ([Vision block checkpointing]).
    ("plain-vision-ckpt", ["--plain", "--vision-checkpoint"]),
    ("managed-vision-ckpt", ["--chunk-kib", "96", "--n-persist", "1", "--n-buffer", "2",
                             "--grad-accum", "2", "--block-modes", "ckpt,swap,none",
                             "--vision-checkpoint"]),
]


def config(arch, tie):
    if arch == "qwen2_vl":
        return qwen2_vl_config(tie)
    return transformers.Qwen2_5_VLConfig(
        text_config=dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=112,
                         num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                         rms_norm_eps=1e-5, max_position_embeddings=128,
                         rope_parameters=dict(rope_type="default", rope_theta=1e4,
                                              mrope_section=[4, 2, 2])),
        vision_config=dict(depth=3, hidden_size=32, intermediate_size=48, num_heads=2,
                           out_hidden_size=64, patch_size=PATCH, spatial_merge_size=MERGE,
                           temporal_patch_size=TEMPORAL, in_channels=CHANNELS, window_size=8,
                           fullatt_block_indexes=[1]),
        image_token_id=IMAGE, video_token_id=VIDEO, vision_start_token_id=START,
        vision_end_token_id=END, tie_word_embeddings=tie)


def qwen2_vl_config(tie):
    """Qwen2-VL: the same language model; a tower with LayerNorm, fc1 -> QuickGELU -> fc2 (mlp_ratio
    2) and attention over each whole image in every block (no windows)."""
    return transformers.Qwen2VLConfig(
        text_config=dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=112,
                         num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                         rms_norm_eps=1e-5, max_position_embeddings=128,
                         rope_parameters=dict(rope_type="default", rope_theta=1e4,
                                              mrope_section=[4, 2, 2])),
        vision_config=dict(depth=3, embed_dim=32, hidden_size=64, mlp_ratio=2, num_heads=2,
                           patch_size=PATCH, spatial_merge_size=MERGE,
                           temporal_patch_size=TEMPORAL, in_channels=CHANNELS),
        image_token_id=IMAGE, video_token_id=VIDEO, vision_start_token_id=START,
        vision_end_token_id=END, tie_word_embeddings=tie)


MODEL_CLASSES = {"qwen2_5_vl": "Qwen2_5_VLForConditionalGeneration",
                 "qwen2_vl": "Qwen2VLForConditionalGeneration"}


def arch_of(name):
    """The family a checkpoint's name starts with ("qwen2_vl-untied" -> "qwen2_vl")."""
    return name.split("-")[0]


def disk_name(name):
    """transformers 5's in-memory names -> the checkpoint's."""
    if name.startswith("model.visual."):
        return name[len("model."):]
    if name.startswith("model.language_model."):
        return "model." + name[len("model.language_model."):]
    return name


def write_checkpoint(directory, arch, tie, seed):
    torch.manual_seed(seed)
    model = getattr(transformers, MODEL_CLASSES[arch])(config(arch, tie)).float()
    randomise(model, seed)
    model.save_pretrained(directory)


TORCH_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def load_hf(directory, dtype=torch.float32, device="cpu"):
    with open(os.path.join(directory, "config.json")) as f:
        arch = json.load(f)["model_type"]
    model = getattr(transformers, MODEL_CLASSES[arch]).from_pretrained(
        directory, dtype=dtype, attn_implementation="sdpa")
    return model.to(device).train()


def batch(seed):
    """input_ids, targets (shifted, -100 where the next token is an image token or none), and
    every row's images: pixel_values, image_grid_thw."""
    g = torch.Generator().manual_seed(seed)
    rows, grids = [], []
    for images in ROW_IMAGES:
        row = torch.randint(0, 80, (3,), generator=g).tolist()
        for t, h, w in images:
            row += [START] + [IMAGE] * (t * h * w // MERGE ** 2) + [END]
            row += torch.randint(0, 80, (4,), generator=g).tolist()
            grids.append([t, h, w])
        row += torch.randint(0, 80, (SEQ + 1 - len(row),), generator=g).tolist()
        rows.append(row)
    ids = torch.tensor(rows)
    targets = ids[:, 1:].clone()
    targets[targets == IMAGE] = -100
    grid = torch.tensor(grids)
    patches = int(grid.prod(-1).sum())
    pixels = torch.randn(patches, CHANNELS * TEMPORAL * PATCH * PATCH, generator=g)
    return ids[:, :-1].contiguous(), targets.contiguous(), pixels, grid


def images_of_rows(ids, pixels, grid, begin, end):
    runs = [sum(1 for t in range(ids.shape[1]) if ids[r, t] == IMAGE and
                (t == 0 or ids[r, t - 1] != IMAGE)) for r in range(ids.shape[0])]
    first, last = sum(runs[:begin]), sum(runs[:end])
    counts = grid.prod(-1).tolist()
    return pixels[sum(counts[:first]):sum(counts[:last])], grid[first:last]


def forward(model, ids, pixels, grid):
    """Logits of the model on its own device (pixel_values in its dtype, as transformers casts)."""
    device = next(model.parameters()).device
    ids = ids.to(device)
    return model(input_ids=ids, pixel_values=pixels.to(device), image_grid_thw=grid.to(device),
                 mm_token_type_ids=(ids == IMAGE).int()).logits


def hf_reference(directory, ids, targets, pixels, grid, grad_accum, dtype=torch.float32,
                 device="cpu", optimizer=None):
    """Logits, loss and grads as transformers computes them in `dtype` on `device`, with
    `optimizer` also the parameters after its step; returned in fp32 on the CPU."""
    model = load_hf(directory, dtype, device)
    with torch.no_grad():
        logits = forward(model, ids, pixels, grid).float().cpu()
    params = dict(model.named_parameters())
    rows = ids.shape[0] // grad_accum
    loss_sum = 0.0
    for i in range(grad_accum):
        pv, gr = images_of_rows(ids, pixels, grid, i * rows, (i + 1) * rows)
        sl = slice(i * rows, (i + 1) * rows)
        out = forward(model, ids[sl], pv, gr).float()
        # transformers' ForCausalLMLoss given shift_labels: mean over the scored targets.
        loss = torch.nn.functional.cross_entropy(out.view(-1, VOCAB),
                                                 targets[sl].reshape(-1).to(device),
                                                 ignore_index=-100)
        (loss / grad_accum).backward()
        loss_sum += loss.item()
    grads = {disk_name(n): p.grad.detach().float().cpu().clone() for n, p in params.items()}
    ref = (logits, loss_sum / grad_accum, grads)
    if optimizer is None:
        return ref
    return ref + ({disk_name(n): t for n, t in optimizer_step(params, 0.0, optimizer).items()},)


def hf_step_with(directory, got):
    """transformers' parameters after one AdamW step taken with memplan's gradients."""
    params = dict(load_hf(directory).named_parameters())
    for n, p in params.items():
        p.grad = got["grad." + disk_name(n)].clone()
    return {disk_name(n): t for n, t in optimizer_step(params, 0.0, "adamw").items()}


def compare(tally, label, out_path, ref, low=None):
    """Judges one memplan run against the reference: fp32_judge, or with `low` (transformers' bf16
    run) hf_parity_test.py's bf16_judge against the fp32 `ref`."""
    got = load_file(out_path)
    judge = fp32_judge if low is None else bf16_judge
    low = low or ref
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
        visual = sum(1 for n in ref[index] if n.startswith("visual."))
        tally.check(f"{label} {what}", not missing and ratio <= 1,
                    f"{len(ref[index])} tensors ({visual} of the vision tower), worst {name}: "
                    f"{detail}" + (f", missing {missing}" if missing else ""))


def precision_args(dtype, device):
    """The tool's dtype, device and optimizer flags: pure-bf16 AdamW at bf16 (hf_parity_test.py)."""
    return ["--dtype", dtype, "--device", device] + (
        ["--optimizer", "adamw_bf16"] if dtype == "bf16" else [])


def precision_tag(dtype, device):
    return f", {dtype} {device}" if dtype != "fp32" or device != "cpu" else ""


def run_checkpoint(tally, tool, work, name, tie, seed, dtype, device):
    ckpt = os.path.join(work, name)
    write_checkpoint(ckpt, arch_of(name), tie, seed)
    bf16 = dtype == "bf16"
    hyper = ["--lr", str(LR), "--beta1", str(BETAS[0]), "--beta2", str(BETAS[1]),
             "--eps", str(EPS), "--weight-decay", str(WD)] + precision_args(dtype, device)
    ids, targets, pixels, grid = batch(100 + seed)
    tok_path = os.path.join(work, f"{name}.tokens.safetensors")
    img_path = os.path.join(work, f"{name}.images.safetensors")
    save_file({"input_ids": ids, "targets": targets}, tok_path)
    save_file({"pixel_values": pixels, "image_grid_thw": grid}, img_path)
    refs = {}
    for plan, plan_args in PLANS:
        grad_accum = int(plan_args[plan_args.index("--grad-accum") + 1]) \
            if "--grad-accum" in plan_args else 1
        if grad_accum not in refs:
            # fp32: the step is torch's AdamW on memplan's gradients (hf_step_with below). bf16:
            # the fp32 truth and transformers' own bf16 run, the yardstick, each with its step.
            refs[grad_accum] = (
                hf_reference(ckpt, ids, targets, pixels, grid, grad_accum, torch.float32, device,
                             "adamw" if bf16 else None),
                hf_reference(ckpt, ids, targets, pixels, grid, grad_accum, torch.bfloat16,
                             device, "adamw_bf16") if bf16 else None)
        tag = f"{name}.{dtype}.{plan}"
        out = os.path.join(work, f"{tag}.out.safetensors")
        save_hf = os.path.join(work, f"{tag}.saved")
        rc, log = run_tool(tool, ["--model", ckpt, "--tokens", tok_path, "--images", img_path,
                                  "--out", out, "--save-hf", save_hf] + hyper + plan_args)
        label = f"{name} [{plan}{precision_tag(dtype, device)}]"
        tally.check(f"{label} runs", rc == 0, log.strip().splitlines()[-1] if log.strip() else "")
        if rc != 0:
            continue
        ref32, low = refs[grad_accum]
        if not bf16:
            ref32 = ref32 + (hf_step_with(ckpt, load_file(out)),)
        compare(tally, label, out, ref32, low)
        if plan == "plain":
            with torch.no_grad():
                got = forward(load_hf(save_hf, TORCH_DTYPES[dtype], device), ids, pixels, grid)
                ref_model = load_hf(ckpt, TORCH_DTYPES[dtype], device)
                post = load_file(out)
                for n, p in ref_model.named_parameters():
                    p.copy_(post["param." + disk_name(n)])
                want = forward(ref_model, ids, pixels, grid)
            err = rel_err(got.float().cpu(), want.float().cpu())
            tally.check(f"{label} saved checkpoint loads in transformers", err <= REL_TOL,
                        f"logits rel err {err:.2e}")

    # Image tokens without their images are refused, never run as text.
    out = os.path.join(work, f"{name}.no-images.out.safetensors")
    rc, log = run_tool(tool, ["--model", ckpt, "--tokens", tok_path, "--out", out, "--plain"]
                       + precision_args(dtype, device))
    tally.check(f"{name} image tokens without images refused", rc != 0 and "image" in log,
                log.strip().splitlines()[-1] if log.strip() else f"exit {rc}")


LORA_PLANS = [
    ("plain", ["--plain"]),
    ("grouped-ckpt", ["--block-modes", "ckpt,ckpt,ckpt"]),
    ("managed-offload", ["--chunk-kib", "96", "--n-persist", "1", "--n-buffer", "2",
                         "--block-modes", "ckpt,swap,none"]),
]


def peft_name(name):
    """peft's in-memory adapter name -> memplan's."""
    name = name.replace("base_model.model.", "", 1).replace(".default.", ".")
    return disk_name(name)


def lora_model(ckpt, adapter_dir=None, dtype=torch.float32, device="cpu"):
    """peft over transformers' model in `dtype`; the adapters in it too (memplan's are)."""
    base = load_hf(ckpt, dtype, device)
    if adapter_dir is not None:
        return peft.PeftModel.from_pretrained(base, adapter_dir, is_trainable=True,
                                              autocast_adapter_dtype=False).train()
    config = peft.LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0,
                             target_modules=["q_proj", "v_proj"])
    return peft.get_peft_model(base, config, autocast_adapter_dtype=False).train()


def lora_reference(ckpt, initial, ids, targets, pixels, grid, dtype, device, optimizer):
    """peft's logits, loss and adapter grads from the initial adapter in `dtype` on `device`, with
    `optimizer` also the adapters after its step; returned in fp32 on the CPU."""
    model = lora_model(ckpt, initial, dtype, device)
    with torch.no_grad():
        logits = forward(model, ids, pixels, grid).float().cpu()
    out = forward(model, ids, pixels, grid).float()
    loss = torch.nn.functional.cross_entropy(out.view(-1, VOCAB), targets.reshape(-1).to(device),
                                             ignore_index=-100)
    loss.backward()
    trainable = {n: p for n, p in model.named_parameters() if p.requires_grad}
    grads = {peft_name(n): p.grad.detach().float().cpu().clone() for n, p in trainable.items()}
    ref = (logits, loss.item(), grads)
    if optimizer is None:
        return ref
    return ref + ({peft_name(n): t for n, t in optimizer_step(trainable, 0.0, optimizer).items()},)


def run_lora(tally, tool, work, name, seed, dtype, device):
    ckpt = os.path.join(work, name)
    bf16 = dtype == "bf16"
    model = lora_model(ckpt)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_" in n:
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
    initial = os.path.join(work, f"{name}.lora-initial")
    model.save_pretrained(initial)
    ids, targets, pixels, grid = batch(300 + seed)
    tok_path = os.path.join(work, f"{name}.lora.tokens.safetensors")
    img_path = os.path.join(work, f"{name}.lora.images.safetensors")
    save_file({"input_ids": ids, "targets": targets}, tok_path)
    save_file({"pixel_values": pixels, "image_grid_thw": grid}, img_path)
    # fp32: the step is torch's AdamW on memplan's gradients (below). bf16: the fp32 truth and
    # peft's own bf16 run, each with its step.
    ref = lora_reference(ckpt, initial, ids, targets, pixels, grid, torch.float32, device,
                         "adamw" if bf16 else None)
    low = lora_reference(ckpt, initial, ids, targets, pixels, grid, torch.bfloat16, device,
                         "adamw_bf16") if bf16 else None
    hyper = ["--lr", str(LR), "--beta1", str(BETAS[0]), "--beta2", str(BETAS[1]),
             "--eps", str(EPS), "--weight-decay", str(WD), "--lora-rank", "4", "--lora-alpha",
             "8", "--lora-targets", "q_proj,v_proj", "--load-adapter", initial]
    hyper += precision_args(dtype, device)
    for plan, plan_args in LORA_PLANS:
        label = f"{name} LoRA q_proj,v_proj [{plan}{precision_tag(dtype, device)}]"
        out_path = os.path.join(work, f"{name}.lora.{dtype}.{plan}.out.safetensors")
        saved = os.path.join(work, f"{name}.lora.{dtype}.{plan}.adapter")
        rc, log = run_tool(tool, ["--model", ckpt, "--tokens", tok_path, "--images", img_path,
                                  "--out", out_path, "--save-adapter", saved] + hyper + plan_args)
        tally.check(f"{label} runs", rc == 0, log.strip().splitlines()[-1] if log.strip() else "")
        if rc != 0:
            continue
        got = load_file(out_path)
        if bf16:
            compare(tally, label, out_path, ref, low)
            if plan == "plain":
                # peft loads the adapter memplan saved: the logits of peft's bf16 model holding
                # memplan's post-step adapters.
                with torch.no_grad():
                    loaded = peft.PeftModel.from_pretrained(
                        load_hf(ckpt, torch.bfloat16, device), saved, autocast_adapter_dtype=False)
                    got_logits = forward(loaded, ids, pixels, grid)
                    holder = lora_model(ckpt, initial, torch.bfloat16, device)
                    for n, p in holder.named_parameters():
                        if p.requires_grad:
                            p.copy_(got["param." + peft_name(n)])
                    want_logits = forward(holder, ids, pixels, grid)
                err = rel_err(got_logits.float().cpu(), want_logits.float().cpu())
                tally.check(f"{label} saved adapter loads in peft", err <= REL_TOL,
                            f"logits rel err {err:.2e}")
            continue
        # The step: torch's AdamW over peft's trainable parameters with memplan's gradients.
        stepper = lora_model(ckpt, initial)
        params = {n: p for n, p in stepper.named_parameters() if p.requires_grad}
        for n, p in params.items():
            p.grad = got["grad." + peft_name(n)].clone()
        stepped = {peft_name(n): t for n, t in optimizer_step(params, 0.0, "adamw").items()}
        compare(tally, label, out_path, ref + (stepped,))
        if plan == "plain":
            # peft loads the adapter memplan saved: the logits of memplan's post-step values.
            with torch.no_grad():
                loaded = peft.PeftModel.from_pretrained(load_hf(ckpt), saved)
                got_logits = forward(loaded, ids, pixels, grid)
                want_logits = forward(stepper, ids, pixels, grid)
            err = rel_err(got_logits, want_logits)
            tally.check(f"{label} saved adapter loads in peft", err <= REL_TOL,
                        f"logits rel err {err:.2e}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tool", required=True, help="memplan-hf-parity binary")
    parser.add_argument("--work", help="scratch directory (default: a temporary one)")
    parser.add_argument("--arch", choices=sorted(MODEL_CLASSES),
                        help="check only this family (default: every one)")
    parser.add_argument("--dtype", choices=sorted(TORCH_DTYPES), default="fp32",
                        help="fp32 (default; 1e-5 relative) or bf16 (hf_parity_test.py's bound)")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    args = parser.parse_args()
    if args.device == "cpu":
        torch.set_num_threads(2)
    work = args.work or tempfile.mkdtemp(prefix="memplan-vl-parity-")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    print(f"transformers {transformers.__version__}, torch {torch.__version__}, work dir {work}")
    tally = Tally()
    at = (args.dtype, args.device)
    if args.arch in (None, "qwen2_5_vl"):
        run_checkpoint(tally, args.tool, work, "qwen2_5_vl-untied", False, 1, *at)
        run_checkpoint(tally, args.tool, work, "qwen2_5_vl-tied", True, 2, *at)
        run_lora(tally, args.tool, work, "qwen2_5_vl-untied", 3, *at)
    if args.arch in (None, "qwen2_vl"):
        run_checkpoint(tally, args.tool, work, "qwen2_vl-untied", False, 4, *at)
        run_lora(tally, args.tool, work, "qwen2_vl-untied", 5, *at)
    print(f"{tally.passed} passed, {len(tally.failed)} failed")
    if tally.failed:
        print("failed: " + ", ".join(tally.failed))
    return 1 if tally.failed else 0


if __name__ == "__main__":
    sys.exit(main())
