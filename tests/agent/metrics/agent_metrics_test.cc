// The agent's live metrics over real HTTP: the prediction and the measured step side by side,
// labelled by plan_id, chunk traffic counted.
#include "agent/metrics/agent_metrics.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <unistd.h>

#include <vector>

#include "absl/strings/str_cat.h"
#include "common/build_info.h"
#include "http_get.h"

namespace memplan {
namespace {

using ::testing::HasSubstr;

TEST(AgentMetricsTest, ServesPredictionAndMeasurementsByPlan) {
  auto metrics = AgentMetrics::Start("127.0.0.1:0");
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  ASSERT_GT((*metrics)->port(), 0);
  (*metrics)->ObserveStep({1.0, 100, 1, 2, 3, 4, 5});  // before SetPlan: ignored
  (*metrics)->SetPlan({"plan-0123", 80'000'000'000, 2.5, 1600});
  (*metrics)->ObserveStep(
      {2.6, 1575, 60'000'000'000, 70'000'000'000, 75'000'000'000, 78'000'000'000, 1'000'000'000});
  (*metrics)->ObserveStep({2.4, 1706, 60'000'000'000, 70'000'000'000, 74'000'000'000,
                           77'500'000'000, 1'000'000'000, 2.25, 42});
  auto body = testing::HttpGet((*metrics)->port(), "/metrics");
  ASSERT_TRUE(body.ok()) << body.status();
  for (const char* line :
       {"memplan_agent_steps_total{plan_id=\"plan-0123\"} 2\n",
        "memplan_agent_step_seconds{plan_id=\"plan-0123\"} 2.4\n",
        "memplan_agent_tokens_per_second{plan_id=\"plan-0123\"} 1706\n",
        "memplan_agent_device_allocated_bytes{plan_id=\"plan-0123\"} 60000000000\n",
        "memplan_agent_device_reserved_bytes{plan_id=\"plan-0123\"} 70000000000\n",
        "memplan_agent_step_peak_allocated_bytes{plan_id=\"plan-0123\"} 74000000000\n",
        "memplan_agent_step_peak_reserved_bytes{plan_id=\"plan-0123\"} 77500000000\n",
        "memplan_agent_chunk_bytes_total{direction=\"h2d\",plan_id=\"plan-0123\"} 2000000000\n",
        "memplan_agent_predicted_peak_bytes{plan_id=\"plan-0123\"} 80000000000\n",
        "memplan_agent_predicted_step_seconds{plan_id=\"plan-0123\"} 2.5\n",
        "memplan_agent_predicted_tokens_per_second{plan_id=\"plan-0123\"} 1600\n",
        "memplan_agent_loss{plan_id=\"plan-0123\"} 2.25\n",
        "memplan_agent_step{plan_id=\"plan-0123\"} 42\n"}) {
    EXPECT_THAT(*body, HasSubstr(line));
  }
  EXPECT_THAT(*body, HasSubstr(absl::StrCat(
                         "memplan_build_info{build_type=\"", std::string(build_info::kBuildType),
                         "\",git_sha=\"", std::string(build_info::kGitSha), "\",version=\"",
                         std::string(build_info::kVersion), "\"} 1\n")));
}

// The agent's endpoint is the planner's server core: connections that send nothing (or half a
// request) hold up no scrape; each is cut at its 5 s deadline.
TEST(AgentMetricsTest, IdleConnectionsDoNotStallAScrape) {
  auto metrics = AgentMetrics::Start("127.0.0.1:0");
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  std::vector<int> idle;
  for (const char* sent : {"", "", "GET /metrics HTTP/1.1\r\n"}) {
    const int fd = testing::ConnectAndSend((*metrics)->port(), sent);
    ASSERT_GE(fd, 0);
    idle.push_back(fd);
  }
  auto body = testing::HttpGet((*metrics)->port(), "/metrics", "", /*timeout_seconds=*/2);
  for (const int fd : idle) close(fd);
  ASSERT_TRUE(body.ok()) << body.status();
  EXPECT_THAT(*body, HasSubstr("memplan_build_info{"));
}

TEST(AgentMetricsTest, OccupiedPortIsAnErrorAndOfflineRunsSayNone) {
  auto first = AgentMetrics::Start("127.0.0.1:0");
  ASSERT_TRUE(first.ok());
  auto second = AgentMetrics::Start("127.0.0.1:" + std::to_string((*first)->port()));
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  (*first)->SetPlan({});
  (*first)->ObserveStep({0.1, 10, 0, 0, 0, 0, 0});
  auto body = testing::HttpGet((*first)->port(), "/metrics");
  ASSERT_TRUE(body.ok());
  EXPECT_THAT(*body, HasSubstr("memplan_agent_steps_total{plan_id=\"none\"} 1\n"));
}

}  // namespace
}  // namespace memplan
