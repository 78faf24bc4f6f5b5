#include "planner/core/osft_plan.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status.h"
#include "common/validate.h"
#include "planner/cost/analytic_trace.h"
#include "planner/cost/osft_price.h"

namespace memplan {
namespace {

constexpr int64_t kMiB = int64_t{1} << 20;

std::string GiB(int64_t bytes) {
  return absl::StrFormat("%.2f GiB", static_cast<double>(bytes) / (1 << 30));
}

int64_t RequiredBytes(const Prediction& p) { return std::max(p.peak_bytes, p.load_peak_bytes); }

// [OSFT plans] The agent refuses chunk knobs with OSFT (--plan-file, --chunk-mib, --n-persist,
// --n-buffer: agent/train/train_config.cc) and shards nothing: only block modes are plannable.
absl::Status CheckOsftKnobs(const PlanInputs& in) {
  const FixedKnobs& f = in.fixed;
  const char* field = f.chunk_bytes               ? "fixed.chunk_bytes"
                      : f.n_persist               ? "fixed.n_persist"
                      : f.n_buffer                ? "fixed.n_buffer"
                      : f.host_memory             ? "fixed.host_memory"
                      : f.shard_persistent_state  ? "fixed.shard_persistent_state"
                      : f.shard_persistent_params ? "fixed.shard_persistent_params"
                      : f.head_chunk_logit_bytes  ? "fixed.head_chunk_logit_bytes"
                                                  : nullptr;
  if (field != nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        field,
        " does not apply to an OSFT run: the agent runs OSFT unmanaged (every parameter "
        "on the device, replicated over ranks, no chunks); only fixed.n_checkpoint, "
        "fixed.n_swap and fixed.n_hs_offload can be fixed"));
  }
  if (in.profiled_trace) {
    return absl::InvalidArgumentError(
        "profiled_trace: an OSFT run is planned from the architecture (the profiler measures a "
        "full fine-tune)");
  }
  return absl::OkStatus();
}

// The mode counts the fixed knobs allow, arranged as the cost model's ModeCounts.
std::vector<ModeCounts> ModeSpace(int32_t n, const FixedKnobs& f) {
  std::vector<ModeCounts> out;
  for (int32_t s = 0; s <= n; ++s) {
    if (f.n_swap && *f.n_swap != s) continue;
    for (int32_t hs = 0; s + hs <= n; ++hs) {
      if (f.n_hs_offload && *f.n_hs_offload != hs) continue;
      for (int32_t c = 0; s + hs + c <= n; ++c) {
        if (f.n_checkpoint && *f.n_checkpoint != c) continue;
        out.push_back(ModeCounts{s, hs, c});
      }
    }
  }
  return out;
}

struct Found {
  bool found = false;
  ModeCounts counts;
  Prediction prediction;
};

struct OsftSearch {
  Found fastest;  // fits the device and the host
  Found leanest;  // fits the host
  int64_t evaluated = 0;
};

bool HostFits(const Prediction& p, const PlanInputs& in, int64_t host_bytes_per_rank) {
  if (p.host_pinned_bytes + p.host_pageable_bytes > host_bytes_per_rank) return false;
  return in.hardware.pinned_limit_bytes <= 0 ||
         p.host_pinned_bytes <= in.hardware.pinned_limit_bytes;
}

OsftSearch Search(const OsftPricer& pricer, const std::vector<ModeCounts>& space,
                  const PlanInputs& in, int64_t capacity, int64_t host_bytes_per_rank) {
  OsftSearch s;
  for (const ModeCounts& counts : space) {
    const Prediction p = pricer.Predict(counts);
    ++s.evaluated;
    if (!HostFits(p, in, host_bytes_per_rank)) continue;
    const int64_t need = RequiredBytes(p);
    if (!s.leanest.found || need < RequiredBytes(s.leanest.prediction) ||
        (need == RequiredBytes(s.leanest.prediction) &&
         p.iteration_seconds < s.leanest.prediction.iteration_seconds)) {
      s.leanest = Found{true, counts, p};
    }
    if (need <= capacity &&
        (!s.fastest.found || p.iteration_seconds < s.fastest.prediction.iteration_seconds)) {
      s.fastest = Found{true, counts, p};
    }
  }
  return s;
}

std::string DescribeOsftPlan(const ResidencyPlan& p) {
  return absl::StrCat(
      "OSFT unmanaged (every parameter on the device",
      p.world_size > 1 ? absl::StrCat(" of each of ", p.world_size, " ranks") : std::string(),
      ", no chunks), ", p.n_checkpoint, " checkpointed, ", p.n_swap, " swapped, ", p.n_hs_offload,
      " hidden-state offloaded");
}

