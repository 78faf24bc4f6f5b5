#include "planner/service/planner_service.h"

#include <chrono>
#include <exception>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/grpc_credentials.h"
#include "common/log.h"
#include "common/status.h"
#include "planner/metrics/planner_metrics.h"
#include "planner/service/planner_core.h"
#include "planner/service/write_authorizer.h"

namespace memplan {
namespace {

// absl::StatusCode and grpc::StatusCode share their numbering (both follow google.rpc.Code), but
// spelling the mapping out keeps a future divergence from passing silently.
grpc::StatusCode ToGrpcCode(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kOk:
      return grpc::StatusCode::OK;
    case absl::StatusCode::kCancelled:
      return grpc::StatusCode::CANCELLED;
    case absl::StatusCode::kUnknown:
      return grpc::StatusCode::UNKNOWN;
    case absl::StatusCode::kInvalidArgument:
      return grpc::StatusCode::INVALID_ARGUMENT;
    case absl::StatusCode::kDeadlineExceeded:
      return grpc::StatusCode::DEADLINE_EXCEEDED;
    case absl::StatusCode::kNotFound:
      return grpc::StatusCode::NOT_FOUND;
    case absl::StatusCode::kAlreadyExists:
      return grpc::StatusCode::ALREADY_EXISTS;
    case absl::StatusCode::kPermissionDenied:
      return grpc::StatusCode::PERMISSION_DENIED;
    case absl::StatusCode::kResourceExhausted:
      return grpc::StatusCode::RESOURCE_EXHAUSTED;
    case absl::StatusCode::kFailedPrecondition:
      return grpc::StatusCode::FAILED_PRECONDITION;
    case absl::StatusCode::kAborted:
      return grpc::StatusCode::ABORTED;
    case absl::StatusCode::kOutOfRange:
      return grpc::StatusCode::OUT_OF_RANGE;
    case absl::StatusCode::kUnimplemented:
      return grpc::StatusCode::UNIMPLEMENTED;
    case absl::StatusCode::kInternal:
      return grpc::StatusCode::INTERNAL;
    case absl::StatusCode::kUnavailable:
      return grpc::StatusCode::UNAVAILABLE;
    case absl::StatusCode::kDataLoss:
      return grpc::StatusCode::DATA_LOSS;
    case absl::StatusCode::kUnauthenticated:
      return grpc::StatusCode::UNAUTHENTICATED;
    default:
      return grpc::StatusCode::UNKNOWN;
  }
}

// The authorization header, the verified client certificate and the peer of a call.
CallerCredentials CredentialsOf(const grpc::ServerContextBase& context) {
  CallerCredentials credentials;
  const auto& metadata = context.client_metadata();
  if (auto it = metadata.find(kAuthorizationMetadataKey); it != metadata.end()) {
    credentials.authorization = std::string(it->second.data(), it->second.size());
  }
  // Only a certificate that the handshake verified against --tls-client-ca counts.
  const std::shared_ptr<const grpc::AuthContext> auth = context.auth_context();
  if (auth != nullptr && auth->IsPeerAuthenticated()) {
    const std::vector<grpc::string_ref> identity = auth->GetPeerIdentity();
    if (!identity.empty()) {
      credentials.certificate_identity = std::string(identity[0].data(), identity[0].size());
    }
  }
  credentials.peer = context.peer();
  return credentials;
}

// "/memplan.v1.Planner/Plan" -> "Plan": the label the handlers use.
std::string MethodLabel(const char* full_name) {
  if (full_name == nullptr) return "unknown";
  const absl::string_view name(full_name);
  const size_t slash = name.rfind('/');
  return std::string(slash == absl::string_view::npos ? name : name.substr(slash + 1));
}

// See MakeUndecodableRequestInterceptorFactory. One per call; gRPC runs its hooks in order.
class UndecodableRequestInterceptor final : public grpc::experimental::Interceptor {
 public:
  UndecodableRequestInterceptor(std::string method, PlannerMetrics* metrics)
      : method_(std::move(method)), metrics_(metrics) {}

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    using grpc::experimental::InterceptionHookPoints;
    if (methods->QueryInterceptionHookPoint(InterceptionHookPoints::POST_RECV_MESSAGE) &&
        methods->GetRecvMessage() == nullptr) {
      undecodable_ = true;
    }
    if (undecodable_ &&
        methods->QueryInterceptionHookPoint(InterceptionHookPoints::PRE_SEND_STATUS)) {
      // A refusal for lack of resources also arrives without a message; only a parse failure
      // is re-worded.
      const grpc::Status status = methods->GetSendStatus();
      if (status.error_code() == grpc::StatusCode::INTERNAL ||
          status.error_code() == grpc::StatusCode::UNIMPLEMENTED) {
        methods->ModifySendStatus(grpc::Status(
            grpc::StatusCode::INVALID_ARGUMENT,
            absl::StrCat("the request of ", method_,
                         " could not be decoded as its protobuf message (malformed or truncated "
                         "bytes, or a field of the wrong wire type)")));
        if (metrics_ != nullptr) metrics_->RpcRefused(method_, "undecodable");
        MEMPLAN_LOG(kWarning, "rpc refused")
            .Field("method", method_)
            .Field("reason", "undecodable");
      }
    }
    methods->Proceed();
  }

