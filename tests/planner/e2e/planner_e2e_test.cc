// End to end: the real memplan-planner binary on a loopback port with a temporary SQLite file,
// driven over real gRPC (Planner, health, reflection), stopped with SIGTERM and SIGKILL.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/presets.h"
#include "common/proto_convert.h"
#include "daemon_process.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpc/reflection/v1alpha/reflection.grpc.pb.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "memplan/v1/planner.grpc.pb.h"

#ifndef MEMPLAN_PLANNER_BINARY
#error "MEMPLAN_PLANNER_BINARY must name the memplan-planner executable"
#endif

namespace memplan {
namespace {

using ::memplan::testing::DaemonProcess;
using ::testing::HasSubstr;
using ::testing::StartsWith;

constexpr int64_t kGiB = int64_t{1} << 30;

class PlannerE2ETest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string templ = ::testing::TempDir() + "/memplan-e2e-XXXXXX";
    ASSERT_NE(mkdtemp(templ.data()), nullptr);
    dir_ = templ;
    db_path_ = dir_ + "/planner.db";
    log_path_ = dir_ + "/planner.log";
  }

  void TearDown() override {
    daemon_.reset();
    if (HasFailure() || getenv("MEMPLAN_E2E_KEEP") != nullptr) {
      std::printf("daemon log kept at %s\n", log_path_.c_str());
    } else {
      std::filesystem::remove_all(dir_);
    }
  }

  // The metrics endpoint is off unless a test reads it (stopping it takes up to 0.2 s).
  void StartDaemon(bool serve_metrics = false) {
    auto daemon =
        testing::DaemonProcess::Start(MEMPLAN_PLANNER_BINARY, db_path_, log_path_, serve_metrics,
                                      {"--search-threads=2", "--log-level=debug"});
    ASSERT_TRUE(daemon.ok()) << daemon.status();
    daemon_ = std::make_unique<DaemonProcess>(*std::move(daemon));
    channel_ = grpc::CreateChannel(daemon_->address(), grpc::InsecureChannelCredentials());
    ASSERT_TRUE(
        channel_->WaitForConnected(std::chrono::system_clock::now() + std::chrono::seconds(30)));
    stub_ = v1::Planner::NewStub(channel_);
  }

  // Sends SIGTERM and expects a clean exit 0. Closes the client channel first: gRPC's server
  // shutdown waits (up to the grace period) for connected clients to go away.
  void StopDaemon() {
    stub_.reset();
    channel_.reset();
    auto status = daemon_->SignalAndWait(SIGTERM);
    ASSERT_TRUE(status.ok()) << status.status();
    ASSERT_TRUE(WIFEXITED(*status)) << "wait status " << *status;
    EXPECT_EQ(WEXITSTATUS(*status), 0);
    daemon_.reset();
  }

  static v1::PlanRequest TinyRequest() {
    v1::PlanRequest r;
    r.set_arch_preset("llama-tiny");
    r.set_hardware_preset("rtx-3090");
    r.mutable_workload()->set_micro_batch(2);
    r.mutable_workload()->set_seq_len(512);
    r.set_skip_limits(true);
    return r;
  }

  grpc::Status Plan(const v1::PlanRequest& request, v1::PlanResponse* response) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    return stub_->Plan(&context, request, response);
  }

  grpc::Status Report(const std::string& plan_id, int64_t reserved, const std::string& note,
                      v1::ReportMeasurementResponse* response) {
    v1::ReportMeasurementRequest request;
    request.mutable_measurement()->set_plan_id(plan_id);
    request.mutable_measurement()->set_peak_reserved_bytes(reserved);
    request.mutable_measurement()->set_peak_allocated_bytes(reserved > 0 ? reserved / 2 : 0);
    // No step time: these tests check peaks and storage (a made-up step time far from the
    // plan's prediction would be quarantined).
    request.mutable_measurement()->set_note(note);
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    return stub_->ReportMeasurement(&context, request, response);
  }

  grpc::Status GetPlan(const std::string& plan_id, v1::GetPlanResponse* response) {
    v1::GetPlanRequest request;
    request.set_plan_id(plan_id);
    grpc::ClientContext context;
    return stub_->GetPlan(&context, request, response);
  }

  std::string dir_;
  std::string db_path_;
  std::string log_path_;
  std::unique_ptr<DaemonProcess> daemon_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Planner::Stub> stub_;
};

