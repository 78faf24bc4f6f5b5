#include "agent/client/planner_client.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/grpc_credentials.h"
#include "common/log.h"
#include "common/proto_convert.h"
#include "common/status.h"
#include "memplan/v1/planner.grpc.pb.h"

namespace memplan {
namespace {

absl::Status FromGrpc(const grpc::Status& status) {
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
}

absl::Status InvalidQuery(const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("plan query: ", what));
}

absl::StatusOr<v1::PlanRequest> ToRequest(const PlanQuery& q) {
  v1::PlanRequest request;
  const int models =
      (q.arch.has_value() ? 1 : 0) + (q.trace_id.empty() ? 0 : 1) + (q.arch_preset.empty() ? 0 : 1);
  if (models != 1) {
    return InvalidQuery(
        absl::StrCat("set exactly one of arch, trace_id, arch_preset (got ", models, ")"));
  }
  const int hardware = (q.hardware.has_value() ? 1 : 0) + (q.hardware_profile_id.empty() ? 0 : 1) +
                       (q.hardware_preset.empty() ? 0 : 1);
  if (hardware != 1) {
    return InvalidQuery(absl::StrCat(
        "set exactly one of hardware, hardware_profile_id, hardware_preset (got ", hardware, ")"));
  }
  if (q.arch.has_value()) *request.mutable_arch() = ToProto(*q.arch);
  if (!q.trace_id.empty()) request.set_trace_id(q.trace_id);
  if (!q.arch_preset.empty()) request.set_arch_preset(q.arch_preset);
  if (q.hardware.has_value()) *request.mutable_hardware_spec() = ToProto(*q.hardware);
  if (!q.hardware_profile_id.empty()) request.set_hardware_profile_id(q.hardware_profile_id);
  if (!q.hardware_preset.empty()) request.set_hardware_preset(q.hardware_preset);
  *request.mutable_workload() = ToProto(q.workload);
  *request.mutable_training() = ToProto(q.training);
  request.set_param_dtype(ToProto(q.param_dtype));
  request.set_optimizer(std::string(OptimizerName(q.optimizer)));
  *request.mutable_fixed() = ToProto(q.fixed);
  request.set_safety_margin(q.safety_margin);
  request.set_skip_limits(q.skip_limits);
  request.set_max_alternatives(q.max_alternatives);
  return request;
}

absl::StatusOr<PlanAnswer> FromResponse(const v1::PlanResponse& r) {
  PlanAnswer a;
  a.fits = r.fits();
  a.reason = r.reason();
  // A verdict of "does not fit" may come without a complete plan (no block modes): keep the
  // default plan then. A plan that fits must be complete, or the agent cannot apply it.
  absl::StatusOr<ResidencyPlan> plan = ResidencyPlanFromProto(r.plan(), "plan.");
  if (plan.ok()) {
    a.plan = *std::move(plan);
  } else if (a.fits) {
    return absl::InternalError(absl::StrCat("the planner answered a plan the agent cannot read: ",
                                            plan.status().message()));
  }
  a.prediction = PredictionFromProto(r.prediction());
  a.max_micro_batch = r.max_micro_batch();
  a.max_seq_len = r.max_seq_len();
  a.min_gpu_memory_bytes = r.min_gpu_memory_bytes();
  for (int i = 0; i < r.alternatives_size(); ++i) {
    const v1::Alternative& alt = r.alternatives(i);
    absl::StatusOr<ResidencyPlan> alt_plan =
        ResidencyPlanFromProto(alt.plan(), absl::StrCat("alternatives[", i, "].plan."));
    if (!alt_plan.ok()) continue;  // an alternative is advice; an unreadable one is skipped
    a.alternatives.push_back(
        PlanAlternative{*std::move(alt_plan), PredictionFromProto(alt.prediction()), alt.note()});
  }
  a.plan_id = r.plan_id();
  a.trace_id = r.trace_id();
  a.analytic_trace = r.analytic_trace();
  a.capacity_bytes = r.capacity_bytes();
  a.search_seconds = r.search_seconds();
  a.plans_evaluated = r.plans_evaluated();
  return a;
}

void RealSleep(double seconds) {
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
}

}  // namespace

