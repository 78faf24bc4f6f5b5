// StepTime::IterationSeconds (eq. 2): the CPU optimizer overlapped with backward, after it
// (clipping), in two passes and [Deferred CPU updates] beside the next forward, clipped or not.

#include "common/optimizer_bytes.h"
#include "gtest/gtest.h"
#include "planner/cost/cost_model.h"

namespace memplan {
namespace {

// The example times the tests below start from (T_fwd 1 s, T_bwd 2 s, T_gpu 0.25 s, T_upd
// 1.5 s, 0.125 s fixed), every term exact in binary.
StepTime ExampleTimes() {
  StepTime t;
  t.forward_seconds = 1.0;
  t.backward_seconds = 2.0;
  t.gpu_optimizer_seconds = 0.25;
  t.cpu_optimizer_seconds = 1.5;
  t.fixed_seconds = 0.125;
  return t;
}

TEST(StepTimeTest, ClippingRunsTheCpuOptimizerAfterBackward) {
  StepTime t = ExampleTimes();
  // Overlapped: the CPU updates hide behind backward.
  EXPECT_DOUBLE_EQ(t.IterationSeconds(1), 1.0 + 2.25 + 0.125);
  EXPECT_DOUBLE_EQ(t.IterationSeconds(2), 2.0 + 2.0 + 2.25 + 0.125);
  // Clipping: they wait for the global norm, then run beside the GPU optimizer.
  t.cpu_optimizer_overlaps = false;
  EXPECT_DOUBLE_EQ(t.IterationSeconds(1), 1.0 + 2.0 + 1.5 + 0.125);
  EXPECT_DOUBLE_EQ(t.IterationSeconds(2), 2.0 + 2.0 + 2.0 + 1.5 + 0.125);
}

// [Two CPU passes]: T_acc per micro-batch beside its backward; with clipping the host norm and
// then T_upd beside the GPU update after backward, without it T_acc + T_upd against the last
// backward and the GPU update.
TEST(StepTimeTest, TwoCpuPassesBesideBackwardAndAfterIt) {
  StepTime t = ExampleTimes();
  t.cpu_accumulate_seconds = 0.5;
  t.cpu_optimizer_overlaps = false;
  // Clipped, accumulate hidden by backward: 1 + max(2, 0.5) + max(0.25, 1.5) + 0.125.
  EXPECT_DOUBLE_EQ(t.IterationSeconds(1), 4.625);
  // Clipped, two micro-batches whose accumulate (3 s) outlasts backward, 0.25 s of host norm:
  // 2 x 1 + 2 x max(2, 3) + 0.25 + max(0.25, 1.5) + 0.125.
  t.cpu_accumulate_seconds = 3.0;
  t.cpu_norm_seconds = 0.25;
  EXPECT_DOUBLE_EQ(t.IterationSeconds(2), 9.875);
  // Unclipped: 2 x 1 + 1 x max(2, 3) + max(2 + 0.25, 3 + 1.5) + 0.125 (no host norm).
  t.cpu_optimizer_overlaps = true;
  EXPECT_DOUBLE_EQ(t.IterationSeconds(2), 9.625);
  // Unclipped, one micro-batch: 1 + max(2 + 0.25, 0.5 + 1.5) + 0.125, then with T_acc = 1 s
  // the CPU side (2.5 s) is the longer one.
  t.cpu_accumulate_seconds = 0.5;
  EXPECT_DOUBLE_EQ(t.IterationSeconds(1), 3.375);
  t.cpu_accumulate_seconds = 1.0;
  EXPECT_DOUBLE_EQ(t.IterationSeconds(1), 3.625);
}

// [Deferred CPU updates]: clipped, one rank, the next forward hides up to T_fwd of the CPU
// updates; never less than the GPU update.
TEST(StepTimeTest, DeferredClippedUpdatesOverlapTheNextForward) {
  StepTime t = ExampleTimes();
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
  StepTime t = ExampleTimes();
  t.cpu_accumulate_seconds = 0.5;
  t.cpu_optimizer_seconds = 3.0;
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

// [CPU windows]: the CPU starts on the first offloaded grads T_lead into backward, and the next
// forward hides deferred updates only until its window that uploads the last offloaded chunk.
TEST(StepTimeTest, CpuWindowsBoundTheOverlap) {
  StepTime t = ExampleTimes();
  t.cpu_accumulate_seconds = 0.5;
  t.cpu_optimizer_seconds = 3.0;
  t.cpu_optimizer_deferred = true;
  t.cpu_backward_lead_seconds = 0.25;
  t.cpu_forward_tail_seconds = 0.375;
  // Unclipped: 1 + max(2 + 0.25, 0.25 + 0.5 + 3 - (1 - 0.375)) + 0.125.
  EXPECT_DOUBLE_EQ(t.IterationSeconds(1), 1.0 + 3.125 + 0.125);
  // Clipped: 1 + max(2, 0.5) + max(0.25, 3 - 0.625) + 0.125; the lead is inside backward.
  t.cpu_optimizer_overlaps = false;
  EXPECT_DOUBLE_EQ(t.IterationSeconds(1), 1.0 + 2.0 + 2.375 + 0.125);
  // A tail longer than the forward hides nothing.
  t.cpu_forward_tail_seconds = 1.5;
  EXPECT_DOUBLE_EQ(t.IterationSeconds(1), 1.0 + 2.0 + 3.0 + 0.125);
  // Without deferral the tail does not matter; the lead still delays the unclipped CPU side.
  t.cpu_optimizer_deferred = false;
  t.cpu_optimizer_overlaps = true;
  EXPECT_DOUBLE_EQ(t.IterationSeconds(1), 1.0 + 3.75 + 0.125);
}

}  // namespace
}  // namespace memplan
