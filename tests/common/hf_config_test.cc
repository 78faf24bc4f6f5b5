#include "common/hf_config.h"

#include <filesystem>
#include <fstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "common/validate.h"

namespace memplan {
namespace {

using ::testing::HasSubstr;

// Field names and values as published in the Hugging Face hub's config.json files.
constexpr char kLlama31_8B[] = R"({
  "architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 128000, "eos_token_id": 128001, "hidden_act": "silu", "hidden_size": 4096,
  "initializer_range": 0.02, "intermediate_size": 14336, "max_position_embeddings": 131072,
  "mlp_bias": false, "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 32,
  "num_key_value_heads": 8, "pretraining_tp": 1, "rms_norm_eps": 1e-05,
  "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                   "original_max_position_embeddings": 8192, "rope_type": "llama3"},
  "rope_theta": 500000.0, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
  "transformers_version": "4.43.0.dev0", "use_cache": true, "vocab_size": 128256})";

constexpr char kQwen25_05B[] = R"({
  "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
  "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 896, "initializer_range": 0.02,
  "intermediate_size": 4864, "max_position_embeddings": 32768, "max_window_layers": 24,
  "model_type": "qwen2", "num_attention_heads": 14, "num_hidden_layers": 24,
  "num_key_value_heads": 2, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
  "sliding_window": 32768, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
  "use_cache": true, "use_sliding_window": false, "vocab_size": 151936})";

constexpr char kQwen3_06B[] = R"({
  "architectures": ["Qwen3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
  "hidden_size": 1024, "initializer_range": 0.02, "intermediate_size": 3072,
  "max_position_embeddings": 40960, "max_window_layers": 28, "model_type": "qwen3",
  "num_attention_heads": 16, "num_hidden_layers": 28, "num_key_value_heads": 8,
  "rms_norm_eps": 1e-06, "rope_scaling": null, "rope_theta": 1000000, "sliding_window": null,
  "tie_word_embeddings": true, "torch_dtype": "bfloat16", "use_cache": true,
  "use_sliding_window": false, "vocab_size": 151936})";

constexpr char kMistral7B[] = R"({
  "_name_or_path": "mistralai/Mistral-7B-v0.1",
  "architectures": ["MistralForCausalLM"], "bos_token_id": 1, "eos_token_id": 2,
  "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
  "intermediate_size": 14336, "max_position_embeddings": 32768, "model_type": "mistral",
  "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
  "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "sliding_window": 4096,
  "tie_word_embeddings": false, "torch_dtype": "bfloat16", "use_cache": true,
  "vocab_size": 32000})";

// A minimal config; tests patch one key at a time into it.
std::string Tiny(const std::string& extra = "") {
  return R"({"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2,
             "num_attention_heads": 4, "intermediate_size": 128, "vocab_size": 256)" +
         (extra.empty() ? std::string() : ", " + extra) + "}";
}

TEST(HfConfigTest, Llama31) {
  absl::StatusOr<ModelSpec> m = ParseHfConfigJson(kLlama31_8B);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->family, "llama");
  EXPECT_EQ(m->hidden_size, 4096);
  EXPECT_EQ(m->num_layers, 32);
  EXPECT_EQ(m->num_heads, 32);
  EXPECT_EQ(m->num_kv_heads, 8);
  EXPECT_EQ(m->HeadDim(), 128);
  EXPECT_EQ(m->intermediate_size, 14336);
  EXPECT_EQ(m->vocab_size, 128256);
  EXPECT_FALSE(m->tie_word_embeddings);
  EXPECT_FALSE(m->qkv_bias);
  EXPECT_FALSE(m->qk_norm);
  EXPECT_DOUBLE_EQ(m->rope_theta, 500000.0);
  EXPECT_DOUBLE_EQ(m->rms_norm_eps, 1e-5);
  EXPECT_EQ(m->max_position_embeddings, 131072);
}

TEST(HfConfigTest, Qwen25HasQkvBiasAndTiedEmbeddings) {
  absl::StatusOr<ModelSpec> m = ParseHfConfigJson(kQwen25_05B);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->family, "qwen2");
  EXPECT_EQ(m->hidden_size, 896);
  EXPECT_EQ(m->num_heads, 14);
  EXPECT_EQ(m->num_kv_heads, 2);
  EXPECT_EQ(m->HeadDim(), 64);
  EXPECT_TRUE(m->tie_word_embeddings);
  EXPECT_TRUE(m->qkv_bias);
  EXPECT_FALSE(m->qk_norm);
  EXPECT_DOUBLE_EQ(m->rope_theta, 1e6);
  EXPECT_DOUBLE_EQ(m->rms_norm_eps, 1e-6);
}

