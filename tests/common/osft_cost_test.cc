// common/osft_cost.h: the rank rule, and the price of an OSFT run against hand counts on a tiny
// dense model (the agent's own counts are checked in tests/agent/train/osft_trainer_test.cc).
#include "common/osft_cost.h"

#include <gtest/gtest.h>

#include "common/param_shapes.h"
#include "tests/agent/tiny_spec.h"

namespace memplan {
namespace {

ModelSpec Tiny() {
  ModelSpec s = testing::TinySpec();
  s.num_layers = 2;
  return s;
}

TEST(OsftSplitRanksTest, TheRatioIsTheTrainableFraction) {
  EXPECT_EQ(OsftSplitRanks(4096, 4096, 0.5).high, 2048);
  EXPECT_EQ(OsftSplitRanks(4096, 14336, 0.25).low, 1024);
  EXPECT_EQ(OsftSplitRanks(8, 8, 0.01).low, 1);
  EXPECT_EQ(OsftSplitRanks(8, 8, 0.99).high, 1);
}

TEST(OsftCostTest, CountsBytesAndFlopsOfTheFactors) {
  OsftWorkload w;
  w.rank_ratio = 0.5;
  w.targets = {"q_proj", "down_proj"};
  w.dtype_bytes = 2;
  w.world_size = 2;
  auto c = EstimateOsftCost(Tiny(), w);
  ASSERT_TRUE(c.ok()) << c.status();
  // q_proj [64, 64]: r 64, 32 + 32; down_proj [64, 96]: r 64, 32 + 32; two blocks.
  const int64_t q_part = 32 * (64 + 64 + 1), down_part = 32 * (64 + 96 + 1);
  EXPECT_EQ(c->trainable_params, 2 * (q_part + down_part));
  int64_t dense = 0;
  for (const ParamShape& p : HfParamShapes(Tiny())) dense += p.numel();
  EXPECT_EQ(c->dense_params, dense);
  EXPECT_EQ(c->frozen_params, dense - 2 * (64 * 64 + 64 * 96) + 2 * (q_part + down_part));
  EXPECT_EQ(c->frozen_bytes, 2 * c->frozen_params);
  EXPECT_EQ(c->grad_bytes, 2 * c->trainable_params);
  EXPECT_EQ(c->optimizer_state_bytes, 2 * c->grad_bytes);  // exp_avg + exp_avg_sq, model dtype
  EXPECT_EQ(c->model_state_bytes,
            c->frozen_bytes + c->trainable_bytes + c->grad_bytes + c->optimizer_state_bytes);
  EXPECT_EQ(c->allreduce_bytes_per_step, c->grad_bytes);
  // Forward: 2 k (in + out) + k per part (k = 32, two parts), against 2 in out dense; 2 blocks.
  EXPECT_DOUBLE_EQ(c->forward_flops_per_token,
                   2 * (2 * (2.0 * 32 * 128 + 32) + 2 * (2.0 * 32 * 160 + 32)));
  EXPECT_DOUBLE_EQ(c->dense_forward_flops_per_token, 2 * (2.0 * 64 * 64 + 2.0 * 64 * 96));
  EXPECT_DOUBLE_EQ(c->projection_flops_per_step,
                   2 * (4.0 * 32 * 32 * 128 + 4.0 * 32 * 32 * 160));
  // Loaded dense, then every target replaced by bigger factors: the peak is past the dense model.
  EXPECT_GT(c->load_peak_bytes, 2 * dense);
  EXPECT_GE(c->load_peak_bytes, c->frozen_bytes + c->trainable_bytes);
}

TEST(OsftCostTest, MoreTrainableSpectrumMovesBytesFromFrozenToTrained) {
  OsftWorkload w;
  w.targets = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
  w.rank_ratio = 0.25;
  auto quarter = EstimateOsftCost(Tiny(), w);
  w.rank_ratio = 0.5;
  auto half = EstimateOsftCost(Tiny(), w);
  w.optimizer = OptimizerKind::kSgd;
  auto sgd = EstimateOsftCost(Tiny(), w);
  ASSERT_TRUE(quarter.ok() && half.ok() && sgd.ok());
  EXPECT_LT(quarter->trainable_params, half->trainable_params);
  EXPECT_EQ(quarter->trainable_params + quarter->frozen_params,
            half->trainable_params + half->frozen_params);
  EXPECT_LT(quarter->model_state_bytes, half->model_state_bytes);
  EXPECT_EQ(sgd->optimizer_state_bytes, 0);
  EXPECT_EQ(half->allreduce_bytes_per_step, 0);  // one rank
}

TEST(OsftCostTest, RefusesWhatTheAgentDoesNotRun) {
  OsftWorkload w;
  w.targets = {"q_proj"};
  w.rank_ratio = 1;
  EXPECT_FALSE(EstimateOsftCost(Tiny(), w).ok());
  w.rank_ratio = 0.5;
  w.targets = {"q_proj", "q_proj"};
  EXPECT_FALSE(EstimateOsftCost(Tiny(), w).ok());
  w.targets = {"qproj"};
  EXPECT_FALSE(EstimateOsftCost(Tiny(), w).ok());
  w.targets = {"q_proj"};
  w.optimizer = OptimizerKind::kAdamW8bit;
  EXPECT_FALSE(EstimateOsftCost(Tiny(), w).ok());
  w.optimizer = OptimizerKind::kAdamW;
  ModelSpec moe = Tiny();
  moe.num_experts = 4;
  moe.num_experts_per_tok = 2;
  moe.moe_intermediate_size = 32;
  EXPECT_FALSE(EstimateOsftCost(moe, w).ok());
}

TEST(OsftAllReduceBucketsTest, ParameterOrderClosedBeforeTheLimitLargeOnesAlone) {
  using Ranges = std::vector<std::pair<size_t, size_t>>;
  EXPECT_EQ(OsftAllReduceBuckets({}, 100), Ranges{});
  // 40 + 50 fit; 30 would pass 100; 30 + 70 = 100 fit exactly; 150 alone; 1 after it.
  EXPECT_EQ(OsftAllReduceBuckets({40, 50, 30, 70, 150, 1}, 100),
            (Ranges{{0, 2}, {2, 4}, {4, 5}, {5, 6}}));
  EXPECT_EQ(OsftAllReduceBuckets({10, 10, 10}, 1000), (Ranges{{0, 3}}));
  // Every gradient in exactly one bucket, in order.
  const std::vector<int64_t> sizes = {7, 300, 5, 5, 90, 11, 64, 64, 64, 2};
  const Ranges buckets = OsftAllReduceBuckets(sizes, 128);
  size_t next = 0;
  for (const auto& [begin, end] : buckets) {
    EXPECT_EQ(begin, next);
    EXPECT_LT(begin, end);
    int64_t filled = 0;
    for (size_t i = begin; i < end; ++i) filled += sizes[i];
    if (end - begin > 1) {
      EXPECT_LE(filled, 128);
    }
    EXPECT_LE(filled, std::max<int64_t>(128, OsftBucketBufferBytes(1000, 300, 128)));
    next = end;
  }
  EXPECT_EQ(next, sizes.size());
  EXPECT_EQ(OsftBucketBufferBytes(1000, 300, 128), 300);  // a large gradient alone
  EXPECT_EQ(OsftBucketBufferBytes(1000, 50, 128), 128);
  EXPECT_EQ(OsftBucketBufferBytes(100, 50, 128), 100);    // all of it in one bucket
}

}  // namespace
}  // namespace memplan
