#include "planner/store/integrity_monitor.h"

#include <utility>

#include "absl/time/time.h"

namespace memplan {

IntegrityMonitor::IntegrityMonitor(Store& store, const Options& options,
                                   FailureCallback on_failure)
    : store_(store), options_(options), on_failure_(std::move(on_failure)) {
  if (options_.mode != IntegrityCheck::kOff && options_.interval_seconds > 0) {
    thread_ = std::thread([this] { Loop(); });
  }
}

IntegrityMonitor::~IntegrityMonitor() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

absl::Status IntegrityMonitor::RunOnce() {
  absl::Status status = store_.CheckIntegrity(options_.mode);
  if (!status.ok() && on_failure_) on_failure_(status);
  return status;
}

void IntegrityMonitor::Loop() {
  const absl::Duration interval = absl::Seconds(options_.interval_seconds);
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      // The open already checked the file: the first scheduled check is one interval later.
      const auto stopping = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_; };
      if (mu_.AwaitWithTimeout(absl::Condition(&stopping), interval)) return;
    }
    (void)RunOnce();
  }
}

}  // namespace memplan
