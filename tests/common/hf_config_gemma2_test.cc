// ParseHfConfigJson / ToHfConfigJson / HfParamShapes / ValidateModelSpec for Gemma 2 (gemma2):
// its soft caps, query scalar, alternating sliding layers, padding row and extra norms.
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

// google/gemma-2-9b's published config.json (as on the Hub).
std::string PublishedConfig() {
  return R"({
  "architectures": ["Gemma2ForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "attn_logit_softcapping": 50.0,
  "bos_token_id": 2,
  "cache_implementation": "hybrid",
  "eos_token_id": 1,
  "final_logit_softcapping": 30.0,
  "head_dim": 256,
  "hidden_act": "gelu_pytorch_tanh",
  "hidden_activation": "gelu_pytorch_tanh",
  "hidden_size": 3584,
  "initializer_range": 0.02,
  "intermediate_size": 14336,
  "max_position_embeddings": 8192,
  "model_type": "gemma2",
  "num_attention_heads": 16,
  "num_hidden_layers": 42,
  "num_key_value_heads": 8,
  "pad_token_id": 0,
  "query_pre_attn_scalar": 256,
  "rms_norm_eps": 1e-06,
  "rope_theta": 10000.0,
  "sliding_window": 4096,
  "sliding_window_size": 4096,
  "torch_dtype": "float32",
  "use_cache": true,
  "vocab_size": 256000
})";
}

std::string With(const std::string& json, const std::string& extra) {
  std::string out = json;
  out.insert(out.rfind('}'), ",\n" + extra);
  return out;
}

TEST(HfConfigGemma2Test, PublishedConfigIsThePreset) {
  const absl::StatusOr<ModelSpec> spec = ParseHfConfigJson(PublishedConfig());
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->family, "gemma2");
  EXPECT_TRUE(spec->IsGemma());
  EXPECT_TRUE(spec->tie_word_embeddings);
  EXPECT_EQ(spec->HeadDim(), 256);
  EXPECT_DOUBLE_EQ(spec->query_pre_attn_scalar, 256);
  EXPECT_DOUBLE_EQ(spec->AttentionScale(), 1.0 / 16);
  EXPECT_DOUBLE_EQ(spec->attn_logit_softcapping, 50);
  EXPECT_DOUBLE_EQ(spec->final_logit_softcapping, 30);
  EXPECT_EQ(spec->embedding_padding_idx, 0);
  EXPECT_EQ(spec->sliding_window, 4096);
  ASSERT_EQ(spec->sliding_layers.size(), 21u);
  EXPECT_EQ(spec->LayerWindow(0), 4096);
  EXPECT_EQ(spec->LayerWindow(1), 0);
  EXPECT_EQ(spec->LayerWindow(40), 4096);

  const std::optional<ModelSpec> preset = FindModelPreset("gemma-2-9b");
  ASSERT_TRUE(preset.has_value());
  testing::ExpectPresetIsConfig(*preset, *spec);
}

TEST(HfConfigGemma2Test, LayerTypesNullCapsAndRoundTrip) {
  const std::string json = R"({"model_type": "gemma2", "hidden_size": 64, "intermediate_size": 96,
    "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 24,
    "vocab_size": 100, "sliding_window": 7, "attn_logit_softcapping": null,
    "final_logit_softcapping": 12.5, "query_pre_attn_scalar": 20, "pad_token_id": null,
    "tie_word_embeddings": false,
    "layer_types": ["full_attention", "sliding_attention", "sliding_attention"]})";
  const absl::StatusOr<ModelSpec> spec = ParseHfConfigJson(json);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_THAT(spec->sliding_layers, ElementsAre(1, 2));
  EXPECT_EQ(spec->sliding_window, 7);
  EXPECT_EQ(spec->attn_logit_softcapping, 0);
  EXPECT_EQ(spec->final_logit_softcapping, 12.5);
  EXPECT_EQ(spec->embedding_padding_idx, -1);
  EXPECT_FALSE(spec->tie_word_embeddings);

  const absl::StatusOr<ModelSpec> back = ParseHfConfigJson(ToHfConfigJson(*spec, DType::kBFloat16));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->sliding_layers, spec->sliding_layers);
  EXPECT_EQ(back->sliding_window, spec->sliding_window);
  EXPECT_EQ(back->attn_logit_softcapping, 0);
  EXPECT_EQ(back->final_logit_softcapping, 12.5);
  EXPECT_EQ(back->query_pre_attn_scalar, 20);
  EXPECT_EQ(back->embedding_padding_idx, -1);
  EXPECT_EQ(back->HeadDim(), 24);
  EXPECT_FALSE(back->tie_word_embeddings);
  EXPECT_THAT(ToHfConfigJson(*spec, DType::kBFloat16), HasSubstr("\"gelu_pytorch_tanh\""));
}

TEST(HfConfigGemma2Test, UnsupportedKeysAreNamed) {
  const struct {
    const char* extra;
    const char* word;
  } cases[] = {
      {R"("hidden_activation": "gelu")", "hidden_activation"},
      {R"("use_bidirectional_attention": true)", "use_bidirectional_attention"},
      {R"("layer_types": ["full_attention"])", "layer_types"},
      {R"("attn_logit_softcapping": -1)", "attn_logit_softcapping"},
  };
  for (const auto& c : cases) {
    std::string json = PublishedConfig();
    if (std::string(c.extra).rfind("\"attn_logit", 0) == 0) {
      json.replace(json.find("\"attn_logit_softcapping\": 50.0,"), 31, "");
    }
    const absl::StatusOr<ModelSpec> spec = ParseHfConfigJson(With(json, c.extra));
    ASSERT_FALSE(spec.ok()) << c.extra;
    EXPECT_THAT(std::string(spec.status().message()), HasSubstr(c.word));
  }
  std::string biased = PublishedConfig();
  biased.replace(biased.find("\"attention_bias\": false"), 23, "\"attention_bias\": true");
  EXPECT_THAT(std::string(ParseHfConfigJson(biased).status().message()),
              HasSubstr("attention_bias"));
}

TEST(HfConfigGemma2Test, FieldsOnlyForGemma) {
  ModelSpec m = *FindModelPreset("qwen2.5-0.5b");
  m.attn_logit_softcapping = 50;
  EXPECT_THAT(std::string(ValidateModelSpec(m, "arch.").message()),
              HasSubstr("attn_logit_softcapping"));
  m.attn_logit_softcapping = 0;
  m.embedding_padding_idx = 0;
  EXPECT_THAT(std::string(ValidateModelSpec(m, "arch.").message()),
              HasSubstr("embedding_padding_idx"));
}

TEST(HfConfigGemma2Test, FourNormsPerBlock) {
  const ModelSpec m = *FindModelPreset("gemma-2-2b");
  int norms = 0;
  bool head = false;
  for (const ParamShape& p : HfParamShapes(m)) {
    if (p.group == 1 && p.name.find("layernorm") != std::string::npos) ++norms;
    head = head || p.name == "lm_head.weight";
  }
  EXPECT_EQ(norms, 4);
  EXPECT_FALSE(head);  // tied
  const std::vector<ParamShape> shapes = HfParamShapes(m);
  EXPECT_EQ(shapes[1].name, "model.layers.0.self_attn.q_proj.weight");
  EXPECT_THAT(shapes[1].shape, ElementsAre(8 * 256, 2304));
  EXPECT_EQ(shapes[11].name, "model.layers.0.post_feedforward_layernorm.weight");
}

}  // namespace
}  // namespace memplan
