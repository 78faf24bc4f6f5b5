// Observability, live: the real memplan-planner, driven over gRPC (plans that fit and do not,
// measurements used and quarantined, an OOM report, a refused write, a NOT_FOUND), scraped by a
// real Prometheus (Debian package) on loopback with deploy/prometheus/prometheus.yml and
// memplan-rules.yml. Every query of deploy/grafana's dashboard must return data, every rule must
// load and evaluate cleanly, recording rules must produce series, and every memplan_* metric a
// rule reads must exist: a renamed metric fails this test. An OOM report must fire the OOM alert
// and leave the error histogram alone; idle TCP connections must not hold up a scrape.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/string_view.h"
#include "agent/metrics/agent_metrics.h"
#include "daemon_process.h"
#include "grpcpp/grpcpp.h"
#include "memplan/v1/planner.grpc.pb.h"
#include "nlohmann/json.hpp"

#ifndef MEMPLAN_PLANNER_BINARY
#error "MEMPLAN_PLANNER_BINARY must name the memplan-planner executable"
#endif
#ifndef MEMPLAN_SOURCE_DIR
#error "MEMPLAN_SOURCE_DIR must name the source tree (for deploy/)"
#endif

namespace memplan {
namespace {

using ::memplan::testing::DaemonProcess;
using Json = nlohmann::json;

constexpr char kToken[] = "live-test-0123456789abcdef";
constexpr char kJob[] = "memplan-planner";  // the job names of deploy/prometheus/prometheus.yml
constexpr char kAgentJob[] = "memplan-agent";

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// Replaces `from` (which must occur) by `to`; a deploy file that changed shape fails loudly.
std::string MustReplace(const std::string& text, const std::string& from, const std::string& to) {
  EXPECT_NE(text.find(from), std::string::npos) << "\"" << from << "\" not found";
  return absl::StrReplaceAll(text, {{from, to}});
}

std::string UrlEncode(const std::string& text) {
  std::string out;
  for (const unsigned char c : text) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
      out.push_back(static_cast<char>(c));
    } else {
      absl::StrAppend(&out, "%", absl::Hex(c, absl::kZeroPad2));
    }
  }
  return out;
}

// [No std::regex] GCC 12 warns -Wmaybe-uninitialized inside <regex> under -O1 and the sanitizer
// flags, which -Werror turns into a failed build; these two patterns are parsed by hand.

bool IsWordChar(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }

// "label_values(METRIC, LABEL)" with both parts word characters, as Grafana's variables say it.
bool ParseLabelValues(const std::string& definition, std::string* metric, std::string* label) {
  constexpr absl::string_view kPrefix = "label_values(";
  if (!absl::StartsWith(definition, kPrefix) || !absl::EndsWith(definition, ")")) return false;
  const absl::string_view inside =
      absl::string_view(definition).substr(kPrefix.size(), definition.size() - kPrefix.size() - 1);
  const size_t comma = inside.find(", ");
  if (comma == absl::string_view::npos) return false;
  *metric = std::string(inside.substr(0, comma));
  *label = std::string(inside.substr(comma + 2));
  const auto word = [](const std::string& w) {
    return !w.empty() && std::all_of(w.begin(), w.end(), IsWordChar);
  };
  return word(*metric) && word(*label);
}

// Every maximal run of [a-z_] that starts with "memplan_" in a PromQL expression.
std::vector<std::string> MemplanMetricNames(const std::string& query) {
  std::vector<std::string> names;
  for (size_t i = query.find("memplan_"); i != std::string::npos;
       i = query.find("memplan_", i + 1)) {
    size_t end = i;
    while (end < query.size() && (std::islower(static_cast<unsigned char>(query[end])) ||
                                  query[end] == '_')) {
      ++end;
    }
    names.push_back(query.substr(i, end - i));
    i = end - 1;
  }
  return names;
}

