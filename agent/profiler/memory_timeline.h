// MemoryTimeline: a ParamResidency observer that records device memory at every group hook of a
// training step (allocated and reserved bytes at the hook, and the allocated peak since the
// previous hook), so a plan's real memory curve can be laid next to the cost model's phases.
// Reading the caching allocator's counters needs no device synchronisation, so the timeline
// changes neither the schedule nor the memory it observes.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "agent/core/param_residency.h"
#include "agent/profiler/memory_probe.h"

namespace memplan {

struct MemoryEvent {
  int64_t step = 0;         // the step being recorded (as set by BeginStep)
  std::string event;        // pre_forward, post_forward, pre_backward, post_backward, or a mark
  int group = -1;           // -1 for marks
  int64_t allocated = 0;    // live tensor bytes at the event
  int64_t reserved = 0;     // bytes held by the allocator at the event
  int64_t peak_since = 0;   // allocated peak between the previous event and this one
  // The allocator's detail at the event (MemoryProbe::Detail): active bytes (allocated plus freed
  // blocks waiting for another stream), their peak since the previous event, free pieces of
  // split segments, and the count of segment allocations/expansions so far.
  int64_t active = 0;
  int64_t peak_active_since = 0;
  int64_t inactive_split = 0;
  int64_t device_allocs = 0;
  // Host seconds since the step's step_begin event (when the hook ran: backward's hooks follow the
  // device where the host waits for it), and the offloaded chunks whose CPU update had started
  // by then (SetCpuUpdateCounter; -1 without a counter): together, the CPU optimizer's overlap
  // with backward.
  double seconds = 0;
  int64_t cpu_updates = -1;
};

// Not thread-safe (like every ParamResidency); the probe must outlive the timeline.
class MemoryTimeline final : public ParamResidency {
 public:
  explicit MemoryTimeline(MemoryProbe* probe) : probe_(probe) {}

  // Starts recording `step` (resets the probe's peak); events before the first BeginStep and
  // after EndStep are ignored.
  void BeginStep(int64_t step);
  void Mark(const std::string& label);  // a labelled event (e.g. "optimizer_done")
  // Read at every event for MemoryEvent::cpu_updates (e.g. ChunkManager::UpdatesStartedBeforeStep).
  void SetCpuUpdateCounter(std::function<int64_t()> counter) { cpu_updates_ = std::move(counter); }
  void EndStep();
  bool recording() const { return recording_; }

  void PreForward(int group) override { Record("pre_forward", group); }
  void PostForward(int group) override { Record("post_forward", group); }
  void PreBackward(int group) override { Record("pre_backward", group); }
  void PostBackward(int group) override { Record("post_backward", group); }

  const std::vector<MemoryEvent>& events() const { return events_; }
  // Peaks of the current (or last) recorded step over all its events. The timeline resets the
  // probe's peak at every event, so whoever else reads that peak sees only the last interval:
  // use these instead while a timeline records.
  int64_t StepPeakAllocated() const { return step_peak_allocated_; }
  int64_t StepPeakReserved() const { return step_peak_reserved_; }
  // Tab-separated, one header line; written to `path` + ".tmp" and renamed.
  absl::Status WriteTsv(const std::string& path) const;

 private:
  void Record(const char* event, int group);

  MemoryProbe* probe_;
  bool recording_ = false;
  int64_t step_ = 0;
  int64_t step_peak_allocated_ = 0;
  int64_t step_peak_reserved_ = 0;
  std::vector<MemoryEvent> events_;
  std::function<int64_t()> cpu_updates_;
  std::chrono::steady_clock::time_point step_start_;
};

}  // namespace memplan
