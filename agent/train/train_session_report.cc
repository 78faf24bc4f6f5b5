// TrainSession's reporting (train_session.h): the plan it applied, the ranks' figures, the
// run's summary and its memory timeline; the rest of the session is train_session.cc.
#include "agent/train/train_session.h"

#include <ATen/Parallel.h>
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <ostream>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "agent/chunks/chunk_manager.h"
#include "agent/client/plan_share.h"
#include "agent/client/planner_client.h"
#include "agent/client/planner_loop.h"
#include "agent/dist/process_group.h"
#include "agent/io/checkpoint.h"
#include "agent/io/file_system.h"
#include "agent/io/model_files.h"
#include "agent/io/peft_adapter.h"
#include "agent/io/random_access_file.h"
#include "agent/io/safetensors_torch.h"
#include "agent/io/synthetic_tokens.h"
#include "agent/io/token_batcher.h"
#include "agent/io/token_file.h"
#include "agent/io/trainer_state.h"
#include "agent/io/writable_file.h"
#include "agent/metrics/agent_metrics.h"
#include "agent/profiler/memory_probe.h"
#include "agent/profiler/memory_timeline.h"
#include "agent/train/device_setup.h"
#include "common/hf_config.h"
#include "common/log.h"
#include "common/osft_cost.h"
#include "common/presets.h"
#include "common/status.h"
#include "common/validate.h"

