#include "common/metrics_server.h"

#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <memory>
#include <vector>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/build_info.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "planner/metrics/planner_metrics.h"
#include "prometheus/registry.h"
#include "tests/planner/metrics/http_get.h"

namespace memplan {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

bool PromtoolAvailable() { return std::system("command -v promtool >/dev/null 2>&1") == 0; }

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

// One server for the whole suite: stopping civetweb takes up to its 2 s poll quantum, so each test
// uses its own label values instead of its own server.
class MetricsServerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    registry_ = new std::shared_ptr<prometheus::Registry>(std::make_shared<prometheus::Registry>());
    metrics_ = new PlannerMetrics(*registry_);
    auto server = MetricsServer::Start("127.0.0.1:0", *registry_);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = server->release();
  }
  static void TearDownTestSuite() {
    delete server_;
    delete metrics_;
    delete registry_;
  }
  void SetUp() override { ASSERT_NE(server_, nullptr); }

  // Observes one of everything under labels derived from `tag`, as the service would after a plan
  // and a measurement.
  static void ObserveSomething(const std::string& tag) {
    metrics_->ObserveRpc(absl::StrCat("Plan", tag), "OK", 0.003);
    metrics_->ObserveRpc(absl::StrCat("Report", tag), "NOT_FOUND", 0.0004);
    metrics_->ObserveSearch(0.05);
    metrics_->PlanServed(true);
    metrics_->PlanServed(false);
    metrics_->ObservePlanPrediction(absl::StrCat("plan-", tag), 60'000'000'000);
    metrics_->ObserveMeasurement(absl::StrCat("plan-", tag), 60'000'000'000, 61'200'000'000,
                                 {"h100-80gb", "bf16", "llama"});
    metrics_->SetStoredMeasurements(42);
  }

  static std::shared_ptr<prometheus::Registry>* registry_;
  static PlannerMetrics* metrics_;
  static MetricsServer* server_;
};
std::shared_ptr<prometheus::Registry>* MetricsServerTest::registry_ = nullptr;
PlannerMetrics* MetricsServerTest::metrics_ = nullptr;
MetricsServer* MetricsServerTest::server_ = nullptr;

TEST_F(MetricsServerTest, BindsAnEphemeralPort) {
  EXPECT_GT(server_->port(), 0);
  EXPECT_LT(server_->port(), 65536);
}

TEST_F(MetricsServerTest, ServesObservedValuesOverHttp) {
  ObserveSomething("serve");
  auto body = testing::HttpGet(server_->port(), "/metrics");
  ASSERT_TRUE(body.ok()) << body.status();
  EXPECT_THAT(*body, HasSubstr("# TYPE memplan_rpc_duration_seconds histogram"));
  EXPECT_THAT(
      *body, HasSubstr("memplan_rpc_duration_seconds_count{code=\"OK\",method=\"Planserve\"} 1\n"));
  EXPECT_THAT(*body,
              HasSubstr("memplan_rpc_duration_seconds_bucket{code=\"OK\",method=\"Planserve\","
                        "le=\"0.0025\"} 0\n"));
  EXPECT_THAT(*body,
              HasSubstr("memplan_rpc_duration_seconds_bucket{code=\"OK\",method=\"Planserve\","
                        "le=\"0.005\"} 1\n"));
  EXPECT_THAT(*body, HasSubstr("memplan_rpc_duration_seconds_count{code=\"NOT_FOUND\","
                               "method=\"Reportserve\"} 1\n"));
  EXPECT_THAT(*body, HasSubstr("# TYPE memplan_search_duration_seconds histogram"));
  EXPECT_THAT(*body, HasSubstr("# TYPE memplan_plans_served_total counter"));
  EXPECT_THAT(*body, HasSubstr("memplan_plans_served_total{fits=\"true\"} "));
  EXPECT_THAT(*body, HasSubstr("memplan_plans_served_total{fits=\"false\"} "));
  EXPECT_THAT(*body, HasSubstr("# TYPE memplan_plan_predicted_peak_bytes gauge"));
  EXPECT_THAT(*body,
              HasSubstr("memplan_plan_predicted_peak_bytes{plan_id=\"plan-serve\"} 60000000000\n"));
  EXPECT_THAT(*body,
              HasSubstr("memplan_plan_measured_peak_bytes{plan_id=\"plan-serve\"} 61200000000\n"));
  EXPECT_THAT(*body, HasSubstr("# TYPE memplan_prediction_relative_error histogram"));
  // (60.0 - 61.2) / 61.2 = -1.96 %: under-predicted, between the -0.025 and -0.01 bounds.
  EXPECT_THAT(*body, HasSubstr("memplan_prediction_relative_error_bucket{dtype=\"bf16\","
                               "family=\"llama\",hardware=\"h100-80gb\",le=\"-0.025\"} 0\n"));
  EXPECT_THAT(*body, HasSubstr("memplan_prediction_relative_error_bucket{dtype=\"bf16\","
                               "family=\"llama\",hardware=\"h100-80gb\",le=\"-0.01\"} 1\n"));
  EXPECT_THAT(*body, HasSubstr("# TYPE memplan_stored_measurements gauge"));
  EXPECT_THAT(*body, HasSubstr("memplan_stored_measurements 42\n"));
  EXPECT_THAT(*body, HasSubstr("# TYPE memplan_build_info gauge"));
  EXPECT_THAT(*body, HasSubstr(absl::StrCat(
                         "memplan_build_info{build_type=\"", std::string(build_info::kBuildType),
                         "\",git_sha=\"", std::string(build_info::kGitSha), "\",version=\"",
                         std::string(build_info::kVersion), "\"} 1\n")));
}