std::string DescribeState(const OsftCost& c) {
  return absl::StrCat("model states ", GiB(c.model_state_bytes), " (", GiB(c.frozen_bytes),
                      " frozen factors and parameters, ", GiB(c.trainable_bytes),
                      " trainable low factors, ", GiB(c.grad_bytes), " their gradients, ",
                      GiB(c.optimizer_state_bytes), " optimizer state)");
}

// Smallest card (1 MiB granularity) whose usable bytes cover `required`.
int64_t SmallestCard(int64_t required, double margin) {
  auto usable = [margin](int64_t g) {
    return static_cast<int64_t>(std::floor(static_cast<double>(g) * (1.0 - margin)));
  };
  int64_t g = static_cast<int64_t>(std::ceil(static_cast<double>(required) / (1.0 - margin)));
  while (usable(g) < required) ++g;
  g = (g + kMiB - 1) / kMiB * kMiB;
  return g <= kMaxGpuMemoryBytes ? g : 0;
}

absl::StatusOr<OsftPricer> PricerFor(const PlanInputs& in, const OsftPlanContext& context,
                                     const Workload& workload, Trace* trace_out) {
  ASSIGN_OR_RETURN(Trace trace,
                   SynthesizeTrace(in.arch, workload, in.param_dtype, in.training, in.hardware));
  ASSIGN_OR_RETURN(OsftPricer pricer, OsftPricer::Create(trace, in.hardware, context.cost_options));
  if (trace_out != nullptr) *trace_out = std::move(trace);
  return pricer;
}

// The limits' plans: every block in one mode (or none), the leanest of which is the leanest plan
// in practice; with fixed counts, every plan they allow.
std::vector<ModeCounts> LimitSpace(int32_t n, const FixedKnobs& f) {
  if (f.n_swap || f.n_hs_offload || f.n_checkpoint) return ModeSpace(n, f);
  return {ModeCounts{}, ModeCounts{n, 0, 0}, ModeCounts{0, n, 0}, ModeCounts{0, 0, n}};
}

// Whether some plan fits `workload`.
absl::StatusOr<bool> FitsAt(const PlanInputs& in, const OsftPlanContext& context,
                            const Workload& workload) {
  ASSIGN_OR_RETURN(const OsftPricer pricer, PricerFor(in, context, workload, nullptr));
  const OsftSearch s = Search(pricer, LimitSpace(pricer.num_blocks(), in.fixed), in,
                              context.capacity_bytes, context.host_bytes_per_rank);
  return s.fastest.found;
}

// The largest value of one workload dimension (`seq` or the micro-batch) in [1, cap] at which a
// plan fits, by bisection (required bytes grow with it); 0 when none.
absl::StatusOr<int64_t> MaxDimension(const PlanInputs& in, const OsftPlanContext& context, bool seq,
                                     int64_t cap) {
  Workload w = in.workload;
  auto set = [&w, seq](int64_t v) { (seq ? w.seq_len : w.micro_batch) = v; };
  int64_t lo = 0, hi = cap + 1;  // lo fits (or 0), hi does not (or beyond the cap)
  while (hi - lo > 1) {
    const int64_t mid = lo + (hi - lo) / 2;
    set(mid);
    ASSIGN_OR_RETURN(const bool fits, FitsAt(in, context, w));
    (fits ? lo : hi) = mid;
  }
  return lo;
}

}  // namespace