// A loopback TCP connection to `port` that sends nothing (the client that once held every scrape
// behind it); -1 on failure.
int OpenIdleConnection(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

int PortOf(const std::string& address) { return std::stoi(address.substr(address.rfind(':') + 1)); }

// Polls `done` every 200 ms until it holds or `seconds` pass.
bool WaitFor(double seconds, const std::function<bool()>& done) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < deadline) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  return done();
}

class PrometheusLiveTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(MEMPLAN_PROMETHEUS_BINARY)) {
      GTEST_SKIP() << MEMPLAN_PROMETHEUS_BINARY
                   << " is missing (apt-get install prometheus; scripts/bootstrap.sh does)";
    }
    std::string templ = ::testing::TempDir() + "/memplan-prom-XXXXXX";
    ASSERT_NE(mkdtemp(templ.data()), nullptr);
    dir_ = templ;
    std::ofstream(dir_ + "/tokens") << "live-test write " << kToken << "\n";
    auto daemon = DaemonProcess::Start(
        MEMPLAN_PLANNER_BINARY, dir_ + "/planner.db", dir_ + "/planner.log", /*serve_metrics=*/true,
        {"--search-threads=2", "--auth-token-file=" + dir_ + "/tokens"});
    ASSERT_TRUE(daemon.ok()) << daemon.status();
    daemon_ = std::make_unique<DaemonProcess>(*std::move(daemon));
    stub_ = v1::Planner::NewStub(
        grpc::CreateChannel(daemon_->address(), grpc::InsecureChannelCredentials()));
    // A training node's live metrics (agent/metrics), as memplan-agent train --metrics serves
    // them, fed with a run's numbers.
    auto agent = AgentMetrics::Start("127.0.0.1:0");
    ASSERT_TRUE(agent.ok()) << agent.status();
    agent_ = *std::move(agent);
    agent_->SetPlan({"plan-live", int64_t{20} << 30, 0.5, 8192});
  }

  void TearDown() override {
    testing::StopProcess(prometheus_pid_, 10);
    daemon_.reset();
    if (dir_.empty()) return;
    if (HasFailure()) {
      std::printf("files kept in %s (planner.log, prometheus.log)\n", dir_.c_str());
    } else {
      std::filesystem::remove_all(dir_);
    }
  }

  // deploy/prometheus/prometheus.yml with this planner as the target, 1 s intervals and the
  // absolute path of memplan-rules.yml; then Prometheus on a free loopback port.
  void StartPrometheus() {
    const std::string deploy = std::string(MEMPLAN_SOURCE_DIR) + "/deploy/prometheus/";
    std::string config = ReadFile(deploy + "prometheus.yml");
    config = MustReplace(config, "scrape_interval: 15s", "scrape_interval: 1s");
    config = MustReplace(config, "evaluation_interval: 15s", "evaluation_interval: 1s");
    config = MustReplace(config, "- memplan-rules.yml", "- " + deploy + "memplan-rules.yml");
    config = MustReplace(config, "\"127.0.0.1:9464\"", "\"" + daemon_->metrics_address() + "\"");
    config = MustReplace(config, "\"127.0.0.1:9465\"",
                         absl::StrCat("\"127.0.0.1:", agent_->port(), "\""));
    std::ofstream(dir_ + "/prometheus.yml") << config;
    prometheus_port_ = testing::FreeLoopbackPort();
    ASSERT_GT(prometheus_port_, 0);
    auto pid = testing::StartProcess(
        MEMPLAN_PROMETHEUS_BINARY,
        {"--config.file=" + dir_ + "/prometheus.yml", "--storage.tsdb.path=" + dir_ + "/tsdb",
         absl::StrCat("--web.listen-address=127.0.0.1:", prometheus_port_), "--log.level=warn"},
        dir_ + "/prometheus.log");
    ASSERT_TRUE(pid.ok()) << pid.status();
    prometheus_pid_ = *pid;
    ASSERT_TRUE(WaitFor(60, [&] { return testing::HttpGet(prometheus_port_, "/-/ready").ok(); }))
        << ReadFile(dir_ + "/prometheus.log");
  }

  // GET /api/v1/<path>; the "data" member of a successful answer, or null.
  Json Api(const std::string& path) {
    auto body = testing::HttpGet(prometheus_port_, "/api/v1/" + path);
    if (!body.ok()) return nullptr;
    Json answer = Json::parse(*body, nullptr, /*allow_exceptions=*/false);
    if (answer.is_discarded() || answer.value("status", "") != "success") return nullptr;
    return answer["data"];
  }

  // The instant-query result vector of `promql` (empty on error).
  Json Query(const std::string& promql) {
    Json data = Api("query?query=" + UrlEncode(promql));
    if (data.is_null() || !data.contains("result")) return Json::array();
    return data["result"];
  }

  double Scalar(const std::string& promql) {
    Json result = Query(promql);
    if (result.empty()) return -1;
    return std::stod(result[0]["value"][1].get<std::string>());
  }

  // One round of traffic: plans that fit and one that does not, measurements (one quarantined),
  // a refused write and a NOT_FOUND.
  void DriveTraffic() {
    for (int i = 0; i < 3; ++i) {
      agent_->ObserveStep({0.52, 7900, int64_t{19} << 30, int64_t{20} << 30, int64_t{20} << 30,
                           int64_t{21} << 30, int64_t{3} << 30, 2.75 - 0.25 * i, ++agent_step_});
    }
    v1::PlanRequest fits;
    fits.set_arch_preset("llama-tiny");
    fits.set_hardware_preset("rtx-3090");
    fits.mutable_workload()->set_micro_batch(2);
    fits.mutable_workload()->set_seq_len(512);
    fits.set_skip_limits(true);
    v1::PlanRequest too_big;
    too_big.set_arch_preset("llama-3.1-8b");
    too_big.set_hardware_preset("rtx-4090");
    too_big.mutable_workload()->set_micro_batch(1);
    too_big.mutable_workload()->set_seq_len(4096);
    too_big.set_skip_limits(true);
    for (const v1::PlanRequest& request : {fits, fits, too_big}) {
      v1::PlanResponse plan;
      grpc::ClientContext context;
      ASSERT_TRUE(stub_->Plan(&context, request, &plan).ok());
      if (!plan.fits()) continue;
      const int64_t reserved =
          plan.prediction().peak_bytes() - plan.prediction().breakdown().cuda_context_bytes();
      for (const int64_t measured : {reserved + reserved / 50, int64_t{1} << 40}) {
        v1::ReportMeasurementRequest report;
        report.mutable_measurement()->set_plan_id(plan.plan_id());
        report.mutable_measurement()->set_peak_reserved_bytes(measured);
        report.mutable_measurement()->set_step_seconds(plan.prediction().iteration_seconds());
        v1::ReportMeasurementResponse receipt;
        grpc::ClientContext report_context;
        report_context.AddMetadata("authorization", absl::StrCat("Bearer ", kToken));
        ASSERT_TRUE(stub_->ReportMeasurement(&report_context, report, &receipt).ok());
      }
      // A run of this plan that ran out of memory (peak 0: it did not get far enough to read one).
      v1::ReportMeasurementRequest oom;
      oom.mutable_measurement()->set_plan_id(plan.plan_id());
      oom.mutable_measurement()->set_oom(true);
      v1::ReportMeasurementResponse oom_receipt;
      grpc::ClientContext oom_context;
      oom_context.AddMetadata("authorization", absl::StrCat("Bearer ", kToken));
      ASSERT_TRUE(stub_->ReportMeasurement(&oom_context, oom, &oom_receipt).ok());
      EXPECT_FALSE(oom_receipt.has_relative_error());
      v1::ReportMeasurementRequest anonymous;
      anonymous.mutable_measurement()->set_plan_id(plan.plan_id());
      anonymous.mutable_measurement()->set_peak_reserved_bytes(reserved);
      v1::ReportMeasurementResponse refused;
      grpc::ClientContext anonymous_context;
      EXPECT_EQ(stub_->ReportMeasurement(&anonymous_context, anonymous, &refused).error_code(),
                grpc::StatusCode::UNAUTHENTICATED);
    }
    v1::GetPlanRequest missing;
    missing.set_plan_id("plan-0000000000000000");
    v1::GetPlanResponse none;
    grpc::ClientContext context;
    EXPECT_EQ(stub_->GetPlan(&context, missing, &none).error_code(), grpc::StatusCode::NOT_FOUND);
  }

  std::string dir_;
  std::unique_ptr<DaemonProcess> daemon_;
  std::unique_ptr<v1::Planner::Stub> stub_;
  std::unique_ptr<AgentMetrics> agent_;
  int64_t agent_step_ = 0;
  pid_t prometheus_pid_ = -1;
  int prometheus_port_ = 0;
};

