#include "agent/chunks/thread_pool.h"

#include <atomic>
#include <vector>

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

}  // namespace
}  // namespace memplan
