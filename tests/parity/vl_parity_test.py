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

  vl_parity_test.py --tool PATH [--work DIR] [--arch qwen2_5_vl|qwen2_vl]
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
from hf_parity_test import (BETAS, EPS, LR, REL_TOL, WD, Tally, fp32_judge,  # noqa: E402
                            optimizer_step, randomise, rel_err, run_tool)

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


def load_hf(directory):
    with open(os.path.join(directory, "config.json")) as f:
        arch = json.load(f)["model_type"]
    model = getattr(transformers, MODEL_CLASSES[arch]).from_pretrained(
        directory, dtype=torch.float32, attn_implementation="sdpa")
    return model.train()


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
    return model(input_ids=ids, pixel_values=pixels, image_grid_thw=grid,
                 mm_token_type_ids=(ids == IMAGE).int()).logits


def hf_reference(directory, ids, targets, pixels, grid, grad_accum):
    model = load_hf(directory)
    with torch.no_grad():
        logits = forward(model, ids, pixels, grid).float()
    params = dict(model.named_parameters())
    rows = ids.shape[0] // grad_accum
    loss_sum = 0.0
    for i in range(grad_accum):
        pv, gr = images_of_rows(ids, pixels, grid, i * rows, (i + 1) * rows)
        sl = slice(i * rows, (i + 1) * rows)
        out = forward(model, ids[sl], pv, gr).float()
        # transformers' ForCausalLMLoss given shift_labels: mean over the scored targets.
        loss = torch.nn.functional.cross_entropy(out.view(-1, VOCAB), targets[sl].reshape(-1),
                                                 ignore_index=-100)
        (loss / grad_accum).backward()
        loss_sum += loss.item()
    grads = {disk_name(n): p.grad.detach().clone() for n, p in params.items()}
    return logits, loss_sum / grad_accum, grads


def hf_step_with(directory, got):
    """transformers' parameters after one AdamW step taken with memplan's gradients."""
    params = dict(load_hf(directory).named_parameters())
    for n, p in params.items():
        p.grad = got["grad." + disk_name(n)].clone()
    return {disk_name(n): t for n, t in optimizer_step(params, 0.0, "adamw").items()}


def compare(tally, label, out_path, ref):
    got = load_file(out_path)
    ratio, detail = fp32_judge(got["logits"], ref[0], None)
    tally.check(f"{label} logits", ratio <= 1, detail)
    ratio, detail = fp32_judge(got["loss"], torch.tensor([ref[1]]), None)
    tally.check(f"{label} loss", ratio <= 1,
                f"memplan {got['loss'].item():.8f} transformers {ref[1]:.8f}, {detail}")
    for index, prefix, what in ((2, "grad.", "grads"), (3, "param.", "params after the step")):
        missing = [n for n in ref[index] if prefix + n not in got]
        judged = [fp32_judge(got[prefix + n], want, None) + (n,)
                  for n, want in ref[index].items() if prefix + n in got]
        ratio, detail, name = max(judged, key=lambda r: r[0], default=(0.0, "", ""))
        visual = sum(1 for n in ref[index] if n.startswith("visual."))
        tally.check(f"{label} {what}", not missing and ratio <= 1,
                    f"{len(ref[index])} tensors ({visual} of the vision tower), worst {name}: "
                    f"{detail}" + (f", missing {missing}" if missing else ""))


