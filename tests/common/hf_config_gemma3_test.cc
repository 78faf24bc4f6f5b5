// ParseHfConfigJson / ToHfConfigJson / ValidateModelSpec for Gemma 3's text decoder
// (gemma3_text): q/k norms, the sliding layers' own RoPE base, the full layers' RoPE scaling, the
// 5 local : 1 global pattern, and the refusals that name their field.
#include <optional>
#include <string>

#include "common/hf_config.h"
#include "common/param_shapes.h"
#include "common/presets.h"
#include "common/validate.h"
#include "tests/common/expect_gemma_preset.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace memplan {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// The layout of google/gemma-3-1b-pt's config.json (values as published, written from memory of
// the public file; no download).
std::string PublishedConfig() {
  return R"({
  "architectures": ["Gemma3ForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "attn_logit_softcapping": null,
  "bos_token_id": 2,
  "cache_implementation": "hybrid",
  "eos_token_id": 1,
  "final_logit_softcapping": null,
  "head_dim": 256,
  "hidden_activation": "gelu_pytorch_tanh",
  "hidden_size": 1152,
  "initializer_range": 0.02,
  "intermediate_size": 6912,
  "max_position_embeddings": 32768,
  "model_type": "gemma3_text",
  "num_attention_heads": 4,
  "num_hidden_layers": 26,
  "num_key_value_heads": 1,
  "pad_token_id": 0,
  "query_pre_attn_scalar": 256,
  "rms_norm_eps": 1e-06,
  "rope_local_base_freq": 10000,
  "rope_scaling": null,
  "rope_theta": 1000000,
  "sliding_window": 512,
  "sliding_window_pattern": 6,
  "torch_dtype": "bfloat16",
  "use_cache": true,
  "vocab_size": 262144
})";
}

std::string Tiny(const std::string& extra) {
  return R"({"model_type": "gemma3_text", "hidden_size": 64, "intermediate_size": 96,
    "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 24,
    "vocab_size": 100)" +
         (extra.empty() ? std::string() : ", " + extra) + "}";
}

TEST(HfConfigGemma3Test, PublishedConfig) {
  const absl::StatusOr<ModelSpec> spec = ParseHfConfigJson(PublishedConfig());
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->family, "gemma3_text");
  EXPECT_TRUE(spec->IsGemma());
  EXPECT_TRUE(spec->qk_norm);
  EXPECT_TRUE(spec->tie_word_embeddings);
  EXPECT_EQ(spec->HeadDim(), 256);
  EXPECT_DOUBLE_EQ(spec->AttentionScale(), 1.0 / 16);
  EXPECT_EQ(spec->attn_logit_softcapping, 0);
  EXPECT_EQ(spec->final_logit_softcapping, 0);
  EXPECT_EQ(spec->rope_theta, 1e6);
  EXPECT_EQ(spec->rope_local_base_freq, 1e4);
  EXPECT_EQ(spec->rope_scaling.type, "default");
  EXPECT_EQ(spec->sliding_window, 512);
  // 5 local : 1 global: layers 5, 11, 17, 23 attend to everything.
  EXPECT_EQ(spec->sliding_layers.size(), 22u);
  for (int64_t l = 0; l < 26; ++l) EXPECT_EQ(spec->LayerWindow(l), (l + 1) % 6 ? 512 : 0) << l;
  EXPECT_TRUE(ValidateModelSpec(*spec, "arch.").ok());
}

TEST(HfConfigGemma3Test, PublishedConfigIsThePreset) {
  const absl::StatusOr<ModelSpec> spec = ParseHfConfigJson(PublishedConfig());
  ASSERT_TRUE(spec.ok()) << spec.status();
  const std::optional<ModelSpec> preset = FindModelPreset("gemma-3-1b");
  ASSERT_TRUE(preset.has_value());
  testing::ExpectPresetIsConfig(*preset, *spec);
  // From 4B up the full layers' RoPE is scaled linearly by 8; every preset validates.
  for (const char* name : {"gemma-3-4b", "gemma-3-12b", "gemma-3-27b"}) {
    const ModelSpec m = *FindModelPreset(name);
    EXPECT_TRUE(ValidateModelSpec(m, "arch.").ok()) << name;
    EXPECT_EQ(m.rope_scaling.type, "linear") << name;
    EXPECT_EQ(m.rope_scaling.factor, 8.0) << name;
    EXPECT_EQ(m.sliding_window, 1024) << name;
  }
}

TEST(HfConfigGemma3Test, DefaultsAreGemma3TextConfigs) {
  const absl::StatusOr<ModelSpec> spec = ParseHfConfigJson(Tiny(""));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->attn_logit_softcapping, 0);
  EXPECT_EQ(spec->final_logit_softcapping, 0);
  EXPECT_EQ(spec->rope_theta, 1e6);
  EXPECT_EQ(spec->rope_local_base_freq, 1e4);
  EXPECT_EQ(spec->sliding_window, 4096);
  EXPECT_THAT(spec->sliding_layers, ElementsAre(0, 1, 2, 3));
  EXPECT_EQ(spec->query_pre_attn_scalar, 256);
  EXPECT_EQ(spec->max_position_embeddings, 131072);
}

