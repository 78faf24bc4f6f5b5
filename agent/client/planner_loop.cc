#include "agent/client/planner_loop.h"

#include <c10/cuda/CUDACachingAllocator.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "agent/client/planner_client.h"
#include "agent/core/seconds_since.h"
#include "agent/model/llama_model.h"
#include "agent/profiler/device_memory.h"
#include "agent/profiler/model_profiler.h"
#include "agent/profiler/on_demand_profiler.h"
#include "common/param_shapes.h"
#include "common/relative_error.h"
#include "common/status.h"

namespace memplan {

std::string PlanLine(const ResidencyPlan& p) {
  std::vector<std::string> modes;
  for (BlockMode m : p.block_modes) modes.emplace_back(BlockModeName(m));
  return absl::StrFormat(
      "chunk_bytes=%d n_chunks=%d n_persist=%d n_buffer=%d n_swap=%d n_ckpt=%d n_hs_offload=%d "
      "host_memory=%s block_modes=%s%s%s%s",
      p.chunk_bytes, p.n_chunks, p.n_persist, p.n_buffer, p.n_swap, p.n_checkpoint, p.n_hs_offload,
      std::string(HostMemoryKindName(p.host_memory)), absl::StrJoin(modes, ","),
      p.world_size > 1
          ? (p.shard_persistent_params
                 // LoRA: the frozen base's parameters alone, the adapters' state replicated.
                 ? (p.shard_persistent_state
                        ? " persistent_state=sharded persistent_params=sharded"
                        : " persistent_state=replicated persistent_params=sharded")
                 : p.shard_persistent_state ? " persistent_state=sharded"
                                            : " persistent_state=replicated")
          : "",
      p.vision_checkpoint ? " vision_checkpoint=1" : "",
      // [Wide head chunks]: shown where the plan is not at the default.
      p.head_chunk_logit_bytes > 0
          ? absl::StrCat(" head_chunk_logit_bytes=", p.head_chunk_logit_bytes)
          : std::string());
}

absl::StatusOr<std::string> ProfileAndSubmit(PlannerClient& client,
                                             const LlamaModelOptions& model_options,
                                             const Workload& workload,
                                             const std::string& hardware_name) {
  // The unmanaged copy needs the parameters and their gradients on the device next to the
  // activations; when those two alone take more than 80 % of the free memory, the parameters
  // stay in host memory and come to the device one group at a time (on-demand profiling).
  LlamaModelOptions options = model_options;
  options.param_device.reset();
  int64_t param_bytes = 0;
  for (const ParamShape& p : HfParamShapes(options.spec)) {
    int64_t numel = 1;
    for (int64_t d : p.shape) numel *= d;
    param_bytes += numel * DTypeBytes(options.dtype);
  }
  bool on_demand = false;
  if (const std::optional<DeviceMemInfo> info = ReadDeviceMemInfo(options.device)) {
    on_demand = 2 * param_bytes > static_cast<int64_t>(0.8 * static_cast<double>(info->free_bytes));
  }
  if (on_demand) options.param_device = torch::Device(torch::kCPU);
  ASSIGN_OR_RETURN(std::unique_ptr<LlamaModel> model, LlamaModel::Create(options));
  ProfilerOptions profiler;
  // Only what the profile measures: the trace records the workload, and the world size of a
  // profiled run is always one (--profile is refused on several ranks).
  profiler.workload.micro_batch = workload.micro_batch;
  profiler.workload.seq_len = workload.seq_len;
  profiler.workload.grad_accum = workload.grad_accum;
  profiler.workload.grad_clipping = workload.grad_clipping;
  // [Profiled images] (agent/profiler/model_profiler.cc): a vision-language model's pass runs
  // the workload's images, and the trace records them.
  profiler.workload.images_per_sample = workload.images_per_sample;
  profiler.workload.image_height = workload.image_height;
  profiler.workload.image_width = workload.image_width;
  profiler.hardware_name = hardware_name;
  // The profiling batch is drawn from the run's seed, the one the model is drawn from.
  profiler.seed = model_options.seed;
  const auto start = std::chrono::steady_clock::now();
  ProfileResult result;
  if (!on_demand) {
    absl::StatusOr<ProfileResult> resident = ProfileModel(*model, profiler);
    if (resident.ok()) {
      result = *std::move(resident);
    } else if (absl::IsResourceExhausted(resident.status()) && options.device.is_cuda()) {
      // The estimate above counts parameters and gradients only; the activations did not fit
      // beside them. The parameters go to host memory and the profile is taken again on demand.
      std::printf("resident profiling ran out of device memory; profiling on demand\n");
      model.reset();
      c10::cuda::CUDACachingAllocator::emptyCache();
      options.param_device = torch::Device(torch::kCPU);
      ASSIGN_OR_RETURN(model, LlamaModel::Create(options));
      on_demand = true;
    } else {
      return resident.status();
    }
  }
  if (on_demand) {
    ASSIGN_OR_RETURN(OnDemandProfile od, ProfileModelOnDemand(*model, profiler, OnDemandOptions{}));
    result = std::move(od.result);
  }
  const double seconds = SecondsSince(start);
  const Workload& traced = result.trace.workload;
  std::printf(
      "profiled%s in %.2f s (%d passes; warm-up %.3f s, timed pass %.3f s), step peak %.2f MiB, "
      "params %.2f MiB, memory from %s%s\n",
      on_demand ? " on demand" : "", seconds, result.passes, result.warmup_seconds,
      result.step_seconds, MiB(result.step_peak_bytes), MiB(result.param_bytes),
      result.memory_source.c_str(),
      traced.images_per_sample > 0
          ? absl::StrFormat(", with %d images of %dx%d per sample", traced.images_per_sample,
                            traced.image_height, traced.image_width)
                .c_str()
          : "");
  ASSIGN_OR_RETURN(std::string trace_id, client.SubmitTrace(result.trace));
  std::printf("trace_id %s\n", trace_id.c_str());
  return trace_id;
}

absl::StatusOr<PlanAnswer> AskPlanner(PlannerClient& client, const PlannerLoopOptions& loop,
                                      PlanQuery query, const LlamaModelOptions& model_options) {
  const std::string hardware_name =
      loop.hardware_profile_id.empty() ? loop.hardware_preset : loop.hardware_profile_id;
  if (loop.hardware_profile_id.empty()) {
    query.hardware_preset = loop.hardware_preset;
  } else {
    query.hardware_profile_id = loop.hardware_profile_id;
  }
  absl::StatusOr<std::string> trace_id;
  if (loop.profile) {
    trace_id = ProfileAndSubmit(client, model_options, query.workload, hardware_name);
    // A workload whose activations do not fit the card even on demand cannot be profiled; the
    // planner can still plan it from the architecture (the analytic trace), and says so.
    if (!trace_id.ok() && !absl::IsResourceExhausted(trace_id.status())) return trace_id.status();
    if (!trace_id.ok()) {
      std::printf("profiling skipped (%s); planning from the architecture instead\n",
                  std::string(trace_id.status().message()).c_str());
    }
  }
  if (trace_id.ok()) {
    // The query names exactly one model source: the measured trace replaces the architecture.
    query.arch.reset();
    query.arch_preset.clear();
    query.trace_id = *trace_id;
  }
  query.safety_margin = loop.safety_margin;
  ASSIGN_OR_RETURN(PlanAnswer answer, client.Plan(query));
  std::printf("plan_id %s\n", answer.plan_id.c_str());
  std::printf(
      "planner %s: fits=%s trace=%s analytic_trace=%s capacity %.2f MiB "
      "(%lld plans in %.3f s)\n",
      client.address().c_str(), answer.fits ? "true" : "false",
      answer.trace_id.empty() ? "(analytic)" : answer.trace_id.c_str(),
      answer.analytic_trace ? "true" : "false", MiB(answer.capacity_bytes),
      static_cast<long long>(answer.plans_evaluated), answer.search_seconds);
  if (!answer.fits) {
    return absl::FailedPreconditionError(
        absl::StrCat("the planner found no plan that fits: ", answer.reason));
  }
  std::printf("plan: %s\n", PlanLine(answer.plan).c_str());
  std::printf("predicted: peak %.2f MiB, iteration %.4f s, %.0f tokens/s\n",
              MiB(answer.prediction.peak_bytes), answer.prediction.iteration_seconds,
              answer.prediction.tokens_per_second);
  return answer;
}

absl::Status ReportToPlanner(PlannerClient& client, const PlanAnswer& answer, Measurement m) {
  m.measured_at_unix_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                              std::chrono::system_clock::now().time_since_epoch())
                              .count();
  std::printf(
      "measured: peak allocated %.2f MiB, peak reserved %.2f MiB, device used %.2f MiB, "
      "load peak %.2f MiB, step %.4f s%s\n",
      MiB(m.peak_allocated_bytes), MiB(m.peak_reserved_bytes), MiB(m.peak_device_bytes),
      MiB(m.load_peak_bytes), m.step_seconds, m.oom ? ", OOM" : "");
  const double predicted_seconds = answer.prediction.iteration_seconds;
  std::printf(
      "predicted vs measured: peak %.2f / %.2f MiB, load peak %.2f / %.2f MiB, step %.4f / "
      "%.4f s\n",
      MiB(answer.prediction.peak_bytes), MiB(m.peak_reserved_bytes),
      MiB(answer.prediction.load_peak_bytes), MiB(m.load_peak_bytes), predicted_seconds,
      m.step_seconds);
  if (m.peak_reserved_bytes < 1) {
    if (!m.note.empty()) m.note += "; ";
    m.note += "cpu: no device peak";
    std::printf("report skipped: %s (the planner requires peak_reserved_bytes >= 1)\n",
                m.note.c_str());
    return absl::OkStatus();
  }
  ASSIGN_OR_RETURN(MeasurementReceipt receipt, client.ReportMeasurement(m));
  const std::string error =
      receipt.relative_error.has_value()
          ? absl::StrFormat("%+.2f%% %s", *receipt.relative_error * 100.0,
                            kRelativeErrorDefinition)
          : std::string("none (out of memory)");
  std::printf(
      "reported: measurement_id %s, relative error %s, calibration samples %d "
      "(fragmentation %.3f, residual %.2f MiB)\n",
      receipt.measurement_id.c_str(), error.c_str(), receipt.calibration.samples,
      receipt.calibration.fragmentation_factor, MiB(receipt.calibration.residual_bytes));
  if (!receipt.quarantine_reason.empty()) {
    std::printf("quarantined by the planner (stored, not applied to calibration): %s\n",
                receipt.quarantine_reason.c_str());
  }
  return absl::OkStatus();
}

}  // namespace memplan
