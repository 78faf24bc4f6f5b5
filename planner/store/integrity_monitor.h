// Runs Store::CheckIntegrity on a schedule, on its own thread, and hands every failed check to a
// callback (the daemon logs it and turns health NOT_SERVING). Thread-safe; the destructor stops
// the thread without waiting out the interval.
#pragma once

#include <functional>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "planner/store/store.h"

namespace memplan {

class IntegrityMonitor {
 public:
  struct Options {
    IntegrityCheck mode = IntegrityCheck::kQuick;
    double interval_seconds = 24 * 3600;  // <= 0 or mode kOff: no thread (RunOnce still works)
  };
  using FailureCallback = std::function<void(const absl::Status&)>;

  IntegrityMonitor(Store& store, const Options& options, FailureCallback on_failure);
  ~IntegrityMonitor();
  IntegrityMonitor(const IntegrityMonitor&) = delete;
  IntegrityMonitor& operator=(const IntegrityMonitor&) = delete;

  // One check on the caller's thread, reported like a scheduled one; returns its result.
  absl::Status RunOnce();

 private:
  void Loop();

  Store& store_;
  const Options options_;
  const FailureCallback on_failure_;
  absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;  // last: started once the members above exist
};

}  // namespace memplan
