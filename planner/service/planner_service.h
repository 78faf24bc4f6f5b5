// The gRPC shell of memplan.v1.Planner: each handler forwards to PlannerCore, converts the
// absl::Status once (ToGrpcStatus), records the call in PlannerMetrics and logs it. No handler
// lets an exception escape (it becomes INTERNAL). Thread-safe.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "grpcpp/grpcpp.h"
#include "memplan/v1/planner.grpc.pb.h"

namespace memplan {

class PlannerCore;
class PlannerMetrics;
class WriteAuthorizer;

// The one place where absl::Status becomes grpc::Status (codes map one to one).
grpc::Status ToGrpcStatus(const absl::Status& status);

class PlannerServiceImpl final : public v1::Planner::Service {
 public:
  // `core` must outlive the service; `metrics` may be null. `authorizer` (may be null: writes
  // open) decides who may call SubmitTrace, SubmitHardwareProfile and ReportMeasurement.
  PlannerServiceImpl(PlannerCore& core, PlannerMetrics* metrics,
                     const WriteAuthorizer* authorizer = nullptr);

  grpc::Status Plan(grpc::ServerContext* context, const v1::PlanRequest* request,
                    v1::PlanResponse* response) override;
  grpc::Status SubmitTrace(grpc::ServerContext* context, const v1::SubmitTraceRequest* request,
                           v1::SubmitTraceResponse* response) override;
  grpc::Status SubmitHardwareProfile(grpc::ServerContext* context,
                                     const v1::SubmitHardwareProfileRequest* request,
                                     v1::SubmitHardwareProfileResponse* response) override;
  grpc::Status ReportMeasurement(grpc::ServerContext* context,
                                 const v1::ReportMeasurementRequest* request,
                                 v1::ReportMeasurementResponse* response) override;
  grpc::Status GetPlan(grpc::ServerContext* context, const v1::GetPlanRequest* request,
                       v1::GetPlanResponse* response) override;
  grpc::Status ListPlans(grpc::ServerContext* context, const v1::ListPlansRequest* request,
                         v1::ListPlansResponse* response) override;
  grpc::Status GetCalibration(grpc::ServerContext* context,
                              const v1::GetCalibrationRequest* request,
                              v1::GetCalibrationResponse* response) override;
  grpc::Status ListPresets(grpc::ServerContext* context, const v1::ListPresetsRequest* request,
                           v1::ListPresetsResponse* response) override;
  grpc::Status GetTrace(grpc::ServerContext* context, const v1::GetTraceRequest* request,
                        v1::GetTraceResponse* response) override;
  grpc::Status GetHardwareProfile(grpc::ServerContext* context,
                                  const v1::GetHardwareProfileRequest* request,
                                  v1::GetHardwareProfileResponse* response) override;
  grpc::Status Admit(grpc::ServerContext* context, const v1::AdmitRequest* request,
                     v1::AdmitResponse* response) override;

 private:
  // Runs `call` (returning absl::StatusOr<Response>), times it and converts its outcome.
  template <typename Call, typename Response>
  grpc::Status Handle(absl::string_view method, grpc::ServerContext* context, Call call,
                      Response* response);

  // The caller's identity for a write RPC, or UNAUTHENTICATED / PERMISSION_DENIED (counted in
  // memplan_rpc_rejected_total).
  absl::StatusOr<std::string> AuthorizeWrite(absl::string_view method,
                                             const grpc::ServerContext& context);

  PlannerCore& core_;
  PlannerMetrics* const metrics_;
  const WriteAuthorizer* const authorizer_;
};

}  // namespace memplan
