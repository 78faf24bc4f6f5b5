#include "agent/train/train_config.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/flags.h"
#include "common/head_chunking.h"
#include "common/host_reserve.h"
#include "common/optimizer_bytes.h"
#include "common/request_flags.h"
#include "common/status.h"
#include "common/validate.h"

namespace memplan {

std::string TrainUsage() {
  return R"(usage: memplan-agent train [flags]

Model (one of):
  --arch PRESET            a model preset (random init), e.g. llama-3.2-1b
  --model DIR              a Hugging Face checkpoint directory (config.json + *.safetensors)
  --arch-file CONFIG       a Hugging Face config.json (or its directory): that architecture,
                           random init, as --arch
Data (one of):
  --data FILE              token file (memplan header, or raw with --raw-token-bytes 2|4);
                           every id is checked against the model's vocabulary before step 1
  --synthetic-data         a seeded learnable token stream (--synthetic-noise P, default 0.1)
  --data-vl FILE           vision-language samples (token ids, pixel values, image grids) written
                           by scripts/prepare-vl-data.py; a vision-language model (qwen2_5_vl,
                           qwen2_vl) trains only on images: --data-vl or --synthetic-images
  --synthetic-images N --image-size HxW   N seeded random images of H x W pixels per sample
  --vision-checkpoint      a trained vision tower recomputes each block in backward, keeping
                           only the block's input (the planner also turns it on when a plan
                           fits only so)
Workload:
  --batch N (1)  --seq N (128)  --steps N (10)  --grad-accum N (1)
  --lr X (1e-4)  --clip X (1.0; 0 = off)  --weight-decay X (0.01)
                           --seq may not exceed the model's max_position_embeddings (or what
                           its rope_scaling extends it to: factor x the original positions)
  --lr-schedule constant|cosine (constant)   cosine: from --lr down to --min-lr-ratio x --lr
                           over the steps after the warmup (transformers'
                           get_cosine_schedule_with_warmup; with a ratio, its min-lr variant)
  --warmup-steps N (0)     the learning rate rises linearly from 0 over the first N steps
  --min-lr-ratio X (0)     cosine: where the curve ends, 0 <= X <= 1
  --skip-nonfinite         a step whose loss or gradients are NaN or infinite drops its
                           gradients and skips its update (logged; at most 8 in a row).
                           Default: the run stops before that update and before any save,
                           naming the step, and exits non-zero. Managed runs with clipping
                           learn the gradient norm during the update: a non-finite norm
                           there stops the run even with this flag
  --dtype fp32|bf16|fp16   (default bf16 on CUDA, fp32 on CPU; bf16 with adamw_bf16)
  --optimizer adamw|adamw_bf16|sgd|adamw8bit   (adamw, or the plan file's)
                           adamw: fp32 moments (+ fp32 master for bf16/fp16 models);
                           adamw_bf16: bf16 parameters and moments, no master (--dtype bf16,
                           torch.optim.AdamW(fused=True) on bf16 parameters); adamw8bit:
                           bitsandbytes-style AdamW8bit (uint8 block-wise moments, no master;
                           fp32 or bf16, managed runs); sgd: no momentum
                           (+ fp32 master for bf16/fp16 models in managed runs)
  --param-rounding stochastic|nearest   how adamw8bit rounds its updates into bf16
                           parameters (stochastic, the default: small updates add up as on an
                           fp32 master; nearest: bitsandbytes' AdamW8bit bit for bit)
  --device cpu|cuda|cuda:N|auto (auto)   --seed N (0)
  --moe-experts grouped|loop   a mixture of experts' expert projections: one grouped GEMM per
                           projection over every expert, no host synchronisation (grouped, the
                           default; the loop where it cannot run: CUDA needs bf16 on compute
                           capability 9.x or 10.x) or a GEMM per expert (loop, for comparisons)
LoRA (adapters on a frozen base, as PEFT's LoraConfig):
  --lora-rank R            adapter rank, 1 to the hidden size (0 = full fine-tune, the default)
  --lora-alpha A (16)      the update is scaled by A / R; A > 0
  --lora-dropout P (0)     dropout on the adapters' input, 0 <= P < 1
  --lora-targets LIST|all  q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj (required)
  --qlora                  QLoRA: the base's projection weights in 4-bit NF4 (bitsandbytes'
                           nf4, blocks of 64, double quantization), quantized at load on the
                           compute device and dequantized per matmul; needs --lora-rank
  --load-adapter DIR       start from a PEFT adapter (adapter_config.json +
                           adapter_model.safetensors); its r, lora_alpha and targets must match
  --save-adapter DIR       write the trained adapter in PEFT's format at the end
  --merge-export DIR       write a Hugging Face checkpoint with W + B A * A/R at the end
OSFT (orthogonal subspace fine-tuning; docs/agent.md, "OSFT"):
  --osft-rank-ratio R      split each targeted weight by SVD; the fraction R of its spectrum
                           (the smallest singular directions) trains, the rest stays frozen;
                           0 < R < 1. Unmanaged (under torchrun each rank holds the whole
                           model); no plan. --save writes a checkpoint whose model.safetensors
                           holds the merged weights (a Hugging Face model), osft_config.json
                           and osft_factors.safetensors the split and its factors; --resume
                           continues it with the same R and targets on any number of ranks
  --osft-targets LIST|all  the projections split (default all)
  --plain                  no plan: plain autograd, no per-group Functions (the baseline)
Residency plan (any chunk knob or --plan-file runs the chunk manager):
  --plan-file FILE         JSON plan (`memplan plan --json` output or a bare plan); its
                           knobs are refused outside the run's layout, never clamped:
                           n_persist in [0, n_chunks], n_buffer in [1, n_chunks - n_persist]
                           (0 or absent when every chunk is persistent)
  --chunk-mib N  --n-persist N  --n-buffer N  --host-memory pinned|pageable
  --block-modes LIST       one per block, e.g. ckpt,ckpt,swap,none
  --n-ckpt N  --n-swap N  --n-hs-offload N   counts (offload blocks first, NONE last)
  --persistent-state sharded|replicated   several ranks: the persistent chunks' optimizer
                           state sharded 1/W per rank (grads reduce-scattered, parameters
                           all-gathered after the update) or replicated (grads all-reduced)
  --persistent-params sharded|replicated   several ranks: the persistent chunks' parameters
                           sharded too, 1/W per rank, all-gathered before each group that uses
                           them and released after (ZeRO-3; implies --persistent-state sharded;
                           LoRA / QLoRA: the frozen base's, the adapters stay replicated)
  --head-chunk-mib N       fp32 logits per LM head chunk, 1 to 4096 MiB (default: the plan's;
                           256, or 1024 with --plain); larger chunks are faster and hold more
  --accumulate-offloaded-grads device|host   several ranks, --grad-accum > 1: sum the offloaded
                           chunks' grads on the device and reduce-scatter them once per step (no
                           collective before the last micro-batch; their fp32 grads stay on the
                           device until then; not priced by the planner, refused with --planner)
                           or reduce-scatter every micro-batch into the host sum (default)
  --offload-in-flight N (2)  groups whose copies to the host may be in flight: in forward,
                           group g's offloaded activations are freed at the end of group
                           g + N - 1's forward, their copy done (the planner prices N = 2);
                           in backward, the host waits for the grad copies N groups back
  --pinned-activations auto|caching|exact
                           pinned host copies of swapped and offloaded activations: torch's
                           caching host allocator, which rounds each up to a power of two, or
                           page-locked at their exact size in the agent's own pool (the bytes the
                           planner prices); auto (default): exact when the planner's plan would
                           not fit the host's RAM with every copy rounded up to twice its size,
                           else caching (logged as "pinned activations")
  --speculative-clip auto|on|off
                           with clipping, one rank and one micro-batch a step: when the last
                           step needed no clipping, the offloaded chunks' CPU updates start in
                           backward as without clipping, into a second copy of what they
                           write (host memory: the master or parameters and the moments of
                           every offloaded chunk), which becomes the live one when the step
                           does not clip; a step that does clip updates again. Exact either
                           way. auto (default): on for adamw8bit and adamw_bf16 (where it was
                           measured to pay) when the planner's plan and the copies fit the
                           host's RAM (logged as "speculative clipping")
  --device-update-share X (0)
                           adamw8bit and adamw_bf16, one rank, managed: the share (0..1) of the
                           offloaded chunks whose update, when the step holds it until the
                           norm (clipping), runs on the GPU: copied there, updated as the
                           resident chunks are, copied back beside the next forward. Exact as
                           the CPU update. Measured on an H200 host (8B, 62 offloaded chunks,
                           --clip 1): adamw8bit 0.5 -22 % per step; adamw_bf16 no gain
                           (docs/benchmarks.md, "Thirty-first session"). Pinned host memory for
                           those chunks' state; 2 GPU slots of 4 chunks' bytes during the step
  --cpu-threads N (0)      CPU optimizer threads; 0: the host's hardware threads divided by the
                           ranks on this host (what the planner's CPU figures assume)
Held-out evaluation:
  --eval-tokens FILE       a token file (as --data, same --raw-token-bytes); logs `eval loss`,
                           the mean loss of --eval-batches micro-batches without gradients
  --eval-every N (0)       evaluate every N steps (0: after the last step only)
  --eval-batches K (4)     micro-batches of --batch x --seq per evaluation, 1 to 100000
Checkpoints and output:
  --save DIR  --save-every N (0 = at the end)  --resume DIR  --log-every N (1)
                           SIGTERM or SIGINT (Ctrl-C): the step in flight finishes, a checkpoint
                           is written to --save (if given) and the run exits with code 3; a
                           second signal ends the process at once
Diagnostics and device memory:
  --memory-timeline FILE   per-group allocated/reserved bytes of every step, as TSV
  --kernel-trace FILE      a Kineto trace (CPU ops and CUDA kernels, Chrome-trace JSON, as
                           torch.profiler writes) of step --kernel-trace-step (3), for
                           scripts/kernel-trace-summary.py; rank R > 0 writes FILE.rank-R (the
                           traced step runs slower and is left out of the mean step time
                           and the steady peaks when the run has three steps or more)
  --metrics HOST:PORT      serve live Prometheus metrics while training (GET /metrics: step time,
                           tokens/s, device memory and peaks, chunk bytes moved host to device,
                           with the planner's prediction for the plan; port 0 picks a free port,
                           printed as "metrics on HOST:PORT")
  --memory-limit off|plan|MIB
                           hold the CUDA caching allocator's reserved bytes to a cap: "plan" is
                           the planner's predicted reserved peak (--planner), MIB a figure; at
                           the cap the allocator returns cached free blocks and retries before
                           it fails (default off; the retries are counted at the end)
  --allocator-conf STR     CUDA caching-allocator settings, PYTORCH_CUDA_ALLOC_CONF syntax
                           (default expandable_segments:True unless that variable is set;
                           "" = PyTorch's own default)
Several ranks (torchrun --nproc-per-node N --no-python memplan-agent train ...):
  WORLD_SIZE, RANK, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT from the environment;
  one process per GPU (LOCAL_RANK), NCCL on CUDA and Gloo on the CPU. Every rank reads its own
  --batch rows (the global batch is WORLD_SIZE x --batch), the chunks are sharded over the ranks
  (ZeRO-3), and rank 0 logs. --save: every rank writes the pieces it stores into one checkpoint
  directory (rank-R-of-W.safetensors, nothing gathered; LoRA and adamw8bit runs gather to rank 0);
  --resume reads any world size's checkpoint, each rank only the ranges it stores.
  For comparisons: MEMPLAN_NCCL_HIGH_PRIORITY=0 (normal-priority NCCL streams) and
  MEMPLAN_COALESCE_GATHERS=0 (one all-gather per chunk instead of one per hook); both default 1.
  --memory-timeline FILE: rank 0 writes FILE, rank R > 0 FILE.rank-R. Not yet with --profile.
)";
}

absl::StatusOr<std::vector<BlockMode>> ParseBlockModeList(absl::string_view csv) {
  std::vector<BlockMode> modes;
  for (absl::string_view item : absl::StrSplit(csv, ',')) {
    std::optional<BlockMode> mode = ParseBlockModeName(item);
    if (!mode.has_value()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "block mode \"", std::string(item), "\" is not one of none, ckpt, swap, hs_offload"));
    }
    modes.push_back(*mode);
  }
  return modes;
}

