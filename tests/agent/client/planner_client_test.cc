#include "agent/client/planner_client.h"

#include <arpa/inet.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "agent/client/record_json.h"
#include "common/presets.h"
#include "daemon_process.h"
#include "test_pki.h"

namespace memplan {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// A loopback TCP socket bound to a free port. listen_backlog >= 0 listens (connections complete
// in the kernel but nobody ever answers: calls run into their deadline); -1 only binds, so
// nothing listens there (connections are refused).
class LoopbackSocket {
 public:
  explicit LoopbackSocket(int listen_backlog) {
    fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = 0;
    bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
    socklen_t len = sizeof(addr);
    getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
    if (listen_backlog >= 0) listen(fd_, listen_backlog);
  }
  ~LoopbackSocket() { Close(); }
  void Close() {
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
  }
  int port() const { return port_; }
  std::string address() const { return absl::StrCat("127.0.0.1:", port_); }

 private:
  int fd_ = -1;
  int port_ = 0;
};

struct FakeSleeper {
  std::vector<double> waits;
  std::function<void()> on_first_wait;
  std::function<void(double)> AsFunction() {
    return [this](double seconds) {
      waits.push_back(seconds);
      if (waits.size() == 1 && on_first_wait) on_first_wait();
    };
  }
};

PlannerClientOptions FastOptions(FakeSleeper* sleeper, int retries) {
  PlannerClientOptions o;
  o.retries = retries;
  o.initial_backoff_seconds = 0.25;
  o.max_backoff_seconds = 1.0;
  o.call_deadline_seconds = 5;
  o.sleep = sleeper->AsFunction();
  return o;
}

PlanQuery PresetQuery() {
  PlanQuery q;
  q.arch_preset = "llama-3.2-1b";
  q.hardware_preset = "h100-80gb";
  q.workload = Workload{2, 2048, 1, 1};
  q.param_dtype = DType::kBFloat16;
  q.skip_limits = true;
  return q;
}

TEST(PlannerClientTest, CreateRejectsBadOptions) {
  PlannerClientOptions o;
  EXPECT_EQ(PlannerClient::Create("", o).status().code(), absl::StatusCode::kInvalidArgument);
  o.retries = -1;
  EXPECT_THAT(PlannerClient::Create("127.0.0.1:1", o).status().message(), HasSubstr("retries"));
  o = PlannerClientOptions();
  o.initial_backoff_seconds = 2;
  o.max_backoff_seconds = 1;
  EXPECT_THAT(PlannerClient::Create("127.0.0.1:1", o).status().message(), HasSubstr("backoff"));
  o = PlannerClientOptions();
  o.call_deadline_seconds = 0;
  EXPECT_THAT(PlannerClient::Create("127.0.0.1:1", o).status().message(),
              HasSubstr("call_deadline_seconds"));
}

TEST(PlannerClientTest, QueryNeedsExactlyOneModelAndOneHardware) {
  FakeSleeper sleeper;
  auto client = PlannerClient::Create("127.0.0.1:1", FastOptions(&sleeper, 3));
  ASSERT_TRUE(client.ok());
  PlanQuery q = PresetQuery();
  q.trace_id = "also-a-trace";
  absl::StatusOr<PlanAnswer> two_models = (*client)->Plan(q);
  EXPECT_EQ(two_models.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(two_models.status().message(), HasSubstr("arch, trace_id, arch_preset"));
  q = PresetQuery();
  q.hardware_preset.clear();
  EXPECT_THAT((*client)->Plan(q).status().message(),
              HasSubstr("hardware, hardware_profile_id, hardware_preset"));
  EXPECT_TRUE(sleeper.waits.empty()) << "a bad query must not reach the network";
}

TEST(PlannerClientTest, RefusedConnectionRetriesWithCappedBackoffThenNamesTheAddress) {
  LoopbackSocket closed(/*listen_backlog=*/-1);  // bound, not listening: connection refused
  FakeSleeper sleeper;
  auto client = PlannerClient::Create(closed.address(), FastOptions(&sleeper, 4));
  ASSERT_TRUE(client.ok());
  absl::StatusOr<PlanAnswer> answer = (*client)->Plan(PresetQuery());
  ASSERT_EQ(answer.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(answer.status().message(), HasSubstr(closed.address()));
  EXPECT_THAT(answer.status().message(), HasSubstr("5 attempt(s)"));
  EXPECT_THAT(sleeper.waits, ElementsAre(0.25, 0.5, 1.0, 1.0));

  // Non-idempotent calls are still retried when the planner was not reached at all.
  sleeper.waits.clear();
  Measurement m;
  m.plan_id = "p";
  m.peak_reserved_bytes = 1;
  EXPECT_EQ((*client)->ReportMeasurement(m).status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(sleeper.waits.size(), 4u);
}

TEST(PlannerClientTest, DeadlineIsRetriedOnlyForCallsSafeToRepeat) {
  LoopbackSocket silent(/*listen_backlog=*/16);  // accepts TCP, never speaks HTTP/2
  FakeSleeper sleeper;
  PlannerClientOptions options = FastOptions(&sleeper, 2);
  options.call_deadline_seconds = 0.2;
  auto client = PlannerClient::Create(silent.address(), options);
  ASSERT_TRUE(client.ok());
  absl::StatusOr<std::string> id = (*client)->SubmitHardwareProfile(*FindHardwarePreset("h200"));
  // Depending on the gRPC version a silent peer ends as DEADLINE_EXCEEDED or UNAVAILABLE; both
  // are retried for an idempotent call.
  ASSERT_TRUE(id.status().code() == absl::StatusCode::kDeadlineExceeded ||
              id.status().code() == absl::StatusCode::kUnavailable)
      << id.status();
  EXPECT_EQ(sleeper.waits.size(), 2u);
  EXPECT_THAT(id.status().message(), HasSubstr(silent.address()));

  if (id.status().code() == absl::StatusCode::kDeadlineExceeded) {
    sleeper.waits.clear();
    Measurement m;
    m.plan_id = "p";
    m.peak_reserved_bytes = 1;
    absl::StatusOr<MeasurementReceipt> receipt = (*client)->ReportMeasurement(m);
    EXPECT_EQ(receipt.status().code(), absl::StatusCode::kDeadlineExceeded);
    EXPECT_TRUE(sleeper.waits.empty()) << "a measurement may have been stored: not repeated";
  }
}

class PlannerClientE2eTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string base =
        absl::StrCat(::testing::TempDir(), "/planner_client_test_", getpid(), "_",
                     ::testing::UnitTest::GetInstance()->random_seed(), "_", counter_++);
    db_path_ = base + ".db";
    log_path_ = base + ".log";
  }
  void TearDown() override {
    for (const char* suffix : {"", "-wal", "-shm"}) std::remove((db_path_ + suffix).c_str());
    std::remove(log_path_.c_str());
  }

  absl::StatusOr<testing::DaemonProcess> StartDaemon(std::vector<std::string> extra = {}) {
    return testing::DaemonProcess::Start(MEMPLAN_PLANNER_BINARY, db_path_, log_path_,
                                         /*serve_metrics=*/false, extra);
  }

  static inline int counter_ = 0;
  std::string db_path_;
  std::string log_path_;
};

// The agent's client over mutual TLS with certificates made by openssl (tests/planner/e2e).
TEST_F(PlannerClientE2eTest, MutualTlsWithTheAgentsCertificate) {
  std::string dir = db_path_ + ".pki";
  ASSERT_EQ(mkdir(dir.c_str(), 0700), 0);
  auto pki = testing::MakeTestPki(dir);
  ASSERT_TRUE(pki.ok()) << pki.status();
  auto daemon = StartDaemon({"--tls-cert=" + pki->server_cert, "--tls-key=" + pki->server_key,
                             "--tls-client-ca=" + pki->ca_cert});
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  FakeSleeper sleeper;

  PlannerClientOptions options = FastOptions(&sleeper, 0);
  options.security.tls_ca_file = pki->ca_cert;
  options.security.tls_cert_file = pki->client_cert;
  options.security.tls_key_file = pki->client_key;
  auto client = PlannerClient::Create(daemon->address(), options);
  ASSERT_TRUE(client.ok()) << client.status();
  absl::StatusOr<PlanAnswer> answer = (*client)->Plan(PresetQuery());
  ASSERT_TRUE(answer.ok()) << answer.status();
  EXPECT_TRUE(answer->fits) << answer->reason;

  // Without its certificate the handshake fails; the error names the address.
  options.security.tls_cert_file.clear();
  options.security.tls_key_file.clear();
  auto no_cert = PlannerClient::Create(daemon->address(), options);
  ASSERT_TRUE(no_cert.ok()) << no_cert.status();
  answer = (*no_cert)->Plan(PresetQuery());
  EXPECT_EQ(answer.status().code(), absl::StatusCode::kUnavailable) << answer.status();
  EXPECT_THAT(answer.status().message(), HasSubstr(daemon->address()));
  EXPECT_THAT(answer.status().message(), HasSubstr("with TLS: does --tls-ca sign"));

  // Files that cannot be read fail Create, naming the flag.
  options.security.tls_ca_file = dir + "/missing.crt";
  auto missing = PlannerClient::Create(daemon->address(), options);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(missing.status().message(), HasSubstr("--tls-ca"));
  std::filesystem::remove_all(dir);
}

// The agent's writes carry the bearer token of --auth-token-file; without it they are refused
// (and not retried: UNAUTHENTICATED is final).
TEST_F(PlannerClientE2eTest, WritesCarryTheBearerToken) {
  const std::string tokens = db_path_ + ".tokens";
  const std::string token_file = db_path_ + ".token";
  { std::ofstream(tokens) << "agent-1 write w-0123456789abcdef\n"; }
  { std::ofstream(token_file) << "w-0123456789abcdef\n"; }
  auto daemon = StartDaemon({"--auth-token-file=" + tokens});
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  FakeSleeper sleeper;

  auto anonymous = PlannerClient::Create(daemon->address(), FastOptions(&sleeper, 2));
  ASSERT_TRUE(anonymous.ok());
  absl::StatusOr<PlanAnswer> answer = (*anonymous)->Plan(PresetQuery());  // reads stay open
  ASSERT_TRUE(answer.ok()) << answer.status();
  Measurement m;
  m.plan_id = answer->plan_id;
  m.peak_reserved_bytes = answer->prediction.peak_bytes / 2;
  absl::StatusOr<MeasurementReceipt> receipt = (*anonymous)->ReportMeasurement(m);
  EXPECT_EQ(receipt.status().code(), absl::StatusCode::kUnauthenticated) << receipt.status();
  EXPECT_TRUE(sleeper.waits.empty());

  PlannerClientOptions options = FastOptions(&sleeper, 2);
  options.security.auth_token_file = token_file;
  auto agent = PlannerClient::Create(daemon->address(), options);
  ASSERT_TRUE(agent.ok()) << agent.status();
  receipt = (*agent)->ReportMeasurement(m);
  ASSERT_TRUE(receipt.ok()) << receipt.status();
  EXPECT_FALSE(receipt->measurement_id.empty());

  options.security.auth_token_file = db_path_ + ".missing";
  auto missing = PlannerClient::Create(daemon->address(), options);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(missing.status().message(), HasSubstr("--auth-token-file"));
  for (const std::string& f : {tokens, token_file}) std::remove(f.c_str());
}

TEST_F(PlannerClientE2eTest, ProfilePlanMeasureAgainstTheRealDaemon) {
  auto daemon = StartDaemon();
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  FakeSleeper sleeper;
  auto client = PlannerClient::Create(daemon->address(), FastOptions(&sleeper, 2));
  ASSERT_TRUE(client.ok());

  // A measured hardware profile, then a plan against it by id.
  HardwareSpec hw = *FindHardwarePreset("h100-80gb");
  hw.name = "bench-h100";
  hw.measured = true;
  absl::StatusOr<std::string> profile_id = (*client)->SubmitHardwareProfile(hw);
  ASSERT_TRUE(profile_id.ok()) << profile_id.status();
  EXPECT_FALSE(profile_id->empty());

  PlanQuery q = PresetQuery();
  q.hardware_preset.clear();
  q.hardware_profile_id = *profile_id;
  absl::StatusOr<PlanAnswer> answer = (*client)->Plan(q);
  ASSERT_TRUE(answer.ok()) << answer.status();
  EXPECT_TRUE(answer->fits) << answer->reason;
  EXPECT_FALSE(answer->plan_id.empty());
  EXPECT_TRUE(answer->analytic_trace);
  const ModelSpec arch = *FindModelPreset("llama-3.2-1b");
  EXPECT_EQ(static_cast<int64_t>(answer->plan.block_modes.size()), arch.num_layers);
  EXPECT_GT(answer->prediction.peak_bytes, 0);
  EXPECT_LE(answer->prediction.peak_bytes, answer->capacity_bytes);
  EXPECT_GT(answer->prediction.iteration_seconds, 0);

  // The answer survives the plan file the agent can run offline from.
  absl::StatusOr<PlanAnswer> reread = PlanAnswerFromJson(PlanAnswerToJson(*answer));
  ASSERT_TRUE(reread.ok()) << reread.status();
  EXPECT_EQ(reread->plan.block_modes, answer->plan.block_modes);
  EXPECT_EQ(reread->prediction.peak_bytes, answer->prediction.peak_bytes);
  EXPECT_EQ(reread->plan_id, answer->plan_id);

  // Reserved bytes 10% below the prediction's reserved part (the prediction minus the CUDA
  // context): the planner reports +10% relative error.
  const int64_t predicted_reserved =
      answer->prediction.peak_bytes - answer->prediction.breakdown.cuda_context_bytes;
  Measurement m;
  m.plan_id = answer->plan_id;
  m.peak_reserved_bytes = predicted_reserved * 10 / 11;
  m.peak_allocated_bytes = m.peak_reserved_bytes * 9 / 10;
  m.step_seconds = answer->prediction.iteration_seconds;
  absl::StatusOr<MeasurementReceipt> receipt = (*client)->ReportMeasurement(m);
  ASSERT_TRUE(receipt.ok()) << receipt.status();
  EXPECT_FALSE(receipt->measurement_id.empty());
  ASSERT_TRUE(receipt->relative_error.has_value());
  EXPECT_DOUBLE_EQ(*receipt->relative_error,
                   static_cast<double>(predicted_reserved - m.peak_reserved_bytes) /
                       static_cast<double>(m.peak_reserved_bytes));
  EXPECT_NEAR(*receipt->relative_error, 0.1, 1e-6);
  EXPECT_EQ(receipt->calibration.hardware_name, "bench-h100");
  EXPECT_GE(receipt->calibration.samples, 1);
  EXPECT_TRUE(sleeper.waits.empty());
}

TEST_F(PlannerClientE2eTest, ProfiledTraceIsUsedByPlan) {
  auto daemon = StartDaemon();
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  FakeSleeper sleeper;
  auto client = PlannerClient::Create(daemon->address(), FastOptions(&sleeper, 1));
  ASSERT_TRUE(client.ok());

  // A small "profiled" trace with plausible figures for a tiny model.
  Trace t;
  t.arch = *FindModelPreset("llama-tiny");
  t.workload = Workload{1, 128, 1, 1};
  t.param_dtype = DType::kBFloat16;
  t.hardware_name = "h100-80gb";
  t.analytic = false;
  t.embedding = EdgeTrace{1 << 20, 1024, 1 << 16, 1 << 16, 1e-5, 2e-5};
  for (int64_t i = 0; i < t.arch.num_layers; ++i) {
    t.blocks.push_back(BlockTrace{1 << 20, 1 << 16, 1 << 19, 1 << 17, 1 << 18, 1e-4, 2e-4, 1e-4});
  }
  t.head = EdgeTrace{1 << 20, 1 << 20, 1 << 18, 1 << 19, 1e-4, 2e-4};
  t.total_param_count = 1 << 22;
  t.trainable_param_count = t.total_param_count;
  absl::StatusOr<std::string> trace_id = (*client)->SubmitTrace(t);
  ASSERT_TRUE(trace_id.ok()) << trace_id.status();

  PlanQuery q;
  q.trace_id = *trace_id;
  q.hardware_preset = "h100-80gb";
  q.workload = t.workload;
  q.skip_limits = true;
  absl::StatusOr<PlanAnswer> answer = (*client)->Plan(q);
  ASSERT_TRUE(answer.ok()) << answer.status();
  EXPECT_EQ(answer->trace_id, *trace_id);
  EXPECT_FALSE(answer->analytic_trace);
  EXPECT_EQ(static_cast<int64_t>(answer->plan.block_modes.size()), t.arch.num_layers);
}

TEST_F(PlannerClientE2eTest, PlannerErrorsComeBackWithCodeAndMessageUnretried) {
  auto daemon = StartDaemon();
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  FakeSleeper sleeper;
  auto client = PlannerClient::Create(daemon->address(), FastOptions(&sleeper, 3));
  ASSERT_TRUE(client.ok());

  PlanQuery unknown = PresetQuery();
  unknown.arch_preset.clear();
  unknown.trace_id = "no-such-trace";
  absl::StatusOr<PlanAnswer> not_found = (*client)->Plan(unknown);
  EXPECT_EQ(not_found.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(not_found.status().message(), HasSubstr("no-such-trace"));

  PlanQuery bad = PresetQuery();
  bad.arch_preset.clear();
  ModelSpec arch = *FindModelPreset("llama-3.2-1b");
  arch.num_heads = 0;
  bad.arch = arch;
  absl::StatusOr<PlanAnswer> invalid = (*client)->Plan(bad);
  EXPECT_EQ(invalid.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(invalid.status().message(), HasSubstr("num_heads"));

  Measurement m;
  m.plan_id = "no-such-plan";
  m.peak_reserved_bytes = 1 << 30;
  EXPECT_EQ((*client)->ReportMeasurement(m).status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(sleeper.waits.empty());
}

TEST_F(PlannerClientE2eTest, RecoversWhenThePlannerComesUpDuringTheBackoff) {
  LoopbackSocket reserved(/*listen_backlog=*/-1);
  const int port = reserved.port();
  reserved.Close();  // free the port for the daemon, which the first backoff starts
  FakeSleeper sleeper;
  std::optional<testing::DaemonProcess> daemon;
  absl::Status start_status;
  sleeper.on_first_wait = [&] {
    auto started = StartDaemon({absl::StrCat("--listen=127.0.0.1:", port)});
    if (started.ok()) {
      daemon.emplace(std::move(started).value());
    } else {
      start_status = started.status();
    }
  };
  auto client = PlannerClient::Create(absl::StrCat("127.0.0.1:", port), FastOptions(&sleeper, 3));
  ASSERT_TRUE(client.ok());
  absl::StatusOr<PlanAnswer> answer = (*client)->Plan(PresetQuery());
  ASSERT_TRUE(start_status.ok()) << start_status;
  ASSERT_TRUE(daemon.has_value());
  ASSERT_TRUE(answer.ok()) << answer.status();
  EXPECT_TRUE(answer->fits);
  EXPECT_EQ(sleeper.waits.size(), 1u) << "the attempt after the daemon started must succeed";
}

}  // namespace
}  // namespace memplan
