#include "planner/service/planner_core.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <exception>
#include <optional>
#include <set>
#include <string>
#include <utility>

#include "absl/memory/memory.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/log.h"
#include "common/presets.h"
#include "common/proto_convert.h"
#include "common/relative_error.h"
#include "common/status.h"
#include "common/safety_margin.h"
#include "common/validate.h"
#include "planner/core/plan_engine.h"
#include "planner/metrics/planner_metrics.h"
#include "planner/service/search_executor.h"
#include "planner/store/store.h"

namespace memplan {
namespace {

constexpr int kDefaultMaxAlternatives = 5;

int64_t SystemNowUnixMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

double SteadyNowSeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

absl::Status Invalid(absl::string_view message) { return absl::InvalidArgumentError(message); }

// Store errors carry the store's wording; NOT_FOUND is re-worded to name the request field so a
// caller sees which of its ids was wrong.
absl::Status NameMissingId(const absl::Status& status, absl::string_view field,
                           absl::string_view id) {
  if (status.code() != absl::StatusCode::kNotFound) return status;
  return absl::NotFoundError(absl::StrCat(field, " ", Quote(id), " was not found"));
}

absl::Status CheckBytes(absl::string_view field, int64_t value) {
  if (value < 0 || value > kMaxMeasuredBytes) {
    return Invalid(absl::StrCat(field, " = ", value, " is out of range; allowed [0, ",
                                kMaxMeasuredBytes, "]"));
  }
  return absl::OkStatus();
}

absl::Status CheckSeconds(absl::string_view field, double value) {
  if (!std::isfinite(value) || value < 0 || value > kMaxStepSeconds) {
    return Invalid(
        absl::StrCat(field, " = ", value, " is out of range; allowed [0, ", kMaxStepSeconds, "]"));
  }
  return absl::OkStatus();
}

// A profiled trace describes one workload; planning another one from it would be wrong without
// saying so, so a request that names a trace must agree with it (or leave the field unset).
absl::Status CheckMatchesTrace(absl::string_view field, int64_t requested, int64_t traced) {
  if (requested == traced) return absl::OkStatus();
  return Invalid(absl::StrCat(field, " = ", requested, " differs from the trace's ", traced,
                              "; a profiled trace only predicts the workload it measured (leave ",
                              field, " unset to use the trace's)"));
}

// The strings and lists of a PlanRequest, before any is used, stored or quoted (PlanRequest
// errors name PlanRequest fields; Admit prefixes them).
absl::Status CheckPlanRequestBounds(const v1::PlanRequest& r) {
  switch (r.model_case()) {
    case v1::PlanRequest::kArch:
      RETURN_IF_ERROR(CheckName("arch.name", r.arch().name()));
      RETURN_IF_ERROR(CheckName("arch.family", r.arch().family()));
      break;
    case v1::PlanRequest::kTraceId:
      RETURN_IF_ERROR(CheckId("trace_id", r.trace_id()));
      break;
    case v1::PlanRequest::kArchPreset:
      RETURN_IF_ERROR(CheckName("arch_preset", r.arch_preset()));
      break;
    case v1::PlanRequest::MODEL_NOT_SET:
      break;
  }
  switch (r.hardware_case()) {
    case v1::PlanRequest::kHardwareSpec:
      RETURN_IF_ERROR(CheckName("hardware_spec.name", r.hardware_spec().name()));
      break;
    case v1::PlanRequest::kHardwareProfileId:
      RETURN_IF_ERROR(CheckId("hardware_profile_id", r.hardware_profile_id()));
      break;
    case v1::PlanRequest::kHardwarePreset:
      RETURN_IF_ERROR(CheckName("hardware_preset", r.hardware_preset()));
      break;
    case v1::PlanRequest::HARDWARE_NOT_SET:
      break;
  }
  RETURN_IF_ERROR(CheckListSize("training.lora_target_modules",
                                r.training().lora_target_modules_size(), kMaxLoraTargetModules));
  for (int i = 0; i < r.training().lora_target_modules_size(); ++i) {
    RETURN_IF_ERROR(CheckName(absl::StrCat("training.lora_target_modules[", i, "]"),
                              r.training().lora_target_modules(i)));
  }
  RETURN_IF_ERROR(CheckName("optimizer", r.optimizer()));
  return absl::OkStatus();
}

// Everything Plan resolved from the request: the engine inputs, the trace id the model came
// from, and the request as stored (ids and presets replaced by what they named).
struct Resolved {
  PlanInputs inputs;
  std::string trace_id;
  v1::PlanRequest stored_request;
};

}  // namespace

absl::StatusOr<std::unique_ptr<PlannerCore>> PlannerCore::Create(Store& store,
                                                                 SearchExecutor& executor,
                                                                 PlannerMetrics* metrics,
                                                                 PlannerCoreOptions options) {
  if (!options.now_unix_ms) options.now_unix_ms = SystemNowUnixMs;
  if (!options.now_seconds) options.now_seconds = SteadyNowSeconds;
  ASSIGN_OR_RETURN(const int64_t stored, store.CountMeasurements());
  if (metrics != nullptr) metrics->SetStoredMeasurements(stored);
  return absl::WrapUnique(new PlannerCore(store, executor, metrics, std::move(options), stored));
}

PlannerCore::PlannerCore(Store& store, SearchExecutor& executor, PlannerMetrics* metrics,
                         PlannerCoreOptions options, int64_t stored_measurements)
    : store_(store),
      executor_(executor),
      metrics_(metrics),
      options_(std::move(options)),
      stored_measurements_(stored_measurements),
      burst_limiter_(options_.measurement_checks) {}

absl::StatusOr<v1::PlanResponse> PlannerCore::Plan(const v1::PlanRequest& request,
                                                   Storage storage) {
  RETURN_IF_ERROR(CheckPlanRequestBounds(request));
  Resolved r;
  PlanInputs& in = r.inputs;
  r.stored_request = request;

  // ---- model
  std::optional<v1::Trace> named_trace;
  switch (request.model_case()) {
    case v1::PlanRequest::kArch:
      in.arch = ModelSpecFromProto(request.arch());
      RETURN_IF_ERROR(ValidateModelSpec(in.arch, "arch."));
      break;
    case v1::PlanRequest::kTraceId: {
      if (request.trace_id().empty()) return Invalid("trace_id is empty");
      auto trace = store_.GetTrace(request.trace_id());
      if (!trace.ok()) return NameMissingId(trace.status(), "trace_id", request.trace_id());
      named_trace = *std::move(trace);
      in.arch = ModelSpecFromProto(named_trace->arch());
      break;
    }
    case v1::PlanRequest::kArchPreset: {
      std::optional<ModelSpec> preset = FindModelPreset(request.arch_preset());
      if (!preset.has_value()) {
        return absl::NotFoundError(
            absl::StrCat("arch_preset ", Quote(request.arch_preset()),
                         " is not a known model preset",
                         UnknownModelPresetHint(request.arch_preset())));
      }
      in.arch = *std::move(preset);
      break;
    }
    case v1::PlanRequest::MODEL_NOT_SET:
      return Invalid("model is required: set one of arch, trace_id, arch_preset");
  }

  // ---- hardware
  switch (request.hardware_case()) {
    case v1::PlanRequest::kHardwareSpec:
      in.hardware = HardwareSpecFromProto(request.hardware_spec());
      RETURN_IF_ERROR(ValidateHardwareSpec(in.hardware, "hardware_spec."));
      break;
    case v1::PlanRequest::kHardwareProfileId: {
      auto profile = store_.GetHardwareProfile(request.hardware_profile_id());
      if (!profile.ok()) {
        return NameMissingId(profile.status(), "hardware_profile_id",
                             request.hardware_profile_id());
      }
      in.hardware = HardwareSpecFromProto(*profile);
      break;
    }
    case v1::PlanRequest::kHardwarePreset: {
      // An agent's measured profile of the same name is better evidence than the datasheet.
      ASSIGN_OR_RETURN(std::optional<v1::HardwareProfile> measured,
                       store_.FindHardwareProfileByName(request.hardware_preset()));
      if (measured.has_value()) {
        in.hardware = HardwareSpecFromProto(*measured);
        break;
      }
      std::optional<HardwareSpec> preset = FindHardwarePreset(request.hardware_preset());
      if (!preset.has_value()) {
        return absl::NotFoundError(
            absl::StrCat("hardware_preset ", Quote(request.hardware_preset()),
                         " is neither a hardware preset nor a measured profile name",
                         UnknownHardwarePresetHint(request.hardware_preset())));
      }
      in.hardware = *std::move(preset);
      break;
    }
    case v1::PlanRequest::HARDWARE_NOT_SET:
      return Invalid(
          "hardware is required: set one of hardware_spec, hardware_profile_id, hardware_preset");
  }
  // A preset or a profile names a typical node of that card; the request may know the real
  // node's RAM. It replaces the figure before anything reads it, so the plan, the reason's host
  // limit and the stored hardware_spec all carry it.
  RETURN_IF_ERROR(CheckHostMemoryOverride("host_memory_bytes", request.host_memory_bytes()));
  if (request.host_memory_bytes() > 0) in.hardware.host_memory_bytes = request.host_memory_bytes();

  // ---- workload, training, dtype (a named trace supplies the ones left unset)
  in.workload = WorkloadFromProto(request.workload());
  ASSIGN_OR_RETURN(in.training, TrainingMethodFromProto(request.training(), "training."));
  ASSIGN_OR_RETURN(in.param_dtype,
                   DTypeFromProto(request.param_dtype(), "param_dtype", DType::kBFloat16));
  if (named_trace.has_value()) {
    ASSIGN_OR_RETURN(Trace trace, TraceFromProto(*named_trace, "trace."));
    if (request.has_workload()) {
      RETURN_IF_ERROR(CheckMatchesTrace("workload.micro_batch", in.workload.micro_batch,
                                        trace.workload.micro_batch));
      RETURN_IF_ERROR(
          CheckMatchesTrace("workload.seq_len", in.workload.seq_len, trace.workload.seq_len));
      RETURN_IF_ERROR(CheckMatchesTrace("workload.world_size", in.workload.world_size,
                                        trace.workload.world_size));
    } else {
      in.workload = trace.workload;
    }
    if (request.has_training()) {
      if (in.training.kind != trace.training.kind ||
          in.training.lora_rank != trace.training.lora_rank) {
        return Invalid(
            "training differs from the trace's training method; leave training unset to use "
            "the trace's");
      }
    } else {
      in.training = trace.training;
    }
    if (request.param_dtype() == v1::DTYPE_UNSPECIFIED) {
      in.param_dtype = trace.param_dtype;
    } else if (in.param_dtype != trace.param_dtype) {
      return Invalid(absl::StrCat("param_dtype = ", std::string(DTypeName(in.param_dtype)),
                                  " differs from the trace's ",
                                  std::string(DTypeName(trace.param_dtype)),
                                  "; leave param_dtype unset to use the trace's"));
    }
    r.trace_id = trace.trace_id;
    in.profiled_trace = std::move(trace);
  }
  RETURN_IF_ERROR(ValidateWorkload(in.workload, "workload."));
  RETURN_IF_ERROR(ValidateTrainingMethod(in.training, in.arch, "training."));

  // ---- optimizer, margin, alternatives, knobs
  const std::string optimizer = request.optimizer().empty() ? "adamw" : request.optimizer();
  std::optional<OptimizerKind> kind = ParseOptimizer(optimizer);
  if (!kind.has_value()) {
    return Invalid(absl::StrCat("optimizer = ", Quote(optimizer),
                                " is not supported; allowed: ", std::string(OptimizerAllowList())));
  }
  in.optimizer = *kind;
  RETURN_IF_ERROR(CheckSafetyMargin("safety_margin", request.safety_margin()));
  in.safety_margin = ResolveSafetyMargin(request.safety_margin());
  if (request.max_alternatives() < 0 || request.max_alternatives() > kMaxAlternatives) {
    return Invalid(absl::StrCat("max_alternatives = ", request.max_alternatives(),
                                " is out of range; allowed [0, ", kMaxAlternatives, "]"));
  }
  in.max_alternatives =
      request.max_alternatives() == 0 ? kDefaultMaxAlternatives : request.max_alternatives();
  in.skip_limits = request.skip_limits();
  ASSIGN_OR_RETURN(in.fixed, FixedKnobsFromProto(request.fixed(), "fixed."));

  // ---- a stored profiled trace for exactly this request beats the analytic one
  if (!in.profiled_trace.has_value()) {
    Trace key;
    key.arch = in.arch;
    key.workload = in.workload;
    key.param_dtype = in.param_dtype;
    key.training = in.training;
    key.hardware_name = in.hardware.name;
    key.analytic = false;
    ASSIGN_OR_RETURN(std::optional<v1::Trace> found, store_.FindTrace(ToProto(key)));
    if (found.has_value()) {
      ASSIGN_OR_RETURN(Trace trace, TraceFromProto(*found, "stored trace."));
      r.trace_id = trace.trace_id;
      in.profiled_trace = std::move(trace);
    }
  }

  // ---- calibration learned for this key, else the nearest one that has samples
  const CalibrationKey cal_key{in.hardware.name, in.param_dtype, in.arch.family,
                               std::string(TrainingKindName(in.training.kind)),
                               std::string(OptimizerName(in.optimizer))};
  ASSIGN_OR_RETURN(const std::optional<v1::Calibration> calibration, CalibrationFor(cal_key));
  if (calibration.has_value()) {
    in.fragmentation_factor = calibration->fragmentation_factor();
    in.residual_bytes = calibration->residual_bytes();
    if (calibration->time_samples() > 0) in.time_factor = calibration->time_factor();
  } else {
    in.fragmentation_factor = options_.default_fragmentation_factor;
  }

  // ---- search, on the executor rather than the caller's (gRPC) thread
  absl::StatusOr<PlanOutcome> outcome = absl::InternalError("search did not run");
  double search_seconds = 0;
  absl::Notification done;
  absl::Status queued = executor_.Submit([&] {
    const double start = options_.now_seconds();
    try {
      outcome = MakePlan(in);
    } catch (const std::exception& e) {
      outcome = absl::InternalError(absl::StrCat("plan search failed: ", e.what()));
    } catch (...) {
      outcome = absl::InternalError("plan search failed with an unknown exception");
    }
    search_seconds = options_.now_seconds() - start;
    done.Notify();
  });
  if (!queued.ok()) {
    if (metrics_ != nullptr && queued.code() == absl::StatusCode::kResourceExhausted) {
      metrics_->RpcRefused("Plan", "search_queue_full");
    }
    return queued;
  }
  done.WaitForNotification();
  if (!outcome.ok()) return outcome.status();
  if (metrics_ != nullptr) metrics_->ObserveSearch(search_seconds);

  // ---- answer, stored before it is returned so that its id is valid
  v1::PlanResponse response;
  response.set_fits(outcome->fits);
  response.set_reason(outcome->reason);
  *response.mutable_plan() = ToProto(outcome->plan);
  *response.mutable_prediction() = ToProto(outcome->prediction);
  response.set_max_micro_batch(outcome->max_micro_batch);
  response.set_max_seq_len(outcome->max_seq_len);
  response.set_min_gpu_memory_bytes(outcome->min_gpu_memory_bytes);
  for (size_t i = 0; i < outcome->alternatives.size(); ++i) {
    v1::Alternative* alt = response.add_alternatives();
    *alt->mutable_plan() = ToProto(outcome->alternatives[i].first);
    *alt->mutable_prediction() = ToProto(outcome->alternatives[i].second);
    if (i < outcome->alternative_notes.size()) alt->set_note(outcome->alternative_notes[i]);
  }
  response.set_trace_id(r.trace_id);
  response.set_analytic_trace(!in.profiled_trace.has_value() || in.profiled_trace->analytic);
  response.set_capacity_bytes(outcome->capacity_bytes);
  response.set_search_seconds(search_seconds);
  response.set_plans_evaluated(outcome->plans_evaluated);

  // The stored request is self-contained: later changes to presets or profiles do not change
  // what a stored plan was made for, and calibration can key on it directly.
  v1::PlanRequest& stored = r.stored_request;
  *stored.mutable_arch() = ToProto(in.arch);
  *stored.mutable_hardware_spec() = ToProto(in.hardware);
  *stored.mutable_workload() = ToProto(in.workload);
  *stored.mutable_training() = ToProto(in.training);
  stored.set_param_dtype(ToProto(in.param_dtype));
  stored.set_optimizer(std::string(OptimizerName(in.optimizer)));
  stored.set_safety_margin(in.safety_margin);
  stored.set_max_alternatives(in.max_alternatives);
  v1::StoredPlan plan;
  *plan.mutable_request() = std::move(stored);
  *plan.mutable_response() = response;
  if (storage == Storage::kDryRun) {
    if (metrics_ != nullptr) metrics_->PlanServed(response.fits());
    return response;
  }
  ASSIGN_OR_RETURN(std::string plan_id, store_.PutPlan(plan));
  response.set_plan_id(plan_id);

  if (metrics_ != nullptr) {
    metrics_->PlanServed(response.fits());
    metrics_->ObservePlanPrediction(plan_id, response.prediction().peak_bytes());
  }
  return response;
}

absl::StatusOr<v1::SubmitTraceResponse> PlannerCore::SubmitTrace(
    const v1::SubmitTraceRequest& request) {
  if (!request.has_trace()) return Invalid("trace is required");
  ASSIGN_OR_RETURN(Trace trace, TraceFromProto(request.trace(), "trace."));
  RETURN_IF_ERROR(ValidateTrace(trace, "trace."));
  if (!trace.analytic && trace.hardware_name.empty()) {
    return Invalid(
        "trace.hardware_name is empty; a profiled trace must name the hardware it ran on");
  }
  // Store the normalised form (defaults explicit) so lookups by content match it.
  ASSIGN_OR_RETURN(std::string id, store_.PutTrace(ToProto(trace)));
  v1::SubmitTraceResponse response;
  response.set_trace_id(id);
  return response;
}

absl::StatusOr<v1::SubmitHardwareProfileResponse> PlannerCore::SubmitHardwareProfile(
    const v1::SubmitHardwareProfileRequest& request) {
  if (!request.has_profile()) return Invalid("profile is required");
  const HardwareSpec spec = HardwareSpecFromProto(request.profile());
  if (spec.name.empty()) {
    return Invalid("profile.name is empty; it is how plans and calibration refer to the card");
  }
  RETURN_IF_ERROR(ValidateHardwareSpec(spec, "profile."));
  ASSIGN_OR_RETURN(std::string id, store_.PutHardwareProfile(ToProto(spec)));
  v1::SubmitHardwareProfileResponse response;
  response.set_profile_id(id);
  return response;
}

absl::StatusOr<Calibration> PlannerCore::FitKey(const CalibrationKey& key) {
  const int window = std::max(1, options_.calibrator.window_samples);
  ASSIGN_OR_RETURN(std::vector<CalibrationSample> recent,
                   store_.RecentCalibrationSamples(key, window));
  const CalibrationResult fit = FitCalibration(recent, options_.calibrator);
  Calibration calibration;
  calibration.hardware_name = key.hardware_name;
  calibration.param_dtype = key.param_dtype;
  calibration.model_family = key.model_family;
  calibration.method = key.method;
  calibration.optimizer = key.optimizer;
  calibration.fragmentation_factor = fit.fragmentation_factor;
  calibration.residual_bytes = fit.residual_bytes;
  calibration.samples = fit.samples;
  calibration.mean_abs_relative_error = fit.mean_abs_relative_error;
  calibration.time_factor = fit.time_factor;
  calibration.time_samples = fit.time_samples;
  calibration.updated_at_unix_ms = options_.now_unix_ms();
  return calibration;
}

absl::StatusOr<std::optional<v1::Calibration>> PlannerCore::CalibrationFor(
    const CalibrationKey& key) {
  // [Calibration keys]: the key's own calibration, else a fit of its method's pooled samples,
  // else the legacy calibration of its card, dtype and family.
  ASSIGN_OR_RETURN(std::optional<v1::Calibration> own, store_.GetCalibration(key));
  if (own.has_value() && own->samples() > 0) return own;
  ASSIGN_OR_RETURN(const Calibration pooled, FitKey(PooledCalibrationKey(key)));
  if (pooled.samples > 0) return std::optional<v1::Calibration>(ToProto(pooled));
  ASSIGN_OR_RETURN(std::optional<v1::Calibration> legacy,
                   store_.GetCalibration(LegacyCalibrationKey(key)));
  if (legacy.has_value() && legacy->samples() > 0) return legacy;
  return std::optional<v1::Calibration>();
}

absl::StatusOr<v1::ReportMeasurementResponse> PlannerCore::ReportMeasurement(
    const v1::ReportMeasurementRequest& request, const MeasurementSource& source) {
  if (!request.has_measurement()) return Invalid("measurement is required");
  v1::Measurement m = request.measurement();
  // Both are the planner's to set; a client's values are not trusted.
  m.set_reported_by(source.reported_by);
  m.clear_quarantine_reason();
  if (m.plan_id().empty()) return Invalid("measurement.plan_id is empty");
  RETURN_IF_ERROR(CheckId("measurement.plan_id", m.plan_id()));
  RETURN_IF_ERROR(CheckNote("measurement.note", m.note()));
  RETURN_IF_ERROR(CheckBytes("measurement.peak_allocated_bytes", m.peak_allocated_bytes()));
  RETURN_IF_ERROR(CheckBytes("measurement.peak_reserved_bytes", m.peak_reserved_bytes()));
  RETURN_IF_ERROR(CheckBytes("measurement.peak_device_bytes", m.peak_device_bytes()));
  RETURN_IF_ERROR(CheckBytes("measurement.load_peak_bytes", m.load_peak_bytes()));
  RETURN_IF_ERROR(CheckSeconds("measurement.step_seconds", m.step_seconds()));
  if (m.peak_reserved_bytes() == 0 && !m.oom()) {
    return Invalid(absl::StrCat("measurement.peak_reserved_bytes = 0 is out of range; allowed [1, ",
                                kMaxMeasuredBytes, "] (0 only with oom = true)"));
  }
  if (m.measured_at_unix_ms() < 0) {
    return Invalid(absl::StrCat("measurement.measured_at_unix_ms = ", m.measured_at_unix_ms(),
                                " is out of range; allowed >= 0 (0 = now)"));
  }
  if (m.measured_at_unix_ms() == 0) m.set_measured_at_unix_ms(options_.now_unix_ms());

  auto plan = store_.GetPlan(m.plan_id());
  if (!plan.ok()) return NameMissingId(plan.status(), "measurement.plan_id", m.plan_id());
  const v1::PlanRequest& req = plan->request();
  const Prediction predicted = PredictionFromProto(plan->response().prediction());
  ASSIGN_OR_RETURN(const DType dtype,
                   DTypeFromProto(req.param_dtype(), "stored plan param_dtype", DType::kBFloat16));
  ASSIGN_OR_RETURN(const TrainingKind method,
                   TrainingKindFromProto(req.training().kind(), "stored plan training.kind"));
  const CalibrationKey key{req.hardware_spec().name(), dtype,
                           req.arch().family().empty() ? "llama" : req.arch().family(),
                           std::string(TrainingKindName(method)),
                           req.optimizer().empty() ? "adamw" : req.optimizer()};

  v1::ReportMeasurementResponse response;
  absl::MutexLock lock(&calibration_mu_);
  // Sanity checks come first so that a quarantined measurement is stored with its reason. The
  // burst check counts every report, so it runs even when a plan check already failed.
  std::optional<Quarantine> quarantine =
      burst_limiter_.Record(source.client, options_.now_unix_ms());
  if (std::optional<Quarantine> against_plan =
          CheckAgainstPlan(m, req.hardware_spec().gpu_memory_bytes(), predicted.iteration_seconds,
                           options_.measurement_checks);
      against_plan.has_value()) {
    quarantine = std::move(against_plan);
  }
  if (quarantine.has_value()) m.set_quarantine_reason(quarantine->reason);

  // Durable first: once the client has an id, the measurement survives a crash (the store
  // commits and syncs before returning). Calibration is derived data and can be refitted.
  ASSIGN_OR_RETURN(std::string measurement_id, store_.PutMeasurement(m));
  response.set_measurement_id(measurement_id);
  ++stored_measurements_;
  if (metrics_ != nullptr) metrics_->SetStoredMeasurements(stored_measurements_);

  // The predicted peak is device-level: the allocator's reserved bytes plus the CUDA context
  // (which the allocator does not count). Errors compare the reserved parts; the calibration
  // sample is the device-level equivalent of the measurement.
  const int64_t context = predicted.breakdown.cuda_context_bytes;
  const int64_t predicted_reserved = predicted.peak_bytes - context;
  // An OOM run's peak is only how far it got before failing: it has no relative error
  // ([Relative error]), and the answer leaves the field unset.
  if (!m.oom()) {
    const std::optional<double> error =
        RelativeError(predicted_reserved, m.peak_reserved_bytes());
    if (error.has_value()) response.set_relative_error(*error);
  }
  if (quarantine.has_value()) {
    // Kept out of calibration and out of the predicted-vs-measured gauges; the answer carries
    // the calibration as it stands.
    response.set_quarantine_reason(quarantine->reason);
    ASSIGN_OR_RETURN(std::optional<v1::Calibration> current, store_.GetCalibration(key));
    if (current.has_value()) *response.mutable_calibration() = *std::move(current);
    if (metrics_ != nullptr) metrics_->MeasurementQuarantined(quarantine->check);
    MEMPLAN_LOG(kWarning, "measurement quarantined")
        .Field("plan_id", m.plan_id())
        .Field("measurement_id", measurement_id)
        .Field("reported_by", m.reported_by())
        .Field("reason", quarantine->reason);
    return response;
  }
  // [Calibration keys]: the sample refits its own key and joins its method's pooled samples.
  if (m.peak_reserved_bytes() > 0) {
    CalibrationSample sample;
    sample.raw_model_bytes = RawModelBytes(predicted);
    sample.exact_bytes = predicted.breakdown.exact_bytes;
    sample.fixed_bytes = context;
    sample.measured_bytes = m.peak_reserved_bytes() + context;
    if (!m.oom() && m.step_seconds() > 0 && predicted.iteration_seconds > 0) {
      sample.predicted_seconds = predicted.iteration_seconds / predicted.time_factor;
      sample.measured_seconds = m.step_seconds();
    }
    sample.measured_at_unix_ms = m.measured_at_unix_ms();
    sample.oom = m.oom();
    RETURN_IF_ERROR(store_.PutCalibrationSample(key, sample));
    RETURN_IF_ERROR(store_.PutCalibrationSample(PooledCalibrationKey(key), sample));
  }
  ASSIGN_OR_RETURN(const Calibration calibration, FitKey(key));
  *response.mutable_calibration() = ToProto(calibration);
  RETURN_IF_ERROR(store_.PutCalibration(response.calibration()));

  if (metrics_ != nullptr) {
    const PlannerMetrics::ErrorKey error_key{
        key.hardware_name, std::string(DTypeName(key.param_dtype)), key.model_family};
    // OOMs are counted apart: observed as an error or a peak they would read as over-prediction.
    if (m.oom()) {
      metrics_->ObserveOom(m.plan_id(), predicted_reserved, error_key,
                           static_cast<double>(options_.now_unix_ms()) / 1000.0);
    } else {
      metrics_->ObserveMeasurement(m.plan_id(), predicted_reserved, m.peak_reserved_bytes(),
                                   error_key);
    }
  }
  return response;
}

absl::StatusOr<v1::AdmitResponse> PlannerCore::Admit(const v1::AdmitRequest& request) {
  if (request.pools_size() < 1 || request.pools_size() > kMaxAdmitPools) {
    return Invalid(
        absl::StrCat("pools: ", request.pools_size(), " given; allowed 1 to ", kMaxAdmitPools));
  }
  if (request.job().hardware_case() != v1::PlanRequest::HARDWARE_NOT_SET) {
    return Invalid(
        "job.hardware_spec, job.hardware_profile_id and job.hardware_preset must be unset: each "
        "of pools[] names its own hardware");
  }
  std::set<std::string> names;
  for (int i = 0; i < request.pools_size(); ++i) {
    const v1::NodePool& pool = request.pools(i);
    const std::string field = absl::StrCat("pools[", i, "]");
    if (pool.name().empty()) return Invalid(absl::StrCat(field, ".name is empty"));
    RETURN_IF_ERROR(CheckName(absl::StrCat(field, ".name"), pool.name()));
    if (!names.insert(pool.name()).second) {
      return Invalid(absl::StrCat(field, ".name ", Quote(pool.name()), " is used twice"));
    }
    if (pool.hardware_case() == v1::NodePool::kHardwareProfileId) {
      RETURN_IF_ERROR(
          CheckId(absl::StrCat(field, ".hardware_profile_id"), pool.hardware_profile_id()));
    } else if (pool.hardware_case() == v1::NodePool::kHardwarePreset) {
      RETURN_IF_ERROR(CheckName(absl::StrCat(field, ".hardware_preset"), pool.hardware_preset()));
    } else if (pool.hardware_case() == v1::NodePool::kHardwareSpec) {
      RETURN_IF_ERROR(
          CheckName(absl::StrCat(field, ".hardware_spec.name"), pool.hardware_spec().name()));
    }
    if (pool.gpus() < 1 || pool.gpus() > kMaxPoolGpus) {
      return Invalid(absl::StrCat(field, ".gpus = ", pool.gpus(), " is out of range; allowed [1, ",
                                  kMaxPoolGpus, "]"));
    }
    if (pool.hardware_case() == v1::NodePool::HARDWARE_NOT_SET) {
      return Invalid(
          absl::StrCat(field, ": set one of hardware_spec, hardware_profile_id, hardware_preset"));
    }
  }

  v1::AdmitResponse response;
  double best_tokens_per_second = 0;
  for (int i = 0; i < request.pools_size(); ++i) {
    const v1::NodePool& pool = request.pools(i);
    v1::PlanRequest plan_request = request.job();
    switch (pool.hardware_case()) {
      case v1::NodePool::kHardwareSpec:
        *plan_request.mutable_hardware_spec() = pool.hardware_spec();
        break;
      case v1::NodePool::kHardwareProfileId:
        plan_request.set_hardware_profile_id(pool.hardware_profile_id());
        break;
      case v1::NodePool::kHardwarePreset:
        plan_request.set_hardware_preset(pool.hardware_preset());
        break;
      case v1::NodePool::HARDWARE_NOT_SET:
        break;
    }
    absl::StatusOr<v1::PlanResponse> plan = Plan(plan_request);
    if (!plan.ok()) {
      // Plan names fields of a PlanRequest: the hardware ones are the pool's, the rest the job's.
      const std::string message(plan.status().message());
      return absl::Status(plan.status().code(),
                          absl::StartsWith(message, "hardware")
                              ? absl::StrCat("pools[", i, "] (", Quote(pool.name()), "): ", message)
                              : absl::StrCat("job.", message));
    }
    ASSIGN_OR_RETURN(const v1::StoredPlan stored, store_.GetPlan(plan->plan_id()));
    const int world_size = std::max(1, plan->plan().world_size());
    v1::PoolVerdict& verdict = *response.add_pools();
    verdict.set_pool(pool.name());
    verdict.set_hardware_name(stored.request().hardware_spec().name());
    verdict.set_gpus(pool.gpus());
    verdict.set_plan_id(plan->plan_id());
    *verdict.mutable_plan() = plan->plan();
    *verdict.mutable_prediction() = plan->prediction();
    verdict.set_reason(plan->reason());
    verdict.set_fits(plan->fits());
    if (plan->fits() && pool.gpus() < world_size) {
      verdict.set_fits(false);
      verdict.set_reason(absl::StrCat("the plan fits one GPU, but the job needs ", world_size,
                                      " GPUs (workload.world_size) and the pool has ",
                                      pool.gpus()));
    }
    if (verdict.fits()) {
      verdict.set_job_tokens_per_second(plan->prediction().tokens_per_second() * world_size);
      if (verdict.job_tokens_per_second() > best_tokens_per_second) {
        best_tokens_per_second = verdict.job_tokens_per_second();
        response.set_best_pool(pool.name());
      }
    }
  }
  return response;
}

absl::StatusOr<v1::GetPlanResponse> PlannerCore::GetPlan(const v1::GetPlanRequest& request) {
  if (request.plan_id().empty()) return Invalid("plan_id is empty");
  RETURN_IF_ERROR(CheckId("plan_id", request.plan_id()));
  auto plan = store_.GetPlan(request.plan_id());
  if (!plan.ok()) return NameMissingId(plan.status(), "plan_id", request.plan_id());
  v1::GetPlanResponse response;
  *response.mutable_plan() = *std::move(plan);
  // The response was stored before the store assigned the id.
  response.mutable_plan()->mutable_response()->set_plan_id(response.plan().plan_id());
  return response;
}

absl::StatusOr<v1::ListPlansResponse> PlannerCore::ListPlans(const v1::ListPlansRequest& request) {
  if (request.page_size() < 0 || request.page_size() > kMaxListPlansPageSize) {
    return Invalid(absl::StrCat("page_size = ", request.page_size(),
                                " is out of range; allowed [0, ", kMaxListPlansPageSize,
                                "] (0 = ", kDefaultListPlansPageSize, ")"));
  }
  RETURN_IF_ERROR(CheckId("page_token", request.page_token()));
  ASSIGN_OR_RETURN(ListPlansPage page, store_.ListPlans(request.page_size(), request.page_token()));
  v1::ListPlansResponse response;
  for (v1::StoredPlan& plan : page.plans) {
    plan.mutable_response()->set_plan_id(plan.plan_id());
    *response.add_plans() = std::move(plan);
  }
  response.set_next_page_token(page.next_page_token);
  return response;
}

absl::StatusOr<v1::GetCalibrationResponse> PlannerCore::GetCalibration(
    const v1::GetCalibrationRequest& request) {
  RETURN_IF_ERROR(CheckName("hardware_name", request.hardware_name()));
  RETURN_IF_ERROR(CheckName("model_family", request.model_family()));
  CalibrationFilter filter;
  filter.hardware_name = request.hardware_name();
  filter.model_family = request.model_family();
  if (request.param_dtype() != v1::DTYPE_UNSPECIFIED) {
    ASSIGN_OR_RETURN(filter.param_dtype, DTypeFromProto(request.param_dtype(), "param_dtype"));
  }
  ASSIGN_OR_RETURN(std::vector<v1::Calibration> calibrations, store_.ListCalibrations(filter));
  v1::GetCalibrationResponse response;
  for (v1::Calibration& c : calibrations) *response.add_calibrations() = std::move(c);
  return response;
}

absl::StatusOr<v1::GetTraceResponse> PlannerCore::GetTrace(const v1::GetTraceRequest& request) {
  if (request.trace_id().empty()) return Invalid("trace_id is empty");
  RETURN_IF_ERROR(CheckId("trace_id", request.trace_id()));
  auto trace = store_.GetTrace(request.trace_id());
  if (!trace.ok()) return NameMissingId(trace.status(), "trace_id", request.trace_id());
  v1::GetTraceResponse response;
  *response.mutable_trace() = *std::move(trace);
  return response;
}

absl::StatusOr<v1::GetHardwareProfileResponse> PlannerCore::GetHardwareProfile(
    const v1::GetHardwareProfileRequest& request) {
  if (request.profile_id().empty()) return Invalid("profile_id is empty");
  RETURN_IF_ERROR(CheckId("profile_id", request.profile_id()));
  auto profile = store_.GetHardwareProfile(request.profile_id());
  if (!profile.ok()) return NameMissingId(profile.status(), "profile_id", request.profile_id());
  v1::GetHardwareProfileResponse response;
  *response.mutable_profile() = *std::move(profile);
  return response;
}

absl::StatusOr<v1::ListPresetsResponse> PlannerCore::ListPresets(
    const v1::ListPresetsRequest& request) {
  v1::ListPresetsResponse response;
  for (const ModelSpec& m : ModelPresets()) *response.add_models() = ToProto(m);
  for (const HardwareSpec& h : HardwarePresets()) {
    ASSIGN_OR_RETURN(std::optional<v1::HardwareProfile> measured,
                     store_.FindHardwareProfileByName(h.name));
    *response.add_hardware() = measured.has_value() ? *std::move(measured) : ToProto(h);
  }
  return response;
}

}  // namespace memplan
