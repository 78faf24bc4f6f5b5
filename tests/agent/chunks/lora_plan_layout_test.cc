// [LoRA managers] byte for byte: for a LoRA or QLoRA run the planner's cost model charges exactly what the
// agent's two chunk managers hold — the frozen base's chunks (parameters only, on the device for
// n_persist of them, on the host for the rest) and the adapters' chunks with their optimizer
// state, all on the device — for fp32 and bf16 (fp32 master) models, several chunk sizes and
// n_persist values; and the adapters' packing is common/lora_shapes.h's. QLoRA's base chunks hold
// NF4 parts beside model-dtype norms ([Byte chunks], [QLoRA layout]).
#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "agent/chunks/chunk_manager.h"
#include "agent/model/llama_model.h"
#include "common/chunk_packing.h"
#include "common/lora_shapes.h"
#include "common/presets.h"
#include "gtest/gtest.h"
#include "planner/core/plan_engine.h"
#include "planner/cost/analytic_trace.h"
#include "planner/cost/chunk_layout.h"
#include "planner/cost/cost_model.h"

namespace memplan {
namespace {

const bool kSingleThread = [] {
  torch::set_num_threads(1);
  return true;
}();

class LoraManagersPlanTest : public ::testing::TestWithParam<TrainingKind> {};

TEST_P(LoraManagersPlanTest, CostModelChargesWhatTheAgentsManagersHold) {
  const std::optional<ModelSpec> spec = FindModelPreset("llama-tiny");
  ASSERT_TRUE(spec.has_value());
  const std::optional<HardwareSpec> hardware = FindHardwarePreset("h100-80gb");
  ASSERT_TRUE(hardware.has_value());
  TrainingMethod method;
  method.kind = GetParam();
  method.lora_rank = 8;
  method.lora_target_modules = {"q_proj", "v_proj", "down_proj"};
  Workload workload;
  workload.micro_batch = 1;
  workload.seq_len = 64;
  int checked = 0;
  for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
    LlamaModelOptions model_options;
    model_options.spec = *spec;
    model_options.dtype = dtype;
    model_options.lora.rank = method.lora_rank;
    model_options.lora.targets = method.lora_target_modules;
    model_options.lora.nf4_base = method.kind == TrainingKind::kQlora;
    absl::StatusOr<Trace> trace = SynthesizeTrace(*spec, workload, dtype, method, *hardware);
    ASSERT_TRUE(trace.ok()) << trace.status();
    ASSERT_TRUE(ArchMatchesTrace(*trace));
    const int64_t dtype_bytes = DTypeBytes(dtype);
    for (int64_t chunk_bytes : {int64_t{1} << 20, int64_t{3} << 20}) {
      absl::StatusOr<CostModel> cost = CostModel::Create(*trace, chunk_bytes, *hardware, {});
      ASSERT_TRUE(cost.ok()) << cost.status();
      for (int wanted : {0, 1, 3}) {
        // QLoRA's NF4 base may pack into fewer chunks than 3: the planner asks n_persist <= n_chunks.
        const int n_persist = std::min(wanted, cost->num_chunks());
        SCOPED_TRACE(absl::StrCat(std::string(DTypeName(dtype)), ", chunk ", chunk_bytes,
                                  ", n_persist ", n_persist));
        // A fresh model per manager pair: Create moves its parameters into the chunks.
        auto model = LlamaModel::Create(model_options);
        ASSERT_TRUE(model.ok()) << model.status();
        ChunkManagerOptions base_options;
        base_options.chunk_bytes = chunk_bytes;
        base_options.n_persist = n_persist;
        base_options.host_memory = HostMemoryKind::kPageable;
        base_options.frozen = true;
        auto base = ChunkManager::Create((*model)->ParamGroups(), base_options);
        ASSERT_TRUE(base.ok()) << base.status();
        ChunkManagerOptions adapter_options = base_options;
        adapter_options.frozen = false;
        adapter_options.n_persist = 1 << 20;  // all (the trainer's default)
        auto adapters = ChunkManager::Create((*model)->AdapterGroups(), adapter_options);
        ASSERT_TRUE(adapters.ok()) << adapters.status();
        const ChunkMemoryStats b = (*base)->MemoryStats();
        const ChunkMemoryStats a = (*adapters)->MemoryStats();

        // The plan names the base's layout.
        const ResidencyPlan plan =
            cost->MakeResidencyPlan(n_persist, 2, ModeCounts{}, HostMemoryKind::kPageable);
        EXPECT_EQ(plan.n_chunks, b.n_chunks);
        EXPECT_EQ(plan.layout_fingerprint, b.layout_fingerprint);
        // The adapters are packed as common/lora_shapes.h says.
        absl::StatusOr<ChunkPacking> shared = ChunkPacking::Build(
            LoraLayoutParams(*spec, method, dtype_bytes), {chunk_bytes, kChunkAlignmentBytes});
        ASSERT_TRUE(shared.ok()) << shared.status();
        EXPECT_EQ(shared->fingerprint(), a.layout_fingerprint);
        EXPECT_EQ(a.n_persist, a.n_chunks);

        // Device: base persistent chunks (no state) + adapter chunks + their state.
        EXPECT_EQ(b.persistent_state_device_bytes, 0);
        EXPECT_EQ(cost->PersistentRawBytes(n_persist), b.persistent_device_bytes +
                                                           a.persistent_device_bytes +
                                                           a.persistent_state_device_bytes);
        // Host: the offloaded base chunks' parameters only; nothing of the adapters.
        EXPECT_EQ(a.host_pinned_bytes + a.host_pageable_bytes, 0);
        EXPECT_EQ(cost->HostBytes(n_persist, ModeCounts{}),
                  b.host_pinned_bytes + b.host_pageable_bytes);
        // Buffers stream the offloaded base chunks (the adapters need none).
        EXPECT_EQ(a.buffer_device_bytes, 0);
        ++checked;
      }
    }
  }
  EXPECT_EQ(checked, 12);
}

INSTANTIATE_TEST_SUITE_P(Methods, LoraManagersPlanTest,
                         ::testing::Values(TrainingKind::kLora, TrainingKind::kQlora),
                         [](const ::testing::TestParamInfo<TrainingKind>& info) {
                           return info.param == TrainingKind::kQlora ? "Qlora" : "Lora";
                         });

// The adapters' grads and step copy, as common/lora_shapes.h counts them, after a real backward.
TEST(LoraPlanLayoutTest, AdapterGradBytesAreTheSharedDefinition) {
  const std::optional<ModelSpec> spec = FindModelPreset("llama-tiny");
  ASSERT_TRUE(spec.has_value());
  LlamaModelOptions o;
  o.spec = *spec;
  o.lora.rank = 4;
  o.lora.targets = {"k_proj", "o_proj", "gate_proj", "up_proj"};
  auto model = LlamaModel::Create(o);
  ASSERT_TRUE(model.ok()) << model.status();
  const torch::Tensor ids = torch::randint(spec->vocab_size, {1, 16}, torch::kLong);
  (*model)->Loss(ids, ids).backward();
  int64_t grad_bytes = 0, params = 0;
  for (const auto& p : (*model)->TrainableParams()) {
    ASSERT_TRUE(p.param.grad().defined()) << p.name;
    grad_bytes += p.param.grad().numel() * p.param.grad().element_size();
    params += p.param.numel();
  }
  auto bytes = PersistentLoraAdapterBytes(*spec, LoraTrainingMethod(o.lora), 4,
                                          {int64_t{1} << 20, 256}, OptimizerKind::kAdamW);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  EXPECT_EQ(bytes->grad_bytes, grad_bytes);
  EXPECT_EQ(bytes->params, params);
  EXPECT_EQ(bytes->step_extra_bytes, 0) << "fp32: the update needs no fp32 copy";
}

// The reference case: llama-3.1-8b, LoRA r16 on every projection, 1 x 4096 on a 24 GB
// card. The plan names the agent's base layout (so the agent checks it), and fits.
TEST(LoraPlanLayoutTest, Llama8BLoraR16PlansForA24GBCard) {
  const std::optional<ModelSpec> spec = FindModelPreset("llama-3.1-8b");
  ASSERT_TRUE(spec.has_value());
  PlanInputs in;
  in.arch = *spec;
  in.hardware = *FindHardwarePreset("rtx-4090");
  in.workload.micro_batch = 1;
  in.workload.seq_len = 4096;
  in.param_dtype = DType::kBFloat16;
  in.training.kind = TrainingKind::kLora;
  in.training.lora_rank = 16;
  in.training.lora_target_modules = {"q_proj",    "k_proj",  "v_proj",   "o_proj",
                                     "gate_proj", "up_proj", "down_proj"};
  in.max_alternatives = 0;
  absl::StatusOr<PlanOutcome> out = MakePlan(in);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_TRUE(out->fits) << out->reason;
  LlamaModelOptions o;
  o.spec = *spec;
  o.dtype = DType::kBFloat16;
  o.param_device = torch::Device(torch::kMeta);
  o.lora.rank = 16;
  o.lora.targets = in.training.lora_target_modules;
  auto model = LlamaModel::Create(o);
  ASSERT_TRUE(model.ok()) << model.status();
  ChunkManagerOptions chunks;
  chunks.chunk_bytes = out->plan.chunk_bytes;
  absl::StatusOr<ChunkPacking> base = ChunkManager::LayoutOf((*model)->ParamGroups(), chunks);
  ASSERT_TRUE(base.ok()) << base.status();
  EXPECT_EQ(out->plan.n_chunks, base->num_chunks());
  EXPECT_EQ(out->plan.layout_fingerprint, base->fingerprint());
  std::printf(
      "llama-3.1-8b LoRA r16 all, 1x4096 on rtx-4090: fits=%d peak %.2f GiB, n_persist %d "
      "of %d chunks (%lld MiB), %.0f tokens/s\n",
      out->fits, out->prediction.peak_bytes / 1073741824.0, out->plan.n_persist, out->plan.n_chunks,
      static_cast<long long>(out->plan.chunk_bytes >> 20), out->prediction.tokens_per_second);
}

}  // namespace
}  // namespace memplan
