#include "agent/cli/profile_command.h"

#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "agent/client/planner_client.h"
#include "agent/client/record_json.h"
#include "agent/core/seconds_since.h"
#include "agent/profiler/memory_probe.h"
#include "agent/profiler/model_profiler.h"
#include "agent/profiler/on_demand_profiler.h"
#include "common/flags.h"
#include "common/hf_config.h"
#include "common/presets.h"
#include "common/request_flags.h"
#include "common/validate.h"

namespace memplan {
namespace {

constexpr char kProfileUsage[] =
    "usage: memplan-agent profile (--arch NAME | --arch-file CONFIG.json) [--batch B] [--seq S]\n"
    "         [--dtype fp32|bf16|fp16] [--device cpu|cuda|cuda:N] [--hardware NAME]\n"
    "         [--chunk-bytes N] [--on-demand] [--out FILE] [--planner ADDR]\n"
    "         [--images-per-sample N --image-size HxW]\n"
    "         [--tls-ca FILE [--tls-cert FILE --tls-key FILE]] [--auth-token-file FILE]\n"
    "  --arch-file      a Hugging Face config.json (Llama / Qwen2 / Qwen3 / Mistral /\n"
    "                   Qwen2.5-VL ...)\n"
    "  --on-demand      keep the parameters in host memory and put one group's on the device at\n"
    "                   a time (models larger than the card; ProTrain's on-demand profiling)\n"
    "  --chunk-bytes N  record the chunk layout for this chunk size in the trace\n"
    "  --images-per-sample N --image-size HxW\n"
    "                   a vision-language model (required for one): each sample of the pass\n"
    "                   holds N synthetic images of H x W pixels, recorded in the trace\n";

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

// The device's total memory and what the allocator reserved at most, next to the model's size.
void PrintDeviceMemory(const torch::Device& device) {
  if (!device.is_cuda()) return;
  size_t free_bytes = 0, total_bytes = 0;
  if (cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess) return;
  const AllocatorStats stats = ReadAllocatorStats(device);
  std::printf(
      "device: %.2f GiB in all, allocator reserved %.2f GiB now (peak since the last reset %.2f "
      "GiB)\n",
      total_bytes / kGiB, stats.reserved.current / kGiB, stats.reserved.peak / kGiB);
}

int Fail(const std::string& message) {
  std::fprintf(stderr, "memplan-agent profile: %s\n", message.c_str());
  return 1;
}

int BadFlag(const std::string& message) {
  std::fprintf(stderr, "memplan-agent profile: %s\n%s", message.c_str(), kProfileUsage);
  return 2;
}

void PrintTable(const ProfileResult& r) {
  const Trace& t = r.trace;
  constexpr double kMiB = 1024.0 * 1024.0;
  std::printf("%-10s %10s %10s %10s %10s %10s %10s %10s\n", "group", "param_MiB", "input_MiB",
              "saved_MiB", "fwd_ms", "bwd_ms", "recomp_ms", "bwd_tr_MiB");
  auto edge = [&](const char* name, const EdgeTrace& e) {
    std::printf("%-10s %10.2f %10s %10.2f %10.3f %10.3f %10s %10.2f\n", name, e.param_bytes / kMiB,
                "", e.saved_bytes / kMiB, e.forward_seconds * 1e3, e.backward_seconds * 1e3, "",
                e.backward_transient_bytes / kMiB);
  };
  edge("embedding", t.embedding);
  for (size_t i = 0; i < t.blocks.size(); ++i) {
    const BlockTrace& b = t.blocks[i];
    std::printf("%-10s %10.2f %10.2f %10.2f %10.3f %10.3f %10.3f %10.2f\n",
                absl::StrFormat("block %d", i).c_str(), b.param_bytes / kMiB, b.input_bytes / kMiB,
                b.saved_bytes / kMiB, b.forward_seconds * 1e3, b.backward_seconds * 1e3,
                b.recompute_seconds * 1e3, b.backward_transient_bytes / kMiB);
  }
  edge("head", t.head);
  std::printf(
      "forward_end %.2f MiB, step peak %.2f MiB, params %.2f MiB, grads %.2f MiB, "
      "step %.3f s (ckpt %.3f s), memory from %s\n",
      t.forward_end_bytes / kMiB, r.step_peak_bytes / kMiB, r.param_bytes / kMiB,
      r.grad_bytes / kMiB, r.step_seconds, r.ckpt_step_seconds, r.memory_source.c_str());
}

}  // namespace

int RunProfileCommand(const std::vector<std::string>& args_in) {
  for (const std::string& a : args_in) {
    if (a == "--help" || a == "-h") {
      std::fputs(kProfileUsage, stdout);
      std::fputs(ChannelSecurityUsage().c_str(), stdout);
      return 0;
    }
  }
  std::vector<std::string> args = args_in;
  PlannerClientOptions client_options;
  if (absl::Status s = TakeChannelSecurityFlags(&args, &client_options.security); !s.ok()) {
    return BadFlag(std::string(s.message()));
  }
  std::string arch, arch_file, device = "cpu", out, planner;
  std::optional<DType> param_dtype = DType::kFloat32;
  bool on_demand = false;
  ProfilerOptions options;
  options.workload.micro_batch = 1;
  options.workload.seq_len = 128;
  FlagSet flags("see --help");
  flags.Switch("--on-demand", &on_demand)
      .String("--arch", &arch)
      .String("--arch-file", &arch_file)
      .Int(kBatchFlag, &options.workload.micro_batch)
      .Int(kSeqFlag, &options.workload.seq_len)
      .String("--device", &device)
      .String("--hardware", &options.hardware_name)
      .Int("--chunk-bytes", &options.chunk_bytes, kMinChunkBytes, kMaxChunkBytes)
      .String("--out", &out)
      .String("--planner", &planner)
      .Int("--images-per-sample", &options.workload.images_per_sample, 1, kMaxImagesPerSample)
      .Custom("--image-size", [&options](absl::string_view v) -> absl::Status {
        const std::vector<absl::string_view> sides = absl::StrSplit(v, absl::ByAnyChar("xX"));
        Workload& w = options.workload;
        if (sides.size() != 2 || !absl::SimpleAtoi(sides[0], &w.image_height) ||
            !absl::SimpleAtoi(sides[1], &w.image_width) || w.image_height < 1 ||
            w.image_width < 1 || w.image_height > 65536 || w.image_width > 65536) {
          return absl::InvalidArgumentError(absl::StrCat(
              "--image-size = \"", v, "\": expected HEIGHTxWIDTH in pixels, e.g. 448x448"));
        }
        return absl::OkStatus();
      });
  AddDTypeFlag(&flags, "--dtype", &param_dtype);
  if (absl::Status s = flags.Parse(args); !s.ok()) return BadFlag(std::string(s.message()));
  if (arch.empty() == arch_file.empty())
    return BadFlag("give exactly one of --arch or --arch-file");
  if ((options.workload.images_per_sample > 0) != (options.workload.image_height > 0)) {
    return BadFlag("--images-per-sample N and --image-size HxW go together");
  }
  if (planner.empty() && HasChannelSecurity(client_options.security)) {
    return BadFlag("--tls-* and --auth-token-file need --planner ADDR");
  }
  std::optional<ModelSpec> spec;
  if (!arch.empty()) {
    spec = FindModelPreset(arch);
    if (!spec.has_value()) return BadFlag("--arch: unknown preset" + UnknownModelPresetHint(arch));
  } else {
    absl::StatusOr<ModelSpec> loaded = LoadHfConfigFile(arch_file);
    if (!loaded.ok()) return BadFlag("--arch-file: " + std::string(loaded.status().message()));
    spec = *loaded;
  }

  LlamaModelOptions model_options;
  model_options.spec = *spec;
  model_options.dtype = *param_dtype;
  try {
    model_options.device = torch::Device(device);
  } catch (const c10::Error&) {
    return BadFlag("--device: not a device: " + device);
  }
  if (model_options.device.is_cuda() && !torch::cuda::is_available()) {
    return Fail("--device " + device + ": CUDA is not available");
  }
  if (on_demand) model_options.param_device = torch::Device(torch::kCPU);
  const auto start = std::chrono::steady_clock::now();
  auto model = LlamaModel::Create(model_options);
  if (!model.ok()) return Fail(model.status().ToString());
  int64_t model_bytes = 0;
  for (const NamedParam& p : (*model)->Params()) model_bytes += p.param.nbytes();
  std::printf("model %s: %lld blocks, %.2f GiB of parameters, built in %.1f s %s\n",
              spec->name.c_str(), static_cast<long long>(spec->num_layers), model_bytes / kGiB,
              SecondsSince(start),
              on_demand ? "in host memory (on-demand profiling)" : "on the device");
  absl::StatusOr<ProfileResult> result;
  if (on_demand) {
    auto od = ProfileModelOnDemand(**model, options, OnDemandOptions{});
    if (!od.ok()) return Fail(od.status().ToString());
    std::printf(
        "on-demand: %d chunks of %.0f MiB in %s host memory (%.2f GiB); device buffers %.2f GiB\n",
        od->n_chunks, od->chunk_bytes / (1024.0 * 1024.0), od->pinned ? "pinned" : "pageable",
        od->host_bytes / kGiB, od->device_buffer_bytes / kGiB);
    result = std::move(od->result);
  } else {
    result = ProfileModel(**model, options);
  }
  if (!result.ok()) return Fail(result.status().ToString());
  PrintTable(*result);
  std::printf("model built and profiled in %.1f s: %d forward+backward passes of %.3f s (timed)\n",
              SecondsSince(start), result->passes, result->step_seconds);
  PrintDeviceMemory(model_options.device);
  if (!out.empty()) {
    const absl::Status s = WriteTextFile(out, TraceToJson(result->trace));
    if (!s.ok()) return Fail(s.ToString());
    std::printf("trace written to %s\n", out.c_str());
  }
  if (!planner.empty()) {
    auto client = PlannerClient::Create(planner, client_options);
    if (!client.ok()) return Fail(client.status().ToString());
    auto id = (*client)->SubmitTrace(result->trace);
    if (!id.ok()) return Fail(id.status().ToString());
    std::printf("trace_id %s\n", id->c_str());
  }
  return 0;
}

}  // namespace memplan
