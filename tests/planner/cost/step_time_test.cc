// [Deferred CPU updates] priced: one rank's step leaves what is left of the CPU updates to run
// beside the next forward, clipped or not (common/optimizer_bytes.h StepUpdatesDeferred).
#include <algorithm>
#include <cmath>
#include <random>

#include "common/optimizer_bytes.h"
#include "gtest/gtest.h"
#include "planner/cost/cost_model.h"
#include "tests/planner/cost/random_trace.h"

namespace memplan {
namespace {

using testing::kMiB;
using testing::RandomHardware;
using testing::RandomTrace;

void ExpectNear(double a, double b, const char* what) {
  EXPECT_NEAR(a, b, 1e-9 * std::max(1.0, std::fabs(b))) << what;
}

// [Deferred CPU updates]: clipped, one rank, the next forward hides up to T_fwd of the CPU
// updates; never less than the GPU update.
TEST(StepTimeTest, DeferredClippedUpdatesOverlapTheNextForward) {
  StepTime t;
  t.forward_seconds = 1.0;
  t.backward_seconds = 2.0;
  t.gpu_optimizer_seconds = 0.25;
  t.cpu_optimizer_seconds = 1.5;
  t.fixed_seconds = 0.125;
  t.cpu_optimizer_overlaps = false;
  t.cpu_optimizer_deferred = true;
  EXPECT_DOUBLE_EQ(t.IterationSeconds(1), 1.0 + 2.0 + (1.5 - 1.0) + 0.125);
  EXPECT_DOUBLE_EQ(t.IterationSeconds(2), 2.0 + 2.0 + 2.0 + (1.5 - 1.0) + 0.125);
  t.cpu_optimizer_seconds = 0.75;  // hidden by the forward: the GPU update is what is left
  EXPECT_DOUBLE_EQ(t.IterationSeconds(1), 1.0 + 2.0 + 0.25 + 0.125);
  // The rule both sides read: one rank defers, sharded ranks wait.
  EXPECT_TRUE(StepUpdatesDeferred(1));
  EXPECT_FALSE(StepUpdatesDeferred(2));
}

// [Deferred CPU updates] without clipping: the updates start in backward and what is left of
// them after backward and the GPU update runs beside the next forward, hiding up to T_fwd.
TEST(StepTimeTest, DeferredUnclippedUpdatesOverlapTheNextForward) {
  StepTime t;
  t.forward_seconds = 1.0;
  t.backward_seconds = 2.0;
  t.gpu_optimizer_seconds = 0.25;
  t.cpu_accumulate_seconds = 0.5;
  t.cpu_optimizer_seconds = 3.0;
  t.fixed_seconds = 0.125;
  // Waiting: the CPU side, 0.5 + 3, outlasts backward and the GPU update.
  EXPECT_DOUBLE_EQ(t.IterationSeconds(1), 1.0 + 3.5 + 0.125);
  t.cpu_optimizer_deferred = true;
  // Deferred: the step after backward is max(2 + 0.25, 3.5 - 1).
  EXPECT_DOUBLE_EQ(t.IterationSeconds(1), 1.0 + 2.5 + 0.125);
  EXPECT_DOUBLE_EQ(t.IterationSeconds(2), 2.0 + 2.0 + 2.5 + 0.125);
  // Hidden entirely: backward and the GPU update are what is left.
  t.cpu_optimizer_seconds = 2.0;
  EXPECT_DOUBLE_EQ(t.IterationSeconds(1), 1.0 + 2.25 + 0.125);
}

// The cost model sets the deferral from StepUpdatesDeferred alone, clipped or not: one rank's
// unclipped step prices T_acc + T_upd - T_fwd after backward.
TEST(CostModelTest, UnclippedStepOnOneRankIsDeferred) {
  std::mt19937_64 rng(37);
  Trace trace = RandomTrace(rng, 10);
  trace.param_dtype = DType::kBFloat16;
  trace.training.kind = TrainingKind::kFull;
  trace.trainable_param_count = trace.total_param_count;
  HardwareSpec hw = RandomHardware(rng);
  hw.cpu_adam_params_per_second = 1.0e8;
  hw.cpu_grad_accumulate_params_per_second = 4.0e8;
  hw.cpu_adam_update_params_per_second = 1.25e8;
  CostOptions o;
  o.cpu_optimizer_overlaps = true;
  auto model = CostModel::Create(trace, 32 * kMiB, hw, o);
  ASSERT_TRUE(model.ok()) << model.status();
  const int32_t np = model->num_chunks() / 3;
  const int32_t nb = model->MinBuffers(np);
  const StepTime t = model->Time(np, nb, ModeCounts{}, HostMemoryKind::kPinned);
  EXPECT_TRUE(t.cpu_optimizer_deferred);
  ASSERT_GT(t.cpu_accumulate_seconds + t.cpu_optimizer_seconds,
            t.backward_seconds + t.gpu_optimizer_seconds + t.forward_seconds)
      << "the case should have CPU updates left after backward";
  const Prediction pred =
      model->Predict(model->MakeResidencyPlan(np, nb, {}, HostMemoryKind::kPinned));
  ExpectNear(pred.iteration_seconds,
             t.forward_seconds + t.cpu_accumulate_seconds + t.cpu_optimizer_seconds -
                 t.forward_seconds + t.fixed_seconds,
             "unclipped deferred step");
}

}  // namespace
}  // namespace memplan
