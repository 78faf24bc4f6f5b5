// The CLI runner against a fake Planner service on real loopback gRPC: checks the requests built
// from flags, the table and JSON outputs, and the exit status / message of each failure class.
#include "planner/cli/cli_runner.h"

#include <unistd.h>

#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/json_util.h"
#include "google/protobuf/util/message_differencer.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "memplan/v1/planner.grpc.pb.h"

namespace memplan::cli {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr int64_t kGiB = int64_t{1} << 30;

// Records what it receives; answers from canned messages. Thread-safe (gRPC threads).
class FakePlanner final : public v1::Planner::Service {
 public:
  grpc::Status Plan(grpc::ServerContext*, const v1::PlanRequest* request,
                    v1::PlanResponse* response) override {
    absl::MutexLock lock(&mu_);
    last_plan_ = *request;
    if (request->arch_preset() == "no-such-model") {
      return grpc::Status(grpc::StatusCode::NOT_FOUND,
                          "arch_preset 'no-such-model' is unknown; presets: llama-3.1-8b");
    }
    *response = CannedPlan();
    return grpc::Status::OK;
  }
  grpc::Status SubmitTrace(grpc::ServerContext*, const v1::SubmitTraceRequest* request,
                           v1::SubmitTraceResponse* response) override {
    absl::MutexLock lock(&mu_);
    last_trace_ = request->trace();
    response->set_trace_id("trace-42");
    return grpc::Status::OK;
  }
  grpc::Status ReportMeasurement(grpc::ServerContext*, const v1::ReportMeasurementRequest* request,
                                 v1::ReportMeasurementResponse* response) override {
    absl::MutexLock lock(&mu_);
    last_measurement_ = request->measurement();
    response->set_measurement_id("meas-1");
    response->set_relative_error(0.0125);
    response->mutable_calibration()->set_hardware_name("h100-80gb");
    response->mutable_calibration()->set_samples(1);
    return grpc::Status::OK;
  }
  grpc::Status GetPlan(grpc::ServerContext*, const v1::GetPlanRequest* request,
                       v1::GetPlanResponse* response) override {
    if (request->plan_id() != "plan-1") {
      return grpc::Status(grpc::StatusCode::NOT_FOUND,
                          absl::StrCat("plan_id '", request->plan_id(), "' not found"));
    }
    response->mutable_plan()->set_plan_id("plan-1");
    *response->mutable_plan()->mutable_response() = CannedPlan();
    return grpc::Status::OK;
  }
  // Three plans, pages of page_size (the token is the next index).
  grpc::Status ListPlans(grpc::ServerContext*, const v1::ListPlansRequest* request,
                         v1::ListPlansResponse* response) override {
    const int size = request->page_size() > 0 ? request->page_size() : 50;
    const int start = request->page_token().empty() ? 0 : std::stoi(request->page_token());
    for (int i = start; i < 3 && i < start + size; ++i) {
      response->add_plans()->set_plan_id(absl::StrCat("plan-", i));
    }
    if (start + size < 3) response->set_next_page_token(absl::StrCat(start + size));
    absl::MutexLock lock(&mu_);
    ++list_calls_;
    return grpc::Status::OK;
  }
  grpc::Status GetCalibration(grpc::ServerContext*, const v1::GetCalibrationRequest* request,
                              v1::GetCalibrationResponse* response) override {
    absl::MutexLock lock(&mu_);
    last_calibration_ = *request;
    return grpc::Status::OK;
  }
  grpc::Status ListPresets(grpc::ServerContext*, const v1::ListPresetsRequest*,
                           v1::ListPresetsResponse* response) override {
    response->add_models()->set_name("llama-3.1-8b");
    response->add_hardware()->set_name("rtx-4090");
    return grpc::Status::OK;
  }

  static v1::PlanResponse CannedPlan() {
    v1::PlanResponse r;
    r.set_fits(true);
    r.set_plan_id("plan-1");
    r.mutable_prediction()->set_peak_bytes(70 * kGiB);
    r.mutable_prediction()->set_tokens_per_second(1234);
    for (int i = 0; i < 12; ++i) r.mutable_plan()->add_block_modes(v1::BLOCK_MODE_CKPT);
    for (int i = 0; i < 4; ++i) r.mutable_plan()->add_block_modes(v1::BLOCK_MODE_NONE);
    return r;
  }

  v1::PlanRequest last_plan() {
    absl::MutexLock lock(&mu_);
    return last_plan_;
  }
  v1::Trace last_trace() {
    absl::MutexLock lock(&mu_);
    return last_trace_;
  }
  v1::Measurement last_measurement() {
    absl::MutexLock lock(&mu_);
    return last_measurement_;
  }
  v1::GetCalibrationRequest last_calibration() {
    absl::MutexLock lock(&mu_);
    return last_calibration_;
  }
  int list_calls() {
    absl::MutexLock lock(&mu_);
    return list_calls_;
  }

