#include "agent/io/safetensors_format.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace memplan::io {
namespace {

using ::testing::HasSubstr;

std::string Message(const absl::Status& s) { return std::string(s.message()); }

TEST(SafetensorsDTypeTest, NamesAndSizesRoundTrip) {
  for (const char* name : {"BOOL", "U8", "I8", "F8_E5M2", "F8_E4M3", "I16", "U16", "F16", "BF16",
                           "I32", "U32", "F32", "I64", "U64", "F64"}) {
    std::optional<SafetensorsDType> d = ParseSafetensorsDType(name);
    ASSERT_TRUE(d.has_value()) << name;
    EXPECT_EQ(SafetensorsDTypeName(*d), name);
  }
  EXPECT_EQ(SafetensorsDTypeBytes(SafetensorsDType::kBF16), 2);
  EXPECT_EQ(SafetensorsDTypeBytes(SafetensorsDType::kF64), 8);
  EXPECT_EQ(SafetensorsDTypeBytes(SafetensorsDType::kBool), 1);
  EXPECT_FALSE(ParseSafetensorsDType("F4").has_value());
  EXPECT_FALSE(ParseSafetensorsDType("f32").has_value());
}

TEST(SafetensorsHeaderTest, ParsesTensorsInDataOrderWithMetadata) {
  const std::string json = R"({"__metadata__": {"format": "pt"},
    "b": {"dtype": "F32", "shape": [2, 3], "data_offsets": [4, 28]},
    "a": {"dtype": "BF16", "shape": [2], "data_offsets": [0, 4]},
    "empty": {"dtype": "F32", "shape": [0, 5], "data_offsets": [28, 28]}})";
  absl::StatusOr<SafetensorsHeader> h = ParseSafetensorsHeader(json, 28);
  ASSERT_TRUE(h.ok()) << h.status();
  ASSERT_EQ(h->tensors.size(), 3u);
  EXPECT_EQ(h->tensors[0].name, "a");
  EXPECT_EQ(h->tensors[1].name, "b");
  EXPECT_EQ(h->tensors[2].name, "empty");
  EXPECT_EQ(h->tensors[1].numel(), 6);
  EXPECT_EQ(h->tensors[1].size_bytes(), 24);
  EXPECT_EQ(h->tensors[2].numel(), 0);
  EXPECT_EQ(h->metadata.at("format"), "pt");
  EXPECT_EQ(h->data_offset_bytes, 8 + static_cast<int64_t>(json.size()));
  ASSERT_NE(h->Find("b"), nullptr);
  EXPECT_EQ(h->Find("b")->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(h->Find("zzz"), nullptr);
}

TEST(SafetensorsHeaderTest, ScalarAndEmptyFile) {
  absl::StatusOr<SafetensorsHeader> scalar =
      ParseSafetensorsHeader(R"({"s": {"dtype": "I64", "shape": [], "data_offsets": [0, 8]}})", 8);
  ASSERT_TRUE(scalar.ok()) << scalar.status();
  EXPECT_EQ(scalar->tensors[0].numel(), 1);
  absl::StatusOr<SafetensorsHeader> none = ParseSafetensorsHeader("{}  ", 0);
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_TRUE(none->tensors.empty());
}

struct BadHeader {
  std::string json;
  int64_t data_bytes;
  std::string expected;  // substring of the error
};

class SafetensorsBadHeaderTest : public ::testing::TestWithParam<BadHeader> {};

TEST_P(SafetensorsBadHeaderTest, RejectedWithNamedField) {
  absl::StatusOr<SafetensorsHeader> h =
      ParseSafetensorsHeader(GetParam().json, GetParam().data_bytes);
  ASSERT_FALSE(h.ok());
  EXPECT_EQ(h.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(h.status()), HasSubstr(GetParam().expected)) << h.status();
}