 private:
  const std::string method_;
  PlannerMetrics* const metrics_;
  bool undecodable_ = false;
};

class UndecodableRequestInterceptorFactory final
    : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  explicit UndecodableRequestInterceptorFactory(PlannerMetrics* metrics) : metrics_(metrics) {}
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override {
    return new UndecodableRequestInterceptor(MethodLabel(info->method()), metrics_);
  }

 private:
  PlannerMetrics* const metrics_;
};

}  // namespace

std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>
MakeUndecodableRequestInterceptorFactory(PlannerMetrics* metrics) {
  return std::make_unique<UndecodableRequestInterceptorFactory>(metrics);
}

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(ToGrpcCode(status.code()), std::string(status.message()));
}

PlannerServiceImpl::PlannerServiceImpl(PlannerCore& core, PlannerMetrics* metrics,
                                       const WriteAuthorizer* authorizer,
                                       const PlannerServiceOptions& options)
    : core_(core),
      metrics_(metrics),
      authorizer_(authorizer),
      handlers_(SearchExecutor::Options{.threads = options.handler_threads,
                                        .max_queued = options.max_queued_calls}) {}

absl::StatusOr<std::string> PlannerServiceImpl::AuthorizeWrite(
    absl::string_view method, const grpc::ServerContextBase& context) {
  const CallerCredentials credentials = CredentialsOf(context);
  if (authorizer_ == nullptr) return absl::StrCat("peer:", PeerHost(credentials.peer));
  absl::StatusOr<std::string> caller = authorizer_->AuthorizeWrite(method, credentials);
  if (!caller.ok() && metrics_ != nullptr) {
    metrics_->RpcRejected(method, absl::StatusCodeToString(caller.status().code()));
  }
  return caller;
}

template <typename Call, typename Response>
grpc::ServerUnaryReactor* PlannerServiceImpl::Dispatch(absl::string_view method,
                                                       grpc::CallbackServerContext* context,
                                                       Call call, Response* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  // Callback threads belong to gRPC's event engine and must not block on SQLite or a search, so
  // the call waits in the handler pool's queue instead; the request, response and context stay
  // valid until Finish.
  const absl::Status queued = handlers_.Submit(
      [this, method, context, call = std::move(call), response, reactor]() mutable {
        // A call whose client gave up, or that shutdown cancelled after its grace period, while
        // it waited is not worth a search; finishing it at once also lets shutdown drain the
        // queue quickly.
        if (context->IsCancelled()) {
          if (metrics_ != nullptr) metrics_->RpcRefused(method, "cancelled_in_queue");
          reactor->Finish(grpc::Status(grpc::StatusCode::CANCELLED,
                                       "cancelled while waiting for a handler thread"));
          return;
        }
        reactor->Finish(Handle(method, context, std::move(call), response));
      });
  if (!queued.ok()) {
    const absl::Status refused =
        queued.code() == absl::StatusCode::kResourceExhausted
            ? absl::ResourceExhaustedError(
                  absl::StrCat("the planner has ", handlers_.max_queued(),
                               " calls waiting (--max-queued-rpcs); retry with backoff"))
            : queued;
    if (metrics_ != nullptr) {
      metrics_->RpcRefused(method, refused.code() == absl::StatusCode::kResourceExhausted
                                       ? "queue_full"
                                       : "shutting_down");
      metrics_->ObserveRpc(method, absl::StatusCodeToString(refused.code()), 0);
    }
    MEMPLAN_LOG(kWarning, "rpc refused")
        .Field("method", std::string(method))
        .Field("peer", context->peer())
        .Field("error", std::string(refused.message()));
    reactor->Finish(ToGrpcStatus(refused));
  }
  return reactor;
}

