// ChunkCollectives: the ZeRO collectives of a sharded ChunkManager ([Sharded chunks] in
// chunk_manager.cc), above the ChunkSet. Owns the all-gather batches ([Coalesced gathers]) and
// their timing, the reduce-scatters and all-reduces of gradients in flight, and the first failed
// collective. Promise: every rank issues the same collectives in the same order when the layers
// above make the same calls, and none outlives its tensors. It never schedules optimizer work: a
// finished reduce-scatter is reported through the callbacks ("shard staged", "state shard
// reduced"). Not thread-safe. Private to agent/chunks.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "agent/chunks/chunk_manager.h"
#include "agent/chunks/chunk_set.h"
#include "agent/chunks/chunk_streams.h"
#include "agent/core/torch_pch.h"
#include "agent/dist/communicator.h"

namespace memplan::chunks {

// [Coalesced gathers] The all-gathers of the chunks one Acquire() uploads (a group's, or the
// next group's prefetch), started as one collective once the loop has queued them all: one NCCL
// group call and kernel per group instead of one per chunk, as FSDP2 gathers a module's
// parameters at once. A collective's kernel waits for free SMs behind the compute stream's
// kernels; one wait per group instead of one per chunk is what raises the gathers' share of the
// link's bandwidth in training (docs/benchmarks.md). Every rank forms the same batches: they
// depend only on the layout and the hook sequence.
struct GatherBatch {
  std::unique_ptr<PendingCollective> work;     // null until started (FlushGathers)
  std::vector<torch::Tensor> outputs, inputs;  // queued, until started
  int64_t bytes = 0;                           // output bytes of the whole batch
  bool waited = false;
  absl::Status status;  // of the wait, once waited
};

class ChunkCollectives {
 public:
  // [Reduce-scatter in backward] A chunk's reduced shard is in its host staging area (`copied`:
  // the device-to-host copy, null on the CPU); `squares`: its squared norm as the host will hold
  // it, when the reduce carried the step's whole gradient (else undefined).
  struct ShardStaged {
    int chunk = -1;
    bool update_now = false;
    EventPtr copied;
    torch::Tensor squares;
  };
  using ShardStagedFn = std::function<void(const ShardStaged&)>;
  // [Sharded persistent state] A persistent chunk's reduce-scatter finished: `sum` is this rank's
  // shard of the sum over the ranks (fp32, on the device); the callee divides by the world size
  // (in place where it likes: the tensor is the callee's from then on).
  using StateShardFn = std::function<void(int chunk, const torch::Tensor& sum)>;

  // `comm`: null unless the world size is > 1. `set` and `streams` outlive this.
  ChunkCollectives(ChunkSet& set, ChunkStreams& streams, Communicator* comm)
      : set_(set), streams_(streams), comm_(comm) {}
  void SetCallbacks(ShardStagedFn shard_staged, StateShardFn state_shard) {
    shard_staged_ = std::move(shard_staged);
    state_shard_ = std::move(state_shard);
  }

  Communicator& comm() { return *comm_; }
  int world() const { return set_.world(); }

  // Keeps `s` as the first failure when it is one; returns it.
  absl::Status NoteCollective(const absl::Status& s) {
    if (!s.ok() && status_.ok()) status_ = s;
    return s;
  }
  // The first failed collective (OK when none).
  const absl::Status& status() const { return status_; }
  // A failed collective inside a hook: remembered for Step() and thrown (c10::Error) so that
  // autograd unwinds.
  void FailCollective(const absl::Status& status);

  // Counts an all-gather of `bytes` (output) and returns the open batch it joins, opening one.
  std::shared_ptr<GatherBatch> JoinGatherBatch(int64_t bytes);
  // Starts the open batch, ordered after the upload stream.
  void FlushGathers();
  // Waits for `gather` (started first if still queued) and moves it out; a failure is remembered
  // for Step(). Finished batches go to the collective timing.
  absl::Status FinishBatch(std::shared_ptr<GatherBatch>& gather);
  // Forgets a batch still queued (a hook unwound mid-loop): it was never started, and starting it
  // now could wait on ranks that have gone.
  void DropOpenBatch() { open_gathers_.reset(); }
  // [Collective timing] Reads the device time of finished batches into the gather stats.
  void FoldTimedGathers(bool wait);
  // The all-gathers counted since creation or ResetStats() (uploads, bytes, gathers*).
  const ChunkUploadStats& gather_stats() const { return stats_; }
  void ResetStats() { stats_ = ChunkUploadStats(); }