FixedKnobs PlannerFixedKnobs(const TrainConfig& c) {
  FixedKnobs fixed;
  fixed.chunk_bytes = c.chunk_bytes;
  fixed.n_persist = c.n_persist;
  fixed.n_buffer = c.n_buffer;
  fixed.n_swap = c.n_swap;
  fixed.n_checkpoint = c.n_ckpt;
  fixed.n_hs_offload = c.n_hs_offload;
  fixed.host_memory = c.host_memory;
  fixed.shard_persistent_state = c.shard_persistent_state;
  fixed.shard_persistent_params = c.shard_persistent_params;
  fixed.head_chunk_logit_bytes = c.head_chunk_logit_bytes;
  // A LoRA run's sharded parameters are the frozen base's, which has no state to shard.
  if (c.shard_persistent_params.value_or(false) && !c.lora.enabled()) {
    fixed.shard_persistent_state = true;
  }
  return fixed;
}

absl::StatusOr<std::vector<BlockMode>> BlockModesFromCounts(int num_blocks, int n_swap, int n_ckpt,
                                                            int n_hs_offload) {
  if (n_swap < 0 || n_ckpt < 0 || n_hs_offload < 0) {
    return absl::InvalidArgumentError("block mode counts must be >= 0");
  }
  if (int64_t{n_swap} + n_ckpt + n_hs_offload > num_blocks) {
    return absl::InvalidArgumentError(
        absl::StrCat("n_swap + n_ckpt + n_hs_offload = ", n_swap + n_ckpt + n_hs_offload,
                     " exceeds the ", num_blocks, " blocks"));
  }
  std::vector<BlockMode> offload(n_swap, BlockMode::kSwap);
  offload.insert(offload.end(), n_hs_offload, BlockMode::kHsOffload);
  std::vector<BlockMode> modes;
  size_t o = 0;
  int c = 0;
  while (o < offload.size() || c < n_ckpt) {
    if (o < offload.size()) modes.push_back(offload[o++]);
    if (c < n_ckpt) {
      modes.push_back(BlockMode::kCkpt);
      ++c;
    }
  }
  modes.resize(num_blocks, BlockMode::kNone);
  return modes;
}

