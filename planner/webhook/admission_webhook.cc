#include "planner/webhook/admission_webhook.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/lora_shapes.h"
#include "common/presets.h"
#include "common/types.h"
#include "common/validate.h"
#include "memplan/v1/planner.pb.h"
#include "nlohmann/json.hpp"
#include "planner/service/planner_core.h"

namespace memplan {
namespace {

using Json = nlohmann::json;

std::optional<std::string> StringAt(const Json& object, const std::string& key) {
  if (!object.is_object()) return std::nullopt;
  auto it = object.find(key);
  if (it == object.end() || !it->is_string()) return std::nullopt;
  return it->get<std::string>();
}

absl::Status AnnotationError(const std::string& name, const std::string& value,
                             const std::string& allowed) {
  return absl::InvalidArgumentError(
      absl::StrCat("annotation ", kAnnotationPrefix, name, " = \"", value, "\": ", allowed));
}

absl::Status ReadInt(const Json& annotations, const std::string& name, int64_t lo, int64_t hi,
                     int64_t* out) {
  std::optional<std::string> value = StringAt(annotations, kAnnotationPrefix + name);
  if (!value.has_value()) return absl::OkStatus();
  if (!absl::SimpleAtoi(*value, out) || *out < lo || *out > hi) {
    return AnnotationError(name, *value,
                           absl::StrCat("expected an integer in [", lo, ", ", hi, "]"));
  }
  return absl::OkStatus();
}

// memplan.dev/method (full | lora | qlora; default lora when lora-rank is given, else full),
// lora-rank (already read) and lora-targets (module names joined by ',', or "all") into
// `training`.
absl::Status ReadTrainingMethod(const Json& annotations, int64_t lora_rank,
                                v1::TrainingMethod* training) {
  std::optional<std::string> method =
      StringAt(annotations, absl::StrCat(kAnnotationPrefix, "method"));
  std::optional<std::string> targets =
      StringAt(annotations, absl::StrCat(kAnnotationPrefix, "lora-targets"));
  if (!method.has_value()) method = lora_rank > 0 ? "lora" : "full";
  if (*method == "full") {
    if (lora_rank > 0) {
      return AnnotationError("lora-rank", absl::StrCat(lora_rank),
                             "needs memplan.dev/method lora or qlora");
    }
    if (targets.has_value()) {
      return AnnotationError("lora-targets", *targets, "needs memplan.dev/lora-rank");
    }
    training->set_kind(v1::TrainingMethod::FULL);
    return absl::OkStatus();
  }
  if (*method != "lora" && *method != "qlora") {
    return AnnotationError("method", *method, "allowed: full, lora, qlora");
  }
  if (lora_rank == 0) {
    return AnnotationError("method", *method, "needs memplan.dev/lora-rank");
  }
  if (!targets.has_value()) {
    return AnnotationError("lora-rank", absl::StrCat(lora_rank),
                           absl::StrCat("needs memplan.dev/lora-targets (",
                                        absl::StrJoin(kLoraModules, ", "),
                                        ", or all)"));
  }
  training->set_kind(*method == "qlora" ? v1::TrainingMethod::QLORA : v1::TrainingMethod::LORA);
  training->set_lora_rank(lora_rank);
  if (*targets == "all") {
    for (const char* module : kLoraModules) training->add_lora_target_modules(module);
    return absl::OkStatus();
  }
  for (absl::string_view module : absl::StrSplit(*targets, ',', absl::SkipEmpty())) {
    module = absl::StripAsciiWhitespace(module);
    if (std::find(kLoraModules.begin(), kLoraModules.end(), module) == kLoraModules.end()) {
      return AnnotationError("lora-targets", *targets,
                             absl::StrCat("allowed: ", absl::StrJoin(kLoraModules, ", "), ", or all"));
    }
    training->add_lora_target_modules(std::string(module));
  }
  return absl::OkStatus();
}

// The Plan request a Pod's annotations describe; nullopt when it is not a memplan job.
absl::StatusOr<std::optional<v1::PlanRequest>> PlanRequestOf(const Json& pod) {
  const Json empty = Json::object();
  const Json& metadata = pod.contains("metadata") ? pod["metadata"] : empty;
  const Json& annotations = metadata.contains("annotations") ? metadata["annotations"] : empty;
  std::optional<std::string> model =
      StringAt(annotations, absl::StrCat(kAnnotationPrefix, "model"));
  if (!model.has_value()) return std::optional<v1::PlanRequest>();
  v1::PlanRequest request;
  request.set_arch_preset(*model);
  std::optional<std::string> gpu = StringAt(annotations, absl::StrCat(kAnnotationPrefix, "gpu"));
  if (!gpu.has_value() && pod.contains("spec") && pod["spec"].contains("nodeSelector")) {
    gpu = StringAt(pod["spec"]["nodeSelector"], absl::StrCat(kAnnotationPrefix, "gpu"));
  }
  if (!gpu.has_value()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "annotation ", kAnnotationPrefix, "gpu (or nodeSelector ", kAnnotationPrefix,
        "gpu) is missing: it names the GPU the job asks for; one of: ", HardwarePresetNames()));
  }
  request.set_hardware_preset(*gpu);
  int64_t batch = 1, seq = 4096, world = 1, lora_rank = 0;
  // The request's bounds (common/validate.h), as `memplan plan` applies them to its flags.
  if (auto s = ReadInt(annotations, "batch", 1, kMaxMicroBatch, &batch); !s.ok()) return s;
  if (auto s = ReadInt(annotations, "seq", 1, kMaxSeqLen, &seq); !s.ok()) return s;
  if (auto s = ReadInt(annotations, "world-size", 1, kMaxWorldSize, &world); !s.ok()) return s;
  if (auto s = ReadInt(annotations, "lora-rank", 1, kMaxLoraRank, &lora_rank); !s.ok()) return s;
  // The node, where it differs from the preset's (memplan plan --gpus-per-node, --host-memory-gib).
  int64_t gpus_per_node = 0, host_memory_gib = 0;
  if (auto s = ReadInt(annotations, "gpus-per-node", 1, world, &gpus_per_node); !s.ok()) return s;
  if (auto s = ReadInt(annotations, "host-memory-gib", kMinHostMemoryGiB, kMaxHostMemoryGiB,
                       &host_memory_gib);
      !s.ok()) {
    return s;
  }
  request.mutable_workload()->set_micro_batch(batch);
  request.mutable_workload()->set_seq_len(seq);
  request.mutable_workload()->set_world_size(static_cast<int32_t>(world));
  request.mutable_workload()->set_local_world_size(static_cast<int32_t>(gpus_per_node));
  request.set_host_memory_bytes(host_memory_gib << 30);
  const std::string dtype =
      StringAt(annotations, absl::StrCat(kAnnotationPrefix, "dtype")).value_or("bf16");
  if (dtype == "bf16") {
    request.set_param_dtype(v1::DTYPE_BF16);
  } else if (dtype == "fp16") {
    request.set_param_dtype(v1::DTYPE_FP16);
  } else if (dtype == "fp32") {
    request.set_param_dtype(v1::DTYPE_FP32);
  } else {
    return AnnotationError("dtype", dtype, "allowed: fp32, bf16, fp16");
  }
  if (auto s = ReadTrainingMethod(annotations, lora_rank, request.mutable_training()); !s.ok()) {
    return s;
  }
  if (std::optional<std::string> optimizer =
          StringAt(annotations, absl::StrCat(kAnnotationPrefix, "optimizer"))) {
    if (!ParseOptimizer(*optimizer).has_value()) {
      return AnnotationError("optimizer", *optimizer,
                             absl::StrCat("allowed: ", std::string(OptimizerAllowList())));
    }
    request.set_optimizer(*optimizer);
  }
  // An admission answer must come fast: no max batch / max sequence search.
  request.set_skip_limits(true);
  return std::optional<v1::PlanRequest>(std::move(request));
}