TEST_F(PrometheusLiveTest, DashboardQueriesAndRulesReturnDataFromARealScrape) {
  DriveTraffic();
  StartPrometheus();
  // A few scrapes of the first round, then a second round, so that rates see counters move.
  ASSERT_TRUE(WaitFor(60, [&] {
    return Scalar(absl::StrCat("count_over_time(up{job=\"", kJob, "\"}[1m])")) >= 3;
  })) << ReadFile(dir_ + "/prometheus.log");
  EXPECT_EQ(Scalar(absl::StrCat("up{job=\"", kJob, "\"}")), 1);
  DriveTraffic();
  ASSERT_TRUE(WaitFor(30, [&] {
    return Scalar(absl::StrCat("sum(memplan_plans_served_total{job=\"", kJob, "\"})")) == 6;
  }));
  ASSERT_TRUE(WaitFor(30, [&] {
    return Scalar(absl::StrCat("count_over_time(memplan_stored_measurements{job=\"", kJob,
                               "\"}[1m])")) >= 6;
  }));

  EXPECT_EQ(Scalar(absl::StrCat("up{job=\"", kAgentJob, "\"}")), 1);
  // Every query of both dashboards, with Grafana's variables as a user who picked the job would
  // have them, returns at least one series; so do the variables' own queries.
  int queries = 0;
  for (const auto& [file, job] :
       {std::pair<std::string, std::string>{"memplan-planner-dashboard.json", kJob},
        {"memplan-agent-dashboard.json", kAgentJob}}) {
    const Json dashboard =
        Json::parse(ReadFile(std::string(MEMPLAN_SOURCE_DIR) + "/deploy/grafana/" + file));
    for (const Json& panel : dashboard["panels"]) {
      for (const Json& target : panel.value("targets", Json::array())) {
        const std::string expr =
            absl::StrReplaceAll(target["expr"].get<std::string>(),
                                {{"$__rate_interval", "1m"}, {"$job", job}, {"$plan_id", ".*"}});
        const Json result = Query(expr);
        EXPECT_FALSE(result.empty())
            << file << ", " << panel["title"] << ": " << expr << " returned no data";
        ++queries;
      }
    }
    for (const Json& variable : dashboard["templating"]["list"]) {
      if (variable.value("type", "") != "query") continue;
      const std::string definition = variable["definition"].get<std::string>();
      std::string metric, label;
      ASSERT_TRUE(ParseLabelValues(definition, &metric, &label)) << definition;
      Json values = Api(absl::StrCat("label/", label, "/values?match[]=", UrlEncode(metric)));
      EXPECT_FALSE(values.is_null() || values.empty()) << file << ": " << definition;
    }
  }
  EXPECT_GE(queries, 32);

  // Every rule loaded and evaluated without error; recording rules produce series; every
  // memplan_* metric a rule reads exists.
  Json groups;
  ASSERT_TRUE(WaitFor(30, [&] {
    groups = Api("rules")["groups"];
    if (groups.empty()) return false;
    for (const Json& group : groups) {
      for (const Json& rule : group["rules"]) {
        if (rule.value("lastEvaluation", "").rfind("0001-", 0) == 0) return false;
      }
    }
    return true;
  })) << "rules were not evaluated";
  int recording = 0;
  int alerting = 0;
  std::set<std::string> metrics_read;
  for (const Json& group : groups) {
    for (const Json& rule : group["rules"]) {
      const std::string name = rule["name"].get<std::string>();
      const std::string query = rule["query"].get<std::string>();
      EXPECT_EQ(rule.value("health", ""), "ok") << name << ": " << rule.value("lastError", "");
      if (rule["type"] == "recording") {
        ++recording;
        EXPECT_FALSE(Query(name).empty()) << "recording rule " << name << " has no series";
      } else {
        ++alerting;
      }
      for (std::string& metric : MemplanMetricNames(query)) metrics_read.insert(std::move(metric));
    }
  }
  EXPECT_EQ(recording, 2);
  EXPECT_EQ(alerting, 6);
  EXPECT_GE(metrics_read.size(), 4u);
  for (const std::string& name : metrics_read) {
    EXPECT_FALSE(Query(absl::StrCat("count(", name, "{job=\"", kJob, "\"})")).empty())
        << "a rule reads " << name << ", which the planner does not export";
  }
  // The planner is up, so the alert on it is not firing; the measured runs were within 5 %, so
  // neither is the under-prediction one.
  const Json alerts = Api("alerts")["alerts"];
  for (const Json& alert : alerts) {
    EXPECT_NE(alert["labels"].value("alertname", ""), "MemplanPlannerDown") << alert.dump();
    EXPECT_NE(alert["labels"].value("alertname", ""), "MemplanPredictionsUnderestimate")
        << alert.dump();
  }
  std::printf("%d dashboard queries, %d recording and %d alerting rules, %zu metrics checked\n",
              queries, recording, alerting, metrics_read.size());
}

