#include "agent/profiler/kernel_trace.h"

#include <set>

#include <torch/csrc/autograd/profiler_kineto.h>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace memplan {
namespace {

namespace prof = torch::profiler::impl;
namespace kineto = torch::autograd::profiler;

std::set<prof::ActivityType> Activities(bool cuda) {
  std::set<prof::ActivityType> a = {prof::ActivityType::CPU};
  if (cuda) a.insert(prof::ActivityType::CUDA);
  return a;
}

}  // namespace

absl::StatusOr<std::unique_ptr<KernelTrace>> KernelTrace::Start(bool cuda) {
  try {
    const prof::ProfilerConfig config(prof::ProfilerState::KINETO);
    kineto::prepareProfiler(config, Activities(cuda));
    kineto::enableProfiler(config, Activities(cuda));
  } catch (const c10::Error& e) {
    return absl::FailedPreconditionError(
        absl::StrCat("--kernel-trace: the Kineto profiler did not start: ",
                     e.what_without_backtrace()));
  }
  std::unique_ptr<KernelTrace> trace(new KernelTrace());
  trace->running_ = true;
  return trace;
}

absl::Status KernelTrace::StopAndSave(const std::string& path) {
  if (!running_) return absl::FailedPreconditionError("--kernel-trace: the trace is not running");
  running_ = false;
  try {
    std::unique_ptr<kineto::ProfilerResult> result = kineto::disableProfiler();
    if (result == nullptr) {
      return absl::InternalError("--kernel-trace: the profiler returned no result");
    }
    result->save(path);
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("--kernel-trace: writing ", path,
                                            " failed: ", e.what_without_backtrace()));
  }
  return absl::OkStatus();
}

KernelTrace::~KernelTrace() {
  if (!running_) return;
  try {
    kineto::disableProfiler();
  } catch (const c10::Error&) {
    // A destructor on an error path: the trace is dropped.
  }
}

}  // namespace memplan
