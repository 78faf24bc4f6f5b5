#include "agent/io/hf_checkpoint.h"

#include <algorithm>
#include <fstream>
#include <string>

#include "agent/io/file_system.h"
#include "common/param_shapes.h"
#include "agent/io/safetensors_torch.h"
#include "common/hf_config.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace memplan::io {
namespace {

using ::testing::HasSubstr;

constexpr char kTinyQwen2Config[] = R"({"architectures": ["Qwen2ForCausalLM"],
  "model_type": "qwen2", "hidden_size": 16, "num_hidden_layers": 2, "num_attention_heads": 4,
  "num_key_value_heads": 2, "intermediate_size": 32, "vocab_size": 50,
  "tie_word_embeddings": true, "torch_dtype": "bfloat16"})";

std::string NewDir(const std::string& name) {
  // Torch-linked binary: std::filesystem is unusable here (see agent/io/file_system.h).
  const std::string dir = JoinPath(JoinPath(::testing::TempDir(), "hf_checkpoint_test"), name);
  EXPECT_TRUE(RemoveAll(dir).ok());
  EXPECT_TRUE(CreateDirectories(dir).ok());
  return dir;
}

// What a Hugging Face export of the tiny model looks like: bf16 tensors by HF name.
std::vector<NamedParam> HfTensors(const ModelSpec& spec) {
  torch::manual_seed(1);
  std::vector<NamedParam> out;
  for (const ParamShape& p : HfParamShapes(spec)) {
    out.push_back({p.name, torch::randn(p.shape).to(torch::kBFloat16)});
  }
  return out;
}

// The model side: fp32 parameters in groups, the tied head listing the embedding again.
std::vector<NamedParam> ModelParams(const ModelSpec& spec) {
  std::vector<NamedParam> out;
  for (const ParamShape& p : HfParamShapes(spec)) {
    out.push_back({p.name, torch::zeros(p.shape).requires_grad_(true)});
  }
  out.push_back({"lm_head.weight", out.front().param});  // tied: same tensor object
  return out;
}

class HfCheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<ModelSpec> spec = ParseHfConfigJson(kTinyQwen2Config);
    ASSERT_TRUE(spec.ok()) << spec.status();
    spec_ = *spec;
    tensors_ = HfTensors(spec_);
  }

  void ExpectLoaded(const std::vector<NamedParam>& params) {
    std::map<std::string, torch::Tensor> want;
    for (const NamedParam& t : tensors_) want[t.name] = t.param.to(torch::kFloat);
    for (const NamedParam& p : params) {
      const std::string key = p.name == "lm_head.weight" ? "model.embed_tokens.weight" : p.name;
      EXPECT_TRUE(torch::equal(p.param.detach(), want.at(key))) << p.name;
      EXPECT_EQ(p.param.scalar_type(), torch::kFloat);
      EXPECT_TRUE(p.param.requires_grad());
    }
  }

  ModelSpec spec_;
  std::vector<NamedParam> tensors_;
};

TEST_F(HfCheckpointTest, LoadsSingleFileWithDTypeConversionAndTiedHead) {
  const std::string dir = NewDir("single");
  std::ofstream(JoinPath(dir, "config.json")) << kTinyQwen2Config;
  ASSERT_TRUE(
      SaveSafetensorsFile(JoinPath(dir, "model.safetensors"), tensors_, {{"format", "pt"}}).ok());
  absl::StatusOr<ModelSpec> spec = LoadHfConfigFile(dir);
  ASSERT_TRUE(spec.ok()) << spec.status();
  const std::vector<NamedParam> params = ModelParams(*spec);
  absl::StatusOr<HfLoadReport> report = LoadHfCheckpoint(dir, params);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(report->tensors_loaded, static_cast<int64_t>(tensors_.size()));
  EXPECT_TRUE(report->skipped.empty());
  ExpectLoaded(params);
}