TEST(HfConfigTest, Qwen3HasExplicitHeadDimAndQkNorm) {
  absl::StatusOr<ModelSpec> m = ParseHfConfigJson(kQwen3_06B);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->family, "qwen3");
  EXPECT_EQ(m->hidden_size, 1024);
  EXPECT_EQ(m->num_heads, 16);
  // 16 heads x 128 != 1024: head_dim is independent of hidden_size in Qwen3.
  EXPECT_EQ(m->HeadDim(), 128);
  EXPECT_TRUE(m->qk_norm);
  EXPECT_FALSE(m->qkv_bias);
  EXPECT_EQ(m->max_position_embeddings, 40960);
  EXPECT_DOUBLE_EQ(m->rope_theta, 1e6);  // an integer in the JSON
}

TEST(HfConfigTest, MistralTakesNameFromNameOrPath) {
  absl::StatusOr<ModelSpec> m = ParseHfConfigJson(kMistral7B);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->family, "mistral");
  EXPECT_EQ(m->name, "mistralai/Mistral-7B-v0.1");
  EXPECT_EQ(m->num_kv_heads, 8);
  EXPECT_EQ(m->vocab_size, 32000);
}

TEST(HfConfigTest, DefaultsForAbsentAndNullKeys) {
  absl::StatusOr<ModelSpec> m = ParseHfConfigJson(Tiny(R"("num_key_value_heads": null,
                                                          "head_dim": null)"));
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->name, "llama");
  EXPECT_EQ(m->num_kv_heads, 4);  // = num_attention_heads
  EXPECT_EQ(m->head_dim, 0);      // derived: 64 / 4
  EXPECT_EQ(m->HeadDim(), 16);
  EXPECT_FALSE(m->tie_word_embeddings);
  EXPECT_DOUBLE_EQ(m->rope_theta, 10000.0);
  EXPECT_DOUBLE_EQ(m->rms_norm_eps, 1e-6);
  EXPECT_EQ(m->max_position_embeddings, 2048);
}

TEST(HfConfigTest, RopeThetaFromRopeParameters) {
  absl::StatusOr<ModelSpec> m =
      ParseHfConfigJson(Tiny(R"("rope_parameters": {"rope_type": "default", "rope_theta": 5e5})"));
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_DOUBLE_EQ(m->rope_theta, 5e5);
}

TEST(HfConfigTest, Llama31RopeScalingFromTopLevelLayout) {
  absl::StatusOr<ModelSpec> m = ParseHfConfigJson(kLlama31_8B);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->rope_scaling.type, "llama3");
  EXPECT_DOUBLE_EQ(m->rope_scaling.factor, 8.0);
  EXPECT_DOUBLE_EQ(m->rope_scaling.low_freq_factor, 1.0);
  EXPECT_DOUBLE_EQ(m->rope_scaling.high_freq_factor, 4.0);
  EXPECT_EQ(m->rope_scaling.original_max_position_embeddings, 8192);
  EXPECT_EQ(m->sliding_window, 0);
}

