#include "planner/service/search_executor.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace memplan {

SearchExecutor::SearchExecutor(const Options& options)
    : max_queued_(std::max(0, options.max_queued)) {
  const int n = std::max(1, options.threads);
  {
    absl::MutexLock lock(&mu_);
    idle_workers_ = n;
  }
  workers_.reserve(n);
  for (int i = 0; i < n; ++i) workers_.emplace_back([this] { WorkerLoop(); });
}

SearchExecutor::~SearchExecutor() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  for (std::thread& t : workers_) t.join();
}

absl::Status SearchExecutor::Submit(absl::AnyInvocable<void() &&> task) {
  absl::MutexLock lock(&mu_);
  if (stopping_) return absl::UnavailableError("the planner is shutting down");
  // A task that an idle thread will take at once does not count against the queue bound.
  if (static_cast<int>(queue_.size()) >= max_queued_ + idle_workers_) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the search queue is full (", max_queued_, " waiting searches); retry later"));
  }
  queue_.push_back(std::move(task));
  return absl::OkStatus();
}

bool SearchExecutor::HasWorkOrStopping() const { return stopping_ || !queue_.empty(); }

void SearchExecutor::WorkerLoop() {
  while (true) {
    absl::AnyInvocable<void() &&> task;
    {
      absl::MutexLock lock(&mu_);
      // Drain before exiting: callers block on the result of every accepted task.
      mu_.Await(absl::Condition(this, &SearchExecutor::HasWorkOrStopping));
      if (queue_.empty()) return;
      task = std::move(queue_.front());
      queue_.pop_front();
      --idle_workers_;
    }
    std::move(task)();
    absl::MutexLock lock(&mu_);
    ++idle_workers_;
  }
}

}  // namespace memplan