class PlannerClient::Impl {
 public:
  Impl(std::string address, PlannerClientOptions options, ClientCredentials credentials)
      : address_(std::move(address)),
        options_(std::move(options)),
        credentials_(std::move(credentials)) {
    if (!options_.sleep) options_.sleep = RealSleep;
  }

  const std::string& address() const { return address_; }

  // Runs `call(stub, context)` until it succeeds, fails with a code that is not retried, or the
  // attempts run out. `idempotent` calls also retry DEADLINE_EXCEEDED.
  template <typename Call>
  absl::Status Run(const char* method, bool idempotent, Call call) {
    double backoff = options_.initial_backoff_seconds;
    grpc::Status last;
    const int attempts = options_.retries + 1;
    for (int attempt = 1; attempt <= attempts; ++attempt) {
      std::shared_ptr<v1::Planner::Stub> stub = Stub();
      grpc::ClientContext context;
      context.set_deadline(std::chrono::system_clock::now() +
                           std::chrono::duration_cast<std::chrono::system_clock::duration>(
                               std::chrono::duration<double>(options_.call_deadline_seconds)));
      AttachBearerToken(credentials_, &context);
      last = call(*stub, &context);
      if (last.ok()) return absl::OkStatus();
      const bool retryable =
          last.error_code() == grpc::StatusCode::UNAVAILABLE ||
          (idempotent && last.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED);
      if (!retryable) return FromGrpc(last);
      if (last.error_code() == grpc::StatusCode::UNAVAILABLE) DropChannel(stub);
      if (attempt == attempts) break;
      MEMPLAN_LOG(kWarning, "planner call failed, retrying")
          .Field("method", method)
          .Field("address", address_)
          .Field("attempt", attempt)
          .Field("code", static_cast<int>(last.error_code()))
          .Field("error", last.error_message())
          .Field("backoff_seconds", backoff);
      options_.sleep(backoff);
      backoff = std::min(backoff * 2, options_.max_backoff_seconds);
    }
    const absl::StatusCode code = static_cast<absl::StatusCode>(last.error_code());
    return absl::Status(
        code,
        absl::StrCat("planner at ", address_, " did not answer ", method, " after ", attempts,
                     " attempt(s) (", options_.retries, " retries with backoff up to ",
                     options_.max_backoff_seconds, " s): ", last.error_message(),
                     "; is memplan-planner running there? (or run offline with --plan-file)",
                     credentials_.tls
                         ? "; with TLS: does --tls-ca sign the planner's certificate, and does "
                           "the planner require a client certificate (--tls-cert/--tls-key)?"
                         : ""));
  }

 private:
  std::shared_ptr<v1::Planner::Stub> Stub() {
    absl::MutexLock lock(&mu_);
    if (stub_ == nullptr) {
      grpc::ChannelArguments args;
      // A private subchannel pool: a channel dropped after UNAVAILABLE takes its failed
      // connection (and gRPC's own reconnect backoff) with it, so every retry really dials.
      args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
      args.SetInt(GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH, 64 << 20);
      ApplyChannelArguments(credentials_, &args);
      stub_ = v1::Planner::NewStub(grpc::CreateCustomChannel(address_, credentials_.channel, args));
    }
    return stub_;
  }

  void DropChannel(const std::shared_ptr<v1::Planner::Stub>& failed) {
    absl::MutexLock lock(&mu_);
    if (stub_ == failed) stub_.reset();
  }

  const std::string address_;
  PlannerClientOptions options_;
  const ClientCredentials credentials_;
  absl::Mutex mu_;
  std::shared_ptr<v1::Planner::Stub> stub_ ABSL_GUARDED_BY(mu_);
};

