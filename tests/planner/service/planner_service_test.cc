// The gRPC shell over an in-process channel: status conversion, codes on the wire, every call
// counted in the RPC histogram with its method and code, the bounded handler queue and
// undecodable requests.
#include "planner/service/planner_service.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "grpcpp/generic/generic_stub.h"
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
// Value of memplan_planner_rpc_refused_total{method, reason}.
double RefusedCount(prometheus::Registry& registry, const std::string& method,
                    const std::string& reason) {
  double count = 0;
  for (const prometheus::MetricFamily& family : registry.Collect()) {
    if (family.name != "memplan_planner_rpc_refused_total") continue;
    for (const prometheus::ClientMetric& metric : family.metric) {
      bool method_ok = false;
      bool reason_ok = false;
      for (const prometheus::ClientMetric::Label& label : metric.label) {
        method_ok |= label.name == "method" && label.value == method;
        reason_ok |= label.name == "reason" && label.value == reason;
      }
      if (method_ok && reason_ok) count += metric.counter.value;
    }
  }
  return count;
}

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
    StartServer({});
  }

  // (Re)starts the service and server as the daemon builds them, with `options`.
  void StartServer(const PlannerServiceOptions& options) {
    if (server_) server_->Shutdown();
    stub_.reset();
    server_.reset();
    service_ = std::make_unique<PlannerServiceImpl>(*core_, metrics_.get(), nullptr, options);
    grpc::ServerBuilder builder;
    builder.RegisterService(service_.get());
    std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> creators;
    creators.push_back(MakeUndecodableRequestInterceptorFactory(metrics_.get()));
    builder.experimental().SetInterceptorCreators(std::move(creators));
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    channel_ = server_->InProcessChannel(grpc::ChannelArguments());
    stub_ = v1::Planner::NewStub(channel_);
  }

  static v1::PlanRequest TinyRequest() {
    v1::PlanRequest request;
    request.set_arch_preset("llama-tiny");
    request.set_hardware_preset("rtx-3090");
    request.mutable_workload()->set_micro_batch(1);
    request.mutable_workload()->set_seq_len(256);
    request.set_skip_limits(true);
    return request;
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
  std::shared_ptr<grpc::Channel> channel_;
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

// One handler thread, no queue, and the search thread held: of two simultaneous Plans one waits
// in the handler, the other is refused RESOURCE_EXHAUSTED at once, naming the flag, and counted.
TEST_F(PlannerServiceTest, FullHandlerQueueRefusesAndCounts) {
  StartServer({.handler_threads = 1, .max_queued_calls = 0});
  absl::Notification release_search;
  ASSERT_TRUE(executor_->Submit([&] { release_search.WaitForNotification(); }).ok());

  absl::Mutex mu;
  int finished = 0;
  std::vector<grpc::Status> statuses(2);
  std::vector<std::thread> callers;
  for (int i = 0; i < 2; ++i) {
    callers.emplace_back([&, i] {
      v1::PlanResponse response;
      grpc::ClientContext context;
      statuses[i] = stub_->Plan(&context, TinyRequest(), &response);
      absl::MutexLock lock(&mu);
      ++finished;
    });
  }
  {
    // The refused call returns while the accepted one still waits for the held search thread.
    absl::MutexLock lock(&mu);
    mu.Await(absl::Condition(
        +[](int* n) { return *n >= 1; }, &finished));
  }
  release_search.Notify();
  for (std::thread& t : callers) t.join();

  int ok = 0;
  int refused = 0;
  for (const grpc::Status& status : statuses) {
    if (status.ok()) ++ok;
    if (status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) {
      ++refused;
      EXPECT_THAT(status.error_message(), HasSubstr("--max-queued-rpcs"));
    }
  }
  EXPECT_EQ(ok, 1);
  EXPECT_EQ(refused, 1);
  EXPECT_EQ(RefusedCount(*registry_, "Plan", "queue_full"), 1);
}

// A call whose client gave up while it waited for a handler thread is finished without running:
// no search, no stored plan, counted as cancelled_in_queue.
TEST_F(PlannerServiceTest, CallCancelledWhileQueuedDoesNotRun) {
  // The first search announces itself and then waits: from then on the first call holds the
  // only handler thread.
  absl::Notification search_started;
  absl::Notification release_search;
  PlannerCoreOptions options;
  options.now_seconds = [&] {
    if (!search_started.HasBeenNotified()) {
      search_started.Notify();
      release_search.WaitForNotification();
    }
    return 0.0;
  };
  auto core = PlannerCore::Create(*store_, *executor_, metrics_.get(), options);
  ASSERT_TRUE(core.ok());
  core_ = *std::move(core);  // no call is in flight on the fixture's server
  StartServer({.handler_threads = 1, .max_queued_calls = 8});
  grpc::Status first;
  std::thread holder([&] {
    // Holds the only handler thread until the search thread is released.
    v1::PlanResponse response;
    grpc::ClientContext context;
    first = stub_->Plan(&context, TinyRequest(), &response);
  });
  search_started.WaitForNotification();
  v1::PlanResponse response;
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
  const grpc::Status queued = stub_->Plan(&context, TinyRequest(), &response);
  EXPECT_EQ(queued.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  release_search.Notify();
  holder.join();
  EXPECT_TRUE(first.ok()) << first.error_message();
  server_->Shutdown();  // returns once every queued call has finished

  EXPECT_EQ(RefusedCount(*registry_, "Plan", "cancelled_in_queue"), 1);
  auto listed = core_->ListPlans(v1::ListPlansRequest());
  ASSERT_TRUE(listed.ok());
  EXPECT_EQ(listed->plans_size(), 1);
}

// Bytes that are not a PlanRequest: INVALID_ARGUMENT saying so (gRPC alone answers
// UNIMPLEMENTED or INTERNAL with no message), counted as refused "undecodable".
TEST_F(PlannerServiceTest, UndecodableRequestIsInvalidArgument) {
  grpc::GenericStub generic(channel_);
  grpc::ClientContext context;
  const std::string junk = "\xff\xff\xff\xff\x0f\x12\x99";
  grpc::Slice slice(junk);
  grpc::ByteBuffer request(&slice, 1);
  grpc::ByteBuffer reply;
  grpc::CompletionQueue cq;
  auto call = generic.PrepareUnaryCall(&context, "/memplan.v1.Planner/Plan", request, &cq);
  call->StartCall();
  grpc::Status status;
  call->Finish(&reply, &status, reinterpret_cast<void*>(1));
  void* tag = nullptr;
  bool ok = false;
  ASSERT_TRUE(cq.Next(&tag, &ok));
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("request of Plan could not be decoded"));
  EXPECT_EQ(RefusedCount(*registry_, "Plan", "undecodable"), 1);
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
  // The service keeps answering well-formed calls.
  v1::PlanResponse response;
  grpc::ClientContext context2;
  EXPECT_TRUE(stub_->Plan(&context2, TinyRequest(), &response).ok());
}

}  // namespace
}  // namespace memplan