// Issue 32: an OOM report was observed as a relative error of -1 and a measured peak of 0,
// which lowered the under-prediction alert exactly when it should fire. Now it is counted apart
// and fires its own alert, evaluated here by the real Prometheus from deploy/'s rules.
TEST_F(PrometheusLiveTest, OomReportFiresTheOomAlertAndStaysOutOfTheErrorHistogram) {
  DriveTraffic();  // two fitting plans: each one measured run kept, one quarantined, one OOM
  StartPrometheus();
  const std::string job = absl::StrCat("{job=\"", kJob, "\"}");
  ASSERT_TRUE(WaitFor(30, [&] {
    return Scalar(absl::StrCat("sum(memplan_measurements_oom_total", job, ")")) == 2;
  })) << ReadFile(dir_ + "/prometheus.log");
  // Counted by the calibration key, like the error histogram.
  const Json oom = Query(absl::StrCat("memplan_measurements_oom_total", job));
  ASSERT_EQ(oom.size(), 1u) << oom.dump();
  EXPECT_EQ(oom[0]["metric"].value("hardware", ""), "rtx-3090");
  EXPECT_EQ(oom[0]["metric"].value("family", ""), "llama");

  // The rule's own expression, through the query API, and the alert it makes.
  EXPECT_EQ(Query("time() - memplan_last_oom_timestamp_seconds < 3600").size(), 1u);
  Json firing;
  ASSERT_TRUE(WaitFor(30, [&] {
    const Json alerts = Api("alerts")["alerts"];  // a copy: the answer is a temporary
    for (const Json& alert : alerts) {
      if (alert["labels"].value("alertname", "") == "MemplanRunOutOfMemory" &&
          alert.value("state", "") == "firing") {
        firing = alert;
        return true;
      }
    }
    return false;
  })) << Api("alerts").dump();
  EXPECT_EQ(firing["labels"].value("severity", ""), "page");
  EXPECT_EQ(firing["labels"].value("hardware", ""), "rtx-3090");

  // The histogram holds the two measured runs only, both 2 % above the prediction
  // ((p - 1.02 p) / 1.02 p = -1.96 %): no -1 from the OOMs in any bucket below -2.5 %.
  EXPECT_EQ(Scalar(absl::StrCat("sum(memplan_prediction_relative_error_count", job, ")")), 2);
  EXPECT_EQ(Scalar(absl::StrCat("sum(memplan_prediction_relative_error_bucket{job=\"", kJob,
                                "\",le=\"-0.025\"})")),
            0);
  EXPECT_EQ(Scalar(absl::StrCat("sum(memplan_prediction_relative_error_bucket{job=\"", kJob,
                                "\",le=\"-0.01\"})")),
            2);
  // No measured peak of 0 beside a prediction.
  EXPECT_GT(Scalar(absl::StrCat("min(memplan_plan_measured_peak_bytes", job, ")")), 0);
}

