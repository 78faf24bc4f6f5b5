// Cost model: predicted peak GPU memory (ProTrain eqs. 8-11), load-time peak, host memory and
// iteration time (eqs. 2-7) of a residency plan, for one trace and one chunk size.
// Construction precomputes prefix sums and range-max tables in O(N log N + chunks); afterwards a
// plan whose block modes follow ArrangeBlockModes() is evaluated in O(log N).
// Thread-safe after construction (all methods are const and touch no shared mutable state).
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/types.h"
#include "planner/cost/chunk_layout.h"

namespace memplan {

struct CostOptions {
  OptimizerKind optimizer = OptimizerKind::kAdamW;
  int32_t world_size = 1;
  // Ranks per node (in [1, world_size]): they share the node's RAM (RankMemory::node_host_bytes;
  // the search's host limit is per rank) and its CPU: each rank's offloaded-chunk CPU passes run
  // at the profile's rate / local_world_size ([Shared host CPU] in cost_model.cc).
  int32_t local_world_size = 1;
  int32_t grad_accum = 1;
  // [Sharded persistent state] (agent/chunks/chunk_manager.cc), with world_size > 1 and full
  // fine-tuning (not adamw8bit): persistent chunks' optimizer state 1/W per rank, their grads
  // reduce-scattered in backward (half an all-reduce's traffic) and kept as a model-dtype shard,
  // the update 1/W per rank and the parameters all-gathered after it.
  bool shard_persistent_state = false;
  // [Sharded persistent parameters] (agent/chunks/chunk_manager.cc), with shard_persistent_state
  // in effect (LoRA and QLoRA: without it, the frozen base's persistent chunks, [Sharded frozen
  // base]): the persistent chunks' parameters 1/W per rank too, all-gathered (no host copy)
  // before each stage that uses them, the next stage's prefetched beside the current one's
  // compute, and released after: a stage's and the next stage's gathered chunks on the device at
  // once; nothing is gathered after the update (ZeRO-3 over the persistent chunks).
  bool shard_persistent_params = false;
  // The CPU optimizer of offloaded chunks starts on each chunk as soon as its grads are final,
  // overlapping the rest of backward; false (gradient clipping) runs it after backward.
  bool cpu_optimizer_overlaps = true;
  double fragmentation_factor = 1.0;  // alpha of the calibration contract
  double time_factor = 1.0;           // step-time calibration: scales every predicted time
  int64_t residual_bytes = 0;         // calibration residual
  // Fraction of HBM bandwidth the GPU optimizer kernels reach.
  double hbm_efficiency = 0.7;
  // Per step, when any chunk is offloaded: handing grads to the CPU optimizer and waiting for
  // its last updates before the next step (thread hand-off, stream synchronisation). Overlap
  // cannot hide it; it makes offloading a nearly free chunk not worth it.
  double offload_step_overhead_seconds = 1e-3;
  // Build the O(N) overlap-window tables that make Time() O(log N). Memory-only users (limit
  // probes) skip them; Time() then walks every window.
  bool build_time_tables = true;
  // The plans' head chunk (ResidencyPlan::head_chunk_logit_bytes; 0: kHeadChunkLogitBytes, the
  // trace's): another size re-prices the trace's head (RepriceHeadChunks, analytic_trace.h).
  int64_t head_chunk_logit_bytes = 0;
};

// How many blocks use each non-default mode. Blocks are arranged (block 0 first) as
// [SWAP x n_swap][HS_OFFLOAD x n_hs_offload][CKPT x n_checkpoint][NONE ...].
struct ModeCounts {
  int32_t n_swap = 0;
  int32_t n_hs_offload = 0;
  int32_t n_checkpoint = 0;
  int32_t total() const { return n_swap + n_hs_offload + n_checkpoint; }
  friend bool operator==(const ModeCounts&, const ModeCounts&) = default;
};

std::vector<BlockMode> ArrangeBlockModes(int32_t num_blocks, const ModeCounts& counts);
// The counts of `modes` when they follow the arrangement above, else nullopt.
std::optional<ModeCounts> CountsIfArranged(const std::vector<BlockMode>& modes);
ModeCounts CountModes(const std::vector<BlockMode>& modes);

// Per micro-batch forward/backward times and per-step optimizer times.
struct StepTime {
  double forward_seconds = 0;        // T_fwd (eq. 3)
  double backward_seconds = 0;       // T_bwd (eq. 4)
  double gpu_optimizer_seconds = 0;  // persistent chunks, at HBM rate
  // [Two CPU passes] (common/optimizer_bytes.h), non-persistent chunks: T_acc, one micro-batch's
  // grads added on the host beside its backward (0 for a profile without the figure), and T_upd,
  // the update pass (for such a profile, the whole pass).
  double cpu_accumulate_seconds = 0;
  double cpu_optimizer_seconds = 0;
  // Clipping with several micro-batches: the host pass that reads the offloaded grads for the
  // global norm, before any update can start.
  double cpu_norm_seconds = 0;
  double fixed_seconds = 0;            // per-step overhead of offloading (not overlapped)
  bool cpu_optimizer_overlaps = true;  // CostOptions::cpu_optimizer_overlaps
  // What is left of the CPU updates after the step runs beside the next step's forward, clipped
  // or not (StepUpdatesDeferred).
  bool cpu_optimizer_deferred = false;
  // [CPU windows] The CPU optimizer cannot use the whole step: backward runs
  // cpu_backward_lead_seconds before the first offloaded chunk's grads are final (the stages from
  // the head down to the first one using the last chunk), and the next forward hides deferred
  // updates only until it needs the last chunk still being updated (cpu_forward_tail_seconds: its
  // windows from the one that uploads that chunk to the end): the last chunk, or unclipped the
  // last of those backward left pending ([Pending updates in chunk order], cost_time.cc). 0 and 0
  // give the unbounded formulas.
  double cpu_backward_lead_seconds = 0;
  double cpu_forward_tail_seconds = 0;
  // One optimizer step over grad_accum micro-batches (eq. 2, GA micro-batches):
  //   overlapped: GA T_fwd + (GA-1) max(T_bwd, T_acc) + max(T_bwd + T_gpu, T_acc + T_upd)
  //   clipping:   GA T_fwd + GA max(T_bwd, T_acc) + T_norm + max(T_gpu, T_upd)
  //   deferred:   T_upd less T_fwd in both, the next forward hiding the rest of the updates
  //               (steady state: each step's forward overlaps the last step's updates)
  //   [CPU windows]: T_lead + T_acc + T_upd in the overlapped maximum, T_fwd - T_tail hidden
  // plus fixed_seconds.
  double IterationSeconds(int32_t grad_accum) const;
};

class CostModel {
 public:
  // `trace` must have at least one block; `chunk_bytes` > 0. Fails with INVALID_ARGUMENT on
  // inconsistent inputs (e.g. world_size > 1 without NCCL bandwidths).
  static absl::StatusOr<CostModel> Create(const Trace& trace, int64_t chunk_bytes,
                                          const HardwareSpec& hardware, const CostOptions& options);

