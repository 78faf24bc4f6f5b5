// [Gemma 2 block price] and [Fused norm] / [Fused gate] against the agent: a tiny gemma2,
// gemma3_text, llama or qwen3 model profiled on the CPU (the profiler measures what each block
// keeps for backward through c10's allocator) keeps what the planner's analytic trace charges per
// block, within 3 %, in fp32 and bf16, full fine-tuning and LoRA; Gemma 3's blocks add q/k norms
// and a sliding layer on its own RoPE, Qwen3's q/k norms.
#include <gtest/gtest.h>

#include <cstdio>
#include <memory>
#include <string>

#include "agent/profiler/model_profiler.h"
#include "common/presets.h"
#include "planner/cost/analytic_trace.h"
#include "tests/agent/tiny_spec.h"

namespace memplan {
namespace {

// TinySpec's model of `family`, tied (as Gemma's checkpoints are), in 2 blocks twice as wide.
ModelSpec TinyGemma(const std::string& family) {
  ModelSpec s = testing::TinySpec(/*tied=*/true, family);
  s.hidden_size = 128;
  s.num_layers = 2;
  s.intermediate_size = 256;
  s.vocab_size = 256;
  return s;
}

class GemmaProfilePlannerTest
    : public ::testing::TestWithParam<std::tuple<DType, bool, std::string>> {};

TEST_P(GemmaProfilePlannerTest, BlocksKeepWhatThePlannerCharges) {
  const DType dtype = std::get<0>(GetParam());
  const bool lora = std::get<1>(GetParam());
  const std::string family = std::get<2>(GetParam());
  const ModelSpec spec = TinyGemma(family);
  LlamaModelOptions o;
  o.spec = spec;
  o.dtype = dtype;
  o.seed = 3;
  TrainingMethod training;
  if (lora) {
    o.lora.rank = 8;
    o.lora.alpha = 16;
    o.lora.targets = {"q_proj", "v_proj"};
    training.kind = TrainingKind::kLora;
    training.lora_rank = 8;
    training.lora_target_modules = {"q_proj", "v_proj"};
  }
  absl::StatusOr<std::unique_ptr<LlamaModel>> model = LlamaModel::Create(o);
  ASSERT_TRUE(model.ok()) << model.status();
  ProfilerOptions p;
  p.workload.micro_batch = 2;
  p.workload.seq_len = 64;
  p.hardware_name = "test-cpu";
  p.chunk_bytes = 64 << 10;
  absl::StatusOr<ProfileResult> measured = ProfileModel(**model, p);
  ASSERT_TRUE(measured.ok()) << measured.status();
  absl::StatusOr<Trace> priced =
      SynthesizeTrace(spec, p.workload, dtype, training, *FindHardwarePreset("h200"));
  ASSERT_TRUE(priced.ok()) << priced.status();
  for (int l = 0; l < spec.num_layers; ++l) {
    const int64_t got = measured->trace.blocks[l].saved_bytes;
    const int64_t want = priced->blocks[l].saved_bytes;
    std::printf("%s %s %s block %d: measured %lld, planner %lld (%.3f)\n", family.c_str(),
                std::string(DTypeName(dtype)).c_str(), lora ? "lora" : "full", l,
                static_cast<long long>(got), static_cast<long long>(want),
                static_cast<double>(want) / static_cast<double>(got));
    EXPECT_NEAR(static_cast<double>(want) / static_cast<double>(got), 1.0, 0.03) << l;
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, GemmaProfilePlannerTest,
                         ::testing::Combine(::testing::Values(DType::kFloat32, DType::kBFloat16),
                                            ::testing::Bool(),
                                            ::testing::Values("gemma2", "gemma3_text", "llama", "qwen3")));

}  // namespace
}  // namespace memplan
