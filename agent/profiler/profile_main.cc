// memplan-profile: profiles a preset model at a workload, prints the per-block table, writes the
// trace (proto JSON) and optionally submits it to a planner.
// Usage: memplan-profile --arch NAME [--batch B] [--seq S] [--dtype fp32|bf16|fp16]
//          [--device cpu|cuda|cuda:N] [--hardware NAME] [--chunk-bytes N] [--out FILE]
//          [--planner ADDR]
#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/strings/str_format.h"
#include "agent/client/planner_client.h"
#include "agent/client/record_json.h"
#include "agent/profiler/model_profiler.h"
#include "common/presets.h"

namespace {

int Fail(const std::string& message) {
  std::fprintf(stderr, "memplan-profile: %s\n", message.c_str());
  return 1;
}

void PrintTable(const memplan::ProfileResult& r) {
  const memplan::Trace& t = r.trace;
  constexpr double kMiB = 1024.0 * 1024.0;
  std::printf("%-10s %10s %10s %10s %10s %10s %10s %10s\n", "group", "param_MiB", "input_MiB",
              "saved_MiB", "fwd_ms", "bwd_ms", "recomp_ms", "bwd_tr_MiB");
  auto edge = [&](const char* name, const memplan::EdgeTrace& e) {
    std::printf("%-10s %10.2f %10s %10.2f %10.3f %10.3f %10s %10.2f\n", name, e.param_bytes / kMiB,
                "", e.saved_bytes / kMiB, e.forward_seconds * 1e3, e.backward_seconds * 1e3, "",
                e.backward_transient_bytes / kMiB);
  };
  edge("embedding", t.embedding);
  for (size_t i = 0; i < t.blocks.size(); ++i) {
    const memplan::BlockTrace& b = t.blocks[i];
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

int main(int argc, char** argv) {
  std::string arch, dtype = "fp32", device = "cpu", out, planner;
  memplan::ProfilerOptions options;
  options.workload.micro_batch = 1;
  options.workload.seq_len = 128;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) return Fail("flag " + a + " needs a value");
    const std::string v = argv[++i];
    if (a == "--arch") {
      arch = v;
    } else if (a == "--batch") {
      options.workload.micro_batch = std::atoll(v.c_str());
    } else if (a == "--seq") {
      options.workload.seq_len = std::atoll(v.c_str());
    } else if (a == "--dtype") {
      dtype = v;
    } else if (a == "--device") {
      device = v;
    } else if (a == "--hardware") {
      options.hardware_name = v;
    } else if (a == "--chunk-bytes") {
      options.chunk_bytes = std::atoll(v.c_str());
    } else if (a == "--out") {
      out = v;
    } else if (a == "--planner") {
      planner = v;
    } else {
      return Fail("unknown flag " + a);
    }
  }
  const std::optional<memplan::ModelSpec> spec = memplan::FindModelPreset(arch);
  if (!spec.has_value())
    return Fail("--arch: unknown preset; one of " + memplan::ModelPresetNames());
  const std::optional<memplan::DType> param_dtype = memplan::ParseDType(dtype);
  if (!param_dtype.has_value()) return Fail("--dtype must be fp32, bf16 or fp16");

  memplan::LlamaModelOptions model_options;
  model_options.spec = *spec;
  model_options.dtype = *param_dtype;
  try {
    model_options.device = torch::Device(device);
  } catch (const c10::Error&) {
    return Fail("--device: not a device: " + device);
  }
  auto model = memplan::LlamaModel::Create(model_options);
  if (!model.ok()) return Fail(model.status().ToString());
  auto result = memplan::ProfileModel(**model, options);
  if (!result.ok()) return Fail(result.status().ToString());
  PrintTable(*result);
  if (!out.empty()) {
    const absl::Status s = memplan::WriteTextFile(out, memplan::TraceToJson(result->trace));
    if (!s.ok()) return Fail(s.ToString());
    std::printf("trace written to %s\n", out.c_str());
  }
  if (!planner.empty()) {
    auto client = memplan::PlannerClient::Create(planner, memplan::PlannerClientOptions{});
    if (!client.ok()) return Fail(client.status().ToString());
    auto id = (*client)->SubmitTrace(result->trace);
    if (!id.ok()) return Fail(id.status().ToString());
    std::printf("trace_id %s\n", id->c_str());
  }
  return 0;
}
