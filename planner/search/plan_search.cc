#include "planner/search/plan_search.h"

#include <algorithm>
#include <bit>
#include <cstdint>
#include <limits>
#include <optional>
#include <vector>

#include "common/head_chunking.h"
#include "common/status.h"

namespace memplan {
namespace {

// Static raw bytes at the fewest buffers a plan with n_persist = np may have: the fixed count,
// else MinBuffers(np); none when every chunk is persistent.
int64_t StaticAtFewestBuffers(const CostModel& model, const std::optional<int32_t>& fixed_nb,
                              int32_t np) {
  const int32_t c = model.num_chunks();
  if (np >= c) return model.StaticRawBytes(c, 0);
  return model.StaticRawBytes(np, fixed_nb ? *fixed_nb : model.MinBuffers(np));
}

// StaticAtFewestBuffers for n_persist in [0, top].
std::vector<int64_t> StaticProfile(const CostModel& model, const std::optional<int32_t>& fixed_nb,
                                   int32_t top) {
  std::vector<int64_t> values(static_cast<size_t>(std::max(top + 1, 0)));
  for (int32_t np = 0; np <= top; ++np) values[np] = StaticAtFewestBuffers(model, fixed_nb, np);
  return values;
}

// Minima of any range of `values` in O(1) after O(n log n) (a sparse table).
class RangeMin {
 public:
  explicit RangeMin(const std::vector<int64_t>& values) {
    levels_.push_back(values);
    for (size_t w = 1; 2 * w <= values.size(); w *= 2) {
      const std::vector<int64_t>& prev = levels_.back();
      std::vector<int64_t> next(prev.size() - w);
      for (size_t i = 0; i < next.size(); ++i) next[i] = std::min(prev[i], prev[i + w]);
      levels_.push_back(std::move(next));
    }
  }
  // Minimum of values[lo..hi], lo <= hi.
  int64_t Min(int32_t lo, int32_t hi) const {
    const int level = std::bit_width(static_cast<uint32_t>(hi - lo + 1)) - 1;
    return std::min(levels_[level][lo], levels_[level][hi - (1 << level) + 1]);
  }

 private:
  std::vector<std::vector<int64_t>> levels_;
};

// [i] = min(values[i..]); one more entry, the int64 maximum, at the end. Static(np, fewest
// buffers) is usually non-decreasing below np = C (a persistent chunk costs more than the buffer
// it may save), but a chunk much smaller than the shared buffers can save a buffer for less than
// a buffer's bytes: the searches below use these minima to stay exact either way.
std::vector<int64_t> SuffixMinima(const std::vector<int64_t>& values) {
  std::vector<int64_t> minima(values.size() + 1, std::numeric_limits<int64_t>::max());
  for (size_t i = values.size(); i-- > 0;) minima[i] = std::min(minima[i + 1], values[i]);
  return minima;
}

struct Incumbent {
  bool found = false;
  double seconds = std::numeric_limits<double>::infinity();
  int model_index = -1;
  int32_t n_persist = 0;
  int32_t n_buffer = 0;
  ModeCounts counts;
  HostMemoryKind host_memory = HostMemoryKind::kPinned;
};

// Branch-and-bound over one (cost model, host memory kind). The bounds rest on properties the
// cost model guarantees (docs/cost-model.md, "Search"):
//  - with n_swap fixed, time is non-decreasing and activation memory non-increasing in
//    n_checkpoint and in n_hs_offload (arranged modes), host memory non-decreasing in
//    n_hs_offload;
//  - forward/backward time (lower-bound variant) is non-increasing in n_persist and n_buffer,
//    GPU optimizer time non-decreasing and CPU optimizer time non-increasing in n_persist;
//  - persistent, grad-phase and load bytes are non-decreasing and host bytes non-increasing in
//    n_persist.
// Not thread-safe: one Runner per search call, writing into the caller's incumbent.
class Runner {
 public:
  Runner(const CostModel& model, int model_index, HostMemoryKind kind,
         const SearchConstraints& constraints, bool any_fit, Incumbent* best, int64_t* evaluated)
      : model_(model),
        model_index_(model_index),
        kind_(kind),
        any_fit_(any_fit),
        best_(best),
        evaluated_(evaluated) {
    n_ = model.num_blocks();
    c_ = model.num_chunks();
    // Exact bytes plus the calibrated dynamic bytes must fit room_ (CostModel::Peak).
    room_ = model.Room(constraints.capacity_bytes);
    host_limit_ = constraints.host_memory_bytes;
    if (kind == HostMemoryKind::kPinned && constraints.pinned_limit_bytes > 0) {
      host_limit_ = std::min(host_limit_, constraints.pinned_limit_bytes);
    }
    const FixedKnobs& f = constraints.fixed;
    np_lo_ = f.n_persist ? *f.n_persist : 0;
    np_hi_ = f.n_persist ? std::min(*f.n_persist, c_) : c_;
    // The load-time peak without buffers grows with n_persist: keep the largest n_persist whose
    // load fits (the buffers are checked with each plan).
    if (np_hi_ >= np_lo_ && model.LoadRawBytes(np_hi_, 0) > room_) {
      int32_t lo = np_lo_ - 1, hi = np_hi_;  // Load(lo) fits (or lo is below range), Load(hi) not
      while (hi - lo > 1) {
        const int32_t mid = lo + (hi - lo) / 2;
        if (model.LoadRawBytes(mid, 0) <= room_) {
          lo = mid;
        } else {
          hi = mid;
        }
      }
      np_hi_ = lo;
    }
    // The grad phase (all persistent grads alive) also grows with n_persist.
    np_hi_ = std::min(np_hi_, model.MaxPersistForGradPhase(room_, np_hi_));
    fixed_nb_ = f.n_buffer;
    s_lo_ = f.n_swap ? *f.n_swap : 0;
    s_hi_ = f.n_swap ? *f.n_swap : n_;
    h_lo_ = f.n_hs_offload ? *f.n_hs_offload : 0;
    h_hi_ = f.n_hs_offload ? *f.n_hs_offload : n_;
    k_lo_ = f.n_checkpoint ? *f.n_checkpoint : 0;
    k_hi_ = f.n_checkpoint ? *f.n_checkpoint : n_;
    static_profile_ = StaticProfile(model, fixed_nb_, std::min(np_hi_, c_ - 1));
    static_sufmin_ = SuffixMinima(static_profile_);
  }

