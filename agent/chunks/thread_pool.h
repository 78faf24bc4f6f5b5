// ThreadPool: fixed worker threads running queued closures (the CPU optimizer's executor), and
// TaskTracker: counts outstanding tasks so a caller can wait for a batch. Torch-free.
// Both are thread-safe.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace memplan {

class ThreadPool {
 public:
  // num_threads <= 0 runs every task inline in Schedule().
  explicit ThreadPool(int num_threads);
  // Runs the tasks still queued, then joins the workers.
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  // Tasks run in the order they were scheduled, until QueueInOrder() reorders those not started.
  // An urgent task runs before every queued task that is not urgent (urgent ones keep their
  // scheduling order among themselves): [Urgent accumulations] a caller that will soon wait for
  // it must not wait behind the whole queue.
  void Schedule(std::function<void()> task, int64_t order = 0, bool urgent = false);
  // Stable-sorts the tasks still queued by their `order` (smallest first); running ones and
  // urgent ones go on as they were.
  // [Deferred CPU updates]: an unclipped step's updates were queued as backward freed their
  // chunks, last block first; the next forward needs them first block first.
  void QueueInOrder();
  int num_threads() const { return static_cast<int>(workers_.size()); }

 private:
  void WorkerLoop();

  absl::Mutex mu_;
  std::deque<std::pair<int64_t, std::function<void()>>> queue_ ABSL_GUARDED_BY(mu_);
  std::deque<std::function<void()>> urgent_ ABSL_GUARDED_BY(mu_);  // taken before queue_
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> workers_;
};

// Add() before scheduling, Done() at the end of each task, Wait() for all of them.
class TaskTracker {
 public:
  void Add(int n = 1);
  void Done();
  void Wait();
  bool Idle();

 private:
  absl::Mutex mu_;
  int pending_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace memplan
