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
