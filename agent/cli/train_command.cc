#include "agent/cli/train_command.h"

#include <ATen/Parallel.h>
#include <c10/core/AllocatorConfig.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "agent/chunks/chunk_manager.h"
#include "agent/cli/plan_share.h"
#include "agent/client/planner_client.h"
#include "agent/dist/process_group.h"
#include "agent/io/checkpoint.h"
#include "agent/io/hf_checkpoint.h"
#include "agent/io/peft_adapter.h"
#include "agent/io/random_access_file.h"
#include "agent/io/safetensors_torch.h"
#include "agent/io/synthetic_tokens.h"
#include "agent/io/token_batcher.h"
#include "agent/io/token_file.h"
#include "agent/metrics/agent_metrics.h"
#include "agent/profiler/memory_probe.h"
#include "agent/profiler/memory_timeline.h"
#include "agent/profiler/model_profiler.h"
#include "agent/profiler/on_demand_profiler.h"
#include "agent/train/trainer.h"
#include "common/flag_arg.h"
#include "common/hf_config.h"
#include "common/log.h"
#include "common/param_shapes.h"
#include "common/presets.h"
#include "common/safety_margin.h"
#include "common/status.h"
#include "common/validate.h"

namespace memplan {
namespace {

// The synthetic stream is built in memory; beyond this many tokens the batcher wraps around.
constexpr int64_t kMaxSyntheticTokens = int64_t{1} << 24;

absl::StatusOr<torch::Device> ResolveDevice(const std::string& name) {
  if (name == "auto") return torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  try {
    torch::Device device(name);
    if (device.is_cuda() && !torch::cuda::is_available()) {
      return absl::FailedPreconditionError("--device " + name + ": CUDA is not available");
    }
    return device;
  } catch (const c10::Error& e) {
    return absl::InvalidArgumentError("--device " + name + ": " + e.what_without_backtrace());
  }
}

std::string ModesString(const std::vector<BlockMode>& modes) {
  std::vector<std::string> names;
  for (BlockMode m : modes) names.emplace_back(BlockModeName(m));
  return absl::StrJoin(names, ",");
}

absl::StatusOr<std::shared_ptr<const io::TokenFile>> OpenData(const TrainConfig& c,
                                                              const ModelSpec& spec,
                                                              int world_size) {
  io::TokenFileOptions options;
  options.raw_token_bytes = c.raw_token_bytes;
  options.vocab_size = spec.vocab_size;
  if (!c.data_file.empty()) {
    ASSIGN_OR_RETURN(std::unique_ptr<io::TokenFile> file,
                     io::TokenFile::Open(c.data_file, options));
    // An id beyond the vocabulary would otherwise surface only at the batch that reads it, after
    // steps and checkpoints: the whole file is scanned once, before the first step.
    RETURN_IF_ERROR(file->CheckAllIds());
    return std::shared_ptr<const io::TokenFile>(std::move(file));
  }
  io::SyntheticTokenOptions synthetic;
  const int64_t wanted = c.steps * c.grad_accum * world_size * c.batch * c.seq + c.seq + 1;
  synthetic.num_tokens = std::clamp<int64_t>(wanted, c.seq + 1, kMaxSyntheticTokens);
  synthetic.vocab_size = spec.vocab_size;
  synthetic.seed = c.seed;
  synthetic.noise = c.synthetic_noise;
  ASSIGN_OR_RETURN(std::vector<uint32_t> tokens, io::MakeSyntheticTokens(synthetic));
  ASSIGN_OR_RETURN(std::string bytes, io::EncodeTokenFile(tokens, 4, spec.vocab_size));
  options.raw_token_bytes = 0;
  ASSIGN_OR_RETURN(
      std::unique_ptr<io::TokenFile> file,
      io::TokenFile::Open(io::NewMemoryFile(std::move(bytes), "<synthetic>"), options));
  return std::shared_ptr<const io::TokenFile>(std::move(file));
}

absl::StatusOr<MicroBatch> NextBatch(const io::TokenBatcher& batcher, int64_t position) {
  ASSIGN_OR_RETURN(io::TokenBatch batch, batcher.Batch(position));
  MicroBatch out;
  const std::vector<int64_t> sizes = {batch.batch_size, batch.seq_len};
  out.input_ids = torch::from_blob(batch.input_ids.data(), sizes, torch::kLong).clone();
  out.labels = torch::from_blob(batch.labels.data(), sizes, torch::kLong).clone();
  return out;
}

constexpr char kDefaultHardwarePreset[] = "h100-80gb";

bool IsOutOfMemory(const absl::Status& status) {
  // The trainer turns every c10::Error (OutOfMemoryError included) into a status; the CUDA
  // caching allocator's message is the reliable marker.
  return absl::StrContains(status.message(), "out of memory");
}

double MiB(int64_t bytes) { return static_cast<double>(bytes) / (1024.0 * 1024.0); }

// Peaks of the CUDA caching allocator since the last reset (0 on CPU). After an OOM the trainer's
// step stats are lost, so the allocator is asked directly.
void DevicePeaks(const torch::Device& device, int64_t* allocated, int64_t* reserved) {
  *allocated = 0;
  *reserved = 0;
  if (!device.is_cuda() || !torch::cuda::is_available()) return;
  const AllocatorStats stats = ReadAllocatorStats(device);
  *allocated = stats.allocated.peak;
  *reserved = stats.reserved.peak;
}

// Device-level used bytes (every process and the CUDA context included), 0 on CPU.
int64_t DeviceUsedBytes(const torch::Device& device) {
  if (!device.is_cuda()) return 0;
  c10::cuda::CUDAGuard guard(CudaIndex(device));
  size_t free_bytes = 0, total_bytes = 0;
  if (cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess) return 0;
  return static_cast<int64_t>(total_bytes - free_bytes);
}

// Hands cached-but-free device memory back, so that what happened before (profiling, model
// loading) does not sit in the pool the plan is measured by, and starts new peaks.
void ReleaseCachedAndResetPeaks(const torch::Device& device) {
  if (!device.is_cuda()) return;
  torch::cuda::synchronize(CudaIndex(device));
  c10::cuda::CUDACachingAllocator::emptyCache();
  c10::cuda::CUDACachingAllocator::resetPeakStats(CudaIndex(device));
}

// This process's resident set now and at its peak (VmRSS, VmHWM of /proc/self/status), bytes;
// zeros where the file is unreadable.
struct HostMemory {
  int64_t rss = 0;
  int64_t peak_rss = 0;
};
HostMemory ReadHostMemory() {
  HostMemory m;
  std::FILE* f = std::fopen("/proc/self/status", "r");
  if (f == nullptr) return m;
  char line[256];
  while (std::fgets(line, sizeof line, f) != nullptr) {
    long long kib = 0;
    if (std::sscanf(line, "VmRSS: %lld kB", &kib) == 1) m.rss = kib * 1024;
    if (std::sscanf(line, "VmHWM: %lld kB", &kib) == 1) m.peak_rss = kib * 1024;
  }
  std::fclose(f);
  return m;
}

// One line per setup stage: where device memory goes before the first step (CUDA only).
void PrintDeviceMemory(const torch::Device& device, const char* stage) {
  if (!device.is_cuda()) return;
  const AllocatorStats stats = ReadAllocatorStats(device);
  std::printf(
      "device memory %s: allocated %.0f MiB (peak %.0f), reserved %.0f MiB (peak %.0f), "
      "device used %.0f MiB\n",
      stage, MiB(stats.allocated.current), MiB(stats.allocated.peak), MiB(stats.reserved.current),
      MiB(stats.reserved.peak), MiB(DeviceUsedBytes(device)));
}

// PYTORCH_CUDA_ALLOC_CONF syntax; see TrainConfig::allocator_conf for the precedence.
void ConfigureAllocator(const TrainConfig& c, const torch::Device& device) {
  if (!device.is_cuda()) return;
  std::string conf;
  if (c.allocator_conf.has_value()) {
    conf = *c.allocator_conf;
  } else if (std::getenv("PYTORCH_CUDA_ALLOC_CONF") == nullptr) {
    conf = "expandable_segments:True";
  }
  if (!conf.empty()) c10::CachingAllocator::setAllocatorSettings(conf);
  // Initialise the context and the caching allocator now: their statistics are read before the
  // first tensor reaches the device when the model is built in host memory.
  (void)torch::empty({1}, torch::TensorOptions().device(device));
  MEMPLAN_LOG(kInfo, "cuda allocator")
      .Field("settings", conf.empty() ? std::string("(pytorch default or environment)") : conf);
}

// --memory-limit: caps the caching allocator's reserved bytes (setMemoryFraction of the device's
// total), so that what the run holds is what the plan said; at the cap the allocator frees its
// cached blocks (on a device synchronisation) and retries before it fails. Called once the plan is
// known, before the model reaches the device.
absl::Status ApplyMemoryLimit(const TrainConfig& c, const torch::Device& device,
                              const PlanAnswer* answer) {
  if (c.memory_limit_bytes == 0) return absl::OkStatus();
  int64_t limit = c.memory_limit_bytes;
  if (limit < 0) {
    if (answer == nullptr) {
      return absl::InvalidArgumentError(
          "--memory-limit plan: needs --planner (the predicted reserved peak comes from it); give "
          "a size in MiB instead");
    }
    limit = answer->prediction.peak_bytes - answer->prediction.breakdown.cuda_context_bytes;
  }
  if (!device.is_cuda()) {
    std::printf("note: --memory-limit applies to CUDA devices only; ignored on %s\n",
                device.str().c_str());
    return absl::OkStatus();
  }
  size_t free_bytes = 0, total_bytes = 0;
  {
    c10::cuda::CUDAGuard guard(CudaIndex(device));
    C10_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  }
  if (limit <= 0 || limit > static_cast<int64_t>(total_bytes)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--memory-limit: %.0f MiB is outside 1 MiB .. the device's %.0f MiB", MiB(limit),
        MiB(static_cast<int64_t>(total_bytes))));
  }
  c10::cuda::CUDACachingAllocator::setMemoryFraction(
      static_cast<double>(limit) / static_cast<double>(total_bytes), CudaIndex(device));
  std::printf("allocator limit: %.0f MiB reserved%s\n", MiB(limit),
              c.memory_limit_bytes < 0 ? " (the plan's predicted reserved peak)" : "");
  return absl::OkStatus();
}