  // The same model for another workload of the same architecture: `trace` must have the same
  // per-stage parameter bytes (only activations and times differ), so the chunk tables are
  // reused and only the O(N log N) block tables are rebuilt. Options may differ only in
  // build_time_tables.
  absl::StatusOr<CostModel> ForTrace(const Trace& trace, bool build_time_tables) const;
  // The same model with the plans' head chunk of `logit_bytes` (CostOptions::
  // head_chunk_logit_bytes): the head re-priced, the chunk tables shared.
  CostModel WithHeadChunkLogitBytes(int64_t logit_bytes) const;
  // The (head-re-priced) trace this model prices.
  const Trace& trace() const { return trace_; }

  // Structural validity of `plan` for this model (chunk size and count, knob ranges, buffers
  // needed by the layout, block_modes length). Names the field in the error.
  absl::Status ValidatePlan(const ResidencyPlan& plan) const;
  // Every Prediction field. Arranged block modes: O(log N); any other order: O(N) walk.
  // Precondition: ValidatePlan(plan).ok().
  Prediction Predict(const ResidencyPlan& plan) const;
  // The same figures computed by plain loops over every phase and overlap window (tests).
  Prediction PredictReference(const ResidencyPlan& plan) const;
  // A plan with these knobs and arranged modes (fills chunk fields, world size, block_modes).
  ResidencyPlan MakeResidencyPlan(int32_t n_persist, int32_t n_buffer, const ModeCounts& counts,
                                  HostMemoryKind host_memory) const;

