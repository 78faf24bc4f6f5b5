#include "agent/profiler/memory_timeline.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "agent/core/seconds_since.h"
#include "agent/io/writable_file.h"

namespace memplan {

void MemoryTimeline::BeginStep(int64_t step) {
  step_ = step;
  recording_ = true;
  step_peak_allocated_ = 0;
  step_peak_reserved_ = 0;
  probe_->ResetPeak();
  step_start_ = std::chrono::steady_clock::now();
  Record("step_begin", -1);
}

void MemoryTimeline::Mark(const std::string& label) { Record(label.c_str(), -1); }

void MemoryTimeline::EndStep() {
  Record("step_end", -1);
  recording_ = false;
}

void MemoryTimeline::Record(const char* event, int group) {
  if (!recording_) return;
  MemoryEvent e;
  e.step = step_;
  e.event = event;
  e.group = group;
  e.allocated = probe_->AllocatedBytes();
  e.reserved = probe_->ReservedBytes();
  e.peak_since = probe_->PeakAllocatedBytes();
  const MemoryProbe::Detail detail = probe_->AllocatorDetail();
  e.active = detail.active;
  e.peak_active_since = detail.peak_active;
  e.inactive_split = detail.inactive_split;
  e.device_allocs = detail.device_allocs;
  e.seconds = SecondsSince(step_start_);
  e.cpu_updates = cpu_updates_ ? cpu_updates_() : -1;
  probe_->ResetPeak();
  step_peak_allocated_ = std::max(step_peak_allocated_, e.peak_since);
  step_peak_reserved_ = std::max(step_peak_reserved_, e.reserved);
  events_.push_back(std::move(e));
}

absl::Status MemoryTimeline::WriteTsv(const std::string& path) const {
  std::string text =
      "step\tevent\tgroup\tallocated\treserved\tpeak_since_previous\tactive\t"
      "peak_active_since_previous\tinactive_split\tdevice_allocs\tseconds\tcpu_updates_started\n";
  for (const MemoryEvent& e : events_) {
    absl::StrAppend(&text, e.step, "\t", e.event, "\t", e.group, "\t", e.allocated, "\t",
                    e.reserved, "\t", e.peak_since, "\t", e.active, "\t", e.peak_active_since,
                    "\t", e.inactive_split, "\t", e.device_allocs, "\t",
                    absl::StrFormat("%.6f", e.seconds), "\t", e.cpu_updates, "\n");
  }
  const std::string tmp = path + ".tmp";
  if (absl::Status s = io::WriteFileDurably(tmp, text); !s.ok()) return s;
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return absl::InternalError(
        absl::StrCat("memory timeline: rename ", tmp, " -> ", path, ": ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

}  // namespace memplan
