#include "agent/io/safetensors_writer.h"

#include <filesystem>
#include <string>
#include <vector>

#include "agent/io/safetensors_reader.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace memplan::io {
namespace {

using ::testing::HasSubstr;

TEST(SafetensorsWriterTest, HeaderListsTensorsInOrderAndIsPadded) {
  std::vector<float> x(3, 1.0f);
  absl::StatusOr<std::string> header = BuildSafetensorsHeader(
      {{"z", SafetensorsDType::kF32, {3}, x.data()}, {"a", SafetensorsDType::kF32, {1}, x.data()}},
      {{"k", "v"}});
  ASSERT_TRUE(header.ok()) << header.status();
  EXPECT_EQ(header->size() % 8, 0u);
  EXPECT_EQ(header->find("__metadata__"), 2u);  // first key
  EXPECT_LT(header->find("\"z\""), header->find("\"a\""));
  EXPECT_THAT(*header, HasSubstr(R"("data_offsets":[0,12])"));
  EXPECT_THAT(*header, HasSubstr(R"("data_offsets":[12,16])"));
}

TEST(SafetensorsWriterTest, RejectsInvalidLayouts) {
  float x = 0;
  auto error = [](const std::vector<SafetensorsTensorView>& v) {
    return std::string(BuildSafetensorsHeader(v, {}).status().message());
  };
  EXPECT_THAT(error({{"", SafetensorsDType::kF32, {1}, &x}}), HasSubstr("invalid tensor name"));
  EXPECT_THAT(error({{"__metadata__", SafetensorsDType::kF32, {1}, &x}}),
              HasSubstr("invalid tensor name"));
  EXPECT_THAT(
      error({{"a", SafetensorsDType::kF32, {1}, &x}, {"a", SafetensorsDType::kF32, {1}, &x}}),
      HasSubstr("duplicate"));
  EXPECT_THAT(error({{"a", SafetensorsDType::kF32, {-1}, &x}}), HasSubstr("negative"));
  EXPECT_THAT(error({{"a", SafetensorsDType::kF64, {int64_t{1} << 40, int64_t{1} << 30}, &x}}),
              HasSubstr("overflow"));
  EXPECT_THAT(std::string(SerializeSafetensors({{"a", SafetensorsDType::kF32, {1}, nullptr}}, {})
                              .status()
                              .message()),
              HasSubstr("null data"));
  EXPECT_FALSE(BuildSafetensorsHeader({{"bad\xff", SafetensorsDType::kF32, {1}, &x}}, {}).ok());
}

TEST(SafetensorsWriterTest, StreamingWriterChecksSizesAndCount) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::path(::testing::TempDir()) / "safetensors_writer_test";
  fs::create_directories(dir);
  const std::string path = (dir / "s.safetensors").string();
  std::vector<int32_t> a = {1, 2, 3, 4};
  std::vector<double> b = {0.5, 0.25};
  absl::StatusOr<std::unique_ptr<SafetensorsFileWriter>> w = SafetensorsFileWriter::Create(
      path,
      {{"a", SafetensorsDType::kI32, {2, 2}, nullptr}, {"b", SafetensorsDType::kF64, {2}, nullptr}},
      {});
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_THAT(std::string((*w)->AppendTensor(a.data(), 12).message()), HasSubstr("needs 16"));
  ASSERT_TRUE((*w)->AppendTensor(a.data(), 16).ok());
  EXPECT_THAT(std::string((*w)->Finish().message()), HasSubstr("1 of 2 tensors"));
  ASSERT_TRUE((*w)->AppendTensor(b.data(), 16).ok());
  EXPECT_EQ((*w)->AppendTensor(b.data(), 16).code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE((*w)->Finish().ok());

  absl::StatusOr<std::unique_ptr<SafetensorsReader>> r = SafetensorsReader::Open(path);
  ASSERT_TRUE(r.ok()) << r.status();
  std::vector<double> b2(2);
  ASSERT_TRUE((*r)->ReadTensorBytes("b", b2.data(), 16).ok());
  EXPECT_EQ(b2, b);
  EXPECT_EQ(static_cast<int64_t>(fs::file_size(path)), (*r)->header().data_offset_bytes + 32);
}

TEST(SafetensorsWriterTest, WriteFileRoundTripsAllDTypes) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::path(::testing::TempDir()) / "safetensors_writer_all";
  fs::create_directories(dir);
  std::vector<SafetensorsTensorView> views;
  std::vector<std::vector<unsigned char>> data;
  for (const char* name : {"BOOL", "U8", "I8", "F8_E5M2", "F8_E4M3", "I16", "U16", "F16", "BF16",
                           "I32", "U32", "F32", "I64", "U64", "F64"}) {
    const SafetensorsDType d = *ParseSafetensorsDType(name);
    data.emplace_back(static_cast<size_t>(3 * SafetensorsDTypeBytes(d)));
    for (size_t i = 0; i < data.back().size(); ++i)
      data.back()[i] = static_cast<unsigned char>(i * 7);
  }
  int i = 0;
  for (const char* name : {"BOOL", "U8", "I8", "F8_E5M2", "F8_E4M3", "I16", "U16", "F16", "BF16",
                           "I32", "U32", "F32", "I64", "U64", "F64"}) {
    views.push_back({name, *ParseSafetensorsDType(name), {3}, data[i++].data()});
  }
  const std::string path = (dir / "all.safetensors").string();
  ASSERT_TRUE(WriteSafetensorsFile(path, views, {}).ok());
  absl::StatusOr<std::unique_ptr<SafetensorsReader>> r = SafetensorsReader::Open(path);
  ASSERT_TRUE(r.ok()) << r.status();
  for (size_t k = 0; k < views.size(); ++k) {
    const SafetensorsTensorInfo* info = (*r)->header().Find(views[k].name);
    ASSERT_NE(info, nullptr);
    EXPECT_EQ(info->dtype, views[k].dtype);
    std::vector<unsigned char> back(data[k].size());
    ASSERT_TRUE((*r)->ReadTensorBytes(*info, back.data(), back.size()).ok());
    EXPECT_EQ(back, data[k]) << views[k].name;
  }
}

}  // namespace
}  // namespace memplan::io