  // dive: stop after the first leaf whose n_persist range was searched (the most promising
  // one, children visited best bound first): a cheap incumbent for the full runs.
  void Run(bool dive = false) {
    dive_ = dive;
    dived_ = false;
    if (np_hi_ < np_lo_ || np_lo_ > c_) return;
    // Roots (one per n_swap), most promising first so that a good incumbent prunes the rest.
    std::vector<Bound> roots;
    for (int32_t s = s_lo_; s <= std::min(s_hi_, n_); ++s) {
      const Bound root = BoxBound(s, h_lo_, h_hi_, k_lo_, k_hi_);
      if (root.viable) roots.push_back(root);
    }
    if (!any_fit_) {
      std::stable_sort(roots.begin(), roots.end(), [](const Bound& a, const Bound& b) {
        return a.lower_bound < b.lower_bound;
      });
    }
    for (const Bound& root : roots) {
      Box(root);
      if (Done()) return;
    }
  }

  // [Near ties keep the chunks] The incumbent of this runner's model and host kind moved to its
  // plan with every chunk persistent (same block modes) when that plan fits, the knobs allow
  // it, and its predicted time is within kPersistentTieTolerance of the incumbent's. Offloading
  // chunks trades GPU optimizer time for transfers the model takes as hidden behind compute;
  // a predicted gain smaller than the model's error is not worth host memory and PCIe traffic
  // (llama-3.2-1b 4×2048 adamw_bf16, full H200: 47/66 persistent predicted 0.9 ms faster than
  // 66/66 and ran 15 ms slower than the unoffloaded step).
  void PreferPersistentOnNearTie() {
    if (any_fit_ || !best_->found || best_->model_index != model_index_ ||
        best_->host_memory != kind_ || best_->n_persist >= c_ || np_hi_ < c_) {
      return;
    }
    const Incumbent offloaded = *best_;
    best_->seconds = offloaded.seconds * (1 + kPersistentTieTolerance);
    const ModeCounts m = offloaded.counts;
    if (EvalPersist(m, model_.DynamicRawBytes(m), c_) && best_->n_persist == c_) return;
    *best_ = offloaded;
  }

 private:
  // A box of mode counts: n_swap = s, n_hs_offload in [h0, h1], n_checkpoint in [k0, k1].
  struct Bound {
    bool viable = false;
    int32_t s = 0, h0 = 0, h1 = 0, k0 = 0, k1 = 0;
    double lower_bound = 0;
  };

  bool Done() const { return (any_fit_ && best_->found) || (dive_ && dived_); }

  // Fewest static bytes of any plan with n_persist >= np_lo (np = C, where buffers and grad
  // staging vanish, apart from the suffix minima below it).
  int64_t StaticMin(int32_t np_lo) const {
    int64_t best = std::numeric_limits<int64_t>::max();
    if (np_lo >= 0 && np_lo + 1 < static_cast<int32_t>(static_sufmin_.size())) {
      best = static_sufmin_[np_lo];
    }
    if (np_hi_ == c_) best = std::min(best, StaticAt(c_));
    return best;
  }