std::string PlanLine(const ResidencyPlan& p) {
  std::vector<std::string> modes;
  for (BlockMode m : p.block_modes) modes.emplace_back(BlockModeName(m));
  return absl::StrFormat(
      "chunk_bytes=%d n_chunks=%d n_persist=%d n_buffer=%d n_swap=%d n_ckpt=%d n_hs_offload=%d "
      "host_memory=%s block_modes=%s%s",
      p.chunk_bytes, p.n_chunks, p.n_persist, p.n_buffer, p.n_swap, p.n_checkpoint, p.n_hs_offload,
      std::string(HostMemoryKindName(p.host_memory)), absl::StrJoin(modes, ","),
      p.world_size > 1 ? (p.shard_persistent_params  ? " persistent_state=sharded persistent_params=sharded"
                          : p.shard_persistent_state ? " persistent_state=sharded"
                                                     : " persistent_state=replicated")
                       : "");
}

// Profiles a throw-away copy of the model (all parameters on the device, every block NONE and
// then CKPT) at the run's workload and stores the trace in the planner; returns its id.
absl::StatusOr<std::string> ProfileAndSubmit(PlannerClient& client, const TrainConfig& c,
                                             const LlamaModelOptions& model_options,
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
  if (options.device.is_cuda()) {
    c10::cuda::CUDAGuard guard(CudaIndex(options.device));
    size_t free_bytes = 0, total_bytes = 0;
    if (cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess) {
      on_demand = 2 * param_bytes > static_cast<int64_t>(0.8 * static_cast<double>(free_bytes));
    }
  }
  if (on_demand) options.param_device = torch::Device(torch::kCPU);
  ASSIGN_OR_RETURN(std::unique_ptr<LlamaModel> model, LlamaModel::Create(options));
  ProfilerOptions profiler;
  profiler.workload.micro_batch = c.batch;
  profiler.workload.seq_len = c.seq;
  profiler.workload.grad_accum = c.grad_accum;
  profiler.workload.grad_clipping = c.clip > 0;
  profiler.hardware_name = hardware_name;
  profiler.seed = c.seed;
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
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf(
      "profiled%s in %.2f s (%d passes; warm-up %.3f s, timed pass %.3f s), step peak %.2f MiB, "
      "params %.2f MiB, memory from %s\n",
      on_demand ? " on demand" : "", seconds, result.passes, result.warmup_seconds,
      result.step_seconds,
      MiB(result.step_peak_bytes), MiB(result.param_bytes), result.memory_source.c_str());
  ASSIGN_OR_RETURN(std::string trace_id, client.SubmitTrace(result.trace));
  std::printf("trace_id %s\n", trace_id.c_str());
  return trace_id;
}