namespace {
// LoRA-only flags need a rank, and a rank needs targets.
absl::Status CheckLoraFlags(const TrainConfig& c);
// OSFT: targets need a ratio; a ratio defaults the targets to all and refuses what OSFT cannot
// run yet (LoRA, a residency plan).
absl::Status CheckOsftFlags(TrainConfig* c, bool targets_given);
}  // namespace

absl::StatusOr<TrainConfig> ParseTrainArgs(const std::vector<std::string>& args) {
  TrainConfig c;
  FixedKnobs fixed;
  FlagSet flags("see --help");
  flags.NonEmptyString("--arch", &c.arch)
      .NonEmptyString("--model", &c.model_dir)
      .NonEmptyString("--arch-file", &c.arch_file)
      .NonEmptyString("--data", &c.data_file)
      .Choice("--raw-token-bytes", &c.raw_token_bytes, FlagSet::Choices<int>{{"2", 2}, {"4", 4}})
      .Switch("--synthetic-data", &c.synthetic_data)
      .NonEmptyString("--data-vl", &c.vl_data_file)
      .Int("--synthetic-images", &c.synthetic_images, 1, 1024)
      .Switch("--vision-checkpoint", &c.vision_checkpoint)
      .Custom("--image-size",
              [&c](absl::string_view v) -> absl::Status {
                const size_t x = v.find('x');
                if (x == absl::string_view::npos ||
                    !absl::SimpleAtoi(v.substr(0, x), &c.image_height) ||
                    !absl::SimpleAtoi(v.substr(x + 1), &c.image_width) || c.image_height < 1 ||
                    c.image_width < 1 || c.image_height > 65536 || c.image_width > 65536) {
                  return absl::InvalidArgumentError(absl::StrCat(
                      "--image-size = \"", v, "\": expected HEIGHTxWIDTH in pixels, e.g. 448x448"));
                }
                return absl::OkStatus();
              })
      .Double("--synthetic-noise", &c.synthetic_noise, 0, 1)
      .Int(kBatchFlag, &c.batch)
      .Int(kSeqFlag, &c.seq)
      .Int("--steps", &c.steps, 0, int64_t{1} << 40)
      .Int(kGradAccumFlag, &c.grad_accum)
      .Double("--lr", &c.lr, 0, 1e3)
      .Double("--clip", &c.clip, 0, 1e12)
      .Double("--weight-decay", &c.weight_decay, 0, 1e3)
      .Switch("--skip-nonfinite", &c.skip_nonfinite)
      .Choice("--lr-schedule", &c.lr_schedule.kind,
              FlagSet::Choices<LrSchedule::Kind>{{"constant", LrSchedule::Kind::kConstant},
                                                 {"cosine", LrSchedule::Kind::kCosine}})
      .Int("--warmup-steps", &c.lr_schedule.warmup_steps, 0, int64_t{1} << 40)
      .Double("--min-lr-ratio", &c.lr_schedule.min_lr_ratio, 0, 1)
      .NonEmptyString("--eval-tokens", &c.eval_tokens_file)
      .Int("--eval-every", &c.eval_every, 0, int64_t{1} << 40)
      .Int("--eval-batches", &c.eval_batches, 1, 100000);
  AddDTypeFlag(&flags, "--dtype", &c.dtype);
  AddOptimizerFlag(&flags, &c.optimizer);
  flags
      .Choice("--param-rounding", &c.stochastic_rounding,
              FlagSet::Choices<bool>{{"stochastic", true}, {"nearest", false}})
      .Choice("--moe-experts", &c.moe_loop_experts,
              FlagSet::Choices<bool>{{"grouped", false}, {"loop", true}})
      .Custom("--device",
              [&c](absl::string_view v) -> absl::Status {
                if (!(v == "cpu" || v == "cuda" || v == "auto" || absl::StartsWith(v, "cuda:"))) {
                  return absl::InvalidArgumentError(NotOneOf(v, "cpu, cuda, cuda:N, auto"));
                }
                c.device = std::string(v);
                return absl::OkStatus();
              })
      .Custom("--seed",
              [&c](absl::string_view v) -> absl::Status {
                if (!absl::SimpleAtoi(v, &c.seed)) {
                  return absl::InvalidArgumentError(
                      absl::StrCat(Quote(v), " is not an integer in [0, ", ~uint64_t{0}, "]"));
                }
                return absl::OkStatus();
              })
      .Switch("--plain", &c.plain);
  // [Plan knobs are refused, never clamped] A run streams its offloaded chunks through at least
  // one buffer; 0 is accepted only when every chunk is persistent, as the planner prints such a
  // plan ("buffer 0"), and checked against the layout in CheckRunPlanKnobs.
  AddFixedKnobFlags(&flags, &fixed, /*min_n_buffer=*/0);
  flags
      .Custom("--block-modes",
              [&c](absl::string_view v) -> absl::Status {
                ASSIGN_OR_RETURN(c.block_modes, ParseBlockModeList(v));
                return absl::OkStatus();
              })
      .Choice("--accumulate-offloaded-grads", &c.accumulate_offloaded_grads_on_device,
              FlagSet::Choices<bool>{{"device", true}, {"host", false}})
      .NonEmptyString("--plan-file", &c.plan_file)
      .Int("--offload-in-flight", &c.offload_in_flight, 1, 1024)
      .Choice("--pinned-activations", &c.pinned_activations,
              FlagSet::Choices<PinnedActivations>{{"auto", PinnedActivations::kAuto},
                                                  {"caching", PinnedActivations::kCaching},
                                                  {"exact", PinnedActivations::kExact}})
      .Choice("--speculative-clip", &c.speculative_clip,
              FlagSet::Choices<SpeculativeClip>{{"auto", SpeculativeClip::kAuto},
                                                {"on", SpeculativeClip::kOn},
                                                {"off", SpeculativeClip::kOff}})
      .Double("--device-update-share", &c.device_update_share, 0, 1)
      .Int("--cpu-threads", &c.cpu_threads, 0, 1024)
      .NonEmptyString("--save", &c.save_dir)
      .Int("--save-every", &c.save_every, 0, int64_t{1} << 40)
      .NonEmptyString("--resume", &c.resume_dir)
      .Int("--log-every", &c.log_every, 1, int64_t{1} << 40)
      .NonEmptyString("--memory-timeline", &c.memory_timeline)
      .NonEmptyString("--kernel-trace", &c.kernel_trace)
      .Int("--kernel-trace-step", &c.kernel_trace_step, 1, int64_t{1} << 40)
      .NonEmptyString("--metrics", &c.metrics_address)
      .Int(kLoraRankFlag, &c.lora.rank)
      .Double("--lora-alpha", &c.lora.alpha, DoubleRange{0, 1e12, /*lo_open=*/true})
      .Double("--lora-dropout", &c.lora.dropout, DoubleRange{0, 1, false, /*hi_open=*/true})
      .Switch("--qlora", &c.lora.nf4_base)
      .NonEmptyString("--load-adapter", &c.load_adapter_dir)
      .NonEmptyString("--save-adapter", &c.save_adapter_dir)
      .NonEmptyString("--merge-export", &c.merge_export_dir)
      .Double("--osft-rank-ratio", &c.osft.rank_ratio, DoubleRange{0, 1, true, true})
      .Custom("--osft-targets",
              [&c](absl::string_view v) -> absl::Status {
                ASSIGN_OR_RETURN(c.osft.targets, ParseLoraTargetList("--osft-targets", v));
                return absl::OkStatus();
              })
      .Custom("--memory-limit",
              [&c](absl::string_view v) -> absl::Status {
                if (v == "off") {
                  c.memory_limit_bytes = 0;
                } else if (v == "plan") {
                  c.memory_limit_bytes = -1;
                } else {
                  int64_t mib = 0;
                  constexpr int64_t kMaxMib = int64_t{1} << 30;
                  if (!absl::SimpleAtoi(v, &mib) || mib < 1 || mib > kMaxMib) {
                    return absl::InvalidArgumentError(absl::StrCat(
                        Quote(v), " is not off, plan or a size in MiB in ", RangeText(1, kMaxMib)));
                  }
                  c.memory_limit_bytes = mib << 20;
                }
                return absl::OkStatus();
              })
      .String("--allocator-conf", &c.allocator_conf);
  AddLoraTargetsFlag(&flags, &c.lora.targets);
  RETURN_IF_ERROR(flags.Parse(args));
  c.chunk_bytes = fixed.chunk_bytes;
  c.n_persist = fixed.n_persist;
  c.n_buffer = fixed.n_buffer;
  c.n_ckpt = fixed.n_checkpoint;
  c.n_swap = fixed.n_swap;
  c.n_hs_offload = fixed.n_hs_offload;
  c.host_memory = fixed.host_memory;
  c.shard_persistent_state = fixed.shard_persistent_state;
  c.shard_persistent_params = fixed.shard_persistent_params;
  c.head_chunk_logit_bytes = fixed.head_chunk_logit_bytes;
  c.param_rounding_given = flags.Given("--param-rounding");
  c.lora_alpha_given = flags.Given("--lora-alpha");
  c.lora_dropout_given = flags.Given("--lora-dropout");

  if (int{!c.arch.empty()} + int{!c.model_dir.empty()} + int{!c.arch_file.empty()} != 1) {
    return absl::InvalidArgumentError(
        "give exactly one of --arch PRESET, --arch-file CONFIG or --model DIR");
  }
  if (int{!c.data_file.empty()} + int{c.synthetic_data} + int{!c.vl_data_file.empty()} +
          int{c.synthetic_images > 0} != 1) {
    return absl::InvalidArgumentError(
        "give exactly one of --data FILE, --synthetic-data, --data-vl FILE or --synthetic-images N "
        "--image-size HxW");
  }
  if ((c.synthetic_images > 0) != flags.Given("--image-size")) {
    return absl::InvalidArgumentError("--synthetic-images N and --image-size HxW go together");
  }
  if (c.plain && (c.chunk_bytes || c.n_persist || c.n_buffer || c.block_modes || c.n_ckpt ||
                  c.n_swap || c.n_hs_offload || c.shard_persistent_state ||
                  c.shard_persistent_params ||
                  !c.plan_file.empty())) {
    return absl::InvalidArgumentError("--plain runs without a plan; drop the plan flags");
  }
  if (c.param_rounding_given && c.optimizer.has_value() &&
      *c.optimizer != OptimizerKind::kAdamW8bit) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--param-rounding applies to --optimizer adamw8bit (the others keep an fp32 master or "
        "use torch's fused AdamW); got --optimizer ", std::string(OptimizerName(*c.optimizer))));
  }
  if (!c.kernel_trace.empty() && c.kernel_trace_step > c.steps) {
    return FlagError("--kernel-trace-step",
                     absl::StrCat(c.kernel_trace_step, " is past --steps ", c.steps,
                                  ": the step to trace never runs"));
  }
  if (flags.Given("--kernel-trace-step") && c.kernel_trace.empty()) {
    return FlagError("--kernel-trace-step", "needs --kernel-trace FILE");
  }
  if (c.plain && c.optimizer == OptimizerKind::kAdamW8bit) {
    return absl::InvalidArgumentError(
        "--optimizer adamw8bit keeps its 8-bit state in the chunk manager; drop --plain");
  }
  if (flags.Given("--min-lr-ratio") && c.lr_schedule.kind != LrSchedule::Kind::kCosine) {
    return FlagError("--min-lr-ratio", "applies to --lr-schedule cosine");
  }
  if (c.eval_tokens_file.empty() && (flags.Given("--eval-every") || flags.Given("--eval-batches"))) {
    return FlagError(flags.Given("--eval-every") ? "--eval-every" : "--eval-batches",
                     "needs --eval-tokens FILE");
  }
  if (c.block_modes.has_value() && (c.n_ckpt || c.n_swap || c.n_hs_offload)) {
    return absl::InvalidArgumentError(
        "--block-modes and --n-ckpt/--n-swap/--n-hs-offload are exclusive");
  }
  if (c.optimizer.has_value()) {
    RETURN_IF_ERROR(ResolveOptimizer(c, std::nullopt).status());
  }
  RETURN_IF_ERROR(CheckOsftFlags(&c, flags.Given("--osft-targets")));
  // [LoRA resume settings] A LoRA checkpoint may supply the rank and targets.
  if (c.resume_dir.empty()) RETURN_IF_ERROR(CheckLoraFlags(c));
  return c;
}