  // ---- building blocks for the search; all O(1) or O(log N) ----
  int32_t num_blocks() const { return num_blocks_; }
  int32_t num_chunks() const { return num_chunks_; }
  int64_t chunk_bytes() const { return chunks_->layout.chunk_bytes; }
  const ChunkLayout& layout() const { return chunks_->layout; }
  const CostOptions& options() const { return options_; }
  // Fewest shared chunk buffers that let every stage run with its successor's regular chunks
  // prefetched (oversized chunks have buffers of their own).
  int32_t MinBuffers(int32_t n_persist) const;
  // Raw (pre-calibration) bytes held for the whole step: persistent chunks with their optimizer
  // state, chunk buffers, grad staging for offloaded chunks. The steady peak is
  //   StaticRawBytes + StepDynamicRawBytes(modes, n_persist).
  int64_t StaticRawBytes(int32_t n_persist, int32_t n_buffer) const;
  // Grad bytes besides the persistent grads themselves, held for the whole step: offloaded
  // chunks' staging, with W > 1 the persistent all-reduce's fp32 copies in flight, and with
  // sharded persistent parameters the gathered chunks. (Sharded persistent state's reduce-scatter
  // buffers are not here: they belong to phases, PersistentReduceBytes.)
  int64_t GradStagingBytes(int32_t n_persist) const;
  // [Vocabulary-sized allocations] the allocator's reserve for the step's largest allocation:
  // one [V, H] grad, or with sharded persistent state over a persistent embedding stage its
  // reduce-scatter working set (MemoryBreakdown::allocator_slack_bytes).
  int64_t VocabSlackBytes(int32_t n_persist) const;
  // [State reduce-scatter per group] With sharded persistent state: the device bytes of the
  // reduce-scatter buffers (fp32 flat and fp32 shard) of the persistent chunks among [0, n_persist)
  // that stage `stage` (0 = embedding, 1..N blocks, N + 1 head) owns in forward; they are issued
  // at the stage's backward hook and live until the next stage's. 0 without sharded state.
  int64_t PersistentReduceBytes(int32_t stage, int32_t n_persist) const;
  // Of that, the device slots the agent allocates for the blocks' offloaded grads ([Grad staging
  // slots], common/chunk_packing.h); 0 where the model does not price slots (several ranks,
  // adapters, an unknown layout) or nothing is offloaded.
  int64_t GradSlotBytes(int32_t n_persist) const;
  // Grads are reduced over the ranks in fp32 whatever the model dtype ([Sharded chunks]): the
  // bytes a reduction moves per byte of model-dtype grads.
  double ReduceWidening() const { return 4.0 / static_cast<double>(dtype_bytes_); }
  // The persistent chunks' link bytes per grad byte: [Narrow reduce-scatter] sends a 16-bit
  // model's sharded-state grads in their own dtype; the all-reduce widens them to fp32.
  double PersistentReduceWidening() const { return chunks_->shard_state ? 1.0 : ReduceWidening(); }
  // A persistent chunk's grads cross the link twice when all-reduced, once when reduce-scattered
  // ([Sharded persistent state]).
  double PersistentReduceFactor() const { return chunks_->shard_state ? 1.0 : 2.0; }
  // Whether this model's persistent chunks keep their optimizer state sharded.
  bool ShardsPersistentState() const { return chunks_->shard_state; }
  bool ShardsPersistentParams() const { return chunks_->shard_params; }
  // Whether options.shard_persistent_state can take effect for this workload ([Sharded persistent
  // state]): several ranks, a full fine-tune (LoRA's adapters stay replicated), not adamw8bit
  // (its 256-element blocks would straddle shards). What the agent's ChunkManager accepts.
  static bool CanShardPersistentState(const Trace& trace, const CostOptions& options);
  // Whether options.shard_persistent_params can take effect ([Sharded persistent parameters]):
  // with the state sharded for a full fine-tune; alone for LoRA and QLoRA over several ranks (the
  // frozen base's persistent chunks, [Sharded frozen base]; the adapters stay replicated).
  static bool CanShardPersistentParams(const Trace& trace, const CostOptions& options);
  // Persistent chunks + their optimizer state only (a lower bound of StaticRawBytes).
  int64_t PersistentRawBytes(int32_t n_persist) const;
  // End of backward / optimizer step: every persistent chunk's grads exist, activations are gone.
  int64_t GradPhaseRawBytes(int32_t n_persist) const;
  // [Grads beside backward] The largest backward phase of a block next to the grads already
  // produced when it runs: the tied embedding's (written by the head's backward, staged or updated
  // only after the embedding's own backward) and the persistent chunks' of later blocks (kept
  // until the optimizer step). Non-decreasing in n_persist.
  int64_t BackwardGradsRawBytes(const ModeCounts& counts, int32_t n_persist) const;
  // Every dynamic phase of the step: max(DynamicRawBytes, GradPhaseRawBytes,
  // BackwardGradsRawBytes) — what the steady peak adds to StaticRawBytes. `dyn` is
  // DynamicRawBytes(counts), when the caller has it.
  int64_t StepDynamicRawBytes(const ModeCounts& counts, int64_t dyn, int32_t n_persist) const;
  // BackwardGradsRawBytes(counts, n) for every n at O(log N) each: the blocks' phases for these
  // counts are read once. The searches ask it for many n_persist at the same mode counts.
  class BackwardGradsByPersist {
   public:
    int64_t At(int32_t n_persist) const;

