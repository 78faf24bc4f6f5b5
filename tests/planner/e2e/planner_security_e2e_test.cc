// End to end, transport security: the real memplan-planner binary and the real memplan CLI over
// loopback with certificates made by openssl in the test. TLS and mutual TLS calls that succeed,
// and the ones that must fail (plaintext client, wrong CA, missing or foreign client
// certificate); plaintext off loopback refused without --insecure.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/wait.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "daemon_process.h"
#include "grpcpp/grpcpp.h"
#include "memplan/v1/planner.grpc.pb.h"
#include "test_pki.h"

#ifndef MEMPLAN_PLANNER_BINARY
#error "MEMPLAN_PLANNER_BINARY must name the memplan-planner executable"
#endif
#ifndef MEMPLAN_CLI_BINARY
#error "MEMPLAN_CLI_BINARY must name the memplan executable"
#endif

namespace memplan {
namespace {

using ::memplan::testing::DaemonProcess;
using ::testing::HasSubstr;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

int ExitCode(int wait_status) { return WIFEXITED(wait_status) ? WEXITSTATUS(wait_status) : -1; }

class PlannerSecurityE2ETest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string templ = ::testing::TempDir() + "/memplan-sec-XXXXXX";
    ASSERT_NE(mkdtemp(templ.data()), nullptr);
    dir_ = templ;
    auto pki = testing::MakeTestPki(dir_);
    ASSERT_TRUE(pki.ok()) << pki.status();
    pki_ = *pki;
  }

  void TearDown() override {
    daemon_.reset();
    if (HasFailure() || getenv("MEMPLAN_E2E_KEEP") != nullptr) {
      std::printf("files kept in %s\n", dir_.c_str());
    } else {
      std::filesystem::remove_all(dir_);
    }
  }

  void StartDaemon(std::vector<std::string> args, bool serve_metrics = false) {
    args.push_back("--search-threads=1");
    auto daemon = DaemonProcess::Start(MEMPLAN_PLANNER_BINARY, dir_ + "/planner.db",
                                       dir_ + "/planner.log", serve_metrics, args);
    ASSERT_TRUE(daemon.ok()) << daemon.status() << "\n" << ReadFile(dir_ + "/planner.log");
    daemon_ = std::make_unique<DaemonProcess>(*std::move(daemon));
  }

  std::vector<std::string> TlsServerFlags() const {
    return {"--tls-cert=" + pki_.server_cert, "--tls-key=" + pki_.server_key};
  }

  // TLS credentials trusting `ca`, presenting `cert`/`key` when given.
  std::shared_ptr<grpc::ChannelCredentials> Tls(const std::string& ca, const std::string& cert = "",
                                                const std::string& key = "") const {
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = ReadFile(ca);
    if (!cert.empty()) {
      ssl.pem_cert_chain = ReadFile(cert);
      ssl.pem_private_key = ReadFile(key);
    }
    return grpc::SslCredentials(ssl);
  }

  // One read RPC (ListPresets) on a fresh channel.
  grpc::Status ListPresets(const std::shared_ptr<grpc::ChannelCredentials>& credentials,
                           v1::ListPresetsResponse* response) {
    auto stub = v1::Planner::NewStub(grpc::CreateChannel(daemon_->address(), credentials));
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
    return stub->ListPresets(&context, v1::ListPresetsRequest(), response);
  }

  // Runs the memplan CLI against the daemon; {exit code, stdout + stderr}.
  std::pair<int, std::string> Cli(std::vector<std::string> args) {
    args.insert(args.begin(), {"--planner", daemon_->address(), "--timeout", "20"});
    auto run = testing::RunToCompletion(MEMPLAN_CLI_BINARY, args);
    EXPECT_TRUE(run.ok()) << run.status();
    if (!run.ok()) return {-1, ""};
    return {ExitCode(run->first), run->second};
  }