TEST_F(HfCheckpointTest, LoadsShardedCheckpoint) {
  const std::string dir = NewDir("sharded");
  const size_t half = tensors_.size() / 2;
  std::vector<NamedParam> a(tensors_.begin(), tensors_.begin() + half);
  std::vector<NamedParam> b(tensors_.begin() + half, tensors_.end());
  ASSERT_TRUE(SaveSafetensorsFile(dir + "/model-00001-of-00002.safetensors", a).ok());
  ASSERT_TRUE(SaveSafetensorsFile(dir + "/model-00002-of-00002.safetensors", b).ok());
  std::string index = R"({"metadata": {"total_size": 1}, "weight_map": {)";
  for (size_t i = 0; i < tensors_.size(); ++i) {
    index += "\"" + tensors_[i].name + "\": \"model-0000" + (i < half ? "1" : "2") +
             "-of-00002.safetensors\"" + (i + 1 < tensors_.size() ? "," : "");
  }
  index += "}}";
  std::ofstream(JoinPath(dir, "model.safetensors.index.json")) << index;

  absl::StatusOr<std::unique_ptr<HfCheckpoint>> ckpt = HfCheckpoint::Open(dir);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_EQ((*ckpt)->TensorNames().size(), tensors_.size());
  absl::StatusOr<torch::Tensor> one = (*ckpt)->Read(tensors_.back().name);
  ASSERT_TRUE(one.ok());
  EXPECT_TRUE(torch::equal(*one, tensors_.back().param));
  EXPECT_EQ((*ckpt)->Read("nope").status().code(), absl::StatusCode::kNotFound);

  const std::vector<NamedParam> params = ModelParams(spec_);
  absl::StatusOr<HfLoadReport> report = (*ckpt)->LoadInto(params, {});
  ASSERT_TRUE(report.ok()) << report.status();
  ExpectLoaded(params);

  // [Sharded loading] Match names every parameter's source (the tied head's alias too) without
  // reading; ReadRange reads any part of a tensor from either shard, converted.
  absl::StatusOr<HfCheckpoint::Matched> matched = (*ckpt)->Match(ModelParams(spec_), {});
  ASSERT_TRUE(matched.ok()) << matched.status();
  EXPECT_EQ(matched->loads.size(), tensors_.size());
  EXPECT_EQ(matched->source_of.at("lm_head.weight"), "model.embed_tokens.weight");
  for (const NamedParam& t : tensors_) {
    const torch::Tensor flat = t.param.reshape({-1});
    const int64_t n = flat.numel();
    for (const auto& [begin, len] :
         std::vector<std::pair<int64_t, int64_t>>{{0, n}, {n / 3, n / 2}, {n - 1, 1}}) {
      absl::StatusOr<torch::Tensor> part =
          (*ckpt)->ReadRange(t.name, begin, len, torch::kFloat32);
      ASSERT_TRUE(part.ok()) << t.name << ": " << part.status();
      EXPECT_EQ(part->scalar_type(), torch::kFloat32);
      EXPECT_TRUE(torch::equal(*part, flat.narrow(0, begin, len).to(torch::kFloat32))) << t.name;
    }
    EXPECT_EQ((*ckpt)->ReadRange(t.name, n - 1, 2, torch::kFloat32).status().code(),
              absl::StatusCode::kOutOfRange);
  }
  EXPECT_EQ((*ckpt)->ReadRange("nope", 0, 1, torch::kFloat32).status().code(),
            absl::StatusCode::kNotFound);
}