  // [Reduce-scatter in backward] Reduce-scatters chunk c's fp32 grads (`grad_flat`, padded) into
  // its host staging area `stage` (model dtype, this rank's shard); at most two in flight (the
  // oldest finishes first). Finishing divides by W and reports ShardStaged.
  void StartShardReduce(int c, torch::Tensor grad_flat, const torch::Tensor& stage,
                        bool whole_step, bool update_now);
  absl::Status FinishShardReduces();
  int pending_shard_reduces() const { return static_cast<int>(pending_shard_reduces_.size()); }

  // [Persistent all-reduce in backward] All-reduces `flat` (fp32, the concatenated `grads`),
  // then copies the mean back into `grads`; one in flight (call FinishPersistentReduce first).
  void StartAllReduce(torch::Tensor flat, std::vector<torch::Tensor> grads);
  // [State reduce-scatter per group] Reduce-scatters chunk c's padded grads (fp32, or the model's
  // 16-bit dtype: [Narrow reduce-scatter]) into an fp32 sum; finishing reports it to
  // StateShardFn.
  void StartStateReduceScatter(int c, torch::Tensor flat);
  absl::Status FinishStateReduces();
  // Device bytes of the state reduce-scatters in flight (their fp32 flat inputs and fp32 shard
  // outputs, as allocated): what the planner charges per stage (StateReduceScatterBytes,
  // common/optimizer_bytes.h).
  int64_t state_reduce_bytes() const { return state_reduce_bytes_; }
  // Finishes the state reduce-scatters, then the all-reduce in flight.
  absl::Status FinishPersistentReduce();

  // Every rank's `shard` (any device, the same size on each), concatenated in rank order, on the
  // CPU (a collective; a failure throws). GatherHost gathers `elems` (default: the chunk's shard)
  // of a host array.
  torch::Tensor GatherDevice(const torch::Tensor& shard);
  torch::Tensor GatherHost(const void* data, torch::ScalarType dtype, const Chunk& chunk,
                           int64_t elems = -1);

  // Ends the step: waits for every reduction in flight (none may outlive its tensors) and drops
  // them.
  void ResetStep();

 private:
  struct PendingShardReduce {
    int chunk = -1;
    std::unique_ptr<PendingCollective> work;
    torch::Tensor grad_flat;  // the input, alive until the collective is done
    torch::Tensor shard;      // the output (the host staging itself for an fp32 CPU model)
    torch::Tensor stage;      // the host staging area
    bool in_place = false;
    bool whole_step = false;  // the step's whole grad: its squares are summed on finishing
    bool update_now = false;  // the update may start once the shard is staged
  };
  struct PendingReduce {
    std::unique_ptr<PendingCollective> work;
    torch::Tensor flat;
    std::vector<torch::Tensor> grads;
    // [Sharded persistent state]: a reduce-scatter of chunk `chunk` into `shard` instead.
    int chunk = -1;
    torch::Tensor shard;
  };
  absl::Status FinishShardReduce(PendingShardReduce& r);

  ChunkSet& set_;
  ChunkStreams& streams_;
  Communicator* comm_ = nullptr;  // set only when the world size is > 1
  ShardStagedFn shard_staged_;
  StateShardFn state_shard_;
  absl::Status status_;  // the first failed collective
  std::shared_ptr<GatherBatch> open_gathers_;
  // [Collective timing] Finished all-gathers (batches) whose device time is not read yet, oldest
  // first; at most kMaxTimedGathers are kept (each may hold its input shards).
  std::deque<std::shared_ptr<GatherBatch>> timed_gathers_;
  static constexpr size_t kMaxTimedGathers = 2;
  ChunkUploadStats stats_;
  std::optional<PendingReduce> pending_reduce_;
  std::vector<PendingReduce> pending_state_reduces_;
  int64_t state_reduce_bytes_ = 0;  // of pending_state_reduces_
  std::vector<PendingShardReduce> pending_shard_reduces_;
};

}  // namespace memplan::chunks