namespace memplan {
namespace {

std::string ModesString(const std::vector<BlockMode>& modes) {
  std::vector<std::string> names;
  for (BlockMode m : modes) names.emplace_back(BlockModeName(m));
  return absl::StrJoin(names, ",");
}

}  // namespace

void TrainSession::ReportApplied() {
  {
    // The load-time peak of this rank: host (resident set) and device, before the first step.
    const HostMemory loaded = ReadHostMemory();
    const AllocatorPeaks peaks = ReadAllocatorPeaks(device_);
    auto record = MEMPLAN_LOG(kInfo, "load peak");
    record.Field("rank", dist_.rank)
        .Field("host_peak_rss_bytes", loaded.peak_rss)
        .Field("host_rss_before_model_bytes", before_model_.rss)
        .Field("host_rss_bytes", loaded.rss)
        .Field("device_peak_reserved_bytes", peaks.reserved_bytes)
        .Field("sharded_load", sharded_load_);
    if (!loop_.address.empty()) {
      // What the planner gave this rank of the node's RAM at the plan's steady state (its chunks
      // and swapped activations); loading adds the weights in flight, which its reserve holds.
      record.Field("planned_host_bytes",
                   answer_.prediction.host_pinned_bytes + answer_.prediction.host_pageable_bytes);
    }
    if (const ChunkManager* base = trainer_->base_chunk_manager(); base != nullptr) {
      // LoRA: the frozen base's part on this rank ([Sharded frozen base]), all of the base the
      // rank ever held when managed (QLoRA included: [Sharded NF4 loading]).
      const ChunkMemoryStats stats = base->MemoryStats();
      record.Field("base_chunk_host_bytes", stats.host_pinned_bytes + stats.host_pageable_bytes)
          .Field("base_chunk_device_bytes", stats.buffer_device_bytes +
                                                stats.persistent_device_bytes);
    }
    if (const ChunkManager* m = trainer_->chunk_manager(); m != nullptr && sharded_load_) {
      const ChunkMemoryStats stats = m->MemoryStats();
      record.Field("chunk_host_bytes", stats.host_pinned_bytes + stats.host_pageable_bytes)
          .Field("chunk_device_bytes", stats.buffer_device_bytes + stats.persistent_device_bytes +
                                           stats.persistent_state_device_bytes);
    }
  }
  PrintDeviceMemory(device_, "after applying the plan");
  {
    auto record = MEMPLAN_LOG(kInfo, "plan applied");
    record.Field("model", spec_.name)
        .Field("dtype", std::string(DTypeName(dtype_)))
        .Field("optimizer", std::string(OptimizerName(optimizer_)))
        .Field("device", device_.str())
        .Field("managed", plan_.managed)
        .Field("block_modes", ModesString(plan_.block_modes));
    if (optimizer_ == OptimizerKind::kAdamW8bit && dtype_ != DType::kFloat32) {
      record.Field("param_rounding",
                   trainer_options_.chunks.stochastic_rounding ? "stochastic" : "nearest");
    }
    // LoRA: the plan's chunks are the frozen base's; the adapters' manager is reported apart.
    if (ChunkManager* adapters =
            trainer_->base_chunk_manager() ? trainer_->chunk_manager() : nullptr) {
      const ChunkMemoryStats a = adapters->MemoryStats();
      record.Field("lora_rank", config_.lora.rank)
          .Field("nf4_base", config_.lora.nf4_base)
          .Field("adapter_chunks", a.n_chunks)
          .Field("adapter_device_bytes", a.persistent_device_bytes)
          .Field("adapter_state_device_bytes", a.persistent_state_device_bytes);
    }
    // OSFT: what the split made and what the price (common/osft_cost.h) predicts for it.
    if (model_->has_osft()) {
      OsftWorkload w;
      w.rank_ratio = config_.osft.rank_ratio;
      w.targets = config_.osft.targets;
      w.dtype_bytes = DTypeBytes(dtype_);
      w.optimizer = optimizer_;
      w.world_size = world_size_;
      record.Field("osft_rank_ratio", w.rank_ratio)
          .Field("osft_targets", absl::StrJoin(w.targets, ","));
      if (absl::StatusOr<OsftCost> cost = EstimateOsftCost(spec_, w); cost.ok()) {
        record.Field("osft_trainable_params", cost->trainable_params)
            .Field("osft_frozen_params", cost->frozen_params)
            .Field("osft_model_state_bytes_predicted", cost->model_state_bytes)
            .Field("osft_load_peak_bytes_predicted", cost->load_peak_bytes)
            .Field("osft_allreduce_bytes_per_step", cost->allreduce_bytes_per_step);
      }
    }
    if (ChunkManager* chunks = trainer_->base_chunk_manager() ? trainer_->base_chunk_manager()
                                                              : trainer_->chunk_manager()) {
      const ChunkMemoryStats s = chunks->MemoryStats();
      record.Field("chunk_bytes", plan_.chunk_bytes)
          .Field("n_chunks", s.n_chunks)
          .Field("n_persist", s.n_persist)
          .Field("n_buffer", s.n_buffer)
          .Field("n_oversized_buffers", s.n_oversized_buffers)
          .Field("persistent_device_bytes", s.persistent_device_bytes)
          .Field("buffer_device_bytes", s.buffer_device_bytes)
          .Field("host_pinned_bytes", s.host_pinned_bytes)
          .Field("host_pageable_bytes", s.host_pageable_bytes);
      if (s.pinned_fallback) record.Field("pinned_fallback", s.pinned_fallback_reason);
    }
  }
  if (trainer_->chunk_manager() != nullptr && !loop_.address.empty()) {
    // The planner's per-rank figures are what this rank's chunk managers allocate (pinned and
    // pageable compared as one total: on the CPU pinned memory falls back to pageable). LoRA and
    // QLoRA: the frozen base's manager and the adapters' together ([LoRA managers]).
    int64_t host = 0, device_bytes = 0;
    for (ChunkManager* chunks : {trainer_->base_chunk_manager(), trainer_->chunk_manager()}) {
      if (chunks == nullptr) continue;
      const ChunkMemoryStats s = chunks->MemoryStats();
      host += s.host_pinned_bytes + s.host_pageable_bytes;
      device_bytes +=
          s.persistent_device_bytes + s.persistent_state_device_bytes + s.buffer_device_bytes;
    }
    const RankMemory& m = answer_.prediction.rank_memory;
    std::printf(
        "rank %d chunk memory (allocated / planned): host %lld / %lld bytes, device %lld / %lld "
        "bytes\n",
        dist_.rank, static_cast<long long>(host),
        static_cast<long long>(m.chunk_host_pinned_bytes + m.chunk_host_pageable_bytes),
        static_cast<long long>(device_bytes),
        static_cast<long long>(m.persistent_device_bytes + m.persistent_state_device_bytes +
                               m.buffer_device_bytes));
  }
}

absl::Status TrainSession::PrintRankFigures() {
  // Every rank's own steady peaks (the summary and the measurement are rank 0's): what a
  // per-rank plan is checked against.
  std::printf("rank %d steady peak: allocated %lld reserved %lld device_used %lld bytes\n",
              dist_.rank, static_cast<long long>(steady_allocated_),
              static_cast<long long>(steady_reserved_), static_cast<long long>(steady_device_));
  // LoRA: the frozen base's manager does the gathers ([Sharded frozen base]).
  ChunkManager* chunks = trainer_->base_chunk_manager() != nullptr ? trainer_->base_chunk_manager()
                                                                   : trainer_->chunk_manager();
  if (chunks != nullptr) {
    // [Collective timing] the chunk all-gathers of steps 2.. as the backend timed them, with
    // nccl-tests' bus bandwidth (output bytes / time x (W - 1) / W), comparable with
    // `memplan-agent bench --world-size W`'s all-gather figure.
    const ChunkUploadStats u = chunks->UploadStats();
    const double bus = AllGatherBusBytesPerSecond(static_cast<double>(u.gather_output_bytes),
                                                  u.gather_seconds, world_size_);
    std::printf(
        "rank %d chunk all-gathers (after step 1): %lld, %lld timed, %.1f MiB out, "
        "device %.4f s, bus bandwidth %.1f GB/s\n",
        dist_.rank, static_cast<long long>(u.gathers), static_cast<long long>(u.gathers_timed),
        static_cast<double>(u.gather_output_bytes) / (1 << 20), u.gather_seconds, bus / 1e9);
    if (group_ != nullptr) {
      ASSIGN_OR_RETURN(const std::optional<GatherBandwidth> across, CompareGatherTimes(*group_, u));
      if (across.has_value() && lead_) {
        std::printf(
            "chunk all-gathers across %d ranks (%lld gathers): bus bandwidth %.1f GB/s "
            "by the fastest rank of each (the transfer), %.1f GB/s by the slowest\n",
            world_size_, static_cast<long long>(across->gathers),
            across->fastest_bus_bytes_per_second / 1e9, across->slowest_bus_bytes_per_second / 1e9);
      }
    }
  }
  std::fflush(stdout);
  return absl::OkStatus();
}

absl::Status TrainSession::Summarize() {
  // The `done` record is written when it goes out of scope, after the `trained` line and the
  // report: it stays the run's last log line.
  auto summary = MEMPLAN_LOG(kInfo, "done");
  summary.Field("steps", trainer_->step())
      .Field("world_size", world_size_)
      .Field("mean_tokens_per_second", timed_steps_ > 0 ? world_size_ * tokens_per_second_sum_ /
                                                              static_cast<double>(timed_steps_)
                                                        : 0.0)
      .Field("peak_allocated_bytes", peak_allocated_)
      .Field("peak_reserved_bytes", peak_reserved_)
      .Field("load_peak_reserved_bytes", load_reserved_)
      .Field("steady_device_used_bytes", steady_device_);
  if (ActivationOffloader* offloader = trainer_->offloader()) {
    const ActivationOffloadStats s = offloader->Stats();
    summary.Field("activation_offloaded_bytes", s.offloaded_bytes)
        .Field("activation_host_peak_bytes", s.host_bytes_peak)
        .Field("activation_synchronous_fetches", s.synchronous_fetches);
  }
  std::printf("trained %lld steps\n", static_cast<long long>(trainer_->step()));
  if (client_ != nullptr && timed_steps_ > 0) {
    Measurement m;
    m.plan_id = answer_.plan_id;
    m.peak_allocated_bytes = steady_allocated_;
    m.peak_reserved_bytes = steady_reserved_;
    m.peak_device_bytes = steady_device_;
    m.load_peak_bytes = load_reserved_;
    m.step_seconds = seconds_sum_ / static_cast<double>(timed_steps_);
    if (config_.steps == 1) m.note = "single step: no warm-up excluded";
    RETURN_IF_ERROR(ReportToPlanner(*client_, answer_, m));
  }
  return absl::OkStatus();
}

void TrainSession::WriteTimelineOnExit() {
  // Finish() writes the timeline after the last step; a run that stopped before it still leaves
  // its curve, and a failure to write it must not hide the status that ended the run.
  if (timeline_ == nullptr || timeline_written_) return;
  if (absl::Status s = timeline_->WriteTsv(TimelinePath()); !s.ok()) {
    MEMPLAN_LOG(kError, "memory timeline not written").Field("error", s.ToString());
  }
}

}  // namespace memplan
