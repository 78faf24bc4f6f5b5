#include "common/hf_config.h"

#include <filesystem>
#include <fstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

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