  // Largest n_persist <= np_hi_ whose static bytes at the fewest buffers fit `budget`, or -1.
  // np = C drops buffers and grad staging, so it is tried apart; below it the suffix minima are
  // non-decreasing in np, and the largest np whose suffix minimum fits is itself a fit.
  int32_t MaxPersistWithBuffers(int64_t budget) const {
    if (np_hi_ == c_ && StaticAt(c_) <= budget) return c_;
    int32_t top = std::min(np_hi_, c_ - 1);
    top = std::min(top, model_.MaxPersistWithin(budget, top));  // necessary condition, cheap
    if (top < 0 || static_sufmin_[0] > budget) return -1;
    int32_t lo = 0;
    while (lo < top) {
      const int32_t mid = lo + (top - lo + 1) / 2;
      if (static_sufmin_[mid] <= budget) {
        lo = mid;
      } else {
        top = mid - 1;
      }
    }
    return lo;
  }

  int64_t StaticAt(int32_t np) const { return StaticAtFewestBuffers(model_, fixed_nb_, np); }

  // Viability and a time lower bound for every plan in the box. Properties used: activation
  // bytes are non-increasing along n_checkpoint and along n_hs_offload (and along the diagonal
  // CKPT -> HS_OFFLOAD), time is non-decreasing along the same moves and along CKPT -> NONE
  // reversed, host bytes are non-decreasing in n_hs_offload.
  Bound BoxBound(int32_t s, int32_t h0, int32_t h1, int32_t k0, int32_t k1) const {
    Bound b;
    const int32_t rest = n_ - s;
    h1 = std::min(h1, rest);
    k1 = std::min(k1, rest);
    if (h0 > h1 || k0 > k1 || h0 + k0 > rest) return b;
    b.s = s;
    b.h0 = h0;
    b.h1 = h1;
    b.k0 = k0;
    b.k1 = k1;
    const int32_t np_lo =
        std::max(np_lo_, model_.MinPersistForHost(host_limit_, ModeCounts{s, h0, k0}));
    if (np_lo > np_hi_) return b;
    const int64_t activation_room = room_ - StaticMin(np_lo);
    // For r recomputed blocks the most memory-saving point of the box puts as many of them in
    // HS_OFFLOAD as allowed; its activation bytes are non-increasing in r.
    auto point = [&](int32_t r) {
      const int32_t h = std::min(h1, r - k0);
      return ModeCounts{s, h, r - h};
    };
    const int32_t r_lo = h0 + k0, r_hi = std::min(h1 + k1, rest);
    const int64_t dyn_min = model_.Scaled(model_.DynamicRawBytes(point(r_hi)));
    if (dyn_min > activation_room) return b;
    const int32_t np_hi = MaxPersistWithBuffers(room_ - dyn_min);
    if (np_hi < np_lo) return b;
    b.viable = true;
    if (any_fit_) return b;
    // Fewest recomputed blocks any fitting point of the box can have.
    int32_t lo = r_lo, hi = r_hi;
    while (lo < hi) {
      const int32_t mid = lo + (hi - lo) / 2;
      if (model_.Scaled(model_.DynamicRawBytes(point(mid))) <= activation_room) {
        hi = mid;
      } else {
        lo = mid + 1;
      }
    }
    // Every fitting point (h, k) has h >= h0 and h + k >= lo; moving its HS_OFFLOAD blocks
    // beyond h0 to CKPT and dropping checkpoints never slows it, so it is no faster than
    // (h0, max(k0, lo - h0)).
    const ModeCounts fastest{s, h0, std::max(k0, lo - h0)};
    b.lower_bound = LowerBound(np_lo, np_hi, fastest, dyn_min);
    return b;
  }

  // A lower bound of the iteration time of every plan with these (or more) mode counts and
  // n_persist in [np_a, np_b] whose scaled step-dynamic bytes are at least `dyn_scaled_lb`.
  // Time never grows with n_persist or n_buffer (docs/cost-model.md, section 6), so the bound
  // takes np_b and the most buffers any such plan can hold: no more than the offloaded chunks at
  // np_b, nor than fit beside the fewest persistent bytes (those of np_a) and the least dynamic
  // bytes. Infinite when even that is fewer than np_b needs (MinBuffers never grows with
  // n_persist, so no plan of the range has enough).
  double LowerBound(int32_t np_a, int32_t np_b, const ModeCounts& m,
                    int64_t dyn_scaled_lb) const {
    int32_t nb = c_ - np_b;
    if (fixed_nb_) {
      nb = *fixed_nb_;
    } else if (np_b < c_) {
      const int64_t room = room_ - dyn_scaled_lb - model_.PersistentRawBytes(np_a);
      const int64_t fit = room < 0 ? 0 : room / std::max<int64_t>(1, model_.SharedBufferBytes());
      nb = static_cast<int32_t>(std::min<int64_t>(nb, fit));
      if (nb < model_.MinBuffers(np_b)) return std::numeric_limits<double>::infinity();
    }
    StepTime t = model_.Time(np_b, nb, m, kind_, /*lower_bound=*/true);
    t.gpu_optimizer_seconds = model_.GpuOptimizerSeconds(np_a);
    return model_.IterationSeconds(t);
  }

