// The gRPC shell of memplan.v1.Planner (callback API): each call is queued on the service's own
// bounded handler pool, which forwards it to PlannerCore, converts the absl::Status once
// (ToGrpcStatus), records the call in PlannerMetrics and logs it. A full queue answers
// RESOURCE_EXHAUSTED, counted in memplan_planner_rpc_refused_total. No handler lets an exception
// escape (it becomes INTERNAL). Thread-safe.
#pragma once

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/support/server_interceptor.h"
#include "memplan/v1/planner.grpc.pb.h"
#include "planner/service/search_executor.h"

namespace memplan {

class PlannerCore;
class PlannerMetrics;
class WriteAuthorizer;

// The one place where absl::Status becomes grpc::Status (codes map one to one).
grpc::Status ToGrpcStatus(const absl::Status& status);

// gRPC fails a call whose request bytes do not parse before any handler runs (INTERNAL with no
// message in the sync API, UNIMPLEMENTED in the callback API). This interceptor turns that into
// INVALID_ARGUMENT naming the method, counted as memplan_planner_rpc_refused_total{method,
// reason="undecodable"}. `metrics` may be null and must outlive the server.
std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>
MakeUndecodableRequestInterceptorFactory(PlannerMetrics* metrics);

struct PlannerServiceOptions {
  // Threads that run handlers (validation, store reads and writes; Plan waits there for the
  // search executor). At least 1.
  int handler_threads = 16;
  // Calls that may wait for a handler thread; beyond that a call is refused RESOURCE_EXHAUSTED.
  int max_queued_calls = 1024;
};

class PlannerServiceImpl final : public v1::Planner::CallbackService {
 public:
  // `core` must outlive the service; `metrics` may be null. `authorizer` (may be null: writes
  // open) decides who may call SubmitTrace, SubmitHardwareProfile and ReportMeasurement.
  // Destruction runs every queued call, so shut the server down first.
  PlannerServiceImpl(PlannerCore& core, PlannerMetrics* metrics,
                     const WriteAuthorizer* authorizer = nullptr,
                     const PlannerServiceOptions& options = {});

  grpc::ServerUnaryReactor* Plan(grpc::CallbackServerContext* context,
                                 const v1::PlanRequest* request,
                                 v1::PlanResponse* response) override;
  grpc::ServerUnaryReactor* SubmitTrace(grpc::CallbackServerContext* context,
                                        const v1::SubmitTraceRequest* request,
                                        v1::SubmitTraceResponse* response) override;
  grpc::ServerUnaryReactor* SubmitHardwareProfile(
      grpc::CallbackServerContext* context, const v1::SubmitHardwareProfileRequest* request,
      v1::SubmitHardwareProfileResponse* response) override;
  grpc::ServerUnaryReactor* ReportMeasurement(grpc::CallbackServerContext* context,
                                              const v1::ReportMeasurementRequest* request,
                                              v1::ReportMeasurementResponse* response) override;
  grpc::ServerUnaryReactor* GetPlan(grpc::CallbackServerContext* context,
                                    const v1::GetPlanRequest* request,
                                    v1::GetPlanResponse* response) override;
  grpc::ServerUnaryReactor* ListPlans(grpc::CallbackServerContext* context,
                                      const v1::ListPlansRequest* request,
                                      v1::ListPlansResponse* response) override;
  grpc::ServerUnaryReactor* GetCalibration(grpc::CallbackServerContext* context,
                                           const v1::GetCalibrationRequest* request,
                                           v1::GetCalibrationResponse* response) override;
  grpc::ServerUnaryReactor* ListPresets(grpc::CallbackServerContext* context,
                                        const v1::ListPresetsRequest* request,
                                        v1::ListPresetsResponse* response) override;
  grpc::ServerUnaryReactor* GetTrace(grpc::CallbackServerContext* context,
                                     const v1::GetTraceRequest* request,
                                     v1::GetTraceResponse* response) override;
  grpc::ServerUnaryReactor* GetHardwareProfile(grpc::CallbackServerContext* context,
                                               const v1::GetHardwareProfileRequest* request,
                                               v1::GetHardwareProfileResponse* response) override;
  grpc::ServerUnaryReactor* Admit(grpc::CallbackServerContext* context,
                                  const v1::AdmitRequest* request,
                                  v1::AdmitResponse* response) override;

 private:
  // Queues `call` (returning absl::StatusOr<Response>) on the handler pool and returns the
  // reactor it finishes; a full queue finishes it at once with RESOURCE_EXHAUSTED.
  template <typename Call, typename Response>
  grpc::ServerUnaryReactor* Dispatch(absl::string_view method, grpc::CallbackServerContext* context,
                                     Call call, Response* response);

  // Runs `call`, times it and converts its outcome.
  template <typename Call, typename Response>
  grpc::Status Handle(absl::string_view method, grpc::ServerContextBase* context, Call call,
                      Response* response);

  // The caller's identity for a write RPC, or UNAUTHENTICATED / PERMISSION_DENIED (counted in
  // memplan_rpc_rejected_total).
  absl::StatusOr<std::string> AuthorizeWrite(absl::string_view method,
                                             const grpc::ServerContextBase& context);

  PlannerCore& core_;
  PlannerMetrics* const metrics_;
  const WriteAuthorizer* const authorizer_;
  // Declared last: destroyed (draining its queue) before the members its tasks use.
  SearchExecutor handlers_;
};

}  // namespace memplan
