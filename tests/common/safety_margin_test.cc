#include "common/safety_margin.h"

#include <limits>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace memplan {
namespace {

using ::testing::HasSubstr;

TEST(CheckSafetyMarginTest, AcceptsTheRangeEdges) {
  EXPECT_TRUE(CheckSafetyMargin("safety_margin", 0).ok());
  EXPECT_TRUE(CheckSafetyMargin("safety_margin", kDefaultSafetyMargin).ok());
  EXPECT_TRUE(CheckSafetyMargin("safety_margin", 0.5).ok());
}

TEST(CheckSafetyMarginTest, RefusesOutsideTheRangeNamingTheField) {
  for (double bad : {-1e-9, 0.5000001, 0.9, 1.0, std::numeric_limits<double>::infinity(),
                     std::numeric_limits<double>::quiet_NaN()}) {
    const absl::Status s = CheckSafetyMargin("--safety-margin", bad);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(std::string(s.message()), HasSubstr("--safety-margin = ")) << bad;
    EXPECT_THAT(std::string(s.message()), HasSubstr("allowed [0, 0.5]")) << bad;
  }
  EXPECT_EQ(CheckSafetyMargin("safety_margin", 0.7).message(),
            "safety_margin = 0.7 is out of range; allowed [0, 0.5]");
}

TEST(ResolveSafetyMarginTest, ZeroReadsAsTheDefault) {
  EXPECT_EQ(ResolveSafetyMargin(0), kDefaultSafetyMargin);
  EXPECT_EQ(ResolveSafetyMargin(0.2), 0.2);
  EXPECT_EQ(ResolveSafetyMargin(-0.1), -0.1);  // left for CheckSafetyMargin to refuse
}

TEST(ParseSafetyMarginFlagTest, ParsesAndChecks) {
  EXPECT_EQ(*ParseSafetyMarginFlag("--safety-margin", "0.1"), 0.1);
  EXPECT_EQ(*ParseSafetyMarginFlag("--safety-margin", "0"), 0);
  EXPECT_EQ(*ParseSafetyMarginFlag("--safety-margin", "0.5"), 0.5);
  EXPECT_EQ(ParseSafetyMarginFlag("--margin", "0.9").status().message(),
            "--margin: 0.9 is outside [0, 0.5]");
  EXPECT_EQ(ParseSafetyMarginFlag("--safety-margin", "lots").status().message(),
            "--safety-margin: \"lots\" is not a number in [0, 0.5]");
}

}  // namespace
}  // namespace memplan
