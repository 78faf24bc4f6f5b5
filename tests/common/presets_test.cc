#include "common/presets.h"

#include <gtest/gtest.h>

#include "common/param_shapes.h"
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

// The mixtures of experts as their config.json files publish them: every layer sparse, and the
// parameter counts of the checkpoints (as hf_config_test / param_shapes_test count them).
TEST(PresetsTest, MixturesOfExpertsMatchPublishedConfigs) {
  auto count = [](const ModelSpec& m) {
    int64_t n = 0;
    for (const ParamShape& p : HfParamShapes(m)) n += p.numel();
    return n;
  };
  const auto qwen = FindModelPreset("qwen3-30b-a3b");
  ASSERT_TRUE(qwen.has_value());
  EXPECT_EQ(qwen->family, "qwen3_moe");
  EXPECT_TRUE(qwen->qk_norm);
  EXPECT_EQ(qwen->num_experts, 128);
  EXPECT_EQ(qwen->num_experts_per_tok, 8);
  EXPECT_EQ(qwen->moe_intermediate_size, 768);
  EXPECT_TRUE(qwen->norm_topk_prob);
  EXPECT_EQ(count(*qwen), 30532122624);
  const auto mixtral = FindModelPreset("mixtral-8x7b");
  ASSERT_TRUE(mixtral.has_value());
  EXPECT_EQ(mixtral->family, "mixtral");
  EXPECT_EQ(mixtral->num_experts, 8);
  EXPECT_EQ(mixtral->num_experts_per_tok, 2);
  EXPECT_EQ(mixtral->moe_intermediate_size, mixtral->intermediate_size);
  EXPECT_DOUBLE_EQ(mixtral->rms_norm_eps, 1e-5);
  EXPECT_EQ(count(*mixtral), 46702792704);
  for (const ModelSpec& m : {*qwen, *mixtral}) {
    EXPECT_TRUE(ValidateModelSpec(m, "arch.").ok()) << m.name;
    for (int64_t l = 0; l < m.num_layers; ++l) EXPECT_TRUE(m.IsMoeLayer(l)) << m.name << " " << l;
  }
}

TEST(PresetsTest, UnknownNamesAreAbsent) {
  EXPECT_FALSE(FindModelPreset("gpt-5").has_value());
  EXPECT_FALSE(FindHardwarePreset("tpu-v5").has_value());
}

// Hugging Face repo ids and other capitalisations name the preset; near misses get one suggestion
// instead of the whole list.
TEST(PresetsTest, RepoIdsAndNearMissesResolveOrSuggest) {
  ASSERT_TRUE(FindModelPreset("meta-llama/Llama-3.1-8B").has_value());
  EXPECT_EQ(FindModelPreset("meta-llama/Llama-3.1-8B")->name, "llama-3.1-8b");
  ASSERT_TRUE(FindModelPreset("Qwen/Qwen3-8B").has_value());
  EXPECT_EQ(FindModelPreset("Qwen/Qwen3-8B")->name, "qwen3-8b");
  ASSERT_TRUE(FindHardwarePreset("H100-80GB").has_value());
  EXPECT_EQ(FindHardwarePreset("H100-80GB")->name, "h100-80gb");

  EXPECT_FALSE(FindModelPreset("llama-3.1-8").has_value());
  EXPECT_EQ(UnknownModelPresetHint("llama-3.1-8"), "; did you mean llama-3.1-8b?");
  EXPECT_EQ(UnknownModelPresetHint("meta-llama/Llama-3.1-8"), "; did you mean llama-3.1-8b?");
  EXPECT_EQ(UnknownHardwarePresetHint("h100-80"), "; did you mean h100-80gb?");
  EXPECT_EQ(UnknownHardwarePresetHint("h100_80gb"), "; did you mean h100-80gb?");
  // Nothing close: the list, as before.
  EXPECT_EQ(UnknownModelPresetHint("gpt-5"), "; known: " + ModelPresetNames());
  EXPECT_EQ(UnknownHardwarePresetHint("tpu-v5"), "; known: " + HardwarePresetNames());

  const std::vector<std::string> names = {"alpha", "beta"};
  EXPECT_EQ(MatchPresetName("alpha", names).name, "alpha");
  EXPECT_EQ(MatchPresetName("org/ALPHA", names).name, "alpha");
  EXPECT_EQ(MatchPresetName("alpah", names).suggestion, "alpha");
  EXPECT_TRUE(MatchPresetName("alpah", names).name.empty());
  EXPECT_TRUE(MatchPresetName("zzzzzzzz", names).suggestion.empty());
}

}  // namespace
}  // namespace memplan