def run_checkpoint(tally, tool, work, name, tie, seed):
    ckpt = os.path.join(work, name)
    write_checkpoint(ckpt, arch_of(name), tie, seed)
    hyper = ["--lr", str(LR), "--beta1", str(BETAS[0]), "--beta2", str(BETAS[1]),
             "--eps", str(EPS), "--weight-decay", str(WD)]
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
            refs[grad_accum] = hf_reference(ckpt, ids, targets, pixels, grid, grad_accum)
        out = os.path.join(work, f"{name}.{plan}.out.safetensors")
        save_hf = os.path.join(work, f"{name}.{plan}.saved")
        rc, log = run_tool(tool, ["--model", ckpt, "--tokens", tok_path, "--images", img_path,
                                  "--out", out, "--save-hf", save_hf] + hyper + plan_args)
        label = f"{name} [{plan}]"
        tally.check(f"{label} runs", rc == 0, log.strip().splitlines()[-1] if log.strip() else "")
        if rc != 0:
            continue
        compare(tally, label, out, refs[grad_accum] + (hf_step_with(ckpt, load_file(out)),))
        if plan == "plain":
            with torch.no_grad():
                got = forward(load_hf(save_hf), ids, pixels, grid)
                ref_model = load_hf(ckpt)
                post = load_file(out)
                for n, p in ref_model.named_parameters():
                    p.copy_(post["param." + disk_name(n)])
                want = forward(ref_model, ids, pixels, grid)
            err = rel_err(got, want)
            tally.check(f"{label} saved checkpoint loads in transformers", err <= REL_TOL,
                        f"logits rel err {err:.2e}")

    # Image tokens without their images are refused, never run as text.
    out = os.path.join(work, f"{name}.no-images.out.safetensors")
    rc, log = run_tool(tool, ["--model", ckpt, "--tokens", tok_path, "--out", out, "--plain"])
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


def lora_model(ckpt, adapter_dir=None):
    base = load_hf(ckpt)
    if adapter_dir is not None:
        return peft.PeftModel.from_pretrained(base, adapter_dir, is_trainable=True).train()
    config = peft.LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0,
                             target_modules=["q_proj", "v_proj"])
    return peft.get_peft_model(base, config).train()


def run_lora(tally, tool, work, name, seed):
    ckpt = os.path.join(work, name)
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
    with torch.no_grad():
        logits = forward(model, ids, pixels, grid).float()
    out = forward(model, ids, pixels, grid).float()
    loss = torch.nn.functional.cross_entropy(out.view(-1, VOCAB), targets.reshape(-1),
                                             ignore_index=-100)
    loss.backward()
    trainable = {n: p for n, p in model.named_parameters() if p.requires_grad}
    grads = {peft_name(n): p.grad.detach().clone() for n, p in trainable.items()}
    ref = (logits, loss.item(), grads)
    hyper = ["--lr", str(LR), "--beta1", str(BETAS[0]), "--beta2", str(BETAS[1]),
             "--eps", str(EPS), "--weight-decay", str(WD), "--lora-rank", "4", "--lora-alpha",
             "8", "--lora-targets", "q_proj,v_proj", "--load-adapter", initial]
    for plan, plan_args in LORA_PLANS:
        label = f"{name} LoRA q_proj,v_proj [{plan}]"
        out_path = os.path.join(work, f"{name}.lora.{plan}.out.safetensors")
        saved = os.path.join(work, f"{name}.lora.{plan}.adapter")
        rc, log = run_tool(tool, ["--model", ckpt, "--tokens", tok_path, "--images", img_path,
                                  "--out", out_path, "--save-adapter", saved] + hyper + plan_args)
        tally.check(f"{label} runs", rc == 0, log.strip().splitlines()[-1] if log.strip() else "")
        if rc != 0:
            continue
        got = load_file(out_path)
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
    args = parser.parse_args()
    torch.set_num_threads(2)
    work = args.work or tempfile.mkdtemp(prefix="memplan-vl-parity-")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    print(f"transformers {transformers.__version__}, torch {torch.__version__}, work dir {work}")
    tally = Tally()
    if args.arch in (None, "qwen2_5_vl"):
        run_checkpoint(tally, args.tool, work, "qwen2_5_vl-untied", False, 1)
        run_checkpoint(tally, args.tool, work, "qwen2_5_vl-tied", True, 2)
        run_lora(tally, args.tool, work, "qwen2_5_vl-untied", 3)
    if args.arch in (None, "qwen2_vl"):
        run_checkpoint(tally, args.tool, work, "qwen2_vl-untied", False, 4)
        run_lora(tally, args.tool, work, "qwen2_vl-untied", 5)
    print(f"{tally.passed} passed, {len(tally.failed)} failed")
    if tally.failed:
        print("failed: " + ", ".join(tally.failed))
    return 1 if tally.failed else 0


if __name__ == "__main__":
    sys.exit(main())
