#include "planner/cost/cost_model.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/lora_shapes.h"
#include "common/optimizer_bytes.h"

namespace memplan {
namespace {

constexpr int kNoneMode = static_cast<int>(BlockMode::kNone);
constexpr int kCkptMode = static_cast<int>(BlockMode::kCkpt);
constexpr int kSwapMode = static_cast<int>(BlockMode::kSwap);
constexpr int kHsMode = static_cast<int>(BlockMode::kHsOffload);

// Forward window keys: owned chunks persistent / offloaded x activation traffic none/swap/hs.
constexpr int kFwdKeys = 6;
// Backward window keys: mode(4) x prev-stage chunk state (persistent, evicted, resident) x
// next-stage grad state (persistent, persistent without all-reduce, offloaded).
constexpr int kBwdKeys = 36;

int FloorLog2(int32_t x) { return 31 - __builtin_clz(static_cast<unsigned>(x)); }

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
// process alone on the host. Two H200s of one host, llama-23b (docs/benchmarks.md): the host
// AdamW took 3.03 s of a 4.30 s step where the model, charging each rank the whole rate,
// predicted 2.69 s.
CpuPassRates RankCpuPassRates(OptimizerKind kind, const HardwareSpec& hardware,
                              int32_t local_ranks) {
  CpuPassRates r = CpuOptimizerPassRates(kind, hardware);
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

double StepTime::IterationSeconds(int32_t grad_accum) const {
  const double ga = std::max(1, grad_accum);
  // A chunk's accumulate starts when its grads land; offloaded chunks are the last blocks', whose
  // backward runs first, so the pass runs beside the micro-batch's backward and ends with it
  // unless it is the longer of the two.
  const double bwd = std::max(backward_seconds, cpu_accumulate_seconds);
  // Written so that T_acc = T_norm = 0 (a profile without the two-pass figures) gives the
  // single-pass formula bit for bit.
  const double tail =
      cpu_optimizer_overlaps
          ? std::max(backward_seconds + gpu_optimizer_seconds,
                     cpu_accumulate_seconds + cpu_optimizer_seconds)
          : bwd + cpu_norm_seconds + std::max(gpu_optimizer_seconds, cpu_optimizer_seconds);
  return ga * forward_seconds + (ga - 1) * bwd + tail + fixed_seconds;
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
  CostModel model;
  model.trace_ = trace;
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
  model.trace_ = trace;
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
  // hole is that large: the caching allocator maps each above everything else. Reserved ran
  // 0.15 to 2.2 such grads above the allocated peak over 34 runs on an H200 (docs/benchmarks.md,
  // seed 2027); the model reserves both, unscaled. Only when the embedding and head are trained.
  if (trace_.training.kind == TrainingKind::kFull) {
    vocab_slack_ = trace_.embedding.param_bytes + (trace_.arch.tie_word_embeddings
                                                       ? trace_.embedding.param_bytes
                                                       : trace_.head.param_bytes);
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
  const int64_t touch_bpp = GpuOptimizerTouchBytesPerElem(opt, dtype_bytes_) + norm_bpp;
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
  const CpuPassRates cpu_rates = RankCpuPassRates(opt, hardware_, options_.local_world_size);
  t.gather_prefix.assign(c_count + 1, 0);
  t.pgrad_prefix.assign(c_count + 1, 0);
  const int32_t w_ranks = options_.world_size;
  t.shard_state = options_.shard_persistent_state && CanShardPersistentState(trace_, options_);
  t.shard_params = t.shard_state && options_.shard_persistent_params;
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
    t.gpu_opt_prefix[0] = static_cast<double>(adapters->params * touch_bpp) / hbm;
  }
  for (int32_t c = 0; c < c_count; ++c) {
    const int64_t fill = t.layout.chunk_param_bytes[c];
    const int64_t train = adapters.has_value() ? 0 : t.layout.chunk_trainable_bytes[c];
    const int64_t train_params = train / dtype_bytes_;
    // The agent allocates a persistent chunk at its exact size (no tail padding); with sharded
    // state padded to a multiple of W elements, the all-gather's output.
    // [Sharded persistent parameters]: this rank's shard of the parameters only.
    const int64_t alloc =
        t.shard_params  ? ShardElems(fill / dtype_bytes_, w_ranks) * dtype_bytes_
        : t.shard_state ? PaddedElems(fill / dtype_bytes_, w_ranks) * dtype_bytes_
                        : fill;
    // This rank's shard of the chunk ([Sharded chunks] in agent/chunks/chunk_manager.cc: every
    // host array holds ShardElems() elements, padding included); the whole chunk when W = 1.
    const OffloadedChunkHostBytes offloaded =
        OffloadedShardHost(opt, dtype_bytes_, options_.grad_accum, fill, options_.world_size);
    const double state_share =
        full_ft || fill == 0 ? 1.0 : static_cast<double>(train) / static_cast<double>(fill);
    // [LoRA managers]: a frozen base chunk holds its parameters only (QLoRA's NF4 chunks in
    // bytes: [Byte chunks] in agent/chunks/chunk_manager.cc).
    const OffloadedChunkHostBytes frozen = FrozenChunkHost(
        options_.world_size == 1
            ? fill
            : ShardElems(fill / dtype_bytes_, options_.world_size) * dtype_bytes_);
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
        t.gpu_opt_prefix[c] + static_cast<double>(updated_params * touch_bpp) / hbm;
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
    // kGradStagingSlots slots the agent allocates for the step; the embedding's or the head's
    // grad, when its chunk is offloaded, comes and goes once at an end of backward: the largest
    // such chunk's.
    t.grad_staging_by_npersist.assign(c_count + 1, 0);
    int64_t nonblock = 0;
    for (int32_t c = c_count - 1; c >= 0; --c) {
      nonblock = std::max(nonblock, t.layout.chunk_nonblock_bytes[c]);
      t.grad_staging_by_npersist[c] =
          kGradStagingSlots * t.layout.grad_slot_bytes_by_first_offloaded[c] + nonblock;
    }
  }
  if (options_.world_size > 1 && !adapters.has_value()) {
    // Sharded ([Sharded chunks]): a chunk's grads collect in an fp32 tensor over the padded
    // chunk until it is reduce-scattered (two chunks in flight, as above: the two largest), plus
    // the fp32 shard the collective writes and its model-dtype rounding (CUDA); on CUDA the
    // all-gather's input, one shard per gather in flight, is held as long (charged as two).
    const int w = options_.world_size;
    const int64_t shard = ShardElems(fills.first / dtype_bytes_, w);
    t.grad_staging_bytes =
        (PaddedElems(fills.first / dtype_bytes_, w) + PaddedElems(fills.second / dtype_bytes_, w)) * 4 +
        shard * (4 + dtype_bytes_) + 2 * shard * dtype_bytes_;
  }
  // [Persistent all-reduce in backward] (agent/chunks/chunk_manager.cc): a persistent chunk's
  // grads are copied into an fp32 tensor and all-reduced beside the rest of backward, one left in
  // flight while the next is copied: the two largest chunks' trainable elements in fp32.
  // Only the persistent chunks (c < n_persist) take part: per n_persist, over chunks [0, n).
  t.persistent_reduce_by_npersist.assign(c_count + 1, 0);
  if (t.shard_state) {
    // [Sharded persistent state], [State reduce-scatter per group] (agent/chunks/
    // chunk_manager.cc): the chunks a group completes in backward (those its stage owns in
    // forward) are reduce-scattered together and finished at the next group's hook: the fp32 flat
    // tensors over their padded spans and the fp32 shards the collectives write, for the stage
    // whose persistent chunks hold the most.
    std::vector<int64_t> stage_bytes(t.fwd_owned_begin.size(), 0);
    size_t s = 0;
    int64_t worst = 0;
    for (int32_t c = 0; c < c_count; ++c) {
      while (s + 1 < t.fwd_owned_begin.size() && c >= t.fwd_owned_begin[s + 1]) ++s;
      const int64_t elems = t.layout.chunk_param_bytes[c] / dtype_bytes_;
      stage_bytes[s] += (PaddedElems(elems, w_ranks) + ShardElems(elems, w_ranks)) * 4;
      worst = std::max(worst, stage_bytes[s]);
      t.persistent_reduce_by_npersist[c + 1] = worst;
    }
  } else if (options_.world_size > 1 && !adapters.has_value()) {
    // The two largest persistent chunks' trainable elements in fp32.
    TopTwo trains;
    for (int32_t c = 0; c < c_count; ++c) {
      trains.Add(t.layout.chunk_trainable_bytes[c]);
      t.persistent_reduce_by_npersist[c + 1] = (trains.first + trains.second) / dtype_bytes_ * 4;
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
      gathered[c] =
          PaddedElems(t.layout.chunk_param_bytes[c] / dtype_bytes_, w_ranks) * dtype_bytes_;
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
        PaddedElems(t.layout.chunk_param_bytes[c] / dtype_bytes_, options_.world_size) *
        dtype_bytes_;
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

int64_t CostModel::ModeValue(int mode, int32_t j) const {
  // V_mode(j) = retained bytes of blocks [0, j) all in `mode` + block j's own saved set and
  // transient peak + what its predecessor (same mode) has in flight.
  int64_t retained = 0;
  if (mode == kNoneMode) retained = saved_prefix_[j];
  if (mode == kCkptMode) retained = input_prefix_[j];
  int64_t act = 0;
  if (j > 0 && mode == kSwapMode) act = saved_[j - 1];
  if (j > 0 && mode == kHsMode) act = input_[j - 1];
  return retained + saved_[j] + block_extra_[j] + act;
}

int32_t CostModel::RangeMaxIndex(int mode, int32_t lo, int32_t hi) const {
  const int l = FloorLog2(hi - lo);
  const int32_t a = sparse_[mode][l][lo];
  const int32_t b = sparse_[mode][l][hi - (1 << l)];
  const int64_t va = ModeValue(mode, a), vb = ModeValue(mode, b);
  if (vb > va || (vb == va && b < a)) return b;
  return a;
}

int64_t CostModel::ActBytes(int32_t block, BlockMode mode) const {
  if (mode == BlockMode::kSwap) return saved_[block];
  if (mode == BlockMode::kHsOffload) return input_[block];
  return 0;
}

int64_t CostModel::RetainedBytes(int32_t block, BlockMode mode) const {
  if (mode == BlockMode::kNone) return saved_[block];
  if (mode == BlockMode::kCkpt) return input_[block];
  return 0;
}

int64_t CostModel::ChunkSum(const std::vector<int64_t>& prefix, int64_t lo, int64_t hi) const {
  lo = std::clamp<int64_t>(lo, 0, num_chunks_);
  hi = std::clamp<int64_t>(hi, 0, num_chunks_);
  return hi > lo ? prefix[hi] - prefix[lo] : 0;
}

double CostModel::ChunkSumD(const std::vector<double>& prefix, int64_t lo, int64_t hi) const {
  lo = std::clamp<int64_t>(lo, 0, num_chunks_);
  hi = std::clamp<int64_t>(hi, 0, num_chunks_);
  return hi > lo ? prefix[hi] - prefix[lo] : 0.0;
}

// ---------------------------------------------------------------------------------------------
// Memory

int32_t CostModel::MinBuffers(int32_t n_persist) const {
  if (n_persist >= num_chunks_) return 0;
  const int32_t n = num_blocks_;
  // Regular chunks in [max(lo, n_persist), hi].
  auto count = [&](int32_t lo, int32_t hi) {
    const int32_t start = std::max(lo, n_persist);
    if (hi < start) return 0;
    return chunks_->regular_prefix[hi + 1] - chunks_->regular_prefix[start];
  };
  // Windows with lo >= n_persist count their whole span (suffix max); the others count
  // [n_persist, hi], largest for the last of them since hi is non-decreasing.
  int32_t lo_k = 1, hi_k = n + 3;  // first window k in [1, n+2] with span lo >= n_persist
  while (lo_k < hi_k) {
    const int32_t mid = (lo_k + hi_k) / 2;
    if (chunks_->window_span[2 * mid] >= n_persist) {
      hi_k = mid;
    } else {
      lo_k = mid + 1;
    }
  }
  int32_t need = chunks_->window_span_suffix_max[std::min(lo_k, n + 3)];
  if (lo_k > 1)
    need = std::max(need, count(chunks_->window_span[2 * (lo_k - 1)],
                                chunks_->window_span[2 * (lo_k - 1) + 1]));
  if (tied_) {
    // The LM head reads the tied embedding weight: windows N+1 and N+2 also hold its chunks.
    const int32_t f0 = chunks_->layout.stage_first_chunk[0],
                  l0 = chunks_->layout.stage_last_chunk[0];
    for (int32_t k = n + 1; k <= n + 2; ++k) {
      const int32_t lo = chunks_->window_span[2 * k], hi = chunks_->window_span[2 * k + 1];
      const int32_t overlap = count(std::max(lo, f0), std::min(hi, l0));
      need = std::max(need, count(lo, hi) + count(f0, l0) -
                                (std::max(lo, f0) <= std::min(hi, l0) ? overlap : 0));
    }
  }
  return need;
}

int64_t CostModel::PersistentRawBytes(int32_t n_persist) const {
  return chunks_->persistent_prefix[n_persist];
}

int32_t CostModel::MaxPersistWithin(int64_t budget_bytes, int32_t max_persist) const {
  max_persist = std::clamp(max_persist, 0, num_chunks_);
  const auto end = chunks_->persistent_prefix.begin() + max_persist + 1;
  return static_cast<int32_t>(
             std::upper_bound(chunks_->persistent_prefix.begin(), end, budget_bytes) -
             chunks_->persistent_prefix.begin()) -
         1;
}

int64_t CostModel::GradPhaseRawBytes(int32_t n_persist) const {
  // Persistent grads are produced during backward (nothing holds them before the first block's
  // backward); they are all alive when the embedding's backward ends, next to its transient,
  // and in the optimizer step, next to the fp32 copy of one chunk's grads (mixed precision).
  const bool updates_on_device = n_persist > 0 || chunks_->adapters_persistent;
  const int64_t step_extra = updates_on_device ? chunks_->optimizer_step_extra_bytes : 0;
  return chunks_->pgrad_prefix[n_persist] + std::max(emb_retained_ + emb_extra_, step_extra);
}

int64_t CostModel::GradsLiveInBackward(int32_t j, int32_t n_persist) const {
  // Chunks first used by a stage after block j's (stage j + 1) hold only later blocks' (or the
  // head's) parameters, whose grads are done; a chunk that block j shares with its successor is
  // left out (at most one chunk).
  const int32_t begin = chunks_->fwd_owned_begin[j + 2];
  int64_t live = chunks_->tied_grad_bytes;
  if (n_persist > begin) live += chunks_->pgrad_prefix[n_persist] - chunks_->pgrad_prefix[begin];
  return live;
}

int64_t CostModel::BackwardGradsImpl(const Modes& m, int32_t n_persist, int* phase) const {
  int64_t best = 0;
  if (phase != nullptr) *phase = -1;
  for (int32_t j = 0; j < num_blocks_; ++j) {
    const int64_t v = PhaseTotal(j, m) + GradsLiveInBackward(j, n_persist);
    if (v > best) {
      best = v;
      if (phase != nullptr) *phase = j;
    }
  }
  return best;
}

int64_t CostModel::BackwardGradsRawBytes(const ModeCounts& counts, int32_t n_persist) const {
  Modes m;
  m.counts = counts;
  return BackwardGradsImpl(m, n_persist, nullptr);
}

int64_t CostModel::StepDynamicRawBytes(const ModeCounts& counts, int64_t dyn,
                                       int32_t n_persist) const {
  return std::max({dyn, GradPhaseRawBytes(n_persist), BackwardGradsRawBytes(counts, n_persist)});
}

CostModel::BackwardGradsByPersist CostModel::BackwardGradsTable(const ModeCounts& counts) const {
  // BackwardGradsImpl's max over blocks j of phase_j + tied + (pgrad[n] - pgrad[begin_j] when
  // n > begin_j): begin_j never decreases with j, so the blocks with begin_j < n are a prefix
  // (their term grows with pgrad[n]) and the others a suffix (a constant).
  Modes m;
  m.counts = counts;
  BackwardGradsByPersist t;
  t.model_ = this;
  const int32_t n = num_blocks_;
  t.begin_.resize(n);
  t.prefix_max_.resize(n);
  t.suffix_max_.resize(n);
  std::vector<int64_t> phase(n);
  for (int32_t j = 0; j < n; ++j) {
    phase[j] = PhaseTotal(j, m);
    t.begin_[j] = chunks_->fwd_owned_begin[j + 2];
    const int64_t v = phase[j] - chunks_->pgrad_prefix[t.begin_[j]];
    t.prefix_max_[j] = j == 0 ? v : std::max(t.prefix_max_[j - 1], v);
  }
  for (int32_t j = n - 1; j >= 0; --j) {
    t.suffix_max_[j] = j == n - 1 ? phase[j] : std::max(t.suffix_max_[j + 1], phase[j]);
  }
  return t;
}

int64_t CostModel::BackwardGradsByPersist::At(int32_t n_persist) const {
  const ChunkTables& c = *model_->chunks_;
  // Blocks [0, k) have begin_j < n_persist.
  const int32_t k = static_cast<int32_t>(
      std::lower_bound(begin_.begin(), begin_.end(), n_persist) - begin_.begin());
  int64_t best = std::numeric_limits<int64_t>::min();
  if (k > 0) best = prefix_max_[k - 1] + c.pgrad_prefix[n_persist];
  if (k < static_cast<int32_t>(begin_.size())) best = std::max(best, suffix_max_[k]);
  if (best == std::numeric_limits<int64_t>::min()) return 0;  // no blocks
  return std::max<int64_t>(0, best + c.tied_grad_bytes);
}

int64_t CostModel::StepDynamicRawBytes(const BackwardGradsByPersist& grads, int64_t dyn,
                                       int32_t n_persist) const {
  return std::max({dyn, GradPhaseRawBytes(n_persist), grads.At(n_persist)});
}

int32_t CostModel::MaxPersistForGradPhase(int64_t room_bytes, int32_t max_persist) const {
  // persistent_prefix[np] + Scaled(GradPhaseRawBytes(np)) <= room, non-decreasing in np (both
  // terms are): the largest such np by bisection.
  max_persist = std::clamp(max_persist, 0, num_chunks_);
  auto fits = [&](int32_t np) {
    return chunks_->persistent_prefix[np] + Scaled(GradPhaseRawBytes(np)) <= room_bytes;
  };
  if (!fits(0)) return -1;
  int32_t lo = 0, hi = max_persist;  // fits(lo)
  while (lo < hi) {
    const int32_t mid = lo + (hi - lo + 1) / 2;
    if (fits(mid)) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

int32_t CostModel::MinPersistForHost(int64_t host_limit_bytes, const ModeCounts& counts) const {
  // HostBytes(np) = host_prefix[C] - host_prefix[np] + acts <= limit
  //   <=> host_prefix[np] >= host_prefix[C] + acts - limit (host_prefix is non-decreasing).
  const int64_t acts = HostBytes(num_chunks_, counts);
  const int64_t need = chunks_->host_prefix[num_chunks_] + acts - host_limit_bytes;
  if (acts > host_limit_bytes) return num_chunks_ + 1;
  return static_cast<int32_t>(
      std::lower_bound(chunks_->host_prefix.begin(), chunks_->host_prefix.end(), need) -
      chunks_->host_prefix.begin());
}

int64_t CostModel::StaticRawBytes(int32_t n_persist, int32_t n_buffer) const {
  return chunks_->persistent_prefix[n_persist] + BufferBytes(n_persist, n_buffer) +
         GradStagingBytes(n_persist) + vocab_slack_;
}

int64_t CostModel::GradStagingBytes(int32_t n_persist) const {
  const int64_t offloaded =
      n_persist >= num_chunks_                    ? 0
      : !chunks_->grad_staging_by_npersist.empty() ? chunks_->grad_staging_by_npersist[n_persist]
                                                   : chunks_->grad_staging_bytes;
  // [Sharded persistent parameters]: the gathered chunks are held for the step as the buffers
  // are (a stage's and the next one's at any time).
  return offloaded + chunks_->persistent_reduce_by_npersist[n_persist] +
         chunks_->persistent_gather_by_npersist[n_persist];
}

int64_t CostModel::GradSlotBytes(int32_t n_persist) const {
  if (chunks_->grad_staging_by_npersist.empty() || n_persist >= num_chunks_) return 0;
  return kGradStagingSlots *
         chunks_->layout.grad_slot_bytes_by_first_offloaded[std::max(n_persist, 0)];
}

int64_t CostModel::BufferBytes(int32_t n_persist, int32_t n_buffer) const {
  // The agent allocates no buffer when every chunk is persistent, whatever n_buffer says.
  if (n_persist >= num_chunks_) return 0;
  return int64_t{n_buffer} * chunks_->shared_buffer_bytes +
         chunks_->oversized_suffix[std::clamp(n_persist, 0, num_chunks_)];
}

int64_t CostModel::LoadRawBytes(int32_t n_persist, int32_t n_buffer) const {
  // The agent builds the model in host memory and packs it into chunks there; the device gets
  // the persistent chunks with their optimizer state and the chunk buffers. An unmanaged run
  // (every chunk persistent) holds the same bytes.
  return PersistentRawBytes(n_persist) + BufferBytes(n_persist, n_buffer);
}

int64_t CostModel::Scaled(int64_t scaled_bytes) const {
  return static_cast<int64_t>(
      std::ceil(options_.fragmentation_factor * static_cast<double>(scaled_bytes)));
}

int64_t CostModel::Peak(int64_t exact_bytes, int64_t scaled_bytes) const {
  return exact_bytes + Scaled(scaled_bytes) + options_.residual_bytes +
         hardware_.cuda_context_bytes;
}

int64_t CostModel::Room(int64_t capacity_bytes) const {
  return capacity_bytes - options_.residual_bytes - hardware_.cuda_context_bytes;
}

int64_t CostModel::HostBytes(int32_t n_persist, const ModeCounts& counts) const {
  // Counts beyond the block count are clamped (callers may probe invalid corners).
  const int32_t s = std::clamp(counts.n_swap, 0, num_blocks_);
  const int32_t e = std::clamp(s + counts.n_hs_offload, s, num_blocks_);
  const int64_t acts = saved_prefix_[s] + (input_prefix_[e] - input_prefix_[s]);
  return chunks_->host_prefix[num_chunks_] - chunks_->host_prefix[n_persist] + acts;
}

RankMemory CostModel::RankChunkMemory(int32_t n_persist, int32_t n_buffer,
                                      HostMemoryKind host_memory, int64_t host_bytes) const {
  const ChunkTables& t = *chunks_;
  n_persist = std::clamp(n_persist, 0, num_chunks_);
  RankMemory r;
  r.world_size = options_.world_size;
  r.local_world_size = options_.local_world_size;
  r.persistent_device_bytes = t.alloc_prefix[n_persist];
  r.persistent_state_device_bytes = t.opt_prefix[n_persist];
  r.buffer_device_bytes = BufferBytes(n_persist, n_buffer);
  r.persistent_gather_device_bytes = t.persistent_gather_by_npersist[n_persist];
  const int64_t transfer = t.host_transfer_prefix[num_chunks_] - t.host_transfer_prefix[n_persist];
  const int64_t state = t.host_prefix[num_chunks_] - t.host_prefix[n_persist] - transfer;
  // The optimizer state is always pageable; the transfer buffers follow the plan.
  if (host_memory == HostMemoryKind::kPinned) {
    r.chunk_host_pinned_bytes = transfer;
    r.chunk_host_pageable_bytes = state;
  } else {
    r.chunk_host_pageable_bytes = transfer + state;
  }
  r.node_host_bytes = host_bytes * options_.local_world_size;
  return r;
}

int64_t CostModel::PhaseTotal(int phase, const Modes& m) const {
  return PhaseParts(phase, m).total;
}

CostModel::DynamicParts CostModel::PhaseParts(int phase, const Modes& m) const {
  // phase -1: embedding forward/backward; 0..N-1: block forward+backward; N: head.
  DynamicParts parts;
  if (phase < 0) {
    parts.activations = emb_retained_;
    parts.transient = emb_extra_;
  } else {
    const int32_t j = phase;
    int64_t none_saved = 0, ckpt_inputs = 0;
    if (m.explicit_modes == nullptr) {
      const int32_t c_begin = m.counts.n_swap + m.counts.n_hs_offload;
      const int32_t c_end = m.counts.total();
      ckpt_inputs = input_prefix_[std::min(j, c_end)] - input_prefix_[std::min(j, c_begin)];
      none_saved = j > c_end ? saved_prefix_[j] - saved_prefix_[c_end] : 0;
    } else {
      for (int32_t i = 0; i < j; ++i) {
        const BlockMode mode = m.Block(i);
        if (mode == BlockMode::kNone) none_saved += saved_[i];
        if (mode == BlockMode::kCkpt) ckpt_inputs += input_[i];
      }
    }
    const bool has_prev = j > 0;
    const BlockMode prev = has_prev ? m.Block(j - 1) : BlockMode::kNone;
    const int64_t swapped_in = prev == BlockMode::kSwap ? saved_[j - 1] : 0;
    const int64_t hs_in = prev == BlockMode::kHsOffload ? input_[j - 1] : 0;
    parts.checkpoint_chain = ckpt_inputs;
    if (j < num_blocks_) {
      parts.activations = emb_retained_ + none_saved + saved_[j] + swapped_in;
      parts.transient = block_extra_[j] + hs_in;
    } else {
      parts.activations = emb_retained_ + none_saved + head_saved_ + swapped_in;
      parts.transient = head_extra_ + hs_in;
      parts.head = head_saved_ + head_extra_;
    }
  }
  parts.total = parts.activations + parts.checkpoint_chain + parts.transient;
  return parts;
}

CostModel::DynamicParts CostModel::DynamicImpl(const Modes& m, bool fast) const {
  const int32_t n = num_blocks_;
  // Phases in order: embedding, blocks 0..N-1, head; the first strict maximum wins.
  int best_phase = -1;
  int64_t best = PhaseTotal(-1, m);
  auto consider = [&](int phase, int64_t value) {
    if (value > best) {
      best = value;
      best_phase = phase;
    }
  };
  if (!fast || m.explicit_modes != nullptr) {
    int64_t retained = emb_retained_;
    for (int32_t j = 0; j < n; ++j) {
      const int64_t act = j > 0 ? ActBytes(j - 1, m.Block(j - 1)) : 0;
      consider(j, retained + saved_[j] + block_extra_[j] + act);
      retained += RetainedBytes(j, m.Block(j));
    }
    consider(n, retained + head_saved_ + head_extra_ + ActBytes(n - 1, m.Block(n - 1)));
    return PhaseParts(best_phase, m);
  }
  const ModeCounts& c = m.counts;
  const int32_t bounds[5] = {0, c.n_swap, c.n_swap + c.n_hs_offload, c.total(), n};
  const int seg_mode[4] = {kSwapMode, kHsMode, kCkptMode, kNoneMode};
  int64_t base = emb_retained_;
  for (int seg = 0; seg < 4; ++seg) {
    const int32_t a = bounds[seg], b = bounds[seg + 1];
    if (a >= b) continue;
    const int mode = seg_mode[seg];
    const int64_t act = a > 0 ? ActBytes(a - 1, m.Block(a - 1)) : 0;
    consider(a, base + saved_[a] + block_extra_[a] + act);
    auto prefix = [&](int32_t j) -> int64_t {
      if (mode == kNoneMode) return saved_prefix_[j];
      if (mode == kCkptMode) return input_prefix_[j];
      return 0;
    };
    if (b > a + 1) {
      const int32_t idx = RangeMaxIndex(mode, a + 1, b);
      consider(idx, base - prefix(a) + ModeValue(mode, idx));
    }
    base += prefix(b) - prefix(a);
  }
  consider(n, base + head_saved_ + head_extra_ + ActBytes(n - 1, m.Block(n - 1)));
  return PhaseParts(best_phase, m);
}

int64_t CostModel::DynamicRawBytes(const ModeCounts& counts) const {
  Modes m;
  m.counts = counts;
  return DynamicImpl(m, /*fast=*/true).total;
}

// ---------------------------------------------------------------------------------------------
// Time (ProTrain eqs. 2-7)

double CostModel::Link(double up_bytes, double down_bytes, int kind) const {
  if (kind == 1) {
    // Pageable copies are staged by the driver through a pinned bounce buffer on the CPU and
    // do not overlap each other.
    return up_bytes / h2d_[1] + down_bytes / d2h_[1];
  }
  double t = std::max(up_bytes / h2d_[0], down_bytes / d2h_[0]);
  if (bidir_ > 0) t = std::max(t, (up_bytes + down_bytes) / bidir_);
  return t;
}

double CostModel::Window(double comp, double up_bytes, double down_bytes, int kind,
                         double nccl) const {
  // [Pageable copies drain the queue] A copy to or from pageable memory holds the thread that
  // enqueues the GPU's work until it is done (the driver stages it through a bounce buffer),
  // and a device-to-host one first waits until the GPU has run everything queued before it (the
  // data must exist). After such a copy nothing is queued, so the window's host-to-device
  // staging, its compute and the copy run one after another. Without a pageable
  // device-to-host copy, the staging overlaps the compute queued before it.
  const double link = Link(up_bytes, down_bytes, kind);
  if (kind == 1 && down_bytes > 0) return std::max(comp + link, nccl);
  return std::max({comp, link, nccl});
}

double CostModel::ForwardWindow(int32_t k, const PlanPoint& p, const Modes& m) const {
  // Window k: compute of stage k-1, overlapped with the prefetch of stage k's offloaded chunks
  // (H2D + all-gather) and the offload of stage k-2's activations (SWAP / HS_OFFLOAD).
  const int32_t n = num_blocks_;
  const double w = options_.world_size;
  const double comp = k >= 1 ? fwd_s_[k - 1] : 0.0;
  // The chunks stage k needs first (the tied head: the embedding's too): the offloaded ones
  // are loaded (H2D + all-gather); [Sharded persistent parameters]: the persistent ones are
  // gathered from the device shards, no host copy.
  double load = 0, gathered = 0;
  auto add = [&](int32_t lo, int32_t hi) {  // chunks [lo, hi)
    load += static_cast<double>(ChunkSum(chunks_->fill_prefix, std::max(lo, p.n_persist), hi));
    if (chunks_->shard_params) {
      gathered += static_cast<double>(
          ChunkSum(chunks_->fill_prefix, lo, std::min(hi, p.n_persist)));
    }
  };
  if (k <= n + 1) {
    add(chunks_->fwd_owned_begin[k], chunks_->fwd_owned_begin[k + 1]);
    if (k == n + 1 && tied_) {
      add(chunks_->layout.stage_first_chunk[0], chunks_->layout.stage_last_chunk[0] + 1);
    }
  }
  const int32_t blk = k - 3;
  const double down = blk >= 0 && blk < n ? static_cast<double>(ActBytes(blk, m.Block(blk))) : 0.0;
  const double nccl =
      w > 1 ? (load + gathered) * (w - 1) / w / hardware_.nccl_allgather_bytes_per_second : 0.0;
  return Window(comp, load / w, down, p.kind, nccl);
}

int CostModel::ForwardKey(int32_t k, const PlanPoint& p, const Modes& m) const {
  const int32_t n = num_blocks_;
  if (k < 1 || k > n) return -1;
  const int32_t lo = chunks_->fwd_owned_begin[k], hi = chunks_->fwd_owned_begin[k + 1];
  int state;
  if (hi <= p.n_persist) {
    state = 0;
  } else if (lo >= p.n_persist) {
    state = 1;
  } else {
    return -1;
  }
  const int32_t blk = k - 3;
  int act = 0;
  if (blk >= 0 && blk < n) {
    const BlockMode mode = m.Block(blk);
    act = mode == BlockMode::kSwap ? 1 : mode == BlockMode::kHsOffload ? 2 : 0;
  }
  return state * 3 + act;
}

double CostModel::ForwardWindowPure(int32_t k, int key, int kind) const {
  const int32_t n = num_blocks_;
  const double w = options_.world_size;
  const int state = key / 3, act = key % 3;
  const double comp = fwd_s_[k - 1];
  const double owned = static_cast<double>(
      ChunkSum(chunks_->fill_prefix, chunks_->fwd_owned_begin[k], chunks_->fwd_owned_begin[k + 1]));
  const double load = state == 1 ? owned : 0.0;
  // [Sharded persistent parameters]: persistent chunks are gathered too, from the device.
  const double gathered = state == 0 && chunks_->shard_params ? owned : 0.0;
  const int32_t blk = k - 3;
  double down = 0;
  if (blk >= 0 && blk < n) {
    if (act == 1) down = static_cast<double>(saved_[blk]);
    if (act == 2) down = static_cast<double>(input_[blk]);
  }
  const double nccl =
      w > 1 ? (load + gathered) * (w - 1) / w / hardware_.nccl_allgather_bytes_per_second : 0.0;
  return Window(comp, load / w, down, kind, nccl);
}

double CostModel::BackwardWindow(int32_t s, const PlanPoint& p, const Modes& m) const {
  // Backward of stage s (with recompute for CKPT / HS_OFFLOAD), overlapped with the re-fetch of
  // stage s-1's evicted chunks and its swapped activations / offloaded input, and with the
  // reduce + offload of the grads of chunks that stage s+1 finished.
  const int32_t n = num_blocks_;
  const double w = options_.world_size;
  const BlockMode mode = m.Stage(s, n);
  double comp = bwd_s_[s];
  if (mode == BlockMode::kCkpt || mode == BlockMode::kHsOffload) comp += rec_s_[s];
  const int32_t evict_end = num_chunks_ - p.n_buffer;
  double refetch = 0, act_in = 0, gradoff = 0, ptrain = 0, regather = 0;
  if (s >= 1) {
    refetch = static_cast<double>(ChunkSum(chunks_->fill_prefix,
                                           std::max(chunks_->bwd_owned_begin[s - 1], p.n_persist),
                                           std::min(chunks_->bwd_owned_begin[s], evict_end)));
    if (s - 1 >= 1 && s - 1 <= n) act_in = static_cast<double>(ActBytes(s - 2, m.Block(s - 2)));
    // [Sharded persistent parameters]: stage s-1's persistent chunks, released since forward,
    // are gathered again from the device shards.
    if (chunks_->shard_params) {
      regather = static_cast<double>(ChunkSum(chunks_->fill_prefix, chunks_->bwd_owned_begin[s - 1],
                                              std::min(chunks_->bwd_owned_begin[s], p.n_persist)));
    }
  }
  if (s + 1 <= n + 1) {
    const int32_t lo = chunks_->fwd_owned_begin[s + 1], hi = chunks_->fwd_owned_begin[s + 2];
    gradoff = static_cast<double>(ChunkSum(chunks_->train_prefix, std::max(lo, p.n_persist), hi));
    ptrain = static_cast<double>(ChunkSum(chunks_->train_prefix, lo, std::min(hi, p.n_persist)));
  }
  double nccl = 0;
  if (w > 1) {
    const double frac = (w - 1) / w;
    nccl = (refetch + regather) * frac / hardware_.nccl_allgather_bytes_per_second +
           (gradoff + (p.lower_bound ? 1.0 : PersistentReduceFactor()) * ptrain) * frac *
               ReduceWidening() / hardware_.nccl_reduce_scatter_bytes_per_second;
  }
  return Window(comp, refetch / w + act_in, gradoff / w, p.kind, nccl);
}

double CostModel::BackwardEdges(const PlanPoint& p) const {
  const int32_t n = num_blocks_;
  const double w = options_.world_size;
  const double frac = (w - 1) / w;
  const int32_t evict_end = num_chunks_ - p.n_buffer;
  // Before the head's backward: its chunks, if they were evicted (never with enough buffers).
  const double refetch = static_cast<double>(
      ChunkSum(chunks_->fill_prefix, std::max(chunks_->bwd_owned_begin[n + 1], p.n_persist),
               std::min(num_chunks_, evict_end)));
  double pre = Link(refetch / w, 0, p.kind);
  if (w > 1) pre = std::max(pre, refetch * frac / hardware_.nccl_allgather_bytes_per_second);
  // After the embedding's backward: the grads of the embedding's chunks.
  const int32_t lo = chunks_->fwd_owned_begin[0], hi = chunks_->fwd_owned_begin[1];
  const double gradoff =
      static_cast<double>(ChunkSum(chunks_->train_prefix, std::max(lo, p.n_persist), hi));
  const double ptrain =
      static_cast<double>(ChunkSum(chunks_->train_prefix, lo, std::min(hi, p.n_persist)));
  double post = Link(0, gradoff / w, p.kind);
  if (w > 1) {
    post = std::max(post, (gradoff + (p.lower_bound ? 1.0 : PersistentReduceFactor()) * ptrain) *
                              frac * ReduceWidening() /
                              hardware_.nccl_reduce_scatter_bytes_per_second);
  }
  return pre + post;
}

int CostModel::BackwardKey(int32_t s, const PlanPoint& p, const Modes& m) const {
  const int32_t n = num_blocks_;
  if (s < 1 || s > n) return -1;
  const BlockMode mode = m.Stage(s, n);
  if (m.Stage(s - 1, n) != mode) return -1;
  const int32_t evict_end = num_chunks_ - p.n_buffer;
  const int32_t plo = chunks_->bwd_owned_begin[s - 1], phi = chunks_->bwd_owned_begin[s];
  int bst;
  if (phi <= p.n_persist) {
    bst = 0;
  } else if (plo >= p.n_persist && phi <= evict_end) {
    bst = 1;
  } else if (plo >= std::max(p.n_persist, evict_end)) {
    bst = 2;
  } else {
    return -1;
  }
  const int32_t nlo = chunks_->fwd_owned_begin[s + 1], nhi = chunks_->fwd_owned_begin[s + 2];
  int fst;
  if (nhi <= p.n_persist) {
    fst = p.lower_bound ? 1 : 0;
  } else if (nlo >= p.n_persist) {
    fst = 2;
  } else {
    return -1;
  }
  return static_cast<int>(mode) * 9 + bst * 3 + fst;
}

double CostModel::BackwardWindowPure(int32_t s, int key, int kind) const {
  const int32_t n = num_blocks_;
  const double w = options_.world_size;
  const int mode = key / 9, bst = (key / 3) % 3, fst = key % 3;
  double comp = bwd_s_[s];
  if (mode == kCkptMode || mode == kHsMode) comp += rec_s_[s];
  const double owned_prev = static_cast<double>(
      ChunkSum(chunks_->fill_prefix, chunks_->bwd_owned_begin[s - 1], chunks_->bwd_owned_begin[s]));
  const double refetch = bst == 1 ? owned_prev : 0.0;
  // [Sharded persistent parameters]: persistent chunks are gathered again from the device.
  const double regather = bst == 0 && chunks_->shard_params ? owned_prev : 0.0;
  double act_in = 0;
  if (s - 1 >= 1 && s - 1 <= n) {
    if (mode == kSwapMode) act_in = static_cast<double>(saved_[s - 2]);
    if (mode == kHsMode) act_in = static_cast<double>(input_[s - 2]);
  }
  const double owned_train = static_cast<double>(ChunkSum(
      chunks_->train_prefix, chunks_->fwd_owned_begin[s + 1], chunks_->fwd_owned_begin[s + 2]));
  const double gradoff = fst == 2 ? owned_train : 0.0;
  // Persistent grads are all-reduced (twice the reduce-scatter traffic); the lower-bound
  // variant charges them a reduce-scatter only, which keeps it monotone in n_persist.
  const double ptrain = fst == 0   ? PersistentReduceFactor() * owned_train
                        : fst == 1 ? owned_train
                                   : 0.0;
  double nccl = 0;
  if (w > 1) {
    const double frac = (w - 1) / w;
    nccl = (refetch + regather) * frac / hardware_.nccl_allgather_bytes_per_second +
           (gradoff + ptrain) * frac * ReduceWidening() /
               hardware_.nccl_reduce_scatter_bytes_per_second;
  }
  return Window(comp, refetch / w + act_in, gradoff / w, kind, nccl);
}

namespace {

// Sums window(k) for k in [lo, hi). `cuts` holds every index where a window's key may change;
// between two cuts the key is constant, so a pure run is one prefix-sum difference.
struct Cuts {
  int32_t v[48];
  int size = 0;
  void Add(int32_t x) {
    if (size < 48) v[size++] = x;
  }
};

template <typename KeyFn, typename WindowFn>
double SumWindows(int32_t lo, int32_t hi, Cuts& cuts, KeyFn key, WindowFn window,
                  const std::vector<std::vector<double>>& prefix) {
  cuts.Add(lo);
  cuts.Add(hi);
  for (int i = 0; i < cuts.size; ++i) cuts.v[i] = std::clamp(cuts.v[i], lo, hi);
  std::sort(cuts.v, cuts.v + cuts.size);
  const int count = static_cast<int>(std::unique(cuts.v, cuts.v + cuts.size) - cuts.v);
  double total = 0;
  for (int i = 0; i + 1 < count; ++i) {
    const int32_t a = cuts.v[i], b = cuts.v[i + 1];
    if (b - a > 2) {
      const int ka = key(a);
      if (ka >= 0 && ka == key(b - 1)) {
        total += prefix[ka][b] - prefix[ka][a];
        continue;
      }
    }
    for (int32_t k = a; k < b; ++k) total += window(k);
  }
  return total;
}

}  // namespace

StepTime CostModel::TimeImpl(const PlanPoint& p, const Modes& m, bool fast) const {
  const int32_t n = num_blocks_;
  StepTime t;
  t.cpu_optimizer_overlaps = options_.cpu_optimizer_overlaps;
  if (!fast || m.explicit_modes != nullptr || !options_.build_time_tables) {
    for (int32_t k = 0; k <= n + 2; ++k) t.forward_seconds += ForwardWindow(k, p, m);
    for (int32_t s = 0; s <= n + 1; ++s) t.backward_seconds += BackwardWindow(s, p, m);
  } else {
    const ModeCounts& c = m.counts;
    const int32_t seg[3] = {c.n_swap, c.n_swap + c.n_hs_offload, c.total()};
    // Forward: keys change at the edges, where the activation traffic (block k-3) changes mode,
    // and around the stage whose owned chunks straddle n_persist.
    const int32_t f =
        static_cast<int32_t>(std::upper_bound(chunks_->fwd_owned_begin.begin(),
                                              chunks_->fwd_owned_begin.end(), p.n_persist) -
                             chunks_->fwd_owned_begin.begin()) -
        1;
    // Only stage f can straddle n_persist (stages before it are persistent, after it not).
    Cuts cuts;
    for (int32_t x : {0, 1, 3, n + 1}) cuts.Add(x);
    for (int32_t b : seg) cuts.Add(b + 3);
    cuts.Add(f);
    cuts.Add(f + 1);
    t.forward_seconds = SumWindows(
        0, n + 3, cuts, [&](int32_t k) { return ForwardKey(k, p, m); },
        [&](int32_t k) { return ForwardWindow(k, p, m); }, fwd_prefix_[p.kind]);
    // Backward: keys change at the edges, at mode boundaries (stage b+1 is the first of a
    // segment), and around the stages whose chunks straddle n_persist or the eviction bound.
    Cuts bcuts;
    for (int32_t x : {0, 1, 2, n + 1}) bcuts.Add(x);
    for (int32_t b : seg) {
      bcuts.Add(b + 1);
      bcuts.Add(b + 2);
    }
    const int32_t evict_end = num_chunks_ - p.n_buffer;
    for (int32_t x : {p.n_persist, evict_end}) {
      // Window s reads stage s-1's backward-owned chunks; stage st is the only one that can
      // straddle x.
      const auto it =
          std::upper_bound(chunks_->bwd_owned_begin.begin(), chunks_->bwd_owned_begin.end(), x);
      const int32_t st = static_cast<int32_t>(it - chunks_->bwd_owned_begin.begin()) - 1;
      bcuts.Add(st + 1);
      bcuts.Add(st + 2);
    }
    // Window s offloads the grads of stage s+1's forward-owned chunks.
    bcuts.Add(f - 1);
    bcuts.Add(f);
    t.backward_seconds = SumWindows(
        0, n + 2, bcuts, [&](int32_t s) { return BackwardKey(s, p, m); },
        [&](int32_t s) { return BackwardWindow(s, p, m); }, bwd_prefix_[p.kind]);
  }
  t.backward_seconds += BackwardEdges(p);
  // [Sharded persistent state]: the all-gathers run beside the next chunks' updates.
  t.gpu_optimizer_seconds =
      std::max(chunks_->gpu_opt_prefix[p.n_persist], chunks_->gather_prefix[p.n_persist]);
  t.cpu_optimizer_seconds =
      chunks_->cpu_opt_prefix[num_chunks_] - chunks_->cpu_opt_prefix[p.n_persist];
  t.cpu_accumulate_seconds =
      chunks_->cpu_acc_prefix[num_chunks_] - chunks_->cpu_acc_prefix[p.n_persist];
  // Clipping with several micro-batches: the agent reads every offloaded grad array once on the
  // host for the norm (with one micro-batch the norms come from the device grads). A read-only
  // pass over HostGradElemBytes per element, at the bandwidth the accumulate pass reaches.
  if (!options_.cpu_optimizer_overlaps && options_.grad_accum > 1) {
    t.cpu_norm_seconds = t.cpu_accumulate_seconds *
                         static_cast<double>(HostGradElemBytes(options_.optimizer, dtype_bytes_)) /
                         kCpuAccumulateBytesPerParam;
  }
  t.fixed_seconds = p.n_persist < num_chunks_ ? options_.offload_step_overhead_seconds : 0.0;
  return t;
}

StepTime CostModel::Time(int32_t n_persist, int32_t n_buffer, const ModeCounts& counts,
                         HostMemoryKind host_memory, bool lower_bound) const {
  PlanPoint p;
  p.n_persist = n_persist;
  p.n_buffer = n_buffer;
  p.kind = host_memory == HostMemoryKind::kPinned ? 0 : 1;
  p.lower_bound = lower_bound && options_.world_size > 1;
  Modes m;
  m.counts = counts;
  return TimeImpl(p, m, /*fast=*/true);
}

// ---------------------------------------------------------------------------------------------
// Plans

absl::Status CostModel::ValidatePlan(const ResidencyPlan& plan) const {
  auto bad = [](const std::string& msg) { return absl::InvalidArgumentError(msg); };
  if (options_.world_size > 1 && plan.shard_persistent_state != chunks_->shard_state) {
    return bad(absl::StrCat(
        "plan.shard_persistent_state = ", plan.shard_persistent_state ? "true" : "false",
        " but this model ", chunks_->shard_state ? "shards" : "replicates",
        " the persistent chunks' state (sharding needs world_size > 1 and full fine-tuning with "
        "adamw, adamw_bf16 or sgd)"));
  }
  if (options_.world_size > 1 && plan.shard_persistent_params != chunks_->shard_params) {
    return bad(absl::StrCat(
        "plan.shard_persistent_params = ", plan.shard_persistent_params ? "true" : "false",
        " but this model ", chunks_->shard_params ? "shards" : "replicates",
        " the persistent chunks' parameters (sharding them needs the state sharded too)"));
  }
  if (plan.chunk_bytes != chunks_->layout.chunk_bytes) {
    return bad(absl::StrCat("plan.chunk_bytes = ", plan.chunk_bytes, " does not match the layout (",
                            chunks_->layout.chunk_bytes, ")"));
  }
  if (plan.n_chunks != 0 && plan.n_chunks != num_chunks_) {
    return bad(absl::StrCat("plan.n_chunks = ", plan.n_chunks, " does not match the layout (",
                            num_chunks_, " chunks of ", chunks_->layout.chunk_bytes, " bytes)"));
  }
  if (plan.n_persist < 0 || plan.n_persist > num_chunks_) {
    return bad(absl::StrCat("plan.n_persist = ", plan.n_persist, " is out of range; allowed [0, ",
                            num_chunks_, "]"));
  }
  const int32_t max_buffer = num_chunks_ - plan.n_persist;
  const int32_t min_buffer = MinBuffers(plan.n_persist);
  if (plan.n_buffer < min_buffer || plan.n_buffer > max_buffer) {
    return bad(absl::StrCat("plan.n_buffer = ", plan.n_buffer, " is out of range; allowed [",
                            min_buffer, ", ", max_buffer, "] with n_persist = ", plan.n_persist));
  }
  const int32_t n = num_blocks_;
  for (auto [name, v] : {std::pair<const char*, int32_t>{"n_swap", plan.n_swap},
                         {"n_checkpoint", plan.n_checkpoint},
                         {"n_hs_offload", plan.n_hs_offload}}) {
    if (v < 0 || v > n) {
      return bad(absl::StrCat("plan.", name, " = ", v, " is out of range; allowed [0, ", n, "]"));
    }
  }
  if (plan.n_swap + plan.n_checkpoint + plan.n_hs_offload > n) {
    return bad(absl::StrCat("plan.n_swap + plan.n_checkpoint + plan.n_hs_offload = ",
                            plan.n_swap + plan.n_checkpoint + plan.n_hs_offload,
                            " exceeds the number of blocks (", n, ")"));
  }
  if (!plan.block_modes.empty()) {
    if (static_cast<int32_t>(plan.block_modes.size()) != n) {
      return bad(absl::StrCat("plan.block_modes has ", plan.block_modes.size(),
                              " entries; the model has ", n, " blocks"));
    }
    const ModeCounts c = CountModes(plan.block_modes);
    if (c.n_swap != plan.n_swap || c.n_checkpoint != plan.n_checkpoint ||
        c.n_hs_offload != plan.n_hs_offload) {
      return bad("plan.block_modes do not match n_swap / n_checkpoint / n_hs_offload");
    }
  }
  return absl::OkStatus();
}

ResidencyPlan CostModel::MakeResidencyPlan(int32_t n_persist, int32_t n_buffer,
                                           const ModeCounts& counts,
                                           HostMemoryKind host_memory) const {
  ResidencyPlan plan;
  plan.chunk_bytes = chunks_->layout.chunk_bytes;
  plan.n_chunks = num_chunks_;
  plan.layout_fingerprint = chunks_->layout.fingerprint;
  plan.n_persist = n_persist;
  plan.n_buffer = n_buffer;
  plan.n_swap = counts.n_swap;
  plan.n_checkpoint = counts.n_checkpoint;
  plan.n_hs_offload = counts.n_hs_offload;
  plan.host_memory = host_memory;
  plan.block_modes = ArrangeBlockModes(num_blocks_, counts);
  plan.world_size = options_.world_size;
  plan.shard_persistent_state = chunks_->shard_state;
  plan.shard_persistent_params = chunks_->shard_params;
  return plan;
}

Prediction CostModel::Assemble(const ResidencyPlan& plan, const Modes& m, bool fast) const {
  PlanPoint p;
  p.n_persist = plan.n_persist;
  p.n_buffer = plan.n_buffer;
  p.kind = plan.host_memory == HostMemoryKind::kPinned ? 0 : 1;
  const DynamicParts dyn = DynamicImpl(m, fast);
  const StepTime time = TimeImpl(p, m, fast);

  Prediction pred;
  MemoryBreakdown& b = pred.breakdown;
  // The breakdown describes the moment of the peak: the activation walk's worst phase, a block's
  // backward next to the grads already produced ([Grads beside backward]), or the end of
  // backward when the persistent grads outweigh both.
  const int64_t grad_phase = GradPhaseRawBytes(plan.n_persist);
  int bwd_block = -1;
  const int64_t bwd_grads = BackwardGradsImpl(m, plan.n_persist, &bwd_block);
  const bool grads_peak = grad_phase > std::max(dyn.total, bwd_grads);
  const bool bwd_peak = !grads_peak && bwd_grads > dyn.total;
  const DynamicParts phase = bwd_peak ? PhaseParts(bwd_block, m) : dyn;
  const int64_t staging = GradStagingBytes(plan.n_persist);
  b.persistent_chunks_bytes = chunks_->alloc_prefix[plan.n_persist];
  b.buffers_bytes = BufferBytes(plan.n_persist, plan.n_buffer);
  b.grads_bytes = staging + (grads_peak ? chunks_->pgrad_prefix[plan.n_persist]
                             : bwd_peak ? GradsLiveInBackward(bwd_block, plan.n_persist)
                                        : 0);
  b.optimizer_state_bytes = chunks_->opt_prefix[plan.n_persist];
  // At the grad phase: the embedding's backward, or the optimizer step's fp32 grad copy.
  const bool step_copy = grads_peak && (plan.n_persist > 0 || chunks_->adapters_persistent) &&
                         chunks_->optimizer_step_extra_bytes > emb_retained_ + emb_extra_;
  b.activations_bytes = grads_peak ? (step_copy ? 0 : emb_retained_) : phase.activations;
  b.checkpoint_chain_bytes = grads_peak ? 0 : phase.checkpoint_chain;
  b.transient_bytes =
      grads_peak ? (step_copy ? chunks_->optimizer_step_extra_bytes : emb_extra_) : phase.transient;
  b.cuda_context_bytes = hardware_.cuda_context_bytes;
  b.fragmentation_factor = options_.fragmentation_factor;
  b.calibration_residual_bytes = options_.residual_bytes;
  b.head_bytes = grads_peak ? 0 : phase.head;
  b.allocator_slack_bytes = vocab_slack_;
  b.exact_bytes = StaticRawBytes(plan.n_persist, plan.n_buffer);
  pred.peak_bytes = Peak(b.exact_bytes, std::max({dyn.total, grad_phase, bwd_grads}));
  pred.load_peak_bytes = Peak(LoadRawBytes(plan.n_persist, plan.n_buffer), 0);

  int64_t host = 0;
  if (fast && m.explicit_modes == nullptr) {
    host = HostBytes(plan.n_persist, m.counts);
  } else {
    host = chunks_->host_prefix[num_chunks_] - chunks_->host_prefix[plan.n_persist];
    for (int32_t j = 0; j < num_blocks_; ++j) host += ActBytes(j, m.Block(j));
  }
  if (plan.host_memory == HostMemoryKind::kPinned) {
    pred.host_pinned_bytes = host;
  } else {
    pred.host_pageable_bytes = host;
  }
  pred.rank_memory = RankChunkMemory(plan.n_persist, plan.n_buffer, plan.host_memory, host);

  // Every time is scaled by the step-time calibration (a common factor leaves the search's
  // ranking unchanged, so the search itself runs on the model's own times).
  const double ga = options_.grad_accum;
  const double tf = options_.time_factor;
  pred.time_factor = tf;
  pred.forward_seconds = tf * ga * time.forward_seconds;
  pred.backward_seconds = tf * ga * time.backward_seconds;
  pred.iteration_seconds = tf * time.IterationSeconds(options_.grad_accum);
  // What the step adds to forward and backward compute: the optimizers' tail, the host norm and
  // any accumulate time that backward does not cover.
  pred.optimizer_seconds = pred.iteration_seconds - pred.forward_seconds - pred.backward_seconds;
  const double tokens = static_cast<double>(trace_.workload.micro_batch) *
                        static_cast<double>(trace_.workload.seq_len) * ga;
  pred.tokens_per_second = pred.iteration_seconds > 0 ? tokens / pred.iteration_seconds : 0;
  return pred;
}

Prediction CostModel::Predict(const ResidencyPlan& plan) const {
  Modes m;
  std::optional<ModeCounts> arranged;
  if (plan.block_modes.empty()) {
    m.counts = ModeCounts{plan.n_swap, plan.n_hs_offload, plan.n_checkpoint};
  } else if ((arranged = CountsIfArranged(plan.block_modes))) {
    m.counts = *arranged;
  } else {
    m.explicit_modes = &plan.block_modes;
  }
  return Assemble(plan, m, /*fast=*/true);
}

Prediction CostModel::PredictReference(const ResidencyPlan& plan) const {
  std::vector<BlockMode> modes =
      plan.block_modes.empty()
          ? ArrangeBlockModes(num_blocks_,
                              ModeCounts{plan.n_swap, plan.n_hs_offload, plan.n_checkpoint})
          : plan.block_modes;
  Modes m;
  m.explicit_modes = &modes;
  return Assemble(plan, m, /*fast=*/false);
}

}  // namespace memplan
