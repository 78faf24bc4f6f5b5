// ParseHfConfigJson / ToHfConfigJson / VisionParamShapes for the vision-language family qwen2_vl
// (Qwen2-VL: the tower's LayerNorm, QuickGELU MLP and no windows; its own key names).
#include <optional>
#include <string>

#include "common/hf_config.h"
#include "common/param_shapes.h"
#include "common/presets.h"
#include "common/validate.h"
#include "common/vision_kind.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace memplan {
namespace {

using ::testing::HasSubstr;

// scripts/configs/qwen2-vl-7b/config.json: Qwen/Qwen2-VL-7B-Instruct's published config.
std::string PublishedConfig() {
  return R"({
  "architectures": ["Qwen2VLForConditionalGeneration"],
  "attention_dropout": 0.0,
  "bos_token_id": 151643,
  "eos_token_id": 151645,
  "vision_start_token_id": 151652,
  "vision_end_token_id": 151653,
  "vision_token_id": 151654,
  "image_token_id": 151655,
  "video_token_id": 151656,
  "hidden_act": "silu",
  "hidden_size": 3584,
  "initializer_range": 0.02,
  "intermediate_size": 18944,
  "max_position_embeddings": 32768,
  "max_window_layers": 28,
  "model_type": "qwen2_vl",
  "num_attention_heads": 28,
  "num_hidden_layers": 28,
  "num_key_value_heads": 4,
  "rms_norm_eps": 1e-06,
  "rope_theta": 1000000.0,
  "sliding_window": 32768,
  "tie_word_embeddings": false,
  "torch_dtype": "bfloat16",
  "use_cache": true,
  "use_sliding_window": false,
  "vision_config": {
    "depth": 32,
    "embed_dim": 1280,
    "mlp_ratio": 4,
    "num_heads": 16,
    "in_chans": 3,
    "hidden_size": 3584,
    "patch_size": 14,
    "spatial_merge_size": 2,
    "temporal_patch_size": 2
  },
  "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]},
  "vocab_size": 152064
})";
}

// A tiny Qwen2-VL in transformers 5's nested layout, `vision_extra` appended to vision_config.
std::string TinyNested(const std::string& vision_extra = "") {
  return R"({"architectures": ["Qwen2VLForConditionalGeneration"], "model_type": "qwen2_vl",
    "image_token_id": 100, "video_token_id": 101, "vision_start_token_id": 102,
    "vision_end_token_id": 103, "tie_word_embeddings": false,
    "text_config": {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
      "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 128,
      "model_type": "qwen2_vl_text", "use_sliding_window": false,
      "rope_parameters": {"mrope_section": [2, 1, 1], "rope_theta": 10000.0,
                          "rope_type": "default"}},
    "vision_config": {"depth": 2, "embed_dim": 16, "hidden_size": 32, "mlp_ratio": 2,
      "num_heads": 2, "patch_size": 4, "spatial_merge_size": 2, "temporal_patch_size": 2,
      "rope_parameters": {"rope_theta": 10000.0, "rope_type": "axial"})" +
         vision_extra + "}}";
}

TEST(HfConfigQwen2VlTest, PublishedSevenB) {
  absl::StatusOr<ModelSpec> m = ParseHfConfigJson(PublishedConfig());
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->family, "qwen2_vl");
  EXPECT_TRUE(m->qkv_bias);
  EXPECT_EQ(m->hidden_size, 3584);
  EXPECT_EQ(m->num_layers, 28);
  EXPECT_EQ(m->num_kv_heads, 4);
  EXPECT_EQ(m->max_position_embeddings, 32768);
  EXPECT_EQ(m->mrope_section, (std::vector<int64_t>{16, 24, 24}));
  EXPECT_EQ(m->sliding_window, 0);
  const VisionSpec& v = m->vision;
  EXPECT_EQ(v.depth, 32);
  EXPECT_EQ(v.hidden_size, 1280);
  EXPECT_EQ(v.intermediate_size, 5120);
  EXPECT_EQ(v.num_heads, 16);
  EXPECT_EQ(v.in_channels, 3);
  EXPECT_EQ(v.out_hidden_size, 3584);
  EXPECT_TRUE(VisionLayerNorm(*m));
  EXPECT_FALSE(VisionGatedMlp(*m));
  EXPECT_FALSE(VisionWindowed(v));
  EXPECT_TRUE(v.fullatt_block_indexes.empty());
  EXPECT_TRUE(VisionFullAttentionBlock(v, 0));
  EXPECT_TRUE(ValidateModelSpec(*m, "arch.").ok()) << ValidateModelSpec(*m, "arch.");

  const std::optional<ModelSpec> preset = FindModelPreset("qwen2-vl-7b");
  ASSERT_TRUE(preset.has_value());
  EXPECT_TRUE(ValidateModelSpec(*preset, "arch.").ok()) << ValidateModelSpec(*preset, "arch.");
  EXPECT_EQ(HfParamShapes(*preset).size(), HfParamShapes(*m).size());
  EXPECT_EQ(preset->vision.intermediate_size, v.intermediate_size);
  EXPECT_EQ(preset->vision.window_size, v.window_size);
  EXPECT_EQ(preset->max_position_embeddings, m->max_position_embeddings);
  EXPECT_DOUBLE_EQ(preset->rms_norm_eps, m->rms_norm_eps);
}