 private:
  absl::Mutex mu_;
  v1::PlanRequest last_plan_ ABSL_GUARDED_BY(mu_);
  v1::Trace last_trace_ ABSL_GUARDED_BY(mu_);
  v1::Measurement last_measurement_ ABSL_GUARDED_BY(mu_);
  v1::GetCalibrationRequest last_calibration_ ABSL_GUARDED_BY(mu_);
  int list_calls_ ABSL_GUARDED_BY(mu_) = 0;
};

struct Result {
  int exit_code;
  std::string out;
  std::string err;
};

class CliRunnerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    builder.RegisterService(&fake_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    ASSERT_GT(port_, 0);
  }
  void TearDown() override { server_->Shutdown(); }

  Result Run(std::vector<std::string> args) {
    args.insert(args.begin(), {"--planner", absl::StrCat("127.0.0.1:", port_)});
    std::ostringstream out;
    std::ostringstream err;
    const int code = RunCli(args, out, err);
    return {code, out.str(), err.str()};
  }

  std::string WriteTemp(const std::string& name, const std::string& text) {
    const std::string path = absl::StrCat(::testing::TempDir(), name, "_", ::getpid());
    std::ofstream(path) << text;
    temp_files_.push_back(path);
    return path;
  }
  ~CliRunnerTest() override {
    for (const std::string& path : temp_files_) std::remove(path.c_str());
  }

  FakePlanner fake_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
  std::vector<std::string> temp_files_;
};

