// Plan search: the fastest residency plan (min predicted iteration time) whose predicted steady
// and load-time peaks fit the GPU capacity and whose host memory fits host RAM and the pinned
// limit. Exhaustive over (chunk size, host memory kind, n_swap, n_hs_offload, n_checkpoint,
// n_persist, n_buffer) with exact branch-and-bound pruning (docs/cost-model.md, "Search").
// Thread-safe after construction (const methods only).
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "common/types.h"
#include "planner/cost/cost_model.h"

namespace memplan {

inline constexpr int64_t kDefaultChunkCandidatesBytes[] = {int64_t{32} << 20, int64_t{64} << 20,
                                                           int64_t{128} << 20, int64_t{256} << 20};

struct SearchConstraints {
  FixedKnobs fixed;                // every set knob is a hard constraint
  int64_t capacity_bytes = 0;      // usable GPU bytes (after the safety margin)
  int64_t host_memory_bytes = 0;   // host RAM available to this GPU's process
  int64_t pinned_limit_bytes = 0;  // 0 = unlimited
};

// [Near ties keep the chunks] (plan_search.cc): the fastest plan offloads chunks, yet the plan
// with every chunk persistent and the same block modes fits and is predicted at most this much
// slower: the search answers the persistent one. 5 %: two full-card plans predicted 1-2 % faster
// with chunks offloaded ran 4 % and 56 % slower than all-persistent (docs/cost-model.md).
inline constexpr double kPersistentTieTolerance = 0.05;

struct SearchResult {
  bool found = false;
  int model_index = -1;  // which chunk-size candidate
  ResidencyPlan plan;
  Prediction prediction;
  int64_t plans_evaluated = 0;  // full (n_persist, n_buffer, modes) evaluations
};

class PlanSearch {
 public:
  // One cost model per chunk-size candidate (deduplicated, each > 0); with world_size > 1 a
  // second one per size with the persistent chunks' optimizer state sharded
  // (CostOptions::shard_persistent_state) where the workload allows it, and a third with the
  // parameters sharded too (shard_persistent_params); LoRA and QLoRA: a second with the frozen
  // base's persistent chunks sharded (shard_persistent_params alone). The plans' head chunk is
  // options.head_chunk_logit_bytes.
  static absl::StatusOr<PlanSearch> Create(const Trace& trace, const HardwareSpec& hardware,
                                           const CostOptions& options,
                                           const std::vector<int64_t>& chunk_candidates_bytes);

  // Fastest feasible plan; ties keep the first found (smaller chunk, pinned, fewer swaps...).
  // [Wide head chunks] (plan_search.cc): unless fixed.head_chunk_logit_bytes is set, the plan
  // found then takes head chunks of kPlainHeadChunkLogitBytes when it still fits with them.
  SearchResult FindFastest(const SearchConstraints& constraints) const;
  // Some feasible plan, found without optimising time (used by limit probes).
  SearchResult FindAnyFit(const SearchConstraints& constraints) const;
  // The plan needing the least GPU memory (max of steady and load-time peak) that honours the
  // fixed knobs and the host limits; capacity_bytes is ignored. Any capacity at or above its
  // requirement admits a plan, any capacity below admits none.
  SearchResult FindLeanest(const SearchConstraints& constraints) const;
  // The same search for another workload of the same architecture (see CostModel::ForTrace);
  // memory-only models when `build_time_tables` is false (FindAnyFit / FindLeanest only).
  absl::StatusOr<PlanSearch> ForTrace(const Trace& trace, bool build_time_tables) const;

  int num_models() const { return static_cast<int>(models_.size()); }
  const CostModel& model(int i) const { return models_[static_cast<size_t>(i)]; }

 private:
  PlanSearch(std::vector<CostModel> models, std::vector<CostModel> wide_models)
      : models_(std::move(models)), wide_models_(std::move(wide_models)) {}
  SearchResult Run(const SearchConstraints& constraints, bool any_fit) const;

  std::vector<CostModel> models_;
  // models_[i] with kPlainHeadChunkLogitBytes head chunks, where the workload's head is chunked
  // at that size and the head chunk is not fixed (CostOptions::head_chunk_logit_bytes 0); else
  // empty.
  std::vector<CostModel> wide_models_;
};

}  // namespace memplan
