// Construction of the cost model: validation of its inputs, the block, chunk and overlap-window
// tables (cost_model.h); the memory, time and plan parts are cost_memory.cc, cost_time.cc and
// cost_assembly.cc.
#include "planner/cost/cost_model.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/head_chunking.h"
#include "common/lora_shapes.h"
#include "common/optimizer_bytes.h"
#include "common/vision_cost.h"
#include "planner/cost/analytic_trace.h"
#include "planner/cost/cost_model_internal.h"

namespace memplan {

using cost_internal::FloorLog2;

namespace {

// Forward window keys: owned chunks persistent / offloaded x activation traffic none/swap/hs.
constexpr int kFwdKeys = 6;
// Backward window keys: mode(4) x prev-stage chunk state (persistent, evicted, resident) x
// next-stage grad state (persistent, persistent without all-reduce, offloaded).
constexpr int kBwdKeys = 36;

// [Shared host CPU]
// The profile's CPU pass rates ([Two CPU passes], common/optimizer_bytes.h) are what one process
// reaches alone on the host: memplan-agent bench runs each pass on a pool of one thread per
// hardware thread (HardwareBenchOptions::adam_threads = 0) over arrays far beyond the last-level
// cache, i.e. with all the host's cores and its memory bandwidth. The local_world_size ranks of a
// node run their own passes over their own shards in the same phase of the same step (data
// parallel: each accumulates beside its backward and updates after the same norm), each with its
// share of the cores (--cpu-threads = cores / ranks in scripts/gpu-multi.sh), so they share that
// bandwidth: each rank's passes run at the host rate / local_world_size. Ranks on other nodes
// have hosts of their own and divide nothing. Assumed: the profile's figures were measured by one
// process alone on the host. (Charging each rank the whole rate under-predicted a two-rank step:
// docs/benchmarks.md, "Sharded training on two GPUs".)
CpuPassRates RankCpuPassRates(OptimizerKind kind, const HardwareSpec& hardware,
                              int64_t dtype_bytes, int32_t grad_accum, int32_t local_ranks) {
  CpuPassRates r = CpuOptimizerPassRates(kind, hardware, dtype_bytes, grad_accum);
  if (local_ranks > 1) {
    r.accumulate_params_per_second /= local_ranks;
    r.update_params_per_second /= local_ranks;
  }
  return r;
}

// The two largest of the values added so far (0 while fewer were added).
struct TopTwo {
  int64_t first = 0, second = 0;
  void Add(int64_t v) {
    if (v > first) {
      second = first;
      first = v;
    } else {
      second = std::max(second, v);
    }
  }
};

}  // namespace

bool CostModel::CanShardPersistentState(const Trace& trace, const CostOptions& options) {
  return options.world_size > 1 && trace.training.kind == TrainingKind::kFull &&
         options.optimizer != OptimizerKind::kAdamW8bit;
}

bool CostModel::CanShardPersistentParams(const Trace& trace, const CostOptions& options) {
  return CanShardPersistentState(trace, options) ||
         (options.world_size > 1 && trace.training.kind != TrainingKind::kFull);
}

std::vector<BlockMode> ArrangeBlockModes(int32_t num_blocks, const ModeCounts& counts) {
  std::vector<BlockMode> modes(static_cast<size_t>(std::max(num_blocks, 0)), BlockMode::kNone);
  int32_t j = 0;
  for (int32_t i = 0; i < counts.n_swap && j < num_blocks; ++i) modes[j++] = BlockMode::kSwap;
  for (int32_t i = 0; i < counts.n_hs_offload && j < num_blocks; ++i) {
    modes[j++] = BlockMode::kHsOffload;
  }
  for (int32_t i = 0; i < counts.n_checkpoint && j < num_blocks; ++i) {
    modes[j++] = BlockMode::kCkpt;
  }
  return modes;
}

ModeCounts CountModes(const std::vector<BlockMode>& modes) {
  ModeCounts c;
  for (BlockMode m : modes) {
    if (m == BlockMode::kSwap) ++c.n_swap;
    if (m == BlockMode::kHsOffload) ++c.n_hs_offload;
    if (m == BlockMode::kCkpt) ++c.n_checkpoint;
  }
  return c;
}

std::optional<ModeCounts> CountsIfArranged(const std::vector<BlockMode>& modes) {
  const ModeCounts c = CountModes(modes);
  if (ArrangeBlockModes(static_cast<int32_t>(modes.size()), c) != modes) return std::nullopt;
  return c;
}

BlockMode CostModel::Modes::Block(int32_t j) const {
  if (explicit_modes != nullptr) return (*explicit_modes)[static_cast<size_t>(j)];
  if (j < counts.n_swap) return BlockMode::kSwap;
  if (j < counts.n_swap + counts.n_hs_offload) return BlockMode::kHsOffload;
  if (j < counts.total()) return BlockMode::kCkpt;
  return BlockMode::kNone;
}

BlockMode CostModel::Modes::Stage(int32_t s, int32_t num_blocks) const {
  return s >= 1 && s <= num_blocks ? Block(s - 1) : BlockMode::kNone;
}

absl::StatusOr<CostModel> CostModel::Create(const Trace& trace, int64_t chunk_bytes,
                                            const HardwareSpec& hardware,
                                            const CostOptions& options) {
  if (trace.blocks.empty()) return absl::InvalidArgumentError("trace.blocks is empty");
  if (chunk_bytes <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk_bytes = ", chunk_bytes, " must be positive"));
  }
  if (options.world_size < 1 || options.grad_accum < 1) {
    return absl::InvalidArgumentError("world_size and grad_accum must be >= 1");
  }
  if (options.local_world_size < 1 || options.local_world_size > options.world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("local_world_size = ", options.local_world_size,
                     " is out of range; allowed [1, world_size = ", options.world_size, "]"));
  }
  // The agent runs adamw_bf16 on bf16 parameters only: a plan for another dtype would not run.
  if (const std::string problem = OptimizerDTypeProblem(options.optimizer, trace.param_dtype);
      !problem.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("optimizer: ", problem, "; param_dtype is ",
                                                   std::string(DTypeName(trace.param_dtype))));
  }
  if (options.world_size > 1 && (hardware.nccl_allgather_bytes_per_second <= 0 ||
                                 hardware.nccl_reduce_scatter_bytes_per_second <= 0)) {
    return absl::InvalidArgumentError(
        "hardware.nccl_allgather_bytes_per_second and "
        "hardware.nccl_reduce_scatter_bytes_per_second must be > 0 when workload.world_size > "
        "1");
  }
  if (!(options.fragmentation_factor > 0) || !std::isfinite(options.fragmentation_factor)) {
    return absl::InvalidArgumentError("fragmentation_factor must be positive");
  }
  if (hardware.h2d_pinned_bytes_per_second <= 0 || hardware.d2h_pinned_bytes_per_second <= 0 ||
      hardware.h2d_pageable_bytes_per_second <= 0 || hardware.d2h_pageable_bytes_per_second <= 0 ||
      hardware.hbm_bytes_per_second <= 0 || hardware.cpu_adam_params_per_second <= 0) {
    return absl::InvalidArgumentError("hardware transfer, HBM and CPU Adam rates must be > 0");
  }
  if (options.head_chunk_logit_bytes != 0 &&
      (options.head_chunk_logit_bytes < kMinHeadChunkLogitBytes ||
       options.head_chunk_logit_bytes > kMaxHeadChunkLogitBytes)) {
    return absl::InvalidArgumentError(
        absl::StrCat("head_chunk_logit_bytes = ", options.head_chunk_logit_bytes,
                     " is out of range; allowed 0 or [", kMinHeadChunkLogitBytes, ", ",
                     kMaxHeadChunkLogitBytes, "]"));
  }
  CostModel model;
  model.trace_ =
      RepriceHeadChunks(trace, hardware, kHeadChunkLogitBytes, options.head_chunk_logit_bytes);
  model.hardware_ = hardware;
  model.options_ = options;
  model.num_blocks_ = static_cast<int32_t>(trace.blocks.size());
  model.dtype_bytes_ = DTypeBytes(trace.param_dtype);
  model.tied_ = trace.arch.tie_word_embeddings;
  model.PrecomputeChunks(LayoutChunks(trace, chunk_bytes));
  model.Precompute();
  return model;
}

