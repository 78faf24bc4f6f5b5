// One layout: for every model preset, both parameter dtypes and every chunk size the planner
// searches, the plan's n_chunks and layout fingerprint, the cost model's chunk sizes and the
// planner's parameter list per chunk are exactly what the agent builds: ChunkManager::LayoutOf
// (the packing ChunkManager::Create uses) over LlamaModel::ParamGroups() of a meta model (shapes
// only, so a 70B preset costs no memory).
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "agent/chunks/chunk_manager.h"
#include "agent/model/llama_model.h"
#include "common/chunk_packing.h"
#include "common/presets.h"
#include "gtest/gtest.h"
#include "planner/core/plan_engine.h"
#include "planner/cost/analytic_trace.h"
#include "planner/cost/chunk_layout.h"
#include "planner/cost/cost_model.h"

namespace memplan {
namespace {

constexpr int64_t kMiB = int64_t{1} << 20;

std::unique_ptr<LlamaModel> MetaModel(const ModelSpec& spec, DType dtype) {
  LlamaModelOptions options;
  options.spec = spec;
  options.dtype = dtype;
  options.param_device = torch::Device(torch::kMeta);
  absl::StatusOr<std::unique_ptr<LlamaModel>> model = LlamaModel::Create(options);
  EXPECT_TRUE(model.ok()) << model.status();
  return model.ok() ? *std::move(model) : nullptr;
}

// Parameter names of each chunk, in packing order.
std::vector<std::vector<std::string>> ChunkNames(const ChunkPacking& packing) {
  std::vector<std::vector<std::string>> names;
  for (const ChunkInfo& chunk : packing.chunks()) {
    names.emplace_back();
    for (int i : chunk.params) names.back().push_back(packing.params()[i].name);
  }
  return names;
}

TEST(PlanLayoutTest, PlannerLayoutIsTheAgentsForEveryPresetAndChunkCandidate) {
  const std::optional<HardwareSpec> hardware = FindHardwarePreset("h100-80gb");
  ASSERT_TRUE(hardware.has_value());
  Workload workload;
  workload.micro_batch = 1;
  workload.seq_len = 1024;
  int checked = 0;
  for (const ModelSpec& spec : ModelPresets()) {
    for (DType dtype : {DType::kBFloat16, DType::kFloat32}) {
      SCOPED_TRACE(absl::StrCat(spec.name, " ", std::string(DTypeName(dtype))));
      const std::unique_ptr<LlamaModel> model = MetaModel(spec, dtype);
      ASSERT_NE(model, nullptr);
      const ParamGroups groups = model->ParamGroups();
      // A vision-language preset is planned with its images (its tower in group 0).
      Workload w = workload;
      if (spec.IsVisionLanguage()) {
        w.images_per_sample = 1;
        w.image_height = w.image_width = 448;
      }
      absl::StatusOr<Trace> trace = SynthesizeTrace(spec, w, dtype, TrainingMethod{}, *hardware);
      ASSERT_TRUE(trace.ok()) << trace.status();
      ASSERT_TRUE(ArchMatchesTrace(*trace));
      for (int64_t chunk_bytes : ChunkCandidates(FixedKnobs{}, *trace)) {
        SCOPED_TRACE(absl::StrCat("chunk ", chunk_bytes / kMiB, " MiB"));
        ChunkManagerOptions chunk_options;
        chunk_options.chunk_bytes = chunk_bytes;
        absl::StatusOr<ChunkPacking> agent = ChunkManager::LayoutOf(groups, chunk_options);
        ASSERT_TRUE(agent.ok()) << agent.status();

        // What the plan carries.
        absl::StatusOr<CostModel> cost = CostModel::Create(*trace, chunk_bytes, *hardware, {});
        ASSERT_TRUE(cost.ok()) << cost.status();
        const ResidencyPlan plan =
            cost->MakeResidencyPlan(0, 1, ModeCounts{}, HostMemoryKind::kPinned);
        EXPECT_EQ(plan.n_chunks, agent->num_chunks());
        EXPECT_EQ(plan.layout_fingerprint, agent->fingerprint());

        // What the cost model charges, chunk by chunk.
        const ChunkLayout& layout = cost->layout();
        ASSERT_EQ(layout.num_chunks(), agent->num_chunks());
        for (int c = 0; c < layout.num_chunks(); ++c) {
          EXPECT_EQ(layout.chunk_param_bytes[c], agent->chunks()[c].size_bytes) << "chunk " << c;
          EXPECT_EQ(layout.chunk_oversized[c], agent->chunks()[c].oversized) << "chunk " << c;
        }

        // Which parameters each chunk holds.
        const std::optional<ChunkPacking> planner = ArchPacking(*trace, chunk_bytes);
        ASSERT_TRUE(planner.has_value());
        EXPECT_EQ(ChunkNames(*planner), ChunkNames(*agent));
        ++checked;
      }
    }
  }
  EXPECT_GE(checked, 2 * static_cast<int>(ModelPresets().size()) * 4);
}

// The figures of issue 14: llama-3.1-8b in bf16 at 32 MiB, where the planner once listed
// input_layernorm before q_proj and so counted other chunks than the agent built.
TEST(PlanLayoutTest, Llama31_8BAt32MiBPlanMatchesTheAgent) {
  const std::optional<ModelSpec> spec = FindModelPreset("llama-3.1-8b");
  ASSERT_TRUE(spec.has_value());
  const std::unique_ptr<LlamaModel> model = MetaModel(*spec, DType::kBFloat16);
  ASSERT_NE(model, nullptr);
  ChunkManagerOptions chunk_options;
  chunk_options.chunk_bytes = 32 * kMiB;
  absl::StatusOr<ChunkPacking> agent = ChunkManager::LayoutOf(model->ParamGroups(), chunk_options);
  ASSERT_TRUE(agent.ok()) << agent.status();

  PlanInputs in;
  in.arch = *spec;
  in.hardware = *FindHardwarePreset("h100-80gb");
  in.workload.micro_batch = 1;
  in.workload.seq_len = 4096;
  in.param_dtype = DType::kBFloat16;
  in.fixed.chunk_bytes = 32 * kMiB;
  in.skip_limits = true;
  in.max_alternatives = 0;
  absl::StatusOr<PlanOutcome> out = MakePlan(in);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->plan.n_chunks, agent->num_chunks());
  EXPECT_EQ(out->plan.layout_fingerprint, agent->fingerprint());
  EXPECT_EQ(out->trace_used.chunk_param_bytes.size(), agent->chunks().size());
  std::printf("llama-3.1-8b bf16, 32 MiB chunks: planner %d, agent %d chunks, fingerprint %s\n",
              out->plan.n_chunks, agent->num_chunks(), agent->fingerprint().c_str());
}

}  // namespace
}  // namespace memplan
