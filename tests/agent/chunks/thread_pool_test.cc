#include "agent/chunks/thread_pool.h"

#include <atomic>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"

namespace memplan {
namespace {

TEST(ThreadPoolTest, RunsEveryTaskAndTrackerWaitsForAll) {
  for (int threads : {0, 1, 3}) {
    ThreadPool pool(threads);
    TaskTracker tracker;
    std::vector<int> slots(1000, 0);
    tracker.Add(static_cast<int>(slots.size()));
    for (size_t i = 0; i < slots.size(); ++i) {
      pool.Schedule([&slots, &tracker, i] {
        slots[i] = static_cast<int>(i) + 1;
        tracker.Done();
      });
    }
    tracker.Wait();
    EXPECT_TRUE(tracker.Idle());
    for (size_t i = 0; i < slots.size(); ++i) ASSERT_EQ(slots[i], static_cast<int>(i) + 1);
  }
}

TEST(ThreadPoolTest, DestructorDrainsTheQueue) {
  std::atomic<int> ran{0};
  {
    ThreadPool pool(2);
    for (int i = 0; i < 100; ++i) pool.Schedule([&ran] { ran.fetch_add(1); });
  }
  EXPECT_EQ(ran.load(), 100);
}

// A one-worker pool whose worker holds a first task (recorded as 0) until Release(), so that
// what is scheduled meanwhile queues behind it; Run() records each task's id in the order the
// worker runs them.
class HeldPool {
 public:
  explicit HeldPool(int tasks) {
    tracker_.Add(tasks + 1);
    pool_.Schedule([this] {
      absl::MutexLock lock(&mu_);
      started_ = true;
      mu_.Await(absl::Condition(&release_));
      ran_.push_back(0);
      tracker_.Done();
    });
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(&started_));
  }
  void Schedule(int id, int64_t order, bool urgent = false) {
    pool_.Schedule([this, id] {
      absl::MutexLock lock(&mu_);
      ran_.push_back(id);
      tracker_.Done();
    }, order, urgent);
  }
  ThreadPool& pool() { return pool_; }
  // Lets the worker go and returns the ids in the order they ran.
  std::vector<int> Release() {
    {
      absl::MutexLock lock(&mu_);
      release_ = true;
    }
    tracker_.Wait();
    absl::MutexLock lock(&mu_);
    return ran_;
  }

 private:
  absl::Mutex mu_;
  bool release_ = false;
  bool started_ = false;
  std::vector<int> ran_;
  TaskTracker tracker_;
  ThreadPool pool_{1};  // last: its destructor joins the worker before the members above go
};

// [Deferred CPU updates] What is queued behind a running task runs by its order once
// QueueInOrder() is called (equal orders keep their scheduling order); the running one goes on.
TEST(ThreadPoolTest, QueueInOrderRunsWhatWaitsSmallestOrderFirst) {
  HeldPool held(5);
  // Queued as backward frees chunks: last first; two tasks of chunk 3 in their own order.
  for (const auto& [id, order] : std::vector<std::pair<int, int64_t>>{
           {31, 3}, {32, 3}, {2, 2}, {11, 1}, {12, 1}}) {
    held.Schedule(id, order);
  }
  held.pool().QueueInOrder();
  EXPECT_EQ(held.Release(), (std::vector<int>{0, 11, 12, 2, 31, 32}));
}

// [Urgent accumulations] An urgent task queued behind others runs before every queued task that
// is not urgent, urgent ones in their own order, and QueueInOrder() leaves them first.
TEST(ThreadPoolTest, UrgentTasksRunBeforeTheQueuedOnes) {
  HeldPool held(6);
  // Updates of chunks 5 and 4, then an accumulation of chunk 3, an update of 2, another
  // accumulation (of chunk 1), an update of chunk 0.
  for (const auto& [id, order, urgent] : std::vector<std::tuple<int, int64_t, bool>>{
           {5, 5, false}, {4, 4, false}, {103, 3, true}, {2, 2, false}, {101, 1, true},
           {6, 0, false}}) {
    held.Schedule(id, order, urgent);
  }
  held.pool().QueueInOrder();
  EXPECT_EQ(held.Release(), (std::vector<int>{0, 103, 101, 6, 2, 4, 5}));
}

}  // namespace
}  // namespace memplan