TEST(HfConfigGemma3Test, RopePerLayerTypeAndRoundTrip) {
  const absl::StatusOr<ModelSpec> spec = ParseHfConfigJson(Tiny(R"(
    "sliding_window": 7, "final_logit_softcapping": 2.0, "tie_word_embeddings": false,
    "layer_types": ["full_attention", "sliding_attention", "sliding_attention", "full_attention"],
    "rope_parameters": {"full_attention": {"rope_type": "linear", "factor": 8.0,
                                           "rope_theta": 500000.0},
                        "sliding_attention": {"rope_type": "default", "rope_theta": 300.0}})"));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_THAT(spec->sliding_layers, ElementsAre(1, 2));
  EXPECT_EQ(spec->rope_scaling.type, "linear");
  EXPECT_EQ(spec->rope_scaling.factor, 8.0);
  EXPECT_EQ(spec->rope_theta, 5e5);
  EXPECT_EQ(spec->rope_local_base_freq, 300);

  const std::string written = ToHfConfigJson(*spec, DType::kBFloat16);
  EXPECT_THAT(written, HasSubstr("\"sliding_attention\": {"));
  const absl::StatusOr<ModelSpec> back = ParseHfConfigJson(written);
  ASSERT_TRUE(back.ok()) << back.status() << written;
  EXPECT_EQ(back->family, "gemma3_text");
  EXPECT_EQ(back->sliding_layers, spec->sliding_layers);
  EXPECT_EQ(back->sliding_window, 7);
  EXPECT_EQ(back->rope_scaling.type, "linear");
  EXPECT_EQ(back->rope_scaling.factor, 8.0);
  EXPECT_EQ(back->rope_theta, 5e5);
  EXPECT_EQ(back->rope_local_base_freq, 300);
  EXPECT_EQ(back->final_logit_softcapping, 2.0);
  EXPECT_EQ(back->attn_logit_softcapping, 0);
  EXPECT_TRUE(back->qk_norm);
  EXPECT_FALSE(back->tie_word_embeddings);
}

TEST(HfConfigGemma3Test, PublishedLayoutScalesTheFullLayersOnly) {
  const absl::StatusOr<ModelSpec> spec = ParseHfConfigJson(Tiny(R"(
    "sliding_window_pattern": 3, "rope_theta": 1000000, "rope_local_base_freq": 1000,
    "rope_scaling": {"rope_type": "linear", "factor": 8.0})"));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_THAT(spec->sliding_layers, ElementsAre(0, 1, 3));
  EXPECT_EQ(spec->rope_scaling.type, "linear");
  EXPECT_EQ(spec->rope_local_base_freq, 1000);
}

TEST(HfConfigGemma3Test, UnsupportedValuesAreNamed) {
  const struct {
    std::string json;
    const char* word;
  } cases[] = {
      {R"({"model_type": "gemma3", "text_config": {"model_type": "gemma3_text"}})", "text_config"},
      {Tiny(R"("rope_parameters": {"full_attention": {"rope_type": "default"},
                "sliding_attention": {"rope_type": "linear", "factor": 2.0}})"),
       "rope_parameters.sliding_attention"},
      {Tiny(R"("rope_parameters": {"chunked_attention": {"rope_type": "default"}})"),
       "rope_parameters.chunked_attention"},
      {Tiny(R"("rope_parameters": {"full_attention": {"rope_type": "longrope"}})"), "rope_type"},
      {Tiny(R"("hidden_activation": "gelu")"), "hidden_activation"},
      {Tiny(R"("use_bidirectional_attention": true)"), "use_bidirectional_attention"},
      {Tiny(R"("attention_bias": true)"), "attention_bias"},
      {Tiny(R"("sliding_window_pattern": 0)"), "sliding_window_pattern"},
      {Tiny(R"("rope_local_base_freq": -5)"), "rope_local_base_freq"},
  };
  for (const auto& c : cases) {
    const absl::StatusOr<ModelSpec> spec = ParseHfConfigJson(c.json);
    ASSERT_FALSE(spec.ok()) << c.json;
    EXPECT_THAT(std::string(spec.status().message()), HasSubstr(c.word)) << c.json;
  }
}

TEST(HfConfigGemma3Test, LocalBaseOnlyForGemma3) {
  ModelSpec m = *FindModelPreset("gemma-2-2b");
  m.rope_local_base_freq = 1e4;
  EXPECT_THAT(std::string(ValidateModelSpec(m, "arch.").message()),
              HasSubstr("rope_local_base_freq"));
}

TEST(HfConfigGemma3Test, QkNormsAndFourNormsPerBlock) {
  const absl::StatusOr<ModelSpec> m = ParseHfConfigJson(PublishedConfig());
  ASSERT_TRUE(m.ok()) << m.status();
  int norms = 0;
  bool head = false;
  for (const ParamShape& p : HfParamShapes(*m)) {
    if (p.group == 1 && p.name.find("norm.weight") != std::string::npos) ++norms;
    if (p.name == "model.layers.0.self_attn.q_norm.weight") {
      EXPECT_THAT(p.shape, ElementsAre(256));
    }
    head = head || p.name == "lm_head.weight";
  }
  EXPECT_EQ(norms, 6);
  EXPECT_FALSE(head);
}

}  // namespace
}  // namespace memplan
