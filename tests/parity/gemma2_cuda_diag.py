#!/usr/bin/env python3
"""Where memplan and transformers part in low precision for one parity checkpoint, on one device.

Writes the checkpoint as hf_parity_test.py does (same config, same seed, same tokens) and prints:
  1. the attention implementation transformers picks for it by default on --device, and whether
     that run agrees with the eager one: per decoder layer's hidden state, then logits and loss
     (fp32 and --dtype). An attention that drops Gemma 2's soft cap shows here as an O(1) gap.
  2. the agent's tile math for one attention layer (agent/model/attention.cc), at --dtype on
     --device against fp32: for Gemma 2 its eager tiles (grouped-query product, scale, cap, -inf
     mask, fp32 softmax cast back, product with v) beside transformers' eager_attention_forward;
     for another family's sliding checkpoint its SDPA tiles (key and value gradients summed over
     tiles) beside transformers' one sdpa call. Output and the gradients of q, k and v.
  3. with --tool (memplan-hf-parity built for the device): memplan's logits, loss and every
     gradient (plain plan) against transformers eager in fp32, beside transformers' own error at
     --dtype, per tensor in layer order.

  gemma2_cuda_diag.py [--tool build-gpu/tests/parity/memplan-hf-parity] [--checkpoint NAME]
                      [--device cuda] [--dtype bf16] [--work DIR]
"""

import argparse
import os
import re
import sys
import tempfile

import torch
import transformers
from safetensors.torch import load_file, save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_parity_test as parity  # noqa: E402

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def seed_of(name):
    """The seed hf_parity_test.main() gives checkpoint `name`."""
    dense = sorted(n for n in parity.CHECKPOINTS if n not in parity.FIXED_SEEDS)
    return dict(zip(dense, range(1, len(dense) + 1)), **parity.FIXED_SEEDS)[name]


def load(directory, dtype, device, attn):
    kwargs = {} if attn == "default" else {"attn_implementation": attn}
    model = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=dtype, **kwargs)
    return model.to(device).train()


def forward(directory, dtype, device, attn, ids, targets):
    """(implementation, hidden states, logits, loss, grads by checkpoint name) of one run."""
    model = load(directory, dtype, device, attn)
    ids, targets = ids.to(device), targets.to(device)
    out = model(input_ids=ids, labels=targets, shift_labels=targets, output_hidden_states=True)
    out.loss.backward()
    family, experts = parity.moe_of(model)
    grads = parity.to_checkpoint_names(
        {n: p.grad.detach().float().cpu() for n, p in model.named_parameters()}, family, experts)
    hidden = [h.detach().float().cpu() for h in out.hidden_states]
    return (model.config._attn_implementation, hidden, out.logits.detach().float().cpu(),
            out.loss.item(), grads)


def report_reference(directory, dtype, device, ids, targets):
    """Section 1. Returns fp32 eager's and --dtype eager's runs for section 3."""
    runs = {}
    for attn in ("default", "eager"):
        for dt in (torch.float32, dtype):
            runs[(attn, dt)] = forward(directory, dt, device, attn, ids, targets)
    print(f"== 1. transformers on {device}: default attention "
          f"'{runs[('default', torch.float32)][0]}' against 'eager'")
    for dt in dict.fromkeys((torch.float32, dtype)):
        d, e = runs[("default", dt)], runs[("eager", dt)]
        layers = " ".join(f"{parity.rel_err(a, b):.1e}" for a, b in zip(d[1][1:], e[1][1:]))
        print(f"  {str(dt):15} hidden per layer: {layers}")
        print(f"  {str(dt):15} logits {parity.rel_err(d[2], e[2]):.2e}, loss {d[3]:.6f} vs "
              f"{e[3]:.6f}")
    ref, low = runs[("eager", torch.float32)], runs[("eager", dtype)]
    for attn in ("default", "eager"):
        r = runs[(attn, dtype)]
        print(f"  {attn} {dtype} against fp32 eager: logits {parity.rel_err(r[2], ref[2]):.2e}, "
              f"loss {abs(r[3] - ref[3]):.2e}")
    return ref, low