   private:
    friend class CostModel;
    const CostModel* model_ = nullptr;
    // Per block j: the chunks the next stage owns in forward, [begin_j, end_j) (later blocks'
    // and the head's chunks start at begin_j), and the block's phase.
    std::vector<int32_t> begin_, end_;
    std::vector<int64_t> phase_;
    // max over i <= j of phase_i + GradsLiveInBackward(i, n) - pgrad_prefix[n], for n >= end_i
    std::vector<int64_t> prefix_max_;
    std::vector<int64_t> suffix_max_;  // max over i >= j of phase_i
  };
  BackwardGradsByPersist BackwardGradsTable(const ModeCounts& counts) const;
  // StepDynamicRawBytes with the table of the same counts.
  int64_t StepDynamicRawBytes(const BackwardGradsByPersist& grads, int64_t dyn,
                              int32_t n_persist) const;
  // Largest n_persist in [0, max_persist] whose persistent bytes plus the calibrated grad phase
  // fit `room` (capacity less residual and context, see Room()), or -1.
  int32_t MaxPersistForGradPhase(int64_t room_bytes, int32_t max_persist) const;
  // Largest n_persist in [0, max_persist] with PersistentRawBytes <= budget, or -1.
  int32_t MaxPersistWithin(int64_t budget_bytes, int32_t max_persist) const;
  // Smallest n_persist with HostBytes <= host_limit, or num_chunks() + 1 when none.
  int32_t MinPersistForHost(int64_t host_limit_bytes, const ModeCounts& counts) const;
  // Raw bytes of the activation walk (max over forward, head and backward phases).
  int64_t DynamicRawBytes(const ModeCounts& counts) const;
  // Raw bytes while weights are loaded and packed into chunks (before the first step).
  int64_t LoadRawBytes(int32_t n_persist, int32_t n_buffer) const;
  // Bytes of one shared device chunk buffer: the largest regular (not oversized) chunk.
  int64_t SharedBufferBytes() const { return chunks_->shared_buffer_bytes; }
  // Device bytes of all chunk buffers: n_buffer shared ones plus one of its own for every
  // non-persistent oversized chunk (the agent's rule, agent/chunks/chunk_manager.cc).
  int64_t BufferBytes(int32_t n_persist, int32_t n_buffer) const;
  // Calibration contract ([Exact and scaled bytes]): exact + ceil(alpha * scaled) + residual +
  // cuda_context. Exact bytes are allocated once at their exact size for the whole run
  // (persistent chunks, their optimizer state, chunk buffers, grad staging: StaticRawBytes, and
  // LoadRawBytes); scaled bytes are the step's dynamic allocations (activations, checkpoint
  // chain, transients, the grad phase), whose allocator slack the factor alpha stands for.
  int64_t Peak(int64_t exact_bytes, int64_t scaled_bytes) const;
  // alpha applied to dynamic bytes: ceil(alpha * scaled).
  int64_t Scaled(int64_t scaled_bytes) const;
  // What exact + Scaled(dynamic) may take on a card of `capacity_bytes`: the capacity less the
  // residual and the CUDA context (may be negative).
  int64_t Room(int64_t capacity_bytes) const;
  // Host bytes (pinned or pageable, per rank) for offloaded chunk state and activations.
  // Sharded (world_size W > 1): each rank's shards, ShardElems() of every offloaded chunk.
  int64_t HostBytes(int32_t n_persist, const ModeCounts& counts) const;
  // What one rank's chunk manager allocates for a plan (its ChunkMemoryStats, byte for byte;
  // RankMemory in common/types.h); `host_bytes` is HostBytes() of the plan, activations
  // included, for node_host_bytes.
  RankMemory RankChunkMemory(int32_t n_persist, int32_t n_buffer, HostMemoryKind host_memory,
                             int64_t host_bytes) const;
  // Times for arranged modes. lower_bound charges persistent grads a reduce-scatter instead of
  // an all-reduce (W > 1), which makes forward + backward time monotone non-increasing in
  // n_persist and never above the real time (search bounds).
  StepTime Time(int32_t n_persist, int32_t n_buffer, const ModeCounts& counts,
                HostMemoryKind host_memory, bool lower_bound = false) const;
  double GpuOptimizerSeconds(int32_t n_persist) const { return chunks_->gpu_opt_prefix[n_persist]; }
  double IterationSeconds(const StepTime& time) const {
    return time.IterationSeconds(options_.grad_accum);
  }