  void Box(const Bound& b) {
    if (Done() || !b.viable) return;
    if (!any_fit_ && b.lower_bound >= best_->seconds) return;
    if (b.h0 == b.h1 && b.k0 == b.k1) {
      Leaf(ModeCounts{b.s, b.h0, b.k0});
      return;
    }
    Bound lo, hi;
    if (b.h1 - b.h0 >= b.k1 - b.k0) {
      const int32_t mid = b.h0 + (b.h1 - b.h0) / 2;
      lo = BoxBound(b.s, b.h0, mid, b.k0, b.k1);
      hi = BoxBound(b.s, mid + 1, b.h1, b.k0, b.k1);
    } else {
      const int32_t mid = b.k0 + (b.k1 - b.k0) / 2;
      lo = BoxBound(b.s, b.h0, b.h1, b.k0, mid);
      hi = BoxBound(b.s, b.h0, b.h1, mid + 1, b.k1);
    }
    // Optimising: the child with the smaller bound first. Feasibility: the memory-saving one.
    if (any_fit_ || hi.lower_bound < lo.lower_bound) std::swap(lo, hi);
    Box(lo);
    Box(hi);
  }

  void Leaf(const ModeCounts& m) {
    const int64_t dyn = model_.DynamicRawBytes(m);
    const int32_t np_lo = std::max(np_lo_, model_.MinPersistForHost(host_limit_, m));
    const int32_t np_hi = MaxPersistWithBuffers(room_ - model_.Scaled(dyn));
    if (np_hi < np_lo) return;
    if (any_fit_) {
      // Every other memory term never decreases with n_persist above the host's floor, so a
      // plan is worth trying only where the static bytes at the fewest buffers fall below those
      // of every plan tried before it (they may fall: a persistent chunk can save a buffer, or
      // shrink the sharded grad staging, for less than it costs), and at the last chunk (the
      // grad staging and buffers disappear).
      // With a fixed buffer count, start where that many buffers are enough (MinBuffers is
      // non-increasing in n_persist).
      int32_t start = np_lo;
      if (fixed_nb_ && start < c_ && model_.MinBuffers(start) > *fixed_nb_) {
        int32_t lo = start, hi = c_;  // MinBuffers(c_) == 0
        while (lo < hi) {
          const int32_t mid = lo + (hi - lo) / 2;
          if (model_.MinBuffers(mid) <= *fixed_nb_) {
            hi = mid;
          } else {
            lo = mid + 1;
          }
        }
        start = lo;
      }
      if (start <= np_hi && EvalPersist(m, dyn, start)) return;
      const int32_t profiled = static_cast<int32_t>(static_profile_.size()) - 1;
      if (start >= 0 && start <= std::min(np_hi, profiled)) {
        int64_t lowest = static_profile_[start];
        for (int32_t np = start + 1; np <= std::min(np_hi, profiled); ++np) {
          if (static_profile_[np] >= lowest) continue;
          lowest = static_profile_[np];
          if (EvalPersist(m, dyn, np)) return;
        }
      }
      if (np_hi == c_ && start < c_) EvalPersist(m, dyn, c_);
      return;
    }
    PersistRange(m, dyn, np_lo, np_hi);
    dived_ = true;
  }

  void PersistRange(const ModeCounts& m, int64_t dyn, int32_t a, int32_t b) {
    if (a > b) return;
    // Every plan of the range holds at least the leaf's dynamic bytes and the grad phase of a.
    const int64_t dyn_lb = model_.Scaled(std::max(dyn, model_.GradPhaseRawBytes(a)));
    if (LowerBound(a, b, m, dyn_lb) >= best_->seconds) return;
    if (b - a < 3) {
      for (int32_t np = b; np >= a; --np) EvalPersist(m, dyn, np);
      return;
    }
    // More persistent chunks are usually faster: explore the upper half first.
    const int32_t mid = a + (b - a) / 2;
    PersistRange(m, dyn, mid + 1, b);
    PersistRange(m, dyn, a, mid);
  }

