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

// [Deferred CPU updates] What is queued behind a running task runs by its order once
// QueueInOrder() is called (equal orders keep their scheduling order); the running one goes on.
TEST(ThreadPoolTest, QueueInOrderRunsWhatWaitsSmallestOrderFirst) {
  ThreadPool pool(1);
  TaskTracker tracker;
  absl::Mutex mu;
  bool release = false;
  bool started = false;
  std::vector<int> ran;
  auto record = [&](int id) {
    absl::MutexLock lock(&mu);
    ran.push_back(id);
  };
  tracker.Add(6);
  // The one worker holds this task until the queue behind it is sorted.
  pool.Schedule([&] {
    absl::MutexLock lock(&mu);
    started = true;
    mu.Await(absl::Condition(&release));
    ran.push_back(0);
    tracker.Done();
  }, /*order=*/9);
  {
    absl::MutexLock lock(&mu);
    mu.Await(absl::Condition(&started));
  }
  // Queued as backward frees chunks: last first; two tasks of chunk 3 in their own order.
  for (const auto& [id, order] : std::vector<std::pair<int, int64_t>>{
           {31, 3}, {32, 3}, {2, 2}, {11, 1}, {12, 1}}) {
    pool.Schedule([&record, &tracker, id = id] {
      record(id);
      tracker.Done();
    }, order);
  }
  pool.QueueInOrder();
  {
    absl::MutexLock lock(&mu);
    release = true;
  }
  tracker.Wait();
  EXPECT_EQ(ran, (std::vector<int>{0, 11, 12, 2, 31, 32}));
}

// [Urgent accumulations] An urgent task queued behind others runs before every queued task that
// is not urgent, urgent ones in their own order, and QueueInOrder() leaves them first.
TEST(ThreadPoolTest, UrgentTasksRunBeforeTheQueuedOnes) {
  ThreadPool pool(1);
  TaskTracker tracker;
  absl::Mutex mu;
  bool release = false;
  bool started = false;
  std::vector<int> ran;
  tracker.Add(7);
  pool.Schedule([&] {
    absl::MutexLock lock(&mu);
    started = true;
    mu.Await(absl::Condition(&release));
    ran.push_back(0);
    tracker.Done();
  });
  {
    absl::MutexLock lock(&mu);
    mu.Await(absl::Condition(&started));
  }
  // Updates of chunks 5 and 4, then an accumulation of chunk 3, an update of 2, another
  // accumulation (of chunk 1).
  for (const auto& [id, order, urgent] : std::vector<std::tuple<int, int64_t, bool>>{
           {5, 5, false}, {4, 4, false}, {103, 3, true}, {2, 2, false}, {101, 1, true},
           {6, 0, false}}) {
    pool.Schedule([&mu, &ran, &tracker, id = id] {
      absl::MutexLock lock(&mu);
      ran.push_back(id);
      tracker.Done();
    }, order, urgent);
  }
  pool.QueueInOrder();
  {
    absl::MutexLock lock(&mu);
    release = true;
  }
  tracker.Wait();
  EXPECT_EQ(ran, (std::vector<int>{0, 103, 101, 6, 2, 4, 5}));
}

}  // namespace
}  // namespace memplan