def band_mask(rows, keys, offset, window, dtype, device):
    """TileMask of agent/model/attention.cc: 0 where the query sees the key, -inf elsewhere."""
    rel = torch.arange(keys, device=device)[None] - torch.arange(rows, device=device)[:, None]
    seen = (rel <= offset) & ((rel > offset - window) if window > 0 else True)
    return torch.zeros(rows, keys, dtype=dtype, device=device).masked_fill(~seen, float("-inf"))


def agent_tiles(q, k, v, window, scale, cap, tile_rows):
    """The agent's eager tile math (agent/model/attention.cc), operation for operation."""
    b, heads, seq, dim = q.shape
    kv_heads = k.shape[1]
    groups = heads // kv_heads
    out = []
    for t in range(0, seq, tile_rows):
        rows = min(tile_rows, seq - t)
        k0 = max(0, t - window + 1) if window > 0 else 0
        keys = t + rows - k0
        mask = band_mask(rows, keys, t - k0, window, q.dtype, q.device)
        qg = q[:, :, t:t + rows].reshape(b, kv_heads, groups * rows, dim)
        s = torch.matmul(qg, k[:, :, k0:t + rows].transpose(-1, -2)) * scale
        if cap > 0:
            s = torch.tanh(s / cap) * cap
        s = s.view(b, kv_heads, groups, rows, keys) + mask
        p = torch.softmax(s, -1, dtype=torch.float32).to(q.dtype)
        o = torch.matmul(p.view(b, kv_heads, groups * rows, keys), v[:, :, k0:t + rows])
        out.append(o.view(b, heads, rows, dim))
    return torch.cat(out, 2)


def hf_eager(q, k, v, window, scale, cap):
    """transformers' Gemma 2 eager_attention_forward with its mask (dtype minimum added)."""
    from transformers.models.gemma2 import modeling_gemma2 as g2
    seq = q.shape[2]
    i = torch.arange(seq, device=q.device)[:, None]
    j = torch.arange(seq, device=q.device)[None]
    seen = j <= i
    if window > 0:
        seen &= i - j < window
    mask = torch.zeros(seq, seq, dtype=q.dtype, device=q.device).masked_fill(
        ~seen, torch.finfo(q.dtype).min)[None, None]
    module = torch.nn.Module()
    module.num_key_value_groups = q.shape[1] // k.shape[1]
    module.training = False
    out, _ = g2.eager_attention_forward(module, q, k, v, mask, dropout=0.0, scaling=scale,
                                        softcap=cap if cap > 0 else None)
    return out.transpose(1, 2)  # back to [batch, heads, seq, dim]


def agent_sdpa_tiles(q, k, v, grad, window, fp32_group_sum):
    """CausalAttention's windowed tiles (agent/model/attention.cc): forward per tile, backward by
    recomputing each tile under autograd, key and value gradients summed over tiles in fp32. With
    fp32_group_sum the grouped heads' key and value gradients are also summed in fp32 (instead of
    through repeat_interleave's backward in the dtype). Returns (out, dq, dk, dv)."""
    groups = q.shape[1] // k.shape[1]
    seq, rows_max = q.shape[2], max(1, min(window, 1024))
    out, dq = torch.empty_like(q), torch.empty_like(q)
    dk = torch.zeros(k.shape, dtype=torch.float32, device=k.device)
    dv = torch.zeros_like(dk)
    for t in range(0, seq, rows_max):
        rows = min(rows_max, seq - t)
        k0 = max(0, t - window + 1)
        mask = band_mask(rows, t + rows - k0, t - k0, window, q.dtype, q.device)
        qt = q[:, :, t:t + rows].detach().requires_grad_(True)
        kt = k[:, :, k0:t + rows].detach().requires_grad_(True)
        vt = v[:, :, k0:t + rows].detach().requires_grad_(True)
        kr, vr = kt.repeat_interleave(groups, 1), vt.repeat_interleave(groups, 1)
        if fp32_group_sum:
            kr, vr = kr.detach().requires_grad_(True), vr.detach().requires_grad_(True)
        o = torch.nn.functional.scaled_dot_product_attention(qt, kr, vr, attn_mask=mask)
        out[:, :, t:t + rows] = o.detach()
        wrt = (qt, kr, vr) if fp32_group_sum else (qt, kt, vt)
        g = torch.autograd.grad(o, wrt, grad[:, :, t:t + rows])
        dq[:, :, t:t + rows] = g[0]
        for acc, gi in ((dk, g[1]), (dv, g[2])):
            if fp32_group_sum:
                b, _, keys, d = gi.shape
                gi = gi.view(b, -1, groups, keys, d).sum(2, dtype=torch.float32)
            acc[:, :, k0:t + rows] += gi
    return out, dq, dk.to(k.dtype), dv.to(v.dtype)