template <typename Call, typename Response>
grpc::Status PlannerServiceImpl::Handle(absl::string_view method, grpc::ServerContextBase* context,
                                        Call call, Response* response) {
  const auto start = std::chrono::steady_clock::now();
  absl::Status status;
  // An exception escaping a sync handler would take the call (or the process) down with an
  // unhelpful code; the core is not expected to throw, but allocation failure and third-party
  // code can.
  try {
    auto result = call();
    if (result.ok()) {
      *response = *std::move(result);
    } else {
      status = result.status();
    }
  } catch (const std::exception& e) {
    status = absl::InternalError(absl::StrCat(method, " failed: ", e.what()));
  } catch (...) {
    status = absl::InternalError(absl::StrCat(method, " failed with an unknown exception"));
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const std::string code = absl::StatusCodeToString(status.code());
  if (metrics_ != nullptr) metrics_->ObserveRpc(method, code, seconds);
  if (status.ok()) {
    MEMPLAN_LOG(kDebug, "rpc")
        .Field("method", std::string(method))
        .Field("code", code)
        .Field("ms", seconds * 1e3)
        .Field("peer", context->peer());
  } else {
    MEMPLAN_LOG(kWarning, "rpc failed")
        .Field("method", std::string(method))
        .Field("code", code)
        .Field("ms", seconds * 1e3)
        .Field("peer", context->peer())
        .Field("error", std::string(status.message()));
  }
  return ToGrpcStatus(status);
}

grpc::ServerUnaryReactor* PlannerServiceImpl::Plan(grpc::CallbackServerContext* context,
                                                   const v1::PlanRequest* request,
                                                   v1::PlanResponse* response) {
  return Dispatch(
      "Plan", context, [=, this] { return core_.Plan(*request); }, response);
}

grpc::ServerUnaryReactor* PlannerServiceImpl::SubmitTrace(grpc::CallbackServerContext* context,
                                                          const v1::SubmitTraceRequest* request,
                                                          v1::SubmitTraceResponse* response) {
  return Dispatch(
      "SubmitTrace", context,
      [=, this]() -> absl::StatusOr<v1::SubmitTraceResponse> {
        RETURN_IF_ERROR(AuthorizeWrite("SubmitTrace", *context).status());
        return core_.SubmitTrace(*request);
      },
      response);
}

grpc::ServerUnaryReactor* PlannerServiceImpl::SubmitHardwareProfile(
    grpc::CallbackServerContext* context, const v1::SubmitHardwareProfileRequest* request,
    v1::SubmitHardwareProfileResponse* response) {
  return Dispatch(
      "SubmitHardwareProfile", context,
      [=, this]() -> absl::StatusOr<v1::SubmitHardwareProfileResponse> {
        RETURN_IF_ERROR(AuthorizeWrite("SubmitHardwareProfile", *context).status());
        return core_.SubmitHardwareProfile(*request);
      },
      response);
}

grpc::ServerUnaryReactor* PlannerServiceImpl::ReportMeasurement(
    grpc::CallbackServerContext* context, const v1::ReportMeasurementRequest* request,
    v1::ReportMeasurementResponse* response) {
  return Dispatch(
      "ReportMeasurement", context,
      [=, this]() -> absl::StatusOr<v1::ReportMeasurementResponse> {
        PlannerCore::MeasurementSource source;
        ASSIGN_OR_RETURN(source.reported_by, AuthorizeWrite("ReportMeasurement", *context));
        // Agents may share a token: the burst check counts per token and host.
        source.client = absl::StartsWith(source.reported_by, "peer:")
                            ? source.reported_by
                            : absl::StrCat(source.reported_by, " from ", PeerHost(context->peer()));
        return core_.ReportMeasurement(*request, source);
      },
      response);
}

grpc::ServerUnaryReactor* PlannerServiceImpl::GetPlan(grpc::CallbackServerContext* context,
                                                      const v1::GetPlanRequest* request,
                                                      v1::GetPlanResponse* response) {
  return Dispatch(
      "GetPlan", context, [=, this] { return core_.GetPlan(*request); }, response);
}

grpc::ServerUnaryReactor* PlannerServiceImpl::ListPlans(grpc::CallbackServerContext* context,
                                                        const v1::ListPlansRequest* request,
                                                        v1::ListPlansResponse* response) {
  return Dispatch(
      "ListPlans", context, [=, this] { return core_.ListPlans(*request); }, response);
}

grpc::ServerUnaryReactor* PlannerServiceImpl::GetCalibration(
    grpc::CallbackServerContext* context, const v1::GetCalibrationRequest* request,
    v1::GetCalibrationResponse* response) {
  return Dispatch(
      "GetCalibration", context, [=, this] { return core_.GetCalibration(*request); }, response);
}

grpc::ServerUnaryReactor* PlannerServiceImpl::ListPresets(grpc::CallbackServerContext* context,
                                                          const v1::ListPresetsRequest* request,
                                                          v1::ListPresetsResponse* response) {
  return Dispatch(
      "ListPresets", context, [=, this] { return core_.ListPresets(*request); }, response);
}

grpc::ServerUnaryReactor* PlannerServiceImpl::GetTrace(grpc::CallbackServerContext* context,
                                                       const v1::GetTraceRequest* request,
                                                       v1::GetTraceResponse* response) {
  return Dispatch(
      "GetTrace", context, [=, this] { return core_.GetTrace(*request); }, response);
}

grpc::ServerUnaryReactor* PlannerServiceImpl::GetHardwareProfile(
    grpc::CallbackServerContext* context, const v1::GetHardwareProfileRequest* request,
    v1::GetHardwareProfileResponse* response) {
  return Dispatch(
      "GetHardwareProfile", context, [=, this] { return core_.GetHardwareProfile(*request); },
      response);
}

grpc::ServerUnaryReactor* PlannerServiceImpl::Admit(grpc::CallbackServerContext* context,
                                                    const v1::AdmitRequest* request,
                                                    v1::AdmitResponse* response) {
  return Dispatch(
      "Admit", context, [=, this] { return core_.Admit(*request); }, response);
}

}  // namespace memplan