TEST_F(MetricsServerTest, ScrapeReflectsLaterObservations) {
  metrics_->SetStoredMeasurements(1);
  auto first = testing::HttpGet(server_->port(), "/metrics");
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_THAT(*first, HasSubstr("memplan_stored_measurements 1\n"));
  metrics_->SetStoredMeasurements(2);
  auto second = testing::HttpGet(server_->port(), "/metrics");
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_THAT(*second, HasSubstr("memplan_stored_measurements 2\n"));
  EXPECT_THAT(*second, Not(HasSubstr("memplan_stored_measurements 1\n")));
}

TEST_F(MetricsServerTest, PromtoolAcceptsTheScrape) {
  if (!PromtoolAvailable()) GTEST_SKIP() << "promtool not installed";
  ObserveSomething("promtool");
  auto body = testing::HttpGet(server_->port(), "/metrics");
  ASSERT_TRUE(body.ok()) << body.status();
  const std::string dir = ::testing::TempDir();
  const std::string scrape = absl::StrCat(dir, "memplan_scrape_", ::getpid(), ".txt");
  const std::string report = absl::StrCat(dir, "memplan_promtool_", ::getpid(), ".txt");
  {
    std::ofstream out(scrape);
    out << *body;
  }
  const int rc = std::system(
      absl::StrCat("promtool check metrics < ", scrape, " > ", report, " 2>&1").c_str());
  const std::string output = ReadFile(report);
  std::remove(scrape.c_str());
  std::remove(report.c_str());
  ASSERT_TRUE(WIFEXITED(rc));
  EXPECT_EQ(WEXITSTATUS(rc), 0) << output;
  EXPECT_EQ(output, "") << "promtool lint findings:\n" << output;
}

// Issue 27, 5: one connection that sent nothing stalled every scrape behind it (the server
// answered one connection at a time, each for up to its 5 s socket timeout).
TEST_F(MetricsServerTest, IdleConnectionsDoNotStallAScrape) {
  std::vector<int> idle;
  for (const char* sent : {"", "", "GET /met", "GET /metrics HTTP/1.1\r\nHost: x"}) {
    const int fd = testing::ConnectAndSend(server_->port(), sent);
    ASSERT_GE(fd, 0);
    idle.push_back(fd);
  }
  // The scrape gives up after 2 s, well before the idle connections' 5 s deadline.
  auto body = testing::HttpGet(server_->port(), "/metrics", "", /*timeout_seconds=*/2);
  for (const int fd : idle) close(fd);
  ASSERT_TRUE(body.ok()) << body.status();
  EXPECT_THAT(*body, HasSubstr("# TYPE memplan_stored_measurements gauge"));
}

TEST_F(MetricsServerTest, OnlyGetMetricsIsServed) {
  auto other = testing::HttpGet(server_->port(), "/");
  ASSERT_FALSE(other.ok());
  EXPECT_THAT(std::string(other.status().message()), HasSubstr("404"));
  const int fd = testing::ConnectAndSend(
      server_->port(),
      absl::StrCat("GET /metrics HTTP/1.1\r\nX-Pad: ", std::string(10 << 10, 'a'), "\r\n\r\n"));
  ASSERT_GE(fd, 0);
  std::string answer;
  char buffer[1024];
  ssize_t n = 0;
  while ((n = recv(fd, buffer, sizeof(buffer), 0)) > 0) answer.append(buffer, n);
  close(fd);
  EXPECT_THAT(answer, ::testing::StartsWith("HTTP/1.1 431 "));
}

TEST(MetricsServerStartTest, BearerTokenIsRequiredWhenSet) {
  auto registry = std::make_shared<prometheus::Registry>();
  MetricsServerOptions options;
  options.address = "127.0.0.1:0";
  options.bearer_token = "s3cret-scrape-token";
  auto server = MetricsServer::Start(options, registry);
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = (*server)->port();
  for (const std::string& headers :
       {std::string(), std::string("Authorization: Bearer wrong\r\n"),
        std::string("Authorization: Bearer s3cret-scrape-toke\r\n"),
        std::string("Authorization: Basic czNjcmV0LXNjcmFwZS10b2tlbg==\r\n")}) {
    auto refused = testing::HttpGet(port, "/metrics", headers);
    ASSERT_FALSE(refused.ok()) << headers;
    EXPECT_THAT(std::string(refused.status().message()), HasSubstr("401")) << headers;
  }
  auto scraped =
      testing::HttpGet(port, "/metrics", "Authorization: Bearer s3cret-scrape-token\r\n");
  EXPECT_TRUE(scraped.ok()) << scraped.status();
}

TEST(MetricsServerStartTest, OccupiedPortIsAnError) {
  auto registry = std::make_shared<prometheus::Registry>();
  auto first = MetricsServer::Start("127.0.0.1:0", registry);
  ASSERT_TRUE(first.ok()) << first.status();
  auto second = MetricsServer::Start(absl::StrCat("127.0.0.1:", (*first)->port()), registry);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(second.status().message()), HasSubstr("metrics address"));
}

TEST(MetricsServerStartTest, NullRegistryIsRejected) {
  auto server = MetricsServer::Start("127.0.0.1:0", nullptr);
  ASSERT_FALSE(server.ok());
  EXPECT_EQ(server.status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace memplan