INSTANTIATE_TEST_SUITE_P(
    Cases, SafetensorsBadHeaderTest,
    ::testing::Values(
        BadHeader{"", 0, "must start with '{'"}, BadHeader{" {}", 0, "must start with '{'"},
        BadHeader{"{", 0, "malformed JSON"}, BadHeader{R"({"a": 1} x)", 0, "malformed JSON"},
        BadHeader{"{\"a\xff\": {}}", 0, "malformed JSON"},  // invalid UTF-8
        BadHeader{R"({"t": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
                    "t": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})",
                  8, "duplicate key \"t\""},
        BadHeader{R"({"t": {"dtype": "F32", "shape": [[[1]]], "data_offsets": [0, 4]}})", 4,
                  "nesting"},
        BadHeader{R"({"t": 5})", 0, "tensor \"t\" field \"(entry)\""},
        BadHeader{R"({"": {"dtype": "F32", "shape": [], "data_offsets": [0, 4]}})", 4,
                  "empty tensor name"},
        BadHeader{R"({"t": {"shape": [1], "data_offsets": [0, 4]}})", 4,
                  "tensor \"t\" field \"dtype\": missing"},
        BadHeader{R"({"t": {"dtype": "F33", "shape": [1], "data_offsets": [0, 4]}})", 4,
                  "tensor \"t\" field \"dtype\": unknown dtype \"F33\""},
        BadHeader{R"({"t": {"dtype": 4, "shape": [1], "data_offsets": [0, 4]}})", 4,
                  "field \"dtype\": must be a string"},
        BadHeader{R"({"t": {"dtype": "F32", "data_offsets": [0, 4]}})", 4,
                  "field \"shape\": missing"},
        BadHeader{R"({"t": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}})", 4,
                  "field \"shape\": dimension 0 = -1"},
        BadHeader{R"({"t": {"dtype": "F32", "shape": [1.5], "data_offsets": [0, 4]}})", 4,
                  "field \"shape\": dimension 0"},
        BadHeader{
            R"({"t": {"dtype": "F32", "shape": [18446744073709551615], "data_offsets": [0, 4]}})",
            4, "field \"shape\": dimension 0"},
        BadHeader{
            R"({"t": {"dtype": "F32", "shape": [4294967296, 4294967296], "data_offsets": [0, 4]}})",
            4, "overflows"},
        BadHeader{
            R"({"t": {"dtype": "F64", "shape": [2305843009213693952], "data_offsets": [0, 4]}})", 4,
            "overflows"},
        BadHeader{
            R"({"t": {"dtype": "F32", "shape": [1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1], "data_offsets": [0, 4]}})",
            4, "rank 33"},
        BadHeader{R"({"t": {"dtype": "F32", "shape": [1]}})", 4, "field \"data_offsets\": missing"},
        BadHeader{R"({"t": {"dtype": "F32", "shape": [1], "data_offsets": [0]}})", 4,
                  "field \"data_offsets\": must be an array [begin, end]"},
        BadHeader{R"({"t": {"dtype": "F32", "shape": [1], "data_offsets": [-4, 0]}})", 4,
                  "field \"data_offsets\""},
        BadHeader{R"({"t": {"dtype": "F32", "shape": [1], "data_offsets": [4, 0]}})", 4,
                  "begin > end"},
        BadHeader{R"({"t": {"dtype": "F32", "shape": [1], "data_offsets": [0, 8]}})", 4,
                  "ends past the data section"},
        BadHeader{R"({"t": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}})", 4,
                  "span 4 bytes but F32 [2] needs 8"},
        BadHeader{R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                    "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})",
                  12,
                  "tensor \"b\" field \"data_offsets\": begins at 4 but \"a\" ends at 8 (overlap)"},
        BadHeader{R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
                    "b": {"dtype": "F32", "shape": [1], "data_offsets": [8, 12]}})",
                  12, "(gap)"},
        BadHeader{R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})", 8,
                  "the data section starts at 0"},
        BadHeader{R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})", 8,
                  "tensors cover 4 bytes but the data section has 8"},
        BadHeader{R"({"__metadata__": {"k": 1}})", 0,
                  "\"__metadata__\" entry \"k\" must be a string"},
        BadHeader{R"({"__metadata__": []})", 0, "\"__metadata__\" must be an object"},
        BadHeader{R"([])", 0, "must start with '{'"}));

TEST(SafetensorsHeaderLengthTest, BoundsChecked) {
  unsigned char prefix[8] = {};
  auto encode = [&prefix](uint64_t n) {
    for (int i = 0; i < 8; ++i) prefix[i] = static_cast<unsigned char>(n >> (8 * i));
  };
  encode(10);
  absl::StatusOr<int64_t> ok = DecodeSafetensorsHeaderLength(prefix, 18);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(*ok, 10);
  EXPECT_THAT(Message(DecodeSafetensorsHeaderLength(prefix, 17).status()), HasSubstr("truncated"));
  encode(kMaxSafetensorsHeaderBytes + 1);
  EXPECT_THAT(Message(DecodeSafetensorsHeaderLength(prefix, int64_t{1} << 40).status()),
              HasSubstr("exceeds the limit"));
  encode(~uint64_t{0});
  EXPECT_FALSE(DecodeSafetensorsHeaderLength(prefix, int64_t{1} << 40).ok());
  encode(1);
  EXPECT_THAT(Message(DecodeSafetensorsHeaderLength(prefix, 9).status()), HasSubstr("too small"));
}

}  // namespace
}  // namespace memplan::io
