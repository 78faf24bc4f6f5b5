// planner/core/osft_plan.h through MakePlan / PredictPlan: an OSFT method gets a verdict and the
// price of the plan the agent runs (unmanaged, block modes only); bad ratios and chunk knobs are
// refused naming the field.
#include <string>

#include "common/presets.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "planner/core/plan_engine.h"

namespace memplan {
namespace {

using ::testing::HasSubstr;

PlanInputs OsftInputs(const std::string& model, const std::string& card, int64_t seq, double ratio,
                      int32_t world = 1) {
  PlanInputs in;
  in.arch = *FindModelPreset(model);
  in.hardware = *FindHardwarePreset(card);
  in.workload.micro_batch = 1;
  in.workload.seq_len = seq;
  in.workload.world_size = world;
  in.training.kind = TrainingKind::kOsft;
  in.training.osft_rank_ratio = ratio;
  return in;
}

std::string ErrorOf(const PlanInputs& in) {
  auto out = MakePlan(in);
  EXPECT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(out.status().message());
}

TEST(OsftPlanTest, Llama8bOnAnH100FitsUnmanagedAndPricesTheStep) {
  PlanInputs in = OsftInputs("llama-3.1-8b", "h100-80gb", 4096, 0.5);
  auto out = MakePlan(in);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_TRUE(out->fits) << out->reason;
  EXPECT_THAT(out->reason, HasSubstr("OSFT unmanaged"));
  EXPECT_EQ(out->plan.chunk_bytes, 0);
  EXPECT_EQ(out->plan.n_chunks, 0);
  EXPECT_EQ(static_cast<int64_t>(out->plan.block_modes.size()), in.arch.num_layers);
  EXPECT_LE(out->prediction.peak_bytes, out->capacity_bytes);
  EXPECT_GT(out->prediction.iteration_seconds, 0);
  EXPECT_GT(out->prediction.optimizer_seconds, 0);  // the update, the projection
  EXPECT_EQ(out->trace_used.training.kind, TrainingKind::kOsft);
  EXPECT_GT(out->max_micro_batch, 0);
  EXPECT_GT(out->min_gpu_memory_bytes, 0);
  // PredictPlan re-prices the stored plan to the same figures.
  auto again = PredictPlan(in, out->plan);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->peak_bytes, out->prediction.peak_bytes);
  EXPECT_DOUBLE_EQ(again->iteration_seconds, out->prediction.iteration_seconds);

  // Two ranks replicate the model: the same memory, one all-reduce more per step.
  PlanInputs two = OsftInputs("llama-3.1-8b", "h100-80gb", 4096, 0.5, 2);
  auto out2 = MakePlan(two);
  ASSERT_TRUE(out2.ok()) << out2.status();
  EXPECT_TRUE(out2->fits);
  EXPECT_EQ(out2->plan.world_size, 2);
  EXPECT_GT(out2->prediction.iteration_seconds, out->prediction.iteration_seconds);
}

TEST(OsftPlanTest, DoesNotFitWhereNothingCanBeOffloaded) {
  // The model states alone (about 47 GiB at ratio 0.5) exceed a 24 GB card, whatever the modes.
  auto out = MakePlan(OsftInputs("llama-3.1-8b", "rtx-4090", 4096, 0.5));
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_FALSE(out->fits);
  EXPECT_THAT(out->reason, HasSubstr("does not fit"));
  EXPECT_THAT(out->reason, HasSubstr("no chunk can be offloaded"));
  EXPECT_GT(out->min_gpu_memory_bytes, int64_t{40} << 30);
}

TEST(OsftPlanTest, FixedCheckpointCountsAreHonoured) {
  PlanInputs in = OsftInputs("llama-3.2-1b", "h100-80gb", 2048, 0.25);
  in.fixed.n_checkpoint = 5;
  in.skip_limits = true;
  auto out = MakePlan(in);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->plan.n_checkpoint, 5);
}

TEST(OsftPlanTest, RefusesBadRatiosTargetsAndChunkKnobs) {
  for (double ratio : {0.0, 1.0, 1.5, -0.25}) {
    EXPECT_THAT(ErrorOf(OsftInputs("llama-3.2-1b", "h100-80gb", 2048, ratio)),
                HasSubstr("training.osft_rank_ratio = "))
        << ratio;
  }
  EXPECT_THAT(ErrorOf(OsftInputs("llama-3.2-1b", "h100-80gb", 2048, 1.0)),
              HasSubstr("allowed (0, 1)"));
  PlanInputs in = OsftInputs("llama-3.2-1b", "h100-80gb", 2048, 0.5);
  in.training.osft_target_modules = {"q_proj", "lm_head"};
  EXPECT_THAT(ErrorOf(in), HasSubstr("training.osft_target_modules has \"lm_head\""));
  in.training.osft_target_modules = {"q_proj", "q_proj"};
  EXPECT_THAT(ErrorOf(in), HasSubstr("twice"));
  in = OsftInputs("llama-3.2-1b", "h100-80gb", 2048, 0.5);
  in.training.lora_rank = 8;
  EXPECT_THAT(ErrorOf(in), HasSubstr("training.lora_rank"));
  in = OsftInputs("llama-3.2-1b", "h100-80gb", 2048, 0.5);
  in.fixed.n_persist = 3;
  EXPECT_THAT(ErrorOf(in), HasSubstr("fixed.n_persist does not apply to an OSFT run"));
  in = OsftInputs("llama-3.2-1b", "h100-80gb", 2048, 0.5);
  in.fixed.chunk_bytes = int64_t{64} << 20;
  EXPECT_THAT(ErrorOf(in), HasSubstr("fixed.chunk_bytes"));
}

}  // namespace
}  // namespace memplan