  // Evaluates the plan with `np` persistent chunks and the most buffers that fit (time never
  // grows with buffers). Returns whether it is feasible.
  bool EvalPersist(const ModeCounts& m, int64_t dyn, int32_t np) {
    ++*evaluated_;
    const int64_t budget = room_ - model_.Scaled(model_.StepDynamicRawBytes(GradsFor(m), dyn, np));
    int32_t nb = 0;
    if (np < c_) {
      const int64_t room = budget - model_.StaticRawBytes(np, 0);
      if (room < 0) return false;
      const int64_t fit = room / std::max<int64_t>(1, model_.SharedBufferBytes());
      nb = fixed_nb_ ? *fixed_nb_ : static_cast<int32_t>(std::min<int64_t>(c_ - np, fit));
      if (nb > fit || nb > c_ - np || nb < model_.MinBuffers(np)) return false;
    } else {
      if (fixed_nb_ && *fixed_nb_ != 0) return false;
      if (model_.StaticRawBytes(np, 0) > budget) return false;
    }
    if (model_.HostBytes(np, m) > host_limit_) return false;
    if (model_.LoadRawBytes(np, nb) > room_) return false;
    double seconds = 0;
    if (!any_fit_) {
      seconds = model_.IterationSeconds(model_.Time(np, nb, m, kind_));
      if (!(seconds < best_->seconds)) return true;
    }
    best_->found = true;
    best_->seconds = seconds;
    best_->model_index = model_index_;
    best_->n_persist = np;
    best_->n_buffer = nb;
    best_->counts = m;
    best_->host_memory = kind_;
    return true;
  }

  std::vector<int64_t> static_profile_;  // [np] = StaticAt over [0, min(np_hi_, C - 1)]
  std::vector<int64_t> static_sufmin_;  // [np] = min StaticAt over [np, min(np_hi_, C - 1)]
  // The backward-grads table of the mode counts evaluated last (a leaf evaluates several
  // n_persist at the same counts).
  const CostModel::BackwardGradsByPersist& GradsFor(const ModeCounts& m) {
    if (!grads_ || grads_counts_ != m) {
      grads_ = model_.BackwardGradsTable(m);
      grads_counts_ = m;
    }
    return *grads_;
  }
  std::optional<CostModel::BackwardGradsByPersist> grads_;
  ModeCounts grads_counts_;
  const CostModel& model_;
  const int model_index_;
  const HostMemoryKind kind_;
  const bool any_fit_;
  bool dive_ = false, dived_ = false;
  Incumbent* best_;
  int64_t* evaluated_;
  int32_t n_ = 0, c_ = 0;
  int64_t room_ = 0, host_limit_ = 0;
  int32_t np_lo_ = 0, np_hi_ = 0;
  std::optional<int32_t> fixed_nb_;
  int32_t s_lo_ = 0, s_hi_ = 0, h_lo_ = 0, h_hi_ = 0, k_lo_ = 0, k_hi_ = 0;
};

}  // namespace

namespace {

// Host-memory kinds worth trying: pinned transfers are never slower and need the same bytes, so
// pageable only pays when the pinned limit binds (or the caller fixed it).
std::vector<HostMemoryKind> KindsToTry(const SearchConstraints& c) {
  std::vector<HostMemoryKind> kinds;
  const FixedKnobs& f = c.fixed;
  if (!f.host_memory || *f.host_memory == HostMemoryKind::kPinned) {
    kinds.push_back(HostMemoryKind::kPinned);
  }
  if ((f.host_memory && *f.host_memory == HostMemoryKind::kPageable) ||
      (!f.host_memory && c.pinned_limit_bytes > 0)) {
    kinds.push_back(HostMemoryKind::kPageable);
  }
  return kinds;
}

// [Wide head chunks] FindFastest's plan with head chunks of kPlainHeadChunkLogitBytes instead of
// the default: each chunk adds its [V, H] weight-gradient product into the fp32 sum, so four
// times fewer chunks are faster (the head's forward, [Head chunk sums] in common/head_chunking.h)
// and hold four times the chunk's logits. Only where the head is chunked at that size (else the
// head would run plain, slower and larger) and the plans' head chunk is the default.
std::vector<CostModel> WideHeadModels(const std::vector<CostModel>& models) {
  std::vector<CostModel> wide;
  if (models.empty() || models[0].options().head_chunk_logit_bytes != 0) return wide;
  const Trace& t = models[0].trace();
  if (!HeadIsChunked(t.workload.micro_batch * t.workload.seq_len, t.arch.vocab_size,
                     t.arch.hidden_size, kPlainHeadChunkLogitBytes)) {
    return wide;
  }
  wide.reserve(models.size());
  for (const CostModel& m : models) {
    wide.push_back(m.WithHeadChunkLogitBytes(kPlainHeadChunkLogitBytes));
  }
  return wide;
}

}  // namespace

absl::StatusOr<PlanSearch> PlanSearch::Create(const Trace& trace, const HardwareSpec& hardware,
                                              const CostOptions& options,
                                              const std::vector<int64_t>& chunk_candidates_bytes) {
  std::vector<int64_t> sizes = chunk_candidates_bytes;
  std::sort(sizes.begin(), sizes.end());
  sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());
  if (sizes.empty()) return absl::InvalidArgumentError("no chunk size candidates");
  std::vector<CostModel> models;
  models.reserve(3 * sizes.size());
  for (int64_t size : sizes) {
    CostOptions replicated = options;
    replicated.shard_persistent_state = false;
    replicated.shard_persistent_params = false;
    ASSIGN_OR_RETURN(CostModel model, CostModel::Create(trace, size, hardware, replicated));
    models.push_back(std::move(model));
    // Several ranks: each chunk size also with the persistent chunks' state sharded ([Sharded
    // persistent state]), where the workload allows it (full fine-tuning, not adamw8bit).
    if (CostModel::CanShardPersistentState(trace, options)) {
      CostOptions sharded = options;
      sharded.shard_persistent_state = true;
      sharded.shard_persistent_params = false;
      ASSIGN_OR_RETURN(CostModel shard_model, CostModel::Create(trace, size, hardware, sharded));
      models.push_back(std::move(shard_model));
      // And with the parameters sharded too ([Sharded persistent parameters], ZeRO-3): the
      // search keeps whichever prices faster among the plans that fit.
      sharded.shard_persistent_params = true;
      ASSIGN_OR_RETURN(CostModel zero3_model, CostModel::Create(trace, size, hardware, sharded));
      models.push_back(std::move(zero3_model));
    } else if (CostModel::CanShardPersistentParams(trace, options)) {
      // LoRA and QLoRA: the frozen base's persistent chunks sharded and gathered on use ([Sharded
      // frozen base]); it has no state, the adapters stay replicated.
      CostOptions sharded = options;
      sharded.shard_persistent_state = false;
      sharded.shard_persistent_params = true;
      ASSIGN_OR_RETURN(CostModel base_model, CostModel::Create(trace, size, hardware, sharded));
      models.push_back(std::move(base_model));
    }
  }
  std::vector<CostModel> wide = WideHeadModels(models);
  return PlanSearch(std::move(models), std::move(wide));
}

