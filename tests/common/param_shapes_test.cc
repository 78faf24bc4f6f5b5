#include "common/param_shapes.h"

#include <set>

#include "common/hf_config.h"
#include "gtest/gtest.h"

namespace memplan {
namespace {

int64_t Count(const std::vector<ParamShape>& shapes) {
  int64_t total = 0;
  for (const ParamShape& p : shapes) {
    int64_t n = 1;
    for (int64_t d : p.shape) n *= d;
    total += n;
  }
  return total;
}

ModelSpec Spec(const char* json) {
  absl::StatusOr<ModelSpec> m = ParseHfConfigJson(json);
  EXPECT_TRUE(m.ok()) << m.status();
  return *m;
}

// Published parameter counts of real checkpoints check every shape rule at once.
TEST(HfParamShapesTest, Llama31_8BHasItsPublishedParameterCount) {
  const ModelSpec m = Spec(R"({"model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32,
      "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336,
      "vocab_size": 128256, "tie_word_embeddings": false})");
  const std::vector<ParamShape> shapes = HfParamShapes(m);
  EXPECT_EQ(Count(shapes), 8030261248);
  EXPECT_EQ(shapes.size(), 1u + 32u * 9u + 2u);
  EXPECT_EQ(shapes.front().name, "model.embed_tokens.weight");
  EXPECT_EQ(shapes.back().name, "lm_head.weight");
  // [Parameter order]: Hugging Face's named_parameters() order inside a block.
  EXPECT_EQ(shapes[2].name, "model.layers.0.self_attn.k_proj.weight");
  EXPECT_EQ(shapes[2].shape, (std::vector<int64_t>{1024, 4096}));
  EXPECT_EQ(shapes[2].group, 1);
  EXPECT_EQ(shapes[8].name, "model.layers.0.input_layernorm.weight");
  EXPECT_EQ(shapes[9].name, "model.layers.0.post_attention_layernorm.weight");
  EXPECT_EQ(shapes.front().group, 0);
  EXPECT_EQ(shapes.back().group, 33);
}

// Hand-summed from the published configs: Qwen3-30B-A3B's 30.5B (128 experts of 3 x 768 x 2048
// per layer, a 128 x 2048 router) and Mixtral-8x7B's 46.7B.
TEST(HfParamShapesTest, Qwen3_30B_A3BListsEveryExpertUnderItsCheckpointName) {
  const ModelSpec m = Spec(R"({"model_type": "qwen3_moe", "hidden_size": 2048,
      "num_hidden_layers": 48, "num_attention_heads": 32, "num_key_value_heads": 4,
      "head_dim": 128, "intermediate_size": 6144, "moe_intermediate_size": 768,
      "num_experts": 128, "num_experts_per_tok": 8, "norm_topk_prob": true,
      "vocab_size": 151936, "tie_word_embeddings": false})");
  const std::vector<ParamShape> shapes = HfParamShapes(m);
  EXPECT_EQ(Count(shapes), 30532122624);
  // Per block: 4 attention projections, 2 q/k norms, the router, 3 per expert, 2 norms.
  EXPECT_EQ(shapes.size(), 1u + 48u * (6u + 1u + 3u * 128u + 2u) + 2u);
  // [Parameter order]: the router where the dense MLP would start, then experts in index order.
  EXPECT_EQ(shapes[7].name, "model.layers.0.mlp.gate.weight");
  EXPECT_EQ(shapes[7].shape, (std::vector<int64_t>{128, 2048}));
  EXPECT_EQ(shapes[8].name, "model.layers.0.mlp.experts.0.gate_proj.weight");
  EXPECT_EQ(shapes[8].shape, (std::vector<int64_t>{768, 2048}));
  EXPECT_EQ(shapes[9].name, "model.layers.0.mlp.experts.0.up_proj.weight");
  EXPECT_EQ(shapes[10].name, "model.layers.0.mlp.experts.0.down_proj.weight");
  EXPECT_EQ(shapes[10].shape, (std::vector<int64_t>{2048, 768}));
  EXPECT_EQ(shapes[7 + 3 * 128].name, "model.layers.0.mlp.experts.127.down_proj.weight");
  EXPECT_EQ(shapes[8 + 3 * 128].name, "model.layers.0.input_layernorm.weight");
  EXPECT_EQ(shapes[8].group, 1);
}

