// The gRPC shell over an in-process channel: status conversion, codes on the wire, and every
// call counted in the RPC histogram with its method and code.
#include "planner/service/planner_service.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "grpcpp/grpcpp.h"
#include "planner/metrics/planner_metrics.h"
#include "planner/service/planner_core.h"
#include "planner/service/search_executor.h"
#include "planner/store/store.h"
#include "prometheus/client_metric.h"
#include "prometheus/metric_family.h"
#include "prometheus/registry.h"

namespace memplan {
namespace {

using ::testing::HasSubstr;

TEST(ToGrpcStatusTest, KeepsCodeAndMessage) {
  EXPECT_TRUE(ToGrpcStatus(absl::OkStatus()).ok());
  const struct {
    absl::Status in;
    grpc::StatusCode out;
  } cases[] = {
      {absl::InvalidArgumentError("a"), grpc::StatusCode::INVALID_ARGUMENT},
      {absl::NotFoundError("b"), grpc::StatusCode::NOT_FOUND},
      {absl::FailedPreconditionError("c"), grpc::StatusCode::FAILED_PRECONDITION},
      {absl::ResourceExhaustedError("d"), grpc::StatusCode::RESOURCE_EXHAUSTED},
      {absl::UnavailableError("e"), grpc::StatusCode::UNAVAILABLE},
      {absl::InternalError("f"), grpc::StatusCode::INTERNAL},
      {absl::AlreadyExistsError("g"), grpc::StatusCode::ALREADY_EXISTS},
      {absl::DataLossError("h"), grpc::StatusCode::DATA_LOSS},
  };
  for (const auto& c : cases) {
    const grpc::Status s = ToGrpcStatus(c.in);
    EXPECT_EQ(s.error_code(), c.out);
    EXPECT_EQ(s.error_message(), std::string(c.in.message()));
  }
}

// Sum of the sample counts of memplan_rpc_duration_seconds{method, code}.
uint64_t RpcCount(prometheus::Registry& registry, const std::string& method,
                  const std::string& code) {
  uint64_t count = 0;
  for (const prometheus::MetricFamily& family : registry.Collect()) {
    if (family.name != "memplan_rpc_duration_seconds") continue;
    for (const prometheus::ClientMetric& metric : family.metric) {
      bool method_ok = false;
      bool code_ok = false;
      for (const prometheus::ClientMetric::Label& label : metric.label) {
        method_ok |= label.name == "method" && label.value == method;
        code_ok |= label.name == "code" && label.value == code;
      }
      if (method_ok && code_ok) count += metric.histogram.sample_count;
    }
  }
  return count;
}

class PlannerServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    store_ = NewMemoryStore();
    registry_ = std::make_shared<prometheus::Registry>();
    metrics_ = std::make_unique<PlannerMetrics>(registry_);
    executor_ = std::make_unique<SearchExecutor>(SearchExecutor::Options{.threads = 1});
    auto core = PlannerCore::Create(*store_, *executor_, metrics_.get());
    ASSERT_TRUE(core.ok());
    core_ = *std::move(core);
    service_ = std::make_unique<PlannerServiceImpl>(*core_, metrics_.get());
    grpc::ServerBuilder builder;
    builder.RegisterService(service_.get());
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    stub_ = v1::Planner::NewStub(server_->InProcessChannel(grpc::ChannelArguments()));
  }

  void TearDown() override {
    if (server_) server_->Shutdown();
  }

  std::unique_ptr<Store> store_;
  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<PlannerMetrics> metrics_;
  std::unique_ptr<SearchExecutor> executor_;
  std::unique_ptr<PlannerCore> core_;
  std::unique_ptr<PlannerServiceImpl> service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<v1::Planner::Stub> stub_;
};

TEST_F(PlannerServiceTest, PlanOverTheWireAndCounted) {
  v1::PlanRequest request;
  request.set_arch_preset("llama-tiny");
  request.set_hardware_preset("rtx-3090");
  request.mutable_workload()->set_micro_batch(1);
  request.mutable_workload()->set_seq_len(256);
  request.set_skip_limits(true);
  v1::PlanResponse response;
  grpc::ClientContext context;
  const grpc::Status status = stub_->Plan(&context, request, &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_FALSE(response.plan_id().empty());
  EXPECT_EQ(RpcCount(*registry_, "Plan", "OK"), 1u);
}

TEST_F(PlannerServiceTest, ErrorsKeepTheirCodeAndMessageOnTheWire) {
  v1::PlanRequest request;
  request.set_arch_preset("llama-tiny");
  request.set_hardware_preset("rtx-3090");
  request.mutable_workload()->set_micro_batch(1);
  request.mutable_workload()->set_seq_len(256);
  request.set_optimizer("lion");
  v1::PlanResponse response;
  grpc::ClientContext context;
  grpc::Status status = stub_->Plan(&context, request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("adamw, adamw_bf16, sgd"));
  EXPECT_EQ(RpcCount(*registry_, "Plan", "INVALID_ARGUMENT"), 1u);

  v1::GetPlanRequest get;
  get.set_plan_id("plan-none");
  v1::GetPlanResponse got;
  grpc::ClientContext context2;
  status = stub_->GetPlan(&context2, get, &got);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(RpcCount(*registry_, "GetPlan", "NOT_FOUND"), 1u);
}

}  // namespace
}  // namespace memplan
