// The cost model's time: overlap windows of compute, host copies and collectives, and the step
// time (ProTrain eqs. 2-7; cost_model.h).
#include <algorithm>
#include <cmath>
#include <vector>

#include "common/optimizer_bytes.h"
#include "planner/cost/cost_model.h"
#include "planner/cost/cost_model_internal.h"

namespace memplan {

using cost_internal::kCkptMode;
using cost_internal::kHsMode;
using cost_internal::kSwapMode;

double StepTime::IterationSeconds(int32_t grad_accum) const {
  const double ga = std::max(1, grad_accum);
  // A chunk's accumulate starts when its grads land; offloaded chunks are the last blocks', whose
  // backward runs first, so the pass runs beside the micro-batch's backward and ends with it
  // unless it is the longer of the two.
  const double bwd = std::max(backward_seconds, cpu_accumulate_seconds);
  // [Deferred CPU updates]: the next forward runs beside what is left of the CPU updates and
  // hides up to T_fwd of it, clipped or not; [CPU windows]: less the forward's tail after the
  // last offloaded chunk's upload.
  const double hidden =
      cpu_optimizer_deferred ? std::max(0.0, forward_seconds - cpu_forward_tail_seconds) : 0.0;
  // Written so that T_acc = T_norm = T_lead = T_tail = 0 (a profile without the two-pass
  // figures) gives the single-pass formula bit for bit.
  const double tail = cpu_optimizer_overlaps
                          ? std::max(backward_seconds + gpu_optimizer_seconds,
                                     cpu_backward_lead_seconds + cpu_accumulate_seconds +
                                         cpu_optimizer_seconds - hidden)
                          : bwd + cpu_norm_seconds +
                                std::max(gpu_optimizer_seconds, cpu_optimizer_seconds - hidden);
  return ga * forward_seconds + (ga - 1) * bwd + tail + fixed_seconds;
}

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

// [Collectives under compute] (agent/bench/collective_bench.h): the gathers and reduce-scatters
// of the forward and backward windows run beside the stages' GEMMs and share the GPU with them;
// the bench's figure for that, where the profile has one. The edges of backward and the gathers
// after the optimizer step have no compute beside them: the plain figures.
double CostModel::StepAllgatherRate() const {
  return hardware_.nccl_allgather_under_compute_bytes_per_second > 0
             ? hardware_.nccl_allgather_under_compute_bytes_per_second
             : hardware_.nccl_allgather_bytes_per_second;
}

// [Local reduce passes] With several ranks a persistent chunk's grads pass through device memory
// on the compute stream around their collective (agent/chunks/chunk_optimizer.cc,
// StartPersistentReduce; chunk_collectives.cc): bytes read and written per grad byte, d the
// model dtype's bytes and W the ranks:
//   sharded state, 16-bit: the grads copied into a flat (2), the exchanged slices summed into an
//     fp32 shard (1 + 4/(d·W), widened_sum_kernel.cu), its mean rounded with its squares
//     (4/(d·W) + 1/W, shard_mean_kernel.cu);
//   sharded state, fp32: the flat copy (2), the division in place (2/W), the squares through an
//     fp64 copy, its square and their sum (3/W + 4/W + 2/W);
//   all-reduced: the grads widened into an fp32 flat (1 + 4/d), divided in place (8/d) and copied
//     back (4/d + 1).
// The collectives themselves run beside compute (Window); these passes do not.
double CostModel::LocalReduceSeconds(double grad_bytes) const {
  const double w = options_.world_size;
  if (w <= 1 || grad_bytes <= 0) return 0.0;
  const double d = static_cast<double>(dtype_bytes_);
  double per_byte;
  if (chunks_->shard_state) {
    per_byte = d < 4 ? 2 + 1 + 4 / (d * w) + 4 / (d * w) + 1 / w : 2 + 11 / w;
  } else {
    per_byte = 2 + 16 / d;
  }
  return grad_bytes * per_byte / (hardware_.hbm_bytes_per_second * options_.hbm_efficiency);
}

double CostModel::StepReduceScatterRate() const {
  return hardware_.nccl_reduce_scatter_under_compute_bytes_per_second > 0
             ? hardware_.nccl_reduce_scatter_under_compute_bytes_per_second
             : hardware_.nccl_reduce_scatter_bytes_per_second;
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
      gathered +=
          static_cast<double>(ChunkSum(chunks_->fill_prefix, lo, std::min(hi, p.n_persist)));
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
  const double nccl = w > 1 ? (load + gathered) * (w - 1) / w / StepAllgatherRate() : 0.0;
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
  const double nccl = w > 1 ? (load + gathered) * (w - 1) / w / StepAllgatherRate() : 0.0;
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
    nccl =
        (refetch + regather) * frac / StepAllgatherRate() +
        (gradoff * ReduceWidening() +
         (p.lower_bound ? 1.0 : PersistentReduceFactor() * PersistentReduceWidening()) * ptrain) *
            frac / StepReduceScatterRate();
    // The lower bound leaves them out, which keeps it monotone in n_persist.
    if (!p.lower_bound) comp += LocalReduceSeconds(ptrain);
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
    post = std::max(
        post,
        (gradoff * ReduceWidening() +
         (p.lower_bound ? 1.0 : PersistentReduceFactor() * PersistentReduceWidening()) * ptrain) *
            frac / hardware_.nccl_reduce_scatter_bytes_per_second);
    if (!p.lower_bound) post += LocalReduceSeconds(ptrain);
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
  // Persistent grads are all-reduced (twice the reduce-scatter traffic, widened to fp32) or
  // reduce-scattered in their own dtype; the lower-bound variant charges them one model-dtype
  // reduce-scatter, never more than an offloaded chunk's fp32 one, so it stays monotone in
  // n_persist.
  const double ptrain = fst == 0
                            ? PersistentReduceFactor() * PersistentReduceWidening() * owned_train
                        : fst == 1 ? owned_train
                                   : 0.0;
  double nccl = 0;
  if (w > 1) {
    const double frac = (w - 1) / w;
    nccl = (refetch + regather) * frac / StepAllgatherRate() +
           (gradoff * ReduceWidening() + ptrain) * frac / StepReduceScatterRate();
    if (fst == 0) comp += LocalReduceSeconds(owned_train);  // not in the lower bound (fst 1)
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
  t.cpu_optimizer_deferred = StepUpdatesDeferred(options_.world_size);
  const bool walk = !fast || m.explicit_modes != nullptr || !options_.build_time_tables;
  // The forward windows [lo, n + 3): a plain walk, or prefix sums between the cuts where a
  // window's key may change (fwd_cuts, filled below when !walk).
  Cuts fwd_cuts;
  auto forward_from = [&](int32_t lo) {
    lo = std::max(lo, 0);
    if (walk) {
      double sum = 0;
      for (int32_t k = lo; k <= n + 2; ++k) sum += ForwardWindow(k, p, m);
      return sum;
    }
    Cuts cuts = fwd_cuts;
    return SumWindows(
        lo, n + 3, cuts, [&](int32_t k) { return ForwardKey(k, p, m); },
        [&](int32_t k) { return ForwardWindow(k, p, m); }, fwd_prefix_[p.kind]);
  };
  if (walk) {
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
    for (int32_t x : {0, 1, 3, n + 1}) fwd_cuts.Add(x);
    for (int32_t b : seg) fwd_cuts.Add(b + 3);
    fwd_cuts.Add(f);
    fwd_cuts.Add(f + 1);
    t.forward_seconds = forward_from(0);
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
  if (p.n_persist < num_chunks_) {
    // [CPU windows] The last chunk (offloaded whenever any is) is first used by stage f in
    // forward: window f uploads it, so deferred updates must be done by then; in backward its
    // grads are final after stage f's backward, the first offloaded grads the CPU can take.
    const auto& owned = chunks_->fwd_owned_begin;
    auto first_user = [&](int32_t chunk) {
      return static_cast<int32_t>(std::upper_bound(owned.begin(), owned.end(), chunk) -
                                  owned.begin() - 1);
    };
    const int32_t f = first_user(num_chunks_ - 1);
    for (int32_t s = std::max(f, 0); s <= n + 1; ++s) {
      t.cpu_backward_lead_seconds += BackwardWindow(s, p, m);
    }
    int32_t last_waited = num_chunks_ - 1;
    if (options_.cpu_optimizer_overlaps && t.cpu_optimizer_deferred) {
      // [Pending updates in chunk order] Unclipped, each chunk's accumulate and update run as
      // its grads land, last chunk first; what backward leaves undone is the lowest chunks'
      // work, which Step() requeues in chunk order. The next forward meets chunk n_persist's
      // update first and the last pending chunk's last: it waits for that one, and the windows
      // from its upload to the end are what the updates cannot hide. The CPU works for
      // T_bwd - T_lead in backward, on the chunks [done, C) whose work fits in that.
      const auto& acc = chunks_->cpu_acc_prefix;
      const auto& upd = chunks_->cpu_opt_prefix;
      auto work_from = [&](int32_t c) {
        return (acc[num_chunks_] - acc[c]) + (upd[num_chunks_] - upd[c]);
      };
      const double budget = t.backward_seconds - t.cpu_backward_lead_seconds;
      int32_t lo = p.n_persist, hi = num_chunks_;  // the first chunk done in backward
      while (lo < hi) {
        const int32_t mid = lo + (hi - lo) / 2;
        if (work_from(mid) <= budget) {
          hi = mid;
        } else {
          lo = mid + 1;
        }
      }
      if (lo > p.n_persist) last_waited = lo - 1;
    }
    t.cpu_forward_tail_seconds = forward_from(first_user(last_waited));
  }
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

}  // namespace memplan
