// ChunkPager: residency, above the ChunkSet and the ChunkCollectives. Owns the device buffers of
// the non-persistent chunks and each chunk's home buffer ([Fixed buffer slots]), what each buffer
// holds, the uploads into them (or, sharded, the all-gathers of the shards) and the gathering
// and releasing of sharded persistent chunks; it points the parameters at their chunk's device
// memory and back at placeholders. Promise: after Acquire(g) every parameter of group g views
// its chunk's current values on the device, ordered before the compute stream's next work.
// Not thread-safe. Private to agent/chunks.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "agent/chunks/chunk_collectives.h"
#include "agent/chunks/chunk_manager.h"
#include "agent/chunks/chunk_set.h"
#include "agent/chunks/chunk_streams.h"
#include "agent/core/torch_pch.h"

namespace memplan::chunks {

class ChunkPager {
 public:
  // Called before a chunk's host parameters are read for an upload: what still writes them
  // (the CPU optimizer) must finish first.
  using HostWritesFn = std::function<void(int chunk)>;

  // The collaborators outlive the pager.
  ChunkPager(ChunkSet& set, ChunkStreams& streams, ChunkCollectives& collectives,
             HostWritesFn wait_host_writes)
      : set_(set),
        streams_(streams),
        collectives_(collectives),
        wait_host_writes_(std::move(wait_host_writes)) {}

  // [Fixed buffer slots] Gives every non-persistent chunk its home buffer (raising n_buffer,
  // with a warning, when the groups need more); AllocateBuffers then allocates them.
  absl::Status AssignHomes();
  absl::Status AllocateBuffers();

  // Makes group g's chunks resident (uploads or gathers them as needed, releasing sharded
  // persistent chunks that neither g nor the next group uses); false for an unknown group.
  bool Acquire(int group, bool forward);
  // Starts the next group's uploads in this direction without evicting anything g uses.
  void Prefetch(int group, bool forward);

  // Waits for the all-gather still writing chunk c's home buffer, if any (the CPU update may then
  // overwrite its host parameters); a failure is kept for Step().
  void FinishGatherOf(int c);
  // Waits for every gather in flight (failures kept for Step()).
  void FinishGathers();
  // Waits for the gathers that were started, for destruction (none may outlive its buffers).
  void WaitStartedGathers();
  // Forgets what every buffer holds: the next Acquire uploads fresh values. Releases the
  // gathered persistent chunks ([Sharded persistent parameters]).
  void InvalidateBuffers();
  void ReleaseAllPersistent();

  // The last upload (or shard copy) out of chunk c's host parameters, null when none.
  const EventPtr& uploaded(int c) const { return uploaded_[c]; }

  int min_buffers() const { return min_buffers_; }
  // Adds the buffers' figures to `stats`.
  void AddStats(ChunkMemoryStats& stats) const;
  // Uploads and gathers since creation or ResetUploadStats(); waits for those in flight.
  ChunkUploadStats UploadStats();
  void ResetUploadStats();

 private:
  struct DeviceBuffer {
    torch::Tensor storage;  // flat, model dtype, sized for the largest non-persistent chunk
    int chunk = -1;         // chunk whose current values it holds
    EventPtr ready;         // upload into it finished
    // Sharded: the all-gather (batch) writing into it, until this buffer waited for it.
    std::shared_ptr<GatherBatch> gather;
    // Sharded, CUDA: the chunk's shard copied to the device, input of `gather`; freed with it,
    // so a rank's device holds one shard per gather in flight, not 1/W of every offloaded chunk.
    torch::Tensor gather_src;
  };

  void Upload(int c);
  void Materialize(int c);
  void Dematerialize(int c);
  // [Sharded chunks] Queues the chunk's all-gather into `buffer` in the open batch ([Coalesced
  // gathers]); FlushGathers() starts the batch (at once when options.coalesce_gathers is off).
  void StartGather(int c, DeviceBuffer& buffer);
  void WaitGather(DeviceBuffer& buffer);
  // Waits for the all-gather into `buffer`, if any; a failure is remembered for Step().
  absl::Status FinishGather(DeviceBuffer& buffer);
  // [Sharded persistent parameters]: the chunk's all-gather into its own memory (queued in the
  // open batch), the compute stream's wait for it, and giving the memory back.
  void GatherPersistent(int c);
  void WaitPersistent(int c);
  void ReleasePersistent(int c);
  void FoldTimedUploads(bool wait);

  ChunkSet& set_;
  ChunkStreams& streams_;
  ChunkCollectives& collectives_;
  HostWritesFn wait_host_writes_;
  std::vector<int> home_;            // per chunk: its buffer, see [Fixed buffer slots]
  std::vector<bool> materialized_;   // per chunk: its parameters view the home buffer
  std::vector<EventPtr> uploaded_;   // per chunk: the last upload from its host parameters
  std::vector<bool> gathered_;       // per persistent chunk: its memory is attached and gathered
  std::vector<std::shared_ptr<GatherBatch>> gather_;  // per persistent chunk, until waited for
  std::vector<DeviceBuffer> buffers_;  // [0, shared_buffers_) shared, then one per oversized
  int shared_buffers_ = 0;
  int min_buffers_ = 0;
  int64_t buffer_device_bytes_ = 0;
  int persistent_gathers_ = 0;
  // Upload accounting: finished durations are folded into the stats; pairs of timing events
  // (start, end) whose copies may still run wait in timed_uploads_.
  int64_t uploads_ = 0;
  int64_t upload_bytes_ = 0;
  double upload_seconds_ = 0;
  std::vector<std::pair<EventPtr, EventPtr>> timed_uploads_;
};

}  // namespace memplan::chunks
