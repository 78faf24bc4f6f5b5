// The planner as a Kubernetes validating admission webhook: an AdmissionReview
// (admission.k8s.io/v1) for a Pod whose annotations name a memplan job (memplan.dev/model, ...)
// is answered with the planner's verdict for the GPU it asks for — denied with the reason when
// the job does not fit, allowed with the plan id when it does. Pods without memplan.dev/model
// are allowed untouched. Thread-safe (PlannerCore is).
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "planner/webhook/https_server.h"

namespace memplan {

class PlannerCore;

// The annotations a Pod carries (values as in `memplan plan`):
//   memplan.dev/model        model preset (required for the webhook to act)
//   memplan.dev/gpu          hardware preset of the node it asks for; else the Pod's
//                            nodeSelector "memplan.dev/gpu"
//   memplan.dev/batch, memplan.dev/seq, memplan.dev/world-size   (default 1, 4096, 1)
//   memplan.dev/dtype        fp32 | bf16 | fp16 (default bf16)
//   memplan.dev/method       full | lora | qlora (default: lora with a lora-rank, else full)
//   memplan.dev/lora-rank, memplan.dev/lora-targets (modules joined by ',', or all)
//   memplan.dev/optimizer    adamw | adamw_bf16 | sgd | adamw8bit (default: the planner's, adamw)
inline constexpr char kAnnotationPrefix[] = "memplan.dev/";
// Deeper AdmissionReview bodies are answered 400 before they are parsed (a Pod is ~10 deep).
inline constexpr int kMaxJsonDepth = 64;

class AdmissionWebhook {
 public:
  explicit AdmissionWebhook(PlannerCore& core) : core_(core) {}

  // The AdmissionReview answer to an AdmissionReview request body; request.dryRun = true plans
  // without storing. INVALID_ARGUMENT when the body is not an AdmissionReview with request.uid or
  // nests deeper than kMaxJsonDepth (the caller answers HTTP 400).
  absl::StatusOr<std::string> Review(const std::string& body);

  // HTTP entry point: POST /validate -> Review.
  HttpAnswer Handle(const std::string& method, const std::string& path, const std::string& body);

 private:
  PlannerCore& core_;
};

}  // namespace memplan
