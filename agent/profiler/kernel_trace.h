#pragma once
// A Kineto (CUPTI) trace of one training step, for finding where the device time goes: which
// kernels run, how long, and where the device waits on the host. `memplan-agent train
// --kernel-trace FILE` writes the Chrome-trace JSON that torch.profiler writes, so one
// summariser (scripts/kernel-trace-summary.py) reads memplan's steps and transformers' alike.

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace memplan {

class KernelTrace {
 public:
  // Starts collecting CPU ops and CUDA kernels (CPU ops only where torch has no CUDA).
  static absl::StatusOr<std::unique_ptr<KernelTrace>> Start(bool cuda);
  // Stops collecting and writes the trace to `path`.
  absl::Status StopAndSave(const std::string& path);
  ~KernelTrace();

 private:
  KernelTrace() = default;
  bool running_ = false;
};

}  // namespace memplan