  // Writes the token file: "agent-1" may write, "ci-job" may only report measurements.
  std::string WriteTokenFile() {
    const std::string path = dir_ + "/tokens";
    std::ofstream(path) << "# name role token\n"
                        << "agent-1 write " << kWriteToken << "\n"
                        << "ci-job  report " << kReportToken << "\n";
    return path;
  }

  static void SetToken(grpc::ClientContext* context, const std::string& token) {
    if (!token.empty()) context->AddMetadata("authorization", "Bearer " + token);
  }

  grpc::Status Plan(v1::Planner::Stub& stub, v1::PlanResponse* response) {
    v1::PlanRequest request;
    request.set_arch_preset("llama-tiny");
    request.set_hardware_preset("rtx-3090");
    request.mutable_workload()->set_micro_batch(2);
    request.mutable_workload()->set_seq_len(512);
    request.set_skip_limits(true);
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    return stub.Plan(&context, request, response);
  }

  grpc::Status SubmitProfile(v1::Planner::Stub& stub, const std::string& token) {
    v1::SubmitHardwareProfileRequest request;
    v1::HardwareProfile& profile = *request.mutable_profile();
    profile.set_name("bench-3090");
    profile.set_gpu_memory_bytes(int64_t{24} << 30);
    profile.set_cuda_context_bytes(int64_t{500} << 20);
    profile.set_h2d_pinned_bytes_per_second(2.5e10);
    profile.set_d2h_pinned_bytes_per_second(2.5e10);
    profile.set_h2d_pageable_bytes_per_second(1e10);
    profile.set_d2h_pageable_bytes_per_second(1e10);
    profile.set_bidirectional_pinned_bytes_per_second(4e10);
    profile.set_hbm_bytes_per_second(9e11);
    profile.set_matmul_bf16_flops(7e13);
    profile.set_matmul_fp16_flops(7e13);
    profile.set_matmul_fp32_flops(3.5e13);
    profile.set_cpu_adam_params_per_second(1e9);
    profile.set_host_memory_bytes(int64_t{128} << 30);
    profile.set_measured(true);
    v1::SubmitHardwareProfileResponse response;
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
    SetToken(&context, token);
    return stub.SubmitHardwareProfile(&context, request, &response);
  }

  grpc::Status Report(v1::Planner::Stub& stub, const std::string& token, const std::string& plan_id,
                      int64_t reserved_bytes, v1::ReportMeasurementResponse* response,
                      double step_seconds = 0) {
    v1::ReportMeasurementRequest request;
    request.mutable_measurement()->set_plan_id(plan_id);
    request.mutable_measurement()->set_peak_reserved_bytes(reserved_bytes);
    // Allocated below reserved by 64 MiB, or by a quarter of a smaller peak (a tiny model's plan
    // reserves less than 128 MiB, and half of it is reported below).
    request.mutable_measurement()->set_peak_allocated_bytes(
        reserved_bytes - std::min(int64_t{64} << 20, reserved_bytes / 4));
    request.mutable_measurement()->set_step_seconds(step_seconds);
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
    SetToken(&context, token);
    return stub.ReportMeasurement(&context, request, response);
  }

  static std::vector<v1::Calibration> Calibrations(v1::Planner::Stub& stub) {
    v1::GetCalibrationResponse response;
    grpc::ClientContext context;
    const grpc::Status status =
        stub.GetCalibration(&context, v1::GetCalibrationRequest(), &response);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return {response.calibrations().begin(), response.calibrations().end()};
  }

  static v1::StoredPlan StoredPlan(v1::Planner::Stub& stub, const std::string& plan_id) {
    v1::GetPlanRequest request;
    request.set_plan_id(plan_id);
    v1::GetPlanResponse response;
    grpc::ClientContext context;
    const grpc::Status status = stub.GetPlan(&context, request, &response);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return response.plan();
  }