// Whether the JSON text nests arrays and objects deeper than `limit`, counted over the raw bytes
// (brackets inside strings skipped) so that nothing deep is ever built: copying and comparing
// nlohmann values recurse once per level, and 100 000 levels overflowed the stack.
bool NestsDeeperThan(const std::string& text, int limit) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > limit) return true;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return false;
}

}  // namespace

absl::StatusOr<std::string> AdmissionWebhook::Review(const std::string& body) {
  if (NestsDeeperThan(body, kMaxJsonDepth)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "AdmissionReview nests arrays/objects deeper than ", kMaxJsonDepth, " levels"));
  }
  const Json review = Json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (review.is_discarded() || !review.is_object() || !review.contains("request") ||
      !StringAt(review["request"], "uid").has_value()) {
    return absl::InvalidArgumentError(
        "not an AdmissionReview (admission.k8s.io/v1) with request.uid");
  }
  const Json& request = review["request"];
  Json response = {{"uid", request["uid"]}, {"allowed", true}};
  const Json empty = Json::object();
  const Json& pod = request.contains("object") ? request["object"] : empty;
  // The manifest declares sideEffects: NoneOnDryRun, so a dry-run review stores no plan.
  const auto dry_run = request.find("dryRun");
  const bool is_dry_run = dry_run != request.end() && dry_run->is_boolean() && dry_run->get<bool>();
  absl::StatusOr<std::optional<v1::PlanRequest>> plan_request = PlanRequestOf(pod);
  std::string denial;
  if (!plan_request.ok()) {
    denial = absl::StrCat("memplan: ", plan_request.status().message());
  } else if (plan_request->has_value()) {
    absl::StatusOr<v1::PlanResponse> plan = core_.Plan(
        **plan_request, is_dry_run ? PlannerCore::Storage::kDryRun : PlannerCore::Storage::kStore);
    if (!plan.ok()) {
      denial = absl::StrCat("memplan: ", plan.status().message());
    } else {
      if (!is_dry_run) response["auditAnnotations"] = {{"memplan.dev/plan-id", plan->plan_id()}};
      if (!plan->fits()) {
        denial = absl::StrCat("memplan: ", (*plan_request)->arch_preset(), " on ",
                              (*plan_request)->hardware_preset(), ": ", plan->reason());
      } else {
        response["warnings"] = Json::array({absl::StrCat(
            "memplan: fits; ", is_dry_run ? "dry run, no plan stored" : "plan " + plan->plan_id(),
            ", ", static_cast<int64_t>(plan->prediction().tokens_per_second()),
            " tokens/s per GPU")});
      }
    }
  }
  if (!denial.empty()) {
    response["allowed"] = false;
    response["status"] = {{"code", 403}, {"message", denial}};
  }
  const Json answer = {
      {"apiVersion", "admission.k8s.io/v1"}, {"kind", "AdmissionReview"}, {"response", response}};
  return answer.dump();
}

HttpAnswer AdmissionWebhook::Handle(const std::string& method, const std::string& path,
                                    const std::string& body) {
  const std::string route = path.substr(0, path.find('?'));
  if (route != "/validate") return {404, "text/plain", "not found; POST /validate\n"};
  if (method != "POST") return {405, "text/plain", "POST an AdmissionReview\n"};
  absl::StatusOr<std::string> answer = Review(body);
  if (!answer.ok()) return {400, "text/plain", absl::StrCat(answer.status().message(), "\n")};
  return {200, "application/json", *std::move(answer)};
}

}  // namespace memplan
