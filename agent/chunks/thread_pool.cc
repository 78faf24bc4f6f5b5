#include "agent/chunks/thread_pool.h"

#include <algorithm>
#include <utility>

namespace memplan {

ThreadPool::ThreadPool(int num_threads) {
  for (int i = 0; i < num_threads; ++i) workers_.emplace_back([this] { WorkerLoop(); });
}

ThreadPool::~ThreadPool() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  for (std::thread& worker : workers_) worker.join();
}

void ThreadPool::Schedule(std::function<void()> task, int64_t order, bool urgent) {
  if (workers_.empty()) {
    task();
    return;
  }
  absl::MutexLock lock(&mu_);
  if (urgent) {
    urgent_.push_back(std::move(task));
  } else {
    queue_.emplace_back(order, std::move(task));
  }
}

void ThreadPool::QueueInOrder() {
  absl::MutexLock lock(&mu_);
  std::stable_sort(queue_.begin(), queue_.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
}

void ThreadPool::WorkerLoop() {
  while (true) {
    std::function<void()> task;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stopping_ || !urgent_.empty() || !queue_.empty();
      };
      mu_.Await(absl::Condition(&ready));
      if (!urgent_.empty()) {
        task = std::move(urgent_.front());
        urgent_.pop_front();
      } else if (!queue_.empty()) {
        task = std::move(queue_.front().second);
        queue_.pop_front();
      } else {
        return;  // stopping and drained
      }
    }
    task();
  }
}

void TaskTracker::Add(int n) {
  absl::MutexLock lock(&mu_);
  pending_ += n;
}

void TaskTracker::Done() {
  absl::MutexLock lock(&mu_);
  --pending_;
}

void TaskTracker::Wait() {
  absl::MutexLock lock(&mu_);
  auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return pending_ == 0; };
  mu_.Await(absl::Condition(&idle));
}

bool TaskTracker::Idle() {
  absl::MutexLock lock(&mu_);
  return pending_ == 0;
}

}  // namespace memplan
