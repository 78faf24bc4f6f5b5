// ThreadSanitizer builds only (scripts/sanitize.sh tsan): makes absl::Mutex and absl::CondVar
// visible to TSan when Abseil itself was not built with -fsanitize=thread.
//
// Why this exists: Debian's libabsl_synchronization.so is compiled without TSan, so the
// ABSL_TSAN_MUTEX_* annotations inside mutex.cc are empty and TSan never learns that a Mutex
// orders two threads. Every field guarded by an absl::Mutex — ours, and the ones gRPC guards
// with grpc_core::Mutex, which wraps absl::Mutex — would then be reported as a race. Building
// Abseil and gRPC from source with TSan is the alternative; this file is much smaller.
//
// How: the functions below define the same (mangled) symbols as libabsl_synchronization.so. This
// file is built as a shared library that every TSan executable links before Abseil, so the
// dynamic loader binds every call — ours, gRPC's, and Abseil's own internal calls, which go
// through the PLT (absl::Notification locks its Mutex that way) — to these definitions. Each one
// tells TSan about the lock event with the public __tsan_mutex_* interface, the same calls and
// flags Abseil makes itself when it is built with TSan, and forwards to the real function found
// with dlsym(RTLD_NEXT).
//
// absl::Notification gets the same treatment (its fast paths are atomics inside Abseil).
//
// What it does not cover: synchronization gRPC does with bare atomics or lock-free queues stays
// invisible; scripts/tsan.supp names the reports that come from that, each with its reason.
#ifndef __SANITIZE_THREAD__
#error "common/sanitize/tsan_absl_sync.cc is for -fsanitize=thread builds only"
#endif

#include <dlfcn.h>
#include <sanitizer/tsan_interface.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"

namespace {

// The real function behind `symbol`, looked up once; abort with a message if Abseil changed.
template <typename Fn>
Fn Real(const char* symbol) {
  void* address = dlsym(RTLD_NEXT, symbol);
  if (address == nullptr) {
    std::fprintf(stderr, "tsan_absl_sync: %s not found in the next library (%s)\n", symbol,
                 dlerror());
    std::abort();
  }
  return reinterpret_cast<Fn>(address);
}

// Mangled names, in Debian's inline namespace (ABSL_OPTION_INLINE_NAMESPACE_NAME = debian3).
static_assert(sizeof(absl::Mutex) == sizeof(std::atomic<intptr_t>),
              "absl::Mutex is no longer one word: re-check tsan_absl_sync.cc");
#define MEMPLAN_ABSL_NS "_ZN4absl7debian3"
#define MEMPLAN_ABSL_NS_CONST "_ZNK4absl7debian3"  // const member functions

// Abseil's writer bit in the Mutex word (kMuWriter in mutex.cc), used to tell whether a thread
// waiting on a CondVar or in Await holds the Mutex shared or exclusive.
constexpr intptr_t kMuWriter = 0x0008;

unsigned HeldFlags(absl::Mutex* mu) {
  const auto* word = reinterpret_cast<const std::atomic<intptr_t>*>(mu);
  return (word->load(std::memory_order_relaxed) & kMuWriter) != 0 ? 0u : __tsan_mutex_read_lock;
}

// Abseil calls some of its own public functions through the PLT (CondVar::WaitWithTimeout calls
// WaitWithDeadline, for one), which lands here again: only the outermost call on a thread is
// annotated, as Abseil annotates only its public entry points.
thread_local int nesting = 0;
struct Nesting {
  Nesting() : inner(nesting++ > 0) {}
  ~Nesting() { --nesting; }
  Nesting(const Nesting&) = delete;
  Nesting& operator=(const Nesting&) = delete;
  const bool inner;
};

// A wait that gives the Mutex up and takes it back (CondVar::Wait, Mutex::Await). TSan ignores a
// thread's memory accesses between a pre_ and a post_ annotation, so the whole wait sits inside
// the unlock: the Condition that Abseil evaluates while waiting (really under the lock, where TSan
// cannot see the lock) reads nothing TSan would misjudge, as in Abseil's own annotations.
template <typename Wait>
auto AroundWait(absl::Mutex* mu, Wait&& wait) {
  const unsigned flags = HeldFlags(mu);
  __tsan_mutex_pre_unlock(mu, flags);
  auto result = wait();
  __tsan_mutex_post_unlock(mu, flags);
  __tsan_mutex_pre_lock(mu, flags);
  __tsan_mutex_post_lock(mu, flags, 0);
  return result;
}

// A lock that may fail (TryLock, LockWhenWithTimeout...): TSan records the lock only on success.
template <typename Lock>
bool AroundTry(absl::Mutex* mu, unsigned flags, Lock&& lock) {
  __tsan_mutex_pre_lock(mu, flags | __tsan_mutex_try_lock);
  const bool locked = lock();
  __tsan_mutex_post_lock(mu, flags | __tsan_mutex_try_lock | (locked ? 0 : __tsan_mutex_try_lock_failed),
                         0);
  return locked;
}

}  // namespace