 private:
  CostModel() = default;

  // Block modes either from arranged counts or from an explicit vector.
  struct Modes {
    const std::vector<BlockMode>* explicit_modes = nullptr;
    ModeCounts counts;
    BlockMode Block(int32_t j) const;
    BlockMode Stage(int32_t s, int32_t num_blocks) const;  // edges are kNone
  };
  struct PlanPoint {
    int32_t n_persist = 0;
    int32_t n_buffer = 0;
    int kind = 0;  // 0 pinned, 1 pageable
    bool lower_bound = false;
  };
  struct DynamicParts {
    int64_t total = 0;
    int64_t activations = 0;
    int64_t checkpoint_chain = 0;
    int64_t transient = 0;
    int64_t head = 0;  // of activations + transient: the head's own bytes (head phase only)
  };

  void Precompute();
  void PrecomputeBlocks();
  void PrecomputeChunks(ChunkLayout layout);
  void PrecomputeWindows();
  int64_t ActBytes(int32_t block, BlockMode mode) const;  // bytes a mode moves to/from host
  int64_t RetainedBytes(int32_t block, BlockMode mode) const;
  double Link(double up_bytes, double down_bytes, int kind) const;
  // One overlap window: compute `comp` beside the link's copies and `nccl` seconds of collectives
  // ([Pageable copies drain the queue] in cost_model.cc).
  double Window(double comp, double up_bytes, double down_bytes, int kind, double nccl) const;
  // The bus bandwidths of the collectives inside the forward and backward windows ([Collectives
  // under compute] in cost_time.cc).
  double StepAllgatherRate() const;
  double StepReduceScatterRate() const;
  // [Local reduce passes] Device seconds, on the compute stream, of the copies and element-wise
  // passes around the collective of `grad_bytes` of persistent chunks' grads (model dtype).
  double LocalReduceSeconds(double grad_bytes) const;
  double ForwardWindow(int32_t k, const PlanPoint& p, const Modes& m) const;
  double BackwardWindow(int32_t s, const PlanPoint& p, const Modes& m) const;
  double BackwardEdges(const PlanPoint& p) const;                        // pre- and post-windows
  int ForwardKey(int32_t k, const PlanPoint& p, const Modes& m) const;   // -1 = not pure
  int BackwardKey(int32_t s, const PlanPoint& p, const Modes& m) const;  // -1 = not pure
  double ForwardWindowPure(int32_t k, int key, int kind) const;
  double BackwardWindowPure(int32_t s, int key, int kind) const;
  StepTime TimeImpl(const PlanPoint& p, const Modes& m, bool fast) const;
  DynamicParts DynamicImpl(const Modes& m, bool fast) const;
  DynamicParts PhaseParts(int phase, const Modes& m) const;  // -1 emb, 0..N-1 block, N head
  int64_t PhaseTotal(int phase, const Modes& m) const;
  // Grads live while block j runs backward ([Grads beside backward]), with sharded persistent
  // state the next stage's reduce-scatter buffers in flight in place of its grad shards.
  int64_t GradsLiveInBackward(int32_t j, int32_t n_persist) const;
  // Sharded persistent state: stage s's reduce-scatter buffers less the grad shards they become
  // (which pgrad_prefix counts from the step's start); 0 otherwise. >= 0.
  int64_t ReduceBeyondShards(int32_t stage, int32_t n_persist) const;
  // GradPhaseRawBytes' parts: the persistent grads, and what comes on top of them at the
  // embedding's backward, at the end of backward (the embedding stage's reduce-scatter, or its
  // all-reduce copy with replicated state, in flight) and in the optimizer step.
  struct GradPhase {
    int64_t grads = 0, embedding = 0, last_reduce = 0, step = 0;
    int64_t total() const { return grads + std::max({embedding, last_reduce, step}); }
  };
  GradPhase GradPhaseParts(int32_t n_persist) const;
  // BackwardGradsRawBytes for any Modes; *phase (if given) gets the block of the maximum.
  int64_t BackwardGradsImpl(const Modes& m, int32_t n_persist, int* phase) const;
  Prediction Assemble(const ResidencyPlan& plan, const Modes& m, bool fast) const;
  int32_t RangeMaxIndex(int mode, int32_t lo, int32_t hi) const;  // argmax V_mode on [lo, hi)
  int64_t ModeValue(int mode, int32_t j) const;
  int64_t ChunkSum(const std::vector<int64_t>& prefix, int64_t lo, int64_t hi) const;
  double ChunkSumD(const std::vector<double>& prefix, int64_t lo, int64_t hi) const;

