// ParseHfConfigJson / ToHfConfigJson for the vision-language family qwen2_5_vl.
#include <optional>
#include <string>

#include "common/hf_config.h"
#include "common/presets.h"
#include "common/validate.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace memplan {
namespace {

using ::testing::HasSubstr;

// Qwen/Qwen2.5-VL-7B-Instruct's config.json as published (language keys at the top level).
constexpr char kQwen25Vl7B[] = R"({
  "architectures": ["Qwen2_5_VLForConditionalGeneration"], "attention_dropout": 0.0,
  "bos_token_id": 151643, "eos_token_id": 151645, "vision_start_token_id": 151652,
  "vision_end_token_id": 151653, "vision_token_id": 151654, "image_token_id": 151655,
  "video_token_id": 151656, "hidden_act": "silu", "hidden_size": 3584,
  "initializer_range": 0.02, "intermediate_size": 18944, "max_position_embeddings": 128000,
  "max_window_layers": 28, "model_type": "qwen2_5_vl", "num_attention_heads": 28,
  "num_hidden_layers": 28, "num_key_value_heads": 4, "rms_norm_eps": 1e-06,
  "rope_theta": 1000000.0, "sliding_window": 32768, "tie_word_embeddings": false,
  "torch_dtype": "bfloat16", "transformers_version": "4.41.2", "use_cache": true,
  "use_sliding_window": false,
  "vision_config": {"depth": 32, "hidden_act": "silu", "hidden_size": 1280,
                    "intermediate_size": 3420, "num_heads": 16, "in_chans": 3,
                    "out_hidden_size": 3584, "patch_size": 14, "spatial_merge_size": 2,
                    "spatial_patch_size": 14, "window_size": 112,
                    "fullatt_block_indexes": [7, 15, 23, 31], "tokens_per_second": 2,
                    "temporal_patch_size": 2},
  "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]},
  "vocab_size": 152064})";

// What transformers 5.24's save_pretrained writes (language keys under text_config).
std::string TinyNested(const std::string& text_extra = "", const std::string& vision_extra = "",
                       const std::string& top_extra = "") {
  return R"({"architectures": ["Qwen2_5_VLForConditionalGeneration"], "model_type": "qwen2_5_vl",
    "image_token_id": 100, "video_token_id": 101, "vision_start_token_id": 102,
    "vision_end_token_id": 103, "tie_word_embeddings": false)" +
         top_extra + R"(,
    "text_config": {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
      "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 128,
      "model_type": "qwen2_5_vl_text", "use_sliding_window": false, "sliding_window": null,
      "rope_parameters": {"mrope_section": [2, 1, 1], "rope_theta": 10000.0,
                          "rope_type": "default"})" +
         text_extra + R"(},
    "vision_config": {"depth": 2, "hidden_size": 16, "intermediate_size": 24, "num_heads": 2,
      "out_hidden_size": 32, "patch_size": 4, "spatial_merge_size": 2, "temporal_patch_size": 2,
      "window_size": 16, "fullatt_block_indexes": [1],
      "rope_parameters": {"rope_theta": 10000.0, "rope_type": "axial"})" +
         vision_extra + "}}";
}

TEST(HfConfigVlTest, Qwen25Vl7BPublishedLayout) {
  absl::StatusOr<ModelSpec> m = ParseHfConfigJson(kQwen25Vl7B);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->family, "qwen2_5_vl");
  EXPECT_TRUE(m->IsVisionLanguage());
  EXPECT_TRUE(m->qkv_bias);
  EXPECT_FALSE(m->qk_norm);
  EXPECT_EQ(m->hidden_size, 3584);
  EXPECT_EQ(m->num_layers, 28);
  EXPECT_EQ(m->num_kv_heads, 4);
  EXPECT_EQ(m->vocab_size, 152064);
  EXPECT_EQ(m->rope_scaling.type, "default");
  EXPECT_DOUBLE_EQ(m->rope_theta, 1e6);
  EXPECT_DOUBLE_EQ(m->rms_norm_eps, 1e-6);
  EXPECT_EQ(m->mrope_section, (std::vector<int64_t>{16, 24, 24}));
  EXPECT_EQ(m->sliding_window, 0);
  EXPECT_EQ(m->vision.depth, 32);
  EXPECT_EQ(m->vision.hidden_size, 1280);
  EXPECT_EQ(m->vision.intermediate_size, 3420);
  EXPECT_EQ(m->vision.num_heads, 16);
  EXPECT_EQ(m->vision.HeadDim(), 80);
  EXPECT_EQ(m->vision.patch_size, 14);
  EXPECT_EQ(m->vision.temporal_patch_size, 2);
  EXPECT_EQ(m->vision.PatchDim(), 3 * 2 * 14 * 14);
  EXPECT_EQ(m->vision.WindowMergedPatches(), 4);
  EXPECT_EQ(m->vision.fullatt_block_indexes, (std::vector<int64_t>{7, 15, 23, 31}));
  EXPECT_EQ(m->vision.out_hidden_size, 3584);
  EXPECT_EQ(m->image_token_id, 151655);
  EXPECT_EQ(m->video_token_id, 151656);
  EXPECT_EQ(m->vision_start_token_id, 151652);
  EXPECT_EQ(m->vision_end_token_id, 151653);
  EXPECT_TRUE(ValidateModelSpec(*m, "arch.").ok());
}