TEST(HfConfigTest, RopeScalingFromRopeParametersLayout) {
  // transformers 5.x keeps theta and the scaling together in rope_parameters; its theta wins
  // over a top-level one.
  absl::StatusOr<ModelSpec> m = ParseHfConfigJson(Tiny(R"("rope_theta": 1e4,
      "rope_parameters": {"rope_type": "llama3", "rope_theta": 5e5, "factor": 32.0,
                          "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                          "original_max_position_embeddings": 8192})"));
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_DOUBLE_EQ(m->rope_theta, 5e5);
  EXPECT_EQ(m->rope_scaling.type, "llama3");
  EXPECT_DOUBLE_EQ(m->rope_scaling.factor, 32.0);
}

TEST(HfConfigTest, RopeTypesAndDefaults) {
  absl::StatusOr<ModelSpec> linear =
      ParseHfConfigJson(Tiny(R"("rope_scaling": {"type": "linear", "factor": 2.0})"));
  ASSERT_TRUE(linear.ok()) << linear.status();
  EXPECT_EQ(linear->rope_scaling.type, "linear");
  EXPECT_DOUBLE_EQ(linear->rope_scaling.factor, 2.0);
  EXPECT_DOUBLE_EQ(linear->rope_theta, 10000.0);

  // yarn without a factor: max_position_embeddings / original_max_position_embeddings.
  absl::StatusOr<ModelSpec> yarn = ParseHfConfigJson(Tiny(R"("max_position_embeddings": 4096,
      "rope_parameters": {"rope_type": "yarn", "original_max_position_embeddings": 1024})"));
  ASSERT_TRUE(yarn.ok()) << yarn.status();
  EXPECT_DOUBLE_EQ(yarn->rope_scaling.factor, 4.0);
  EXPECT_DOUBLE_EQ(yarn->rope_scaling.beta_fast, 32.0);
  EXPECT_TRUE(yarn->rope_scaling.truncate);

  // llama3 without original_max_position_embeddings: max_position_embeddings.
  absl::StatusOr<ModelSpec> llama3 = ParseHfConfigJson(Tiny(R"("max_position_embeddings": 4096,
      "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                       "high_freq_factor": 4.0})"));
  ASSERT_TRUE(llama3.ok()) << llama3.status();
  EXPECT_EQ(llama3->rope_scaling.original_max_position_embeddings, 4096);

  absl::StatusOr<ModelSpec> none = ParseHfConfigJson(Tiny(R"("rope_scaling": null)"));
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_EQ(none->rope_scaling.type, "default");
}

TEST(HfConfigTest, SlidingWindowAsTransformersDecidesIt) {
  absl::StatusOr<ModelSpec> mistral = ParseHfConfigJson(kMistral7B);
  ASSERT_TRUE(mistral.ok()) << mistral.status();
  EXPECT_EQ(mistral->sliding_window, 4096);
  ASSERT_EQ(mistral->sliding_layers.size(), 32u);  // every layer
  EXPECT_EQ(mistral->sliding_layers.front(), 0);
  EXPECT_EQ(mistral->sliding_layers.back(), 31);
  EXPECT_EQ(mistral->LayerWindow(17), 4096);
  // The agent computes the window exactly: sequences beyond it are accepted.
  EXPECT_TRUE(CheckSequenceLength(*mistral, 4096).ok());
  EXPECT_TRUE(CheckSequenceLength(*mistral, 32768).ok());
  EXPECT_FALSE(CheckSequenceLength(*mistral, 0).ok());

  // Qwen2 with use_sliding_window false: full attention whatever "sliding_window" says.
  absl::StatusOr<ModelSpec> qwen = ParseHfConfigJson(kQwen25_05B);
  ASSERT_TRUE(qwen.ok()) << qwen.status();
  EXPECT_EQ(qwen->sliding_window, 0);
  EXPECT_TRUE(qwen->sliding_layers.empty());

  const std::string qwen2 = R"({"model_type": "qwen2", "hidden_size": 64,
      "num_hidden_layers": 4, "num_attention_heads": 4, "intermediate_size": 128,
      "vocab_size": 256, "use_sliding_window": true, "sliding_window": 512)";
  // Layers from max_window_layers on slide; none do when it covers every layer.
  absl::StatusOr<ModelSpec> all_full = ParseHfConfigJson(qwen2 + R"(, "max_window_layers": 4})");
  ASSERT_TRUE(all_full.ok()) << all_full.status();
  EXPECT_EQ(all_full->sliding_window, 0);
  EXPECT_TRUE(all_full->sliding_layers.empty());
  absl::StatusOr<ModelSpec> some = ParseHfConfigJson(qwen2 + R"(, "max_window_layers": 2})");
  ASSERT_TRUE(some.ok()) << some.status();
  EXPECT_EQ(some->sliding_window, 512);
  EXPECT_EQ(some->sliding_layers, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(some->LayerWindow(1), 0);
  EXPECT_EQ(some->LayerWindow(2), 512);
  absl::StatusOr<ModelSpec> typed = ParseHfConfigJson(qwen2 + R"(, "layer_types":
      ["full_attention", "full_attention", "full_attention", "sliding_attention"]})");
  ASSERT_TRUE(typed.ok()) << typed.status();
  EXPECT_EQ(typed->sliding_window, 512);
  EXPECT_EQ(typed->sliding_layers, (std::vector<int64_t>{3}));
  // layer_types wins over max_window_layers, and needs one entry per layer.
  absl::StatusOr<ModelSpec> both = ParseHfConfigJson(qwen2 + R"(, "max_window_layers": 0,
      "layer_types": ["sliding_attention", "full_attention", "sliding_attention",
      "full_attention"]})");
  ASSERT_TRUE(both.ok()) << both.status();
  EXPECT_EQ(both->sliding_layers, (std::vector<int64_t>{0, 2}));
  const absl::StatusOr<ModelSpec> short_types =
      ParseHfConfigJson(qwen2 + R"(, "layer_types": ["sliding_attention"]})");
  ASSERT_FALSE(short_types.ok());
  EXPECT_THAT(std::string(short_types.status().message()), HasSubstr("layer_types"));

  // The config writer keeps which layers slide.
  absl::StatusOr<ModelSpec> back = ParseHfConfigJson(ToHfConfigJson(*both, DType::kFloat32));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->sliding_window, 512);
  EXPECT_EQ(back->sliding_layers, (std::vector<int64_t>{0, 2}));
}