namespace {

// Whether the fixed knobs allow `model`'s chunk size and persistent-state sharding.
bool Allows(const FixedKnobs& f, const CostModel& model) {
  if (f.chunk_bytes && *f.chunk_bytes != model.chunk_bytes()) return false;
  if (f.shard_persistent_params &&
      *f.shard_persistent_params != model.ShardsPersistentParams()) {
    return false;
  }
  return !f.shard_persistent_state || *f.shard_persistent_state == model.ShardsPersistentState();
}

// Turns the search's best point into a plan and its full prediction.
void FillFromIncumbent(const std::vector<CostModel>& models, const Incumbent& best,
                       SearchResult* result) {
  if (!best.found) return;
  const CostModel& model = models[static_cast<size_t>(best.model_index)];
  result->found = true;
  result->model_index = best.model_index;
  result->plan =
      model.MakeResidencyPlan(best.n_persist, best.n_buffer, best.counts, best.host_memory);
  result->prediction = model.Predict(result->plan);
}

}  // namespace

SearchResult PlanSearch::Run(const SearchConstraints& constraints, bool any_fit) const {
  Incumbent best;
  SearchResult result;
  const FixedKnobs& f = constraints.fixed;
  const std::vector<HostMemoryKind> kinds = KindsToTry(constraints);
  // Optimising: one dive per chunk size and host kind first, so that every full run below is
  // pruned by the best of them (the first chunk size's own first plan can be far from the
  // optimum another chunk size reaches). Ties keep the plan found first (a dive's plan, where it
  // ties with a later one).
  for (const bool dive : any_fit ? std::vector<bool>{false} : std::vector<bool>{true, false}) {
    for (int i = 0; i < num_models(); ++i) {
      const CostModel& model = models_[static_cast<size_t>(i)];
      if (!Allows(f, model)) continue;
      for (HostMemoryKind kind : kinds) {
        Runner runner(model, i, kind, constraints, any_fit, &best, &result.plans_evaluated);
        runner.Run(dive);
        if (any_fit && best.found) break;
      }
      if (any_fit && best.found) break;
    }
  }
  if (!any_fit && best.found) {
    const CostModel& model = models_[static_cast<size_t>(best.model_index)];
    Runner(model, best.model_index, best.host_memory, constraints, any_fit, &best,
           &result.plans_evaluated)
        .PreferPersistentOnNearTie();
  }
  FillFromIncumbent(models_, best, &result);
  return result;
}