  Trace trace_;
  HardwareSpec hardware_;
  CostOptions options_;
  int32_t num_blocks_ = 0;
  int32_t num_chunks_ = 0;
  int64_t dtype_bytes_ = 2;
  bool tied_ = false;

  // Blocks (index j): retained/saved figures and the transient peak of each block.
  std::vector<int64_t> saved_, input_, block_extra_;
  std::vector<int64_t> saved_prefix_, input_prefix_;  // size N + 1
  // Range-max tables over V_mode(j) for modes none/ckpt/swap/hs (argmax indices per level).
  std::array<std::vector<std::vector<int32_t>>, 4> sparse_;
  int64_t emb_retained_ = 0, emb_extra_ = 0, head_saved_ = 0, head_extra_ = 0;
  // [Vocabulary-sized allocations] (MemoryBreakdown::allocator_slack_bytes).
  int64_t vocab_slack_ = 0;

  // Stages (0 = embedding, 1..N blocks, N+1 head).
  std::vector<double> fwd_s_, bwd_s_, rec_s_;

  // Everything derived from the chunk layout alone; shared (immutable) between the models that
  // ForTrace() derives for other workloads.
  struct ChunkTables {
    ChunkLayout layout;
    std::vector<int32_t> fwd_owned_begin;  // size N + 3; fwd owner = first stage using a chunk
    std::vector<int32_t> bwd_owned_begin;  // size N + 3; bwd owner = last stage using a chunk
    std::vector<int32_t> window_span;      // chunks used by window k: [first_{k-1}, last_k]
    std::vector<int32_t> window_span_suffix_max;
    // Chunk prefix sums (size C + 1).
    std::vector<int64_t> fill_prefix, train_prefix, alloc_prefix, opt_prefix, host_prefix;
    std::vector<int64_t> host_transfer_prefix;  // of host_prefix: params + grad staging
    std::vector<int64_t> persistent_prefix;     // alloc + opt
    // Persistent grads held from their chunk's reduction to the optimizer step: the trainable
    // bytes, or with sharded state this rank's shard of them ([Sharded persistent state]).
    std::vector<int64_t> pgrad_prefix;
    std::vector<double> gpu_opt_prefix;
    // [Two CPU passes]: the offloaded chunks' update (or whole) pass and accumulate pass.
    std::vector<double> cpu_opt_prefix, cpu_acc_prefix;
    // [Sharded persistent state]: all-gathering the updated parameters after the step.
    std::vector<double> gather_prefix;
    bool shard_state = false;  // the option, in effect (W > 1, full fine-tuning, not adamw8bit)
    // [Sharded persistent parameters], in effect (with shard_state, or a LoRA run's frozen base)
    bool shard_params = false;
    // [Sharded persistent parameters], per n_persist (size n_chunks + 1): the padded bytes of
    // the gathered persistent chunks held at once (a stage's and the next stage's, the tied
    // head's embedding chunks included); zeros otherwise.
    std::vector<int64_t> persistent_gather_by_npersist;
    int64_t grad_staging_bytes = 0;
    // [Grad staging slots] per n_persist (world size 1, full fine-tuning, the agent's layout):
    // the staging of offloaded grads, replacing grad_staging_bytes; empty otherwise.
    std::vector<int64_t> grad_staging_by_npersist;
    // Sharded (W > 1) with replicated persistent state, per n_persist (size n_chunks + 1): the
    // fp32 copies of persistent grads whose all-reduce is in flight during backward (two chunks:
    // one reduced, one being copied), over the persistent chunks that blocks or the head
    // complete (not the embedding stage's); zeros otherwise.
    std::vector<int64_t> persistent_reduce_by_npersist;
    // The same, per n_persist: the fp32 copy of the largest embedding-stage persistent chunk,
    // in flight from the last backward hook to the step (GradPhaseParts); zeros otherwise.
    std::vector<int64_t> replicated_last_reduce_by_npersist;
    // [State reduce-scatter per group] With sharded persistent state, prefix sums over chunks
    // (size C + 1) of StateReduceScatterBytes (common/optimizer_bytes.h); zeros otherwise.
    std::vector<int64_t> state_reduce_prefix;
    // Sharded (W > 1, full fine-tuning), per n_persist: the staging of the offloaded chunks'
    // grads ([Sharded chunks]), sized by the two largest offloaded chunks; empty otherwise.
    std::vector<int64_t> sharded_staging_by_npersist;
    // LoRA of a known architecture: the adapters' chunks, grads and state are in every
    // persistent prefix (index 0 included) and updated on the device ([LoRA managers]).
    bool adapters_persistent = false;
    int64_t optimizer_step_extra_bytes = 0;  // fp32 copy of one chunk's grads (mixed precision)
    // Trainable bytes of the embedding's chunks when the head shares its weight: their grads
    // exist from the head's backward to the end of backward ([Grads beside backward]).
    int64_t tied_grad_bytes = 0;
    int64_t shared_buffer_bytes = 0;        // largest regular chunk of the layout
    std::vector<int64_t> oversized_suffix;  // size C + 1: oversized chunk bytes in [c, C)
    std::vector<int32_t> regular_prefix;    // size C + 1: regular chunks in [0, c)
  };
  std::shared_ptr<const ChunkTables> chunks_;

  // Prefix sums of pure overlap windows, per host kind.
  // Forward: key = fwd_state(2) * 3 + act(3). Backward: key = mode(4) * 9 + bst(3) * 3 + fst(3).
  std::array<std::vector<std::vector<double>>, 2> fwd_prefix_, bwd_prefix_;
  double h2d_[2] = {0, 0}, d2h_[2] = {0, 0};
  double bidir_ = 0;
};

}  // namespace memplan