// Qwen2-VL-7B's tower: 675,759,104 parameters, as transformers counts them (patch embedding
// 1280·1176, 32 blocks of 2·2·1280 + 3·1280·1281 + 1280·1281 + 5120·1281 + 1280·5121, merger 2·1280
// + 5120·5121 + 3584·5121).
TEST(HfConfigQwen2VlTest, TowerParameterNamesAndCount) {
  const std::optional<ModelSpec> m = FindModelPreset("qwen2-vl-7b");
  ASSERT_TRUE(m.has_value());
  const std::vector<ParamShape> shapes = VisionParamShapes(*m);
  ASSERT_EQ(shapes.size(), 1u + 32u * 12u + 6u);
  const char* block0[] = {"norm1.weight",    "norm1.bias",    "norm2.weight",     "norm2.bias",
                          "attn.qkv.weight", "attn.qkv.bias", "attn.proj.weight", "attn.proj.bias",
                          "mlp.fc1.weight",  "mlp.fc1.bias",  "mlp.fc2.weight",   "mlp.fc2.bias"};
  for (size_t i = 0; i < 12; ++i) {
    EXPECT_EQ(shapes[1 + i].name, std::string("visual.blocks.0.") + block0[i]);
  }
  EXPECT_EQ(shapes[1 + 8].shape, (std::vector<int64_t>{5120, 1280}));
  EXPECT_EQ(shapes[1 + 10].shape, (std::vector<int64_t>{1280, 5120}));
  EXPECT_EQ(shapes[1 + 32 * 12].name, "visual.merger.ln_q.weight");
  EXPECT_EQ(shapes[2 + 32 * 12].name, "visual.merger.ln_q.bias");
  int64_t total = 0;
  for (const ParamShape& p : shapes) total += p.numel();
  const int64_t block = 4 * 1280 + 3 * 1280 * 1281 + 1280 * 1281 + 5120 * 1281 + 1280 * 5121;
  EXPECT_EQ(total, 1280 * 1176 + 32 * block + 2 * 1280 + 5120 * 5121 + 3584 * 5121);
  EXPECT_EQ(total, 675759104);
}

TEST(HfConfigQwen2VlTest, RoundTripsThroughTransformersLayout) {
  absl::StatusOr<ModelSpec> m = ParseHfConfigJson(TinyNested());
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->vision.hidden_size, 16);
  EXPECT_EQ(m->vision.out_hidden_size, 32);
  EXPECT_EQ(m->vision.intermediate_size, 32);
  const std::string json = ToHfConfigJson(*m, DType::kFloat32);
  EXPECT_THAT(json, HasSubstr("\"Qwen2VLForConditionalGeneration\""));
  EXPECT_THAT(json, HasSubstr("\"qwen2_vl_text\""));
  EXPECT_THAT(json, HasSubstr("\"embed_dim\": 16"));
  EXPECT_THAT(json, HasSubstr("\"mlp_ratio\": 2"));
  EXPECT_THAT(json, HasSubstr("\"quick_gelu\""));
  EXPECT_THAT(json, ::testing::Not(HasSubstr("window_size")));
  absl::StatusOr<ModelSpec> back = ParseHfConfigJson(json);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->family, "qwen2_vl");
  EXPECT_EQ(back->vision.hidden_size, 16);
  EXPECT_EQ(back->vision.intermediate_size, 32);
  EXPECT_EQ(back->vision.out_hidden_size, 32);
  EXPECT_EQ(back->vision.window_size, 0);
  EXPECT_EQ(back->mrope_section, m->mrope_section);
}

TEST(HfConfigQwen2VlTest, RefusalsNameTheKey) {
  absl::StatusOr<ModelSpec> act = ParseHfConfigJson(TinyNested(R"(, "hidden_act": "silu")"));
  ASSERT_FALSE(act.ok());
  EXPECT_THAT(act.status().message(), HasSubstr("\"vision_config.hidden_act\""));
  absl::StatusOr<ModelSpec> width = ParseHfConfigJson(
      R"({"model_type": "qwen2_vl", "hidden_size": 32, "num_hidden_layers": 1,
          "num_attention_heads": 4, "intermediate_size": 64, "vocab_size": 128,
          "image_token_id": 100, "video_token_id": 101, "vision_start_token_id": 102,
          "vision_end_token_id": 103, "rope_scaling": {"type": "mrope", "mrope_section": [2, 1, 1]},
          "vision_config": {"depth": 1, "embed_dim": 16, "hidden_size": 48, "num_heads": 2}})");
  ASSERT_FALSE(width.ok());
  EXPECT_THAT(width.status().message(), HasSubstr("\"vision_config.hidden_size\""));
  absl::StatusOr<ModelSpec> heads = ParseHfConfigJson(TinyNested(R"(, "num_heads": 3)"));
  ASSERT_FALSE(heads.ok());
  EXPECT_THAT(heads.status().message(), HasSubstr("\"vision_config.num_heads\""));
}

}  // namespace
}  // namespace memplan
