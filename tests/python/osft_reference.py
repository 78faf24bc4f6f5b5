#!/usr/bin/env python3
"""Reference math of orthogonal subspace fine-tuning (OSFT, "Sculpting Subspaces", Nayak et al.
2025), written from the method, in plain PyTorch, to check memplan-agent's OSFT against.

For each targeted projection weight W [out, in] (fp32 SVD, W = U diag(S) V^T, r = min(out, in)):
  * rank ratio R in (0, 1) is the fraction of the spectrum that trains:
      k_high = clamp(floor((1 - R) * r), 1, r - 1), k_low = r - k_high;
    the k_high largest singular directions (U_high [out, k_high], S_high [k_high],
    V_high [in, k_high]) are frozen, the rest (U_low, S_low, V_low) are trainable parameters.
  * signs: each singular pair (u_i, v_i) is flipped so that the entry of u_i with the largest
    magnitude is positive (the SVD's sign is otherwise arbitrary; this makes it reproducible).
  * forward, never forming W: y = ((x V_high) * S_high) U_high^T + ((x V_low) * S_low) U_low^T (+ b).
  * after backward, the low factors' gradients are projected orthogonal to the frozen subspaces, in
    factored form (no k x k Gram matrix, no out x out projector):
      dU_low -= U_high (U_high^T dU_low),  dV_low -= V_high (V_high^T dV_low);  dS_low as it is.
  * then AdamW (torch.optim.AdamW) on the low factors only.

Parameter names (memplan's): "<module path>.osft_{u,s,v}_{high,low}", e.g.
"model.layers.0.self_attn.q_proj.osft_u_low".

Run as a script: a self-check on a tiny random Llama (fp32, CPU): the factorized forward equals the
dense one before any step, the projected gradients are orthogonal to the frozen subspaces, and two
AdamW steps lower the loss. Exits non-zero on a failure.
"""

import math
import sys

import torch

ALL_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
SUFFIXES = ("u_high", "s_high", "v_high", "u_low", "s_low", "v_low")


def split_ranks(out_features, in_features, rank_ratio):
    """(k_high, k_low) for a [out, in] weight at rank ratio R (the trainable fraction)."""
    r = min(out_features, in_features)
    k_high = min(max(int(math.floor((1.0 - rank_ratio) * r)), 1), r - 1)
    return k_high, r - k_high


def svd_split(weight, rank_ratio):
    """The six factors of `weight` (any float dtype), fp32 SVD, returned in the weight's dtype."""
    w = weight.detach().to(torch.float32)
    u, s, vh = torch.linalg.svd(w, full_matrices=False)
    v = vh.transpose(0, 1)
    # Canonical signs: the largest-magnitude entry of every left singular vector positive.
    idx = u.abs().argmax(dim=0, keepdim=True)
    signs = torch.sign(torch.gather(u, 0, idx))
    signs[signs == 0] = 1
    u = u * signs
    v = v * signs
    k_high, _ = split_ranks(w.shape[0], w.shape[1], rank_ratio)
    dt = weight.dtype
    return {
        "u_high": u[:, :k_high].contiguous().to(dt),
        "s_high": s[:k_high].contiguous().to(dt),
        "v_high": v[:, :k_high].contiguous().to(dt),
        "u_low": u[:, k_high:].contiguous().to(dt),
        "s_low": s[k_high:].contiguous().to(dt),
        "v_low": v[:, k_high:].contiguous().to(dt),
    }


class OsftLinear(torch.nn.Module):
    """A linear layer held as frozen high and trainable low SVD factors."""

    def __init__(self, linear, rank_ratio):
        super().__init__()
        factors = svd_split(linear.weight, rank_ratio)
        for name in SUFFIXES:
            trainable = name.endswith("_low")
            self.register_parameter(name, torch.nn.Parameter(factors[name],
                                                             requires_grad=trainable))
        self.bias = linear.bias
        if self.bias is not None:
            self.bias.requires_grad_(False)

    def forward(self, x):
        shape = x.shape
        x2 = x.reshape(-1, shape[-1])
        high = torch.mm(x2, self.v_high) * self.s_high
        if self.bias is not None:
            y = torch.addmm(self.bias, high, self.u_high.t())
        else:
            y = torch.mm(high, self.u_high.t())
        low = torch.mm(x2, self.v_low) * self.s_low
        y = y + torch.mm(low, self.u_low.t())
        return y.reshape(*shape[:-1], y.shape[-1])

    @torch.no_grad()
    def project_grads(self):
        """Removes from the low factors' gradients their components in the frozen subspaces."""
        if self.u_low.grad is not None:
            self.u_low.grad -= self.u_high @ (self.u_high.t() @ self.u_low.grad)
        if self.v_low.grad is not None:
            self.v_low.grad -= self.v_high @ (self.v_high.t() @ self.v_low.grad)