  // The value of the sample `name{labels}` in a Prometheus text exposition; -1 when absent.
  static double Sample(const std::string& exposition, const std::string& name,
                       const std::vector<std::string>& labels) {
    std::istringstream lines(exposition);
    for (std::string line; std::getline(lines, line);) {
      if (line.rfind(name + "{", 0) != 0) continue;
      bool all = true;
      for (const std::string& label : labels) all &= line.find(label) != std::string::npos;
      if (all) return std::stod(line.substr(line.rfind(' ') + 1));
    }
    return -1;
  }

  static constexpr char kWriteToken[] = "w-5f0c1d2e3a4b5c6d7e8f9a0b";
  static constexpr char kReportToken[] = "r-0a1b2c3d4e5f6a7b8c9d0e1f";

  std::string dir_;
  testing::TestPki pki_;
  std::unique_ptr<DaemonProcess> daemon_;
};

TEST_F(PlannerSecurityE2ETest, PlaintextOffLoopbackIsRefusedWithoutInsecure) {
  for (const std::string listen : {"0.0.0.0:0", "[::]:0"}) {
    auto run = testing::RunToCompletion(
        MEMPLAN_PLANNER_BINARY, {"--listen=" + listen, "--metrics=", "--db=" + dir_ + "/x.db"});
    ASSERT_TRUE(run.ok());
    EXPECT_EQ(ExitCode(run->first), 2) << run->second;
    EXPECT_THAT(run->second, HasSubstr("--listen=" + listen + " is not a loopback address"));
    EXPECT_THAT(run->second, HasSubstr("--tls-cert"));
    EXPECT_THAT(run->second, HasSubstr("--insecure"));
  }
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/x.db")) << "refused before opening the store";
  // Loopback plaintext (the default) still starts and answers.
  StartDaemon({});
  v1::ListPresetsResponse presets;
  const grpc::Status status = ListPresets(grpc::InsecureChannelCredentials(), &presets);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_GT(presets.models_size(), 0);
}

TEST_F(PlannerSecurityE2ETest, TlsAnswersClientsThatTrustItsCa) {
  StartDaemon(TlsServerFlags());
  v1::ListPresetsResponse presets;
  grpc::Status status = ListPresets(Tls(pki_.ca_cert), &presets);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_GT(presets.models_size(), 0);

  // A plaintext client cannot talk to a TLS port.
  status = ListPresets(grpc::InsecureChannelCredentials(), &presets);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE) << status.error_message();
  // A client that trusts another CA refuses the planner's certificate.
  status = ListPresets(Tls(pki_.other_ca_cert), &presets);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE) << status.error_message();
  // A certificate for the wrong name is refused too.
  grpc::ChannelArguments args;
  args.SetSslTargetNameOverride("not-the-planner.example");
  auto stub =
      v1::Planner::NewStub(grpc::CreateCustomChannel(daemon_->address(), Tls(pki_.ca_cert), args));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
  status = stub->ListPresets(&context, v1::ListPresetsRequest(), &presets);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE) << status.error_message();
}

TEST_F(PlannerSecurityE2ETest, MutualTlsNeedsAClientCertificateFromTheClientCa) {
  std::vector<std::string> flags = TlsServerFlags();
  flags.push_back("--tls-client-ca=" + pki_.ca_cert);
  StartDaemon(flags);
  v1::ListPresetsResponse presets;
  grpc::Status status = ListPresets(Tls(pki_.ca_cert, pki_.client_cert, pki_.client_key), &presets);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_GT(presets.hardware_size(), 0);

  // No client certificate: the handshake fails.
  status = ListPresets(Tls(pki_.ca_cert), &presets);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE) << status.error_message();
  // A client certificate from another CA: the handshake fails.
  status = ListPresets(Tls(pki_.ca_cert, pki_.other_client_cert, pki_.other_client_key), &presets);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE) << status.error_message();
}

