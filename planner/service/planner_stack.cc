#include "planner/service/planner_stack.h"

#include <algorithm>
#include <thread>
#include <utility>
#include <vector>

#include "absl/memory/memory.h"
#include "common/status.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/resource_quota.h"

namespace memplan {
namespace {

constexpr int kMaxSyncServiceThreads = 16;

int DefaultSearchThreads() {
  const unsigned cpus = std::thread::hardware_concurrency();
  return static_cast<int>(std::clamp(cpus == 0 ? 1u : cpus, 1u, 16u));
}

}  // namespace

absl::StatusOr<std::unique_ptr<PlannerStack>> PlannerStack::Create(
    Store& store, PlannerMetrics* metrics, const WriteAuthorizer* authorizer,
    const PlannerStackOptions& options) {
  auto stack = absl::WrapUnique(new PlannerStack());
  stack->metrics_ = metrics;
  SearchExecutor::Options executor_options;
  executor_options.threads =
      options.search_threads > 0 ? options.search_threads : DefaultSearchThreads();
  executor_options.max_queued = options.max_queued_searches;
  stack->executor_ = std::make_unique<SearchExecutor>(executor_options);
  ASSIGN_OR_RETURN(stack->core_,
                   PlannerCore::Create(store, *stack->executor_, metrics, options.core));
  stack->service_ =
      std::make_unique<PlannerServiceImpl>(*stack->core_, metrics, authorizer, options.service);
  return stack;
}

PlannerStack::~PlannerStack() {
  // The service's queued calls use the core, whose searches run on the executor.
  service_.reset();
  core_.reset();
  executor_.reset();
}

void PlannerStack::AddTo(grpc::ServerBuilder* builder) {
  builder->RegisterService(service_.get());
  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> interceptors;
  interceptors.push_back(MakeUndecodableRequestInterceptorFactory(metrics_));
  builder->experimental().SetInterceptorCreators(std::move(interceptors));
  // Server reflection and health are sync services, served by threads of gRPC's own pool; this
  // caps them (the callback services do not draw on it). The builder keeps its own reference.
  grpc::ResourceQuota quota("memplan-planner");
  quota.SetMaxThreads(kMaxSyncServiceThreads);
  builder->SetResourceQuota(quota);
}

}  // namespace memplan
