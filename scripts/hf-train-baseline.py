#!/usr/bin/env python3
"""Hugging Face transformers' own training step on one GPU, the baseline memplan is compared with.

A Llama/Qwen model from a memplan preset's shape (random init, bf16 parameters), trained the way a
transformers user runs it with `bf16: true` and gradient checkpointing: eager PyTorch (no
torch.compile), SDPA attention, torch.optim.AdamW(fused=True) on the bf16 parameters (the
Trainer's default "adamw_torch_fused"), clip_grad_norm_(1.0), random tokens with labels =
input_ids. Prints one JSON line: steady tokens/s (median over the steps after --warmup) and the
caching allocator's peak allocated / reserved bytes over those steps.

  hf-train-baseline.py --preset llama-3.2-1b --batch 4 --seq 2048 [--steps 15] [--warmup 3]
                       [--no-checkpointing] [--config config.json] [--fsdp2-offload | --fsdp2]
                       [--lora-rank R [--lora-alpha A] [--lora-targets all|q_proj,v_proj,...]]
                       [--qlora] [--optim adamw|adamw8bit] [--kernel-trace FILE]

--lora-rank: PEFT LoRA (get_peft_model, dropout 0) on the bf16 model; only the adapters train
(fused AdamW; PEFT keeps the adapter weights in fp32, its default autocast_adapter_dtype).
--qlora: the projections of every decoder layer become bitsandbytes Linear4bit (NF4, double
quantization, blocks of 64, bf16 compute) before PEFT wraps them, as a QLoRA user loads a model
with BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
bnb_4bit_use_double_quant=True, bnb_4bit_compute_dtype=bfloat16); embedding, norms and head stay
bf16 (prepare_model_for_kbit_training's fp32 upcast is not applied: it would add 4 bytes per
embedding and head parameter). The model is built on the meta device and each layer's random
weights are made on the GPU and quantized there, so a 32B model never exists whole in bf16.
--optim adamw8bit: bitsandbytes AdamW8bit instead of torch's AdamW.

--fsdp2-offload: PyTorch FSDP2 instead, one rank (NCCL): fully_shard on every decoder layer and
the root with CPUOffloadPolicy(pin_memory=True) and MixedPrecisionPolicy(bf16 parameters, fp32
reductions), fp32 parameters and torch.optim.AdamW on the host, gradient checkpointing as above:
the peer baseline for training a model larger than the card's share on one GPU.
--fsdp2: the same without CPUOffloadPolicy (fp32 parameters, grads and AdamW state sharded on the
GPUs). Under torchrun (`torchrun --nproc-per-node N hf-train-baseline.py --fsdp2 ...`) both run one
rank per GPU, --batch rows per rank; tokens/s counts every rank's tokens and the peaks are the
largest rank's.
"""

import argparse
import json
import statistics
import time

import torch
import transformers

# The shapes of memplan's presets (common/presets.cc) that this script is run with.
PRESETS = {
    "llama-3.2-1b": dict(model_type="llama", hidden_size=2048, intermediate_size=8192,
                         num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8,
                         vocab_size=128256, tie_word_embeddings=True, rms_norm_eps=1e-5,
                         max_position_embeddings=131072,
                         rope_parameters=dict(rope_type="llama3", rope_theta=500000.0,
                                              factor=32.0, low_freq_factor=1.0,
                                              high_freq_factor=4.0,
                                              original_max_position_embeddings=8192)),
    "llama-3.1-8b": dict(model_type="llama", hidden_size=4096, intermediate_size=14336,
                         num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                         vocab_size=128256, tie_word_embeddings=False, rms_norm_eps=1e-5,
                         max_position_embeddings=131072,
                         rope_parameters=dict(rope_type="llama3", rope_theta=500000.0,
                                              factor=8.0, low_freq_factor=1.0,
                                              high_freq_factor=4.0,
                                              original_max_position_embeddings=8192)),
    "qwen2.5-32b": dict(model_type="qwen2", hidden_size=5120, intermediate_size=27648,
                        num_hidden_layers=64, num_attention_heads=40, num_key_value_heads=8,
                        vocab_size=152064, tie_word_embeddings=False, rms_norm_eps=1e-6,
                        max_position_embeddings=32768, rope_theta=1000000.0),
    "qwen3-32b": dict(model_type="qwen3", hidden_size=5120, intermediate_size=25600,
                      num_hidden_layers=64, num_attention_heads=64, num_key_value_heads=8,
                      head_dim=128, vocab_size=151936, tie_word_embeddings=False,
                      rms_norm_eps=1e-6, max_position_embeddings=40960, rope_theta=1000000.0),
    "qwen2.5-0.5b": dict(model_type="qwen2", hidden_size=896, intermediate_size=4864,
                         num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                         vocab_size=151936, tie_word_embeddings=True, rms_norm_eps=1e-6,
                         max_position_embeddings=32768, rope_theta=1000000.0),
    "llama-3.2-3b": dict(model_type="llama", hidden_size=3072, intermediate_size=8192,
                         num_hidden_layers=28, num_attention_heads=24, num_key_value_heads=8,
                         vocab_size=128256, tie_word_embeddings=True, rms_norm_eps=1e-5,
                         max_position_embeddings=131072,
                         rope_parameters=dict(rope_type="llama3", rope_theta=500000.0,
                                              factor=32.0, low_freq_factor=1.0,
                                              high_freq_factor=4.0,
                                              original_max_position_embeddings=8192)),
}