def hf_sdpa(q, k, v, grad, window):
    """transformers' sdpa path for a sliding layer: repeated kv heads, one call over the whole
    sequence under a boolean mask. Returns (out, dq, dk, dv)."""
    from transformers.models.qwen2 import modeling_qwen2 as q2
    q, k, v = (x.detach().requires_grad_(True) for x in (q, k, v))
    groups = q.shape[1] // k.shape[1]
    seq = q.shape[2]
    i = torch.arange(seq, device=q.device)[:, None]
    j = torch.arange(seq, device=q.device)[None]
    seen = (j <= i) & (i - j < window)
    o = torch.nn.functional.scaled_dot_product_attention(
        q, q2.repeat_kv(k, groups), q2.repeat_kv(v, groups), attn_mask=seen)
    return (o.detach(),) + torch.autograd.grad(o, (q, k, v), grad)


def report_sdpa_tiles(config, dtype, device, trials=20):
    """Section 2 for a sliding checkpoint of another family: CausalAttention's SDPA tiles against
    transformers' one sdpa call, both at --dtype, judged against fp32, averaged over trials."""
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    window = config.sliding_window
    print(f"== 2. one sliding attention layer on {device} (window {window}, {heads} heads over "
          f"{kv_heads}): mean error against fp32 over {trials} draws")
    g = torch.Generator().manual_seed(5)
    names = ("hf sdpa", "agent tiles", "agent tiles, fp32 group sum")
    sums = {n: [0.0] * 4 for n in names}
    for _ in range(trials):
        shape = lambda h: (2, h, parity.SEQ, dim)  # noqa: E731
        base = [torch.randn(shape(h), generator=g) for h in (heads, kv_heads, kv_heads)]
        grad = torch.randn(shape(heads), generator=g)
        cast = lambda dt: [x.to(device, dt) for x in base + [grad]]  # noqa: E731
        want = hf_sdpa(*cast(torch.float32), window)
        runs = {"hf sdpa": hf_sdpa(*cast(dtype), window),
                "agent tiles": agent_sdpa_tiles(*cast(dtype), window, False),
                "agent tiles, fp32 group sum": agent_sdpa_tiles(*cast(dtype), window, True)}
        for n, got in runs.items():
            for idx, (a, b) in enumerate(zip(got, want)):
                sums[n][idx] += parity.rel_err(a.float().cpu(), b.float().cpu()) / trials
    for n in names:
        errs = ", ".join(f"{label} {e:.2e}" for label, e in zip(("out", "dq", "dk", "dv"),
                                                              sums[n]))
        print(f"  {n:28} {errs}")


