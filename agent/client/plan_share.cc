#include "agent/client/plan_share.h"

#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "agent/client/record_json.h"
#include "agent/dist/communicator.h"
#include "common/status.h"

namespace memplan {

absl::StatusOr<PlanAnswer> ShareRankZeroAnswer(Communicator& comm,
                                               const absl::StatusOr<PlanAnswer>& rank0_answer) {
  const bool root = comm.rank() == 0;
  const std::string json = root && rank0_answer.ok() ? PlanAnswerToJson(*rank0_answer) : "";
  // A broadcast as a sum: rank 0 contributes the bytes, every other rank zeros (exact in int32;
  // the Communicator has no broadcast, and an answer is a few KiB). The length goes first; 0
  // says that rank 0 has no answer.
  const auto options = torch::TensorOptions().device(comm.device());
  try {
    torch::Tensor length = torch::zeros({1}, options.dtype(torch::kInt64));
    if (root) length.fill_(static_cast<int64_t>(json.size()));
    RETURN_IF_ERROR(comm.AllReduceSum(length)->Wait());
    const int64_t n = length.cpu().item<int64_t>();
    if (n == 0) {
      if (root) return rank0_answer.status();
      return absl::FailedPreconditionError(absl::StrCat(
          "rank ", comm.rank(), ": rank 0 got no plan from the planner (its output says why)"));
    }
    torch::Tensor bytes = torch::zeros({n}, torch::kInt32);
    if (root) {
      int32_t* out = bytes.data_ptr<int32_t>();
      for (int64_t i = 0; i < n; ++i) out[i] = static_cast<unsigned char>(json[i]);
    }
    torch::Tensor shared = bytes.to(comm.device());
    RETURN_IF_ERROR(comm.AllReduceSum(shared)->Wait());
    shared = shared.cpu();
    if (root) return *rank0_answer;
    std::string text(static_cast<size_t>(n), '\0');
    const int32_t* in = shared.data_ptr<int32_t>();
    for (int64_t i = 0; i < n; ++i) text[i] = static_cast<char>(in[i]);
    absl::StatusOr<PlanAnswer> answer = PlanAnswerFromJson(text);
    if (!answer.ok()) {
      return absl::InternalError(
          absl::StrCat("rank ", comm.rank(), ": rank 0's plan: ", answer.status().message()));
    }
    return answer;
  } catch (const c10::Error& e) {
    return absl::InternalError(
        absl::StrCat("sharing the plan from rank 0: ", e.what_without_backtrace()));
  }
}

}  // namespace memplan
