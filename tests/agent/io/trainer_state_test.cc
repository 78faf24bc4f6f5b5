#include "agent/io/trainer_state.h"

#include <functional>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace memplan::io {
namespace {

using ::testing::HasSubstr;

CheckpointManifest Sample() {
  CheckpointManifest m;
  TrainerState& t = m.trainer;
  t.step = 120;
  t.data_position = 480;
  t.data_seed = 0xfedcba9876543210ULL;  // above INT64_MAX: must survive as unsigned
  t.rng_seed = 7;
  t.max_grad_norm = 1.0;
  t.optimizer = {
      .kind = "adamw", .lr = 3e-4, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};
  t.model.name = "tiny";
  t.model.family = "qwen2";
  t.model.hidden_size = 64;
  t.model.num_layers = 2;
  t.model.num_heads = 4;
  t.model.num_kv_heads = 2;
  t.model.intermediate_size = 128;
  t.model.vocab_size = 256;
  t.model.qkv_bias = true;
  t.model.tie_word_embeddings = true;
  t.model.rope_theta = 1e6;
  t.model.rms_norm_eps = 1e-6;
  t.param_dtype = DType::kBFloat16;
  t.workload = {.micro_batch = 2, .seq_len = 128, .world_size = 1, .grad_accum = 4};
  t.plan_id = "plan-abc";
  m.file_size_bytes = {{"params.safetensors", 1234}, {"optimizer.safetensors", 5678}};
  return m;
}

TEST(TrainerStateTest, RoundTripsExactly) {
  const CheckpointManifest m = Sample();
  absl::StatusOr<CheckpointManifest> back = DecodeCheckpointManifest(EncodeCheckpointManifest(m));
  ASSERT_TRUE(back.ok()) << back.status();
  const TrainerState& a = m.trainer;
  const TrainerState& b = back->trainer;
  EXPECT_EQ(b.step, a.step);
  EXPECT_EQ(b.data_position, a.data_position);
  EXPECT_EQ(b.data_seed, a.data_seed);
  EXPECT_EQ(b.rng_seed, a.rng_seed);
  EXPECT_EQ(b.max_grad_norm, a.max_grad_norm);
  EXPECT_EQ(b.optimizer.kind, a.optimizer.kind);
  EXPECT_EQ(b.optimizer.lr, a.optimizer.lr);  // exact: doubles are printed round-trippably
  EXPECT_EQ(b.optimizer.beta2, a.optimizer.beta2);
  EXPECT_EQ(b.optimizer.weight_decay, a.optimizer.weight_decay);
  EXPECT_EQ(b.model.family, "qwen2");
  EXPECT_EQ(b.model.num_kv_heads, 2);
  EXPECT_TRUE(b.model.qkv_bias);
  EXPECT_TRUE(b.model.tie_word_embeddings);
  EXPECT_EQ(b.model.rope_theta, 1e6);
  EXPECT_EQ(b.param_dtype, DType::kBFloat16);
  EXPECT_EQ(b.workload.grad_accum, 4);
  EXPECT_EQ(b.workload.seq_len, 128);
  EXPECT_EQ(b.plan_id, "plan-abc");
  EXPECT_EQ(back->file_size_bytes, m.file_size_bytes);
}

// Applies `edit` to the encoded JSON and expects an error naming `key`.
void ExpectError(const std::function<void(nlohmann::json&)>& edit, const std::string& key) {
  nlohmann::json j = nlohmann::json::parse(EncodeCheckpointManifest(Sample()));
  edit(j);
  absl::StatusOr<CheckpointManifest> m = DecodeCheckpointManifest(j.dump());
  ASSERT_FALSE(m.ok()) << "accepted after editing " << key;
  EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(m.status().message()), HasSubstr(key));
}

// Which layers slide survives; a state written before the list existed slid every layer (its
// config.json said so).
TEST(TrainerStateTest, SlidingLayersRoundTripAndDefaultToEveryLayer) {
  CheckpointManifest m = Sample();
  m.trainer.model.sliding_window = 32;
  m.trainer.model.sliding_layers = {1};
  absl::StatusOr<CheckpointManifest> back = DecodeCheckpointManifest(EncodeCheckpointManifest(m));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->trainer.model.sliding_window, 32);
  EXPECT_EQ(back->trainer.model.sliding_layers, (std::vector<int64_t>{1}));

  nlohmann::json j = nlohmann::json::parse(EncodeCheckpointManifest(m));
  j["model"].erase("sliding_layers");
  absl::StatusOr<CheckpointManifest> old = DecodeCheckpointManifest(j.dump());
  ASSERT_TRUE(old.ok()) << old.status();
  EXPECT_EQ(old->trainer.model.sliding_layers, (std::vector<int64_t>{0, 1}));

  ExpectError([](nlohmann::json& j) { j["model"]["sliding_layers"] = "all"; },
              "\"model.sliding_layers\"");
  ExpectError([](nlohmann::json& j) { j["model"]["sliding_layers"] = {5}; }, "sliding_layers");
}

