#include "agent/io/safetensors_index.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace memplan::io {
namespace {

using ::testing::HasSubstr;

TEST(SafetensorsIndexTest, ParsesWeightMapAndShards) {
  absl::StatusOr<SafetensorsIndex> index = ParseSafetensorsIndex(R"({
    "metadata": {"total_size": 16060522496},
    "weight_map": {
      "lm_head.weight": "model-00004-of-00004.safetensors",
      "model.embed_tokens.weight": "model-00001-of-00004.safetensors",
      "model.layers.0.input_layernorm.weight": "model-00001-of-00004.safetensors"}})");
  ASSERT_TRUE(index.ok()) << index.status();
  EXPECT_EQ(index->weight_map.size(), 3u);
  EXPECT_EQ(index->weight_map.at("lm_head.weight"), "model-00004-of-00004.safetensors");
  EXPECT_EQ(index->shards, (std::vector<std::string>{"model-00001-of-00004.safetensors",
                                                     "model-00004-of-00004.safetensors"}));
  ASSERT_TRUE(index->total_size_bytes.has_value());
  EXPECT_EQ(*index->total_size_bytes, 16060522496);
}

TEST(SafetensorsIndexTest, TotalSizeOptionalAndFloatTolerated) {
  absl::StatusOr<SafetensorsIndex> a =
      ParseSafetensorsIndex(R"({"weight_map": {"w": "a.safetensors"}})");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_FALSE(a->total_size_bytes.has_value());
  absl::StatusOr<SafetensorsIndex> b = ParseSafetensorsIndex(
      R"({"metadata": {"total_size": 1024.0}, "weight_map": {"w": "a.safetensors"}})");
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(*b->total_size_bytes, 1024);
}

TEST(SafetensorsIndexTest, Errors) {
  auto error = [](const char* json) {
    return std::string(ParseSafetensorsIndex(json).status().message());
  };
  EXPECT_THAT(error("{"), HasSubstr("malformed JSON"));
  EXPECT_THAT(error("[]"), HasSubstr("JSON object"));
  EXPECT_THAT(error("{}"), HasSubstr("\"weight_map\" is required"));
  EXPECT_THAT(error(R"({"weight_map": {}})"), HasSubstr("non-empty"));
  EXPECT_THAT(error(R"({"weight_map": {"w": "../x.safetensors"}})"), HasSubstr("\"w\""));
  EXPECT_THAT(error(R"({"weight_map": {"w": "/etc/x.safetensors"}})"), HasSubstr("plain"));
  EXPECT_THAT(error(R"({"weight_map": {"w": "x.bin"}})"), HasSubstr("plain"));
  EXPECT_THAT(error(R"({"weight_map": {"w": 3}})"), HasSubstr("plain"));
  EXPECT_THAT(error(R"({"weight_map": {"": "a.safetensors"}})"), HasSubstr("empty tensor name"));
  EXPECT_THAT(error(R"({"metadata": {"total_size": -1}, "weight_map": {"w": "a.safetensors"}})"),
              HasSubstr("total_size"));
}

}  // namespace
}  // namespace memplan::io