namespace {
absl::Status CheckOsftFlags(TrainConfig* c, bool targets_given) {
  if (!c->osft.enabled()) {
    return targets_given ? FlagError("--osft-targets", "needs --osft-rank-ratio (an OSFT run)")
                         : absl::OkStatus();
  }
  if (!targets_given) c->osft.targets.assign(kLoraModuleNames.begin(), kLoraModuleNames.end());
  // [OSFT] runs unmanaged (every rank holds the whole model); its checkpoints are
  // [OSFT checkpoints] (agent/io/osft_checkpoint.h).
  for (const auto& [flag, set] : std::vector<std::pair<const char*, bool>>{
           {"--lora-rank", c->lora.enabled()},
           {"--plan-file", !c->plan_file.empty()},
           {"--chunk-mib/--n-persist/--n-buffer", c->chunk_bytes || c->n_persist || c->n_buffer}}) {
    if (set) {
      return FlagError("--osft-rank-ratio",
                       absl::StrCat("runs unmanaged, without LoRA, for now; drop ", flag));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckLoraFlags(const TrainConfig& c) {
  if (!c.lora.enabled()) {
    for (const auto& [flag, set] :
         std::vector<std::pair<const char*, bool>>{{"--lora-targets", !c.lora.targets.empty()},
                                                   {"--load-adapter", !c.load_adapter_dir.empty()},
                                                   {"--save-adapter", !c.save_adapter_dir.empty()},
                                                   {"--merge-export", !c.merge_export_dir.empty()},
                                                   {"--qlora", c.lora.nf4_base}}) {
      if (set) return FlagError(flag, "needs --lora-rank (a LoRA run)");
    }
    if (c.lora_alpha_given || c.lora_dropout_given) {
      return FlagError("--lora-alpha/--lora-dropout", "needs --lora-rank");
    }
  } else if (c.lora.targets.empty()) {
    return FlagError("--lora-rank", "needs --lora-targets (e.g. q_proj,v_proj or all)");
  }
  return absl::OkStatus();
}
}  // namespace

// [LoRA resume settings]
absl::Status AdoptCheckpointLora(TrainConfig* config, const std::optional<LoraOptions>& saved,
                                 const std::string& source) {
  TrainConfig& c = *config;
  if (saved.has_value()) {
    auto contradiction = [&](const std::string& flag, const std::string& given,
                             const std::string& field, const std::string& stored) {
      return absl::InvalidArgumentError(absl::StrCat(
          flag, " ", given, " contradicts ", field, " = ", stored, " in ", source,
          ": a LoRA checkpoint resumes with its own settings; drop the flag"));
    };
    if (c.lora.rank > 0 && c.lora.rank != saved->rank) {
      return contradiction("--lora-rank", absl::StrCat(c.lora.rank), "r",
                           absl::StrCat(saved->rank));
    }
    if (c.lora_alpha_given && c.lora.alpha != saved->alpha) {
      return contradiction("--lora-alpha", absl::StrCat(c.lora.alpha), "lora_alpha",
                           absl::StrCat(saved->alpha));
    }
    // LoraTrainingMethod lists the targets in canonical order (of a LoRA run: rank > 0).
    auto canonical = [](const std::vector<std::string>& targets) {
      LoraOptions lora;
      lora.rank = 1;
      lora.targets = targets;
      return LoraTrainingMethod(lora).lora_target_modules;
    };
    const std::vector<std::string> stored = canonical(saved->targets);
    if (!c.lora.targets.empty() && canonical(c.lora.targets) != stored) {
      return contradiction("--lora-targets", absl::StrJoin(canonical(c.lora.targets), ","),
                           "target_modules", absl::StrJoin(stored, ","));
    }
    c.lora.rank = saved->rank;
    c.lora.alpha = saved->alpha;
    if (c.lora.targets.empty()) c.lora.targets = saved->targets;
    // Dropout is no part of the adapter's shape: a flag may change it for the rest of the run.
    if (!c.lora_dropout_given) c.lora.dropout = saved->dropout;
  }
  return CheckLoraFlags(c);
}

// [Learning-rate schedule] transformers' lambdas, evaluated at the scheduler's step count (the
// optimizer steps already taken).
double LearningRateFactor(const LrSchedule& schedule, int64_t completed_steps,
                          int64_t total_steps) {
  const double step = static_cast<double>(completed_steps);
  const int64_t warmup = schedule.warmup_steps;
  if (completed_steps < warmup) return step / static_cast<double>(std::max<int64_t>(1, warmup));
  if (schedule.kind == LrSchedule::Kind::kConstant) return 1.0;
  const double progress = (step - static_cast<double>(warmup)) /
                          static_cast<double>(std::max<int64_t>(1, total_steps - warmup));
  const double cosine = 0.5 * (1.0 + std::cos(M_PI * progress));
  return std::max(0.0, cosine * (1.0 - schedule.min_lr_ratio) + schedule.min_lr_ratio);
}

absl::Status CheckPlanTraining(const TrainConfig& config,
                               const std::optional<TrainingMethod>& plan_training) {
  if (!plan_training.has_value()) return absl::OkStatus();
  auto describe = [](const TrainingMethod& m) {
    if (m.kind == TrainingKind::kFull) return std::string("a full fine-tune");
    std::vector<std::string> modules = m.lora_target_modules;
    std::sort(modules.begin(), modules.end());
    return absl::StrCat(m.kind == TrainingKind::kQlora ? "QLoRA" : "LoRA", " rank ", m.lora_rank,
                        " on ", absl::StrJoin(modules, ","));
  };
  const TrainingMethod run = LoraTrainingMethod(config.lora);
  if (describe(run) == describe(*plan_training)) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "--plan-file ", config.plan_file, " was made for ", describe(*plan_training),
      ", this run is ", describe(run), " (--lora-rank/--lora-targets): its memory figures are "
      "not this run's; plan again for this method"));
}

absl::StatusOr<OptimizerKind> ResolveOptimizer(const TrainConfig& config,
                                               std::optional<OptimizerKind> plan_optimizer) {
  if (config.optimizer.has_value() && plan_optimizer.has_value() &&
      *config.optimizer != *plan_optimizer) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--optimizer ", std::string(OptimizerName(*config.optimizer)), ": the plan file (",
        config.plan_file, ") was made for optimizer ",
        std::string(OptimizerName(*plan_optimizer)),
        ", whose memory differs; plan again with --optimizer ",
        std::string(OptimizerName(*config.optimizer)), " or drop the flag"));
  }
  const OptimizerKind kind =
      config.optimizer.value_or(plan_optimizer.value_or(OptimizerKind::kAdamW));
  if (config.dtype.has_value()) {
    if (const std::string problem = OptimizerDTypeProblem(kind, *config.dtype); !problem.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--optimizer ", std::string(OptimizerName(kind)), " with --dtype ",
          std::string(DTypeName(*config.dtype)), ": ", problem));
    }
  }
  return kind;
}