TEST_F(HfCheckpointTest, ShardIndexDisagreementsAreErrors) {
  const std::string dir = NewDir("bad_index");
  ASSERT_TRUE(SaveSafetensorsFile(dir + "/a.safetensors", {tensors_[0], tensors_[1]}).ok());
  auto open_with = [&dir](const std::string& index) {
    std::ofstream(JoinPath(dir, "model.safetensors.index.json"), std::ios::trunc) << index;
    return HfCheckpoint::Open(dir).status();
  };
  const std::string n0 = tensors_[0].name, n1 = tensors_[1].name;
  // Index lists only one of the shard's tensors.
  EXPECT_THAT(
      std::string(open_with(R"({"weight_map": {")" + n0 + R"(": "a.safetensors"}})").message()),
      HasSubstr("which the index does not list"));
  // Index names a tensor the shard lacks.
  EXPECT_THAT(std::string(open_with(R"({"weight_map": {")" + n0 + R"(": "a.safetensors", ")" + n1 +
                                    R"(": "a.safetensors", "ghost": "a.safetensors"}})")
                              .message()),
              HasSubstr("\"ghost\""));
  // Index names a shard that does not exist.
  EXPECT_EQ(open_with(R"({"weight_map": {"x": "b.safetensors"}})").code(),
            absl::StatusCode::kNotFound);
  // Path traversal in a shard name.
  EXPECT_EQ(open_with(R"({"weight_map": {"x": "../a.safetensors"}})").code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(HfCheckpointTest, MismatchesAreReportedTogetherAndNothingIsWritten) {
  const std::string dir = NewDir("mismatch");
  std::vector<NamedParam> broken;
  for (const NamedParam& t : tensors_) {
    if (t.name == "model.layers.1.mlp.up_proj.weight") continue;  // missing
    if (t.name == "model.norm.weight") {
      broken.push_back({t.name, torch::zeros({17}, torch::kBFloat16)});  // wrong shape
      continue;
    }
    broken.push_back(t);
  }
  broken.push_back({"model.layers.0.self_attn.rotary_emb.inv_freq", torch::zeros({2})});  // ignored
  broken.push_back({"score.weight", torch::zeros({2, 16})});  // unexpected
  ASSERT_TRUE(SaveSafetensorsFile(dir + "/model.safetensors", broken).ok());

  const std::vector<NamedParam> params = ModelParams(spec_);
  absl::StatusOr<HfLoadReport> report = LoadHfCheckpoint(dir, params);
  ASSERT_FALSE(report.ok());
  const std::string msg(report.status().message());
  EXPECT_THAT(msg, HasSubstr("1 missing: model.layers.1.mlp.up_proj.weight"));
  EXPECT_THAT(msg, HasSubstr("model.norm.weight: checkpoint [17] vs parameter [16]"));
  EXPECT_THAT(msg, HasSubstr("1 unexpected: score.weight"));
  EXPECT_THAT(msg, ::testing::Not(HasSubstr("inv_freq")));
  for (const NamedParam& p : params) {
    EXPECT_EQ(p.param.abs().sum().item<float>(), 0.0f) << p.name << " was written";
  }

  // With unexpected tensors allowed, the missing and mismatched ones still fail.
  EXPECT_FALSE(LoadHfCheckpoint(dir, params, {.allow_unexpected = true}).ok());
}

TEST_F(HfCheckpointTest, ParamListProblems) {
  const std::string dir = NewDir("params");
  ASSERT_TRUE(SaveSafetensorsFile(dir + "/model.safetensors", tensors_).ok());
  std::vector<NamedParam> params = ModelParams(spec_);
  params.push_back({"model.norm.weight", torch::zeros({16})});  // same name, another tensor
  EXPECT_THAT(std::string(LoadHfCheckpoint(dir, params).status().message()),
              HasSubstr("used by different tensors: model.norm.weight"));

  std::vector<NamedParam> ints = ModelParams(spec_);
  // A [16] vector: the first block's input norm (its place follows common/param_shapes.h).
  auto norm = std::find_if(ints.begin(), ints.end(), [](const NamedParam& p) {
    return p.name == "model.layers.0.input_layernorm.weight";
  });
  ASSERT_NE(norm, ints.end());
  norm->param = torch::zeros({16}, torch::kLong);
  EXPECT_THAT(std::string(LoadHfCheckpoint(dir, ints).status().message()),
              HasSubstr("cannot load into"));

  EXPECT_EQ(LoadHfCheckpoint(NewDir("empty"), params).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(LoadHfCheckpoint(dir + "/nonexistent", params).status().code(),
            absl::StatusCode::kNotFound);
}

TEST(FlattenParamGroupsTest, KeepsOrderAndAliases) {
  torch::Tensor e = torch::zeros({2});
  ParamGroups groups = {{{"a", e}}, {{"b", torch::zeros({1})}}, {{"c", e}}};
  std::vector<NamedParam> flat = FlattenParamGroups(groups);
  ASSERT_EQ(flat.size(), 3u);
  EXPECT_EQ(flat[2].name, "c");
  EXPECT_TRUE(flat[2].param.is_same(e));
}

}  // namespace
}  // namespace memplan::io
