#include "common/presets.h"

#include <gtest/gtest.h>

#include "common/validate.h"

namespace memplan {
namespace {

TEST(PresetsTest, HardwarePresetsAreValid) {
  for (const HardwareSpec& h : HardwarePresets()) {
    EXPECT_TRUE(ValidateHardwareSpec(h, "hardware.").ok()) << h.name;
  }
}

// [Two CPU passes]: a preset's two passes are its whole-pass figure split by the bytes each pass
// moves (10 and 32 of the whole pass's 38 per element), so together they take 42/38 of its time.
TEST(PresetsTest, HardwarePresetsSplitTheCpuPassByBytes) {
  for (const HardwareSpec& h : HardwarePresets()) {
    const double whole = h.cpu_adam_params_per_second;
    EXPECT_DOUBLE_EQ(h.cpu_grad_accumulate_params_per_second, whole * 3.8) << h.name;
    EXPECT_DOUBLE_EQ(h.cpu_adam_update_params_per_second, whole * 38.0 / 32.0) << h.name;
    EXPECT_NEAR(
        1 / h.cpu_grad_accumulate_params_per_second + 1 / h.cpu_adam_update_params_per_second,
        42.0 / 38.0 / whole, 1e-12 / whole)
        << h.name;
  }
}

TEST(PresetsTest, Llama8BMatchesPublishedConfig) {
  const auto m = FindModelPreset("llama-3.1-8b");
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->hidden_size, 4096);
  EXPECT_EQ(m->num_layers, 32);
  EXPECT_EQ(m->num_kv_heads, 8);
  EXPECT_EQ(m->intermediate_size, 14336);
  EXPECT_EQ(m->vocab_size, 128256);
}

TEST(PresetsTest, UnknownNamesAreAbsent) {
  EXPECT_FALSE(FindModelPreset("gpt-5").has_value());
  EXPECT_FALSE(FindHardwarePreset("tpu-v5").has_value());
}

}  // namespace
}  // namespace memplan
