#include "common/validate.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "common/presets.h"

namespace memplan {
namespace {

using ::testing::HasSubstr;

ModelSpec Tiny() { return *FindModelPreset("llama-tiny"); }

TEST(ValidateModelSpecTest, AcceptsEveryPreset) {
  for (const ModelSpec& m : ModelPresets()) {
    EXPECT_TRUE(ValidateModelSpec(m, "arch.").ok()) << m.name;
  }
}

TEST(ValidateModelSpecTest, ZeroLayersNamesFieldAndRange) {
  ModelSpec m = Tiny();
  m.num_layers = 0;
  const absl::Status s = ValidateModelSpec(m, "arch.");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("arch.num_layers = 0"));
  EXPECT_THAT(s.message(), HasSubstr("[1, 4096]"));
}

TEST(ValidateModelSpecTest, HeadsMustDivideHidden) {
  ModelSpec m = Tiny();
  m.num_heads = 7;
  m.num_kv_heads = 7;
  const absl::Status s = ValidateModelSpec(m, "arch.");
  EXPECT_THAT(s.message(), HasSubstr("must divide arch.hidden_size"));
}

TEST(ValidateModelSpecTest, KvHeadsMustDivideHeads) {
  ModelSpec m = Tiny();
  m.num_kv_heads = 3;
  const absl::Status s = ValidateModelSpec(m, "arch.");
  EXPECT_THAT(s.message(), HasSubstr("arch.num_kv_heads = 3 must divide arch.num_heads = 8"));
}

TEST(ValidateWorkloadTest, RejectsNegativeBatch) {
  Workload w;
  w.micro_batch = -1;
  EXPECT_THAT(ValidateWorkload(w, "workload.").message(), HasSubstr("workload.micro_batch = -1"));
}

TEST(ValidateWorkloadTest, LocalWorldSizeIsZeroOrAtMostTheWorldSize) {
  Workload w;
  w.world_size = 8;
  w.local_world_size = 0;  // one node
  EXPECT_TRUE(ValidateWorkload(w, "workload.").ok());
  EXPECT_EQ(LocalRanks(w), 8);
  w.local_world_size = 4;  // two nodes of four
  EXPECT_TRUE(ValidateWorkload(w, "workload.").ok());
  EXPECT_EQ(LocalRanks(w), 4);
  w.local_world_size = 9;
  EXPECT_THAT(ValidateWorkload(w, "workload.").message(),
              HasSubstr("workload.local_world_size = 9 is out of range; allowed [0, 8]"));
}

TEST(ValidateHardwareSpecTest, CapacityBelowContextIsRejected) {
  HardwareSpec h = *FindHardwarePreset("h100-80gb");
  h.cuda_context_bytes = h.gpu_memory_bytes + 1;
  const absl::Status s = ValidateHardwareSpec(h, "hardware.");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("below the CUDA context"));
}

TEST(ValidateTrainingMethodTest, UnknownLoraTargetListsAllowed) {
  TrainingMethod t;
  t.kind = TrainingKind::kLora;
  t.lora_rank = 16;
  t.lora_target_modules = {"q_proj", "qkv"};
  EXPECT_THAT(ValidateTrainingMethod(t, Tiny(), "training.").message(),
              HasSubstr("\"qkv\"; allowed: q_proj"));
}

ModelSpec TinyMoe() {
  ModelSpec m = Tiny();
  m.family = "mixtral";
  m.num_experts = 4;
  m.num_experts_per_tok = 2;
  m.moe_intermediate_size = 64;
  m.norm_topk_prob = true;
  return m;
}

TEST(ValidateModelSpecTest, ExpertsOnlyForMixtureFamiliesAndTopKWithinThem) {
  EXPECT_TRUE(ValidateModelSpec(TinyMoe(), "arch.").ok());
  ModelSpec m = TinyMoe();
  m.num_experts_per_tok = 5;
  EXPECT_THAT(ValidateModelSpec(m, "arch.").message(),
              HasSubstr("arch.num_experts_per_tok = 5 is out of range; allowed [1, 4]"));
  m = TinyMoe();
  m.num_experts = 0;
  EXPECT_THAT(ValidateModelSpec(m, "arch.").message(),
              HasSubstr("arch.num_experts = 0 must be >= 1 for family \"mixtral\""));
  m = Tiny();
  m.num_experts = 4;
  EXPECT_THAT(ValidateModelSpec(m, "arch.").message(),
              HasSubstr("arch.num_experts = 4 must be 0 for family \"llama\""));
  m = TinyMoe();
  m.family = "qwen3_moe";
  m.mlp_only_layers = {4};
  EXPECT_THAT(ValidateModelSpec(m, "arch.").message(),
              HasSubstr("arch.mlp_only_layers[] = 4 is out of range; allowed [0, 3]"));
}