// The qwen2.5-vl-7b preset is the published config.json (scripts/configs/qwen2.5-vl-7b).
TEST(HfConfigVlTest, PresetIsThePublishedConfig) {
  absl::StatusOr<ModelSpec> parsed = ParseHfConfigJson(kQwen25Vl7B);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  const std::optional<ModelSpec> preset = FindModelPreset("qwen2.5-vl-7b");
  ASSERT_TRUE(preset.has_value());
  const ModelSpec& a = *parsed;
  const ModelSpec& b = *preset;
  EXPECT_TRUE(ValidateModelSpec(b, "arch.").ok()) << ValidateModelSpec(b, "arch.");
  EXPECT_EQ(b.family, a.family);
  EXPECT_EQ(b.hidden_size, a.hidden_size);
  EXPECT_EQ(b.num_layers, a.num_layers);
  EXPECT_EQ(b.num_heads, a.num_heads);
  EXPECT_EQ(b.num_kv_heads, a.num_kv_heads);
  EXPECT_EQ(b.HeadDim(), a.HeadDim());
  EXPECT_EQ(b.intermediate_size, a.intermediate_size);
  EXPECT_EQ(b.vocab_size, a.vocab_size);
  EXPECT_EQ(b.tie_word_embeddings, a.tie_word_embeddings);
  EXPECT_EQ(b.qkv_bias, a.qkv_bias);
  EXPECT_EQ(b.qk_norm, a.qk_norm);
  EXPECT_DOUBLE_EQ(b.rope_theta, a.rope_theta);
  EXPECT_DOUBLE_EQ(b.rms_norm_eps, a.rms_norm_eps);
  EXPECT_EQ(b.max_position_embeddings, a.max_position_embeddings);
  EXPECT_EQ(b.rope_scaling.type, a.rope_scaling.type);
  EXPECT_EQ(b.sliding_window, a.sliding_window);
  EXPECT_EQ(b.mrope_section, a.mrope_section);
  EXPECT_EQ(b.image_token_id, a.image_token_id);
  EXPECT_EQ(b.video_token_id, a.video_token_id);
  EXPECT_EQ(b.vision_start_token_id, a.vision_start_token_id);
  EXPECT_EQ(b.vision_end_token_id, a.vision_end_token_id);
  const VisionSpec &va = a.vision, &vb = b.vision;
  EXPECT_EQ(vb.depth, va.depth);
  EXPECT_EQ(vb.hidden_size, va.hidden_size);
  EXPECT_EQ(vb.intermediate_size, va.intermediate_size);
  EXPECT_EQ(vb.num_heads, va.num_heads);
  EXPECT_EQ(vb.in_channels, va.in_channels);
  EXPECT_EQ(vb.patch_size, va.patch_size);
  EXPECT_EQ(vb.spatial_merge_size, va.spatial_merge_size);
  EXPECT_EQ(vb.temporal_patch_size, va.temporal_patch_size);
  EXPECT_EQ(vb.window_size, va.window_size);
  EXPECT_EQ(vb.out_hidden_size, va.out_hidden_size);
  EXPECT_EQ(vb.fullatt_block_indexes, va.fullatt_block_indexes);
  EXPECT_DOUBLE_EQ(vb.rope_theta, va.rope_theta);
  // The Hugging Face repository's name finds it too.
  ASSERT_TRUE(FindModelPreset("Qwen/Qwen2.5-VL-7B").has_value());
}