def quantized_model(config):
    """The model with every decoder projection as an NF4 Linear4bit, built layer by layer."""
    import bitsandbytes as bnb
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    g = torch.Generator(device="cuda").manual_seed(0)

    def random_(shape, std=0.02):
        return torch.empty(shape, device="cuda", dtype=torch.bfloat16).normal_(0, std,
                                                                               generator=g)

    for layer in model.model.layers:
        for parent in (layer.self_attn, layer.mlp):
            for name, child in list(parent.named_children()):
                if not isinstance(child, torch.nn.Linear):
                    continue
                q = bnb.nn.Linear4bit(child.in_features, child.out_features,
                                      bias=child.bias is not None, compute_dtype=torch.bfloat16,
                                      quant_type="nf4", compress_statistics=True, device="meta")
                weight = random_((child.out_features, child.in_features))
                q.weight = bnb.nn.Params4bit(weight.cpu(), requires_grad=False,
                                             quant_type="nf4", compress_statistics=True,
                                             blocksize=64).cuda()
                if child.bias is not None:
                    q.bias = torch.nn.Parameter(torch.zeros(child.out_features, device="cuda",
                                                            dtype=torch.bfloat16),
                                                requires_grad=False)
                setattr(parent, name, q)
    # Everything still on meta (embedding, norms, head, rotary buffers): materialise on the GPU.
    for module in model.modules():
        for name, p in list(module.named_parameters(recurse=False)):
            if p.is_meta:
                value = (torch.ones(p.shape, device="cuda", dtype=torch.bfloat16) if p.dim() == 1
                         else random_(p.shape))
                setattr(module, name, torch.nn.Parameter(value, requires_grad=False))
        for name, b in list(module.named_buffers(recurse=False)):
            if b.is_meta:
                module._buffers[name] = torch.empty_like(b, device="cuda")
    model.model.rotary_emb.__init__(config, device="cuda")
    if config.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    return model


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--preset", default="llama-3.2-1b", choices=sorted(PRESETS))
    p.add_argument("--config", help="a config.json instead of a preset")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--steps", type=int, default=15)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--no-checkpointing", action="store_true")
    p.add_argument("--fsdp2-offload", action="store_true")
    p.add_argument("--fsdp2", action="store_true", help="FSDP2 without CPU offload")
    p.add_argument("--lora-rank", type=int, default=0)
    p.add_argument("--lora-alpha", type=float, default=None, help="default: 2 x rank")
    p.add_argument("--lora-targets", default="all")
    p.add_argument("--qlora", action="store_true")
    p.add_argument("--optim", default="adamw", choices=["adamw", "adamw8bit"])
    p.add_argument("--kernel-trace", metavar="FILE",
                   help="a torch.profiler trace (Chrome JSON) of step --kernel-trace-step, as "
                        "memplan-agent train --kernel-trace writes (scripts/kernel-trace-summary.py)")
    p.add_argument("--kernel-trace-step", type=int, default=3)
    args = p.parse_args()
    if args.steps <= args.warmup:
        p.error(f"--steps ({args.steps}) must exceed --warmup ({args.warmup})")
    if args.qlora and args.lora_rank <= 0:
        p.error("--qlora needs --lora-rank > 0")
    fsdp2 = args.fsdp2 or args.fsdp2_offload
    if (args.lora_rank > 0 or args.optim != "adamw") and fsdp2:
        p.error("--lora-rank/--optim adamw8bit are for the transformers runner, not --fsdp2-offload")

    if args.config:
        config = transformers.AutoConfig.from_pretrained(args.config)
    else:
        fields = dict(PRESETS[args.preset])
        config = transformers.AutoConfig.for_model(fields.pop("model_type"), **fields)
    config.use_cache = False
    torch.manual_seed(0)
    rank, world = 0, 1
    if fsdp2:
        import os
        from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard
        # Under torchrun: one rank per GPU from its variables; alone: one rank on GPU 0.
        rank = int(os.environ.get("RANK", 0))
        world = int(os.environ.get("WORLD_SIZE", 1))
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29533")
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        # CPU offload keeps sharded grads on the host: clipping's norm reduces them over Gloo.
        backend = "cpu:gloo,cuda:nccl" if args.fsdp2_offload else "nccl"
        torch.distributed.init_process_group(backend, rank=rank, world_size=world)
        # Without offload the model is built on its GPU (random init there: on the host, one
        # OMP thread per rank under torchrun takes minutes for 8B); with offload on the host.
        with torch.device("cpu" if args.fsdp2_offload else "cuda"):
            model = transformers.AutoModelForCausalLM.from_config(config,
                                                                  dtype=torch.float32).train()
        if not args.no_checkpointing:
            model.gradient_checkpointing_enable(
                gradient_checkpointing_kwargs={"use_reentrant": False})
        policy = dict(mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16,
                                                     reduce_dtype=torch.float32))
        if args.fsdp2_offload:
            policy["offload_policy"] = CPUOffloadPolicy(pin_memory=True)
        else:
            model = model.to("cuda")
        for layer in model.model.layers:
            fully_shard(layer, **policy)
        fully_shard(model, **policy)
        opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    else:
        if args.qlora:
            model = quantized_model(config)
        else:
            model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
            model = model.to("cuda")
        model.train()
        if not args.no_checkpointing:
            model.gradient_checkpointing_enable(
                gradient_checkpointing_kwargs={"use_reentrant": False})
        if args.lora_rank > 0:
            import peft
            targets = (["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                        "down_proj"] if args.lora_targets == "all"
                       else args.lora_targets.split(","))
            model.enable_input_require_grads()
            model = peft.get_peft_model(model, peft.LoraConfig(
                r=args.lora_rank, lora_alpha=args.lora_alpha or 2 * args.lora_rank,
                lora_dropout=0.0, target_modules=targets, task_type="CAUSAL_LM"))
        trainable = [p for p in model.parameters() if p.requires_grad]
        if args.optim == "adamw8bit":
            import bitsandbytes
            opt = bitsandbytes.optim.AdamW8bit(trainable, lr=args.lr, weight_decay=0.01)
        else:
            opt = torch.optim.AdamW(trainable, lr=args.lr, weight_decay=0.01, fused=True)
    params = sum(p.numel() for p in model.parameters())
    trainable_params = sum(p.numel() for p in model.parameters() if p.requires_grad)

    g = torch.Generator(device="cuda").manual_seed(1 + rank)
    batches = [torch.randint(0, config.vocab_size, (args.batch, args.seq), device="cuda",
                             generator=g) for _ in range(2)]
    times, losses = [], []
    for step in range(args.steps):
        if step == args.warmup:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        ids = batches[step % 2]
        torch.cuda.synchronize()
        profiler = None
        if args.kernel_trace and step + 1 == args.kernel_trace_step:
            profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                          torch.profiler.ProfilerActivity.CUDA])
            profiler.__enter__()
        start = time.perf_counter()
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
        if profiler is not None:
            profiler.__exit__(None, None, None)
            profiler.export_chrome_trace(args.kernel_trace)
        losses.append(loss.item())
        print(f"step {step + 1} loss {losses[-1]:.4f} {times[-1]:.3f} s", flush=True)
    steady = times[args.warmup:]
    tokens = args.batch * args.seq * world
    peaks = torch.tensor([torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved()],
                         dtype=torch.float64, device="cuda")
    if world > 1:  # the largest rank's peaks, the figure a per-rank budget must hold
        torch.distributed.all_reduce(peaks, op=torch.distributed.ReduceOp.MAX)
    if rank != 0:
        torch.distributed.destroy_process_group()
        return
    print(json.dumps({
        "runner": ("fsdp2-cpu-offload" if args.fsdp2_offload else
                   "fsdp2" if args.fsdp2 else "transformers"),
        "world_size": world,
        "transformers": transformers.__version__,
        "torch": torch.__version__, "preset": args.config or args.preset, "params": params,
        "trainable_params": trainable_params, "lora_rank": args.lora_rank, "qlora": args.qlora,
        "optim": args.optim,
        "batch": args.batch, "seq": args.seq, "checkpointing": not args.no_checkpointing,
        "median_step_s": statistics.median(steady),
        "tokens_per_s": tokens / statistics.median(steady),
        "peak_allocated_gib": peaks[0].item() / 2**30,
        "peak_reserved_gib": peaks[1].item() / 2**30,
        "alloc_conf": __import__("os").environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
        "last_loss": losses[-1]}))


if __name__ == "__main__":
    main()