absl::StatusOr<ResidencyPlan> RunnablePlan(const PlanFile& file) {
  if (file.does_not_fit_reason.has_value()) {
    const std::string& reason = *file.does_not_fit_reason;
    return absl::FailedPreconditionError(absl::StrCat(
        "the planner's verdict is DOES NOT FIT: \"",
        reason.empty() ? std::string("(no reason given)") : reason,
        "\"; its plan is the least-bad one, shown for information, not one to run: change the "
        "workload, the card or the fixed knobs and plan again"));
  }
  ResidencyPlan plan = file.answer.plan;
  if (plan.world_size == 0) plan.world_size = 1;
  return plan;
}

absl::StatusOr<ResidencyPlan> ParsePlanJson(absl::string_view json) {
  ASSIGN_OR_RETURN(const PlanFile file, PlanFileFromJson(json));
  return RunnablePlan(file);
}

absl::Status CheckPlanLayout(const ResidencyPlan& plan, const std::string& source,
                             int agent_n_chunks, const std::string& agent_fingerprint,
                             std::string* warning) {
  warning->clear();
  const std::string agent =
      absl::StrCat("this agent packs ", agent_n_chunks, " chunks of ", plan.chunk_bytes,
                   " bytes (layout fingerprint ", agent_fingerprint, ")");
  if (plan.layout_fingerprint.empty()) {
    *warning = absl::StrCat(source, " carries no layout fingerprint (an older planner or a ",
                            "hand-written plan); its n_chunks = ", plan.n_chunks, ", ", agent,
                            "; n_persist = ", plan.n_persist, " is applied to this agent's chunks");
    return absl::OkStatus();
  }
  if (plan.layout_fingerprint == agent_fingerprint && plan.n_chunks == agent_n_chunks) {
    return absl::OkStatus();
  }
  return absl::FailedPreconditionError(absl::StrCat(
      source, " was made for another chunk layout: the planner's has ", plan.n_chunks,
      " chunks (layout fingerprint ", plan.layout_fingerprint, "), ", agent,
      "; n_persist = ", plan.n_persist,
      " would keep other bytes on the GPU than planned: plan again for this model, dtype and "
      "agent build"));
}

