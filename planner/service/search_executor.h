// A fixed pool of threads with a bounded queue, so a burst of work is refused (RESOURCE_EXHAUSTED)
// instead of piling up without limit. The planner runs two: plan searches, and the RPC handlers
// (both off gRPC's own threads).
// Destruction runs every task already accepted, then joins. Thread-safe.
#pragma once

#include <cstdint>
#include <deque>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"

namespace memplan {

class SearchExecutor {
 public:
  struct Options {
    int threads = 2;       // at least 1
    int max_queued = 256;  // tasks that may wait while every thread is busy
  };

  explicit SearchExecutor(const Options& options);
  ~SearchExecutor();
  SearchExecutor(const SearchExecutor&) = delete;
  SearchExecutor& operator=(const SearchExecutor&) = delete;

  // Queues `task`. RESOURCE_EXHAUSTED when the queue is full, UNAVAILABLE after shutdown began.
  // The task must not throw.
  absl::Status Submit(absl::AnyInvocable<void() &&> task);

  int threads() const { return static_cast<int>(workers_.size()); }
  int max_queued() const { return max_queued_; }

 private:
  void WorkerLoop();
  bool HasWorkOrStopping() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const int max_queued_;
  absl::Mutex mu_;
  std::deque<absl::AnyInvocable<void() &&>> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  int idle_workers_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::thread> workers_;
};

}  // namespace memplan
