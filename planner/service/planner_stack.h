// The planner's engine as one piece: the search executor, PlannerCore over a store, and the gRPC
// service, built in that order and destroyed in reverse. memplan-planner serves it on its port
// (planner/daemon); the `memplan` CLI serves it on a server with no port and talks to it through
// an in-process channel (planner/cli), so both answer with the same code. Thread-safe after
// Create.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "planner/service/planner_core.h"
#include "planner/service/planner_service.h"
#include "planner/service/search_executor.h"

namespace grpc {
class ServerBuilder;
}  // namespace grpc

namespace memplan {

class PlannerMetrics;
class Store;
class WriteAuthorizer;

struct PlannerStackOptions {
  int search_threads = 0;  // 0: one per CPU, at most 16
  int max_queued_searches = 256;
  PlannerCoreOptions core;
  PlannerServiceOptions service;
};

class PlannerStack {
 public:
  // `store` must outlive the stack; `metrics` and `authorizer` may be null (no metrics; writes
  // open) and must outlive it too.
  static absl::StatusOr<std::unique_ptr<PlannerStack>> Create(Store& store, PlannerMetrics* metrics,
                                                              const WriteAuthorizer* authorizer,
                                                              const PlannerStackOptions& options);
  ~PlannerStack();  // runs every queued call, then joins the search threads
  PlannerStack(const PlannerStack&) = delete;
  PlannerStack& operator=(const PlannerStack&) = delete;

  // Registers the Planner service on `builder` with what every server of it needs: the
  // interceptor that names undecodable requests, and a cap on gRPC's own sync-service threads.
  // Shut the built server down before destroying the stack.
  void AddTo(grpc::ServerBuilder* builder);

  PlannerCore& core() { return *core_; }
  int search_threads() const { return executor_->threads(); }

 private:
  PlannerStack() = default;

  PlannerMetrics* metrics_ = nullptr;
  std::unique_ptr<SearchExecutor> executor_;
  std::unique_ptr<PlannerCore> core_;
  std::unique_ptr<PlannerServiceImpl> service_;
};

}  // namespace memplan
