#include "agent/io/safetensors_torch.h"

#include <string>

#include "agent/io/file_system.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace memplan::io {
namespace {

using ::testing::HasSubstr;

std::string TempPath(const std::string& name) {
  const std::string dir = JoinPath(::testing::TempDir(), "safetensors_torch_test");
  EXPECT_TRUE(CreateDirectories(dir).ok());
  return JoinPath(dir, name);
}

TEST(SafetensorsTorchTest, DTypeMappingIsABijection) {
  for (const char* name : {"BOOL", "U8", "I8", "F8_E5M2", "F8_E4M3", "I16", "U16", "F16", "BF16",
                           "I32", "U32", "F32", "I64", "U64", "F64"}) {
    const SafetensorsDType d = *ParseSafetensorsDType(name);
    const torch::ScalarType t = TorchDTypeOf(d);
    EXPECT_EQ(c10::elementSize(t), static_cast<size_t>(SafetensorsDTypeBytes(d))) << name;
    absl::StatusOr<SafetensorsDType> back = SafetensorsDTypeOf(t);
    ASSERT_TRUE(back.ok()) << name;
    EXPECT_EQ(*back, d);
  }
  EXPECT_FALSE(SafetensorsDTypeOf(torch::kComplexFloat).ok());
}

TEST(SafetensorsTorchTest, SaveAndReadBackExactly) {
  torch::manual_seed(0);
  const torch::Tensor f32 = torch::randn({3, 5});
  const torch::Tensor bf16 = torch::randn({4, 2}).to(torch::kBFloat16);
  const torch::Tensor transposed = torch::randn({6, 3}).t();  // non-contiguous view
  const torch::Tensor step = torch::tensor(int64_t{17});
  const torch::Tensor empty = torch::empty({0, 3});
  const torch::Tensor with_grad = torch::randn({2}).requires_grad_(true);
  const std::string path = TempPath("roundtrip.safetensors");
  ASSERT_TRUE(SaveSafetensorsFile(path,
                                  {{"f32", f32},
                                   {"bf16", bf16},
                                   {"transposed", transposed},
                                   {"step", step},
                                   {"empty", empty},
                                   {"with_grad", with_grad}},
                                  {{"format", "pt"}})
                  .ok());
  absl::StatusOr<std::vector<NamedParam>> back = ReadSafetensorsFile(path);
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_EQ(back->size(), 6u);
  std::map<std::string, torch::Tensor> by_name;
  for (const NamedParam& p : *back) by_name[p.name] = p.param;
  EXPECT_TRUE(torch::equal(by_name["f32"], f32));
  EXPECT_EQ(by_name["bf16"].scalar_type(), torch::kBFloat16);
  EXPECT_TRUE(torch::equal(by_name["bf16"], bf16));
  EXPECT_TRUE(torch::equal(by_name["transposed"], transposed));
  EXPECT_EQ(by_name["step"].dim(), 0);
  EXPECT_EQ(by_name["step"].item<int64_t>(), 17);
  EXPECT_EQ(by_name["empty"].sizes(), empty.sizes());
  EXPECT_TRUE(torch::equal(by_name["with_grad"], with_grad.detach()));
  EXPECT_FALSE(by_name["with_grad"].requires_grad());
}

TEST(SafetensorsTorchTest, Errors) {
  const std::string path = TempPath("errors.safetensors");
  EXPECT_THAT(std::string(SaveSafetensorsFile(path, {{"u", torch::Tensor()}}).message()),
              HasSubstr("\"u\" is undefined"));
  EXPECT_THAT(
      std::string(
          SaveSafetensorsFile(path, {{"c", torch::zeros({2}, torch::kComplexFloat)}}).message()),
      HasSubstr("no safetensors equivalent"));
  EXPECT_THAT(
      std::string(SaveSafetensorsFile(path, {{"a", torch::zeros({1})}, {"a", torch::zeros({1})}})
                      .message()),
      HasSubstr("duplicate"));
  EXPECT_EQ(ReadSafetensorsFile(TempPath("missing.safetensors")).status().code(),
            absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace memplan::io