TEST_F(PlannerSecurityE2ETest, CliSpeaksTlsAndMutualTls) {
  std::vector<std::string> flags = TlsServerFlags();
  flags.push_back("--tls-client-ca=" + pki_.ca_cert);
  StartDaemon(flags);

  auto [code, output] = Cli({"--tls-ca", pki_.ca_cert, "--tls-cert", pki_.client_cert, "--tls-key",
                             pki_.client_key, "presets", "--models"});
  EXPECT_EQ(code, 0) << output;
  EXPECT_THAT(output, HasSubstr("llama-3.1-8b"));

  // Without the client certificate: the planner is unreachable, and the hint says why.
  std::tie(code, output) = Cli({"--tls-ca", pki_.ca_cert, "presets", "--models"});
  EXPECT_EQ(code, 1) << output;
  EXPECT_THAT(output, HasSubstr("cannot reach the planner"));
  EXPECT_THAT(output, HasSubstr("--tls-cert/--tls-key"));
  // Plaintext against a TLS planner: the hint names --tls-ca.
  std::tie(code, output) = Cli({"presets", "--models"});
  EXPECT_EQ(code, 1) << output;
  EXPECT_THAT(output, HasSubstr("pass --tls-ca"));

  // Bad local input is a usage error naming the flag.
  std::tie(code, output) =
      Cli({"--tls-ca", pki_.ca_cert, "--tls-cert", pki_.client_cert, "presets"});
  EXPECT_EQ(code, 2) << output;
  EXPECT_THAT(output, HasSubstr("--tls-cert and --tls-key go together"));
  std::tie(code, output) = Cli({"--tls-ca", dir_ + "/missing.crt", "presets"});
  EXPECT_EQ(code, 2) << output;
  EXPECT_THAT(output, HasSubstr("--tls-ca = \"" + dir_ + "/missing.crt\": cannot open"));
  std::tie(code, output) =
      Cli({"--tls-cert", pki_.client_cert, "--tls-key", pki_.client_key, "presets"});
  EXPECT_EQ(code, 2) << output;
  EXPECT_THAT(output, HasSubstr("need --tls-ca"));

  auto [help_code, help] = Cli({"presets", "--help"});
  EXPECT_EQ(help_code, 0);
  for (const char* flag :
       {"--tls-ca", "--tls-cert", "--tls-key", "--tls-server-name", "--auth-token-file"}) {
    EXPECT_THAT(help, HasSubstr(flag));
  }
}

TEST_F(PlannerSecurityE2ETest, BadTlsFlagsAreNamed) {
  const std::string db = "--db=" + dir_ + "/x.db";
  auto run = testing::RunToCompletion(
      MEMPLAN_PLANNER_BINARY,
      {"--listen=127.0.0.1:0", "--metrics=", db, "--tls-cert=" + pki_.server_cert});
  ASSERT_TRUE(run.ok());
  EXPECT_EQ(ExitCode(run->first), 2) << run->second;
  EXPECT_THAT(run->second, HasSubstr("--tls-cert and --tls-key go together"));

  run = testing::RunToCompletion(MEMPLAN_PLANNER_BINARY, {"--listen=127.0.0.1:0", "--metrics=", db,
                                                          "--tls-cert=" + dir_ + "/missing.crt",
                                                          "--tls-key=" + pki_.server_key});
  ASSERT_TRUE(run.ok());
  EXPECT_EQ(ExitCode(run->first), 1) << run->second;
  // The log line quotes the message, so its quotes come escaped.
  EXPECT_THAT(run->second, HasSubstr("--tls-cert = \\\"" + dir_ + "/missing.crt\\\": cannot open"));
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/x.db")) << "failed before opening the store";

  // A key that does not belong to the certificate: the port is not served.
  run = testing::RunToCompletion(
      MEMPLAN_PLANNER_BINARY, {"--listen=127.0.0.1:0", "--metrics=", db,
                               "--tls-cert=" + pki_.server_cert, "--tls-key=" + pki_.client_key});
  ASSERT_TRUE(run.ok());
  EXPECT_EQ(ExitCode(run->first), 1) << run->second;
  EXPECT_THAT(run->second, HasSubstr("cannot listen"));

  auto help = testing::RunToCompletion(MEMPLAN_PLANNER_BINARY, {"--help"});
  ASSERT_TRUE(help.ok());
  for (const char* flag :
       {"--tls-cert", "--tls-key", "--tls-client-ca", "--tls-client-auth", "--insecure"}) {
    EXPECT_THAT(help->second, HasSubstr(flag));
  }
}

