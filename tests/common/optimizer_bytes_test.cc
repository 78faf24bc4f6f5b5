#include "common/optimizer_bytes.h"

#include "gtest/gtest.h"

namespace memplan {
namespace {

// The CPU update rate the cost model charges offloaded chunks: the profile's own measurement of
// the optimizer when it has one, else adamw's rate scaled by the optimizer's time factor.
TEST(OptimizerBytesTest, CpuRateIsTheMeasuredOneWhenTheProfileHasIt) {
  HardwareSpec hw;
  hw.cpu_adam_params_per_second = 1.2e9;
  EXPECT_DOUBLE_EQ(CpuOptimizerParamsPerSecond(OptimizerKind::kAdamW, hw), 1.2e9);
  EXPECT_DOUBLE_EQ(CpuOptimizerParamsPerSecond(OptimizerKind::kAdamW8bit, hw),
                   1.2e9 / kAdamW8bitCpuTimeFactor);
  hw.cpu_adamw8bit_params_per_second = 3.3e8;
  EXPECT_DOUBLE_EQ(CpuOptimizerParamsPerSecond(OptimizerKind::kAdamW8bit, hw), 3.3e8);
  EXPECT_DOUBLE_EQ(CpuOptimizerParamsPerSecond(OptimizerKind::kAdamW, hw), 1.2e9);
}

// [Two CPU passes]: a profile with both figures prices them apart (adamw8bit updates at its own
// figure, the others at adamw's over their time factor); with either missing, one whole pass.
TEST(OptimizerBytesTest, TwoPassRatesFallBackToTheWholePass) {
  HardwareSpec hw;
  hw.cpu_adam_params_per_second = 1.2e9;
  CpuPassRates r = CpuOptimizerPassRates(OptimizerKind::kAdamW, hw);
  EXPECT_EQ(r.accumulate_params_per_second, 0);
  EXPECT_DOUBLE_EQ(r.update_params_per_second, 1.2e9);
  hw.cpu_grad_accumulate_params_per_second = 5e9;
  EXPECT_EQ(CpuOptimizerPassRates(OptimizerKind::kAdamW, hw).accumulate_params_per_second, 0)
      << "one figure alone is not used";
  hw.cpu_adam_update_params_per_second = 1.5e9;
  r = CpuOptimizerPassRates(OptimizerKind::kAdamW, hw);
  EXPECT_DOUBLE_EQ(r.accumulate_params_per_second, 5e9);
  EXPECT_DOUBLE_EQ(r.update_params_per_second, 1.5e9);
  EXPECT_DOUBLE_EQ(CpuOptimizerPassRates(OptimizerKind::kAdamW8bit, hw).update_params_per_second,
                   1.5e9 / kAdamW8bitCpuTimeFactor);
  hw.cpu_adamw8bit_params_per_second = 3.3e8;
  EXPECT_DOUBLE_EQ(CpuOptimizerPassRates(OptimizerKind::kAdamW8bit, hw).update_params_per_second,
                   3.3e8);
  // [CPU pass bytes]: sgd's update touches 16 B to adamw's 32.
  EXPECT_DOUBLE_EQ(CpuOptimizerPassRates(OptimizerKind::kSgd, hw).update_params_per_second, 3e9);
  EXPECT_EQ(HostGradElemBytes(OptimizerKind::kAdamW, 2), 4);
  EXPECT_EQ(HostGradElemBytes(OptimizerKind::kAdamW, 4), 4);
  EXPECT_EQ(HostGradElemBytes(OptimizerKind::kAdamWBf16States, 2), 2);
  EXPECT_EQ(HostGradElemBytes(OptimizerKind::kAdamW8bit, 2), 2);
}

// [CPU pass bytes]: the update pass's bytes per element by optimizer, and which optimizers run an
// accumulate pass at all (the agent allocates a grad sum exactly when GradSumElemBytes > 0).
TEST(OptimizerBytesTest, CpuPassBytesAndAccumulatePassPerOptimizer) {
  EXPECT_EQ(CpuUpdateBytesPerParam(OptimizerKind::kAdamW, 2), kCpuUpdateBytesPerParam);
  EXPECT_EQ(CpuUpdateBytesPerParam(OptimizerKind::kAdamW, 4), 4 + 8 + 16);
  EXPECT_EQ(CpuUpdateBytesPerParam(OptimizerKind::kAdamWBf16States, 2), 2 + 4 + 8);
  EXPECT_EQ(CpuUpdateBytesPerParam(OptimizerKind::kSgd, 2), 4 + 8 + 4);
  EXPECT_EQ(CpuUpdateBytesPerParam(OptimizerKind::kAdamW8bit, 2), 2 + 4 + 4);
  EXPECT_TRUE(CpuAccumulatePass(OptimizerKind::kAdamW, 2, 1));
  EXPECT_TRUE(CpuAccumulatePass(OptimizerKind::kSgd, 2, 1));
  EXPECT_FALSE(CpuAccumulatePass(OptimizerKind::kAdamW, 4, 1)) << "fp32: the staging copy is the grad";
  EXPECT_FALSE(CpuAccumulatePass(OptimizerKind::kAdamWBf16States, 2, 1));
  EXPECT_FALSE(CpuAccumulatePass(OptimizerKind::kAdamW8bit, 2, 1));
  EXPECT_TRUE(CpuAccumulatePass(OptimizerKind::kAdamWBf16States, 2, 2));
  HardwareSpec hw;
  hw.cpu_grad_accumulate_params_per_second = 2e10;
  hw.cpu_adam_update_params_per_second = 4e9;
  hw.cpu_adamw8bit_params_per_second = 4.5e9;
  // adamw_bf16: no accumulate pass with one micro-batch, updates at 32 / 14 of adamw's rate.
  CpuPassRates r = CpuOptimizerPassRates(OptimizerKind::kAdamWBf16States, hw, 2, 1);
  EXPECT_EQ(r.accumulate_params_per_second, 0);
  EXPECT_DOUBLE_EQ(r.update_params_per_second, 4e9 * 32 / 14);
  r = CpuOptimizerPassRates(OptimizerKind::kAdamWBf16States, hw, 2, 4);
  EXPECT_DOUBLE_EQ(r.accumulate_params_per_second, 2e10);
  r = CpuOptimizerPassRates(OptimizerKind::kAdamW8bit, hw, 2, 1);
  EXPECT_EQ(r.accumulate_params_per_second, 0);
  EXPECT_DOUBLE_EQ(r.update_params_per_second, 4.5e9);
  // The bench's own figures, where it timed them, take precedence over the bytes.
  hw.cpu_adamw_bf16_params_per_second = 8.5e9;
  hw.cpu_sgd_params_per_second = 7.25e9;
  EXPECT_DOUBLE_EQ(
      CpuOptimizerPassRates(OptimizerKind::kAdamWBf16States, hw, 2, 1).update_params_per_second,
      8.5e9);
  r = CpuOptimizerPassRates(OptimizerKind::kSgd, hw, 2, 1);
  EXPECT_DOUBLE_EQ(r.update_params_per_second, 7.25e9);
  EXPECT_DOUBLE_EQ(r.accumulate_params_per_second, 2e10);
  // sgd on an fp32 model has no master to round: the bf16 bench figure is not its pass.
  EXPECT_DOUBLE_EQ(CpuOptimizerPassRates(OptimizerKind::kSgd, hw, 4, 1).update_params_per_second,
                   4e9 * 32 / (4 + 8));
  // A whole-pass profile: adamw's fused pass is 38 B; adamw_bf16's whole pass is its 14 B update.
  HardwareSpec whole;
  whole.cpu_adam_params_per_second = 3.8e9;
  EXPECT_DOUBLE_EQ(CpuOptimizerPassRates(OptimizerKind::kAdamW, whole).update_params_per_second,
                   3.8e9);
  EXPECT_DOUBLE_EQ(
      CpuOptimizerPassRates(OptimizerKind::kAdamWBf16States, whole).update_params_per_second,
      3.8e9 * 38 / 14);
  EXPECT_DOUBLE_EQ(CpuOptimizerPassRates(OptimizerKind::kSgd, whole).update_params_per_second,
                   3.8e9 * 38 / 22);
}

// The fused 8-bit kernel touches a parameter's grad, the parameter (read and write) and the two
// moments' codes (read and write): 10 B per bf16 element, far below the LibTorch-ops path.
TEST(OptimizerBytesTest, FusedEightBitKernelTouchBytes) {
  EXPECT_EQ(GpuOptimizerTouchBytesPerElem(OptimizerKind::kAdamW8bit, 2), 10);
  EXPECT_EQ(GpuOptimizerTouchBytesPerElem(OptimizerKind::kAdamW8bit, 4), 16);
  EXPECT_GT(GpuOptimizerTouchBytesPerElem(OptimizerKind::kAdamW8bit, 2, false), 200);
}

}  // namespace
}  // namespace memplan