absl::StatusOr<PlanOutcome> MakeOsftPlan(const PlanInputs& in, const OsftPlanContext& context) {
  RETURN_IF_ERROR(CheckOsftKnobs(in));
  Trace trace;
  ASSIGN_OR_RETURN(const OsftPricer pricer, PricerFor(in, context, in.workload, &trace));
  const std::vector<ModeCounts> space = ModeSpace(pricer.num_blocks(), in.fixed);
  const OsftSearch s =
      Search(pricer, space, in, context.capacity_bytes, context.host_bytes_per_rank);

  PlanOutcome out;
  out.capacity_bytes = context.capacity_bytes;
  out.plans_evaluated = s.evaluated;
  out.trace_used = trace;
  const int64_t min_gpu =
      s.leanest.found ? SmallestCard(RequiredBytes(s.leanest.prediction), in.safety_margin) : 0;
  if (s.fastest.found) {
    out.fits = true;
    out.plan = pricer.MakePlan(s.fastest.counts);
    out.prediction = s.fastest.prediction;
    out.reason = absl::StrCat(
        "fits: predicted peak ", GiB(out.prediction.peak_bytes), " of ", context.usable_text,
        ", load-time peak ", GiB(out.prediction.load_peak_bytes), " (the SVD split); ",
        DescribeOsftPlan(out.plan), "; ", DescribeState(pricer.cost()), "; ",
        absl::StrFormat("%.3f s/step, %.0f tokens/s per GPU", out.prediction.iteration_seconds,
                        out.prediction.tokens_per_second));
  } else if (s.leanest.found) {
    out.plan = pricer.MakePlan(s.leanest.counts);
    out.prediction = s.leanest.prediction;
    out.reason = absl::StrCat(
        "does not fit: the leanest OSFT plan needs ", GiB(RequiredBytes(out.prediction)),
        " of GPU memory (", DescribeOsftPlan(out.plan), "; peak ", GiB(out.prediction.peak_bytes),
        ", load-time peak ", GiB(out.prediction.load_peak_bytes), "; ",
        DescribeState(pricer.cost()), ") but only ", context.usable_text,
        " is available; OSFT runs unmanaged, so no chunk can be offloaded; smallest card that "
        "fits: ",
        min_gpu > 0 ? GiB(min_gpu) : std::string("none"));
  } else {
    // Every plan offloads more activations than the host holds: show the plan without offload.
    const ModeCounts none = space.empty() ? ModeCounts{} : space.front();
    out.plan = pricer.MakePlan(none);
    out.prediction = pricer.Predict(none);
    out.reason = absl::StrCat(
        "does not fit: host memory; no OSFT plan keeps its offloaded "
        "activations within ",
        context.host_limit_text);
  }
  if (!in.skip_limits) {
    out.min_gpu_memory_bytes = min_gpu;
    const int64_t tokens_cap = int64_t{1} << 28;  // ValidateWorkload's bound on B x S
    const int64_t batch_cap = std::min<int64_t>(kMaxMicroBatch, tokens_cap / in.workload.seq_len);
    int64_t seq_cap = std::min<int64_t>(kMaxSeqLen, tokens_cap / in.workload.micro_batch);
    if (in.arch.max_position_embeddings > 0) {
      seq_cap = std::min(seq_cap, std::max(in.arch.max_position_embeddings, in.workload.seq_len));
    }
    ASSIGN_OR_RETURN(out.max_micro_batch, MaxDimension(in, context, false, batch_cap));
    ASSIGN_OR_RETURN(out.max_seq_len, MaxDimension(in, context, true, seq_cap));
  }
  return out;
}

absl::StatusOr<Prediction> PredictOsftPlan(const PlanInputs& in, const OsftPlanContext& context,
                                           const ResidencyPlan& plan) {
  RETURN_IF_ERROR(CheckOsftKnobs(in));
  if (plan.chunk_bytes != 0 || plan.n_chunks != 0 || plan.n_persist != 0 || plan.n_buffer != 0) {
    return absl::InvalidArgumentError(
        "plan: an OSFT plan has no chunks (chunk_bytes, n_chunks, n_persist and n_buffer 0)");
  }
  ASSIGN_OR_RETURN(const OsftPricer pricer, PricerFor(in, context, in.workload, nullptr));
  const int32_t n = pricer.num_blocks();
  for (auto [name, v] : {std::pair<const char*, int32_t>{"plan.n_swap", plan.n_swap},
                         {"plan.n_checkpoint", plan.n_checkpoint},
                         {"plan.n_hs_offload", plan.n_hs_offload}}) {
    if (v < 0 || v > n) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, " = ", v, " is out of range; allowed [0, ", n, "]"));
    }
  }
  const ModeCounts counts{plan.n_swap, plan.n_hs_offload, plan.n_checkpoint};
  if (counts.total() > n) {
    return absl::InvalidArgumentError(
        absl::StrCat("plan.n_swap + plan.n_checkpoint + plan.n_hs_offload = ", counts.total(),
                     " exceeds the number of blocks (", n, ")"));
  }
  if (!plan.block_modes.empty() && plan.block_modes != ArrangeBlockModes(n, counts)) {
    return absl::InvalidArgumentError(
        "plan.block_modes: an OSFT plan's modes are arranged (swap, hidden-state offload, "
        "checkpoint, then none, from block 0)");
  }
  return pricer.Predict(counts);
}

}  // namespace memplan