absl::StatusOr<PlanAnswer> AskPlanner(PlannerClient& client, const TrainConfig& c,
                                      const PlannerLoopOptions& loop, const ModelSpec& spec,
                                      DType dtype, const LlamaModelOptions& model_options,
                                      int world_size, int local_world_size) {
  PlanQuery query;
  const std::string hardware_name =
      loop.hardware_profile_id.empty() ? loop.hardware_preset : loop.hardware_profile_id;
  if (loop.hardware_profile_id.empty()) {
    query.hardware_preset = loop.hardware_preset;
  } else {
    query.hardware_profile_id = loop.hardware_profile_id;
  }
  absl::StatusOr<std::string> trace_id;
  if (loop.profile) {
    trace_id = ProfileAndSubmit(client, c, model_options, hardware_name);
    // A workload whose activations do not fit the card even on demand cannot be profiled; the
    // planner can still plan it from the architecture (the analytic trace), and says so.
    if (!trace_id.ok() && !absl::IsResourceExhausted(trace_id.status())) return trace_id.status();
    if (!trace_id.ok()) {
      std::printf("profiling skipped (%s); planning from the architecture instead\n",
                  std::string(trace_id.status().message()).c_str());
    }
  }
  if (trace_id.ok()) {
    query.trace_id = *trace_id;
  } else if (!c.arch.empty()) {
    query.arch_preset = c.arch;
  } else {
    query.arch = spec;
  }
  query.workload.micro_batch = c.batch;
  query.workload.seq_len = c.seq;
  query.workload.grad_accum = c.grad_accum;
  query.workload.grad_clipping = c.clip > 0;
  query.workload.world_size = world_size;
  // The ranks of one node share its RAM: the planner prices each rank's shards against the
  // node's memory divided by them.
  query.workload.local_world_size = local_world_size;
  query.param_dtype = dtype;
  // With --planner there is no plan file: the flag (validated by ParseTrainArgs) or adamw.
  query.optimizer = c.optimizer.value_or(OptimizerKind::kAdamW);
  query.training = LoraTrainingMethod(model_options.lora);
  query.safety_margin = loop.safety_margin;
  // [Fixed knobs with --planner]
  query.fixed = PlannerFixedKnobs(c);
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

// Prints predicted vs measured and reports the measurement unless it has no device peak (CPU):
// the planner refuses peak_reserved_bytes < 1, and a zero would poison its calibration.
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
  std::printf(
      "reported: measurement_id %s, relative error %+.2f%%, calibration samples %d "
      "(fragmentation %.3f, residual %.2f MiB)\n",
      receipt.measurement_id.c_str(), receipt.relative_error * 100.0, receipt.calibration.samples,
      receipt.calibration.fragmentation_factor, MiB(receipt.calibration.residual_bytes));
  if (!receipt.quarantine_reason.empty()) {
    std::printf("quarantined by the planner (stored, not applied to calibration): %s\n",
                receipt.quarantine_reason.c_str());
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<PlannerLoopOptions> TakePlannerFlags(std::vector<std::string>* args) {
  PlannerLoopOptions loop;
  RETURN_IF_ERROR(TakeChannelSecurityFlags(args, &loop.security));
  std::vector<std::string> rest;
  bool hardware_given = false;
  for (size_t i = 0; i < args->size(); ++i) {
    const std::string& arg = (*args)[i];
    auto [name, value] = SplitFlagArg(arg);
    if (name == "--profile") {
      if (value.has_value()) return absl::InvalidArgumentError("--profile takes no value");
      loop.profile = true;
      continue;
    }
    if (name != "--planner" && name != "--hardware" && name != "--hardware-profile-id" &&
        name != "--planner-retries" && name != "--safety-margin") {
      rest.push_back(arg);
      continue;
    }
    if (!value.has_value()) {
      if (i + 1 >= args->size()) return absl::InvalidArgumentError(name + " needs a value");
      value = (*args)[++i];
    }
    if (name == "--planner") {
      loop.address = *value;
    } else if (name == "--hardware") {
      loop.hardware_preset = *value;
      hardware_given = true;
    } else if (name == "--hardware-profile-id") {
      loop.hardware_profile_id = *value;
      hardware_given = true;
    } else if (name == "--planner-retries") {
      if (!absl::SimpleAtoi(*value, &loop.retries) || loop.retries < 0 || loop.retries > 100) {
        return absl::InvalidArgumentError("--planner-retries must be an integer in [0, 100]");
      }
    } else {
      ASSIGN_OR_RETURN(loop.safety_margin, ParseSafetyMarginFlag(name, *value));
    }
  }
  if (loop.address.empty() &&
      (hardware_given || loop.profile || HasChannelSecurity(loop.security))) {
    return absl::InvalidArgumentError(
        "--hardware, --hardware-profile-id, --profile, --tls-* and --auth-token-file need "
        "--planner ADDR");
  }
  if (!loop.hardware_preset.empty() && !loop.hardware_profile_id.empty()) {
    return absl::InvalidArgumentError("give at most one of --hardware or --hardware-profile-id");
  }
  if (!loop.address.empty() && loop.hardware_profile_id.empty() && loop.hardware_preset.empty()) {
    loop.hardware_preset = kDefaultHardwarePreset;
  }
  *args = std::move(rest);
  return loop;
}

std::string PlannerFlagsUsage() {
  return absl::StrCat(R"(
planner flags (closing the loop):
  --planner ADDR              ask the planner at ADDR for the plan, apply it, train, and report
                              the steady-state measurement; plan knob flags (--chunk-mib,
                              --n-persist, --n-buffer, --n-ckpt, --n-swap, --n-hs-offload,
                              --host-memory, --persistent-state, --persistent-params) are
                              fixed in its search
                              (--plan-file, --block-modes and --plain refused)
  --hardware PRESET           the card to plan for (default )",
                      kDefaultHardwarePreset, R"()
  --hardware-profile-id ID    a profile stored by `memplan-agent bench --planner ADDR`
  --profile                   profile the model at this workload first and plan from that trace
  --planner-retries N         retries on UNAVAILABLE with backoff (default 4)
  --safety-margin F           fraction of the card kept free, 0 to 0.5 (0 or unset: the
                              planner's default, 0.05)
)",
                      ChannelSecurityUsage());
}

// What world size > 1 does not run yet, refused before anything is built.
absl::Status CheckDistributedFlags(const TrainConfig& c, const PlannerLoopOptions& loop,
                                   int world_size) {
  if (world_size == 1) return absl::OkStatus();
  const std::string why =
      absl::StrCat(" is not supported with world size ", world_size, " (WORLD_SIZE) yet");
  if (!c.memory_timeline.empty()) return absl::UnimplementedError("--memory-timeline" + why);
  if (loop.profile) return absl::UnimplementedError("--profile" + why);
  return absl::OkStatus();
}

absl::Status RunTrain(const TrainConfig& c, const PlannerLoopOptions& loop,
                      const DistOptions& dist_in) {
  RETURN_IF_ERROR(CheckDistributedFlags(c, loop, dist_in.world_size));
  ASSIGN_OR_RETURN(torch::Device device, ResolveDevice(c.device));
  // One rank per GPU: LOCAL_RANK picks it unless --device names one.
  if (dist_in.world_size > 1 && device.is_cuda() && !device.has_index()) {
    device = torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(dist_in.local_rank));
  }
  ConfigureAllocator(c, device);
  std::unique_ptr<ProcessGroup> group;
  if (dist_in.world_size > 1) {
    DistOptions dist = dist_in;
    dist.backend = device.is_cuda() ? DistBackend::kNccl : DistBackend::kGloo;
    if (device.is_cuda()) dist.local_rank = device.index();
    ASSIGN_OR_RETURN(group, ProcessGroup::Join(dist));
    MEMPLAN_LOG(kInfo, "joined the process group")
        .Field("rank", group->rank())
        .Field("world_size", group->world_size())
        .Field("backend", std::string(DistBackendName(group->backend())))
        .Field("device", device.str());
  }
  const int world_size = dist_in.world_size;
  const bool lead = dist_in.rank == 0;  // logs steps and talks to the planner
  if (world_size > 1 && at::get_num_threads() < c.cpu_threads) {
    // torchrun sets OMP_NUM_THREADS=1 for every rank; a rank's CPU share is --cpu-threads (its
    // torch CPU ops ran single-threaded: 3x slower steps measured on 2 H200s, docs/benchmarks.md).
    at::set_num_threads(c.cpu_threads);
  }

  // Optimizer: --optimizer, else the plan file's, else adamw; a plan file made for another
  // optimizer is refused (its memory figures are not this run's).
  std::string plan_text;
  if (!c.plan_file.empty()) {
    std::FILE* f = std::fopen(c.plan_file.c_str(), "rb");
    if (f == nullptr) return absl::NotFoundError("--plan-file " + c.plan_file + ": cannot open");
    char buf[4096];
    for (size_t n; (n = std::fread(buf, 1, sizeof(buf), f)) > 0;) plan_text.append(buf, n);
    std::fclose(f);
  }
  std::optional<OptimizerKind> plan_optimizer;
  if (!c.plan_file.empty()) {
    auto parsed = ParsePlanOptimizer(plan_text);
    if (!parsed.ok()) {
      return absl::InvalidArgumentError("--plan-file " + c.plan_file + ": " +
                                        std::string(parsed.status().message()));
    }
    plan_optimizer = *parsed;
  }
  ASSIGN_OR_RETURN(const OptimizerKind optimizer, ResolveOptimizer(c, plan_optimizer));
  if (!c.plan_file.empty()) {
    // A plan priced for another training method (full vs LoRA, rank, targets) is refused.
    auto training = ParsePlanTraining(plan_text);
    if (!training.ok()) {
      return absl::InvalidArgumentError("--plan-file " + c.plan_file + ": " +
                                        std::string(training.status().message()));
    }
    RETURN_IF_ERROR(CheckPlanTraining(c, *training));
  }
  const DType dtype = c.dtype.value_or(
      device.is_cuda() || optimizer == OptimizerKind::kAdamWBf16States ? DType::kBFloat16
                                                                       : DType::kFloat32);

  // Model spec.
  ModelSpec spec;
  if (!c.arch.empty()) {
    std::optional<ModelSpec> preset = FindModelPreset(c.arch);
    if (!preset.has_value()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--arch ", c.arch, " is not a preset; known: ", ModelPresetNames()));
    }
    spec = *preset;
  } else if (!c.arch_file.empty()) {
    absl::StatusOr<ModelSpec> loaded = LoadHfConfigFile(c.arch_file);
    if (!loaded.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--arch-file ", c.arch_file, ": ", loaded.status().message()));
    }
    spec = *std::move(loaded);
  } else {
    ASSIGN_OR_RETURN(spec, LoadHfConfigFile(c.model_dir + "/config.json"));
  }
  RETURN_IF_ERROR(CheckSequenceLength(spec, c.seq));
  RETURN_IF_ERROR(CheckSeqWithinPositions(spec, c.seq));

  // Plan: from the planner (--planner), or from the plan file and flags.
  LlamaModelOptions model_options;
  model_options.spec = spec;
  model_options.dtype = dtype;
  model_options.device = device;
  model_options.seed = c.seed;
  if (c.lora.enabled()) {
    RETURN_IF_ERROR(ValidateLoraOptions(c.lora, spec, "--lora-"));
    model_options.lora = c.lora;
  }
  std::optional<ResidencyPlan> file_plan;
  std::unique_ptr<PlannerClient> client;
  PlanAnswer answer;
  if (!loop.address.empty()) {
    // [Fixed knobs with --planner] The other plan knobs go to the planner as fixed knobs: it
    // searches the rest, or answers why no plan with them fits.
    if (c.accumulate_offloaded_grads_on_device) {
      return absl::InvalidArgumentError(
          "--accumulate-offloaded-grads device: the planner does not price it (every offloaded "
          "chunk's fp32 grads on the device until the last micro-batch); drop it with --planner");
    }
    if (!c.plan_file.empty() || c.block_modes || c.plain) {
      return absl::InvalidArgumentError(
          "--planner decides the plan: drop --plan-file, --plain and --block-modes (--chunk-mib, "
          "--n-persist, --n-buffer, --n-ckpt, --n-swap, --n-hs-offload, --host-memory, "
          "--persistent-state and --persistent-params are passed to the planner as fixed knobs)");
    }
    if (loop.profile && c.lora.enabled()) {
      // The profiler measures a full fine-tune's trace (every parameter trains); submitted for a
      // LoRA run it would price the wrong method.
      return absl::InvalidArgumentError(
          "--profile: profiling a LoRA run is not built yet; drop --profile (the planner plans "
          "LoRA from the architecture)");
    }
    PlannerClientOptions client_options;
    client_options.retries = loop.retries;
    client_options.security = loop.security;
    ASSIGN_OR_RETURN(client, PlannerClient::Create(loop.address, client_options));
    // Sharded: rank 0 asks, every rank trains under its answer (one stored plan per job).
    absl::StatusOr<PlanAnswer> asked = absl::UnavailableError("not asked: rank 0 asks");
    if (lead) {
      asked = AskPlanner(*client, c, loop, spec, dtype, model_options, world_size,
                         dist_in.local_world_size);
    }
    if (group != nullptr) asked = ShareRankZeroAnswer(*group, asked);
    ASSIGN_OR_RETURN(answer, std::move(asked));
    if (!lead) {
      std::printf("plan_id %s (rank 0's)\nplan: %s\n", answer.plan_id.c_str(),
                  PlanLine(answer.plan).c_str());
    }
    file_plan = answer.plan;
    // The profiling pass ran the whole model unmanaged; its cached segments are not the plan's.
    PrintDeviceMemory(device, "after profiling");
    ReleaseCachedAndResetPeaks(device);
    PrintDeviceMemory(device, "after releasing the profiler's cache");
    if (device.is_cpu()) {
      // The planner plans for a GPU; on the CPU the figures are only comparable in shape.
      std::printf("note: cpu run: the prediction is for %s, not this CPU%s\n",
                  loop.hardware_profile_id.empty()
                      ? loop.hardware_preset.c_str()
                      : ("profile " + loop.hardware_profile_id).c_str(),
                  file_plan->host_memory == HostMemoryKind::kPinned
                      ? "; pinned host memory is unavailable, chunks stay pageable"
                      : "");
    }
  } else if (!c.plan_file.empty()) {
    auto parsed = ParsePlanJson(plan_text);
    if (!parsed.ok()) {
      // INVALID_ARGUMENT for a malformed file, FAILED_PRECONDITION for a DOES NOT FIT verdict.
      return absl::Status(parsed.status().code(), "--plan-file " + c.plan_file + ": " +
                                                      std::string(parsed.status().message()));
    }
    file_plan = *std::move(parsed);
  }
  // With --planner the knob flags were fixed in its search: its plan carries them, and the block
  // counts it chose for the rest must not be rebuilt from the fixed ones alone.
  TrainConfig knobs = c;
  if (!loop.address.empty()) {
    knobs.n_ckpt.reset();
    knobs.n_swap.reset();
    knobs.n_hs_offload.reset();
  }
  ASSIGN_OR_RETURN(const RunPlan plan, ResolveRunPlan(knobs, static_cast<int>(spec.num_layers),
                                                      file_plan, world_size));
  RETURN_IF_ERROR(ApplyMemoryLimit(c, device, loop.address.empty() ? nullptr : &answer));

  // Model. [Sharded loading] A managed full fine-tune creates its parameters without values
  // (deferred_values: shapes only): the ChunkManager allocates what this rank stores and it is
  // filled below from the checkpoint's byte ranges (or the initial values), so no rank ever holds
  // the whole model, on one rank or many. LoRA (its base is quantised or frozen whole) creates the model on the CPU
  // for the managers to take; an unmanaged run creates it on the device.
  const bool sharded_load = plan.managed && !c.lora.enabled();
  const HostMemory before_model = ReadHostMemory();
  if (plan.managed) model_options.param_device = torch::Device(torch::kCPU);
  model_options.deferred_values = sharded_load;
  const auto model_start = std::chrono::steady_clock::now();
  ASSIGN_OR_RETURN(std::unique_ptr<LlamaModel> model, LlamaModel::Create(model_options));
  // Drawing a large model's initial values (and, QLoRA, quantizing them) takes a while: said.
  MEMPLAN_LOG(kInfo, "model created")
      .Field("seconds", std::chrono::duration<double>(std::chrono::steady_clock::now() -
                                                      model_start)
                            .count())
      .Field("deferred_values", model_options.deferred_values)
      .Field("nf4_base", model_options.lora.nf4_base);
  PrintDeviceMemory(device, "after creating the model");
  std::unique_ptr<io::HfCheckpoint> checkpoint;
  io::HfCheckpoint::Matched matched;
  if (!c.model_dir.empty()) {
    ASSIGN_OR_RETURN(checkpoint, io::HfCheckpoint::Open(c.model_dir));
    const std::vector<NamedParam> names = io::FlattenParamGroups(model->ParamGroups());
    if (sharded_load) {
      // Checked now (names, shapes, dtypes), read once the chunks exist.
      ASSIGN_OR_RETURN(matched, checkpoint->Match(names, {}));
    } else {
      // [QLoRA] an NF4 base is quantized from the checkpoint's weights one at a time.
      ASSIGN_OR_RETURN(io::HfLoadReport report, io::LoadModelCheckpoint(*checkpoint, *model));
      MEMPLAN_LOG(kInfo, "loaded checkpoint")
          .Field("dir", c.model_dir)
          .Field("tensors", report.tensors_loaded)
          .Field("quantized_nf4", static_cast<int64_t>(model->QuantizedWeightNames().size()))
          .Field("bytes", report.bytes_read);
    }
  }
  if (!c.load_adapter_dir.empty()) {
    ASSIGN_OR_RETURN(io::PeftAdapter adapter, io::ReadPeftAdapter(c.load_adapter_dir));
    if (LoraTrainingMethod(adapter.lora).lora_target_modules !=
            LoraTrainingMethod(c.lora).lora_target_modules ||
        adapter.lora.rank != c.lora.rank || adapter.lora.alpha != c.lora.alpha) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--load-adapter ", c.load_adapter_dir, ": r ", adapter.lora.rank, ", lora_alpha ",
          adapter.lora.alpha, " and target_modules must equal --lora-rank, --lora-alpha and "
          "--lora-targets"));
    }
    RETURN_IF_ERROR(io::CopyParamsByName(adapter.tensors, model->TrainableParams()));
    MEMPLAN_LOG(kInfo, "loaded adapter").Field("dir", c.load_adapter_dir);
  }

  // Trainer.
  TrainerOptions options;
  options.grad_accum = c.grad_accum;
  options.max_grad_norm = c.clip;
  options.skip_nonfinite = c.skip_nonfinite;
  options.optimizer = optimizer;
  options.adamw.lr = c.lr;
  options.adamw.weight_decay = c.weight_decay;
  options.block_modes = plan.block_modes;
  options.managed = plan.managed;
  options.plain_reference = c.plain;
  options.chunks.chunk_bytes = plan.chunk_bytes;
  options.chunks.n_persist = plan.n_persist;
  options.chunks.n_buffer = plan.n_buffer;
  options.chunks.host_memory = plan.host_memory;
  options.chunks.shard_persistent_state = plan.shard_persistent_state;
  options.chunks.shard_persistent_params = plan.shard_persistent_params;
  options.chunks.accumulate_sharded_grads_on_device = c.accumulate_offloaded_grads_on_device;
  options.chunks.cpu_threads = c.cpu_threads;
  options.chunks.stochastic_rounding =
      optimizer == OptimizerKind::kAdamW8bit && c.stochastic_rounding;
  options.chunks.rounding_seed = c.seed;
  options.chunks.max_grad_copy_groups = c.offload_in_flight;
  options.offload.host_memory = plan.host_memory;
  options.offload.max_in_flight_groups = c.offload_in_flight;
  options.communicator = group.get();
  if (group != nullptr) options.chunks.coalesce_gathers = group->options().coalesce_gathers;
  const std::string plan_source = loop.address.empty()
                                      ? "--plan-file " + c.plan_file
                                      : absl::StrCat("the planner's plan ", answer.plan_id);
  if (plan.managed) {
    // [Plan knobs are refused, never clamped] (train_config.h): the chunk manager would clamp an
    // n_persist beyond the layout and ignore n_buffer when every chunk is persistent.
    ASSIGN_OR_RETURN(const ChunkPacking layout,
                     ChunkManager::LayoutOf(model->ParamGroups(), options.chunks));
    RETURN_IF_ERROR(CheckRunPlanKnobs(plan, layout.num_chunks(), plan_source));
  }
  // The plan's n_persist counts chunks of the layout it was made for: a plan made for another
  // layout ([Layout fingerprint], common/chunk_packing.h) is refused before anything is allocated.
  if (file_plan.has_value() && plan.managed) {
    const std::string& source = plan_source;
    if (c.chunk_bytes.has_value() && *c.chunk_bytes != file_plan->chunk_bytes) {
      MEMPLAN_LOG(kWarning, "plan layout not checked")
          .Field("reason", absl::StrCat("--chunk-mib replaces the chunk size of ", source,
                                        ", whose n_chunks and n_persist refer to ",
                                        file_plan->chunk_bytes, "-byte chunks"));
    } else {
      ASSIGN_OR_RETURN(const ChunkPacking layout,
                       ChunkManager::LayoutOf(model->ParamGroups(), options.chunks));
      std::string warning;
      RETURN_IF_ERROR(CheckPlanLayout(*file_plan, source, layout.num_chunks(),
                                      layout.fingerprint(), &warning));
      if (!warning.empty()) {
        MEMPLAN_LOG(kWarning, "plan layout not checked").Field("reason", warning);
      } else {
        MEMPLAN_LOG(kInfo, "plan layout matches")
            .Field("n_chunks", layout.num_chunks())
            .Field("layout_fingerprint", layout.fingerprint());
      }
    }
  }
  std::unique_ptr<MemoryProbe> probe;
  std::unique_ptr<MemoryTimeline> timeline;
  if (!c.memory_timeline.empty()) {
    probe = MemoryProbe::Create(device);
    timeline = std::make_unique<MemoryTimeline>(probe.get());
    options.observer = timeline.get();
  }
  ASSIGN_OR_RETURN(std::unique_ptr<Trainer> trainer, Trainer::Create(model.get(), options));
  if (timeline != nullptr && trainer->chunk_manager() != nullptr) {
    // The timeline's cpu_updates_started column: the CPU optimizer's overlap with backward.
    ChunkManager* chunks = trainer->chunk_manager();
    timeline->SetCpuUpdateCounter([chunks] { return chunks->UpdatesStartedBeforeStep(); });
  }
  if (sharded_load && c.resume_dir.empty()) {
    // [Sharded loading] Each rank reads what it stores: its shard of every offloaded chunk and
    // the whole persistent chunks, from the checkpoint's byte ranges or drawn as Create would.
    // (A resumed run is filled by the checkpoint it resumes from, below.)
    const torch::ScalarType param_dtype = model->Params().front().param.scalar_type();
    std::atomic<int64_t> bytes_read{0};
    ChunkManager::RangeReader read;
    if (checkpoint != nullptr) {
      read = [&](const std::string& name, int64_t begin,
                 int64_t len) -> absl::StatusOr<torch::Tensor> {
        auto it = matched.source_of.find(name);
        if (it == matched.source_of.end()) {
          return absl::NotFoundError(absl::StrCat(c.model_dir, ": nothing loads \"", name, "\""));
        }
        ASSIGN_OR_RETURN(torch::Tensor part,
                         checkpoint->ReadRange(it->second, begin, len, param_dtype));
        // ReadRange reads exactly len elements of the stored dtype.
        bytes_read += len * static_cast<int64_t>(torch::elementSize(
                                io::TorchDTypeOf(checkpoint->Find(it->second)->dtype)));
        return part;
      };
    } else {
      read = [&](const std::string& name, int64_t begin, int64_t len) {
        return model->InitialValues(name, begin, len);
      };
    }
    RETURN_IF_ERROR(trainer->LoadParamRanges(read));
    if (checkpoint != nullptr) {
      MEMPLAN_LOG(kInfo, "loaded checkpoint")
          .Field("dir", c.model_dir)
          .Field("tensors", matched.loads.size())
          .Field("bytes", bytes_read.load())
          .Field("rank", dist_in.rank);
    }
  }
  {
    // The load-time peak of this rank: host (resident set) and device, before the first step.
    const HostMemory loaded = ReadHostMemory();
    int64_t allocated = 0, reserved = 0;
    DevicePeaks(device, &allocated, &reserved);
    auto record = MEMPLAN_LOG(kInfo, "load peak");
    record.Field("rank", dist_in.rank)
        .Field("host_peak_rss_bytes", loaded.peak_rss)
        .Field("host_rss_before_model_bytes", before_model.rss)
        .Field("host_rss_bytes", loaded.rss)
        .Field("device_peak_reserved_bytes", reserved)
        .Field("sharded_load", sharded_load);
    if (const ChunkManager* m = trainer->chunk_manager(); m != nullptr && sharded_load) {
      const ChunkMemoryStats stats = m->MemoryStats();
      record.Field("chunk_host_bytes", stats.host_pinned_bytes + stats.host_pageable_bytes)
          .Field("chunk_device_bytes", stats.buffer_device_bytes + stats.persistent_device_bytes +
                                           stats.persistent_state_device_bytes);
    }
  }
  PrintDeviceMemory(device, "after applying the plan");
  // The timeline file is written once: after the last step, or on the way out when a step (or
  // anything else) stops the run early, so a failed step still shows its curve.
  bool timeline_written = timeline == nullptr;
  absl::Cleanup write_timeline_on_exit = [&] {
    if (timeline_written) return;
    if (absl::Status s = timeline->WriteTsv(c.memory_timeline); !s.ok()) {
      MEMPLAN_LOG(kError, "memory timeline not written").Field("error", s.ToString());
    }
  };
  {
    auto record = MEMPLAN_LOG(kInfo, "plan applied");
    record.Field("model", spec.name)
        .Field("dtype", std::string(DTypeName(dtype)))
        .Field("optimizer", std::string(OptimizerName(optimizer)))
        .Field("device", device.str())
        .Field("managed", plan.managed)
        .Field("block_modes", ModesString(plan.block_modes));
    if (optimizer == OptimizerKind::kAdamW8bit && dtype != DType::kFloat32) {
      record.Field("param_rounding", options.chunks.stochastic_rounding ? "stochastic" : "nearest");
    }
    // LoRA: the plan's chunks are the frozen base's; the adapters' manager is reported apart.
    if (ChunkManager* adapters = trainer->base_chunk_manager() ? trainer->chunk_manager() : nullptr) {
      const ChunkMemoryStats a = adapters->MemoryStats();
      record.Field("lora_rank", c.lora.rank)
          .Field("nf4_base", c.lora.nf4_base)
          .Field("adapter_chunks", a.n_chunks)
          .Field("adapter_device_bytes", a.persistent_device_bytes)
          .Field("adapter_state_device_bytes", a.persistent_state_device_bytes);
    }
    if (ChunkManager* chunks = trainer->base_chunk_manager() ? trainer->base_chunk_manager()
                                                             : trainer->chunk_manager()) {
      const ChunkMemoryStats s = chunks->MemoryStats();
      record.Field("chunk_bytes", plan.chunk_bytes)
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
  if (trainer->chunk_manager() != nullptr && !loop.address.empty()) {
    // The planner's per-rank figures are what this rank's chunk managers allocate (pinned and
    // pageable compared as one total: on the CPU pinned memory falls back to pageable). LoRA and
    // QLoRA: the frozen base's manager and the adapters' together ([LoRA managers]).
    int64_t host = 0, device_bytes = 0;
    for (ChunkManager* chunks : {trainer->base_chunk_manager(), trainer->chunk_manager()}) {
      if (chunks == nullptr) continue;
      const ChunkMemoryStats s = chunks->MemoryStats();
      host += s.host_pinned_bytes + s.host_pageable_bytes;
      device_bytes +=
          s.persistent_device_bytes + s.persistent_state_device_bytes + s.buffer_device_bytes;
    }
    const RankMemory& m = answer.prediction.rank_memory;
    std::printf(
        "rank %d chunk memory (allocated / planned): host %lld / %lld bytes, device %lld / %lld "
        "bytes\n",
        dist_in.rank, static_cast<long long>(host),
        static_cast<long long>(m.chunk_host_pinned_bytes + m.chunk_host_pageable_bytes),
        static_cast<long long>(device_bytes),
        static_cast<long long>(m.persistent_device_bytes + m.persistent_state_device_bytes +
                               m.buffer_device_bytes));
  }

  // Data and resume.
  ASSIGN_OR_RETURN(std::shared_ptr<const io::TokenFile> tokens, OpenData(c, spec, world_size));
  io::TokenBatcherOptions batcher_options;
  batcher_options.seed = c.seed;
  batcher_options.batch_size = c.batch;
  batcher_options.seq_len = c.seq;
  // Each rank reads its own rows of every global batch (world_size x --batch rows).
  batcher_options.rank = dist_in.rank;
  batcher_options.world_size = world_size;
  ASSIGN_OR_RETURN(std::unique_ptr<io::TokenBatcher> batcher,
                   io::TokenBatcher::Create(tokens, batcher_options));
  int64_t data_position = 0;
  if (!c.resume_dir.empty()) {
    if (c.lora.enabled() != io::IsLoraCheckpoint(c.resume_dir)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "--resume ", c.resume_dir, c.lora.enabled()
                                         ? " is not a LoRA checkpoint (no adapter_config.json)"
                                         : " is a LoRA checkpoint: resume it with --lora-rank "
                                           "and --lora-targets"));
    }
    if (!c.lora.enabled() && trainer->chunk_manager() != nullptr &&
        io::IsPerRankCheckpoint(c.resume_dir)) {
      // [Per-rank checkpoints]: each rank reads only the ranges it stores.
      ASSIGN_OR_RETURN(std::unique_ptr<io::CheckpointPieces> pieces,
                       io::CheckpointPieces::Open(c.resume_dir));
      RETURN_IF_ERROR(trainer->RestoreFromPieces(*pieces));
      data_position = pieces->trainer().data_position;
    } else {
      ASSIGN_OR_RETURN(io::Checkpoint checkpoint, c.lora.enabled()
                                                      ? io::LoadLoraCheckpoint(c.resume_dir)
                                                      : io::LoadCheckpoint(c.resume_dir));
      RETURN_IF_ERROR(trainer->RestoreCheckpoint(checkpoint));
      data_position = checkpoint.trainer.data_position;
    }
    MEMPLAN_LOG(kInfo, "resumed")
        .Field("dir", c.resume_dir)
        .Field("step", trainer->step())
        .Field("data_position", data_position);
  }
  auto save = [&]() -> absl::Status {
    io::TrainerState state;
    state.data_position = data_position;
    state.data_seed = c.seed;
    state.rng_seed = c.seed;
    state.workload.micro_batch = c.batch;
    state.workload.seq_len = c.seq;
    state.workload.grad_accum = c.grad_accum;
    state.workload.world_size = world_size;
    RETURN_IF_ERROR(trainer->SaveCheckpoint(c.save_dir, state));
    MEMPLAN_LOG(kInfo, "saved").Field("dir", c.save_dir).Field("step", trainer->step());
    return absl::OkStatus();
  };

  // Train: --steps is the total number of optimizer steps, a resumed run continues up to it.
  double tokens_per_second_sum = 0;
  int64_t timed_steps = 0;
  int64_t peak_allocated = 0, peak_reserved = 0;
  // Steady state: every step after the warm-up one (what the planner predicts).
  int64_t steady_allocated = 0, steady_reserved = 0, steady_device = 0;
  // Everything before the first step (model creation, checkpoint loading, chunk packing).
  int64_t load_allocated = 0, load_reserved = 0;
  DevicePeaks(device, &load_allocated, &load_reserved);
  double seconds_sum = 0;
  // Live metrics for a sidecar scrape: the prediction of the plan next to every step.
  std::unique_ptr<AgentMetrics> live;
  int64_t uploaded_bytes = 0;  // chunk upload bytes already published
  if (!c.metrics_address.empty()) {
    absl::StatusOr<std::unique_ptr<AgentMetrics>> started = AgentMetrics::Start(c.metrics_address);
    if (!started.ok()) {
      return absl::Status(started.status().code(),
                          absl::StrCat("--metrics: ", started.status().message()));
    }
    live = *std::move(started);
    const size_t colon = c.metrics_address.rfind(':');
    std::printf("metrics on %s:%d\n", c.metrics_address.substr(0, colon).c_str(), live->port());
    live->SetPlan({answer.plan_id, answer.prediction.peak_bytes,
                   answer.prediction.iteration_seconds, answer.prediction.tokens_per_second});
  }
  while (trainer->step() < c.steps) {
    // Every step is recorded (a TSV row per group hook).
    if (timeline != nullptr) timeline->BeginStep(trainer->step() + 1);
    std::vector<MicroBatch> micro_batches;
    for (int i = 0; i < c.grad_accum; ++i) {
      ASSIGN_OR_RETURN(MicroBatch batch, NextBatch(*batcher, data_position++));
      micro_batches.push_back(std::move(batch));
    }
    if (c.lora.dropout > 0) {
      // LoRA dropout draws from the default generators: seeding them from (--seed, step) makes
      // the masks a function of the step, so a resumed run draws what the straight run drew.
      torch::manual_seed(c.seed * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(trainer->step()));
    }
    absl::StatusOr<StepStats> step;
    try {
      step = trainer->Step(micro_batches);
    } catch (const c10::OutOfMemoryError& e) {  // the trainer converts, but be sure
      step = absl::ResourceExhaustedError(e.what_without_backtrace());
    }
    if (timeline != nullptr) timeline->EndStep();
    if (!step.ok() && IsOutOfMemory(step.status())) {
      Measurement m;
      m.plan_id = answer.plan_id;
      m.oom = true;
      DevicePeaks(device, &m.peak_allocated_bytes, &m.peak_reserved_bytes);
      m.peak_allocated_bytes = std::max(m.peak_allocated_bytes, peak_allocated);
      m.peak_reserved_bytes = std::max(m.peak_reserved_bytes, peak_reserved);
      if (timeline != nullptr) {
        m.peak_allocated_bytes = std::max(m.peak_allocated_bytes, timeline->StepPeakAllocated());
        m.peak_reserved_bytes = std::max(m.peak_reserved_bytes, timeline->StepPeakReserved());
      }
      m.peak_device_bytes = DeviceUsedBytes(device);
      m.load_peak_bytes = load_reserved;
      m.note = absl::StrCat("out of memory in step ", trainer->step() + 1);
      MEMPLAN_LOG(kError, "out of memory")
          .Field("step", trainer->step() + 1)
          .Field("peak_reserved_bytes", m.peak_reserved_bytes);
      if (client != nullptr && lead) {
        const absl::Status reported = ReportToPlanner(*client, answer, m);
        if (!reported.ok()) std::printf("report failed: %s\n", reported.ToString().c_str());
      }
      return absl::ResourceExhaustedError(absl::StrCat(
          "out of memory in step ", trainer->step() + 1,
          " (oom=true); the plan does not fit this device: ", step.status().message()));
    }
    if (!step.ok()) return step.status();
    StepStats& stats = *step;
    if (stats.skipped && lead) {
      MEMPLAN_LOG(kWarning, "step skipped: non-finite")
          .Field("step", stats.step)
          .Field("what", stats.nonfinite);
    }
    if (timeline != nullptr && device.is_cuda()) {
      // The timeline resets the allocator's peak at every hook; its own maxima are the step's.
      stats.peak_allocated_bytes = timeline->StepPeakAllocated();
      stats.peak_reserved_bytes = timeline->StepPeakReserved();
    }
    const int64_t device_used = DeviceUsedBytes(device);
    peak_allocated = std::max(peak_allocated, stats.peak_allocated_bytes);
    peak_reserved = std::max(peak_reserved, stats.peak_reserved_bytes);
    if (stats.step > 1 || c.steps == 1) {  // the first step warms up allocators and kernels
      tokens_per_second_sum += stats.tokens_per_second;
      seconds_sum += stats.seconds;
      steady_allocated = std::max(steady_allocated, stats.peak_allocated_bytes);
      steady_reserved = std::max(steady_reserved, stats.peak_reserved_bytes);
      steady_device = std::max(steady_device, device_used);
      ++timed_steps;
    }
    if (live != nullptr) {
      AgentStepSample sample;
      sample.seconds = stats.seconds;
      sample.tokens_per_second = stats.tokens_per_second;
      if (device.is_cuda()) {
        const AllocatorStats now = ReadAllocatorStats(device);
        sample.allocated_bytes = now.allocated.current;
        sample.reserved_bytes = now.reserved.current;
      }
      sample.peak_allocated_bytes = stats.peak_allocated_bytes;
      sample.peak_reserved_bytes = stats.peak_reserved_bytes;
      if (ChunkManager* chunks = trainer->chunk_manager(); chunks != nullptr) {
        const int64_t total = chunks->UploadStats().bytes;
        sample.chunk_upload_bytes = total - uploaded_bytes;
        uploaded_bytes = total;
      }
      live->ObserveStep(sample);
    }
    if (stats.step == 1 && world_size > 1 && trainer->chunk_manager() != nullptr) {
      // [Collective timing] the gathers' figures below leave out the first step (the
      // communicator's connections are set up by its first collectives).
      trainer->chunk_manager()->ResetUploadStats();
      uploaded_bytes = 0;
    }
    if (lead && (stats.step % c.log_every == 0 || stats.step == c.steps)) {
      // The loss is the global batch's (all-reduced); tokens/s counts every rank's tokens (the
      // ranks step together), peaks are rank 0's.
      MEMPLAN_LOG(kInfo, "step")
          .Field("step", stats.step)
          .Field("loss", stats.loss)
          .Field("grad_norm", stats.grad_norm)
          .Field("seconds", stats.seconds)
          .Field("fb_seconds", stats.forward_backward_seconds)
          .Field("opt_seconds", stats.optimizer_seconds)
          .Field("tokens_per_second", stats.tokens_per_second * world_size)
          .Field("peak_allocated_bytes", stats.peak_allocated_bytes)
          .Field("peak_reserved_bytes", stats.peak_reserved_bytes)
          .Field("cpu_updates_in_backward", stats.offloaded_updates_in_backward);
    }
    if (!c.save_dir.empty() && c.save_every > 0 && stats.step % c.save_every == 0) {
      RETURN_IF_ERROR(save());
    }
  }
  if (timeline != nullptr) {
    timeline_written = true;
    RETURN_IF_ERROR(timeline->WriteTsv(c.memory_timeline));
    std::printf("memory timeline of steps 1-%lld: %s (%zu events)\n",
                static_cast<long long>(trainer->step()), c.memory_timeline.c_str(),
                timeline->events().size());
    if (device.is_cuda()) {
      for (absl::string_view line :
           absl::StrSplit(SegmentsByStream(device), '\n', absl::SkipEmpty())) {
        std::printf("allocator pool %.*s\n", static_cast<int>(line.size()), line.data());
      }
    }
  }
  if (device.is_cuda()) {
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(CudaIndex(device));
    std::printf("allocator retries %lld (cached blocks freed to satisfy an allocation), "
                "device allocations %lld\n",
                static_cast<long long>(stats.num_alloc_retries),
                static_cast<long long>(stats.num_device_alloc));
  }
  if (!c.save_dir.empty() && (c.save_every == 0 || trainer->step() % c.save_every != 0)) {
    RETURN_IF_ERROR(save());
  }
  if (!c.save_adapter_dir.empty() && lead) {
    RETURN_IF_ERROR(io::SavePeftAdapter(c.save_adapter_dir, c.lora,
                                        !c.model_dir.empty()  ? c.model_dir
                                        : !c.arch_file.empty() ? c.arch_file
                                                               : c.arch,
                                        trainer->Params()));
    MEMPLAN_LOG(kInfo, "saved adapter").Field("dir", c.save_adapter_dir);
  }
  if (!c.merge_export_dir.empty() && lead) {
    // [QLoRA] merged into the dequantized weights (what the adapters were trained against).
    ASSIGN_OR_RETURN(const std::vector<NamedParam> base,
                     model->DequantizedBase(trainer->BaseParams()));
    ASSIGN_OR_RETURN(std::vector<NamedParam> merged,
                     io::MergeLora(base, trainer->Params(), c.lora));
    io::TrainerState state;
    state.step = trainer->step();
    state.model = spec;
    state.param_dtype = dtype;
    RETURN_IF_ERROR(io::SaveCheckpoint(c.merge_export_dir, state, merged, {}));
    MEMPLAN_LOG(kInfo, "merged export").Field("dir", c.merge_export_dir);
  }
  if (world_size > 1) {
    // Every rank's own steady peaks (the summary below and the measurement are rank 0's): what a
    // per-rank plan is checked against.
    std::printf("rank %d steady peak: allocated %lld reserved %lld device_used %lld bytes\n",
                dist_in.rank, static_cast<long long>(steady_allocated),
                static_cast<long long>(steady_reserved), static_cast<long long>(steady_device));
    if (ChunkManager* chunks = trainer->chunk_manager(); chunks != nullptr) {
      // [Collective timing] the chunk all-gathers of steps 2.. as the backend timed them, with
      // nccl-tests' bus bandwidth (output bytes / time x (W - 1) / W), comparable with
      // `memplan-agent bench --world-size W`'s all-gather figure.
      const ChunkUploadStats u = chunks->UploadStats();
      const double bus = AllGatherBusBytesPerSecond(static_cast<double>(u.gather_output_bytes),
                                                    u.gather_seconds, world_size);
      std::printf("rank %d chunk all-gathers (after step 1): %lld, %lld timed, %.1f MiB out, "
                  "device %.4f s, bus bandwidth %.1f GB/s\n",
                  dist_in.rank, static_cast<long long>(u.gathers),
                  static_cast<long long>(u.gathers_timed),
                  static_cast<double>(u.gather_output_bytes) / (1 << 20), u.gather_seconds,
                  bus / 1e9);
      if (group != nullptr) {
        ASSIGN_OR_RETURN(const std::optional<GatherBandwidth> across,
                         CompareGatherTimes(*group, u));
        if (across.has_value() && lead) {
          std::printf("chunk all-gathers across %d ranks (%lld gathers): bus bandwidth %.1f GB/s "
                      "by the fastest rank of each (the transfer), %.1f GB/s by the slowest\n",
                      world_size, static_cast<long long>(across->gathers),
                      across->fastest_bus_bytes_per_second / 1e9,
                      across->slowest_bus_bytes_per_second / 1e9);
        }
      }
    }
    std::fflush(stdout);
  }
  if (!lead) return absl::OkStatus();
  auto summary = MEMPLAN_LOG(kInfo, "done");
  summary.Field("steps", trainer->step())
      .Field("world_size", world_size)
      .Field("mean_tokens_per_second",
             timed_steps > 0 ? world_size * tokens_per_second_sum / static_cast<double>(timed_steps)
                             : 0.0)
      .Field("peak_allocated_bytes", peak_allocated)
      .Field("peak_reserved_bytes", peak_reserved)
      .Field("load_peak_reserved_bytes", load_reserved)
      .Field("steady_device_used_bytes", steady_device);
  if (ActivationOffloader* offloader = trainer->offloader()) {
    const ActivationOffloadStats s = offloader->Stats();
    summary.Field("activation_offloaded_bytes", s.offloaded_bytes)
        .Field("activation_host_peak_bytes", s.host_bytes_peak)
        .Field("activation_synchronous_fetches", s.synchronous_fetches);
  }
  std::printf("trained %lld steps\n", static_cast<long long>(trainer->step()));
  if (client != nullptr && timed_steps > 0) {
    Measurement m;
    m.plan_id = answer.plan_id;
    m.peak_allocated_bytes = steady_allocated;
    m.peak_reserved_bytes = steady_reserved;
    m.peak_device_bytes = steady_device;
    m.load_peak_bytes = load_reserved;
    m.step_seconds = seconds_sum / static_cast<double>(timed_steps);
    if (c.steps == 1) m.note = "single step: no warm-up excluded";
    RETURN_IF_ERROR(ReportToPlanner(*client, answer, m));
  }
  return absl::OkStatus();
}

}  // namespace memplan