namespace absl {
ABSL_NAMESPACE_BEGIN

Mutex::~Mutex() {
  static const auto real = Real<void (*)(Mutex*)>(MEMPLAN_ABSL_NS "5MutexD2Ev");
  const Nesting n;
  if (!n.inner) __tsan_mutex_destroy(this, __tsan_mutex_not_static);
  real(this);
}

void Mutex::Lock() {
  static const auto real = Real<void (*)(Mutex*)>(MEMPLAN_ABSL_NS "5Mutex4LockEv");
  const Nesting n;
  if (n.inner) return real(this);
  __tsan_mutex_pre_lock(this, 0);
  real(this);
  __tsan_mutex_post_lock(this, 0, 0);
}

void Mutex::ReaderLock() {
  static const auto real = Real<void (*)(Mutex*)>(MEMPLAN_ABSL_NS "5Mutex10ReaderLockEv");
  const Nesting n;
  if (n.inner) return real(this);
  __tsan_mutex_pre_lock(this, __tsan_mutex_read_lock);
  real(this);
  __tsan_mutex_post_lock(this, __tsan_mutex_read_lock, 0);
}

void Mutex::Unlock() {
  static const auto real = Real<void (*)(Mutex*)>(MEMPLAN_ABSL_NS "5Mutex6UnlockEv");
  const Nesting n;
  if (n.inner) return real(this);
  __tsan_mutex_pre_unlock(this, 0);
  real(this);
  __tsan_mutex_post_unlock(this, 0);
}

void Mutex::ReaderUnlock() {
  static const auto real = Real<void (*)(Mutex*)>(MEMPLAN_ABSL_NS "5Mutex12ReaderUnlockEv");
  const Nesting n;
  if (n.inner) return real(this);
  __tsan_mutex_pre_unlock(this, __tsan_mutex_read_lock);
  real(this);
  __tsan_mutex_post_unlock(this, __tsan_mutex_read_lock);
}

bool Mutex::TryLock() {
  static const auto real = Real<bool (*)(Mutex*)>(MEMPLAN_ABSL_NS "5Mutex7TryLockEv");
  const Nesting n;
  if (n.inner) return real(this);
  return AroundTry(this, 0, [&] { return real(this); });
}

bool Mutex::ReaderTryLock() {
  static const auto real = Real<bool (*)(Mutex*)>(MEMPLAN_ABSL_NS "5Mutex13ReaderTryLockEv");
  const Nesting n;
  if (n.inner) return real(this);
  return AroundTry(this, __tsan_mutex_read_lock, [&] { return real(this); });
}

void Mutex::LockWhen(const Condition& cond) {
  static const auto real =
      Real<void (*)(Mutex*, const Condition&)>(MEMPLAN_ABSL_NS "5Mutex8LockWhenERKNS0_9ConditionE");
  const Nesting n;
  if (n.inner) return real(this, cond);
  __tsan_mutex_pre_lock(this, 0);
  real(this, cond);
  __tsan_mutex_post_lock(this, 0, 0);
}

void Mutex::ReaderLockWhen(const Condition& cond) {
  static const auto real = Real<void (*)(Mutex*, const Condition&)>(
      MEMPLAN_ABSL_NS "5Mutex14ReaderLockWhenERKNS0_9ConditionE");
  const Nesting n;
  if (n.inner) return real(this, cond);
  __tsan_mutex_pre_lock(this, __tsan_mutex_read_lock);
  real(this, cond);
  __tsan_mutex_post_lock(this, __tsan_mutex_read_lock, 0);
}

// The timed LockWhen variants return whether the condition held, but take the Mutex either way.
bool Mutex::LockWhenWithTimeout(const Condition& cond, absl::Duration timeout) {
  static const auto real = Real<bool (*)(Mutex*, const Condition&, absl::Duration)>(
      MEMPLAN_ABSL_NS "5Mutex19LockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  const Nesting n;
  if (n.inner) return real(this, cond, timeout);
  __tsan_mutex_pre_lock(this, 0);
  const bool held = real(this, cond, timeout);
  __tsan_mutex_post_lock(this, 0, 0);
  return held;
}

bool Mutex::LockWhenWithDeadline(const Condition& cond, absl::Time deadline) {
  static const auto real = Real<bool (*)(Mutex*, const Condition&, absl::Time)>(
      MEMPLAN_ABSL_NS "5Mutex20LockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  const Nesting n;
  if (n.inner) return real(this, cond, deadline);
  __tsan_mutex_pre_lock(this, 0);
  const bool held = real(this, cond, deadline);
  __tsan_mutex_post_lock(this, 0, 0);
  return held;
}

bool Mutex::ReaderLockWhenWithTimeout(const Condition& cond, absl::Duration timeout) {
  static const auto real = Real<bool (*)(Mutex*, const Condition&, absl::Duration)>(
      MEMPLAN_ABSL_NS "5Mutex25ReaderLockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  const Nesting n;
  if (n.inner) return real(this, cond, timeout);
  __tsan_mutex_pre_lock(this, __tsan_mutex_read_lock);
  const bool held = real(this, cond, timeout);
  __tsan_mutex_post_lock(this, __tsan_mutex_read_lock, 0);
  return held;
}

bool Mutex::ReaderLockWhenWithDeadline(const Condition& cond, absl::Time deadline) {
  static const auto real = Real<bool (*)(Mutex*, const Condition&, absl::Time)>(
      MEMPLAN_ABSL_NS "5Mutex26ReaderLockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  const Nesting n;
  if (n.inner) return real(this, cond, deadline);
  __tsan_mutex_pre_lock(this, __tsan_mutex_read_lock);
  const bool held = real(this, cond, deadline);
  __tsan_mutex_post_lock(this, __tsan_mutex_read_lock, 0);
  return held;
}

void Mutex::Await(const Condition& cond) {
  static const auto real =
      Real<void (*)(Mutex*, const Condition&)>(MEMPLAN_ABSL_NS "5Mutex5AwaitERKNS0_9ConditionE");
  const Nesting n;
  if (n.inner) return real(this, cond);
  AroundWait(this, [&] {
    real(this, cond);
    return 0;
  });
}

bool Mutex::AwaitWithTimeout(const Condition& cond, absl::Duration timeout) {
  static const auto real = Real<bool (*)(Mutex*, const Condition&, absl::Duration)>(
      MEMPLAN_ABSL_NS "5Mutex16AwaitWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  const Nesting n;
  if (n.inner) return real(this, cond, timeout);
  return AroundWait(this, [&] { return real(this, cond, timeout); });
}

bool Mutex::AwaitWithDeadline(const Condition& cond, absl::Time deadline) {
  static const auto real = Real<bool (*)(Mutex*, const Condition&, absl::Time)>(
      MEMPLAN_ABSL_NS "5Mutex17AwaitWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  const Nesting n;
  if (n.inner) return real(this, cond, deadline);
  return AroundWait(this, [&] { return real(this, cond, deadline); });
}

void CondVar::Wait(Mutex* mu) {
  static const auto real =
      Real<void (*)(CondVar*, Mutex*)>(MEMPLAN_ABSL_NS "7CondVar4WaitEPNS0_5MutexE");
  const Nesting n;
  if (n.inner) return real(this, mu);
  AroundWait(mu, [&] {
    real(this, mu);
    return 0;
  });
}

bool CondVar::WaitWithTimeout(Mutex* mu, absl::Duration timeout) {
  static const auto real = Real<bool (*)(CondVar*, Mutex*, absl::Duration)>(
      MEMPLAN_ABSL_NS "7CondVar15WaitWithTimeoutEPNS0_5MutexENS0_8DurationE");
  const Nesting n;
  if (n.inner) return real(this, mu, timeout);
  return AroundWait(mu, [&] { return real(this, mu, timeout); });
}

bool CondVar::WaitWithDeadline(Mutex* mu, absl::Time deadline) {
  static const auto real = Real<bool (*)(CondVar*, Mutex*, absl::Time)>(
      MEMPLAN_ABSL_NS "7CondVar16WaitWithDeadlineEPNS0_5MutexENS0_4TimeE");
  const Nesting n;
  if (n.inner) return real(this, mu, deadline);
  return AroundWait(mu, [&] { return real(this, mu, deadline); });
}

// Notification: a waiter that finds the flag already set returns on an atomic load inside Abseil,
// without touching the Mutex, and HasBeenNotified() is an inline acquire load of the same flag.
// Notify() therefore releases on the flag's address (which the inline load, compiled with TSan,
// acquires) and the waits acquire it when they return notified.
static_assert(sizeof(Notification) == 2 * sizeof(Mutex),
              "absl::Notification is no longer {Mutex, atomic<bool>}: re-check tsan_absl_sync.cc");

namespace {
void* NotifiedFlag(const Notification* n) {
  return const_cast<char*>(reinterpret_cast<const char*>(n)) + sizeof(Mutex);
}
}  // namespace

void Notification::Notify() {
  static const auto real = Real<void (*)(Notification*)>(MEMPLAN_ABSL_NS "12Notification6NotifyEv");
  __tsan_release(NotifiedFlag(this));
  real(this);
}

void Notification::WaitForNotification() const {
  static const auto real = Real<void (*)(const Notification*)>(
      MEMPLAN_ABSL_NS_CONST "12Notification19WaitForNotificationEv");
  real(this);
  __tsan_acquire(NotifiedFlag(this));
}

bool Notification::WaitForNotificationWithTimeout(absl::Duration timeout) const {
  static const auto real = Real<bool (*)(const Notification*, absl::Duration)>(
      MEMPLAN_ABSL_NS_CONST "12Notification30WaitForNotificationWithTimeoutENS0_8DurationE");
  const bool notified = real(this, timeout);
  if (notified) __tsan_acquire(NotifiedFlag(this));
  return notified;
}

bool Notification::WaitForNotificationWithDeadline(absl::Time deadline) const {
  static const auto real = Real<bool (*)(const Notification*, absl::Time)>(
      MEMPLAN_ABSL_NS_CONST "12Notification31WaitForNotificationWithDeadlineENS0_4TimeE");
  const bool notified = real(this, deadline);
  if (notified) __tsan_acquire(NotifiedFlag(this));
  return notified;
}

ABSL_NAMESPACE_END
}  // namespace absl