TEST_F(PlannerE2ETest, EveryRpcOverRealGrpc) {
  StartDaemon(/*serve_metrics=*/true);

  // Plan from presets.
  v1::PlanResponse plan;
  grpc::Status status = Plan(TinyRequest(), &plan);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_TRUE(plan.fits());
  EXPECT_THAT(plan.plan_id(), StartsWith("plan-"));
  EXPECT_GT(plan.prediction().peak_bytes(), 0);

  // ListPresets.
  {
    grpc::ClientContext context;
    v1::ListPresetsResponse presets;
    ASSERT_TRUE(stub_->ListPresets(&context, {}, &presets).ok());
    EXPECT_EQ(presets.models_size(), static_cast<int>(ModelPresets().size()));
    EXPECT_EQ(presets.hardware_size(), static_cast<int>(HardwarePresets().size()));
  }

  // SubmitHardwareProfile, then plan on it by id.
  HardwareSpec card = *FindHardwarePreset("rtx-4090");
  card.name = "lab-card-7";
  card.measured = true;
  card.gpu_memory_bytes = 20 * kGiB;
  v1::SubmitHardwareProfileRequest submit_hw;
  *submit_hw.mutable_profile() = ToProto(card);
  v1::SubmitHardwareProfileResponse hw_id;
  {
    grpc::ClientContext context;
    status = stub_->SubmitHardwareProfile(&context, submit_hw, &hw_id);
    ASSERT_TRUE(status.ok()) << status.error_message();
    EXPECT_THAT(hw_id.profile_id(), StartsWith("hw-"));
  }
  v1::PlanRequest on_card = TinyRequest();
  on_card.set_hardware_profile_id(hw_id.profile_id());
  v1::PlanResponse card_plan;
  ASSERT_TRUE(Plan(on_card, &card_plan).ok());
  EXPECT_LT(card_plan.capacity_bytes(), 20 * kGiB);

  // SubmitTrace: an analytic-shaped trace copied from what the engine would need is not
  // available on the wire, so submit a small profiled one and read it back.
  {
    const ModelSpec m = *FindModelPreset("llama-tiny");
    Trace t;
    t.arch = m;
    t.workload = {1, 128, 1, 1};
    t.hardware_name = "lab-card-7";
    t.analytic = false;
    const int64_t hidden_bytes = 128 * m.hidden_size * 2;
    for (int i = 0; i < m.num_layers; ++i) {
      t.blocks.push_back({2 << 20, hidden_bytes, 20 * hidden_bytes, 4 * hidden_bytes,
                          6 * hidden_bytes, 1e-4, 2e-4, 1e-4});
    }
    t.embedding = {m.vocab_size * m.hidden_size * 2, hidden_bytes, 0, 0, 1e-5, 1e-5};
    t.head = {m.vocab_size * m.hidden_size * 2,
              128 * m.vocab_size * 4,
              128 * m.vocab_size * 4,
              128 * m.vocab_size * 4,
              1e-4,
              2e-4};
    t.total_param_count = 4'000'000;
    t.trainable_param_count = 4'000'000;
    v1::SubmitTraceRequest submit;
    *submit.mutable_trace() = ToProto(t);
    v1::SubmitTraceResponse trace_id;
    grpc::ClientContext context;
    status = stub_->SubmitTrace(&context, submit, &trace_id);
    ASSERT_TRUE(status.ok()) << status.error_message();
    EXPECT_THAT(trace_id.trace_id(), StartsWith("trace-"));

    v1::GetTraceRequest get;
    get.set_trace_id(trace_id.trace_id());
    v1::GetTraceResponse got;
    grpc::ClientContext context2;
    ASSERT_TRUE(stub_->GetTrace(&context2, get, &got).ok());
    EXPECT_EQ(got.trace().blocks_size(), 4);
    EXPECT_EQ(got.trace().hardware_name(), "lab-card-7");
  }

  // ReportMeasurement, then GetPlan shows it and GetCalibration has the fit.
  v1::ReportMeasurementResponse reported;
  const int64_t measured = plan.prediction().peak_bytes() * 11 / 10;
  status = Report(plan.plan_id(), measured, "first run", &reported);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_THAT(reported.measurement_id(), StartsWith("meas-"));
  EXPECT_LT(reported.relative_error(), 0);  // under-predicted by the uncalibrated model
  EXPECT_EQ(reported.calibration().samples(), 1);

  v1::GetPlanResponse stored;
  ASSERT_TRUE(GetPlan(plan.plan_id(), &stored).ok());
  ASSERT_EQ(stored.plan().measurements_size(), 1);
  EXPECT_EQ(stored.plan().measurements(0).note(), "first run");
  EXPECT_EQ(stored.plan().response().prediction().peak_bytes(), plan.prediction().peak_bytes());

  {
    v1::GetCalibrationRequest request;
    request.set_hardware_name("rtx-3090");
    request.set_param_dtype(v1::DTYPE_BF16);
    v1::GetCalibrationResponse calibrations;
    grpc::ClientContext context;
    ASSERT_TRUE(stub_->GetCalibration(&context, request, &calibrations).ok());
    ASSERT_EQ(calibrations.calibrations_size(), 1);
    EXPECT_EQ(calibrations.calibrations(0).model_family(), "llama");
    EXPECT_EQ(calibrations.calibrations(0).samples(), 1);
  }

  // ListPlans paging over a few more plans: every plan exactly once, newest first.
  std::vector<std::string> ids = {plan.plan_id(), card_plan.plan_id()};
  for (int i = 0; i < 3; ++i) {
    v1::PlanRequest r = TinyRequest();
    r.mutable_workload()->set_micro_batch(3 + i);
    v1::PlanResponse more;
    ASSERT_TRUE(Plan(r, &more).ok());
    ids.push_back(more.plan_id());
  }
  std::vector<std::string> listed;
  v1::ListPlansRequest list;
  list.set_page_size(2);
  for (int page = 0; page < 10; ++page) {
    v1::ListPlansResponse response;
    grpc::ClientContext context;
    ASSERT_TRUE(stub_->ListPlans(&context, list, &response).ok());
    EXPECT_LE(response.plans_size(), 2);
    for (const v1::StoredPlan& p : response.plans()) listed.push_back(p.plan_id());
    if (response.next_page_token().empty()) break;
    list.set_page_token(response.next_page_token());
  }
  ASSERT_EQ(listed.size(), ids.size());
  for (size_t i = 0; i < ids.size(); ++i) EXPECT_EQ(listed[i], ids[ids.size() - 1 - i]);

  // The metrics endpoint counted the calls.
  auto metrics = testing::HttpGet(daemon_->metrics_port(), "/metrics");
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  EXPECT_THAT(*metrics,
              HasSubstr("memplan_rpc_duration_seconds_count{code=\"OK\",method=\"Plan\"}"));
  EXPECT_THAT(*metrics, HasSubstr("memplan_stored_measurements 1"));

  StopDaemon();
}