TEST_F(PlannerSecurityE2ETest, WriteRpcsNeedATokenWithARoleOrAClientCertificate) {
  std::vector<std::string> flags = TlsServerFlags();
  flags.push_back("--tls-client-ca=" + pki_.ca_cert);
  flags.push_back("--tls-client-auth=optional");
  flags.push_back("--auth-token-file=" + WriteTokenFile());
  StartDaemon(flags, /*serve_metrics=*/true);
  // TLS without a client certificate: allowed to connect (optional mode), reads are open.
  auto anonymous = v1::Planner::NewStub(grpc::CreateChannel(daemon_->address(), Tls(pki_.ca_cert)));
  v1::PlanResponse plan;
  grpc::Status status = Plan(*anonymous, &plan);
  ASSERT_TRUE(status.ok()) << status.error_message();

  status = SubmitProfile(*anonymous, "");
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_THAT(status.error_message(), HasSubstr("SubmitHardwareProfile is a write RPC"));
  status = SubmitProfile(*anonymous, "not-a-token-of-this-planner");
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_THAT(status.error_message(), HasSubstr("not in the planner's --auth-token-file"));
  // The "report" role may report measurements but not replace hardware profiles.
  status = SubmitProfile(*anonymous, kReportToken);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(status.error_message(), HasSubstr("role \"report\""));
  v1::ReportMeasurementResponse receipt;
  status = Report(*anonymous, kReportToken, plan.plan_id(), int64_t{3} << 30, &receipt);
  ASSERT_TRUE(status.ok()) << status.error_message();
  // The "write" role may do every write.
  status = SubmitProfile(*anonymous, kWriteToken);
  EXPECT_TRUE(status.ok()) << status.error_message();

  // A verified client certificate writes without a token.
  auto with_cert = v1::Planner::NewStub(grpc::CreateChannel(
      daemon_->address(), Tls(pki_.ca_cert, pki_.client_cert, pki_.client_key)));
  status = SubmitProfile(*with_cert, "");
  EXPECT_TRUE(status.ok()) << status.error_message();
  status = Report(*with_cert, "", plan.plan_id(), int64_t{3} << 30, &receipt);
  ASSERT_TRUE(status.ok()) << status.error_message();

  // Each stored measurement names who reported it (never the token).
  const v1::StoredPlan stored = StoredPlan(*anonymous, plan.plan_id());
  ASSERT_EQ(stored.measurements_size(), 2);
  std::vector<std::string> reporters = {stored.measurements(0).reported_by(),
                                        stored.measurements(1).reported_by()};
  EXPECT_THAT(reporters, ::testing::UnorderedElementsAre("token:ci-job", "cert:agent-1"));

  // Every refusal is counted, by method and code.
  auto metrics = testing::HttpGet(daemon_->metrics_port(), "/metrics");
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  EXPECT_EQ(Sample(*metrics, "memplan_rpc_rejected_total",
                   {"method=\"SubmitHardwareProfile\"", "code=\"UNAUTHENTICATED\""}),
            2);
  EXPECT_EQ(Sample(*metrics, "memplan_rpc_rejected_total",
                   {"method=\"SubmitHardwareProfile\"", "code=\"PERMISSION_DENIED\""}),
            1);
}

