// TrainSession's plan (train_session.h): the plan file, the model spec, and the plan from the
// planner or the plan file with the flags; the rest of the session is train_session.cc.
#include "agent/train/train_session.h"

#include <cstdio>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "agent/client/plan_share.h"
#include "agent/client/planner_client.h"
#include "agent/client/planner_loop.h"
#include "agent/dist/process_group.h"
#include "agent/io/checkpoint.h"
#include "agent/io/model_files.h"
#include "agent/profiler/memory_probe.h"
#include "agent/train/device_setup.h"
#include "agent/train/vl_data.h"
#include "common/hf_config.h"
#include "common/log.h"
#include "common/presets.h"
#include "common/status.h"
#include "common/validate.h"

namespace memplan {

absl::Status TrainSession::ResolvePlan() {
  RETURN_IF_ERROR(ReadPlanFile());
  dtype_ = config_.dtype.value_or(device_.is_cuda() || optimizer_ == OptimizerKind::kAdamWBf16States
                                      ? DType::kBFloat16
                                      : DType::kFloat32);
  RETURN_IF_ERROR(ResolveModelSpec());
  model_options_.spec = spec_;
  model_options_.dtype = dtype_;
  model_options_.device = device_;
  model_options_.seed = config_.seed;
  model_options_.moe_experts = config_.moe_loop_experts ? MoeExperts::kLoop : MoeExperts::kGrouped;
  if (config_.lora.enabled()) {
    RETURN_IF_ERROR(ValidateLoraOptions(config_.lora, spec_, "--lora-"));
    model_options_.lora = config_.lora;
  }
  if (config_.osft.enabled()) {
    RETURN_IF_ERROR(ValidateOsftOptions(config_.osft, spec_));
    model_options_.osft = config_.osft;
  }
  // The plan: from the planner (--planner), or from the plan file and flags.
  if (!loop_.address.empty()) {
    RETURN_IF_ERROR(PlanFromPlanner());
  } else if (!config_.plan_file.empty()) {
    auto parsed = RunnablePlan(plan_file_);
    if (!parsed.ok()) {
      // FAILED_PRECONDITION for a DOES NOT FIT verdict (ReadPlanFile refused a malformed file).
      return absl::Status(parsed.status().code(), "--plan-file " + config_.plan_file + ": " +
                                                      std::string(parsed.status().message()));
    }
    file_plan_ = *std::move(parsed);
  }
  // With --planner the knob flags were fixed in its search: its plan carries them, and the block
  // counts it chose for the rest must not be rebuilt from the fixed ones alone.
  TrainConfig knobs = config_;
  if (!loop_.address.empty()) {
    knobs.n_ckpt.reset();
    knobs.n_swap.reset();
    knobs.n_hs_offload.reset();
  }
  ASSIGN_OR_RETURN(
      plan_, ResolveRunPlan(knobs, static_cast<int>(spec_.num_layers), file_plan_, world_size_));
  // [Chunked head] The head's row chunks: the plan's (checked by ResolveRunPlan), what it was
  // priced with; --plain's are kPlainHeadChunkLogitBytes.
  model_options_.head_chunk_logit_bytes = plan_.head_chunk_logit_bytes;
  // [Vision block checkpointing] asked for, or chosen by the planner for the plan to fit.
  model_options_.vision_checkpoint =
      config_.vision_checkpoint || (file_plan_.has_value() && file_plan_->vision_checkpoint);
  return ApplyMemoryLimit(config_, device_, loop_.address.empty() ? nullptr : &answer_);
}

// The plan file, and the optimizer and training method it was priced for. Optimizer:
// --optimizer, else the plan file's, else adamw; a plan file made for another optimizer is refused
// (its memory figures are not this run's).
absl::Status TrainSession::ReadPlanFile() {
  if (!config_.plan_file.empty()) {
    std::FILE* f = std::fopen(config_.plan_file.c_str(), "rb");
    if (f == nullptr) {
      return absl::NotFoundError("--plan-file " + config_.plan_file + ": cannot open");
    }
    std::string text;
    char buf[4096];
    for (size_t n; (n = std::fread(buf, 1, sizeof(buf), f)) > 0;) text.append(buf, n);
    std::fclose(f);
    auto parsed = PlanFileFromJson(text);
    if (!parsed.ok()) {
      return absl::InvalidArgumentError("--plan-file " + config_.plan_file + ": " +
                                        std::string(parsed.status().message()));
    }
    plan_file_ = *std::move(parsed);
  }
  ASSIGN_OR_RETURN(optimizer_, ResolveOptimizer(config_, plan_file_.optimizer));
  // A plan priced for another training method (full vs LoRA, rank, targets) is refused.
  return CheckPlanTraining(config_, plan_file_.training);
}

absl::Status TrainSession::ResolveModelSpec() {
  if (!config_.arch.empty()) {
    std::optional<ModelSpec> preset = FindModelPreset(config_.arch);
    if (!preset.has_value()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--arch ", config_.arch, " is not a preset; known: ", ModelPresetNames()));
    }
    spec_ = *preset;
  } else if (!config_.arch_file.empty()) {
    absl::StatusOr<ModelSpec> loaded = LoadHfConfigFile(config_.arch_file);
    if (!loaded.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--arch-file ", config_.arch_file, ": ", loaded.status().message()));
    }
    spec_ = *std::move(loaded);
  } else {
    ASSIGN_OR_RETURN(spec_, LoadHfConfigFile(config_.model_dir + "/config.json"));
    // The weights are found and their headers read before the model is allocated: a directory
    // with an 8B config.json and no weights must fail here, not after drawing 8B random values
    // (killed by the OOM killer before it got to the weights).
    absl::StatusOr<std::unique_ptr<io::HfCheckpoint>> opened =
        io::HfCheckpoint::Open(config_.model_dir);
    if (!opened.ok()) {
      return absl::Status(opened.status().code(),
                          absl::StrCat("--model ", opened.status().message()));
    }
    checkpoint_ = *std::move(opened);
  }
  RETURN_IF_ERROR(CheckVlData(config_, spec_));
  RETURN_IF_ERROR(CheckSequenceLength(spec_, config_.seq));
  return CheckSeqWithinPositions(spec_, config_.seq);
}

absl::Status TrainSession::PlanFromPlanner() {
  // [Fixed knobs with --planner] The other plan knobs go to the planner as fixed knobs: it
  // searches the rest, or answers why no plan with them fits.
  if (config_.accumulate_offloaded_grads_on_device) {
    return absl::InvalidArgumentError(
        "--accumulate-offloaded-grads device: the planner does not price it (every offloaded "
        "chunk's fp32 grads on the device until the last micro-batch); drop it with --planner");
  }
  if (!config_.plan_file.empty() || config_.block_modes || config_.plain) {
    return absl::InvalidArgumentError(
        "--planner decides the plan: drop --plan-file, --plain and --block-modes (--chunk-mib, "
        "--n-persist, --n-buffer, --n-ckpt, --n-swap, --n-hs-offload, --host-memory, "
        "--persistent-state and --persistent-params are passed to the planner as fixed knobs)");
  }
  if (loop_.profile && config_.osft.enabled()) {
    return absl::InvalidArgumentError(
        "--profile: profiling an OSFT run is not built yet; drop --profile (the planner plans "
        "OSFT from the architecture)");
  }
  if (loop_.profile && config_.lora.enabled()) {
    // The profiler measures a full fine-tune's trace (every parameter trains); submitted for a
    // LoRA run it would price the wrong method.
    return absl::InvalidArgumentError(
        "--profile: profiling a LoRA run is not built yet; drop --profile (the planner plans "
        "LoRA from the architecture)");
  }
  PlannerClientOptions client_options;
  client_options.retries = loop_.retries;
  client_options.security = loop_.security;
  ASSIGN_OR_RETURN(client_, PlannerClient::Create(loop_.address, client_options));
  // Sharded: rank 0 asks, every rank trains under its answer (one stored plan per job).
  absl::StatusOr<PlanAnswer> asked = absl::UnavailableError("not asked: rank 0 asks");
  if (lead_) {
    absl::StatusOr<PlanQuery> query = PlannerQuery();
    asked = query.ok() ? AskPlanner(*client_, loop_, *std::move(query), model_options_)
                       : absl::StatusOr<PlanAnswer>(query.status());
  }
  if (group_ != nullptr) asked = ShareRankZeroAnswer(*group_, asked);
  ASSIGN_OR_RETURN(answer_, std::move(asked));
  if (!lead_) {
    std::printf("plan_id %s (rank 0's)\nplan: %s\n", answer_.plan_id.c_str(),
                PlanLine(answer_.plan).c_str());
  }
  file_plan_ = answer_.plan;
  // The profiling pass ran the whole model unmanaged; its cached segments are not the plan's.
  PrintDeviceMemory(device_, "after profiling");
  ReleaseCachedAndResetPeaks(device_);
  PrintDeviceMemory(device_, "after releasing the profiler's cache");
  if (device_.is_cpu()) {
    // The planner plans for a GPU; on the CPU the figures are only comparable in shape.
    std::printf("note: cpu run: the prediction is for %s, not this CPU%s\n",
                loop_.hardware_profile_id.empty()
                    ? loop_.hardware_preset.c_str()
                    : ("profile " + loop_.hardware_profile_id).c_str(),
                file_plan_->host_memory == HostMemoryKind::kPinned
                    ? "; pinned host memory is unavailable, chunks stay pageable"
                    : "");
  }
  return absl::OkStatus();
}

absl::StatusOr<PlanQuery> TrainSession::PlannerQuery() const {
  PlanQuery query;
  // The architecture by its preset name when it has one; AskPlanner puts a profiled trace in its
  // place.
  if (!config_.arch.empty()) {
    query.arch_preset = config_.arch;
  } else {
    query.arch = spec_;
  }
  query.workload.micro_batch = config_.batch;
  query.workload.seq_len = config_.seq;
  query.workload.grad_accum = config_.grad_accum;
  query.workload.grad_clipping = config_.clip > 0;
  query.workload.world_size = world_size_;
  // The ranks of one node share its RAM: the planner prices each rank's shards against the
  // node's memory divided by them.
  query.workload.local_world_size = dist_.local_world_size;
  // A vision-language run's images: synthetic ones as given, a sample file's by its sample with
  // the most patches ([Largest VL sample], agent/train/vl_data.h). With --profile the profiling
  // pass runs these images too.
  ASSIGN_OR_RETURN(const VlWorkloadImages images, DescribeVlImages(config_, spec_));
  query.workload.images_per_sample = images.images_per_sample;
  query.workload.image_height = images.image_height;
  query.workload.image_width = images.image_width;
  query.workload.vision_checkpoint = config_.vision_checkpoint;
  if (images.images_per_sample > 0) {
    LogRecord sent(LogLevel::kInfo, "vision-language workload sent to the planner");
    sent.Field("images_per_sample", images.images_per_sample)
        .Field("image_size", absl::StrCat(images.image_height, "x", images.image_width));
    if (images.sample >= 0) {
      sent.Field("source", "--data-vl " + config_.vl_data_file)
          .Field("largest_sample", images.sample)
          .Field("largest_sample_patches", images.sample_patches)
          .Field("described_patches", images.described_patches);
    } else {
      sent.Field("source", std::string("--synthetic-images"));
    }
  }
  query.param_dtype = dtype_;
  // With --planner there is no plan file: the flag (validated by ParseTrainArgs) or adamw.
  query.optimizer = config_.optimizer.value_or(OptimizerKind::kAdamW);
  query.training = LoraTrainingMethod(model_options_.lora);
  if (config_.osft.enabled()) {
    // [OSFT plans] (planner/core/osft_plan.h): the planner prices the unmanaged run and answers
    // only the blocks' modes.
    query.training.kind = TrainingKind::kOsft;
    query.training.osft_rank_ratio = config_.osft.rank_ratio;
    query.training.osft_target_modules = config_.osft.targets;
  }
  // [Fixed knobs with --planner]
  query.fixed = PlannerFixedKnobs(config_);
  return query;
}

}  // namespace memplan
