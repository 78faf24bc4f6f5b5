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

}  // namespace
}  // namespace memplan