def apply_osft(model, rank_ratio, targets=ALL_TARGETS):
    """Freezes every parameter of a transformers Llama-family model and replaces each targeted
    projection by an OsftLinear; returns {memplan name: trainable parameter} in memplan's order
    (block by block, modules in ALL_TARGETS order, u, s, v of the low part)."""
    for p in model.parameters():
        p.requires_grad_(False)
    trainable = {}
    for b, layer in enumerate(model.model.layers):
        for module in ALL_TARGETS:
            if module not in targets:
                continue
            parent = layer.self_attn if module in ALL_TARGETS[:4] else layer.mlp
            osft = OsftLinear(getattr(parent, module), rank_ratio)
            setattr(parent, module, osft)
            path = f"model.layers.{b}.{'self_attn' if module in ALL_TARGETS[:4] else 'mlp'}.{module}"
            for name in ("u_low", "s_low", "v_low"):
                trainable[f"{path}.osft_{name}"] = getattr(osft, name)
    return trainable


def osft_modules(model):
    return [m for m in model.modules() if isinstance(m, OsftLinear)]


def loss_of(model, ids, targets):
    """Mean cross-entropy (fp32) of the logits at t against targets[t] (already shifted)."""
    logits = model(input_ids=ids).logits.float()
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                             targets.reshape(-1), ignore_index=-100)


def train_steps(model, trainable, batches, steps, lr, betas, eps, weight_decay):
    """`steps` OSFT steps (every step: the micro-batches of `batches` accumulated, gradients
    projected, one AdamW update). Returns (losses per step, grads of the first step by name,
    trainable values after the last step by name)."""
    opt = torch.optim.AdamW(list(trainable.values()), lr=lr, betas=betas, eps=eps,
                            weight_decay=weight_decay)
    losses, first_grads = [], None
    for _ in range(steps):
        total = 0.0
        for ids, targets in batches:
            loss = loss_of(model, ids, targets)
            (loss / len(batches)).backward()
            total += loss.item()
        for m in osft_modules(model):
            m.project_grads()
        if first_grads is None:
            first_grads = {n: p.grad.detach().clone() for n, p in trainable.items()}
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(total / len(batches))
    return losses, first_grads, {n: p.detach().clone() for n, p in trainable.items()}


def tiny_llama(seed=0):
    import transformers
    config = transformers.LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        tie_word_embeddings=False)
    torch.manual_seed(seed)
    return transformers.LlamaForCausalLM(config).float().train()


def self_check():
    failures = []

    def check(label, ok, detail):
        print(f"{'ok  ' if ok else 'FAIL'} {label}: {detail}", flush=True)
        if not ok:
            failures.append(label)

    model = tiny_llama()
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 64, (2, 17), generator=g)
    ids, targets = ids[:, :-1].contiguous(), ids[:, 1:].contiguous()
    with torch.no_grad():
        dense = loss_of(model, ids, targets).item()
    trainable = apply_osft(model, 0.5)
    with torch.no_grad():
        factored = loss_of(model, ids, targets).item()
    check("factorized forward equals dense", abs(factored - dense) <= 1e-5 * abs(dense),
          f"{factored:.8f} vs {dense:.8f}")
    k_high, k_low = split_ranks(48, 32, 0.5)
    check("split ranks", (k_high, k_low) == (16, 16), f"{k_high}, {k_low}")
    losses, grads, _ = train_steps(model, trainable, [(ids, targets)], 3, 1e-3, (0.9, 0.95),
                                   1e-8, 0.1)
    worst = 0.0
    # After the steps the low factors have moved; the projection is checked on fresh gradients.
    loss_of(model, ids, targets).backward()
    for m in osft_modules(model):
        m.project_grads()
        worst = max(worst, (m.u_high.t() @ m.u_low.grad).abs().max().item() /
                    max(m.u_low.grad.abs().max().item(), 1e-30),
                    (m.v_high.t() @ m.v_low.grad).abs().max().item() /
                    max(m.v_low.grad.abs().max().item(), 1e-30))
    check("projected gradients orthogonal to the frozen subspaces", worst < 1e-5,
          f"max |U_high^T dU_low| relative {worst:.2e}")
    check("first-step gradients exist for every low factor", len(grads) == len(trainable),
          f"{len(grads)} of {len(trainable)}")
    check("loss decreases over the steps", losses[-1] < losses[0], f"{losses}")
    print(f"{'all passed' if not failures else f'{len(failures)} failed'}")
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(self_check())