TEST(HfConfigTest, ConfigWriterRoundTrips) {
  for (const char* json : {kLlama31_8B, kQwen25_05B, kQwen3_06B, kMistral7B}) {
    absl::StatusOr<ModelSpec> m = ParseHfConfigJson(json);
    ASSERT_TRUE(m.ok()) << m.status();
    absl::StatusOr<ModelSpec> back = ParseHfConfigJson(ToHfConfigJson(*m, DType::kBFloat16));
    ASSERT_TRUE(back.ok()) << back.status() << "\n" << ToHfConfigJson(*m, DType::kBFloat16);
    EXPECT_EQ(back->family, m->family);
    EXPECT_EQ(back->hidden_size, m->hidden_size);
    EXPECT_EQ(back->num_layers, m->num_layers);
    EXPECT_EQ(back->num_kv_heads, m->num_kv_heads);
    EXPECT_EQ(back->HeadDim(), m->HeadDim());
    EXPECT_EQ(back->tie_word_embeddings, m->tie_word_embeddings);
    EXPECT_EQ(back->qkv_bias, m->qkv_bias);
    EXPECT_EQ(back->qk_norm, m->qk_norm);
    EXPECT_DOUBLE_EQ(back->rope_theta, m->rope_theta);
    EXPECT_DOUBLE_EQ(back->rms_norm_eps, m->rms_norm_eps);
    EXPECT_EQ(back->rope_scaling.type, m->rope_scaling.type);
    EXPECT_DOUBLE_EQ(back->rope_scaling.factor, m->rope_scaling.factor);
    EXPECT_EQ(back->rope_scaling.original_max_position_embeddings,
              m->rope_scaling.original_max_position_embeddings);
    EXPECT_EQ(back->sliding_window, m->sliding_window);
    EXPECT_EQ(back->sliding_layers, m->sliding_layers);

    ModelSpec rope_only;
    rope_only.family = m->family;
    rope_only.max_position_embeddings = m->max_position_embeddings;
    ASSERT_TRUE(ParseRopeParametersJson(RopeParametersJson(*m), &rope_only).ok());
    EXPECT_EQ(rope_only.rope_scaling.type, m->rope_scaling.type);
    EXPECT_DOUBLE_EQ(rope_only.rope_theta, m->rope_theta);
  }
}

// As published on the Hugging Face hub (Qwen/Qwen3-30B-A3B, mistralai/Mixtral-8x7B-v0.1).
constexpr char kQwen3_30B_A3B[] = R"({
  "architectures": ["Qwen3MoeForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 151643, "decoder_sparse_step": 1, "eos_token_id": 151645, "head_dim": 128,
  "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 6144,
  "max_position_embeddings": 40960, "max_window_layers": 48, "mlp_only_layers": [],
  "model_type": "qwen3_moe", "moe_intermediate_size": 768, "norm_topk_prob": true,
  "num_attention_heads": 32, "num_experts": 128, "num_experts_per_tok": 8,
  "num_hidden_layers": 48, "num_key_value_heads": 4, "output_router_logits": false,
  "rms_norm_eps": 1e-06, "rope_scaling": null, "rope_theta": 1000000.0,
  "router_aux_loss_coef": 0.001, "sliding_window": null, "tie_word_embeddings": false,
  "torch_dtype": "bfloat16", "transformers_version": "4.51.0", "use_cache": true,
  "use_sliding_window": false, "vocab_size": 151936})";