// Issue 12's "done when": a flood of fake measurements from a client without credentials
// changes no calibration and stores nothing.
TEST_F(PlannerSecurityE2ETest, UnauthorizedMeasurementFloodChangesNoCalibration) {
  StartDaemon({"--auth-token-file=" + WriteTokenFile()}, /*serve_metrics=*/true);
  auto stub = v1::Planner::NewStub(
      grpc::CreateChannel(daemon_->address(), grpc::InsecureChannelCredentials()));
  v1::PlanResponse plan;
  ASSERT_TRUE(Plan(*stub, &plan).ok());
  v1::ReportMeasurementResponse receipt;
  // One honest measurement: the peak the plan predicted.
  const int64_t predicted_reserved =
      plan.prediction().peak_bytes() - plan.prediction().breakdown().cuda_context_bytes();
  grpc::Status status = Report(*stub, kWriteToken, plan.plan_id(), predicted_reserved, &receipt);
  ASSERT_TRUE(status.ok()) << status.error_message();
  const std::vector<v1::Calibration> before = Calibrations(*stub);
  ASSERT_EQ(before.size(), 1u);

  // 200 fake reports claiming twice the memory: no token, then a guessed one.
  int refused = 0;
  for (int i = 0; i < 200; ++i) {
    status = Report(*stub, i % 2 == 0 ? "" : absl::StrCat("guess-", i, "-0123456789abcdef"),
                    plan.plan_id(), 2 * predicted_reserved, &receipt);
    refused += status.error_code() == grpc::StatusCode::UNAUTHENTICATED ? 1 : 0;
  }
  EXPECT_EQ(refused, 200);
  const std::vector<v1::Calibration> after = Calibrations(*stub);
  ASSERT_EQ(after.size(), 1u);
  EXPECT_EQ(after[0].SerializeAsString(), before[0].SerializeAsString())
      << before[0].DebugString() << " vs " << after[0].DebugString();
  EXPECT_EQ(StoredPlan(*stub, plan.plan_id()).measurements_size(), 1);

  auto metrics = testing::HttpGet(daemon_->metrics_port(), "/metrics");
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  EXPECT_EQ(Sample(*metrics, "memplan_rpc_rejected_total",
                   {"method=\"ReportMeasurement\"", "code=\"UNAUTHENTICATED\""}),
            200);
  EXPECT_NE(metrics->find("\nmemplan_stored_measurements 1\n"), std::string::npos) << *metrics;

  // The CLI sends the token from --auth-token-file; without it the planner refuses the write.
  const std::string token_file = dir_ + "/agent-1.token";
  std::ofstream(token_file) << kWriteToken << "\n";
  auto [code, output] = Cli({"measure", "--plan-id", plan.plan_id(), "--peak-reserved", "3GiB"});
  EXPECT_EQ(code, 1) << output;
  EXPECT_THAT(output, HasSubstr("UNAUTHENTICATED"));
  std::tie(code, output) = Cli({"--auth-token-file", token_file, "measure", "--plan-id",
                                plan.plan_id(), "--peak-reserved", "3GiB"});
  EXPECT_EQ(code, 0) << output;
  EXPECT_EQ(StoredPlan(*stub, plan.plan_id()).measurements_size(), 2);
}

