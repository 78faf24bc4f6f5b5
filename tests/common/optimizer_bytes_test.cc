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

// The fused 8-bit kernel touches a parameter's grad, the parameter (read and write) and the two
// moments' codes (read and write): 10 B per bf16 element, far below the LibTorch-ops path.
TEST(OptimizerBytesTest, FusedEightBitKernelTouchBytes) {
  EXPECT_EQ(GpuOptimizerTouchBytesPerElem(OptimizerKind::kAdamW8bit, 2), 10);
  EXPECT_EQ(GpuOptimizerTouchBytesPerElem(OptimizerKind::kAdamW8bit, 4), 16);
  EXPECT_GT(GpuOptimizerTouchBytesPerElem(OptimizerKind::kAdamW8bit, 2, false), 200);
}

}  // namespace
}  // namespace memplan