absl::StatusOr<CostModel> CostModel::ForTrace(const Trace& trace, bool build_time_tables) const {
  if (StageParamBytes(trace) != StageParamBytes(trace_) ||
      trace.param_dtype != trace_.param_dtype ||
      trace.trainable_param_count != trace_.trainable_param_count) {
    return absl::InvalidArgumentError("ForTrace needs a trace with the same parameters");
  }
  // A fresh model sharing the chunk tables: nothing O(chunks) is copied.
  CostModel model;
  model.trace_ =
      RepriceHeadChunks(trace, hardware_, kHeadChunkLogitBytes, options_.head_chunk_logit_bytes);
  model.hardware_ = hardware_;
  model.options_ = options_;
  model.options_.build_time_tables = build_time_tables;
  model.num_blocks_ = static_cast<int32_t>(trace.blocks.size());
  model.num_chunks_ = num_chunks_;
  model.dtype_bytes_ = dtype_bytes_;
  model.tied_ = tied_;
  model.chunks_ = chunks_;
  for (int k = 0; k < 2; ++k) {
    model.h2d_[k] = h2d_[k];
    model.d2h_[k] = d2h_[k];
  }
  model.bidir_ = bidir_;
  model.Precompute();
  return model;
}

CostModel CostModel::WithHeadChunkLogitBytes(int64_t logit_bytes) const {
  CostModel model = *this;
  model.trace_ = RepriceHeadChunks(trace_, hardware_, options_.head_chunk_logit_bytes, logit_bytes);
  model.options_.head_chunk_logit_bytes = logit_bytes;
  model.Precompute();
  return model;
}