absl::StatusOr<RunPlan> ResolveRunPlan(const TrainConfig& c, int num_blocks,
                                       const std::optional<ResidencyPlan>& file, int world_size) {
  RunPlan run;
  if (world_size > 1 && c.plain) {
    return absl::InvalidArgumentError(
        absl::StrCat("--plain: world size ", world_size,
                     " (WORLD_SIZE) runs managed, with the chunks sharded over the ranks"));
  }
  if (file.has_value()) {
    // The planner stamps the query's world size into its plans; a plan for another number of
    // ranks prices other shards and collectives.
    if (std::max(file->world_size, 1) != world_size) {
      return absl::InvalidArgumentError(absl::StrCat(
          "plan.world_size = ", file->world_size, " but this run has world size ", world_size,
          " (WORLD_SIZE): plan again for ", world_size, world_size == 1 ? " rank" : " ranks"));
    }
    // [OSFT plans] (planner/core/osft_plan.h): the planner's OSFT plan has no chunks; the run
    // stays unmanaged and takes its block modes (below).
    run.managed = !c.osft.enabled();
    if (file->chunk_bytes > 0) run.chunk_bytes = file->chunk_bytes;
    run.n_persist = file->n_persist;
    run.n_persist_source = "plan.n_persist";
    // 0 is what the planner writes when every chunk is persistent (and what an absent key reads).
    if (file->n_buffer > 0) {
      run.n_buffer = file->n_buffer;
      run.n_buffer_source = "plan.n_buffer";
    }
    run.host_memory = file->host_memory;
    run.shard_persistent_state = file->shard_persistent_state;
    run.shard_persistent_params = file->shard_persistent_params;
    RETURN_IF_ERROR(
        CheckHeadChunkLogitBytes("plan.head_chunk_logit_bytes", file->head_chunk_logit_bytes));
  }
  // [Chunked head] (common/head_chunking.h): the chunk the plan was priced with.
  run.head_chunk_logit_bytes = c.head_chunk_logit_bytes ? *c.head_chunk_logit_bytes
                               : file.has_value()
                                   ? HeadChunkLogitBytes(file->head_chunk_logit_bytes)
                               : c.plain ? kPlainHeadChunkLogitBytes
                                         : kHeadChunkLogitBytes;
  // [OSFT across ranks] (trainer.cc): the model replicated, unmanaged, on every rank.
  if (world_size > 1 && !c.osft.enabled()) run.managed = true;
  if (c.chunk_bytes || c.n_persist || c.n_buffer) run.managed = true;
  // adamw8bit's state lives in the chunk manager only.
  if (c.optimizer == OptimizerKind::kAdamW8bit) run.managed = true;
  if (c.chunk_bytes) run.chunk_bytes = *c.chunk_bytes;
  if (c.n_persist) {
    run.n_persist = *c.n_persist;
    run.n_persist_source = "--n-persist";
  }
  if (c.n_buffer) {
    run.n_buffer = *c.n_buffer;
    run.n_buffer_source = "--n-buffer";
  }
  if (c.host_memory) run.host_memory = *c.host_memory;
  // A full fine-tune shards its persistent parameters with their state ([Sharded persistent
  // parameters]); a LoRA run's are the frozen base's, which has no state ([Sharded frozen base]):
  // the planner's LoRA plans shard them with the state replicated (the adapters').
  const bool full = !c.lora.enabled();
  if (full && file.has_value() && file->shard_persistent_params && !file->shard_persistent_state) {
    return absl::InvalidArgumentError(
        "plan.shard_persistent_params = true needs plan.shard_persistent_state = true for a full "
        "fine-tune (the parameters are sharded together with the optimizer state; only a LoRA "
        "plan shards its frozen base's parameters alone)");
  }
  if (c.shard_persistent_state) run.shard_persistent_state = *c.shard_persistent_state;
  if (c.shard_persistent_params) {
    if (*c.shard_persistent_params && c.shard_persistent_state == false && full) {
      return absl::InvalidArgumentError(
          "--persistent-params sharded needs the optimizer state sharded too; drop "
          "--persistent-state replicated");
    }
    run.shard_persistent_params = *c.shard_persistent_params;
    if (run.shard_persistent_params && full) run.shard_persistent_state = true;
  }
  if (!run.shard_persistent_state && full) run.shard_persistent_params = false;
  if (c.shard_persistent_state.value_or(false) && world_size <= 1) {
    return absl::InvalidArgumentError(
        "--persistent-state sharded: this run has one rank (WORLD_SIZE unset or 1), nothing to "
        "shard the optimizer state over; launch several ranks (torchrun) or drop the flag");
  }
  if (c.accumulate_offloaded_grads_on_device && world_size <= 1) {
    return absl::InvalidArgumentError(
        "--accumulate-offloaded-grads device: this run has one rank (WORLD_SIZE unset or 1); one "
        "rank sums its offloaded grads on the host without collectives anyway");
  }
  if (c.shard_persistent_params.value_or(false) && world_size <= 1) {
    return absl::InvalidArgumentError(
        "--persistent-params sharded: this run has one rank (WORLD_SIZE unset or 1), nothing to "
        "shard the parameters over; launch several ranks (torchrun) or drop the flag");
  }

  if (c.block_modes.has_value()) {
    run.block_modes = *c.block_modes;
  } else if (c.n_ckpt || c.n_swap || c.n_hs_offload) {
    ASSIGN_OR_RETURN(run.block_modes,
                     BlockModesFromCounts(num_blocks, c.n_swap.value_or(0), c.n_ckpt.value_or(0),
                                          c.n_hs_offload.value_or(0)));
  } else if (file.has_value() && !file->block_modes.empty()) {
    run.block_modes = file->block_modes;
  } else if (file.has_value()) {
    ASSIGN_OR_RETURN(run.block_modes, BlockModesFromCounts(num_blocks, file->n_swap,
                                                           file->n_checkpoint, file->n_hs_offload));
  } else {
    run.block_modes.assign(num_blocks, BlockMode::kNone);
  }
  if (static_cast<int>(run.block_modes.size()) != num_blocks) {
    return absl::InvalidArgumentError(absl::StrCat("block modes: got ", run.block_modes.size(),
                                                   " for a model of ", num_blocks, " blocks"));
  }
  return run;
}