// Issue 32: with one idle TCP connection open, a scrape took 4.5 s (one connection served at a
// time). Idle connections to both /metrics endpoints, the planner's and the agent's, must hold up
// neither a direct GET nor Prometheus's own scrapes (whose timeout is the 1 s interval here).
TEST_F(PrometheusLiveTest, IdleConnectionsDoNotHoldUpScrapes) {
  DriveTraffic();
  StartPrometheus();
  const int ports[] = {PortOf(daemon_->metrics_address()), agent_->port()};
  ASSERT_TRUE(WaitFor(30, [&] {
    return Scalar("sum(up{job=~\"memplan-planner|memplan-agent\"})") == 2;
  })) << ReadFile(dir_ + "/prometheus.log");

  // The server's per-connection deadline is 5 s: everything below happens well inside it.
  const double opened_at = Scalar("vector(time())");
  const auto opened = std::chrono::steady_clock::now();
  std::vector<int> idle;
  for (const int port : ports) {
    for (int i = 0; i < 3; ++i) {
      const int fd = OpenIdleConnection(port);
      ASSERT_GE(fd, 0) << port;
      idle.push_back(fd);
    }
  }
  for (const int port : ports) {
    const auto start = std::chrono::steady_clock::now();
    auto body = testing::HttpGet(port, "/metrics");
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    ASSERT_TRUE(body.ok()) << body.status();
    EXPECT_THAT(*body, ::testing::HasSubstr("memplan_build_info{"));
    EXPECT_LT(seconds, 1.0) << "port " << port;
  }
  // Two scrapes of each job that started after the connections were opened.
  ASSERT_TRUE(WaitFor(4, [&] {
    const Json latest =
        Query("timestamp(scrape_duration_seconds{job=~\"memplan-planner|memplan-agent\"})");
    if (latest.size() != 2) return false;
    for (const Json& sample : latest) {
      if (std::stod(sample["value"][1].get<std::string>()) < opened_at + 2) return false;
    }
    return true;
  }));
  const double held_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - opened).count();
  const std::string since = absl::StrCat("[", static_cast<int>(held_seconds * 1000), "ms]");
  for (const std::string job : {kJob, kAgentJob}) {
    EXPECT_EQ(Scalar(absl::StrCat("min_over_time(up{job=\"", job, "\"}", since, ")")), 1) << job;
    const double slowest = Scalar(
        absl::StrCat("max_over_time(scrape_duration_seconds{job=\"", job, "\"}", since, ")"));
    EXPECT_GE(slowest, 0) << job;
    EXPECT_LT(slowest, 0.5) << job;
  }
  EXPECT_LT(held_seconds, 4.5) << "the checks ran past the idle connections' deadline";
  for (const int fd : idle) close(fd);
}

}  // namespace
}  // namespace memplan