void CostModel::Precompute() {
  PrecomputeBlocks();
  PrecomputeWindows();
}

void CostModel::PrecomputeBlocks() {
  const int32_t n = num_blocks_;

  // ---- blocks ----
  saved_.resize(n);
  input_.resize(n);
  block_extra_.resize(n);
  saved_prefix_.assign(n + 1, 0);
  input_prefix_.assign(n + 1, 0);
  for (int32_t j = 0; j < n; ++j) {
    const BlockTrace& b = trace_.blocks[j];
    input_[j] = b.input_bytes;
    // A checkpointed block keeps its input; treat the input as part of the saved set so that
    // checkpointing never retains more than keeping everything.
    saved_[j] = std::max(b.saved_bytes, b.input_bytes);
    block_extra_[j] = std::max(b.forward_transient_bytes, b.backward_transient_bytes);
    saved_prefix_[j + 1] = saved_prefix_[j] + saved_[j];
    input_prefix_[j + 1] = input_prefix_[j] + input_[j];
  }
  emb_retained_ = trace_.embedding.saved_bytes;
  emb_extra_ =
      std::max(trace_.embedding.forward_transient_bytes, trace_.embedding.backward_transient_bytes);
  head_saved_ = trace_.head.saved_bytes;
  head_extra_ = std::max(trace_.head.forward_transient_bytes, trace_.head.backward_transient_bytes);
  // [Vocabulary-sized allocations] The largest allocations of a step are the two vocabulary-sized
  // grads: the head's weight grad at the start of backward (with tied weights, the embedding's
  // tensor) and the embedding's at its end (with tied weights, a fresh one autograd adds into the
  // first). By then backward has interleaved grads that stay with transients that went, and no
  // hole may be that large: the caching allocator can map one above everything else. Reserved ran
  // 0.15 to 2.2 such grads above the allocated peak over 34 runs on an H200 (docs/benchmarks.md,
  // seed 2027), and 0.2 to 0.7 of one (0.20-0.66 GiB) over the twelve full fine-tunes of the
  // twenty-second session, where reserving both left them -0.6 ... +11.5 % off. The model
  // reserves one, unscaled. Only when the embedding and head are trained.
  if (trace_.training.kind == TrainingKind::kFull) {
    // [Vision tower price] A vision tower's weights share the embedding's stage; its grads are
    // allocated tensor by tensor, none vocabulary-sized.
    const int64_t tower_bytes =
        trace_.arch.IsVisionLanguage()
            ? VisionTowerParamCount(trace_.arch) * DTypeBytes(trace_.param_dtype)
            : 0;
    const int64_t embedding_bytes =
        std::max<int64_t>(0, trace_.embedding.param_bytes - tower_bytes);
    vocab_slack_ = embedding_bytes;  // an untied head's weight is the same [V, H]
  }

  // Range-max tables over V_mode(j) (see ModeValue).
  const int levels = FloorLog2(std::max(n, 1)) + 1;
  for (int mode = 0; mode < 4; ++mode) {
    auto& table = sparse_[mode];
    table.assign(levels, std::vector<int32_t>(n));
    for (int32_t j = 0; j < n; ++j) table[0][j] = j;
    for (int l = 1; l < levels; ++l) {
      const int32_t half = 1 << (l - 1);
      for (int32_t j = 0; j + (1 << l) <= n; ++j) {
        const int32_t a = table[l - 1][j], b = table[l - 1][j + half];
        table[l][j] = ModeValue(mode, b) > ModeValue(mode, a) ? b : a;
      }
    }
  }

  // ---- stages ----
  fwd_s_.assign(n + 2, 0);
  bwd_s_.assign(n + 2, 0);
  rec_s_.assign(n + 2, 0);
  fwd_s_[0] = trace_.embedding.forward_seconds;
  bwd_s_[0] = trace_.embedding.backward_seconds;
  for (int32_t j = 0; j < n; ++j) {
    fwd_s_[j + 1] = trace_.blocks[j].forward_seconds;
    bwd_s_[j + 1] = trace_.blocks[j].backward_seconds;
    rec_s_[j + 1] = trace_.blocks[j].recompute_seconds;
  }
  fwd_s_[n + 1] = trace_.head.forward_seconds;
  bwd_s_[n + 1] = trace_.head.backward_seconds;
}

