#include "agent/dist/gather_bandwidth.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace memplan {

absl::StatusOr<std::optional<GatherBandwidth>> CompareGatherTimes(
    Communicator& comm, const std::vector<float>& seconds_each, int64_t sampled_bytes) {
  const int w = comm.world_size();
  const auto n = static_cast<int64_t>(seconds_each.size());
  try {
    // Every rank sees the same two sums; the samples line up iff every rank has n of them.
    const double k = static_cast<double>(n);
    torch::Tensor counts = torch::tensor({k, k * k}, torch::kFloat64).to(comm.device());
    RETURN_IF_ERROR(comm.AllReduceSum(counts)->Wait());
    const torch::Tensor c = counts.to(torch::kCPU);
    if (n == 0 || c[0].item<double>() != w * k || c[1].item<double>() != w * k * k) {
      return std::optional<GatherBandwidth>();
    }
    const torch::Tensor mine =
        torch::from_blob(const_cast<float*>(seconds_each.data()), {n}, torch::kFloat32)
            .to(comm.device(), /*non_blocking=*/false, /*copy=*/true);
    torch::Tensor all = torch::empty({w * n}, mine.options());
    RETURN_IF_ERROR(comm.AllGather(all, mine)->Wait());
    const torch::Tensor per = all.view({w, n}).to(torch::kCPU).to(torch::kFloat64);
    const double fastest = std::get<0>(per.min(0)).sum().item<double>();
    const double slowest = std::get<0>(per.max(0)).sum().item<double>();
    if (!(fastest > 0) || !(slowest > 0)) return std::optional<GatherBandwidth>();
    const double bytes = static_cast<double>(sampled_bytes);
    return std::optional<GatherBandwidth>(
        GatherBandwidth{n, AllGatherBusBytesPerSecond(bytes, fastest, w),
                        AllGatherBusBytesPerSecond(bytes, slowest, w)});
  } catch (const c10::Error& e) {
    return absl::InternalError(
        absl::StrCat("comparing the chunk all-gathers' times: ", e.what_without_backtrace()));
  }
}

}  // namespace memplan