TEST_F(PlannerE2ETest, HealthAndReflection) {
  StartDaemon();
  {
    auto health = grpc::health::v1::Health::NewStub(channel_);
    for (const std::string service : {"", "memplan.v1.Planner"}) {
      grpc::health::v1::HealthCheckRequest request;
      request.set_service(service);
      grpc::health::v1::HealthCheckResponse response;
      grpc::ClientContext context;
      const grpc::Status status = health->Check(&context, request, &response);
      ASSERT_TRUE(status.ok()) << service << ": " << status.error_message();
      EXPECT_EQ(response.status(), grpc::health::v1::HealthCheckResponse::SERVING) << service;
    }

    auto reflection = grpc::reflection::v1alpha::ServerReflection::NewStub(channel_);
    grpc::ClientContext context;
    auto stream = reflection->ServerReflectionInfo(&context);
    grpc::reflection::v1alpha::ServerReflectionRequest request;
    request.set_list_services("");
    ASSERT_TRUE(stream->Write(request));
    grpc::reflection::v1alpha::ServerReflectionResponse response;
    ASSERT_TRUE(stream->Read(&response));
    std::set<std::string> names;
    for (const auto& s : response.list_services_response().service()) names.insert(s.name());
    EXPECT_TRUE(names.count("memplan.v1.Planner")) << response.ShortDebugString();
    EXPECT_TRUE(names.count("grpc.health.v1.Health")) << response.ShortDebugString();

    // The Planner's schema is served too (what grpcurl needs to build requests).
    request.set_file_containing_symbol("memplan.v1.Planner");
    ASSERT_TRUE(stream->Write(request));
    ASSERT_TRUE(stream->Read(&response));
    EXPECT_GT(response.file_descriptor_response().file_descriptor_proto_size(), 0)
        << response.ShortDebugString();
    stream->WritesDone();
    EXPECT_TRUE(stream->Finish().ok());
  }  // the stubs hold the channel open
  StopDaemon();
}