TEST_F(CliRunnerTest, PlanSendsEveryFlagAndPrintsTheTable) {
  Result r = Run({"plan",
                  "--arch",
                  "llama-3.1-8b",
                  "--gpu",
                  "h100-80gb",
                  "--batch",
                  "2",
                  "--seq",
                  "2048",
                  "--dtype",
                  "fp16",
                  "--optimizer",
                  "sgd",
                  "--n-swap",
                  "0",
                  "--host-memory",
                  "pageable",
                  "--margin",
                  "0.1",
                  "--lora-rank",
                  "8",
                  "--lora-targets",
                  "q_proj,v_proj",
                  "--skip-limits"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const v1::PlanRequest req = fake_.last_plan();
  EXPECT_EQ(req.arch_preset(), "llama-3.1-8b");
  EXPECT_EQ(req.hardware_preset(), "h100-80gb");
  EXPECT_EQ(req.workload().micro_batch(), 2);
  EXPECT_EQ(req.workload().seq_len(), 2048);
  EXPECT_EQ(req.param_dtype(), v1::DTYPE_FP16);
  EXPECT_EQ(req.optimizer(), "sgd");
  EXPECT_TRUE(req.fixed().has_n_swap());  // fixed at 0, a constraint the planner must honour
  EXPECT_EQ(req.fixed().n_swap(), 0);
  EXPECT_FALSE(req.fixed().has_n_persist());
  EXPECT_EQ(req.fixed().host_memory(), v1::HOST_MEMORY_PAGEABLE);
  EXPECT_DOUBLE_EQ(req.safety_margin(), 0.1);
  EXPECT_EQ(req.training().kind(), v1::TrainingMethod::LORA);
  EXPECT_EQ(req.training().lora_rank(), 8);
  EXPECT_EQ(req.training().lora_target_modules_size(), 2);
  EXPECT_TRUE(req.skip_limits());
  EXPECT_THAT(r.out, HasSubstr("FITS"));
  EXPECT_THAT(r.out, HasSubstr("ckpt×12 none×4"));
  EXPECT_THAT(r.out, HasSubstr("70.00 GiB"));
  EXPECT_EQ(r.err, "");
}

TEST_F(CliRunnerTest, ImagesTravelInTheWorkload) {
  Result r = Run({"plan", "--arch", "llama-3.1-8b", "--gpu", "h100-80gb", "--images-per-sample",
                  "3", "--image-size", "448x224", "--skip-limits"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const v1::PlanRequest req = fake_.last_plan();
  EXPECT_EQ(req.workload().images_per_sample(), 3);
  EXPECT_EQ(req.workload().image_height(), 448);
  EXPECT_EQ(req.workload().image_width(), 224);
  // A text model has no tower to print (the planner would refuse its images).
  EXPECT_THAT(r.out, Not(HasSubstr("Vision tower")));
}

TEST_F(CliRunnerTest, TraceIdLeavesUnsetFieldsToTheTrace) {
  Result r = Run({"plan", "--trace-id", "trace-9", "--hardware-id", "hw-2"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  v1::PlanRequest req = fake_.last_plan();
  EXPECT_EQ(req.trace_id(), "trace-9");
  EXPECT_EQ(req.hardware_profile_id(), "hw-2");
  EXPECT_FALSE(req.has_workload());
  EXPECT_FALSE(req.has_training());
  EXPECT_EQ(req.param_dtype(), v1::DTYPE_UNSPECIFIED);

  r = Run({"plan", "--trace-id", "trace-9", "--gpu", "h100-80gb", "--batch", "2", "--seq", "512",
           "--dtype", "fp32"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  req = fake_.last_plan();
  ASSERT_TRUE(req.has_workload());
  EXPECT_EQ(req.workload().micro_batch(), 2);
  EXPECT_EQ(req.workload().seq_len(), 512);
  EXPECT_EQ(req.param_dtype(), v1::DTYPE_FP32);

  // Without a trace the defaults are sent explicitly.
  r = Run({"plan", "--arch", "llama-tiny", "--gpu", "h100-80gb"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  req = fake_.last_plan();
  EXPECT_EQ(req.workload().micro_batch(), 1);
  EXPECT_EQ(req.workload().seq_len(), 4096);
  EXPECT_EQ(req.param_dtype(), v1::DTYPE_BF16);
  EXPECT_EQ(req.training().kind(), v1::TrainingMethod::FULL);
}

TEST_F(CliRunnerTest, JsonIsTheProtoJsonOfTheReply) {
  Result r = Run({"plan", "--json", "--arch", "llama-3.1-8b", "--gpu", "h100-80gb"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  v1::PlanResponse parsed;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(r.out, &parsed).ok()) << r.out;
  EXPECT_TRUE(
      google::protobuf::util::MessageDifferencer::Equals(parsed, FakePlanner::CannedPlan()));
  EXPECT_THAT(r.out, HasSubstr("\"block_modes\""));  // proto field names, not camelCase
  EXPECT_THAT(r.out, HasSubstr("\"BLOCK_MODE_CKPT\""));
}

TEST_F(CliRunnerTest, ArchFileIsParsedIntoTheRequest) {
  const std::string config = WriteTemp("config.json", R"({
    "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 896,
    "intermediate_size": 4864, "num_attention_heads": 14, "num_hidden_layers": 24,
    "num_key_value_heads": 2, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
    "tie_word_embeddings": true, "vocab_size": 151936, "max_position_embeddings": 32768})");
  Result r = Run({"plan", "--arch-file", config, "--gpu", "rtx-4090"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const v1::PlanRequest req = fake_.last_plan();
  ASSERT_EQ(req.model_case(), v1::PlanRequest::kArch);
  EXPECT_EQ(req.arch().family(), "qwen2");
  EXPECT_EQ(req.arch().hidden_size(), 896);
  EXPECT_EQ(req.arch().num_layers(), 24);
  EXPECT_EQ(req.arch().num_kv_heads(), 2);
  EXPECT_TRUE(req.arch().tie_word_embeddings());

  Result bad = Run({"plan", "--arch-file", "/nonexistent/config.json", "--gpu", "rtx-4090"});
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_THAT(bad.err, HasSubstr("--arch-file /nonexistent/config.json"));
  const std::string broken = WriteTemp("broken.json", R"({"model_type": "llama"})");
  Result invalid = Run({"plan", "--arch-file", broken, "--gpu", "rtx-4090"});
  EXPECT_EQ(invalid.exit_code, 2);
  EXPECT_THAT(invalid.err, HasSubstr("--arch-file"));
}

TEST_F(CliRunnerTest, PlannerErrorsPrintCodeAndMessageAndExitOne) {
  Result plan = Run({"plan", "--arch", "no-such-model", "--gpu", "h100-80gb"});
  EXPECT_EQ(plan.exit_code, 1);
  EXPECT_THAT(plan.err, HasSubstr("Plan failed: NOT_FOUND: arch_preset 'no-such-model' is "
                                  "unknown; presets: llama-3.1-8b"));
  EXPECT_EQ(plan.out, "");
  Result get = Run({"plans", "get", "plan-missing"});
  EXPECT_EQ(get.exit_code, 1);
  EXPECT_THAT(get.err, HasSubstr("GetPlan failed: NOT_FOUND: plan_id 'plan-missing' not found"));
  // The fake does not implement GetTrace: the generated base answers UNIMPLEMENTED.
  Result trace = Run({"trace", "get", "trace-1"});
  EXPECT_EQ(trace.exit_code, 1);
  EXPECT_THAT(trace.err, HasSubstr("GetTrace failed: UNIMPLEMENTED"));
}

TEST_F(CliRunnerTest, UnreachablePlannerIsExplained) {
  std::ostringstream out;
  std::ostringstream err;
  // Port 1 on loopback: nothing listens there, the connection is refused at once.
  const int code = RunCli({"--planner", "127.0.0.1:1", "--timeout", "5", "presets"}, out, err);
  EXPECT_EQ(code, 1);
  EXPECT_THAT(err.str(), HasSubstr("cannot reach the planner at 127.0.0.1:1"));
  EXPECT_THAT(err.str(), HasSubstr("Is memplan-planner running"));
}

TEST_F(CliRunnerTest, UsageErrorsExitTwoWithoutCallingThePlanner) {
  Result r = Run({"plan", "--arch", "llama-3.1-8b", "--gpu", "h100-80gb", "--batch", "-1"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("--batch: -1 is outside [1, 65536]"));
  EXPECT_EQ(fake_.last_plan().arch_preset(), "");  // nothing was sent
  std::ostringstream out;
  std::ostringstream err;
  EXPECT_EQ(RunCli({}, out, err), 2);
  EXPECT_THAT(err.str(), HasSubstr("Usage: memplan"));
  Result help = Run({"measure", "--help"});
  EXPECT_EQ(help.exit_code, 0);
  EXPECT_THAT(help.out, HasSubstr("--peak-reserved"));
}

TEST_F(CliRunnerTest, MeasureSendsTheMeasurement) {
  Result r = Run({"measure", "--plan-id", "plan-1", "--peak-reserved", "71GiB", "--peak-allocated",
                  "68GiB", "--step-seconds", "1.5", "--note", "demo"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const v1::Measurement m = fake_.last_measurement();
  EXPECT_EQ(m.plan_id(), "plan-1");
  EXPECT_EQ(m.peak_reserved_bytes(), 71 * kGiB);
  EXPECT_EQ(m.peak_allocated_bytes(), 68 * kGiB);
  EXPECT_DOUBLE_EQ(m.step_seconds(), 1.5);
  EXPECT_EQ(m.note(), "demo");
  EXPECT_THAT(r.out, HasSubstr("meas-1"));
  EXPECT_THAT(r.out, HasSubstr("+1.2%"));
  EXPECT_THAT(r.out, HasSubstr("h100-80gb"));
}

TEST_F(CliRunnerTest, PlansListFollowsPagesWithAll) {
  Result one = Run({"plans", "list", "--page-size", "2"});
  ASSERT_EQ(one.exit_code, 0) << one.err;
  EXPECT_THAT(one.out, HasSubstr("plan-1"));
  EXPECT_THAT(one.out, Not(HasSubstr("plan-2")));
  EXPECT_THAT(one.out, HasSubstr("--page-token 2"));
  Result all = Run({"plans", "list", "--page-size", "2", "--all"});
  ASSERT_EQ(all.exit_code, 0) << all.err;
  EXPECT_THAT(all.out, HasSubstr("plan-0"));
  EXPECT_THAT(all.out, HasSubstr("plan-2"));
  EXPECT_THAT(all.out, Not(HasSubstr("--page-token")));
  EXPECT_EQ(fake_.list_calls(), 3);
}

TEST_F(CliRunnerTest, TraceSubmitReadsProtoJson) {
  const std::string trace = WriteTemp("trace.json", R"({"arch": {"name": "llama-tiny",
      "num_layers": 2}, "param_dtype": "DTYPE_BF16", "blocks": [{"param_bytes": "1024"}, {}]})");
  Result r = Run({"trace", "submit", trace});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("trace-42"));
  const v1::Trace sent = fake_.last_trace();
  EXPECT_EQ(sent.arch().name(), "llama-tiny");
  EXPECT_EQ(sent.blocks_size(), 2);
  EXPECT_EQ(sent.blocks(0).param_bytes(), 1024);

  const std::string bad = WriteTemp("bad.json", R"({"not_a_field": 1})");
  Result invalid = Run({"trace", "submit", bad});
  EXPECT_EQ(invalid.exit_code, 2);
  EXPECT_THAT(invalid.err, HasSubstr("not a memplan.v1.Trace in proto JSON"));
}

TEST_F(CliRunnerTest, CalibrationFiltersAndPresets) {
  Result r = Run({"calibration", "--hardware", "h100-80gb", "--dtype", "bf16"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(fake_.last_calibration().hardware_name(), "h100-80gb");
  EXPECT_EQ(fake_.last_calibration().param_dtype(), v1::DTYPE_BF16);
  EXPECT_THAT(r.out, HasSubstr("No calibration yet"));

  Result hw = Run({"hardware", "list"});
  ASSERT_EQ(hw.exit_code, 0) << hw.err;
  EXPECT_THAT(hw.out, HasSubstr("rtx-4090"));
  EXPECT_THAT(hw.out, Not(HasSubstr("llama-3.1-8b")));
  Result presets = Run({"presets"});
  ASSERT_EQ(presets.exit_code, 0) << presets.err;
  EXPECT_THAT(presets.out, HasSubstr("llama-3.1-8b"));
  EXPECT_THAT(presets.out, HasSubstr("rtx-4090"));
}

}  // namespace
}  // namespace memplan::cli