TEST(TrainerStateTest, GemmaFieldsRoundTrip) {
  CheckpointManifest m = Sample();
  ModelSpec& g = m.trainer.model;
  g.family = "gemma2";
  g.qkv_bias = false;
  g.head_dim = 24;
  g.query_pre_attn_scalar = 20;
  g.attn_logit_softcapping = 50;
  g.final_logit_softcapping = 30;
  g.embedding_padding_idx = 0;
  g.sliding_window = 16;
  g.sliding_layers = {0};
  absl::StatusOr<CheckpointManifest> back = DecodeCheckpointManifest(EncodeCheckpointManifest(m));
  ASSERT_TRUE(back.ok()) << back.status();
  const ModelSpec& b = back->trainer.model;
  EXPECT_EQ(b.family, "gemma2");
  EXPECT_EQ(b.query_pre_attn_scalar, 20);
  EXPECT_EQ(b.attn_logit_softcapping, 50);
  EXPECT_EQ(b.final_logit_softcapping, 30);
  EXPECT_EQ(b.embedding_padding_idx, 0);
  EXPECT_EQ(b.sliding_layers, (std::vector<int64_t>{0}));
  // Other families' states carry none of these keys.
  EXPECT_EQ(EncodeCheckpointManifest(Sample()).find("softcapping"), std::string::npos);

  // Gemma 3 adds its q/k norms and the sliding layers' RoPE base.
  g.family = "gemma3_text";
  g.qk_norm = true;
  g.rope_local_base_freq = 1e4;
  back = DecodeCheckpointManifest(EncodeCheckpointManifest(m));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->trainer.model.family, "gemma3_text");
  EXPECT_TRUE(back->trainer.model.qk_norm);
  EXPECT_EQ(back->trainer.model.rope_local_base_freq, 1e4);
}

TEST(TrainerStateTest, ErrorsNameTheKey) {
  ExpectError([](nlohmann::json& j) { j["format"] = "other"; }, "\"format\"");
  ExpectError([](nlohmann::json& j) { j["version"] = 2; }, "\"version\"");
  ExpectError([](nlohmann::json& j) { j.erase("step"); }, "\"step\" is required");
  ExpectError([](nlohmann::json& j) { j["step"] = -1; }, "\"step\"");
  ExpectError([](nlohmann::json& j) { j["step"] = 1.5; }, "\"step\" must be an integer");
  ExpectError([](nlohmann::json& j) { j["data_seed"] = -3; }, "\"data_seed\"");
  ExpectError([](nlohmann::json& j) { j["optimizer"]["kind"] = "lion"; }, "\"optimizer.kind\"");
  ExpectError([](nlohmann::json& j) { j["optimizer"]["beta2"] = 1.5; }, "\"optimizer.beta2\"");
  ExpectError([](nlohmann::json& j) { j["optimizer"].erase("lr"); }, "\"optimizer.lr\"");
  ExpectError([](nlohmann::json& j) { j["param_dtype"] = "int8"; }, "\"param_dtype\"");
  ExpectError([](nlohmann::json& j) { j["model"]["num_kv_heads"] = 3; }, "num_kv_heads");
  ExpectError([](nlohmann::json& j) { j["model"]["family"] = "gpt2"; }, "family");
  ExpectError([](nlohmann::json& j) { j["model"]["qkv_bias"] = "yes"; }, "\"model.qkv_bias\"");
  ExpectError([](nlohmann::json& j) { j["workload"]["seq_len"] = 0; }, "\"workload.seq_len\"");
  ExpectError(
      [](nlohmann::json& j) {
        j["files"]["../x"] = {{"size_bytes", 1}};
      },
      "\"files.../x\"");
  ExpectError(
      [](nlohmann::json& j) {
        j["files"]["params.safetensors"] = {{"size_bytes", -1}};
      },
      "\"files.params.safetensors.size_bytes\"");
  ExpectError([](nlohmann::json& j) { j = nlohmann::json::array(); }, "JSON object");
  EXPECT_THAT(std::string(DecodeCheckpointManifest("{").status().message()),
              HasSubstr("malformed JSON"));
}