TEST_F(PlannerE2ETest, BadInputsGetCleanCodesAndTheDaemonStaysUp) {
  StartDaemon();
  v1::PlanResponse response;

  v1::PlanRequest r = TinyRequest();
  *r.mutable_arch() = ToProto(*FindModelPreset("llama-tiny"));
  r.mutable_arch()->set_num_layers(0);
  grpc::Status status = Plan(r, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("arch.num_layers = 0"));
  EXPECT_THAT(status.error_message(), HasSubstr("[1, 4096]"));

  r = TinyRequest();
  r.set_optimizer("adam");
  status = Plan(r, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("adamw, adamw_bf16, sgd"));

  r = TinyRequest();
  r.set_arch_preset("no-such-model");
  status = Plan(r, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(status.error_message(), HasSubstr("llama-3.1-8b"));

  r = TinyRequest();
  r.set_trace_id("trace-ffffffffffffffff");
  EXPECT_EQ(Plan(r, &response).error_code(), grpc::StatusCode::NOT_FOUND);

  v1::ReportMeasurementResponse reported;
  status = Report("plan-ffffffffffffffff", kGiB, "", &reported);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(status.error_message(), HasSubstr("measurement.plan_id"));

  v1::PlanResponse good;
  ASSERT_TRUE(Plan(TinyRequest(), &good).ok());
  status = Report(good.plan_id(), -3, "", &reported);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("measurement.peak_reserved_bytes = -3"));

  // Garbage bytes on the Plan method: INVALID_ARGUMENT saying so (gRPC alone answers INTERNAL
  // with no message); the daemon is unaffected.
  {
    grpc::GenericStub generic(channel_);
    grpc::ClientContext context;
    const std::string junk = "\xff\xff\xff\xff\x0f\x12\x99";
    grpc::Slice slice(junk);
    grpc::ByteBuffer request(&slice, 1);
    grpc::ByteBuffer reply;
    grpc::CompletionQueue cq;
    auto call = generic.PrepareUnaryCall(&context, "/memplan.v1.Planner/Plan", request, &cq);
    call->StartCall();
    grpc::Status generic_status;
    call->Finish(&reply, &generic_status, reinterpret_cast<void*>(1));
    void* tag = nullptr;
    bool ok = false;
    ASSERT_TRUE(cq.Next(&tag, &ok));
    EXPECT_EQ(generic_status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(generic_status.error_message(), HasSubstr("request of Plan could not be decoded"));
    cq.Shutdown();
    while (cq.Next(&tag, &ok)) {
    }
  }
  ASSERT_TRUE(Plan(TinyRequest(), &good).ok());
  StopDaemon();
}

// `clients` threads, each on its own connection, make `calls` Plan RPCs each at the same time;
// returns the codes of the calls that failed (with their messages).
std::vector<std::string> ConcurrentPlans(const std::string& address, int clients, int calls,
                                         const v1::PlanRequest& request) {
  struct Barrier {
    int ready = 0;
    int clients = 0;
    bool Open() const { return ready >= clients; }
  };
  absl::Mutex mu;
  std::vector<std::string> failures;
  Barrier barrier{0, clients};
  std::vector<std::thread> threads;
  threads.reserve(clients);
  for (int c = 0; c < clients; ++c) {
    threads.emplace_back([&] {
      grpc::ChannelArguments args;
      args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);  // a connection per client
      auto channel = grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
      auto stub = v1::Planner::NewStub(channel);
      const bool connected =
          channel->WaitForConnected(std::chrono::system_clock::now() + std::chrono::seconds(30));
      {
        // Every client is connected before any calls, so the calls arrive together.
        absl::MutexLock lock(&mu);
        ++barrier.ready;
        mu.Await(absl::Condition(&barrier, &Barrier::Open));
        if (!connected) failures.push_back("could not connect");
      }
      for (int i = 0; i < calls && connected; ++i) {
        grpc::ClientContext context;
        context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
        v1::PlanResponse response;
        const grpc::Status status = stub->Plan(&context, request, &response);
        if (!status.ok()) {
          absl::MutexLock lock(&mu);
          failures.push_back(absl::StrCat(status.error_code(), ": ", status.error_message()));
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  return failures;
}

// With the default flags, 64 and then 256 simultaneous clients are all answered: calls beyond
// the handler threads wait in the queue instead of being refused ("Server Threadpool Exhausted").
TEST_F(PlannerE2ETest, ConcurrentPlanClientsAreQueuedNotRefused) {
  StartDaemon();
  for (const auto& [clients, calls] : {std::pair{64, 3}, std::pair{256, 2}}) {
    const std::vector<std::string> failures =
        ConcurrentPlans(daemon_->address(), clients, calls, TinyRequest());
    EXPECT_TRUE(failures.empty()) << clients << " clients: " << failures.size()
                                  << " calls failed, first: " << failures.front();
  }
  StopDaemon();
}

// A 3 MiB id or name from an unauthenticated client: INVALID_ARGUMENT naming the field (the
// client is not broken by a 3 MiB error in its metadata), nothing stored, the log not flooded.
TEST_F(PlannerE2ETest, OversizedFieldsAreRefusedWithoutEchoingThem) {
  StartDaemon();
  const std::string huge(3 << 20, 'z');
  v1::GetPlanRequest get;
  get.set_plan_id(huge);
  v1::GetPlanResponse got;
  grpc::ClientContext get_context;
  grpc::Status status = stub_->GetPlan(&get_context, get, &got);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();
  EXPECT_THAT(status.error_message(), HasSubstr("plan_id is 3145728 bytes; allowed at most 128"));

  v1::PlanRequest request = TinyRequest();
  request.clear_arch_preset();
  *request.mutable_arch() = ToProto(*FindModelPreset("llama-tiny"));
  request.mutable_arch()->set_name(huge);
  v1::PlanResponse response;
  status = Plan(request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();
  EXPECT_THAT(status.error_message(), HasSubstr("arch.name is 3145728 bytes; allowed at most 256"));
  EXPECT_LT(status.error_message().size(), 512u);

  v1::ListPlansRequest list;
  v1::ListPlansResponse listed;
  grpc::ClientContext list_context;
  ASSERT_TRUE(stub_->ListPlans(&list_context, list, &listed).ok());
  EXPECT_EQ(listed.plans_size(), 0);
  StopDaemon();
  EXPECT_LT(std::filesystem::file_size(log_path_), 64u << 10);
}

TEST_F(PlannerE2ETest, DataSurvivesARestart) {
  StartDaemon();
  v1::PlanResponse plan;
  ASSERT_TRUE(Plan(TinyRequest(), &plan).ok());
  v1::ReportMeasurementResponse reported;
  ASSERT_TRUE(Report(plan.plan_id(), plan.prediction().peak_bytes() * 2, "before", &reported).ok());
  HardwareSpec card = *FindHardwarePreset("rtx-3090");
  card.measured = true;
  card.gpu_memory_bytes = 10 * kGiB;
  v1::SubmitHardwareProfileRequest submit_hw;
  *submit_hw.mutable_profile() = ToProto(card);
  v1::SubmitHardwareProfileResponse hw_id;
  {
    grpc::ClientContext context;
    ASSERT_TRUE(stub_->SubmitHardwareProfile(&context, submit_hw, &hw_id).ok());
  }
  StopDaemon();  // SIGTERM: exit 0 asserted inside

  StartDaemon();
  v1::GetPlanResponse stored;
  ASSERT_TRUE(GetPlan(plan.plan_id(), &stored).ok());
  EXPECT_EQ(stored.plan().response().prediction().peak_bytes(), plan.prediction().peak_bytes());
  ASSERT_EQ(stored.plan().measurements_size(), 1);
  EXPECT_EQ(stored.plan().measurements(0).note(), "before");

  v1::GetCalibrationResponse calibrations;
  {
    grpc::ClientContext context;
    ASSERT_TRUE(stub_->GetCalibration(&context, {}, &calibrations).ok());
  }
  ASSERT_EQ(calibrations.calibrations_size(), 1);
  EXPECT_EQ(calibrations.calibrations(0).fragmentation_factor(),
            reported.calibration().fragmentation_factor());
  EXPECT_EQ(calibrations.calibrations(0).residual_bytes(), reported.calibration().residual_bytes());

  // The measured profile still supersedes the preset of its name after the restart, and the
  // calibration applies to the new plan.
  v1::PlanResponse after;
  ASSERT_TRUE(Plan(TinyRequest(), &after).ok());
  EXPECT_LT(after.capacity_bytes(), 10 * kGiB);
  EXPECT_EQ(after.prediction().breakdown().fragmentation_factor(),
            reported.calibration().fragmentation_factor());
  StopDaemon();
}

TEST_F(PlannerE2ETest, AcknowledgedMeasurementsSurviveKillDashNine) {
  StartDaemon();
  v1::PlanResponse plan;
  ASSERT_TRUE(Plan(TinyRequest(), &plan).ok());

  // A client reports as fast as it can; the daemon is SIGKILLed once 40 reports were acked,
  // with more still arriving.
  absl::Mutex mu;
  std::vector<std::string> acked;  // guarded by mu
  std::thread reporter([&] {
    for (int i = 0;; ++i) {
      v1::ReportMeasurementResponse response;
      const std::string note = absl::StrCat("run-", i);
      if (!Report(plan.plan_id(), kGiB + i, note, &response).ok()) return;
      absl::MutexLock lock(&mu);
      acked.push_back(note);
    }
  });
  {
    absl::MutexLock lock(&mu);
    mu.Await(absl::Condition(
        +[](std::vector<std::string>* v) { return v->size() >= 40; }, &acked));
  }
  auto killed = daemon_->SignalAndWait(SIGKILL);
  ASSERT_TRUE(killed.ok());
  EXPECT_TRUE(WIFSIGNALED(*killed));
  reporter.join();
  daemon_.reset();

  std::vector<std::string> acknowledged;
  {
    absl::MutexLock lock(&mu);
    acknowledged = acked;
  }
  ASSERT_GE(acknowledged.size(), 40u);

  StartDaemon();
  v1::GetPlanResponse stored;
  ASSERT_TRUE(GetPlan(plan.plan_id(), &stored).ok());
  std::set<std::string> notes;
  for (const v1::Measurement& m : stored.plan().measurements()) notes.insert(m.note());
  for (const std::string& note : acknowledged) {
    EXPECT_TRUE(notes.count(note)) << note << " was acknowledged but lost";
  }
  // At most the one report in flight at the kill may have landed without an ack.
  EXPECT_LE(notes.size(), acknowledged.size() + 1);
  std::printf("killed after %zu acknowledged reports; %zu stored after restart\n",
              acknowledged.size(), notes.size());
  StopDaemon();
}

TEST_F(PlannerE2ETest, HelpAndBadFlags) {
  auto help = testing::RunToCompletion(MEMPLAN_PLANNER_BINARY, {"--help"});
  ASSERT_TRUE(help.ok());
  EXPECT_TRUE(WIFEXITED(help->first) && WEXITSTATUS(help->first) == 0);
  EXPECT_THAT(help->second, HasSubstr("--listen"));
  EXPECT_THAT(help->second, HasSubstr("--metrics"));
  EXPECT_THAT(help->second, HasSubstr("--db"));

  auto bad = testing::RunToCompletion(MEMPLAN_PLANNER_BINARY, {"--frobnicate=1"});
  ASSERT_TRUE(bad.ok());
  EXPECT_TRUE(WIFEXITED(bad->first) && WEXITSTATUS(bad->first) == 2);
  EXPECT_THAT(bad->second, HasSubstr("unknown flag --frobnicate"));

  // A database path in a missing folder: a clear failure, not a crash.
  auto no_db = testing::RunToCompletion(
      MEMPLAN_PLANNER_BINARY,
      {"--listen=127.0.0.1:0", "--metrics=", "--db=" + dir_ + "/missing/folder/x.db"});
  ASSERT_TRUE(no_db.ok());
  EXPECT_TRUE(WIFEXITED(no_db->first) && WEXITSTATUS(no_db->first) == 1) << no_db->second;
  EXPECT_THAT(no_db->second, HasSubstr("opening the database"));
}

}  // namespace
}  // namespace memplan
