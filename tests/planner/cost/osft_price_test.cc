// planner/cost/osft_terms.h and osft_price.h: the OSFT analytic trace and the price of an OSFT
// run, against counts derived here from a tiny config. The same counts are the agent's: its split
// model's parameter and gradient counts equal EstimateOsftCost's
// (tests/agent/train/osft_trainer_test.cc, PlannerCountsAreTheModelsAfterTheSplit), and these
// tests hold the planner's terms to EstimateOsftCost's.
#include "planner/cost/osft_price.h"

#include <cmath>

#include "common/osft_cost.h"
#include "common/param_shapes.h"
#include "common/presets.h"
#include "gtest/gtest.h"
#include "planner/core/plan_engine.h"
#include "planner/cost/analytic_trace.h"
#include "planner/cost/osft_terms.h"
#include "tests/agent/tiny_spec.h"

namespace memplan {
namespace {

// hidden 64, 4 heads of 16 with 2 KV heads (k, v: [32, 64]), MLP 96, two blocks.
ModelSpec Tiny() {
  ModelSpec s = testing::TinySpec();
  s.num_layers = 2;
  return s;
}

TrainingMethod Osft(double ratio, std::vector<std::string> targets = {}) {
  TrainingMethod t;
  t.kind = TrainingKind::kOsft;
  t.osft_rank_ratio = ratio;
  t.osft_target_modules = std::move(targets);
  return t;
}

Workload Work(int64_t batch, int64_t seq, int32_t world = 1, int32_t accum = 1) {
  Workload w;
  w.micro_batch = batch;
  w.seq_len = seq;
  w.world_size = world;
  w.grad_accum = accum;
  return w;
}

HardwareSpec Card() { return *FindHardwarePreset("h100-80gb"); }

// Every projection at ratio 0.5 (r = min(out, in); low = r - floor(r / 2)): q, o [64, 64] and
// gate, up, down (r 64) train 32 directions, k, v [32, 64] 16. Factors hold low (out + in + 1).
constexpr int64_t kLowPerBlock = 32 * (64 + 64 + 1) * 2                    // q, o
                                 + 16 * (32 + 64 + 1) * 2                  // k, v
                                 + 32 * (96 + 64 + 1) * 3;                 // gate, up, down
constexpr int64_t kSavedLowPerToken = 2 * 2 * (32 * 2 + 16 * 2 + 32 * 3);  // 2 tensors, bf16

TEST(OsftTraceTest, TheBlocksKeepTheLowProductsBesideAFrozenBasesActivations) {
  // A LoRA trace of the same targets keeps the same frozen-base activations plus A x (rank
  // wide) per target: the OSFT trace keeps x·V_low and its S_low scaling instead.
  TrainingMethod lora;
  lora.kind = TrainingKind::kLora;
  lora.lora_rank = 8;
  lora.lora_target_modules = OsftTargetModules(Osft(0.5));
  const Workload w = Work(2, 64);
  auto lt = SynthesizeTrace(Tiny(), w, DType::kBFloat16, lora, Card());
  auto ot = SynthesizeTrace(Tiny(), w, DType::kBFloat16, Osft(0.5), Card());
  ASSERT_TRUE(lt.ok()) << lt.status();
  ASSERT_TRUE(ot.ok()) << ot.status();
  const int64_t tokens = 2 * 64;
  EXPECT_EQ(ot->blocks[0].saved_bytes,
            lt->blocks[0].saved_bytes - tokens * 7 * 2 * 8 + tokens * kSavedLowPerToken);
  EXPECT_EQ(ot->blocks[0].input_bytes, lt->blocks[0].input_bytes);
  // The head and embedding are frozen in both.
  EXPECT_EQ(ot->head.saved_bytes, lt->head.saved_bytes);
  EXPECT_EQ(ot->trainable_param_count, 2 * kLowPerBlock);
  // Block parameters: the dense block's plus the factors' growth.
  int64_t dense_block = 0, factors = 0;
  for (const ParamShape& p : HfParamShapes(Tiny())) {
    if (p.name.rfind("model.layers.0.", 0) != 0) continue;
    dense_block += p.numel();
    if (p.shape.size() == 2) {
      const int64_t r = std::min(p.shape[0], p.shape[1]);
      factors += r * (p.shape[0] + p.shape[1] + 1) - p.numel();
    }
  }
  EXPECT_EQ(ot->blocks[0].param_bytes, 2 * (dense_block + factors));
}

TEST(OsftPriceTest, ModelStatesAreEstimateOsftCostsAndTheAgents) {
  auto trace = SynthesizeTrace(Tiny(), Work(1, 32), DType::kBFloat16, Osft(0.5), Card());
  ASSERT_TRUE(trace.ok()) << trace.status();
  CostOptions options;
  auto pricer = OsftPricer::Create(*trace, Card(), options);
  ASSERT_TRUE(pricer.ok()) << pricer.status();
  const Prediction p = pricer->Predict(ModeCounts{});
  // Hand counts: 2 blocks of low factors, bf16; gradients alike; exp_avg + exp_avg_sq alike.
  const int64_t trainable = 2 * 2 * kLowPerBlock;
  int64_t dense = 0;
  for (const ParamShape& s : HfParamShapes(Tiny())) dense += s.numel();
  int64_t factors_growth = 0;
  for (const ParamShape& s : HfParamShapes(Tiny())) {
    if (s.name.rfind("model.layers.", 0) == 0 && s.shape.size() == 2) {
      const int64_t r = std::min(s.shape[0], s.shape[1]);
      factors_growth += r * (s.shape[0] + s.shape[1] + 1) - s.numel();
    }
  }
  const int64_t frozen = 2 * (dense + factors_growth) - trainable;
  EXPECT_EQ(pricer->cost().trainable_bytes, trainable);
  EXPECT_EQ(pricer->cost().frozen_bytes, frozen);
  EXPECT_EQ(p.breakdown.persistent_chunks_bytes, frozen + trainable);
  EXPECT_EQ(p.breakdown.optimizer_state_bytes, 2 * trainable);
  EXPECT_EQ(p.breakdown.exact_bytes, frozen + 3 * trainable);
  EXPECT_EQ(p.breakdown.buffers_bytes, 0);
  // The same figures as EstimateOsftCost's, the function the agent's counts are checked against.
  OsftWorkload w;
  w.rank_ratio = 0.5;
  w.targets = OsftTargetModules(Osft(0.5));
  auto cost = EstimateOsftCost(Tiny(), w);
  ASSERT_TRUE(cost.ok());
  EXPECT_EQ(pricer->cost().model_state_bytes, cost->model_state_bytes);
  EXPECT_EQ(pricer->cost().load_peak_bytes, cost->load_peak_bytes);
  // Calibration contract: peak = exact + ceil(alpha (raw - exact)) + residual + context.
  const int64_t raw = RawModelBytes(p);
  EXPECT_EQ(p.peak_bytes,
            p.breakdown.exact_bytes +
                static_cast<int64_t>(
                    std::ceil(p.breakdown.fragmentation_factor * (raw - p.breakdown.exact_bytes))) +
                p.breakdown.calibration_residual_bytes + p.breakdown.cuda_context_bytes);
  // Load: the SVD split's peak, with the context.
  EXPECT_EQ(p.load_peak_bytes, cost->load_peak_bytes + p.breakdown.calibration_residual_bytes +
                                   p.breakdown.cuda_context_bytes);
  EXPECT_EQ(p.host_pinned_bytes + p.host_pageable_bytes, 0);
}

TEST(OsftPriceTest, BlockModesTradeActivationsForTime) {
  auto trace = SynthesizeTrace(Tiny(), Work(4, 512), DType::kBFloat16, Osft(0.5), Card());
  ASSERT_TRUE(trace.ok()) << trace.status();
  auto pricer = OsftPricer::Create(*trace, Card(), CostOptions{});
  ASSERT_TRUE(pricer.ok());
  const Prediction none = pricer->Predict(ModeCounts{});
  const Prediction ckpt = pricer->Predict(ModeCounts{0, 0, 2});
  EXPECT_LT(ckpt.peak_bytes, none.peak_bytes);
  EXPECT_GT(ckpt.iteration_seconds, none.iteration_seconds);
  EXPECT_GT(ckpt.breakdown.checkpoint_chain_bytes, 0);
  const Prediction hs = pricer->Predict(ModeCounts{0, 2, 0});
  EXPECT_GT(hs.host_pinned_bytes, 0);
  const ResidencyPlan plan = pricer->MakePlan(ModeCounts{0, 0, 2});
  EXPECT_EQ(plan.chunk_bytes, 0);
  EXPECT_EQ(plan.n_checkpoint, 2);
  EXPECT_EQ(plan.block_modes, (std::vector<BlockMode>{BlockMode::kCkpt, BlockMode::kCkpt}));
}

TEST(OsftPriceTest, RanksAddOneAllReduceAndAccumulationKeepsTheGrads) {
  auto trace = SynthesizeTrace(Tiny(), Work(1, 64), DType::kBFloat16, Osft(0.5), Card());
  ASSERT_TRUE(trace.ok());
  const HardwareSpec hw = Card();
  CostOptions one;
  CostOptions two;
  two.world_size = 2;
  two.local_world_size = 2;
  auto p1 = OsftPricer::Create(*trace, hw, one);
  auto p2 = OsftPricer::Create(*trace, hw, two);
  ASSERT_TRUE(p1.ok() && p2.ok());
  // The low gradients' buffer (model dtype) is reduce-scattered and all-gathered: half of it
  // crosses each way with two ranks.
  const double half = 0.5 * static_cast<double>(p2->cost().grad_bytes);
  EXPECT_EQ(p2->cost().allreduce_bytes_per_step, p2->cost().grad_bytes);
  EXPECT_NEAR(
      p2->StepSeconds() - p1->StepSeconds(),
      half / hw.nccl_reduce_scatter_bytes_per_second + half / hw.nccl_allgather_bytes_per_second,
      1e-12);
  const Prediction a = p1->Predict(ModeCounts{});
  const Prediction b = p2->Predict(ModeCounts{});
  EXPECT_GT(b.iteration_seconds, a.iteration_seconds);
  EXPECT_DOUBLE_EQ(b.forward_seconds, a.forward_seconds);
  // Several micro-batches: every gradient exists beside the activations.
  CostOptions accum = one;
  accum.grad_accum = 2;
  auto pa = OsftPricer::Create(*trace, hw, accum);
  ASSERT_TRUE(pa.ok());
  const Prediction c = pa->Predict(ModeCounts{});
  EXPECT_EQ(c.breakdown.grads_bytes, pa->cost().grad_bytes);
  EXPECT_GE(c.peak_bytes, a.peak_bytes);
}

// [OSFT all-reduce buckets] A model whose update outweighs its activations (llama-3.1-8b, 16
// tokens): a second rank adds one bucket beside the gradients, not a copy of all of them (9.25 GiB
// here), less the one factor's AdamW temporaries the single rank already holds there.
TEST(OsftPriceTest, RanksAddOneBucketAtTheUpdateNotACopyOfEveryGradient) {
  const ModelSpec model = *FindModelPreset("llama-3.1-8b");
  Prediction peaks[2];
  int64_t grad_bytes = 0;
  for (int world : {1, 2}) {
    auto trace = SynthesizeTrace(model, Work(1, 16, world), DType::kBFloat16, Osft(0.5), Card());
    ASSERT_TRUE(trace.ok()) << trace.status();
    CostOptions options;
    options.world_size = world;
    options.local_world_size = world;
    auto pricer = OsftPricer::Create(*trace, Card(), options);
    ASSERT_TRUE(pricer.ok()) << pricer.status();
    peaks[world - 1] = pricer->Predict(ModeCounts{});
    grad_bytes = pricer->cost().grad_bytes;
  }
  const int64_t added = peaks[1].peak_bytes - peaks[0].peak_bytes;
  EXPECT_GT(grad_bytes, 8 * kOsftAllReduceBucketBytes);
  EXPECT_GT(added, 0);
  EXPECT_LE(added, kOsftAllReduceBucketBytes * 11 / 10);  // the uncalibrated factor on top
}

TEST(OsftPriceTest, RefusesWhatTheAgentRefuses) {
  auto trace = SynthesizeTrace(Tiny(), Work(1, 64), DType::kBFloat16, Osft(0.5), Card());
  ASSERT_TRUE(trace.ok());
  CostOptions eight_bit;
  eight_bit.optimizer = OptimizerKind::kAdamW8bit;
  EXPECT_EQ(OsftPricer::Create(*trace, Card(), eight_bit).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto full = SynthesizeTrace(Tiny(), Work(1, 64), DType::kBFloat16, TrainingMethod{}, Card());
  ASSERT_TRUE(full.ok());
  EXPECT_EQ(OsftPricer::Create(*full, Card(), CostOptions{}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace memplan
