// Plans: structural validation, arranged plans, and the Prediction assembled from the memory and
// time parts (cost_model.h).
#include "planner/cost/cost_model.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/head_chunking.h"
#include "common/optimizer_bytes.h"
#include "planner/cost/cost_model_internal.h"

namespace memplan {

absl::Status CostModel::ValidatePlan(const ResidencyPlan& plan) const {
  auto bad = [](const std::string& msg) { return absl::InvalidArgumentError(msg); };
  if (HeadChunkLogitBytes(plan.head_chunk_logit_bytes) !=
      HeadChunkLogitBytes(options_.head_chunk_logit_bytes)) {
    return bad(absl::StrCat("plan.head_chunk_logit_bytes = ", plan.head_chunk_logit_bytes,
                            " but this model prices head chunks of ",
                            HeadChunkLogitBytes(options_.head_chunk_logit_bytes), " bytes"));
  }
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
        " the persistent chunks' parameters (sharding them needs world_size > 1 and the state "
        "sharded too, or LoRA / QLoRA: the frozen base's)"));
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
  plan.head_chunk_logit_bytes = options_.head_chunk_logit_bytes;
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
  const GradPhase grad_parts = GradPhaseParts(plan.n_persist);
  const int64_t grad_phase = grad_parts.total();
  int bwd_block = -1;
  const int64_t bwd_grads = BackwardGradsImpl(m, plan.n_persist, &bwd_block);
  const bool grads_peak = grad_phase > std::max(dyn.total, bwd_grads);
  const bool bwd_peak = !grads_peak && bwd_grads > dyn.total;
  const DynamicParts phase = bwd_peak ? PhaseParts(bwd_block, m) : dyn;
  const int64_t staging = GradStagingBytes(plan.n_persist);
  b.persistent_chunks_bytes = chunks_->alloc_prefix[plan.n_persist];
  b.buffers_bytes = BufferBytes(plan.n_persist, plan.n_buffer);
  // At the grad phase: the embedding's backward (beside the first block's reduce-scatter with
  // sharded persistent state), the embedding stage's reduce-scatter at the end of backward, or
  // the optimizer step's fp32 grad copy.
  const bool step_copy =
      grads_peak && grad_parts.step > std::max(grad_parts.embedding, grad_parts.last_reduce);
  const bool last_reduce =
      grads_peak && !step_copy && grad_parts.last_reduce > grad_parts.embedding;
  const bool emb_phase = grads_peak && !step_copy && !last_reduce;
  b.grads_bytes = staging + (grads_peak ? grad_parts.grads +
                                              (last_reduce ? grad_parts.last_reduce
                                               : emb_phase ? ReduceBeyondShards(1, plan.n_persist)
                                                           : 0)
                             : bwd_peak ? GradsLiveInBackward(bwd_block, plan.n_persist)
                                        : 0);
  b.optimizer_state_bytes = chunks_->opt_prefix[plan.n_persist];
  b.activations_bytes = grads_peak ? (emb_phase ? emb_retained_ : 0) : phase.activations;
  b.checkpoint_chain_bytes = grads_peak ? 0 : phase.checkpoint_chain;
  b.transient_bytes = grads_peak ? (step_copy   ? chunks_->optimizer_step_extra_bytes
                                    : emb_phase ? emb_extra_
                                                : 0)
                                 : phase.transient;
  b.cuda_context_bytes = hardware_.cuda_context_bytes;
  b.fragmentation_factor = options_.fragmentation_factor;
  b.calibration_residual_bytes = options_.residual_bytes;
  b.head_bytes = grads_peak ? 0 : phase.head;
  b.allocator_slack_bytes = VocabSlackBytes(plan.n_persist);
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
  pred.rank_memory = RankChunkMemory(plan.n_persist, plan.n_buffer, plan.host_memory, host);
  // As the agent allocates it (ChunkMemoryStats): the chunks' transfer buffers and the offloaded
  // activations follow the plan's host memory kind, the optimizer state on the host is pageable.
  const RankMemory& rm = pred.rank_memory;
  const int64_t activations = host - rm.chunk_host_pinned_bytes - rm.chunk_host_pageable_bytes;
  const bool pinned = plan.host_memory == HostMemoryKind::kPinned;
  pred.host_pinned_bytes = rm.chunk_host_pinned_bytes + (pinned ? activations : 0);
  pred.host_pageable_bytes = rm.chunk_host_pageable_bytes + (pinned ? 0 : activations);

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