absl::Status CheckRunPlanKnobs(const RunPlan& plan, int n_chunks, const std::string& plan_source) {
  if (!plan.managed) return absl::OkStatus();
  auto name = [&plan_source](const std::string& source) {
    return absl::StartsWith(source, "plan.") ? absl::StrCat(plan_source, ": ", source) : source;
  };
  const std::string layout =
      absl::StrCat("this run's layout has ", n_chunks, " chunks of ", plan.chunk_bytes, " bytes");
  if (plan.n_persist < 0 || plan.n_persist > n_chunks) {
    return absl::InvalidArgumentError(absl::StrCat(name(plan.n_persist_source), " = ",
                                                   plan.n_persist, " is outside [0, ", n_chunks,
                                                   "]: ", layout));
  }
  if (plan.n_buffer_source.empty()) return absl::OkStatus();
  const int offloaded = n_chunks - plan.n_persist;
  if (offloaded == 0) {
    if (plan.n_buffer == 0) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat(
        name(plan.n_buffer_source), " = ", plan.n_buffer, " is outside [0, 0]: every one of the ",
        n_chunks, " chunks is persistent (", name(plan.n_persist_source), " = ", plan.n_persist,
        "), so nothing streams through buffers; give 0, drop it or keep fewer chunks "
        "persistent"));
  }
  if (plan.n_buffer < 1 || plan.n_buffer > offloaded) {
    return absl::InvalidArgumentError(absl::StrCat(
        name(plan.n_buffer_source), " = ", plan.n_buffer, " is outside [1, ", offloaded, "]: ",
        layout, ", ", plan.n_persist, " of them persistent, and a buffer holds one offloaded chunk"));
  }
  return absl::OkStatus();
}