SearchResult PlanSearch::FindLeanest(const SearchConstraints& constraints) const {
  SearchResult result;
  const FixedKnobs& f = constraints.fixed;
  int64_t best_required = std::numeric_limits<int64_t>::max();
  Incumbent best;
  for (int i = 0; i < num_models(); ++i) {
    const CostModel& model = models_[static_cast<size_t>(i)];
    if (!Allows(f, model)) continue;
    const int32_t n = model.num_blocks(), c = model.num_chunks();
    const int32_t np_min = f.n_persist ? *f.n_persist : 0;
    const int32_t np_max = f.n_persist ? std::min(*f.n_persist, c) : c;
    if (np_min > np_max) continue;
    const std::vector<int64_t> statics = StaticProfile(model, f.n_buffer, c);
    auto static_at = [&](int32_t np) { return statics[std::min(np, c)]; };
    // Required bytes with np persistent chunks and the fewest buffers; -1 when not allowed.
    auto required = [&](int32_t np, const CostModel::BackwardGradsByPersist& grads,
                        int64_t dyn) -> int64_t {
      if (np < np_min || np > np_max) return -1;
      const int32_t nb = np >= c ? 0 : (f.n_buffer ? *f.n_buffer : model.MinBuffers(np));
      if (np < c && (nb < model.MinBuffers(np) || nb > c - np)) return -1;
      if (np >= c && f.n_buffer && *f.n_buffer != 0) return -1;
      return std::max(model.Peak(static_at(np), model.StepDynamicRawBytes(grads, dyn, np)),
                      model.Peak(model.LoadRawBytes(np, nb), 0));
    };
    // With a fixed buffer count, the first n_persist at which that many buffers suffice.
    auto first_allowed = [&](int32_t np) {
      if (!f.n_buffer || np >= c || model.MinBuffers(np) <= *f.n_buffer) return np;
      int32_t lo = np, hi = c;
      while (lo < hi) {
        const int32_t mid = lo + (hi - lo) / 2;
        if (model.MinBuffers(mid) <= *f.n_buffer) {
          hi = mid;
        } else {
          lo = mid + 1;
        }
      }
      return lo;
    };
    // Static bytes rise with n_persist except where a persistent chunk saves a buffer worth more
    // than itself ("drops") and at np = C. Since the grad phase only grows with n_persist, the
    // leanest n_persist of a range is its first one, a drop, or C; suffix minima bound the rest.
    const std::vector<int64_t> static_sufmin = SuffixMinima(statics);
    std::vector<int32_t> drops;
    for (int32_t np = 1; np < c; ++np) {
      if (statics[np] < statics[np - 1]) drops.push_back(np);
    }
    std::vector<int64_t> drop_statics;
    drop_statics.reserve(drops.size());
    for (int32_t np : drops) drop_statics.push_back(statics[np]);
    const RangeMin drop_min(drop_statics);
    for (HostMemoryKind kind : KindsToTry(constraints)) {
      int64_t host_limit = constraints.host_memory_bytes;
      if (kind == HostMemoryKind::kPinned && constraints.pinned_limit_bytes > 0) {
        host_limit = std::min(host_limit, constraints.pinned_limit_bytes);
      }
      const int32_t s_lo = f.n_swap ? *f.n_swap : 0, s_hi = f.n_swap ? *f.n_swap : n;
      const int32_t h_lo = f.n_hs_offload ? *f.n_hs_offload : 0;
      const int32_t h_hi = f.n_hs_offload ? *f.n_hs_offload : n;
      const int32_t k_lo = f.n_checkpoint ? *f.n_checkpoint : 0;
      const int32_t k_hi = f.n_checkpoint ? *f.n_checkpoint : n;
      for (int32_t s = s_lo; s <= std::min(s_hi, n); ++s) {
        const int32_t rest = n - s;
        if (h_lo + k_lo > rest) continue;
        // Host bytes grow with n_hs_offload, so the smallest allowed n_persist over this s is
        // the one at the fewest HS_OFFLOAD blocks.
        const int32_t np_floor = std::max(
            np_min, first_allowed(std::max(
                        np_min, model.MinPersistForHost(host_limit, ModeCounts{s, h_lo, k_lo}))));
        if (np_floor > np_max) continue;
        const int64_t static_floor = static_sufmin[np_floor];
        const int64_t load_floor = model.Peak(model.LoadRawBytes(np_floor, 0), 0);
        // Activation bytes fall as n_hs_offload rises along n_hs_offload + n_checkpoint = max,
        // while host bytes (and so the smallest n_persist) rise: walk down from the most
        // offloaded point and stop once no smaller n_hs_offload can beat the best.
        for (int32_t h = std::min(h_hi, rest); h >= h_lo; --h) {
          const int32_t k = std::min(k_hi, rest - h);
          if (k < k_lo) continue;
          const ModeCounts m{s, h, k};
          const int64_t dyn = model.DynamicRawBytes(m);
          // The same bound without the blocks' backward phases first (a table costs O(blocks)).
          if (std::max(model.Peak(static_floor,
                                  std::max(dyn, model.GradPhaseRawBytes(np_floor))),
                       load_floor) >= best_required) {
            break;
          }
          const CostModel::BackwardGradsByPersist grads = model.BackwardGradsTable(m);
          const int64_t bound = std::max(
              model.Peak(static_floor, model.StepDynamicRawBytes(grads, dyn, np_floor)), load_floor);
          if (bound >= best_required) break;
          result.plans_evaluated += 2;
          const int32_t np_lo =
              first_allowed(std::max(np_min, model.MinPersistForHost(host_limit, m)));
          // The host cannot hold this point's activations at any n_persist (MinPersistForHost
          // says C + 1): no candidate, C included. Fewer HS_OFFLOAD blocks may still fit.
          if (np_lo > np_max) continue;
          // Candidates: np_lo, the drops after it up to np_max, and C: index 0, 1..k, k + 1.
          const int32_t d0 = static_cast<int32_t>(
              std::upper_bound(drops.begin(), drops.end(), np_lo) - drops.begin());
          const int32_t d1 = static_cast<int32_t>(
              std::upper_bound(drops.begin(), drops.end(), np_max) - drops.begin());
          const int32_t nd = std::max(0, d1 - d0);
          auto np_of = [&](int32_t x) { return x == 0 ? np_lo : x <= nd ? drops[d0 + x - 1] : c; };
          auto consider = [&](int32_t np) {
            const int64_t r = required(np, grads, dyn);
            if (r < 0 || r >= best_required) return;
            best_required = r;
            best.found = true;
            best.model_index = i;
            best.n_persist = np;
            best.n_buffer = np >= c ? 0 : (f.n_buffer ? *f.n_buffer : model.MinBuffers(np));
            best.counts = m;
            best.host_memory = kind;
          };
          // Candidates [a, b] need at least their smallest static bytes next to the dynamic bytes
          // of the first (non-decreasing in n_persist): ranges that cannot beat the best are
          // dropped whole (a model whose persistent chunks cost less than the buffers they free,
          // as sharded ones do, has a drop at nearly every n_persist).
          auto scan = [&](auto&& self, int32_t a, int32_t b) -> void {
            if (a > b) return;
            int64_t smin = std::numeric_limits<int64_t>::max();
            if (a == 0) smin = static_at(np_lo);
            if (b == nd + 1) smin = std::min(smin, static_at(c));
            const int32_t da = std::max(a, 1), db = std::min(b, nd);
            if (da <= db) smin = std::min(smin, drop_min.Min(d0 + da - 1, d0 + db - 1));
            if (model.Peak(smin, model.StepDynamicRawBytes(grads, dyn, np_of(a))) >=
                best_required) {
              return;
            }
            if (b - a < 4) {
              for (int32_t x = a; x <= b; ++x) consider(np_of(x));
              return;
            }
            const int32_t mid = a + (b - a) / 2;
            self(self, a, mid);
            self(self, mid + 1, b);
          };
          scan(scan, 0, nd + 1);
        }
      }
    }
  }
  FillFromIncumbent(models_, best, &result);
  return result;
}