TEST(HfConfigVlTest, Transformers5NestedLayoutAndDefaults) {
  absl::StatusOr<ModelSpec> m = ParseHfConfigJson(TinyNested());
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->hidden_size, 32);
  EXPECT_DOUBLE_EQ(m->rms_norm_eps, 1e-5);  // Qwen2_5_VLTextConfig's default
  EXPECT_DOUBLE_EQ(m->rope_theta, 10000.0);
  EXPECT_EQ(m->mrope_section, (std::vector<int64_t>{2, 1, 1}));
  EXPECT_EQ(m->vision.depth, 2);
  EXPECT_EQ(m->vision.fullatt_block_indexes, (std::vector<int64_t>{1}));
  EXPECT_EQ(m->image_token_id, 100);
  EXPECT_EQ(m->vision_end_token_id, 103);
  // Pre-v5 saves carried tie_word_embeddings in text_config.
  absl::StatusOr<ModelSpec> tied = ParseHfConfigJson(TinyNested(R"(, "tie_word_embeddings": true)"));
  ASSERT_TRUE(tied.ok()) << tied.status();
  EXPECT_TRUE(tied->tie_word_embeddings);
}

TEST(HfConfigVlTest, ConfigWriterRoundTrips) {
  for (const std::string& json : {std::string(kQwen25Vl7B), TinyNested()}) {
    absl::StatusOr<ModelSpec> m = ParseHfConfigJson(json);
    ASSERT_TRUE(m.ok()) << m.status();
    const std::string written = ToHfConfigJson(*m, DType::kBFloat16);
    EXPECT_THAT(written, HasSubstr("\"text_config\""));
    absl::StatusOr<ModelSpec> back = ParseHfConfigJson(written);
    ASSERT_TRUE(back.ok()) << back.status() << "\n" << written;
    EXPECT_EQ(back->family, m->family);
    EXPECT_EQ(back->hidden_size, m->hidden_size);
    EXPECT_EQ(back->num_layers, m->num_layers);
    EXPECT_EQ(back->num_kv_heads, m->num_kv_heads);
    EXPECT_DOUBLE_EQ(back->rope_theta, m->rope_theta);
    EXPECT_DOUBLE_EQ(back->rms_norm_eps, m->rms_norm_eps);
    EXPECT_EQ(back->mrope_section, m->mrope_section);
    EXPECT_EQ(back->vision.depth, m->vision.depth);
    EXPECT_EQ(back->vision.hidden_size, m->vision.hidden_size);
    EXPECT_EQ(back->vision.intermediate_size, m->vision.intermediate_size);
    EXPECT_EQ(back->vision.num_heads, m->vision.num_heads);
    EXPECT_EQ(back->vision.patch_size, m->vision.patch_size);
    EXPECT_EQ(back->vision.window_size, m->vision.window_size);
    EXPECT_EQ(back->vision.fullatt_block_indexes, m->vision.fullatt_block_indexes);
    EXPECT_DOUBLE_EQ(back->vision.rope_theta, m->vision.rope_theta);
    EXPECT_EQ(back->image_token_id, m->image_token_id);
    EXPECT_EQ(back->tie_word_embeddings, m->tie_word_embeddings);
  }
}

TEST(HfConfigVlTest, QwenVlWithoutVisionIsNotValid) {
  absl::StatusOr<ModelSpec> m = ParseHfConfigJson(TinyNested());
  ASSERT_TRUE(m.ok()) << m.status();
  m->vision.depth = 0;  // e.g. a spec that lost its tower in a conversion
  absl::Status s = ValidateModelSpec(*m, "arch.");
  EXPECT_THAT(std::string(s.message()), HasSubstr("arch.vision.depth = 0 must be >= 1"));
  ModelSpec text = *m;
  text.family = "qwen2";
  text.vision.depth = 2;
  s = ValidateModelSpec(text, "arch.");
  EXPECT_THAT(std::string(s.message()), HasSubstr("arch.vision.depth = 2 must be 0"));
}