void CostModel::PrecomputeChunks(ChunkLayout layout) {
  auto tables = std::make_shared<ChunkTables>();
  ChunkTables& t = *tables;
  t.layout = std::move(layout);
  num_chunks_ = t.layout.num_chunks();
  const int32_t n = num_blocks_;
  const int32_t c_count = num_chunks_;
  const double w = options_.world_size;

  const auto& first = t.layout.stage_first_chunk;
  const auto& last = t.layout.stage_last_chunk;
  t.fwd_owned_begin.assign(n + 3, 0);
  t.bwd_owned_begin.assign(n + 3, 0);
  for (int32_t s = 0; s <= n + 1; ++s) {
    t.fwd_owned_begin[s] = s == 0 ? 0 : last[s - 1] + 1;
    t.bwd_owned_begin[s] = first[s];
  }
  t.fwd_owned_begin[n + 2] = c_count;
  t.bwd_owned_begin[n + 2] = c_count;
  // Fwd-owned begins can exceed the stage's own last chunk + 1 only for empty ranges; keep the
  // sequence non-decreasing.
  for (int32_t s = 1; s <= n + 2; ++s) {
    t.fwd_owned_begin[s] = std::max(t.fwd_owned_begin[s], t.fwd_owned_begin[s - 1]);
  }

  // Windows: window k runs stage k-1 and prefetches stage k; both stages' chunks are resident.
  t.window_span.assign(2 * (n + 3), 0);
  for (int32_t k = 1; k <= n + 2; ++k) {
    const int32_t lo = first[k - 1];
    const int32_t hi = k <= n + 1 ? last[k] : last[k - 1];
    t.window_span[2 * k] = lo;
    t.window_span[2 * k + 1] = hi;
  }
  // Regular chunks (shared buffers) by prefix; oversized ones have buffers of their own.
  t.regular_prefix.assign(c_count + 1, 0);
  for (int32_t c = 0; c < c_count; ++c) {
    const bool big =
        c < static_cast<int32_t>(t.layout.chunk_oversized.size()) && t.layout.chunk_oversized[c];
    t.regular_prefix[c + 1] = t.regular_prefix[c] + (big ? 0 : 1);
  }
  t.window_span_suffix_max.assign(n + 4, 0);
  for (int32_t k = n + 2; k >= 1; --k) {
    const int32_t regular =
        t.regular_prefix[t.window_span[2 * k + 1] + 1] - t.regular_prefix[t.window_span[2 * k]];
    t.window_span_suffix_max[k] = std::max(t.window_span_suffix_max[k + 1], regular);
  }

  // ---- chunks ----
  // What the agent holds and moves per optimizer: common/optimizer_bytes.h, the definition the
  // ChunkManager allocates by.
  const OptimizerKind opt = options_.optimizer;
  // Gradient clipping reads every persistent grad for its norm and scales it in place (read and
  // write); without clipping the agent still takes the norm when there is one micro-batch.
  const int64_t norm_bpp = trace_.workload.grad_clipping     ? 3 * dtype_bytes_
                           : trace_.workload.grad_accum <= 1 ? dtype_bytes_
                                                             : 0;
  // [Fused 8-bit kernel time]: adamw8bit's pass at its measured share of the copy rate.
  const double touch_bpp =
      static_cast<double>(GpuOptimizerTouchBytesPerElem(opt, dtype_bytes_)) /
          (opt == OptimizerKind::kAdamW8bit ? kFusedAdamW8bitHbmShare : 1.0) +
      static_cast<double>(norm_bpp);
  // Full fine-tuning: the agent's state spans each chunk exactly (alignment gaps included). With
  // LoRA only the trainable share holds state.
  const bool full_ft = StageTrainableBytes(trace_) == StageParamBytes(trace_);
  // [LoRA managers] (agent/train/trainer.cc) for a trace of a known architecture: the base chunks
  // are frozen (parameters only: no grads, staging or state, FrozenChunkHost() on the host) and
  // the adapters live in chunks of their own, all persistent (common/lora_shapes.h): a constant
  // on the device that every n_persist carries.
  std::optional<LoraAdapterBytes> adapters;
  if (trace_.training.kind != TrainingKind::kFull && ArchMatchesTrace(trace_)) {
    absl::StatusOr<LoraAdapterBytes> a = PersistentLoraAdapterBytes(
        trace_.arch, trace_.training, dtype_bytes_,
        ChunkPackingOptions{t.layout.chunk_bytes, kChunkAlignmentBytes}, opt);
    if (a.ok()) adapters = *a;
  }
  const double hbm = hardware_.hbm_bytes_per_second * options_.hbm_efficiency;
  t.fill_prefix.assign(c_count + 1, 0);
  t.train_prefix.assign(c_count + 1, 0);
  t.alloc_prefix.assign(c_count + 1, 0);
  t.opt_prefix.assign(c_count + 1, 0);
  t.host_prefix.assign(c_count + 1, 0);
  t.host_transfer_prefix.assign(c_count + 1, 0);
  t.gpu_opt_prefix.assign(c_count + 1, 0);
  t.cpu_opt_prefix.assign(c_count + 1, 0);
  t.cpu_acc_prefix.assign(c_count + 1, 0);
  const CpuPassRates cpu_rates = RankCpuPassRates(opt, hardware_, dtype_bytes_,
                                                  options_.grad_accum, options_.local_world_size);
  t.gather_prefix.assign(c_count + 1, 0);
  t.pgrad_prefix.assign(c_count + 1, 0);
  const int32_t w_ranks = options_.world_size;
  // The chunk arrays' element: the model dtype, or a byte for QLoRA's frozen base, whose NF4
  // parts, scales and norms share byte chunks ([Byte chunks] in agent/chunks/chunk_manager.cc):
  // it is sharded and padded in bytes.
  const int64_t array_elem_bytes =
      trace_.training.kind == TrainingKind::kQlora && adapters.has_value() ? 1 : dtype_bytes_;
  t.shard_state = options_.shard_persistent_state && CanShardPersistentState(trace_, options_);
  // A full fine-tune shards its persistent parameters with their state; a LoRA run's frozen base
  // has no state, its persistent chunks' parameters are sharded alone ([Sharded frozen base]) and
  // the adapters stay replicated.
  t.shard_params = options_.shard_persistent_params &&
                   CanShardPersistentParams(trace_, options_) &&
                   (t.shard_state || trace_.training.kind != TrainingKind::kFull);
  int64_t max_train = 0;
  TopTwo fills;
  t.persistent_prefix.assign(c_count + 1, 0);
  if (adapters.has_value()) {
    t.adapters_persistent = true;
    t.alloc_prefix[0] = adapters->chunk_bytes;
    t.opt_prefix[0] = adapters->state_bytes;
    t.train_prefix[0] = adapters->grad_bytes;
    t.pgrad_prefix[0] = adapters->grad_bytes;
    t.persistent_prefix[0] = t.alloc_prefix[0] + t.opt_prefix[0];
    t.gpu_opt_prefix[0] = static_cast<double>(adapters->params) * touch_bpp / hbm;
  }
  for (int32_t c = 0; c < c_count; ++c) {
    const int64_t fill = t.layout.chunk_param_bytes[c];
    const int64_t train = adapters.has_value() ? 0 : t.layout.chunk_trainable_bytes[c];
    const int64_t train_params = train / dtype_bytes_;
    // The agent allocates a persistent chunk at its exact size (no tail padding); with sharded
    // state padded to a multiple of W elements, the all-gather's output.
    // [Sharded persistent parameters]: this rank's shard of the parameters only (QLoRA's byte
    // chunks: a shard of bytes).
    const int64_t alloc =
        t.shard_params  ? ShardElems(fill / array_elem_bytes, w_ranks) * array_elem_bytes
        : t.shard_state ? PaddedElems(fill / dtype_bytes_, w_ranks) * dtype_bytes_
                        : fill;
    // This rank's shard of the chunk ([Sharded chunks] in agent/chunks/chunk_manager.cc: every
    // host array holds ShardElems() elements, padding included); the whole chunk when W = 1.
    const OffloadedChunkHostBytes offloaded =
        OffloadedShardHost(opt, dtype_bytes_, options_.grad_accum, fill, options_.world_size);
    const double state_share =
        full_ft || fill == 0 ? 1.0 : static_cast<double>(train) / static_cast<double>(fill);
    // [LoRA managers]: a frozen base chunk holds its parameters only (QLoRA's NF4 chunks in
    // bytes: [Byte chunks] in agent/chunks/chunk_manager.cc); with W ranks this rank's shard
    // ([Sharded frozen base]).
    const OffloadedChunkHostBytes frozen = FrozenChunkHost(
        options_.world_size == 1
            ? fill
            : ShardElems(fill / array_elem_bytes, options_.world_size) * array_elem_bytes);
    const int64_t host =
        adapters.has_value()
            ? frozen.total()
            : offloaded.transfer_bytes +
                  (full_ft ? offloaded.state_bytes
                           : static_cast<int64_t>(std::ceil(offloaded.state_bytes * state_share)));
    const int64_t state_elems = adapters.has_value() ? 0
                                : t.shard_state      ? ShardElems(fill / dtype_bytes_, w_ranks)
                                : full_ft            ? fill / dtype_bytes_
                                                     : train_params;
    t.fill_prefix[c + 1] = t.fill_prefix[c] + fill;
    t.train_prefix[c + 1] = t.train_prefix[c] + train;
    t.alloc_prefix[c + 1] = t.alloc_prefix[c] + alloc;
    t.opt_prefix[c + 1] = t.opt_prefix[c] + PersistentStateBytes(opt, dtype_bytes_, state_elems);
    t.host_prefix[c + 1] = t.host_prefix[c] + host;
    t.host_transfer_prefix[c + 1] =
        t.host_transfer_prefix[c] +
        (adapters.has_value() ? frozen.transfer_bytes : offloaded.transfer_bytes);
    // [Sharded persistent state]: each rank updates its shard, holds its shard of the grads
    // (model dtype) from the reduce-scatter to the step and all-gathers the updated chunk.
    const int64_t updated_params = t.shard_state ? ShardElems(train_params, w_ranks) : train_params;
    t.pgrad_prefix[c + 1] = t.pgrad_prefix[c] + updated_params * dtype_bytes_;
    t.gpu_opt_prefix[c + 1] =
        t.gpu_opt_prefix[c] + static_cast<double>(updated_params) * touch_bpp / hbm;
    // (Not with sharded parameters: they are gathered where a stage uses them, in the windows.)
    t.gather_prefix[c + 1] =
        t.gather_prefix[c] +
        (t.shard_state && !t.shard_params ? static_cast<double>(alloc) * (w_ranks - 1) / w_ranks /
                                                hardware_.nccl_allgather_bytes_per_second
                                          : 0.0);
    t.cpu_opt_prefix[c + 1] = t.cpu_opt_prefix[c] + static_cast<double>(train_params) / w /
                                                        cpu_rates.update_params_per_second;
    t.cpu_acc_prefix[c + 1] =
        t.cpu_acc_prefix[c] +
        (cpu_rates.accumulate_params_per_second > 0
             ? static_cast<double>(train_params) / w / cpu_rates.accumulate_params_per_second
             : 0.0);
    max_train = std::max(max_train, train);
    fills.Add(fill);
    t.persistent_prefix[c + 1] = t.alloc_prefix[c + 1] + t.opt_prefix[c + 1];
  }
  // Offloaded chunks' grads are produced in a chunk-sized staging buffer and copied out while
  // the next one fills: two of them (the agent's layout unknown, or adapters).
  t.grad_staging_bytes = 2 * max_train;
  t.grad_staging_by_npersist.clear();
  if (options_.world_size == 1 && !adapters.has_value() && full_ft &&
      !t.layout.grad_slot_bytes_by_first_offloaded.empty()) {
    // [Grad staging slots] (common/chunk_packing.h): the blocks' offloaded grads in
    // kGradStagingSlots slots the agent allocates for the step. [Vocabulary grads in their phase]
    // The embedding's or the head's grad, when its chunk is offloaded, comes and goes once at an
    // end of backward, where the head's and the embedding's backward transients already hold it
    // (HeadMemory, EmbeddingMemory, or the profiler's measurement of the same backward); charging
    // it for the whole step too put every offloaded full fine-tune of an untied model one [V, H]
    // grad high (seeds 3131 and 2727, docs/benchmarks.md: +7.0 ... +11.5 % on four runs whose
    // peak was the head's or a block's backward).
    t.grad_staging_by_npersist.assign(c_count + 1, 0);
    for (int32_t c = c_count - 1; c >= 0; --c) {
      t.grad_staging_by_npersist[c] =
          kGradStagingSlots * t.layout.grad_slot_bytes_by_first_offloaded[c];
    }
  }
  t.sharded_staging_by_npersist.clear();
  if (options_.world_size > 1 && !adapters.has_value()) {
    // Sharded ([Sharded chunks]): an offloaded chunk's grads collect in an fp32 tensor over the
    // padded chunk until it is reduce-scattered (two chunks in flight, as above: the two largest),
    // plus the fp32 shard the collective writes and its model-dtype rounding (CUDA); on CUDA the
    // all-gather's input, one shard per gather in flight, is held as long (charged as two). Only
    // the offloaded chunks [n_persist, C) take part: per n_persist, the two largest of them.
    const int w = options_.world_size;
    t.sharded_staging_by_npersist.assign(c_count + 1, 0);
    TopTwo offloaded;
    for (int32_t c = c_count - 1; c >= 0; --c) {
      offloaded.Add(t.layout.chunk_param_bytes[c]);
      const int64_t first = offloaded.first / dtype_bytes_,
                    second = offloaded.second / dtype_bytes_;
      const int64_t shard = ShardElems(first, w);
      const int64_t flats = (PaddedElems(first, w) + PaddedElems(second, w)) * 4;
      t.sharded_staging_by_npersist[c] =
          flats + shard * (4 + dtype_bytes_) + 2 * shard * dtype_bytes_;
    }
  }
  // [Persistent all-reduce in backward] (agent/chunks/chunk_manager.cc): a persistent chunk's
  // grads are copied into an fp32 tensor and all-reduced beside the rest of backward, one left in
  // flight while the next is copied: the two largest chunks' trainable elements in fp32.
  // Only the persistent chunks (c < n_persist) take part: per n_persist, over chunks [0, n).
  t.persistent_reduce_by_npersist.assign(c_count + 1, 0);
  t.replicated_last_reduce_by_npersist.assign(c_count + 1, 0);
  t.state_reduce_prefix.assign(c_count + 1, 0);
  if (t.shard_state) {
    // [Sharded persistent state], [State reduce-scatter per group]: no constant. The chunks a
    // stage owns in forward are reduce-scattered together at its backward hook and held until the
    // next stage's hook: the bytes belong to the phase that runs in between (the next block's
    // backward, or for the embedding's stage the end of backward), PersistentReduceBytes().
    for (int32_t c = 0; c < c_count; ++c) {
      t.state_reduce_prefix[c + 1] =
          t.state_reduce_prefix[c] +
          StateReduceScatterBytes(t.layout.chunk_param_bytes[c] / dtype_bytes_, w_ranks);
    }
  } else if (options_.world_size > 1 && !adapters.has_value()) {
    // Step-long: the two largest persistent chunks' trainable elements in fp32, among those a
    // block or the head completes in backward. The embedding stage's chunks complete at the last
    // hook of backward, when nothing but grads is left: the largest of them in fp32 is charged
    // there (replicated_last_reduce_by_npersist, GradPhaseParts), not beside the blocks.
    TopTwo trains;
    int64_t embedding = 0;
    for (int32_t c = 0; c < c_count; ++c) {
      if (c < t.fwd_owned_begin[1]) {
        embedding = std::max(embedding, t.layout.chunk_trainable_bytes[c] / dtype_bytes_ * 4);
      } else {
        trains.Add(t.layout.chunk_trainable_bytes[c]);
      }
      t.persistent_reduce_by_npersist[c + 1] = (trains.first + trains.second) / dtype_bytes_ * 4;
      t.replicated_last_reduce_by_npersist[c + 1] = embedding;
    }
  }
  // The GPU optimizer updates one persistent chunk at a time; when it runs on an fp32 master
  // (adamw, sgd on bf16) that chunk's grads are first copied to fp32, at most one regular chunk's
  // elements at a time ([Sliced grad copy], common/optimizer_bytes.h).
  t.optimizer_step_extra_bytes =
      adapters.has_value()
          ? adapters->step_extra_bytes
          : StepGradCopyElems(max_train / dtype_bytes_, t.layout.chunk_bytes, dtype_bytes_) *
                StepGradCopyBytesPerElem(opt, dtype_bytes_);
  if (t.shard_state) {
    // [Sharded persistent state]: a chunk's whole grad shard widened at once, and the copies of
    // the shards whose all-gathers are in flight (two).
    t.optimizer_step_extra_bytes =
        ShardElems(max_train / dtype_bytes_, w_ranks) *
            StepGradCopyBytesPerElem(opt, dtype_bytes_) +
        (t.shard_params ? 0 : 2 * ShardElems(fills.first / dtype_bytes_, w_ranks) * dtype_bytes_);
  }
  // [Sharded persistent parameters]: Acquire(g) keeps stage g's and the next stage's gathered
  // persistent chunks, the tied head's with the embedding's chunks; the rule is
  // PersistentGatherBytesByNPersist (common/chunk_packing.h), which the agent reads too.
  t.persistent_gather_by_npersist.assign(c_count + 1, 0);
  if (t.shard_params) {
    std::vector<std::vector<int>> used(n + 2);
    for (int32_t s = 0; s <= n + 1; ++s) {
      for (int32_t c = first[s]; c >= 0 && c <= last[s]; ++c) used[s].push_back(c);
    }
    if (tied_) used[n + 1].insert(used[n + 1].end(), used[0].begin(), used[0].end());
    std::vector<int64_t> gathered(c_count);
    for (int32_t c = 0; c < c_count; ++c) {
      gathered[c] = PaddedElems(t.layout.chunk_param_bytes[c] / array_elem_bytes, w_ranks) *
                    array_elem_bytes;
    }
    t.persistent_gather_by_npersist = PersistentGatherBytesByNPersist(used, gathered);
  }

  t.tied_grad_bytes =
      tied_ ? t.train_prefix[t.fwd_owned_begin[1]] - t.train_prefix[t.fwd_owned_begin[0]] : 0;
  // The agent's buffers: shared ones sized for the largest regular chunk of the layout, and one
  // of its own for each non-persistent oversized chunk.
  t.shared_buffer_bytes = 0;
  t.oversized_suffix.assign(c_count + 1, 0);
  for (int32_t c = c_count - 1; c >= 0; --c) {
    const bool big = t.regular_prefix[c + 1] == t.regular_prefix[c];
    // The agent pads every buffer to a multiple of the world size (the all-gather's output).
    const int64_t bytes =
        PaddedElems(t.layout.chunk_param_bytes[c] / array_elem_bytes, options_.world_size) *
        array_elem_bytes;
    t.oversized_suffix[c] = t.oversized_suffix[c + 1] + (big ? bytes : 0);
    if (!big) t.shared_buffer_bytes = std::max(t.shared_buffer_bytes, bytes);
  }

  h2d_[0] = hardware_.h2d_pinned_bytes_per_second;
  d2h_[0] = hardware_.d2h_pinned_bytes_per_second;
  h2d_[1] = hardware_.h2d_pageable_bytes_per_second;
  d2h_[1] = hardware_.d2h_pageable_bytes_per_second;
  bidir_ = hardware_.bidirectional_pinned_bytes_per_second;
  chunks_ = std::move(tables);
}

void CostModel::PrecomputeWindows() {
  const int32_t n = num_blocks_;
  for (int kind = 0; kind < 2; ++kind) {
    fwd_prefix_[kind].clear();
    bwd_prefix_[kind].clear();
  }
  for (int kind = 0; kind < 2 && options_.build_time_tables; ++kind) {
    fwd_prefix_[kind].assign(kFwdKeys, std::vector<double>(n + 4, 0));
    for (int key = 0; key < kFwdKeys; ++key) {
      auto& pre = fwd_prefix_[kind][key];
      for (int32_t k = 0; k <= n + 2; ++k) {
        pre[k + 1] = pre[k] + (k >= 1 && k <= n ? ForwardWindowPure(k, key, kind) : 0.0);
      }
    }
    bwd_prefix_[kind].assign(kBwdKeys, std::vector<double>(n + 3, 0));
    for (int key = 0; key < kBwdKeys; ++key) {
      auto& pre = bwd_prefix_[kind][key];
      for (int32_t s = 0; s <= n + 1; ++s) {
        pre[s + 1] = pre[s] + (s >= 1 && s <= n ? BackwardWindowPure(s, key, kind) : 0.0);
      }
    }
  }
}

}  // namespace memplan