def report_attention(config, dtype, device):
    """Section 2: one layer's attention, the agent's tiles against transformers' eager."""
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    dim = getattr(config, "head_dim", config.hidden_size // heads)
    scale = (getattr(config, "query_pre_attn_scalar", None) or dim) ** -0.5
    cap = getattr(config, "attn_logit_softcapping", None) or 0.0
    window = getattr(config, "sliding_window", None) or 0
    g = torch.Generator().manual_seed(5)
    shape = lambda h: (2, h, parity.SEQ, dim)  # noqa: E731
    base = [torch.randn(shape(h), generator=g) * 2 for h in (heads, kv_heads, kv_heads)]
    grad = torch.randn(shape(heads), generator=g)
    print(f"== 2. one attention layer on {device} (window {window}, cap {cap}, scale "
          f"{scale:.4f}): error against fp32 eager")
    results = {}
    for name, fn in (("agent tiles", lambda q, k, v, w: agent_tiles(q, k, v, w, scale, cap, 7)),
                     ("hf eager", lambda q, k, v, w: hf_eager(q, k, v, w, scale, cap))):
        for dt in (torch.float32, dtype):
            for w in dict.fromkeys((0, window)):
                q, k, v = (x.to(device, dt).detach().clone().requires_grad_(True) for x in base)
                out = fn(q, k, v, w)
                out.backward(grad.to(device, dt))
                results[(name, dt, w)] = [t.detach().float().cpu()
                                          for t in (out, q.grad, k.grad, v.grad)]
    for w in dict.fromkeys((0, window)):
        want = results[("hf eager", torch.float32, w)]
        for name in ("agent tiles", "hf eager"):
            for dt in dict.fromkeys((torch.float32, dtype)):
                got = results[(name, dt, w)]
                errs = ", ".join(f"{label} {parity.rel_err(a, b):.2e}"
                                 for label, a, b in zip(("out", "dq", "dk", "dv"), got, want))
                print(f"  window {w:3} {name:11} {str(dt):15} {errs}")


def layer_key(name):
    m = re.search(r"layers\.(\d+)\.", name)
    return (int(m.group(1)) if m else -1, name)


def report_tool(tool, directory, work, dtype_flag, device, ids, targets, ref, low):
    """Section 3: memplan's plain run against fp32 eager, beside transformers' own error."""
    tok = os.path.join(work, "tokens.safetensors")
    save_file({"input_ids": ids, "targets": targets}, tok)
    out = os.path.join(work, "memplan.out.safetensors")
    args = ["--model", directory, "--tokens", tok, "--out", out, "--dtype", dtype_flag,
            "--device", device, "--plain", "--lr", str(parity.LR), "--optimizer",
            "adamw_bf16" if dtype_flag == "bf16" else "adamw"]
    rc, log = parity.run_tool(tool, args)
    if rc != 0:
        print(f"== 3. {tool} failed (exit {rc}):\n{log}")
        return
    got = load_file(out)
    print(f"== 3. memplan ({dtype_flag}, plain) against transformers eager fp32; "
          "transformers' own error beside it")
    print(f"  logits: memplan {parity.rel_err(got['logits'], ref[2]):.2e}, transformers "
          f"{parity.rel_err(low[2], ref[2]):.2e}")
    print(f"  loss:   memplan {got['loss'].item():.6f}, transformers {low[3]:.6f}, fp32 "
          f"{ref[3]:.6f}")
    for name in sorted(ref[4], key=layer_key):
        if "grad." + name not in got:
            print(f"  {name}: missing")
            continue
        mine = parity.rel_err(got["grad." + name], ref[4][name])
        theirs = parity.rel_err(low[4][name], ref[4][name])
        flag = "  <==" if mine > parity.BF16_FACTOR * theirs + parity.BF16_FLOOR else ""
        print(f"  {name:50} memplan {mine:.2e}  transformers {theirs:.2e}{flag}")


def main():
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n")[0],
        epilog="example: python3 tests/parity/gemma2_cuda_diag.py --tool "
        "build-gpu/tests/parity/memplan-hf-parity --device cuda")
    parser.add_argument("--tool", help="memplan-hf-parity binary (section 3 runs only with it)")
    parser.add_argument("--checkpoint", default="gemma2-softcap-window",
                        choices=sorted(parity.CHECKPOINTS), help="a checkpoint of hf_parity_test")
    parser.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    parser.add_argument("--dtype", default="bf16", choices=["bf16", "fp16"])
    parser.add_argument("--work", help="scratch directory (default: a temporary one)")
    args = parser.parse_args()
    work = args.work or tempfile.mkdtemp(prefix="memplan-diag-")
    os.makedirs(work, exist_ok=True)
    print(f"transformers {transformers.__version__}, torch {torch.__version__}, "
          f"device {args.device}, work dir {work}")
    family, overrides, edit = parity.CHECKPOINTS[args.checkpoint]
    directory = os.path.join(work, args.checkpoint)
    seed = seed_of(args.checkpoint)
    if not os.path.isdir(directory):
        parity.write_checkpoint(directory, family, overrides, edit, seed)
    ids, targets = parity.tokens(100 + seed, parity.ROWS)
    dtype = DTYPES[args.dtype]
    ref, low = report_reference(directory, dtype, args.device, ids, targets)
    config = transformers.AutoConfig.from_pretrained(directory)
    if family == "gemma2":
        report_attention(config, dtype, args.device)
    elif getattr(config, "sliding_window", None):
        report_sdpa_tiles(config, dtype, args.device)
    if args.tool:
        report_tool(args.tool, directory, work, args.dtype, args.device, ids, targets, ref, low)
    return 0


if __name__ == "__main__":
    sys.exit(main())
