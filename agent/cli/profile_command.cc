#include "agent/cli/profile_command.h"

#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "agent/client/planner_client.h"
#include "agent/client/record_json.h"
#include "agent/profiler/model_profiler.h"
#include "common/presets.h"

namespace memplan {
namespace {

constexpr char kProfileUsage[] =
    "usage: memplan-agent profile --arch NAME [--batch B] [--seq S] [--dtype fp32|bf16|fp16]\n"
    "         [--device cpu|cuda|cuda:N] [--hardware NAME] [--chunk-bytes N] [--out FILE]\n"
    "         [--planner ADDR]\n";

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

int RunProfileCommand(const std::vector<std::string>& args) {
  std::string arch, dtype = "fp32", device = "cpu", out, planner;
  ProfilerOptions options;
  options.workload.micro_batch = 1;
  options.workload.seq_len = 128;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--help" || a == "-h") {
      std::fputs(kProfileUsage, stdout);
      return 0;
    }
    if (i + 1 >= args.size()) return BadFlag("flag " + a + " needs a value");
    const std::string& v = args[++i];
    bool number_ok = true;
    if (a == "--arch") {
      arch = v;
    } else if (a == "--batch") {
      number_ok = absl::SimpleAtoi(v, &options.workload.micro_batch);
    } else if (a == "--seq") {
      number_ok = absl::SimpleAtoi(v, &options.workload.seq_len);
    } else if (a == "--dtype") {
      dtype = v;
    } else if (a == "--device") {
      device = v;
    } else if (a == "--hardware") {
      options.hardware_name = v;
    } else if (a == "--chunk-bytes") {
      number_ok = absl::SimpleAtoi(v, &options.chunk_bytes);
    } else if (a == "--out") {
      out = v;
    } else if (a == "--planner") {
      planner = v;
    } else {
      return BadFlag("unknown flag " + a);
    }
    if (!number_ok) return BadFlag(a + ": not an integer: " + v);
  }
  const std::optional<ModelSpec> spec = FindModelPreset(arch);
  if (!spec.has_value()) return BadFlag("--arch: unknown preset; one of " + ModelPresetNames());
  const std::optional<DType> param_dtype = ParseDType(dtype);
  if (!param_dtype.has_value()) return BadFlag("--dtype must be fp32, bf16 or fp16");

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
  auto model = LlamaModel::Create(model_options);
  if (!model.ok()) return Fail(model.status().ToString());
  auto result = ProfileModel(**model, options);
  if (!result.ok()) return Fail(result.status().ToString());
  PrintTable(*result);
  if (!out.empty()) {
    const absl::Status s = WriteTextFile(out, TraceToJson(result->trace));
    if (!s.ok()) return Fail(s.ToString());
    std::printf("trace written to %s\n", out.c_str());
  }
  if (!planner.empty()) {
    auto client = PlannerClient::Create(planner, PlannerClientOptions{});
    if (!client.ok()) return Fail(client.status().ToString());
    auto id = (*client)->SubmitTrace(result->trace);
    if (!id.ok()) return Fail(id.status().ToString());
    std::printf("trace_id %s\n", id->c_str());
  }
  return 0;
}

}  // namespace memplan