TEST(HfParamShapesTest, Mixtral8x7BUsesBlockSparseMoeNames) {
  const ModelSpec m = Spec(R"({"model_type": "mixtral", "hidden_size": 4096,
      "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
      "intermediate_size": 14336, "num_local_experts": 8, "num_experts_per_tok": 2,
      "vocab_size": 32000})");
  const std::vector<ParamShape> shapes = HfParamShapes(m);
  EXPECT_EQ(Count(shapes), 46702792704);
  std::set<std::string> names;
  for (const ParamShape& p : shapes) names.insert(p.name);
  EXPECT_EQ(names.size(), shapes.size());
  EXPECT_EQ(shapes[5].name, "model.layers.0.block_sparse_moe.gate.weight");
  EXPECT_EQ(shapes[6].name, "model.layers.0.block_sparse_moe.experts.0.w1.weight");
  EXPECT_EQ(shapes[7].name, "model.layers.0.block_sparse_moe.experts.0.w3.weight");
  EXPECT_EQ(shapes[8].name, "model.layers.0.block_sparse_moe.experts.0.w2.weight");
  EXPECT_EQ(shapes[8].shape, (std::vector<int64_t>{4096, 14336}));
  EXPECT_EQ(names.count("model.layers.31.block_sparse_moe.experts.7.w2.weight"), 1u);
  EXPECT_EQ(names.count("model.layers.0.mlp.gate_proj.weight"), 0u);
}

TEST(HfParamShapesTest, Qwen3MoeDenseLayersKeepTheMlp) {
  const ModelSpec m = Spec(R"({"model_type": "qwen3_moe", "hidden_size": 64,
      "num_hidden_layers": 3, "num_attention_heads": 4, "head_dim": 16, "intermediate_size": 96,
      "moe_intermediate_size": 32, "num_experts": 4, "num_experts_per_tok": 2,
      "mlp_only_layers": [1], "vocab_size": 128})");
  std::set<std::string> names;
  for (const ParamShape& p : HfParamShapes(m)) names.insert(p.name);
  EXPECT_EQ(names.count("model.layers.1.mlp.gate_proj.weight"), 1u);
  EXPECT_EQ(names.count("model.layers.1.mlp.gate.weight"), 0u);
  EXPECT_EQ(names.count("model.layers.0.mlp.gate_proj.weight"), 0u);
  EXPECT_EQ(names.count("model.layers.2.mlp.experts.3.up_proj.weight"), 1u);
}

TEST(HfParamShapesTest, Qwen25_05BTiedWithBiases) {
  const ModelSpec m = Spec(R"({"model_type": "qwen2", "hidden_size": 896, "num_hidden_layers": 24,
      "num_attention_heads": 14, "num_key_value_heads": 2, "intermediate_size": 4864,
      "vocab_size": 151936, "tie_word_embeddings": true})");
  const std::vector<ParamShape> shapes = HfParamShapes(m);
  EXPECT_EQ(Count(shapes), 494032768);
  std::set<std::string> names;
  for (const ParamShape& p : shapes) names.insert(p.name);
  EXPECT_EQ(names.size(), shapes.size());
  EXPECT_EQ(names.count("lm_head.weight"), 0u);
  EXPECT_EQ(names.count("model.layers.23.self_attn.k_proj.bias"), 1u);
}

TEST(HfParamShapesTest, Qwen3_06BHasQkNormAndWideHeads) {
  const ModelSpec m = Spec(R"({"model_type": "qwen3", "hidden_size": 1024, "num_hidden_layers": 28,
      "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
      "intermediate_size": 3072, "vocab_size": 151936, "tie_word_embeddings": true})");
  const std::vector<ParamShape> shapes = HfParamShapes(m);
  // 0.44B non-embedding parameters (Qwen3 model card) + the tied embedding.
  EXPECT_EQ(Count(shapes) - 151936 * 1024, 440467456);
  bool found = false;
  for (const ParamShape& p : shapes) {
    if (p.name == "model.layers.0.self_attn.q_proj.weight") {
      EXPECT_EQ(p.shape, (std::vector<int64_t>{2048, 1024}));
    }
    if (p.name == "model.layers.0.self_attn.q_norm.weight") {
      found = true;
      EXPECT_EQ(p.shape, (std::vector<int64_t>{128}));
    }
  }
  EXPECT_TRUE(found);
}

}  // namespace
}  // namespace memplan
