#include "planner/core/plan_engine.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/fixed_knobs.h"
#include "common/host_reserve.h"
#include "common/safety_margin.h"
#include "common/status.h"
#include "common/validate.h"
#include "planner/cost/analytic_trace.h"
#include "planner/cost/chunk_layout.h"
#include "planner/core/osft_plan.h"
#include "planner/cost/cost_model.h"
#include "planner/search/plan_search.h"

namespace memplan {
namespace {

constexpr int64_t kMiB = int64_t{1} << 20;
// Per-field bound on a trace's bytes and on the whole trace's byte total: keeps every int64 sum
// of the cost model far from overflow.
constexpr int64_t kMaxTraceBytesField = int64_t{1} << 50;
constexpr double kMaxTraceTotalBytes = 72057594037927936.0;  // 2^56
// A block's step time: far above any real one, far below what overflows a sum.
constexpr double kMaxTraceSeconds = 1e7;

std::string GiB(int64_t bytes) {
  return absl::StrFormat("%.1f GiB", static_cast<double>(bytes) / static_cast<double>(1 << 30));
}

absl::Status Invalid(const std::string& msg) { return absl::InvalidArgumentError(msg); }

absl::Status OutOfRange(const std::string& field, int64_t value, int64_t lo, int64_t hi) {
  return Invalid(
      absl::StrCat(field, " = ", value, " is out of range; allowed [", lo, ", ", hi, "]"));
}

CostOptions MakeCostOptions(const PlanInputs& in, bool time_tables) {
  CostOptions o;
  o.optimizer = in.optimizer;
  o.world_size = in.workload.world_size;
  o.local_world_size = LocalRanks(in.workload);
  o.grad_accum = in.workload.grad_accum;
  o.cpu_optimizer_overlaps = !in.workload.grad_clipping;
  o.fragmentation_factor = in.fragmentation_factor;
  o.residual_bytes = in.residual_bytes;
  o.time_factor = in.time_factor > 0 ? in.time_factor : 1.0;
  o.build_time_tables = time_tables;
  o.head_chunk_logit_bytes = in.fixed.head_chunk_logit_bytes.value_or(0);
  return o;
}

// [Host reserve] (common/host_reserve.h) the OS, the page cache and every local rank's runtime.
int64_t HostReserveBytes(const PlanInputs& in) {
  return ::memplan::HostReserveBytes(in.hardware.host_memory_bytes, LocalRanks(in.workload));
}

// The host memory one rank may use: the node's RAM less the reserve, shared evenly by its local
// ranks (every rank of a sharded plan allocates the same bytes: shards are padded to one size).
int64_t HostBytesPerRank(const PlanInputs& in) {
  return PlanHostBytes(in.hardware.host_memory_bytes, LocalRanks(in.workload)) /
         LocalRanks(in.workload);
}

// "X GiB of RAM per GPU (of N GiB, the rest held back for the system)", naming the node's RAM.
std::string HostLimitText(const PlanInputs& in) {
  const int32_t local = LocalRanks(in.workload);
  const std::string held = absl::StrCat(GiB(HostReserveBytes(in)), " held back for the system");
  if (local == 1) {
    return absl::StrCat(GiB(HostBytesPerRank(in)), " of RAM per GPU (",
                        GiB(in.hardware.host_memory_bytes), ", ", held, ")");
  }
  return absl::StrCat(GiB(HostBytesPerRank(in)), " of RAM per rank (",
                      GiB(in.hardware.host_memory_bytes), " shared by ", local, " local ranks, ",
                      held, ")");
}

int64_t UsableBytes(int64_t gpu_memory_bytes, double margin) {
  return static_cast<int64_t>(std::floor(static_cast<double>(gpu_memory_bytes) * (1.0 - margin)));
}

absl::Status ValidateInputs(const PlanInputs& in) {
  RETURN_IF_ERROR(ValidateModelSpec(in.arch, "arch."));
  RETURN_IF_ERROR(ValidateHardwareSpec(in.hardware, "hardware."));
  RETURN_IF_ERROR(ValidateWorkload(in.workload, "workload."));
  RETURN_IF_ERROR(ValidateTrainingMethod(in.training, in.arch, "training."));
  RETURN_IF_ERROR(ValidateImagesForModel(in.arch, in.workload, "arch.", "workload."));
  RETURN_IF_ERROR(CheckSafetyMargin("safety_margin", in.safety_margin));
  if (in.max_alternatives < 0 || in.max_alternatives > kMaxAlternatives) {
    return OutOfRange("max_alternatives", in.max_alternatives, 0, kMaxAlternatives);
  }
  if (!(in.fragmentation_factor >= 0.25 && in.fragmentation_factor <= 4.0)) {
    return Invalid(absl::StrCat("fragmentation_factor = ", in.fragmentation_factor,
                                " is out of range; allowed [0.25, 4]"));
  }
  if (in.residual_bytes < -in.hardware.gpu_memory_bytes ||
      in.residual_bytes > in.hardware.gpu_memory_bytes) {
    return OutOfRange("residual_bytes", in.residual_bytes, -in.hardware.gpu_memory_bytes,
                      in.hardware.gpu_memory_bytes);
  }
  if (in.workload.world_size > 1 && (in.hardware.nccl_allgather_bytes_per_second <= 0 ||
                                     in.hardware.nccl_reduce_scatter_bytes_per_second <= 0)) {
    return Invalid(absl::StrCat("workload.world_size = ", in.workload.world_size,
                                " needs hardware.nccl_allgather_bytes_per_second and "
                                "hardware.nccl_reduce_scatter_bytes_per_second > 0"));
  }
  if (in.profiled_trace) RETURN_IF_ERROR(ValidateTrace(*in.profiled_trace, "profiled_trace."));
  const FixedKnobs& f = in.fixed;
  if (f.chunk_bytes && (*f.chunk_bytes < kMinChunkBytes || *f.chunk_bytes > kMaxChunkBytes)) {
    return OutOfRange("fixed.chunk_bytes", *f.chunk_bytes, kMinChunkBytes, kMaxChunkBytes);
  }
  if (f.head_chunk_logit_bytes) {
    RETURN_IF_ERROR(
        CheckHeadChunkLogitBytes("fixed.head_chunk_logit_bytes", *f.head_chunk_logit_bytes));
  }
  if (f.shard_persistent_state && *f.shard_persistent_state) {
    // [Sharded persistent state] shards over ranks, and only full fine-tuning's state.
    if (in.workload.world_size <= 1) {
      return Invalid(absl::StrCat(
          "fixed.shard_persistent_state = true needs workload.world_size > 1 (got ",
          in.workload.world_size, "): one rank has nothing to shard the optimizer state over"));
    }
    if (in.training.kind != TrainingKind::kFull || in.optimizer == OptimizerKind::kAdamW8bit) {
      return Invalid(
          "fixed.shard_persistent_state = true needs full fine-tuning with adamw, adamw_bf16 or "
          "sgd (LoRA adapters are not sharded; adamw8bit's 256-element blocks would straddle "
          "shards)");
    }
  }
  if (f.shard_persistent_params && *f.shard_persistent_params) {
    // [Sharded persistent parameters] go with the sharded state; LoRA and QLoRA shard the frozen
    // base's persistent chunks, which have no state ([Sharded frozen base]).
    if (in.workload.world_size <= 1) {
      return Invalid(absl::StrCat(
          "fixed.shard_persistent_params = true needs workload.world_size > 1 (got ",
          in.workload.world_size, "): one rank has nothing to shard the parameters over"));
    }
    if (in.training.kind == TrainingKind::kFull) {
      if (f.shard_persistent_state && !*f.shard_persistent_state) {
        return Invalid(
            "fixed.shard_persistent_params = true needs the state sharded too (fixed."
            "shard_persistent_state = false was given)");
      }
      if (in.optimizer == OptimizerKind::kAdamW8bit) {
        return Invalid(
            "fixed.shard_persistent_params = true needs full fine-tuning with adamw, adamw_bf16 "
            "or sgd, or LoRA / QLoRA (adamw8bit's 256-element blocks would straddle shards)");
      }
    }
  }
  const int64_t n = in.profiled_trace ? static_cast<int64_t>(in.profiled_trace->blocks.size())
                                      : in.arch.num_layers;
  int64_t mode_sum = 0;
  for (auto [name, v] : {std::pair<const char*, std::optional<int32_t>>{"fixed.n_swap", f.n_swap},
                         {"fixed.n_checkpoint", f.n_checkpoint},
                         {"fixed.n_hs_offload", f.n_hs_offload}}) {
    if (!v) continue;
    if (*v < 0 || *v > n) return OutOfRange(name, *v, 0, n);
    mode_sum += *v;
  }
  if (mode_sum > n) {
    return Invalid(
        absl::StrCat("fixed.n_swap + fixed.n_checkpoint + fixed.n_hs_offload = ", mode_sum,
                     " is out of range; allowed [0, ", n, "] (the number of blocks)"));
  }
  return absl::OkStatus();
}

// Rejects traces whose byte figures the cost model cannot sum safely in int64.
absl::Status CheckMagnitude(const Trace& t) {
  double total = 0;
  for (const BlockTrace& b : t.blocks) {
    total += static_cast<double>(b.param_bytes) + static_cast<double>(b.input_bytes) +
             static_cast<double>(b.saved_bytes) + static_cast<double>(b.forward_transient_bytes) +
             static_cast<double>(b.backward_transient_bytes);
  }
  for (const EdgeTrace* e : {&t.embedding, &t.head}) {
    total += static_cast<double>(e->param_bytes) + static_cast<double>(e->saved_bytes) +
             static_cast<double>(e->forward_transient_bytes) +
             static_cast<double>(e->backward_transient_bytes);
  }
  if (!(total <= kMaxTraceTotalBytes)) {
    return Invalid(
        absl::StrCat("workload: the model's parameters and activations add up to ", total,
                     " bytes, beyond what the planner models (2^56); reduce workload.micro_batch * "
                     "workload.seq_len or the model size"));
  }
  return absl::OkStatus();
}

// The trace at `workload`: re-synthesised from the architecture, or a profiled trace scaled
// linearly in tokens.
absl::StatusOr<Trace> TraceFor(const PlanInputs& in, const Workload& workload) {
  if (in.profiled_trace) {
    const Trace& t = *in.profiled_trace;
    if (t.workload.micro_batch == workload.micro_batch && t.workload.seq_len == workload.seq_len &&
        t.workload.images_per_sample == workload.images_per_sample &&
        t.workload.image_height == workload.image_height &&
        t.workload.image_width == workload.image_width &&
        t.workload.vision_checkpoint == workload.vision_checkpoint) {
      Trace out = t;
      out.workload.world_size = workload.world_size;
      out.workload.grad_accum = workload.grad_accum;
      RETURN_IF_ERROR(CheckMagnitude(out));
      return out;
    }
    Trace scaled = ScaleTraceToWorkload(t, workload);
    RETURN_IF_ERROR(CheckMagnitude(scaled));
    return scaled;
  }
  ASSIGN_OR_RETURN(Trace trace,
                   SynthesizeTrace(in.arch, workload, in.param_dtype, in.training, in.hardware));
  RETURN_IF_ERROR(CheckMagnitude(trace));
  return trace;
}

// Range checks that need the chunk layout (n_persist / n_buffer against the chunk count).
absl::Status ValidateFixedAgainstLayout(const FixedKnobs& f, const PlanSearch& search) {
  int32_t max_chunks = 0;
  for (int i = 0; i < search.num_models(); ++i) {
    max_chunks = std::max(max_chunks, search.model(i).num_chunks());
  }
  if (f.n_persist && (*f.n_persist < 0 || *f.n_persist > max_chunks)) {
    return OutOfRange("fixed.n_persist", *f.n_persist, 0, max_chunks);
  }
  if (f.n_buffer && (*f.n_buffer < 0 || *f.n_buffer > max_chunks)) {
    return OutOfRange("fixed.n_buffer", *f.n_buffer, 0, max_chunks);
  }
  return absl::OkStatus();
}

// [Fixed knob conflicts] Fixed knobs that no GPU size can honour on `model`'s layout, named with
// the reason; empty when none. The same rules the search applies to every plan (plan_search.cc,
// EvalPersist): n_persist <= n_chunks; with offloaded chunks MinBuffers(n_persist) <= n_buffer <=
// n_chunks - n_persist; with every chunk persistent n_buffer = 0.
std::string FixedKnobConflict(const FixedKnobs& f, const CostModel& model) {
  const int32_t c = model.num_chunks();
  const std::string layout = absl::StrCat(c, " chunks at ", model.chunk_bytes() / kMiB, " MiB");
  if (f.n_persist && *f.n_persist > c) {
    return absl::StrCat("fixed.n_persist = ", *f.n_persist, " exceeds the layout's ", layout);
  }
  if (!f.n_buffer) return "";
  const int32_t nb = *f.n_buffer;
  auto problem = [&](int32_t np) -> std::string {
    if (np == c) {
      if (nb == 0) return "";
      return absl::StrCat("fixed.n_buffer = ", nb, " with fixed.n_persist = ", np,
                          ": every one of the layout's ", layout,
                          " is persistent, nothing is streamed through buffers (n_buffer 0)");
    }
    if (nb > c - np) {
      return absl::StrCat("fixed.n_buffer = ", nb, " exceeds the ", c - np,
                          " offloaded chunks (the layout's ", layout, " less fixed.n_persist = ",
                          np, "); at most ", c - np, " buffers can be used");
    }
    if (nb < model.MinBuffers(np)) {
      return absl::StrCat("fixed.n_buffer = ", nb, " is below the ", model.MinBuffers(np),
                          " buffers a parameter group needs on the device at once with ",
                          "n_persist = ", np, " (", layout, ")");
    }
    return "";
  };
  if (f.n_persist) return problem(*f.n_persist);
  for (int32_t np = 0; np <= c; ++np) {
    if (problem(np).empty()) return "";
  }
  return absl::StrCat("fixed.n_buffer = ", nb, " fits no n_persist of the layout's ", layout,
                      " (", problem(0), ")");
}

std::string DescribePlan(const ResidencyPlan& p) {
  return absl::StrCat("chunk ", p.chunk_bytes / kMiB, " MiB, ", p.n_persist, "/", p.n_chunks,
                      " chunks persistent, ", p.n_buffer, " buffers, ", p.n_checkpoint,
                      " checkpointed, ", p.n_swap, " swapped, ", p.n_hs_offload,
                      " hidden-state offloaded, ", std::string(HostMemoryKindName(p.host_memory)),
                      " host memory",
                      p.world_size > 1
                          ? (p.shard_persistent_params
                                 ? (p.shard_persistent_state
                                        ? ", persistent chunks sharded (parameters gathered on "
                                          "use, optimizer state)"
                                        : ", persistent base chunks sharded (gathered on use), "
                                          "adapters replicated")
                             : p.shard_persistent_state
                                 ? ", persistent chunks' optimizer state sharded"
                                 : ", persistent chunks' optimizer state replicated")
                          : "",
                      p.head_chunk_logit_bytes > 0
                          ? absl::StrCat(", head chunks of ", p.head_chunk_logit_bytes / kMiB,
                                         " MiB of logits")
                          : "");
}

std::string DescribeTime(const Prediction& p) {
  return absl::StrFormat("%.3f s/step, %.0f tokens/s per GPU", p.iteration_seconds,
                         p.tokens_per_second);
}

int64_t RequiredBytes(const Prediction& p) { return std::max(p.peak_bytes, p.load_peak_bytes); }

// Smallest card (1 MiB granularity) whose usable bytes cover `required`, 0 if above the limit.
int64_t SmallestCard(int64_t required, double margin) {
  int64_t g = static_cast<int64_t>(std::ceil(static_cast<double>(required) / (1.0 - margin)));
  while (UsableBytes(g, margin) < required) ++g;
  g = (g + kMiB - 1) / kMiB * kMiB;
  return g <= kMaxGpuMemoryBytes ? g : 0;
}

// Largest token count (micro_batch * seq_len) for which some plan fits, 0 if none. Every byte
// figure of a trace is linear in tokens (no S x S scores are materialised), so feasibility
// depends on tokens only; each probe rebuilds only the block tables (PlanSearch::ForTrace).
// The leanest plan's required bytes grow almost linearly with tokens, so the boundary is
// bracketed and then narrowed by linear interpolation (bisection when that stalls); the result
// is exact: `lo` always fits and `hi` never does.
absl::StatusOr<int64_t> MaxTokens(const PlanInputs& in, const PlanSearch& search,
                                  const SearchConstraints& constraints, int64_t known_tokens,
                                  int64_t known_required, int64_t cap) {
  const int64_t capacity = constraints.capacity_bytes;
  constexpr int64_t kNever = std::numeric_limits<int64_t>::max();
  // Required bytes of the leanest plan at `tokens` (kNever when host limits forbid every plan).
  auto required = [&](int64_t tokens) -> absl::StatusOr<int64_t> {
    Workload w = in.workload;
    w.micro_batch = 1;
    w.seq_len = tokens;
    if (w.images_per_sample > 0) {
      // [Vision tower price] The tower's bytes follow the images, not the tokens: the probe
      // carries the images of as many samples as the tokens hold (what a larger micro-batch
      // brings), and never fewer than the workload's own (what a longer sequence keeps).
      const Workload& w0 = in.workload;
      const int64_t samples =
          std::max(w0.micro_batch, (tokens + w0.seq_len - 1) / std::max<int64_t>(w0.seq_len, 1));
      const int64_t images = samples * w0.images_per_sample;
      if (images > kMaxImagesPerSample) return kNever;  // beyond what the planner models
      w.images_per_sample = static_cast<int32_t>(images);
    }
    absl::StatusOr<Trace> trace = TraceFor(in, w);
    if (!trace.ok()) {
      // Too large to model is too large to fit; other errors are real.
      if (trace.status().code() == absl::StatusCode::kInvalidArgument) return kNever;
      return trace.status();
    }
    ASSIGN_OR_RETURN(PlanSearch probe, search.ForTrace(*trace, /*build_time_tables=*/false));
    const SearchResult r = probe.FindLeanest(constraints);
    return r.found ? RequiredBytes(r.prediction) : kNever;
  };
  int64_t lo = 0, r_lo = 0;  // fits (lo = 0: the empty workload, by convention)
  int64_t hi = 0, r_hi = 0;  // does not fit (0 = not found yet)
  if (known_required <= capacity) {
    lo = known_tokens;
    r_lo = known_required;
  } else {
    hi = known_tokens;
    r_hi = known_required;
    ASSIGN_OR_RETURN(const int64_t r1, required(1));
    if (r1 > capacity) return 0;
    lo = 1;
    r_lo = r1;
  }
  // Bracket: extrapolate from the known point(s), doubling at least.
  while (hi == 0) {
    int64_t next = std::min(cap, lo * 2);
    if (next <= lo) return lo;
    ASSIGN_OR_RETURN(const int64_t r, required(next));
    if (r <= capacity) {
      // Linear extrapolation through (lo, r_lo) and (next, r) to the capacity, plus 10%.
      const double slope = static_cast<double>(r - r_lo) / static_cast<double>(next - lo);
      lo = next;
      r_lo = r;
      if (slope > 0 && lo < cap) {
        const double guess =
            static_cast<double>(lo) + 1.1 * static_cast<double>(capacity - r_lo) / slope;
        const int64_t jump = std::min<int64_t>(cap, static_cast<int64_t>(guess) + 1);
        if (jump > lo) {
          ASSIGN_OR_RETURN(const int64_t rj, required(jump));
          if (rj <= capacity) {
            lo = jump;
            r_lo = rj;
          } else {
            hi = jump;
            r_hi = rj;
          }
        }
      }
    } else {
      hi = next;
      r_hi = r;
    }
  }
  // Narrow: interpolate (clamped strictly inside the bracket); bisect every other step.
  bool bisect = false;
  while (hi - lo > 1) {
    int64_t mid = lo + (hi - lo) / 2;
    if (!bisect && r_hi != kNever && r_hi > r_lo) {
      const double t = static_cast<double>(capacity - r_lo) / static_cast<double>(r_hi - r_lo);
      mid = lo + static_cast<int64_t>(t * static_cast<double>(hi - lo));
      mid = std::clamp<int64_t>(mid, lo + 1, hi - 1);
    }
    ASSIGN_OR_RETURN(const int64_t r, required(mid));
    const int64_t before = hi - lo;
    if (r <= capacity) {
      lo = mid;
      r_lo = r;
    } else {
      hi = mid;
      r_hi = r;
    }
    // Interpolation that shrank the bracket by less than half falls back to bisection once.
    bisect = !bisect && (hi - lo) * 2 > before;
  }
  return lo;
}

std::string AlternativeNote(const ResidencyPlan& best, const Prediction& best_pred,
                            const ResidencyPlan& alt, const Prediction& alt_pred) {
  std::vector<std::string> changes;
  auto diff = [&](const char* name, int64_t a, int64_t b) {
    if (a != b) changes.push_back(absl::StrCat(name, " ", a, " -> ", b));
  };
  diff("chunk MiB", best.chunk_bytes / kMiB, alt.chunk_bytes / kMiB);
  diff("n_persist", best.n_persist, alt.n_persist);
  diff("n_buffer", best.n_buffer, alt.n_buffer);
  diff("n_checkpoint", best.n_checkpoint, alt.n_checkpoint);
  diff("n_swap", best.n_swap, alt.n_swap);
  diff("n_hs_offload", best.n_hs_offload, alt.n_hs_offload);
  const double mem = 100.0 * (1.0 - static_cast<double>(RequiredBytes(alt_pred)) /
                                        static_cast<double>(RequiredBytes(best_pred)));
  const double slow = best_pred.iteration_seconds > 0
                          ? alt_pred.iteration_seconds / best_pred.iteration_seconds
                          : 0;
  return absl::StrFormat("needs %s (%.0f%% less GPU memory) at %.2fx the step time: %s",
                         GiB(RequiredBytes(alt_pred)), mem, slow, absl::StrJoin(changes, ", "));
}

}  // namespace

namespace {

absl::Status CheckTraceBytes(const std::string& field, int64_t value) {
  if (value < 0 || value > kMaxTraceBytesField) {
    return OutOfRange(field, value, 0, kMaxTraceBytesField);
  }
  return absl::OkStatus();
}

absl::Status CheckTraceSeconds(const std::string& field, double value) {
  if (!std::isfinite(value) || value < 0 || value > kMaxTraceSeconds) {
    return Invalid(
        absl::StrCat(field, " = ", value, " is out of range; allowed [0, ", kMaxTraceSeconds, "]"));
  }
  return absl::OkStatus();
}

absl::Status ValidateEdge(const EdgeTrace& e, const std::string& p) {
  RETURN_IF_ERROR(CheckTraceBytes(p + "param_bytes", e.param_bytes));
  RETURN_IF_ERROR(CheckTraceBytes(p + "saved_bytes", e.saved_bytes));
  RETURN_IF_ERROR(CheckTraceBytes(p + "forward_transient_bytes", e.forward_transient_bytes));
  RETURN_IF_ERROR(CheckTraceBytes(p + "backward_transient_bytes", e.backward_transient_bytes));
  RETURN_IF_ERROR(CheckTraceSeconds(p + "forward_seconds", e.forward_seconds));
  RETURN_IF_ERROR(CheckTraceSeconds(p + "backward_seconds", e.backward_seconds));
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateTrace(const Trace& t, absl::string_view prefix) {
  const std::string p(prefix);
  if (t.blocks.empty()) return Invalid(p + "blocks is empty");
  RETURN_IF_ERROR(ValidateModelSpec(t.arch, p + "arch."));
  RETURN_IF_ERROR(CheckName(p + "arch.name", t.arch.name));
  RETURN_IF_ERROR(ValidateWorkload(t.workload, p + "workload."));
  RETURN_IF_ERROR(ValidateTrainingMethod(t.training, t.arch, p + "training."));
  // A vision-language profile without an image never ran the tower: it would under-count.
  RETURN_IF_ERROR(ValidateImagesForModel(t.arch, t.workload, p + "arch.", p + "workload."));
  RETURN_IF_ERROR(CheckName(p + "hardware_name", t.hardware_name));
  RETURN_IF_ERROR(CheckId(p + "trace_id", t.trace_id));
  if (static_cast<int64_t>(t.blocks.size()) != t.arch.num_layers) {
    return Invalid(absl::StrCat(p, "blocks has ", t.blocks.size(),
                                " entries; it must have one per layer (", p,
                                "arch.num_layers = ", t.arch.num_layers, ")"));
  }
  RETURN_IF_ERROR(ValidateEdge(t.embedding, p + "embedding."));
  RETURN_IF_ERROR(ValidateEdge(t.head, p + "head."));
  for (size_t i = 0; i < t.blocks.size(); ++i) {
    const BlockTrace& b = t.blocks[i];
    const std::string f = absl::StrCat(p, "blocks[", i, "].");
    RETURN_IF_ERROR(CheckTraceBytes(f + "param_bytes", b.param_bytes));
    RETURN_IF_ERROR(CheckTraceBytes(f + "input_bytes", b.input_bytes));
    RETURN_IF_ERROR(CheckTraceBytes(f + "saved_bytes", b.saved_bytes));
    RETURN_IF_ERROR(CheckTraceBytes(f + "forward_transient_bytes", b.forward_transient_bytes));
    RETURN_IF_ERROR(CheckTraceBytes(f + "backward_transient_bytes", b.backward_transient_bytes));
    RETURN_IF_ERROR(CheckTraceSeconds(f + "forward_seconds", b.forward_seconds));
    RETURN_IF_ERROR(CheckTraceSeconds(f + "backward_seconds", b.backward_seconds));
    RETURN_IF_ERROR(CheckTraceSeconds(f + "recompute_seconds", b.recompute_seconds));
  }
  if (t.trainable_param_count < 0 || t.total_param_count < 0 ||
      t.trainable_param_count > t.total_param_count) {
    return Invalid(absl::StrCat(p, "trainable_param_count = ", t.trainable_param_count,
                                " is out of range; allowed [0, ", p,
                                "total_param_count = ", t.total_param_count, "]"));
  }
  RETURN_IF_ERROR(CheckTraceBytes(p + "forward_end_bytes", t.forward_end_bytes));
  RETURN_IF_ERROR(CheckTraceBytes(p + "chunk_bytes", t.chunk_bytes));
  RETURN_IF_ERROR(
      CheckListSize(p + "chunk_param_bytes", t.chunk_param_bytes.size(), kMaxChunkEntries));
  for (size_t i = 0; i < t.chunk_param_bytes.size(); ++i) {
    RETURN_IF_ERROR(
        CheckTraceBytes(absl::StrCat(p, "chunk_param_bytes[", i, "]"), t.chunk_param_bytes[i]));
  }
  return absl::OkStatus();
}

// The defaults, plus the smallest power of two (in MiB) that holds the largest block
// parameter and twice that when the defaults are all smaller: otherwise every wide matrix of a
// large model is an oversized chunk with a device buffer of its own, which defeats offloading.
std::vector<int64_t> ChunkCandidates(const FixedKnobs& fixed, const Trace& trace) {
  if (fixed.chunk_bytes) return {*fixed.chunk_bytes};
  std::vector<int64_t> sizes(std::begin(kDefaultChunkCandidatesBytes),
                             std::end(kDefaultChunkCandidatesBytes));
  const int64_t largest = LargestBlockParamBytes(trace);
  if (largest > sizes.back()) {
    int64_t fit = sizes.back();
    while (fit < largest) fit *= 2;
    sizes.push_back(fit);
    sizes.push_back(2 * fit);
  }
  return sizes;
}

int64_t RawModelBytes(const Prediction& prediction) {
  const MemoryBreakdown& b = prediction.breakdown;
  return b.persistent_chunks_bytes + b.buffers_bytes + b.grads_bytes + b.optimizer_state_bytes +
         b.activations_bytes + b.checkpoint_chain_bytes + b.transient_bytes +
         b.allocator_slack_bytes;
}

namespace {

// [OSFT plans] (planner/core/osft_plan.h): the blocks' modes over an all-resident model.
OsftPlanContext OsftContext(const PlanInputs& in) {
  OsftPlanContext c;
  c.cost_options = MakeCostOptions(in, true);
  c.capacity_bytes = UsableBytes(in.hardware.gpu_memory_bytes, in.safety_margin);
  c.host_bytes_per_rank = HostBytesPerRank(in);
  c.usable_text =
      absl::StrCat(GiB(c.capacity_bytes), " usable (", GiB(in.hardware.gpu_memory_bytes),
                   " card, ", absl::StrFormat("%.0f%%", in.safety_margin * 100), " margin)");
  c.host_limit_text = HostLimitText(in);
  return c;
}

}  // namespace

namespace {

// [Vision block checkpointing] A trained vision tower may recompute its blocks in backward
// (common/vision_cost.h): the plan is searched as the workload asks and, when nothing fits that
// way and the caller left it off, searched again with it on; the answer says which in
// ResidencyPlan::vision_checkpoint. (A profiled trace is rebased to it by ScaleTraceToWorkload:
// its bytes follow the formula, its time does not add the recompute.)
bool MayCheckpointVision(const PlanInputs& in) {
  return in.arch.IsVisionLanguage() && in.training.kind == TrainingKind::kFull &&
         in.workload.images_per_sample > 0 && !in.workload.vision_checkpoint;
}

absl::StatusOr<PlanOutcome> MakePlanAsAsked(const PlanInputs& in) {
  RETURN_IF_ERROR(ValidateInputs(in));
  if (in.training.kind == TrainingKind::kOsft) return MakeOsftPlan(in, OsftContext(in));
  ASSIGN_OR_RETURN(Trace trace, TraceFor(in, in.workload));
  ASSIGN_OR_RETURN(
      PlanSearch search,
      PlanSearch::Create(trace, in.hardware, MakeCostOptions(in, true),
                         ChunkCandidates(in.fixed, trace)));
  RETURN_IF_ERROR(ValidateFixedAgainstLayout(in.fixed, search));

  PlanOutcome out;
  out.capacity_bytes = UsableBytes(in.hardware.gpu_memory_bytes, in.safety_margin);
  SearchConstraints constraints;
  constraints.fixed = in.fixed;
  constraints.capacity_bytes = out.capacity_bytes;
  constraints.host_memory_bytes = HostBytesPerRank(in);
  constraints.pinned_limit_bytes = in.hardware.pinned_limit_bytes;
  const std::string usable =
      absl::StrCat(GiB(out.capacity_bytes), " usable (", GiB(in.hardware.gpu_memory_bytes),
                   " card, ", absl::StrFormat("%.0f%%", in.safety_margin * 100), " margin)");

  SearchResult best = search.FindFastest(constraints);
  out.plans_evaluated = best.plans_evaluated;
  // The leanest plan decides the smallest card that fits and, when nothing fits, what to show.
  const SearchResult leanest = search.FindLeanest(constraints);
  out.plans_evaluated += leanest.plans_evaluated;
  const int64_t min_gpu =
      leanest.found ? SmallestCard(RequiredBytes(leanest.prediction), in.safety_margin) : 0;

  if (best.found) {
    out.fits = true;
    out.plan = best.plan;
    out.prediction = best.prediction;
    out.reason = absl::StrCat("fits: predicted peak ", GiB(best.prediction.peak_bytes), " of ",
                              usable, ", load-time peak ", GiB(best.prediction.load_peak_bytes),
                              "; ", DescribePlan(best.plan), "; ", DescribeTime(best.prediction));
    // Alternatives: the fastest plan under successively tighter GPU budgets, at the chosen chunk
    // size (each one is on the memory/speed Pareto frontier of that chunk size).
    SearchConstraints tighter = constraints;
    tighter.fixed.chunk_bytes = best.plan.chunk_bytes;
    const int64_t floor_bytes = RequiredBytes(leanest.prediction);
    int64_t cap = RequiredBytes(best.prediction);
    for (int i = 0; i < in.max_alternatives; ++i) {
      tighter.capacity_bytes = std::max(floor_bytes, static_cast<int64_t>(cap * 0.85));
      if (tighter.capacity_bytes >= cap) break;
      SearchResult alt = search.FindFastest(tighter);
      out.plans_evaluated += alt.plans_evaluated;
      if (!alt.found) break;
      out.alternative_notes.push_back(
          AlternativeNote(best.plan, best.prediction, alt.plan, alt.prediction));
      out.alternatives.emplace_back(alt.plan, alt.prediction);
      cap = RequiredBytes(alt.prediction);
    }
  } else {
    out.fits = false;
    // Which constraint blocks it? 0) fixed knobs that conflict whatever the memory, 1) a fixed
    // knob, 2) host memory, 3) GPU memory.
    std::vector<const FixedKnobEntry*> relaxable;  // set knobs the plan may be tried without
    for (const FixedKnobEntry& knob : FixedKnobTable()) {
      if (knob.relaxed_when_no_fit && knob.is_set(in.fixed)) relaxable.push_back(&knob);
    }
    std::string knob_reason;
    const bool any_fixed = !relaxable.empty();
    // [Fixed knob conflicts]: reported only when every chunk size the knobs allow has one.
    std::string conflict;
    for (int i = 0; i < search.num_models(); ++i) {
      const std::string c = FixedKnobConflict(in.fixed, search.model(i));
      if (c.empty()) {
        conflict.clear();
        break;
      }
      if (conflict.empty()) conflict = c;
    }
    if (!conflict.empty()) {
      knob_reason =
          absl::StrCat("impossible with the fixed knobs, whatever the memory: ", conflict);
    } else if (any_fixed && !leanest.found) {
      // No GPU size helps: the fixed knobs and the host limits. Name the knob that, left free,
      // lets a plan keep the host side within its limits.
      ASSIGN_OR_RETURN(PlanSearch all_sizes,
                       PlanSearch::Create(trace, in.hardware, MakeCostOptions(in, false),
                                          ChunkCandidates(FixedKnobs{}, trace)));
      for (size_t k = 0; k < relaxable.size() && knob_reason.empty(); ++k) {
        SearchConstraints relaxed = constraints;
        relaxable[k]->clear(&relaxed.fixed);
        const SearchResult r = all_sizes.FindLeanest(relaxed);
        if (r.found) {
          knob_reason = absl::StrCat(
              "does not fit with ", FixedKnobText(*relaxable[k], in.fixed, "fixed."),
              ": host memory, not GPU memory; no ",
              "plan honouring the fixed knobs keeps the host side within ", HostLimitText(in),
              in.hardware.pinned_limit_bytes > 0
                  ? absl::StrCat(" (pinned limit ", GiB(in.hardware.pinned_limit_bytes), ")")
                  : std::string(),
              "; without fixing it the leanest plan (", DescribePlan(r.plan), ") needs ",
              GiB(r.prediction.host_pinned_bytes + r.prediction.host_pageable_bytes),
              " on the host");
        }
      }
    } else if (any_fixed) {
      ASSIGN_OR_RETURN(PlanSearch all_sizes,
                       PlanSearch::Create(trace, in.hardware, MakeCostOptions(in, true),
                                          ChunkCandidates(FixedKnobs{}, trace)));
      for (size_t k = 0; k < relaxable.size() && knob_reason.empty(); ++k) {
        SearchConstraints relaxed = constraints;
        relaxable[k]->clear(&relaxed.fixed);
        const SearchResult r = all_sizes.FindFastest(relaxed);
        if (r.found) {
          knob_reason = absl::StrCat(
              "does not fit with ", FixedKnobText(*relaxable[k], in.fixed, "fixed."),
              ": no plan honouring it fits in ", usable, "; without fixing it the best plan fits (",
              DescribePlan(r.plan), ", peak ", GiB(r.prediction.peak_bytes), ")");
        }
      }
      if (knob_reason.empty()) {
        SearchConstraints relaxed = constraints;
        relaxed.fixed = FixedKnobs{};
        const SearchResult r = all_sizes.FindFastest(relaxed);
        if (r.found) {
          std::vector<std::string> names;
          for (const FixedKnobEntry* knob : relaxable) {
            names.push_back(FixedKnobText(*knob, in.fixed, "fixed."));
          }
          knob_reason = absl::StrCat(
              "does not fit with the fixed knobs together (", absl::StrJoin(names, ", "),
              "); without them the best plan fits (", DescribePlan(r.plan), ")");
        }
      }
    }
    if (leanest.found) {
      // The least-bad plan: the leanest one (it fits the smallest card).
      out.plan = leanest.plan;
      out.prediction = leanest.prediction;
      std::string host_note;
      const Prediction& lp = leanest.prediction;
      if (lp.host_pinned_bytes + lp.host_pageable_bytes > 0 || leanest.plan.n_persist > 0) {
        // Is host memory what keeps the leanest plan big?
        SearchConstraints no_host = constraints;
        no_host.host_memory_bytes = std::numeric_limits<int64_t>::max();
        no_host.pinned_limit_bytes = 0;
        const SearchResult free_host = search.FindLeanest(no_host);
        if (free_host.found && RequiredBytes(free_host.prediction) < RequiredBytes(lp)) {
          host_note = absl::StrCat(
              "; host memory binds: ", HostLimitText(in),
              in.hardware.pinned_limit_bytes > 0
                  ? absl::StrCat(" (pinned limit ", GiB(in.hardware.pinned_limit_bytes), ")")
                  : std::string(),
              " lets only ", leanest.plan.n_chunks - leanest.plan.n_persist, " of ",
              leanest.plan.n_chunks,
              " chunks be offloaded; with enough host memory the leanest "
              "plan would need ",
              GiB(RequiredBytes(free_host.prediction)), " of GPU memory and ",
              GiB(free_host.prediction.host_pinned_bytes +
                  free_host.prediction.host_pageable_bytes),
              " of host memory");
        }
      }
      out.reason =
          !knob_reason.empty()
              ? knob_reason
              : absl::StrCat("does not fit: the leanest plan needs ", GiB(RequiredBytes(lp)),
                             " of GPU memory (", DescribePlan(leanest.plan), ") but only ", usable,
                             " is available; smallest card that fits: ", GiB(min_gpu), host_note);
    } else {
      // No GPU size helps: host memory (RAM or the pinned limit) is the blocker.
      SearchConstraints no_host = constraints;
      no_host.host_memory_bytes = std::numeric_limits<int64_t>::max();
      no_host.pinned_limit_bytes = 0;
      const SearchResult fits_gpu = search.FindFastest(no_host);
      const SearchResult r = fits_gpu.found ? fits_gpu : search.FindLeanest(no_host);
      out.plan = r.plan;
      out.prediction = r.prediction;
      const int64_t host_needed = r.prediction.host_pinned_bytes + r.prediction.host_pageable_bytes;
      out.reason =
          !knob_reason.empty()
              ? knob_reason
              : absl::StrCat(
                    "does not fit: host memory; no plan keeps the host side within ",
                    HostLimitText(in),
                    in.hardware.pinned_limit_bytes > 0
                        ? absl::StrCat(" (pinned limit ", GiB(in.hardware.pinned_limit_bytes), ")")
                        : std::string(),
                    r.found ? absl::StrCat(fits_gpu.found ? "; the fastest plan that fits the GPU ("
                                                          : "; the leanest plan (",
                                           DescribePlan(r.plan), ") needs ", GiB(host_needed),
                                           " on the host")
                            : std::string());
    }
  }

  out.plan.vision_checkpoint = in.workload.vision_checkpoint;
  for (auto& [alt, prediction] : out.alternatives)
    alt.vision_checkpoint = out.plan.vision_checkpoint;
  out.trace_used = WithChunkLayout(trace, search.model(0).layout());
  for (int i = 0; i < search.num_models(); ++i) {
    if (search.model(i).chunk_bytes() == out.plan.chunk_bytes) {
      out.trace_used = WithChunkLayout(trace, search.model(i).layout());
      break;
    }
  }

  if (!in.skip_limits) {
    out.min_gpu_memory_bytes = min_gpu;
    const Workload& w0 = in.workload;
    const int64_t tokens_cap = int64_t{1} << 28;  // ValidateWorkload's bound on B x S
    const int64_t batch_cap = std::min<int64_t>(kMaxMicroBatch, tokens_cap / w0.seq_len);
    int64_t seq_cap = std::min<int64_t>(kMaxSeqLen, tokens_cap / w0.micro_batch);
    if (in.arch.max_position_embeddings > 0) {
      seq_cap = std::min(seq_cap, std::max(in.arch.max_position_embeddings, w0.seq_len));
    }
    const int64_t cap = std::max(batch_cap * w0.seq_len, seq_cap * w0.micro_batch);
    const int64_t tokens0 = w0.micro_batch * w0.seq_len;
    ASSIGN_OR_RETURN(const int64_t max_tokens,
                     MaxTokens(in, search, constraints, tokens0,
                               leanest.found ? RequiredBytes(leanest.prediction)
                                             : std::numeric_limits<int64_t>::max(),
                               std::max(cap, tokens0)));
    out.max_micro_batch = std::min(batch_cap, max_tokens / w0.seq_len);
    out.max_seq_len = std::min(seq_cap, max_tokens / w0.micro_batch);
  }
  return out;
}

}  // namespace

absl::StatusOr<PlanOutcome> MakePlan(const PlanInputs& in) {
  ASSIGN_OR_RETURN(PlanOutcome out, MakePlanAsAsked(in));
  if (!MayCheckpointVision(in)) return out;
  PlanInputs ckpt = in;
  ckpt.workload.vision_checkpoint = true;
  absl::StatusOr<PlanOutcome> with = MakePlanAsAsked(ckpt);
  if (!with.ok()) return out;
  if (!out.fits && with->fits) {
    with->reason = absl::StrCat(with->reason,
                                "; the vision tower's blocks checkpointed (nothing fits without)");
    return with;
  }
  // The limits are what some plan reaches, the checkpoint being the planner's to turn on.
  out.max_micro_batch = std::max(out.max_micro_batch, with->max_micro_batch);
  out.max_seq_len = std::max(out.max_seq_len, with->max_seq_len);
  if (with->min_gpu_memory_bytes > 0) {
    out.min_gpu_memory_bytes = out.min_gpu_memory_bytes > 0
                                   ? std::min(out.min_gpu_memory_bytes, with->min_gpu_memory_bytes)
                                   : with->min_gpu_memory_bytes;
  }
  return out;
}

absl::StatusOr<Prediction> PredictPlan(const PlanInputs& asked, const ResidencyPlan& plan) {
  // A plan with the vision tower's blocks checkpointed is priced so, whatever the workload says.
  PlanInputs inputs = asked;
  inputs.workload.vision_checkpoint = inputs.workload.vision_checkpoint || plan.vision_checkpoint;
  RETURN_IF_ERROR(ValidateInputs(inputs));
  if (inputs.training.kind == TrainingKind::kOsft) {
    return PredictOsftPlan(inputs, OsftContext(inputs), plan);
  }
  if (plan.chunk_bytes < kMinChunkBytes || plan.chunk_bytes > kMaxChunkBytes) {
    return OutOfRange("plan.chunk_bytes", plan.chunk_bytes, kMinChunkBytes, kMaxChunkBytes);
  }
  RETURN_IF_ERROR(
      CheckHeadChunkLogitBytes("plan.head_chunk_logit_bytes", plan.head_chunk_logit_bytes));
  ASSIGN_OR_RETURN(Trace trace, TraceFor(inputs, inputs.workload));
  CostOptions options = MakeCostOptions(inputs, true);
  options.head_chunk_logit_bytes = plan.head_chunk_logit_bytes;
  options.shard_persistent_state = plan.shard_persistent_state;
  options.shard_persistent_params = plan.shard_persistent_params;
  ASSIGN_OR_RETURN(CostModel model,
                   CostModel::Create(trace, plan.chunk_bytes, inputs.hardware, options));
  RETURN_IF_ERROR(model.ValidatePlan(plan));
  return model.Predict(plan);
}

}  // namespace memplan