PlannerClient::PlannerClient(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
PlannerClient::~PlannerClient() = default;

absl::StatusOr<std::unique_ptr<PlannerClient>> PlannerClient::Create(
    const std::string& address, const PlannerClientOptions& options) {
  if (address.empty()) return absl::InvalidArgumentError("planner address is empty");
  if (options.retries < 0 || options.retries > 100) {
    return absl::InvalidArgumentError(
        absl::StrCat("retries = ", options.retries, " is out of range; allowed [0, 100]"));
  }
  auto positive = [](double v) { return std::isfinite(v) && v > 0; };
  if (!positive(options.initial_backoff_seconds) || !positive(options.max_backoff_seconds) ||
      options.max_backoff_seconds < options.initial_backoff_seconds) {
    return absl::InvalidArgumentError(
        absl::StrCat("backoff: need 0 < initial_backoff_seconds (", options.initial_backoff_seconds,
                     ") <= max_backoff_seconds (", options.max_backoff_seconds, ")"));
  }
  if (!positive(options.call_deadline_seconds)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "call_deadline_seconds = ", options.call_deadline_seconds, " must be positive"));
  }
  ASSIGN_OR_RETURN(ClientCredentials credentials, LoadClientCredentials(options.security));
  return std::unique_ptr<PlannerClient>(
      new PlannerClient(std::make_unique<Impl>(address, options, std::move(credentials))));
}

const std::string& PlannerClient::address() const { return impl_->address(); }

absl::StatusOr<PlanAnswer> PlannerClient::Plan(const PlanQuery& query) {
  ASSIGN_OR_RETURN(const v1::PlanRequest request, ToRequest(query));
  v1::PlanResponse response;
  RETURN_IF_ERROR(impl_->Run("Plan", /*idempotent=*/true,
                             [&](v1::Planner::Stub& stub, grpc::ClientContext* context) {
                               return stub.Plan(context, request, &response);
                             }));
  return FromResponse(response);
}

absl::StatusOr<std::string> PlannerClient::SubmitTrace(const Trace& trace) {
  v1::SubmitTraceRequest request;
  *request.mutable_trace() = ToProto(trace);
  v1::SubmitTraceResponse response;
  RETURN_IF_ERROR(impl_->Run("SubmitTrace", /*idempotent=*/true,
                             [&](v1::Planner::Stub& stub, grpc::ClientContext* context) {
                               return stub.SubmitTrace(context, request, &response);
                             }));
  return response.trace_id();
}

absl::StatusOr<std::string> PlannerClient::SubmitHardwareProfile(const HardwareSpec& hardware) {
  v1::SubmitHardwareProfileRequest request;
  *request.mutable_profile() = ToProto(hardware);
  v1::SubmitHardwareProfileResponse response;
  RETURN_IF_ERROR(impl_->Run("SubmitHardwareProfile", /*idempotent=*/true,
                             [&](v1::Planner::Stub& stub, grpc::ClientContext* context) {
                               return stub.SubmitHardwareProfile(context, request, &response);
                             }));
  return response.profile_id();
}

absl::StatusOr<MeasurementReceipt> PlannerClient::ReportMeasurement(
    const Measurement& measurement) {
  v1::ReportMeasurementRequest request;
  *request.mutable_measurement() = ToProto(measurement);
  v1::ReportMeasurementResponse response;
  RETURN_IF_ERROR(impl_->Run("ReportMeasurement", /*idempotent=*/false,
                             [&](v1::Planner::Stub& stub, grpc::ClientContext* context) {
                               return stub.ReportMeasurement(context, request, &response);
                             }));
  MeasurementReceipt receipt;
  receipt.measurement_id = response.measurement_id();
  if (response.has_relative_error()) receipt.relative_error = response.relative_error();
  receipt.quarantine_reason = response.quarantine_reason();
  if (response.has_calibration()) {
    // The receipt's calibration is informative; an unreadable one is left at its defaults.
    absl::StatusOr<Calibration> calibration =
        CalibrationFromProto(response.calibration(), "calibration.");
    if (calibration.ok()) receipt.calibration = *std::move(calibration);
  }
  return receipt;
}

}  // namespace memplan
