// The cost model's memory: peak device bytes (ProTrain eqs. 8-11), load-time and host bytes, the
// raw terms the search bounds with (cost_model.h).
#include <algorithm>
#include <cmath>
#include <limits>

#include "common/optimizer_bytes.h"
#include "planner/cost/cost_model.h"
#include "planner/cost/cost_model_internal.h"

namespace memplan {

using cost_internal::FloorLog2;
using cost_internal::kCkptMode;
using cost_internal::kHsMode;
using cost_internal::kNoneMode;
using cost_internal::kSwapMode;

int64_t CostModel::ModeValue(int mode, int32_t j) const {
  // V_mode(j) = retained bytes of blocks [0, j) all in `mode` + block j's own saved set and
  // transient peak + what its predecessor (same mode) has in flight.
  int64_t retained = 0;
  if (mode == kNoneMode) retained = saved_prefix_[j];
  if (mode == kCkptMode || mode == kSwapMode) retained = input_prefix_[j];  // [Swapped inputs]
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

// [Swapped inputs] A SWAP block's input stays on the device until its backward, beside its host
// copy: the agent's group (agent/blocks/group_runner.cc) holds it as the inner graph's leaf, and
// the previous group holds the same storage as its output. Measured on an H200: qwen2.5-7b LoRA
// 1x44032 with 21 SWAP blocks kept 301 MiB (one hidden vector a token) more per SWAP block through
// forward than priced before, 13.8 % above the predicted peak. Not priced: the input of an
// HS_OFFLOAD block right after SWAP blocks stays on the device too (the last SWAP group holds it
// as its output), one hidden vector a token in such plans. The better fix is the agent's: let a
// SWAP group drop its input's device storage once the copy is made.
int64_t CostModel::RetainedBytes(int32_t block, BlockMode mode) const {
  if (mode == BlockMode::kNone) return saved_[block];
  if (mode == BlockMode::kCkpt || mode == BlockMode::kSwap) return input_[block];
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

int64_t CostModel::ReduceBeyondShards(int32_t stage, int32_t n_persist) const {
  if (!chunks_->shard_state || stage < 0 || stage > num_blocks_ + 1) return 0;
  const int32_t lo = chunks_->fwd_owned_begin[stage];
  const int32_t hi = std::min(n_persist, chunks_->fwd_owned_begin[stage + 1]);
  if (hi <= lo) return 0;
  return chunks_->state_reduce_prefix[hi] - chunks_->state_reduce_prefix[lo] -
         (chunks_->pgrad_prefix[hi] - chunks_->pgrad_prefix[lo]);
}

int64_t CostModel::PersistentReduceBytes(int32_t stage, int32_t n_persist) const {
  if (!chunks_->shard_state || stage < 0 || stage > num_blocks_ + 1) return 0;
  const int32_t lo = chunks_->fwd_owned_begin[stage];
  const int32_t hi = std::min(n_persist, chunks_->fwd_owned_begin[stage + 1]);
  return hi > lo ? chunks_->state_reduce_prefix[hi] - chunks_->state_reduce_prefix[lo] : 0;
}

CostModel::GradPhase CostModel::GradPhaseParts(int32_t n_persist) const {
  // Persistent grads are produced during backward (nothing holds them before the first block's
  // backward); they are all alive when the embedding's backward ends, next to its transient,
  // and in the optimizer step, next to the fp32 copy of one chunk's grads (mixed precision).
  // [State reduce-scatter per group]: the embedding's backward runs beside the first block's
  // reduce-scatter, and the embedding stage's own is in flight from its hook to the step; with
  // replicated state that stage's all-reduce copy is ([Persistent all-reduce in backward]).
  const bool updates_on_device = n_persist > 0 || chunks_->adapters_persistent;
  GradPhase g;
  g.grads = chunks_->pgrad_prefix[n_persist];
  g.embedding = emb_retained_ + emb_extra_ + ReduceBeyondShards(1, n_persist);
  g.last_reduce = chunks_->shard_state ? ReduceBeyondShards(0, n_persist)
                                       : chunks_->replicated_last_reduce_by_npersist[n_persist];
  g.step = updates_on_device ? chunks_->optimizer_step_extra_bytes : 0;
  return g;
}

int64_t CostModel::GradPhaseRawBytes(int32_t n_persist) const {
  return GradPhaseParts(n_persist).total();
}

int64_t CostModel::GradsLiveInBackward(int32_t j, int32_t n_persist) const {
  // Chunks first used by a stage after block j's (stage j + 1) hold only later blocks' (or the
  // head's) parameters, whose grads are done; a chunk that block j shares with its successor is
  // left out (at most one chunk). With sharded persistent state the next stage's (j + 2) chunks
  // are being reduce-scattered beside block j's backward ([State reduce-scatter per group]).
  const int32_t begin = chunks_->fwd_owned_begin[j + 2];
  int64_t live = chunks_->tied_grad_bytes;
  if (n_persist > begin) live += chunks_->pgrad_prefix[n_persist] - chunks_->pgrad_prefix[begin];
  return live + ReduceBeyondShards(j + 2, n_persist);
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
  // BackwardGradsImpl's max over blocks j of phase_j + GradsLiveInBackward(j, n). With the next
  // stage's chunks [begin_j, end_j) (both never decrease with j, the ranges are disjoint):
  //   n <= begin_j: phase_j + tied (a suffix of the blocks);
  //   n >= end_j: phase_j + tied + pgrad[n] + (GradsLiveInBackward(j, end_j) - tied -
  //     pgrad[end_j]), a constant plus pgrad[n] (a prefix of the blocks);
  //   begin_j < n < end_j: at most one block, evaluated directly.
  Modes m;
  m.counts = counts;
  BackwardGradsByPersist t;
  t.model_ = this;
  const int32_t n = num_blocks_;
  const int64_t tied = chunks_->tied_grad_bytes;
  t.begin_.resize(n);
  t.end_.resize(n);
  t.phase_.resize(n);
  t.prefix_max_.resize(n);
  t.suffix_max_.resize(n);
  for (int32_t j = 0; j < n; ++j) {
    t.phase_[j] = PhaseTotal(j, m);
    t.begin_[j] = chunks_->fwd_owned_begin[j + 2];
    t.end_[j] = chunks_->fwd_owned_begin[j + 3];
    const int64_t v =
        t.phase_[j] + GradsLiveInBackward(j, t.end_[j]) - tied - chunks_->pgrad_prefix[t.end_[j]];
    t.prefix_max_[j] = j == 0 ? v : std::max(t.prefix_max_[j - 1], v);
  }
  for (int32_t j = n - 1; j >= 0; --j) {
    t.suffix_max_[j] = j == n - 1 ? t.phase_[j] : std::max(t.suffix_max_[j + 1], t.phase_[j]);
  }
  return t;
}

int64_t CostModel::BackwardGradsByPersist::At(int32_t n_persist) const {
  const CostModel& model = *model_;
  // Blocks [0, k_full) have end_j <= n_persist, blocks [0, k) begin_j < n_persist.
  const int32_t k_full =
      static_cast<int32_t>(std::upper_bound(end_.begin(), end_.end(), n_persist) - end_.begin());
  const int32_t k = static_cast<int32_t>(std::lower_bound(begin_.begin(), begin_.end(), n_persist) -
                                         begin_.begin());
  const int64_t tied = model.chunks_->tied_grad_bytes;
  int64_t best = std::numeric_limits<int64_t>::min();
  if (k_full > 0) best = prefix_max_[k_full - 1] + model.chunks_->pgrad_prefix[n_persist] + tied;
  for (int32_t j = k_full; j < k; ++j) {
    best = std::max(best, phase_[j] + model.GradsLiveInBackward(j, n_persist));
  }
  if (k < static_cast<int32_t>(begin_.size())) best = std::max(best, suffix_max_[k] + tied);
  if (best == std::numeric_limits<int64_t>::min()) return 0;  // no blocks
  return std::max<int64_t>(0, best);
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
         GradStagingBytes(n_persist) + VocabSlackBytes(n_persist);
}

int64_t CostModel::VocabSlackBytes(int32_t n_persist) const {
  // [Vocabulary-sized allocations] With sharded persistent state the embedding stage's grads are
  // reduce-scattered at the last hook of backward from a flat, through a receive buffer as large,
  // into an fp32 shard (StateReduceScatterBytes): three buffers of a [V, H] grad's size or more,
  // allocated together when nothing but grads is left, and what the allocator maps above the rest
  // (seed 5757 draw 12, qwen2.5-14b on two H200s: reserved rose 4.36 GiB at that hook while the
  // allocated bytes stayed below their peak; docs/benchmarks.md).
  if (vocab_slack_ == 0 || !chunks_->shard_state) return vocab_slack_;
  const int32_t embedding_chunks = chunks_->fwd_owned_begin[1];
  if (embedding_chunks <= 0 || n_persist < embedding_chunks) return vocab_slack_;
  return std::max(vocab_slack_, chunks_->state_reduce_prefix[embedding_chunks]);
}

int64_t CostModel::GradStagingBytes(int32_t n_persist) const {
  const int64_t offloaded = n_persist >= num_chunks_ ? 0
                            : !chunks_->sharded_staging_by_npersist.empty()
                                ? chunks_->sharded_staging_by_npersist[std::max(n_persist, 0)]
                            : !chunks_->grad_staging_by_npersist.empty()
                                ? chunks_->grad_staging_by_npersist[n_persist]
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
    // ckpt_inputs: every input held on the device for backward, CKPT blocks' and [Swapped inputs].
    int64_t none_saved = 0, ckpt_inputs = 0;
    if (m.explicit_modes == nullptr) {
      const int32_t s = m.counts.n_swap;
      const int32_t c_begin = s + m.counts.n_hs_offload;
      const int32_t c_end = m.counts.total();
      ckpt_inputs = input_prefix_[std::min(j, c_end)] - input_prefix_[std::min(j, c_begin)] +
                    input_prefix_[std::min(j, s)];
      none_saved = j > c_end ? saved_prefix_[j] - saved_prefix_[c_end] : 0;
    } else {
      for (int32_t i = 0; i < j; ++i) {
        const BlockMode mode = m.Block(i);
        (mode == BlockMode::kNone ? none_saved : ckpt_inputs) += RetainedBytes(i, mode);
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
      if (mode == kCkptMode || mode == kSwapMode) return input_prefix_[j];
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

}  // namespace memplan
