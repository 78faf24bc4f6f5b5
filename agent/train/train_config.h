// Torch-free configuration of `memplan-agent train`: command-line flags, what a run takes from the
// residency plan file (read by agent/client's PlanFileFromJson) and the rule that turns block-mode
// counts into a per-block list.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "agent/client/record_json.h"
#include "agent/model/lora_options.h"
#include "agent/model/osft_options.h"
#include "common/types.h"

namespace memplan {

struct LrSchedule {
  enum class Kind { kConstant, kCosine };
  Kind kind = Kind::kConstant;
  int64_t warmup_steps = 0;
  double min_lr_ratio = 0;  // cosine: the floor, as a fraction of --lr
};

// Where the pinned host copies of swapped and offloaded activations come from: torch's caching
// host allocator (each copy rounded up to a power of two), page-locked at their exact size in the
// offloader's own pool ([Exact pinned host copies], agent/blocks/activation_offloader.cc), or
// whichever of the two the plan leaves room for (ChoosePinnedActivations).
enum class PinnedActivations { kAuto, kCaching, kExact };
// [Speculative clipped updates] (agent/chunks/chunk_manager.h): --speculative-clip; auto lets
// ChooseSpeculativeClip decide from the plan's host room.
enum class SpeculativeClip { kAuto, kOn, kOff };

struct TrainConfig {
  // Model: a preset (common/presets.h) with random init, or a Hugging Face checkpoint directory.
  std::string arch;
  std::string model_dir;
  // --arch-file: a Hugging Face config.json (or a directory holding one), random init like --arch.
  std::string arch_file;
  // Data: a token file (agent/io/token_file.h) or a synthetic stream.
  std::string data_file;
  int raw_token_bytes = 0;  // headerless token files: 2 or 4
  bool synthetic_data = false;
  double synthetic_noise = 0.1;
  // Vision-language data (docs/agent.md, "Vision-language data"): a sample file of
  // scripts/prepare-vl-data.py (--data-vl), or synthetic samples of synthetic_images images of
  // image_height x image_width pixels each (--synthetic-images N --image-size HxW).
  std::string vl_data_file;
  int64_t synthetic_images = 0;
  int64_t image_height = 0;
  int64_t image_width = 0;
  // --vision-checkpoint: the vision tower's blocks recompute in backward
  // (LlamaModelOptions::vision_checkpoint); a plan may also turn it on (its vision_checkpoint).
  bool vision_checkpoint = false;
  // Workload and optimisation.
  int64_t batch = 1;
  int64_t seq = 128;
  int64_t steps = 10;
  int grad_accum = 1;
  double lr = 1e-4;
  double clip = 1.0;  // max grad norm, 0 = off
  double weight_decay = 0.01;
  // --skip-nonfinite: a step with a non-finite loss or gradient skips its update instead of
  // stopping the run (TrainerOptions::skip_nonfinite).
  bool skip_nonfinite = false;
  // Learning-rate schedule ([Learning-rate schedule], LearningRateFactor below): --lr-schedule,
  // --warmup-steps, --min-lr-ratio. The default, constant without warmup, is a fixed --lr.
  LrSchedule lr_schedule;
  // Held-out evaluation: --eval-tokens FILE (a token file like --data), every --eval-every steps
  // (0: after the last step only), the mean loss of --eval-batches micro-batches, no gradients.
  std::string eval_tokens_file;
  int64_t eval_every = 0;
  int64_t eval_batches = 4;
  std::optional<DType> dtype;   // default: bf16 on CUDA, fp32 on CPU; bf16 with adamw_bf16
  std::optional<OptimizerKind> optimizer;  // default: the plan file's, else adamw
  // --param-rounding: how adamw8bit writes its fp32 update into bf16 parameters (it keeps no
  // master): stochastic (default; [Stochastic rounding], agent/chunks/stochastic_rounding.h) or
  // nearest (bitsandbytes' AdamW8bit exactly).
  bool stochastic_rounding = true;
  bool param_rounding_given = false;
  // LoRA (--lora-rank > 0): adapters on the frozen base; PEFT-format adapter in and out, and a
  // merged Hugging Face export.
  LoraOptions lora;
  bool lora_alpha_given = false;  // --lora-alpha / --lora-dropout on the command line
  bool lora_dropout_given = false;
  // OSFT (--osft-rank-ratio in (0, 1)): [OSFT] in agent/model/osft.h; targets default to all
  // projections. Unmanaged (each rank holds the whole model), no checkpoints yet.
  OsftOptions osft;
  std::string load_adapter_dir;
  std::string save_adapter_dir;
  std::string merge_export_dir;
  std::string device = "auto";  // cpu | cuda | cuda:N | auto
  bool plain = false;           // unmanaged, all NONE: plain autograd without per-group Functions
  // --moe-experts loop: a mixture of experts' per-expert loop instead of its grouped GEMMs
  // (LlamaModelOptions::moe_experts, [Grouped experts] in agent/model/moe.cc), for comparisons.
  bool moe_loop_experts = false;
  uint64_t seed = 0;
  // Plan knobs; any chunk knob or a plan file makes the run managed (ChunkManager).
  std::optional<int64_t> chunk_bytes;
  std::optional<int> n_persist;
  std::optional<int> n_buffer;
  std::optional<std::vector<BlockMode>> block_modes;
  std::optional<int> n_ckpt;
  std::optional<int> n_swap;
  std::optional<int> n_hs_offload;
  std::optional<HostMemoryKind> host_memory;
  // --persistent-state sharded|replicated: several ranks ([Sharded persistent state]).
  std::optional<bool> shard_persistent_state;
  // --persistent-params sharded|replicated: several ranks, the persistent chunks' parameters
  // sharded too ([Sharded persistent parameters]; implies the state sharded; LoRA: the frozen
  // base's, [Sharded frozen base]).
  std::optional<bool> shard_persistent_params;
  // --head-chunk-mib N: fp32 logit bytes per LM head chunk (ResidencyPlan::head_chunk_logit_bytes,
  // common/head_chunking.h); else the plan's, or kPlainHeadChunkLogitBytes with --plain.
  std::optional<int64_t> head_chunk_logit_bytes;
  // --accumulate-offloaded-grads device|host: several ranks, --grad-accum > 1: the offloaded
  // chunks' grads summed on the device and reduce-scattered once per step (true), or
  // reduce-scattered every micro-batch into the host sum (false, the default; what the planner
  // prices). ChunkManagerOptions::accumulate_sharded_grads_on_device.
  bool accumulate_offloaded_grads_on_device = false;
  std::string plan_file;
  int offload_in_flight = 2;
  // --pinned-activations auto|caching|exact: ActivationOffloadOptions::exact_pinned_host, chosen
  // by ChoosePinnedActivations.
  PinnedActivations pinned_activations = PinnedActivations::kAuto;
  SpeculativeClip speculative_clip = SpeculativeClip::kAuto;
  // --device-update-share: ChunkManagerOptions::device_update_share ([Device updates of
  // offloaded chunks]); 0, off, by default.
  double device_update_share = 0;
  int cpu_threads = 0;  // 0: the host's hardware threads / the ranks on this host
  // Checkpoints and output.
  std::string save_dir;
  int64_t save_every = 0;  // 0: only at the end (when --save is given)
  std::string resume_dir;
  int64_t log_every = 1;
  // Diagnostics: per-group device memory of every step, as TSV (agent/profiler/memory_timeline.h).
  std::string memory_timeline;
  // Diagnostics: a Kineto trace of step kernel_trace_step (agent/profiler/kernel_trace.h).
  std::string kernel_trace;
  int64_t kernel_trace_step = 3;
  // Cap on the CUDA caching allocator's reserved bytes (setMemoryFraction): 0 = none; -1 = the
  // plan's predicted reserved peak (its peak less the CUDA context; needs --planner). At the cap
  // the allocator gives its cached free blocks back and retries before it reports out of memory.
  int64_t memory_limit_bytes = 0;
  // Live Prometheus metrics on HOST:PORT while training (agent/metrics); empty: off.
  std::string metrics_address;
  // CUDA caching-allocator settings (PYTORCH_CUDA_ALLOC_CONF syntax), applied before the first
  // device allocation. Default: expandable segments (reserved memory tracks allocated memory, which
  // is what the planner predicts); "" keeps PyTorch's default; PYTORCH_CUDA_ALLOC_CONF in the
  // environment wins over the default but not over the flag.
  std::optional<std::string> allocator_conf;
};

// The residency a run applies once flags and plan file are combined.
struct RunPlan {
  bool managed = false;
  int64_t chunk_bytes = int64_t{64} << 20;
  int n_persist = 0;
  int n_buffer = 2;
  HostMemoryKind host_memory = HostMemoryKind::kPinned;
  std::vector<BlockMode> block_modes;  // one per block
  // Several ranks: persistent chunks' optimizer state sharded, parameters replicated
  // (ChunkManagerOptions::shard_persistent_state).
  bool shard_persistent_state = false;
  // And their parameters sharded, gathered on use (ChunkManagerOptions::shard_persistent_params);
  // LoRA: the frozen base's persistent chunks, without shard_persistent_state.
  bool shard_persistent_params = false;
  // fp32 logit bytes per LM head chunk the model runs (LlamaModelOptions::head_chunk_logit_bytes):
  // --head-chunk-mib, else the plan's (0 read as kHeadChunkLogitBytes), else
  // kPlainHeadChunkLogitBytes for --plain, else kHeadChunkLogitBytes.
  int64_t head_chunk_logit_bytes = 0;
  // Where n_persist and n_buffer came from ("--n-persist", "plan.n_buffer"); empty: the default.
  std::string n_persist_source;
  std::string n_buffer_source;
};

// [Learning-rate schedule] The factor --lr is multiplied by for the update of the optimizer step
// that follows `completed_steps` steps, in a run of `total_steps` (--steps): transformers'
// get_constant_schedule_with_warmup / get_cosine_with_min_lr_schedule_with_warmup (one half
// cosine; with min_lr_ratio 0 it is get_cosine_schedule_with_warmup), whose scheduler has stepped
// once per optimizer step before it. Warmup rises linearly from 0 (the first update's factor is
// 0). A function of the step number alone, so a resumed run continues the same curve.
double LearningRateFactor(const LrSchedule& schedule, int64_t completed_steps,
                          int64_t total_steps);

// Parses the arguments after `train`. INVALID_ARGUMENT names the flag. With --resume the LoRA
// flag combination is left to AdoptCheckpointLora (the checkpoint may supply the rank and
// targets); the CLI always calls it.
absl::StatusOr<TrainConfig> ParseTrainArgs(const std::vector<std::string>& args);
// [LoRA resume settings] `saved`: the LoRA settings of --resume's checkpoint (its
// adapter_config.json, read from `source`), or none when it is not a LoRA checkpoint. Takes the
// rank, alpha, targets and dropout the flags leave out from it; a flag that contradicts it
// (rank, alpha or target set) is INVALID_ARGUMENT naming the flag, both values and `source`. Then
// checks the LoRA flag combination (a LoRA-only flag without a rank).
absl::Status AdoptCheckpointLora(TrainConfig* config, const std::optional<LoraOptions>& saved,
                                 const std::string& source);
std::string TrainUsage();

// The plan knob flags of `c` as the fixed knobs of a Plan request ([Fixed knobs with --planner]);
// --persistent-params sharded implies the state sharded ([Sharded persistent parameters]), except
// for LoRA (the frozen base has no state; the adapters' stays replicated).
FixedKnobs PlannerFixedKnobs(const TrainConfig& c);

// "none,ckpt,swap,hs_offload,..." (case-insensitive; "hs-offload" accepted).
absl::StatusOr<std::vector<BlockMode>> ParseBlockModeList(absl::string_view csv);

// Block order of architecture.md: offloading blocks (SWAP, then HS_OFFLOAD) early, interleaved
// with CKPT blocks, NONE blocks last. E.g. 6 blocks, 1 swap, 2 hs, 2 ckpt:
// swap, ckpt, hs_offload, ckpt, hs_offload, none. INVALID_ARGUMENT if the counts exceed the blocks.
absl::StatusOr<std::vector<BlockMode>> BlockModesFromCounts(int num_blocks, int n_swap, int n_ckpt,
                                                            int n_hs_offload);

// The plan a run may apply from a plan file (read by PlanFileFromJson, agent/client/record_json.h:
// a bare ResidencyPlan or any object holding it under "plan", e.g. a PlanResponse).
// FAILED_PRECONDITION quoting the planner's reason when a holder's verdict is "fits": false (a
// PlanResponse that does not fit carries its least-bad plan, which must not be run). world_size 0
// reads as 1.
absl::StatusOr<ResidencyPlan> RunnablePlan(const PlanFile& file);
// PlanFileFromJson, then RunnablePlan.
absl::StatusOr<ResidencyPlan> ParsePlanJson(absl::string_view json);

// [Layout fingerprint] check (common/chunk_packing.h): the chunk layout a plan was made for
// (plan.n_chunks, plan.layout_fingerprint) against the one this agent builds for the run.
// FAILED_PRECONDITION naming `source` and both sides when they differ. A plan without a
// fingerprint (an older planner, a hand-written file) is accepted: OK, with *warning set.
absl::Status CheckPlanLayout(const ResidencyPlan& plan, const std::string& source,
                             int agent_n_chunks, const std::string& agent_fingerprint,
                             std::string* warning);

// FAILED_PRECONDITION naming the flags when the plan file was made for another training method
// (PlanFile::training: full vs LoRA, another rank or target set): its memory figures are not this
// run's. A file that names no method is accepted.
absl::Status CheckPlanTraining(const TrainConfig& config,
                               const std::optional<TrainingMethod>& plan_training);

// --optimizer, else the plan file's, else adamw. INVALID_ARGUMENT naming --optimizer when the flag
// and the plan file disagree, or naming --optimizer and --dtype when the dtype does not fit
// (adamw_bf16 needs bf16).
absl::StatusOr<OptimizerKind> ResolveOptimizer(const TrainConfig& config,
                                               std::optional<OptimizerKind> plan_optimizer);

// Flags override the plan file field by field; block modes come from --block-modes, else the
// counts flags, else the plan's list, else the plan's counts, else all NONE. `world_size` is the
// run's (WORLD_SIZE): a plan made for another world size is refused, and world size > 1 always
// runs managed (the chunks are what is sharded; --plain is refused). A plan's
// head_chunk_logit_bytes outside 0 or [1 MiB, 4 GiB] is INVALID_ARGUMENT naming it.
absl::StatusOr<RunPlan> ResolveRunPlan(const TrainConfig& config, int num_blocks,
                                       const std::optional<ResidencyPlan>& plan_file,
                                       int world_size = 1);

// [Plan knobs are refused, never clamped] The resolved n_persist and n_buffer against the chunk
// layout the run builds (`n_chunks`): n_persist in [0, n_chunks]; with offloaded chunks n_buffer
// in [1, n_chunks - n_persist]; with every chunk persistent only 0 (as the planner prints it).
// INVALID_ARGUMENT naming the knob (the flag, or `plan_source`'s field), its value and the allowed
// range.
absl::Status CheckRunPlanKnobs(const RunPlan& plan, int n_chunks, const std::string& plan_source);

// --seq against the positions the model was made for: max_position_embeddings, or with RoPE
// scaling (linear, dynamic, llama3, yarn) factor x original_max_position_embeddings
// (max_position_embeddings where the config gives no original) when that is larger.
// INVALID_ARGUMENT naming both numbers.
int64_t MaxTrainablePositions(const ModelSpec& spec);
absl::Status CheckSeqWithinPositions(const ModelSpec& spec, int64_t seq);

// [Pinned copies by the plan's room] What --pinned-activations auto decides from, per rank: the
// planner's prediction (absent for a --plan-file or knob run) and the node's RAM.
struct PinnedActivationsRoom {
  bool prediction_known = false;
  bool pinned_plan = false;             // the plan's host memory is pinned
  int64_t planned_host_bytes = 0;       // the prediction's pinned + pageable host bytes
  int64_t pinned_activation_bytes = 0;  // of them, the activation copies' (pinned less chunks')
  int32_t local_ranks = 1;
  int64_t host_memory_bytes = 0;        // the node's RAM; 0 unknown
};
struct PinnedActivationsChoice {
  bool exact = false;
  std::string reason;
};
// kExact and kCaching as given. kAuto: exact when the caching allocator's worst case, every
// activation copy rounded up to twice its bytes, would not fit the node's RAM less the [Host
// reserve] (common/host_reserve.h) on every local rank, where the plan's exact bytes do; the
// caching allocator otherwise (and without a prediction or activation copies).
PinnedActivationsChoice ChoosePinnedActivations(PinnedActivations mode,
                                                const PinnedActivationsRoom& room);

// [Speculative clipped updates] What --speculative-clip auto decides from, per rank.
struct SpeculativeClipRoom {
  bool applies = false;  // SpeculationApplies() and something offloaded
  bool pays = false;     // SpeculationPays() for the run's optimizer
  bool prediction_known = false;
  int64_t planned_host_bytes = 0;  // the prediction's pinned + pageable host bytes
  int64_t backup_bytes = 0;        // SpeculationBackupBytes() over the offloaded chunks
  int32_t local_ranks = 1;
  int64_t host_memory_bytes = 0;  // the node's RAM; 0 unknown
};
struct SpeculativeClipChoice {
  bool on = false;
  std::string reason;
};
// kOff: off; kOn and kAuto: off where speculation does not apply (no clipping, several ranks,
// grad_accum > 1, --skip-nonfinite, nothing offloaded); kOn: on otherwise; kAuto: on when
// speculation pays for the optimizer and the plan's host bytes and the backups fit the node's RAM
// less the [Host reserve] on every local rank (off without a planner prediction).
SpeculativeClipChoice ChooseSpeculativeClip(SpeculativeClip mode, const SpeculativeClipRoom& room);

}  // namespace memplan