TEST(ValidateTrainingMethodTest, MixtureOfExpertsTakesAdaptersOnAttentionOnly) {
  TrainingMethod t;
  t.kind = TrainingKind::kLora;
  t.lora_rank = 8;
  t.lora_target_modules = {"q_proj", "v_proj"};
  EXPECT_TRUE(ValidateTrainingMethod(t, TinyMoe(), "training.").ok());
  t.lora_target_modules = {"q_proj", "up_proj"};
  EXPECT_THAT(ValidateTrainingMethod(t, TinyMoe(), "training.").message(),
              HasSubstr("LoRA target \"up_proj\" is not supported for the mixture of experts"));
  EXPECT_TRUE(ValidateTrainingMethod(t, Tiny(), "training.").ok());
  t.kind = TrainingKind::kQlora;
  t.lora_target_modules = {"q_proj"};
  EXPECT_THAT(ValidateTrainingMethod(t, TinyMoe(), "training.").message(),
              HasSubstr("QLoRA (an NF4 base) is not supported for the mixture of experts"));
}

TEST(ValidateModelSpecTest, SlidingLayersNeedAWindowAndAscendingIndices) {
  ModelSpec m = Tiny();
  m.sliding_window = 64;
  m.sliding_layers = {0, 1};
  EXPECT_TRUE(ValidateModelSpec(m, "arch.").ok());
  m.sliding_layers = {};
  EXPECT_THAT(ValidateModelSpec(m, "arch.").message(), HasSubstr("arch.sliding_layers"));
  m.sliding_layers = {1, 0};
  EXPECT_THAT(ValidateModelSpec(m, "arch.").message(), HasSubstr("arch.sliding_layers[1] = 0"));
  m.sliding_layers = {m.num_layers};
  EXPECT_THAT(ValidateModelSpec(m, "arch.").message(), HasSubstr("arch.sliding_layers[0]"));
  m.sliding_window = 0;
  m.sliding_layers = {0};
  EXPECT_FALSE(ValidateModelSpec(m, "arch.").ok());
}

TEST(CheckSequenceLengthTest, AcceptsAnyLengthBeyondTheWindow) {
  ModelSpec m = Tiny();
  m.sliding_window = 64;
  m.sliding_layers = {0};
  EXPECT_TRUE(CheckSequenceLength(m, 64).ok());
  EXPECT_TRUE(CheckSequenceLength(m, 65).ok());
  EXPECT_TRUE(CheckSequenceLength(m, 1 << 20).ok());
  EXPECT_FALSE(CheckSequenceLength(m, 0).ok());
  m.sliding_window = -1;
  EXPECT_THAT(CheckSequenceLength(m, 8).message(), HasSubstr("sliding_window"));
}

TEST(CheckHeadChunkLogitBytesTest, ZeroOrOneMibToFourGib) {
  EXPECT_TRUE(CheckHeadChunkLogitBytes("plan.head_chunk_logit_bytes", 0).ok());
  EXPECT_TRUE(CheckHeadChunkLogitBytes("plan.head_chunk_logit_bytes", int64_t{1} << 20).ok());
  EXPECT_TRUE(CheckHeadChunkLogitBytes("plan.head_chunk_logit_bytes", int64_t{4} << 30).ok());
  for (const int64_t bad : {int64_t{-1}, (int64_t{1} << 20) - 1, (int64_t{4} << 30) + 1}) {
    const absl::Status s = CheckHeadChunkLogitBytes("plan.head_chunk_logit_bytes", bad);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(s.message(), ::testing::HasSubstr("plan.head_chunk_logit_bytes"));
    EXPECT_THAT(s.message(), ::testing::HasSubstr("[1048576, 4294967296]"));
  }
}

}  // namespace
}  // namespace memplan
