#include "planner/store/store_keys.h"

#include <algorithm>
#include <chrono>
#include <memory>
#include <mutex>
#include <random>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"

namespace memplan::store_internal {
namespace {

constexpr absl::string_view kPlanTokenPrefix = "plans.v1:";

}  // namespace

StoreEnv WithDefaults(StoreEnv env) {
  if (!env.now_unix_ms) {
    env.now_unix_ms = [] {
      return std::chrono::duration_cast<std::chrono::milliseconds>(
                 std::chrono::system_clock::now().time_since_epoch())
          .count();
    };
  }
  if (!env.random_uint64) {
    struct Source {
      std::mutex mu;
      std::mt19937_64 rng{(static_cast<uint64_t>(std::random_device{}()) << 32) ^
                          std::random_device{}()};
    };
    auto source = std::make_shared<Source>();
    env.random_uint64 = [source] {
      std::lock_guard<std::mutex> lock(source->mu);
      return source->rng();
    };
  }
  return env;
}

std::string NewId(absl::string_view prefix, const StoreEnv& env) {
  return absl::StrFormat("%s-%016x", prefix, env.random_uint64());
}

std::string TraceMatchKey(const memplan::v1::Trace& trace) {
  memplan::v1::Trace key;
  *key.mutable_arch() = trace.arch();
  memplan::v1::ModelArch& arch = *key.mutable_arch();
  // The display name does not change the shapes; only the architecture does.
  arch.clear_name();
  if (arch.head_dim() == 0 && arch.num_heads() > 0) {
    arch.set_head_dim(arch.hidden_size() / arch.num_heads());
  }
  *key.mutable_workload() = trace.workload();
  if (key.workload().world_size() == 0) key.mutable_workload()->set_world_size(1);
  // A trace describes one micro-batch; accumulation does not change it.
  key.mutable_workload()->clear_grad_accum();
  // Nor does how the ranks are spread over nodes (it only divides the host memory).
  key.mutable_workload()->clear_local_world_size();
  key.set_param_dtype(trace.param_dtype());
  memplan::v1::TrainingMethod& training = *key.mutable_training();
  training = trace.training();
  if (training.kind() == memplan::v1::TrainingMethod::KIND_UNSPECIFIED) {
    training.set_kind(memplan::v1::TrainingMethod::FULL);
  }
  if (training.kind() == memplan::v1::TrainingMethod::FULL) {
    training.clear_lora_rank();
    training.clear_lora_target_modules();
  } else {
    std::sort(training.mutable_lora_target_modules()->begin(),
              training.mutable_lora_target_modules()->end());
  }
  if (training.kind() != memplan::v1::TrainingMethod::OSFT) {
    training.clear_osft_rank_ratio();
    training.clear_osft_target_modules();
  } else {
    std::sort(training.mutable_osft_target_modules()->begin(),
              training.mutable_osft_target_modules()->end());
  }
  key.set_hardware_name(trace.hardware_name());

  std::string bytes;
  {
    google::protobuf::io::StringOutputStream stream(&bytes);
    google::protobuf::io::CodedOutputStream coded(&stream);
    coded.SetSerializationDeterministic(true);
    key.SerializeToCodedStream(&coded);
  }
  return bytes;
}

std::string EncodePlanPageToken(int64_t last_seq) {
  return absl::WebSafeBase64Escape(absl::StrCat(kPlanTokenPrefix, last_seq));
}

absl::StatusOr<int64_t> DecodePlanPageToken(absl::string_view token) {
  std::string raw;
  int64_t seq = 0;
  if (!absl::WebSafeBase64Unescape(token, &raw) || !absl::StartsWith(raw, kPlanTokenPrefix) ||
      !absl::SimpleAtoi(absl::string_view(raw).substr(kPlanTokenPrefix.size()), &seq) || seq <= 0) {
    return absl::InvalidArgumentError(
        "page_token is not a token returned by ListPlans (pass it back unchanged, or empty)");
  }
  return seq;
}

absl::StatusOr<int> CheckPageSize(int page_size) {
  if (page_size == 0) return kDefaultListPlansPageSize;
  if (page_size < 0 || page_size > kMaxListPlansPageSize) {
    return absl::InvalidArgumentError(
        absl::StrCat("page_size must be in [0, ", kMaxListPlansPageSize,
                     "] (0 = ", kDefaultListPlansPageSize, "), got ", page_size));
  }
  return page_size;
}

memplan::v1::DType ToProtoDType(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return memplan::v1::DTYPE_FP32;
    case DType::kBFloat16:
      return memplan::v1::DTYPE_BF16;
    case DType::kFloat16:
      return memplan::v1::DTYPE_FP16;
  }
  return memplan::v1::DTYPE_UNSPECIFIED;
}

absl::Status CheckMeasurement(const memplan::v1::Measurement& m) {
  if (m.plan_id().empty()) return absl::InvalidArgumentError("measurement.plan_id is required");
  return absl::OkStatus();
}

absl::Status CheckCalibration(const memplan::v1::Calibration& c) {
  if (c.param_dtype() == memplan::v1::DTYPE_UNSPECIFIED) {
    return absl::InvalidArgumentError("calibration.param_dtype must be fp32, bf16 or fp16");
  }
  return absl::OkStatus();
}

absl::Status CheckSampleLimit(int limit) {
  if (limit <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("limit must be > 0, got ", limit));
  }
  return absl::OkStatus();
}

absl::Status CheckStoreLimits(int max_measurements_per_plan, const PlanRetention& retention,
                              int64_t max_list_page_bytes) {
  if (max_measurements_per_plan <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("max_measurements_per_plan must be > 0, got ",
                                                   max_measurements_per_plan));
  }
  if (retention.max_plans < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "plan_retention.max_plans must be >= 0 (0 = no cap), got ", retention.max_plans));
  }
  constexpr int64_t kMaxAgeSeconds = int64_t{100} * 365 * 24 * 3600;
  if (retention.max_age_seconds < 0 || retention.max_age_seconds > kMaxAgeSeconds) {
    return absl::InvalidArgumentError(
        absl::StrCat("plan_retention.max_age_seconds must be in [0, ", kMaxAgeSeconds,
                     "] (0 = no limit), got ", retention.max_age_seconds));
  }
  if (retention.check_every_puts < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "plan_retention.check_every_puts must be >= 1, got ", retention.check_every_puts));
  }
  if (max_list_page_bytes < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_list_page_bytes must be >= 1, got ", max_list_page_bytes));
  }
  return absl::OkStatus();
}

absl::StatusOr<PlanPageRequest> ParsePlanPageRequest(int page_size, absl::string_view page_token) {
  PlanPageRequest request;
  ASSIGN_OR_RETURN(request.limit, CheckPageSize(page_size));
  request.before_seq = INT64_MAX;
  if (!page_token.empty()) {
    ASSIGN_OR_RETURN(request.before_seq, DecodePlanPageToken(page_token));
  }
  return request;
}

}  // namespace memplan::store_internal