constexpr char kMixtral8x7B[] = R"({
  "architectures": ["MixtralForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 1,
  "eos_token_id": 2, "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
  "intermediate_size": 14336, "max_position_embeddings": 32768, "model_type": "mixtral",
  "num_attention_heads": 32, "num_experts_per_tok": 2, "num_hidden_layers": 32,
  "num_key_value_heads": 8, "num_local_experts": 8, "output_router_logits": false,
  "rms_norm_eps": 1e-05, "rope_theta": 1000000.0, "router_aux_loss_coef": 0.02,
  "sliding_window": null, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
  "transformers_version": "4.36.0.dev0", "use_cache": true, "vocab_size": 32000})";

TEST(HfConfigTest, Qwen3MoeReadsExpertsAndRouting) {
  absl::StatusOr<ModelSpec> m = ParseHfConfigJson(kQwen3_30B_A3B);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->family, "qwen3_moe");
  EXPECT_TRUE(m->qk_norm);
  EXPECT_EQ(m->HeadDim(), 128);
  EXPECT_EQ(m->num_experts, 128);
  EXPECT_EQ(m->num_experts_per_tok, 8);
  EXPECT_EQ(m->moe_intermediate_size, 768);
  EXPECT_EQ(m->intermediate_size, 6144);
  EXPECT_TRUE(m->norm_topk_prob);
  EXPECT_EQ(m->decoder_sparse_step, 1);
  EXPECT_TRUE(m->mlp_only_layers.empty());
  EXPECT_FALSE(m->output_router_logits);
  EXPECT_DOUBLE_EQ(m->router_aux_loss_coef, 0.001);
  EXPECT_FALSE(m->HasRouterAuxLoss());
  EXPECT_EQ(m->sliding_window, 0);
  EXPECT_TRUE(m->IsMoeLayer(0));
  EXPECT_TRUE(m->IsMoeLayer(47));
}

TEST(HfConfigTest, Qwen3MoeDenseLayersAndTransformersDefaults) {
  // transformers writes the expert count under its alias num_local_experts; absent keys take
  // Qwen3MoeConfig's defaults (top-8, width 768, no renormalisation).
  absl::StatusOr<ModelSpec> m = ParseHfConfigJson(
      R"({"model_type": "qwen3_moe", "hidden_size": 64, "num_hidden_layers": 6,
          "num_attention_heads": 4, "intermediate_size": 128, "vocab_size": 256,
          "num_local_experts": 16, "decoder_sparse_step": 2, "mlp_only_layers": [3],
          "output_router_logits": true})");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->num_experts, 16);
  EXPECT_EQ(m->num_experts_per_tok, 8);
  EXPECT_EQ(m->moe_intermediate_size, 768);
  EXPECT_FALSE(m->norm_topk_prob);
  EXPECT_DOUBLE_EQ(m->router_aux_loss_coef, 0.001);
  EXPECT_TRUE(m->HasRouterAuxLoss());
  // Sparse: (i + 1) % 2 == 0 and not listed: layers 1 and 5; layer 3 is listed as dense.
  std::vector<bool> sparse;
  for (int64_t i = 0; i < 6; ++i) sparse.push_back(m->IsMoeLayer(i));
  EXPECT_EQ(sparse, (std::vector<bool>{false, true, false, false, false, true}));
}

TEST(HfConfigTest, MixtralRenormalisesAndUsesIntermediateSizePerExpert) {
  absl::StatusOr<ModelSpec> m = ParseHfConfigJson(kMixtral8x7B);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->family, "mixtral");
  EXPECT_FALSE(m->qk_norm);
  EXPECT_EQ(m->num_experts, 8);
  EXPECT_EQ(m->num_experts_per_tok, 2);
  EXPECT_EQ(m->moe_intermediate_size, 14336);
  EXPECT_TRUE(m->norm_topk_prob);
  EXPECT_DOUBLE_EQ(m->router_aux_loss_coef, 0.02);
  EXPECT_DOUBLE_EQ(m->rope_theta, 1e6);
  EXPECT_EQ(m->sliding_window, 0);
  EXPECT_EQ(m->max_position_embeddings, 32768);
  for (int64_t i = 0; i < 32; ++i) EXPECT_TRUE(m->IsMoeLayer(i)) << i;
}