absl::StatusOr<PlanSearch> PlanSearch::ForTrace(const Trace& trace, bool build_time_tables) const {
  std::vector<CostModel> models;
  models.reserve(models_.size());
  for (const CostModel& m : models_) {
    ASSIGN_OR_RETURN(CostModel model, m.ForTrace(trace, build_time_tables));
    models.push_back(std::move(model));
  }
  // Memory-only probes (FindAnyFit, FindLeanest) keep the default head chunk.
  std::vector<CostModel> wide =
      build_time_tables ? WideHeadModels(models) : std::vector<CostModel>{};
  return PlanSearch(std::move(models), std::move(wide));
}

SearchResult PlanSearch::FindFastest(const SearchConstraints& constraints) const {
  SearchResult result = Run(constraints, /*any_fit=*/false);
  // [Wide head chunks]: the head alone changes, so the plan keeps its host bytes; it is kept when
  // its GPU peaks still fit, and it is then faster.
  if (!result.found || constraints.fixed.head_chunk_logit_bytes || wide_models_.empty()) {
    return result;
  }
  const CostModel& wide = wide_models_[static_cast<size_t>(result.model_index)];
  ResidencyPlan plan = result.plan;
  plan.head_chunk_logit_bytes = wide.options().head_chunk_logit_bytes;
  const Prediction p = wide.Predict(plan);
  if (std::max(p.peak_bytes, p.load_peak_bytes) <= constraints.capacity_bytes &&
      p.iteration_seconds < result.prediction.iteration_seconds) {
    result.plan = std::move(plan);
    result.prediction = p;
  }
  return result;
}

SearchResult PlanSearch::FindAnyFit(const SearchConstraints& constraints) const {
  return Run(constraints, /*any_fit=*/true);
}

}  // namespace memplan
