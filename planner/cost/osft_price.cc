#include "planner/cost/osft_price.h"

#include <algorithm>

#include "common/status.h"
#include "planner/cost/analytic_trace.h"
#include "planner/cost/osft_terms.h"

namespace memplan {
namespace {

// [OSFT optimizer passes] Element reads and writes per trainable element of one update, at the
// memory rate: torch::optim::AdamW (C++, one parameter at a time, unfused: weight decay, both
// moments, sqrt, scale, eps, addcdiv) about 22; at::_fused_adamw_ (adamw_bf16) reads parameter,
// gradient and both moments and writes three of them, 7; SGD decays and adds, 5.
double OptimizerPasses(OptimizerKind kind) {
  switch (kind) {
    case OptimizerKind::kAdamW:
      return 22;
    case OptimizerKind::kAdamWBf16States:
      return 7;
    case OptimizerKind::kSgd:
      return 5;
    case OptimizerKind::kAdamW8bit:
      break;  // refused by EstimateOsftCost
  }
  return 22;
}

double MatmulFlops(const HardwareSpec& hw, DType dtype) {
  if (dtype == DType::kFloat32) return hw.matmul_fp32_flops;
  if (dtype == DType::kFloat16 && hw.matmul_fp16_flops > 0) return hw.matmul_fp16_flops;
  return hw.matmul_bf16_flops;
}

}  // namespace

absl::StatusOr<OsftPricer> OsftPricer::Create(const Trace& trace, const HardwareSpec& hardware,
                                              const CostOptions& options) {
  if (trace.training.kind != TrainingKind::kOsft) {
    return absl::InvalidArgumentError("OsftPricer: the trace is not an OSFT trace");
  }
  OsftPricer p;
  p.options_ = options;
  p.world_size_ = std::max<int32_t>(1, options.world_size);
  ASSIGN_OR_RETURN(p.cost_,
                   EstimateOsftCost(trace.arch, OsftWorkloadFor(trace.training, trace.param_dtype,
                                                                options.optimizer, p.world_size_)));
  ASSIGN_OR_RETURN(const OsftBlockTerms terms,
                   OsftBlockTermsFor(trace.arch, trace.training, trace.param_dtype));
  const int64_t d = DTypeBytes(trace.param_dtype);
  p.largest_low_factor_bytes_ = terms.largest_low_factor * d;
  p.block_grad_bytes_ = p.cost_.grad_bytes / std::max<int64_t>(1, trace.arch.num_layers);
  p.tokens_per_step_ = trace.workload.micro_batch * trace.workload.seq_len *
                       std::max<int32_t>(1, options.grad_accum);

  // The walk's model: the same activations and block times with no parameter trained in chunks
  // (a frozen base without adapters) on one rank; the model states are priced here instead.
  Trace walk_trace = trace;
  walk_trace.training = TrainingMethod{};
  walk_trace.training.kind = TrainingKind::kLora;
  walk_trace.trainable_param_count = 0;
  CostOptions walk_options = options;
  walk_options.world_size = 1;
  walk_options.local_world_size = 1;
  walk_options.shard_persistent_state = false;
  walk_options.shard_persistent_params = false;
  walk_options.optimizer = OptimizerKind::kAdamW;
  ASSIGN_OR_RETURN(CostModel walk,
                   CostModel::Create(walk_trace, int64_t{64} << 20, hardware, walk_options));
  p.walk_ = std::make_shared<const CostModel>(std::move(walk));

  // The step beside forward and backward: the update at the memory rate, the projection's thin
  // GEMMs at the analytic trace's edge rate (matmul_efficiency; the dense blocks' [Block time]
  // rates were fitted on whole blocks, not on thin GEMMs), the all-reduce (a reduce-scatter then
  // an all-gather of the model-dtype buffer) with nothing to hide behind.
  const double hbm = hardware.hbm_bytes_per_second * options.hbm_efficiency;
  const double matmul =
      MatmulFlops(hardware, trace.param_dtype) * AnalyticTraceOptions{}.matmul_efficiency;
  double step = 0;
  if (hbm > 0) {
    step += OptimizerPasses(options.optimizer) * static_cast<double>(p.cost_.trainable_bytes) / hbm;
  }
  if (matmul > 0) step += p.cost_.projection_flops_per_step / matmul;
  if (p.world_size_ > 1 && hardware.nccl_reduce_scatter_bytes_per_second > 0 &&
      hardware.nccl_allgather_bytes_per_second > 0) {
    const double w = p.world_size_;
    const double moved = static_cast<double>(p.cost_.allreduce_bytes_per_step) * (w - 1) / w;
    step += moved / hardware.nccl_reduce_scatter_bytes_per_second +
            moved / hardware.nccl_allgather_bytes_per_second;
  }
  p.step_seconds_ = step;
  return p;
}

ResidencyPlan OsftPricer::MakePlan(const ModeCounts& counts) const {
  ResidencyPlan plan;
  plan.n_swap = counts.n_swap;
  plan.n_checkpoint = counts.n_checkpoint;
  plan.n_hs_offload = counts.n_hs_offload;
  plan.host_memory = HostMemoryKind::kPinned;
  plan.block_modes = ArrangeBlockModes(walk_->num_blocks(), counts);
  plan.world_size = world_size_;
  return plan;
}

Prediction OsftPricer::Predict(const ModeCounts& counts) const {
  const CostModel& walk = *walk_;
  const Prediction inner =
      walk.Predict(walk.MakeResidencyPlan(walk.num_chunks(), 0, counts, HostMemoryKind::kPinned));
  const int64_t dyn_walk = walk.DynamicRawBytes(counts);
  // [OSFT grads] The agent sets the gradients to none after every update: they are allocated in
  // backward, block by block from the last. The walk's worst phase (the head or a late block's
  // backward) holds about one block's; with several micro-batches all of them exist throughout.
  // At the update: every gradient, with several ranks the bucket being all-reduced ([OSFT
  // all-reduce buckets], common/osft_cost.h), and AdamW's temporaries of one factor.
  const int64_t grads_in_walk = options_.grad_accum > 1 ? cost_.grad_bytes : block_grad_bytes_;
  const int64_t bucket = world_size_ > 1
                             ? OsftBucketBufferBytes(cost_.grad_bytes, largest_low_factor_bytes_,
                                                     kOsftAllReduceBucketBytes)
                             : 0;
  const int64_t step_extra = std::max(bucket, 2 * largest_low_factor_bytes_);
  const int64_t walk_phase = dyn_walk + grads_in_walk;
  const int64_t step_phase = cost_.grad_bytes + step_extra;
  const bool walk_peak = walk_phase >= step_phase;
  // Allocated once at their size: the factors and AdamW's moments (created at the first update).
  const int64_t exact = cost_.frozen_bytes + cost_.trainable_bytes + cost_.optimizer_state_bytes;

  Prediction pred;
  MemoryBreakdown& b = pred.breakdown;
  b = inner.breakdown;
  b.persistent_chunks_bytes = cost_.frozen_bytes + cost_.trainable_bytes;
  b.buffers_bytes = 0;
  b.optimizer_state_bytes = cost_.optimizer_state_bytes;
  b.allocator_slack_bytes = 0;
  b.exact_bytes = exact;
  if (walk_peak) {
    b.grads_bytes = grads_in_walk;
    b.transient_bytes = dyn_walk - b.activations_bytes - b.checkpoint_chain_bytes;
  } else {
    b.grads_bytes = cost_.grad_bytes;
    b.activations_bytes = 0;
    b.checkpoint_chain_bytes = 0;
    b.head_bytes = 0;
    b.transient_bytes = step_extra;
  }
  pred.peak_bytes = walk.Peak(exact, std::max(walk_phase, step_phase));
  pred.load_peak_bytes = walk.Peak(cost_.load_peak_bytes, 0);
  pred.host_pinned_bytes = inner.host_pinned_bytes;
  pred.host_pageable_bytes = inner.host_pageable_bytes;
  RankMemory& rm = pred.rank_memory;
  rm.world_size = world_size_;
  rm.local_world_size = std::max<int32_t>(1, options_.local_world_size);
  rm.node_host_bytes = rm.local_world_size * (pred.host_pinned_bytes + pred.host_pageable_bytes);

  pred.time_factor = inner.time_factor;
  pred.forward_seconds = inner.forward_seconds;
  pred.backward_seconds = inner.backward_seconds;
  pred.iteration_seconds = inner.iteration_seconds + inner.time_factor * step_seconds_;
  pred.optimizer_seconds = pred.iteration_seconds - pred.forward_seconds - pred.backward_seconds;
  // One rank's tokens a step, as the other plans count them.
  const double tokens = static_cast<double>(tokens_per_step_);
  pred.tokens_per_second = pred.iteration_seconds > 0 ? tokens / pred.iteration_seconds : 0;
  return pred;
}

}  // namespace memplan