TEST(HfConfigTest, MoeConfigWriterRoundTrips) {
  for (const char* json : {kQwen3_30B_A3B, kMixtral8x7B}) {
    absl::StatusOr<ModelSpec> m = ParseHfConfigJson(json);
    ASSERT_TRUE(m.ok()) << m.status();
    m->mlp_only_layers = m->family == "qwen3_moe" ? std::vector<int64_t>{0, 7} : m->mlp_only_layers;
    m->output_router_logits = true;
    absl::StatusOr<ModelSpec> back = ParseHfConfigJson(ToHfConfigJson(*m, DType::kBFloat16));
    ASSERT_TRUE(back.ok()) << back.status() << "\n" << ToHfConfigJson(*m, DType::kBFloat16);
    EXPECT_EQ(back->family, m->family);
    EXPECT_EQ(back->num_experts, m->num_experts);
    EXPECT_EQ(back->num_experts_per_tok, m->num_experts_per_tok);
    EXPECT_EQ(back->moe_intermediate_size, m->moe_intermediate_size);
    EXPECT_EQ(back->norm_topk_prob, m->norm_topk_prob);
    EXPECT_EQ(back->decoder_sparse_step, m->decoder_sparse_step);
    EXPECT_EQ(back->mlp_only_layers, m->mlp_only_layers);
    EXPECT_TRUE(back->output_router_logits);
    EXPECT_DOUBLE_EQ(back->router_aux_loss_coef, m->router_aux_loss_coef);
    EXPECT_EQ(back->qk_norm, m->qk_norm);
    EXPECT_EQ(back->HeadDim(), m->HeadDim());
  }
}

TEST(HfConfigTest, FamilyFromArchitecturesWhenModelTypeAbsent) {
  absl::StatusOr<ModelSpec> m = ParseHfConfigJson(
      R"({"architectures": ["Qwen2ForCausalLM"], "hidden_size": 64, "num_hidden_layers": 2,
          "num_attention_heads": 4, "intermediate_size": 128, "vocab_size": 256})");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->family, "qwen2");
  EXPECT_TRUE(m->qkv_bias);
}

struct BadCase {
  std::string json;
  std::string key;  // the error must name it
};

class HfConfigErrorTest : public ::testing::TestWithParam<BadCase> {};

TEST_P(HfConfigErrorTest, NamesTheKey) {
  absl::StatusOr<ModelSpec> m = ParseHfConfigJson(GetParam().json);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(m.status().message()), HasSubstr(GetParam().key)) << m.status();
}