// The planner refuses the adapters the agent refuses, with the same message.
TEST(HfConfigVlTest, AdaptersOnTheLanguageModelsAttentionOnly) {
  absl::StatusOr<ModelSpec> m = ParseHfConfigJson(kQwen25Vl7B);
  ASSERT_TRUE(m.ok());
  TrainingMethod lora;
  lora.kind = TrainingKind::kLora;
  lora.lora_rank = 16;
  lora.lora_target_modules = {"q_proj", "k_proj", "v_proj", "o_proj"};
  EXPECT_TRUE(ValidateTrainingMethod(lora, *m, "training.").ok());
  lora.lora_target_modules.push_back("up_proj");
  absl::Status s = ValidateTrainingMethod(lora, *m, "training.");
  EXPECT_EQ(s, CheckVisionAdapters(*m, false, lora.lora_target_modules, "training."));
  EXPECT_THAT(std::string(s.message()), HasSubstr("visual.blocks.N.mlp.up_proj"));
  lora.kind = TrainingKind::kQlora;
  lora.lora_target_modules = {"q_proj"};
  EXPECT_THAT(std::string(ValidateTrainingMethod(lora, *m, "training.").message()),
              HasSubstr("QLoRA"));
}

struct VlBadCase {
  std::string json;
  std::string key;  // the error must name it
};

class HfConfigVlErrorTest : public ::testing::TestWithParam<VlBadCase> {};

TEST_P(HfConfigVlErrorTest, NamesTheKey) {
  absl::StatusOr<ModelSpec> m = ParseHfConfigJson(GetParam().json);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(m.status().message()), HasSubstr(GetParam().key)) << m.status();
}

INSTANTIATE_TEST_SUITE_P(
    Cases, HfConfigVlErrorTest,
    ::testing::Values(
        VlBadCase{TinyNested(R"(, "vocab_size": 0)"), "\"text_config.vocab_size\""},
        VlBadCase{R"({"model_type": "qwen2_5_vl", "text_config": 3})", "\"text_config\""},
        VlBadCase{TinyNested(R"(, "use_sliding_window": true)"),
                  "\"text_config.use_sliding_window\""},
        VlBadCase{TinyNested(R"(, "rope_parameters": {"rope_type": "default",
                                                     "mrope_section": [2, 2, 2]})"),
                  "\"text_config.rope_parameters.mrope_section\" sums to 6"},
        VlBadCase{TinyNested(R"(, "rope_parameters": {"rope_type": "default",
                                                     "mrope_section": [4]})"),
                  "\"text_config.rope_parameters.mrope_section\""},
        VlBadCase{TinyNested(R"(, "rope_parameters": {"rope_type": "yarn", "factor": 2,
                                                     "mrope_section": [2, 1, 1]})"),
                  "\"text_config.rope_parameters.rope_type\""},
        VlBadCase{TinyNested("", R"(, "depth": 0)"), "\"vision_config.depth\""},
        VlBadCase{TinyNested("", R"(, "num_heads": 3)"), "\"vision_config.num_heads\""},
        VlBadCase{TinyNested("", R"(, "hidden_act": "quick_gelu")"),
                  "\"vision_config.hidden_act\""},
        VlBadCase{TinyNested("", R"(, "fullatt_block_indexes": [2])"),
                  "\"vision_config.fullatt_block_indexes\""},
        VlBadCase{TinyNested("", R"(, "window_size": 4)"), "\"vision_config.window_size\""},
        VlBadCase{TinyNested("", R"(, "patch_size": "14")"), "\"vision_config.patch_size\""},
        VlBadCase{TinyNested("", R"(, "out_hidden_size": 48)"),
                  "\"vision_config.out_hidden_size\""},
        VlBadCase{TinyNested("", R"(, "rope_parameters": {"rope_type": "default"})"),
                  "\"vision_config.rope_parameters.rope_type\""},
        VlBadCase{R"({"model_type": "qwen2_5_vl", "hidden_size": 32, "num_hidden_layers": 2,
                      "num_attention_heads": 4, "intermediate_size": 64, "vocab_size": 152064,
                      "rope_scaling": {"type": "mrope", "mrope_section": [1, 1, 2]},
                      "vision_config": []})",
                  "\"vision_config\" must be an object"},
        VlBadCase{TinyNested("", "", R"(, "image_token_id": 128)"), "\"image_token_id\""},
        VlBadCase{R"({"model_type": "llava", "hidden_size": 64})", "\"model_type\""}));

}  // namespace
}  // namespace memplan