int64_t MaxTrainablePositions(const ModelSpec& spec) {
  const RopeScaling& r = spec.rope_scaling;
  if (r.type == "default" || r.type.empty() || !(r.factor > 1.0)) {
    return spec.max_position_embeddings;
  }
  const int64_t original = r.original_max_position_embeddings > 0
                               ? r.original_max_position_embeddings
                               : spec.max_position_embeddings;
  const double scaled = std::floor(r.factor * static_cast<double>(original));
  if (scaled >= static_cast<double>(int64_t{1} << 40)) return int64_t{1} << 40;
  return std::max(spec.max_position_embeddings, static_cast<int64_t>(scaled));
}

absl::Status CheckSeqWithinPositions(const ModelSpec& spec, int64_t seq) {
  const int64_t limit = MaxTrainablePositions(spec);
  if (seq <= limit) return absl::OkStatus();
  const RopeScaling& r = spec.rope_scaling;
  if (limit == spec.max_position_embeddings) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--seq ", seq, " exceeds the model's max_position_embeddings = ",
        spec.max_position_embeddings, " (config.json",
        r.type == "default" || r.type.empty() ? ", no rope_scaling" : "",
        "): positions beyond it were never trained; use --seq <= ",
        spec.max_position_embeddings, " or a config with rope_scaling that extends it"));
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "--seq ", seq, " exceeds the ", limit, " positions the model's rope_scaling allows (",
      r.type, ", factor ", r.factor, " x original_max_position_embeddings ",
      r.original_max_position_embeddings > 0 ? r.original_max_position_embeddings
                                             : spec.max_position_embeddings,
      "; max_position_embeddings = ", spec.max_position_embeddings, "); use --seq <= ", limit));
}

namespace {

// The node's RAM a plan may use (less the [Host reserve]) against the plan's host bytes and
// `extra` more, each on every one of the node's `local_ranks` ranks.
struct HostRoom {
  int64_t usable = 0;
  int64_t need = 0;
  bool known = false;  // the node's RAM is known
  bool fits() const { return known && need <= usable; }
};
HostRoom RoomOnTheNode(int64_t host_memory_bytes, int32_t local_ranks, int64_t planned_bytes,
                       int64_t extra_bytes) {
  const int32_t ranks = std::max<int32_t>(local_ranks, 1);
  HostRoom r;
  r.usable = PlanHostBytes(host_memory_bytes, ranks);
  r.need = ranks * (planned_bytes + extra_bytes);
  r.known = host_memory_bytes > 0;
  return r;
}
std::string GiB(int64_t bytes) {
  return absl::StrFormat("%.1f GiB", static_cast<double>(bytes) / (1 << 30));
}
std::string UsableGiB(const HostRoom& r) { return r.known ? GiB(r.usable) : "unknown"; }

}  // namespace

// [Pinned copies by the plan's room] The planner prices the activation copies at their exact
// bytes, torch's caching host allocator hands out a power of two for each: up to twice as many.
// Where even that fits beside the plan's other host bytes, the caching allocator (which the
// swapped runs measured so far used) is kept; where it may not, the copies are page-locked at
// their exact size. Seen on a 126 GiB H200 host: a qwen2.5-14b LoRA plan with 24 swapped blocks at
// 45 824 tokens, 115 GiB of pinned copies priced, did not finish its first step in two minutes
// (docs/benchmarks.md, "Twenty-fifth session").
PinnedActivationsChoice ChoosePinnedActivations(PinnedActivations mode,
                                                const PinnedActivationsRoom& room) {
  if (mode == PinnedActivations::kExact) return {true, "--pinned-activations exact"};
  if (mode == PinnedActivations::kCaching) return {false, "--pinned-activations caching"};
  if (!room.prediction_known) {
    return {false, "no planner prediction of the host bytes (a plan file or knobs)"};
  }
  if (!room.pinned_plan || room.pinned_activation_bytes <= 0) {
    return {false, "the plan pins no activation copies"};
  }
  // The caching allocator's worst case: every copy rounded up to twice its bytes.
  const HostRoom worst = RoomOnTheNode(room.host_memory_bytes, room.local_ranks,
                                       room.planned_host_bytes, room.pinned_activation_bytes);
  if (!worst.fits()) {
    return {true, absl::StrCat(GiB(room.pinned_activation_bytes),
                               " of activation copies a rank, rounded up to powers of two, could "
                               "take up to ",
                               GiB(worst.need), " of the ", UsableGiB(worst),
                               " of RAM a plan may use; exact sizes keep to the planned ",
                               GiB(std::max<int32_t>(room.local_ranks, 1) *
                                   room.planned_host_bytes))};
  }
  return {false, absl::StrCat("up to ", GiB(worst.need),
                              " with every activation copy rounded up fits the ", GiB(worst.usable),
                              " of RAM a plan may use")};
}

SpeculativeClipChoice ChooseSpeculativeClip(SpeculativeClip mode, const SpeculativeClipRoom& room) {
  if (mode == SpeculativeClip::kOff) return {false, "--speculative-clip off"};
  if (!room.applies) {
    return {false,
            "needs clipping, one rank, one micro-batch a step, no --skip-nonfinite and "
            "offloaded chunks"};
  }
  if (mode == SpeculativeClip::kOn) return {true, "--speculative-clip on"};
  if (!room.pays) {
    return {false,
            "speculation is not measured to pay for this optimizer's CPU update (auto "
            "speculates for adamw8bit and adamw_bf16)"};
  }
  if (!room.prediction_known) {
    return {false, "no planner prediction of the host bytes (a plan file or knobs)"};
  }
  const HostRoom with_copies = RoomOnTheNode(room.host_memory_bytes, room.local_ranks,
                                             room.planned_host_bytes, room.backup_bytes);
  if (!with_copies.fits()) {
    return {false, absl::StrCat("the plan's host bytes and ", GiB(room.backup_bytes),
                                " of copies a rank take ", GiB(with_copies.need), ", more than the ",
                                UsableGiB(with_copies), " of RAM a plan may use")};
  }
  return {true, absl::StrCat(GiB(with_copies.need), " with ", GiB(room.backup_bytes),
                             " of copies a rank fits the ", GiB(with_copies.usable),
                             " of RAM a plan may use")};
}

}  // namespace memplan