INSTANTIATE_TEST_SUITE_P(
    Cases, HfConfigErrorTest,
    ::testing::Values(
        BadCase{R"({"model_type": "llama", "num_hidden_layers": 2, "num_attention_heads": 4,
                    "intermediate_size": 128, "vocab_size": 256})",
                "\"hidden_size\" is required"},
        BadCase{Tiny(R"("num_key_value_heads": 3)"), "\"num_key_value_heads\""},
        BadCase{Tiny(R"("num_key_value_heads": 8)"), "\"num_key_value_heads\""},
        BadCase{Tiny(R"("num_key_value_heads": "2")"),
                "\"num_key_value_heads\" must be an integer"},
        BadCase{Tiny(R"("head_dim": 15)"), "\"head_dim\""},
        BadCase{Tiny(R"("rms_norm_eps": -1)"), "\"rms_norm_eps\""},
        BadCase{Tiny(R"("rope_theta": "big")"), "\"rope_theta\" must be a number"},
        BadCase{Tiny(R"("tie_word_embeddings": 1)"), "\"tie_word_embeddings\" must be true"},
        BadCase{Tiny(R"("max_position_embeddings": 0)"), "\"max_position_embeddings\""},
        BadCase{Tiny(R"("hidden_act": "gelu")"), "\"hidden_act\""},
        BadCase{Tiny(R"("mlp_bias": true)"), "\"mlp_bias\""},
        BadCase{Tiny(R"("attention_bias": true)"), "\"attention_bias\""},
        BadCase{Tiny(R"("architectures": ["LlamaForSequenceClassification"])"),
                "\"architectures\""},
        BadCase{R"({"model_type": "gpt2", "hidden_size": 64})", "\"model_type\""},
        BadCase{R"({"hidden_size": 64})", "\"model_type\" is required"},
        BadCase{R"({"model_type": "llama", "hidden_size": 64.5})", "\"hidden_size\""},
        BadCase{R"({"model_type": "llama", "hidden_size": -4})", "\"hidden_size\""},
        BadCase{R"({"model_type": "llama", "hidden_size": 18446744073709551615})",
                "\"hidden_size\""},
        BadCase{R"({"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2,
                    "num_attention_heads": 6, "intermediate_size": 128, "vocab_size": 256})",
                "\"num_attention_heads\""},
        BadCase{Tiny(R"("vocab_size": 0)"), "\"vocab_size\""},
        BadCase{Tiny(R"("rope_scaling": {"type": "longrope", "factor": 2.0})"),
                "rope_scaling.rope_type"},
        BadCase{Tiny(R"("rope_parameters": {"rope_type": "su"})"), "rope_parameters.rope_type"},
        BadCase{Tiny(R"("rope_scaling": {"type": "linear"})"), "rope_scaling.factor"},
        BadCase{Tiny(R"("rope_scaling": {"type": "linear", "factor": 2, "mscale": 1})"),
                "rope_scaling.mscale"},
        BadCase{Tiny(R"("rope_scaling": {"rope_type": "llama3", "factor": 8})"),
                "rope_scaling.low_freq_factor"},
        BadCase{Tiny(R"("rope_scaling": {"type": "dynamic", "factor": -1})"),
                "rope_scaling.factor"},
        BadCase{Tiny(R"("partial_rotary_factor": 0.5)"), "partial_rotary_factor"},
        BadCase{Tiny(R"("rope_parameters": {"full_attention": {"rope_type": "default"}})"),
                "rope_parameters.full_attention"},
        BadCase{R"({"model_type": "mixtral", "hidden_size": 64, "num_hidden_layers": 2,
                    "num_attention_heads": 4, "intermediate_size": 128, "vocab_size": 256,
                    "router_jitter_noise": 0.01})",
                "\"router_jitter_noise\""},
        BadCase{R"({"model_type": "mixtral", "hidden_size": 64, "num_hidden_layers": 2,
                    "num_attention_heads": 4, "intermediate_size": 128, "vocab_size": 256,
                    "num_local_experts": 4, "num_experts_per_tok": 5})",
                "\"num_experts_per_tok\""},
        BadCase{R"({"model_type": "qwen3_moe", "hidden_size": 64, "num_hidden_layers": 2,
                    "num_attention_heads": 4, "intermediate_size": 128, "vocab_size": 256,
                    "num_experts": 0})",
                "\"num_experts\""},
        BadCase{R"({"model_type": "qwen3_moe", "hidden_size": 64, "num_hidden_layers": 2,
                    "num_attention_heads": 4, "intermediate_size": 128, "vocab_size": 256,
                    "mlp_only_layers": [2]})",
                "\"mlp_only_layers\""},
        BadCase{R"({"model_type": "llama",)", "malformed JSON"},
        BadCase{R"([1, 2])", "JSON object"}));

TEST(HfConfigTest, LoadFileFromDirectoryNamesModelAfterDirectory) {
  namespace fs = std::filesystem;
  fs::path dir = fs::path(::testing::TempDir()) / "hf_config_test" / "TinyLlama";
  fs::create_directories(dir);
  { std::ofstream(dir / "config.json") << Tiny(); }
  absl::StatusOr<ModelSpec> m = LoadHfConfigFile(dir.string());
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->name, "TinyLlama");
  EXPECT_EQ(m->hidden_size, 64);

  absl::StatusOr<ModelSpec> direct = LoadHfConfigFile((dir / "config.json").string());
  ASSERT_TRUE(direct.ok()) << direct.status();
  EXPECT_EQ(direct->name, "TinyLlama");
}

TEST(HfConfigTest, LoadFileErrors) {
  namespace fs = std::filesystem;
  fs::path dir = fs::path(::testing::TempDir()) / "hf_config_test_errors";
  fs::create_directories(dir);
  absl::StatusOr<ModelSpec> missing = LoadHfConfigFile((dir / "nope.json").string());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);

  { std::ofstream(dir / "config.json") << Tiny(R"("vocab_size": -1)"); }
  absl::StatusOr<ModelSpec> bad = LoadHfConfigFile(dir.string());
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("config.json"));
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("\"vocab_size\""));
}

}  // namespace
}  // namespace memplan