// A measurement that fails a sanity check is stored with its reason and changes no calibration:
// a peak the card cannot hold, a step time 100x the prediction, and a burst from one client.
TEST_F(PlannerSecurityE2ETest, QuarantinedMeasurementsChangeNoCalibration) {
  StartDaemon({"--quarantine-burst=3"}, /*serve_metrics=*/true);
  auto stub = v1::Planner::NewStub(
      grpc::CreateChannel(daemon_->address(), grpc::InsecureChannelCredentials()));
  v1::PlanResponse plan;
  ASSERT_TRUE(Plan(*stub, &plan).ok());
  const int64_t predicted_reserved =
      plan.prediction().peak_bytes() - plan.prediction().breakdown().cuda_context_bytes();
  const double predicted_seconds = plan.prediction().iteration_seconds();
  v1::ReportMeasurementResponse receipt;
  grpc::Status status =
      Report(*stub, "", plan.plan_id(), predicted_reserved, &receipt, predicted_seconds);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(receipt.quarantine_reason(), "");
  const std::vector<v1::Calibration> before = Calibrations(*stub);
  ASSERT_EQ(before.size(), 1u);
  ASSERT_EQ(before[0].samples(), 1);

  ASSERT_TRUE(
      Report(*stub, "", plan.plan_id(), int64_t{48} << 30, &receipt, predicted_seconds).ok());
  EXPECT_THAT(receipt.quarantine_reason(),
              HasSubstr("peak_above_card: peak_reserved_bytes = 51539607552 (48.00 GiB)"));
  EXPECT_EQ(receipt.calibration().SerializeAsString(), before[0].SerializeAsString());
  ASSERT_TRUE(
      Report(*stub, "", plan.plan_id(), predicted_reserved, &receipt, 100 * predicted_seconds)
          .ok());
  EXPECT_THAT(receipt.quarantine_reason(), HasSubstr("step_time_out_of_band"));
  // Three reports used up the burst allowance of this client: more are quarantined, whatever
  // they claim.
  for (int i = 0; i < 7; ++i) {
    ASSERT_TRUE(
        Report(*stub, "", plan.plan_id(), predicted_reserved / 2, &receipt, predicted_seconds)
            .ok());
    EXPECT_THAT(receipt.quarantine_reason(), ::testing::StartsWith("burst: "));
    EXPECT_THAT(receipt.quarantine_reason(), HasSubstr("at most 3 are used for calibration"));
  }

  const std::vector<v1::Calibration> after = Calibrations(*stub);
  ASSERT_EQ(after.size(), 1u);
  EXPECT_EQ(after[0].SerializeAsString(), before[0].SerializeAsString())
      << before[0].DebugString() << " vs " << after[0].DebugString();
  const v1::StoredPlan stored = StoredPlan(*stub, plan.plan_id());
  ASSERT_EQ(stored.measurements_size(), 10);
  int quarantined = 0;
  for (const v1::Measurement& m : stored.measurements()) {
    quarantined += m.quarantine_reason().empty() ? 0 : 1;
    EXPECT_THAT(m.reported_by(), HasSubstr("peer:ipv4:127.0.0.1"));
  }
  EXPECT_EQ(quarantined, 9);

  auto metrics = testing::HttpGet(daemon_->metrics_port(), "/metrics");
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  EXPECT_EQ(
      Sample(*metrics, "memplan_measurements_quarantined_total", {"check=\"peak_above_card\""}), 1);
  EXPECT_EQ(Sample(*metrics, "memplan_measurements_quarantined_total",
                   {"check=\"step_time_out_of_band\""}),
            1);
  EXPECT_EQ(Sample(*metrics, "memplan_measurements_quarantined_total", {"check=\"burst\""}), 7);
}

TEST_F(PlannerSecurityE2ETest, BadTokenFilesAreNamed) {
  const std::string path = dir_ + "/tokens";
  for (const auto& [content, message] : std::vector<std::pair<std::string, std::string>>{
           {"agent-1 admin 0123456789abcdef0123\n", "role \\\"admin\\\" is not a role"},
           {"agent-1 write short\n", "at least 16 are needed"},
           {"# only a comment\n", "no tokens"},
           {"a write 0123456789abcdef0123\nb write 0123456789abcdef0123\n", "also another"}}) {
    std::ofstream(path) << content;
    auto run = testing::RunToCompletion(
        MEMPLAN_PLANNER_BINARY, {"--listen=127.0.0.1:0", "--metrics=", "--db=" + dir_ + "/x.db",
                                 "--auth-token-file=" + path});
    ASSERT_TRUE(run.ok());
    EXPECT_EQ(ExitCode(run->first), 1) << run->second;
    EXPECT_THAT(run->second, HasSubstr("--auth-token-file"));
    EXPECT_THAT(run->second, HasSubstr(message));
  }
}

}  // namespace
}  // namespace memplan
