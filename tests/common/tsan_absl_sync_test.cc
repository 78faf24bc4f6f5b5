// TSan builds only: every hand-off below is ordered by an absl::Mutex, CondVar, Await or
// Notification, so ThreadSanitizer must stay silent. Without common/sanitize/tsan_absl_sync.cc
// (Debian's Abseil is not instrumented) TSan reports each of them as a data race and the binary
// exits 66, which fails the test; the assertions check that the threads really ran.
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace memplan {
namespace {

TEST(TsanAbslSyncTest, MutexLockOrdersWriters) {
  absl::Mutex mu;
  long counter = 0;  // guarded by mu, but plain so TSan watches it
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 5000; ++i) {
        absl::MutexLock lock(&mu);
        ++counter;
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(counter, 20000);
}

TEST(TsanAbslSyncTest, ReaderLockSeesTheWriterUnderLock) {
  absl::Mutex mu;
  long value = 0;
  long seen = 0;
  std::thread writer([&] {
    absl::MutexLock lock(&mu);
    value = 7;
  });
  writer.join();  // the join orders this test, the lock must not add a report either way
  std::thread reader([&] {
    absl::ReaderMutexLock lock(&mu);
    seen = value;
  });
  std::thread writer2([&] {
    absl::MutexLock lock(&mu);
    value = 8;
  });
  reader.join();
  writer2.join();
  EXPECT_TRUE(seen == 7 || seen == 8);
}

TEST(TsanAbslSyncTest, CondVarAndAwaitHandOff) {
  absl::Mutex mu;
  absl::CondVar cv;
  bool ready = false;
  long payload = 0;
  std::thread producer([&] {
    payload = 42;  // written before the lock, published by the unlock below
    absl::MutexLock lock(&mu);
    ready = true;
    cv.Signal();
  });
  {
    absl::MutexLock lock(&mu);
    while (!ready) cv.WaitWithTimeout(&mu, absl::Seconds(30));
  }
  EXPECT_EQ(payload, 42);
  producer.join();

  bool done = false;
  long second = 0;
  std::thread again([&] {
    second = 9;
    absl::MutexLock lock(&mu);
    done = true;
  });
  {
    absl::MutexLock lock(&mu);
    mu.Await(absl::Condition(&done));
  }
  EXPECT_EQ(second, 9);
  again.join();
}

TEST(TsanAbslSyncTest, NotificationPublishes) {
  absl::Notification notified;
  long payload = 0;
  std::thread t([&] {
    payload = 5;
    notified.Notify();
  });
  notified.WaitForNotification();
  EXPECT_EQ(payload, 5);
  t.join();
}

}  // namespace
}  // namespace memplan
