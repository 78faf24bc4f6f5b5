// OSFT through the planner's core (the gRPC handlers' body): a PlanRequest with training kind
// OSFT is planned unmanaged, stored, and measured under the calibration method "osft"; bad
// fields are refused naming them.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "planner/service/planner_core.h"
#include "tests/planner/service/planner_core_fixture.h"

namespace memplan {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

class PlannerCoreOsftTest : public PlannerCoreTest {
 protected:
  static v1::PlanRequest OsftRequest(double ratio) {
    v1::PlanRequest r = TinyRequest();
    r.mutable_training()->set_kind(v1::TrainingMethod::OSFT);
    r.mutable_training()->set_osft_rank_ratio(ratio);
    return r;
  }
};

TEST_F(PlannerCoreOsftTest, OsftIsPlannedUnmanagedAndCalibratedAsOsft) {
  auto response = Plan(OsftRequest(0.5));
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_TRUE(response->fits()) << response->reason();
  EXPECT_THAT(response->reason(), HasSubstr("OSFT unmanaged"));
  EXPECT_EQ(response->plan().chunk_bytes(), 0);
  EXPECT_EQ(response->plan().n_persist(), 0);
  EXPECT_GT(response->prediction().peak_bytes(), 0);
  EXPECT_GT(response->prediction().iteration_seconds(), 0);

  // A measurement re-predicts the stored OSFT plan and calibrates the "osft" key.
  v1::ReportMeasurementRequest report;
  report.mutable_measurement()->set_plan_id(response->plan_id());
  const int64_t measured = response->prediction().peak_bytes();
  report.mutable_measurement()->set_peak_reserved_bytes(measured);
  report.mutable_measurement()->set_peak_allocated_bytes(measured - 1000);
  auto reported = core_->ReportMeasurement(report);
  ASSERT_TRUE(reported.ok()) << reported.status();
  EXPECT_EQ(reported->calibration().method(), "osft");
  EXPECT_EQ(reported->calibration().samples(), 1);
}

TEST_F(PlannerCoreOsftTest, OsftFieldsAreRefusedNamingThem) {
  for (double ratio : {0.0, 1.0, 2.0}) {
    auto r = Plan(OsftRequest(ratio));
    ASSERT_FALSE(r.ok()) << ratio;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(r.status().message(),
                AllOf(HasSubstr("training.osft_rank_ratio"), HasSubstr("allowed (0, 1)")));
  }
  v1::PlanRequest bad = OsftRequest(0.5);
  bad.mutable_training()->add_osft_target_modules("embed_tokens");
  auto r = Plan(bad);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("training.osft_target_modules"));
  bad = OsftRequest(0.5);
  bad.mutable_fixed()->set_n_persist(1);
  r = Plan(bad);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("fixed.n_persist"));
}

}  // namespace
}  // namespace memplan