TEST(TrainerStateTest, MixtureOfExpertsFieldsRoundTrip) {
  CheckpointManifest m = Sample();
  ModelSpec& s = m.trainer.model;
  s.family = "qwen3_moe";
  s.qkv_bias = false;
  s.qk_norm = true;
  s.num_experts = 8;
  s.num_experts_per_tok = 2;
  s.moe_intermediate_size = 32;
  s.norm_topk_prob = true;
  s.decoder_sparse_step = 2;
  s.mlp_only_layers = {0};
  s.output_router_logits = true;
  s.router_aux_loss_coef = 0.02;
  absl::StatusOr<CheckpointManifest> back = DecodeCheckpointManifest(EncodeCheckpointManifest(m));
  ASSERT_TRUE(back.ok()) << back.status();
  const ModelSpec& b = back->trainer.model;
  EXPECT_EQ(b.family, "qwen3_moe");
  EXPECT_EQ(b.num_experts, 8);
  EXPECT_EQ(b.num_experts_per_tok, 2);
  EXPECT_EQ(b.moe_intermediate_size, 32);
  EXPECT_TRUE(b.norm_topk_prob);
  EXPECT_EQ(b.decoder_sparse_step, 2);
  EXPECT_EQ(b.mlp_only_layers, (std::vector<int64_t>{0}));
  EXPECT_TRUE(b.output_router_logits);
  EXPECT_DOUBLE_EQ(b.router_aux_loss_coef, 0.02);

  // A dense model's state carries no expert keys.
  nlohmann::json dense = nlohmann::json::parse(EncodeCheckpointManifest(Sample()));
  std::function<bool(const nlohmann::json&)> has_experts = [&](const nlohmann::json& j) {
    if (j.is_object()) {
      for (const auto& [k, v] : j.items()) {
        if (k == "num_experts" || has_experts(v)) return true;
      }
    }
    return false;
  };
  EXPECT_FALSE(has_experts(dense));
}

// A vision-language run resumes with its tower and M-RoPE sections (head_dim 16: 8 frequencies).
TEST(TrainerStateTest, VisionLanguageFieldsRoundTrip) {
  CheckpointManifest m = Sample();
  ModelSpec& s = m.trainer.model;
  s.family = "qwen2_5_vl";
  s.mrope_section = {4, 2, 2};
  s.image_token_id = 200;
  s.video_token_id = 201;
  s.vision_start_token_id = 202;
  s.vision_end_token_id = 203;
  s.vision.depth = 3;
  s.vision.hidden_size = 32;
  s.vision.intermediate_size = 48;
  s.vision.num_heads = 2;
  s.vision.patch_size = 2;
  s.vision.window_size = 8;
  s.vision.out_hidden_size = 64;
  s.vision.fullatt_block_indexes = {1};
  s.vision.rope_theta = 500.0;
  absl::StatusOr<CheckpointManifest> back = DecodeCheckpointManifest(EncodeCheckpointManifest(m));
  ASSERT_TRUE(back.ok()) << back.status();
  const ModelSpec& b = back->trainer.model;
  EXPECT_EQ(b.family, "qwen2_5_vl");
  EXPECT_EQ(b.mrope_section, (std::vector<int64_t>{4, 2, 2}));
  EXPECT_EQ(b.vision.depth, 3);
  EXPECT_EQ(b.vision.hidden_size, 32);
  EXPECT_EQ(b.vision.intermediate_size, 48);
  EXPECT_EQ(b.vision.num_heads, 2);
  EXPECT_EQ(b.vision.patch_size, 2);
  EXPECT_EQ(b.vision.spatial_merge_size, 2);
  EXPECT_EQ(b.vision.temporal_patch_size, 2);
  EXPECT_EQ(b.vision.window_size, 8);
  EXPECT_EQ(b.vision.out_hidden_size, 64);
  EXPECT_EQ(b.vision.fullatt_block_indexes, (std::vector<int64_t>{1}));
  EXPECT_DOUBLE_EQ(b.vision.rope_theta, 500.0);
  EXPECT_EQ(b.image_token_id, 200);
  EXPECT_EQ(b.vision_end_token_id, 203);
  // A text model's state carries no vision keys.
  EXPECT_EQ(EncodeCheckpointManifest(Sample()).find("vision"), std::string::npos);

  // Qwen2-VL's tower has no windows: window_size 0 and no full-attention list round-trip.
  s.family = "qwen2_vl";
  s.vision.window_size = 0;
  s.vision.fullatt_block_indexes.clear();
  s.vision.intermediate_size = 64;  // embed_dim · an integer mlp_ratio
  back = DecodeCheckpointManifest(EncodeCheckpointManifest(m));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->trainer.model.family, "qwen2_vl");
  EXPECT_EQ(back->trainer.model.vision.window_size, 0);
  EXPECT_TRUE(back->trainer.model.vision.fullatt_block_indexes.empty());
}

}  // namespace
}  // namespace memplan::io
