#include "agent/chunks/chunk_manager.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <deque>
#include <future>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "agent/chunks/adamw8bit_torch.h"
#include "agent/chunks/cpu_adamw.h"
#include "agent/chunks/host_buffer.h"
#include "agent/chunks/thread_pool.h"
#include "agent/chunks/torch_sqrt.h"
#include "common/chunk_packing.h"
#include "common/log.h"
#include "common/optimizer_bytes.h"
#include "common/status.h"

#if __has_include(<c10/cuda/CUDAStream.h>)
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#define MEMPLAN_CHUNKS_CUDA 1
#endif

// [Fixed buffer slots]
// Autograd keeps, for the backward of a block that is neither checkpointed nor swapped, the
// tensors its forward saved — including views of the weights (matmul saves w.t()). Those views
// point into the device buffer that held the chunk during forward. So every non-persistent chunk
// has a home buffer and is always uploaded into it at the same offsets: when backward brings the
// chunk back, the saved views see the right values again. Homes are assigned round-robin (so the
// next chunk can be prefetched while the current one computes), skipping buffers taken by chunks
// that some group needs at the same time (a tied LM head needs the embedding's chunk). The
// shared buffers are sized for the largest regular chunk; an oversized chunk (one parameter
// larger than the chunk size) has a buffer of its own, appended after the shared ones.

// [Sharded chunks]
// With a communicator of world size W > 1 (ZeRO-3 over chunks), a non-persistent chunk of S
// elements is padded to P = W * ceil(S / W) and rank r holds elements [r P / W, (r + 1) P / W)
// of it: its shard of the parameters (upload source), of the grad staging area and of the
// optimizer state (master, grad sum, moments), all sized P / W. Everything that works on ranges
// (the CPU optimizer, loading) intersects a parameter's range with the shard (Owned()); with
// W = 1 the shard is the whole chunk and the code is the unsharded one.
// * Upload becomes an all-gather of the shards into the chunk's home buffer (on CUDA the shard is
//   first copied to the device on the upload stream; the collective is ordered after it), started
//   where the upload was (prefetch included) and waited for in Materialize.
// * Backward writes the chunk's grads into one flat fp32 device tensor of P elements (added when
//   a tied parameter's grad arrives twice in a micro-batch); when the chunk's last group is done,
//   the tensor is reduce-scattered in fp32, divided by W (the mean over ranks: each rank's loss
//   is weighted by its share of the targets) and this rank's shard goes, rounded once to the
//   model dtype, to host staging, from where the CPU workers accumulate and update it as in the
//   unsharded case. The reduce-scatter runs beside the next group's backward ([Reduce-scatter in
//   backward]: finished at that group's hook, when a third would start, or in WaitAll()).
//   One reduce-scatter per chunk and micro-batch, unless
//   accumulate_sharded_grads_on_device: then the flat tensor keeps adding the micro-batches'
//   grads (in fp32, on the device) and is reduce-scattered once, after the last micro-batch;
//   every offloaded chunk's flat tensor stays on the device until then.
// * Persistent chunks stay replicated: their grads are all-reduced in fp32 (and divided by W) once
//   per step. A chunk's all-reduce starts in backward, right after the group that completes the
//   chunk in the step's last micro-batch, and runs beside the rest of backward (as the planner
//   prices it); one is left in flight at a time (its fp32 copy is the memory the planner charges),
//   and Grads() or Step() finishes the last one and reduces any chunk that did not complete.
// * Clipping: the squared norms of this rank's shards are all-reduced; the persistent chunks'
//   (equal on every rank) are added once.
// Every rank issues the same collectives in the same order because every decision (which chunk
// goes where, when a chunk is complete) depends only on the layout and the call sequence.
//
// [Sharded persistent state]
// With options.shard_persistent_state (ZeRO-2 over the persistent chunks) a persistent chunk's
// parameters stay replicated in one flat device tensor, padded to P elements like an offloaded
// chunk, but its optimizer state (fp32 master, moments) covers only this rank's shard
// [r P / W, (r + 1) P / W): 1/W of the replicated state's bytes.
// * Backward: when the chunk's grads are final (its completion group, last micro-batch) they are
//   copied into an fp32 flat tensor of P elements at their layout offsets, the parameters' .grad
//   are dropped, and the tensor is reduce-scattered beside the rest of backward ([State
//   reduce-scatter per group]: every chunk the group completes is issued at its hook and waited
//   for at the next group's, so the collectives run beside that group's backward instead of
//   stalling the compute stream chunk by chunk; the fp32 flats of one group's chunks are in
//   flight at a time, what the planner charges). Finishing divides by W and keeps the
//   shard rounded to the model dtype (what the replicated path's .grad holds after its
//   all-reduce), with its squared norm summed on the device for clipping.
// * Step: each rank updates its shard (the same kernels as replicated persistent chunks, on the
//   parameters' owned ranges), writes the shard back into the flat parameters and all-gathers
//   them, chunk by chunk, the gathers running beside the next chunks' updates.
// Checkpoint pieces, OptimizerState() and loading read the state from the shards, so a
// checkpoint is the same whatever the layout, world size or plan.
//
// [Sharded persistent parameters]
// With options.shard_persistent_params as well (ZeRO-3 over the persistent chunks, what FSDP2
// does to every module) a persistent chunk's parameters are sharded like its state: the rank
// keeps param_shard, its P / W elements, on the device, and the flat parameter tensor
// (chunk.device) holds memory only while the chunk is gathered.
// * The flat tensor and its storage object live as long as the manager; gathering takes
//   P elements from the caching allocator into that storage object and all-gathers the shards
//   into it, releasing gives the memory back (the storage keeps 0 bytes). The parameters, and
//   the views of them autograd saved for backward (a NONE block's matmul saves w.t()), point
//   into the same storage object, so they see the chunk again once it is re-gathered: what FSDP2
//   does by resizing the unsharded parameter's storage.
// * Acquire(g) first releases the gathered chunks neither group g nor the next group (in this
//   direction) uses, then all-gathers g's chunks and prefetches the next group's, in the same
//   coalesced batch as the offloaded chunks' gathers ([Coalesced gathers]); the compute stream
//   waits for g's before the group runs. At most a group's and the next group's persistent
//   chunks are gathered at once (ChunkMemoryStats::persistent_gather_device_bytes, what the
//   planner charges). The memory is taken while the compute stream is current and the gather is
//   ordered after the compute stream's queued work: a block just released by the compute stream
//   is reused only after its readers ran.
// * Backward and the update are those of [Sharded persistent state]; the update writes the
//   shard (param_shard, or the master rounded into it) and nothing is gathered after the step.
// * Reading parameters (Params(), checkpoint pieces) gathers or reads the shards; loading writes
//   this rank's shard (Stored() is the owned range, as for an offloaded chunk).

namespace memplan {
namespace {

// Elements per CPU optimizer task: big enough to amortise scheduling, small enough that the
// pool balances a few large tensors across all threads.
constexpr int64_t kTaskElems = int64_t{1} << 18;

#ifdef MEMPLAN_CHUNKS_CUDA
using Event = at::cuda::CUDAEvent;
#else
struct Event {
  void synchronize() const {}
};
#endif
using EventPtr = std::shared_ptr<Event>;

struct Param {
  std::string name;
  torch::Tensor tensor;  // the model's parameter; identity is what ties aliases together
  std::vector<int64_t> shape;
  int64_t numel = 0;
  // The parameter's own dtype: the storage dtype, except in [Byte chunks].
  torch::ScalarType dtype = torch::kFloat32;
  int chunk = 0;
  int64_t offset_elems = 0;  // into the chunk's arrays (offset_bytes / storage element size)
  int first_group = 0;       // backward touches it last here: its grad is final after this group
  bool in_flat = false;      // sharded: its grad is in the chunk's grad_flat this micro-batch
  int64_t step = 0;          // updates applied (torch's AdamW keeps one count per parameter)
  bool grad_in_step = false;
  bool grad_this_micro = false;
  torch::Tensor grad_norm;  // L2 norm of the final grad, computed where the grad lives
  // Persistent chunks: optimizer state on the device (views into the chunk's flat state).
  torch::Tensor master;   // fp32 copy when OptimizerKeepsMaster()
  torch::Tensor exp_avg;  // moments: fp32 (adamw) or the model dtype (adamw_bf16); none for sgd
  torch::Tensor exp_avg_sq;
  torch::Tensor fused_step;  // the step counter at::_fused_adamw_ keeps on the device
  // adamw8bit: the absmax of each of its 256-element blocks, strided views into the chunk's slots
  // ([8-bit optimizer state]); the moments above are then uint8 codes.
  torch::Tensor exp_avg_absmax, exp_avg_sq_absmax;
};

// [Byte chunks] A frozen manager may hold parameters of several dtypes (QLoRA's base: NF4 codes
// in uint8, their fp32 scales, norms in bf16). Its chunk arrays are then bytes: offsets and
// spans count bytes (the layout's own units), and each parameter is a view of its slot
// reinterpreted as its dtype (ParamView). Every slot starts at a multiple of alignment_bytes, so
// the reinterpretation is always aligned. With one dtype the arrays have that dtype, as before.
torch::ScalarType StorageDType(const std::vector<Param>& params) {
  if (params.empty()) return torch::kFloat32;
  for (const Param& p : params) {
    if (p.dtype != params[0].dtype) return torch::kUInt8;
  }
  return params[0].dtype;
}

struct GatherBatch;

struct Chunk {
  bool persistent = false;
  int64_t size_bytes = 0;
  int64_t span_elems = 0;
  // [Sharded chunks]: this rank's elements [shard_begin, shard_begin + shard_elems) of the padded
  // chunk (padded_elems); unsharded: the whole chunk.
  int64_t shard_begin = 0;
  int64_t shard_elems = 0;
  int64_t padded_elems = 0;
  torch::Tensor grad_flat;  // sharded: the micro-batch's grads of the chunk on the device
  // Sharded, when one reduce-scatter carries the step's whole gradient (one micro-batch, or the
  // sum kept on the device): the squared L2 norm of this rank's shard as the update will read it,
  // float64 on the device, so that clipping needs no pass over host memory.
  torch::Tensor shard_squares;
  std::vector<int> params;
  int completion_group = 0;  // smallest first_group of its params
  torch::Tensor device;      // persistent: the flat parameter storage
  // Persistent: flat optimizer state over the chunk's span (common/optimizer_bytes.h).
  torch::Tensor device_master, device_exp_avg, device_exp_avg_sq;
  torch::Tensor device_exp_avg_absmax, device_exp_avg_sq_absmax;  // adamw8bit slots
  // Non-persistent: host arrays laid out like the chunk (element offsets of the layout), sized by
  // OffloadedChunkHost() (common/optimizer_bytes.h).
  HostBuffer param_host;  // model dtype; upload source (and the updated parameter without master)
  HostBuffer grad_stage;  // model dtype; where grads land from the device
  HostBuffer master;      // fp32, when OptimizerKeepsMaster()
  HostBuffer grad_accum;  // grad sum over micro-batches (GradSumElemBytes), unless grad_stage is it
  HostBuffer exp_avg;     // moments in OptimizerMomentElemBytes
  HostBuffer exp_avg_sq;
  HostBuffer exp_avg_absmax;  // adamw8bit: QuantAbsmaxSlots() fp32 slots of this shard
  HostBuffer exp_avg_sq_absmax;
  int home = -1;              // device buffer slot, see [Fixed buffer slots]
  bool materialized = false;  // parameters currently view the home buffer
  int micro_batches = 0;      // micro-batches whose grads arrived in this step
  // Sharded, persistent: this step's grads are all-reduced (started in backward, or in Step).
  bool grads_reduced = false;
  // [Sharded persistent state]: a persistent chunk whose state is sharded; this step's reduced
  // grads of its shard (model dtype, on the device) once the reduce-scatter finished.
  bool state_sharded = false;
  torch::Tensor grad_shard;
  // [Sharded persistent parameters]: this rank's shard of the parameters (model dtype, on the
  // device); `device` then holds memory only while gathered, and `gather` is its all-gather
  // (batch) until waited for.
  bool params_sharded = false;
  bool gathered = false;
  // Every rank holds the whole chunk's parameters (a persistent chunk whose parameters are not
  // sharded).
  bool params_replicated() const { return persistent && !params_sharded; }
  torch::Tensor param_shard;
  std::shared_ptr<GatherBatch> gather;
  bool update_started = false;
  EventPtr grads_copied;  // the device-to-host copy of this micro-batch's grads
  EventPtr uploaded;      // the last upload from param_host
  std::unique_ptr<TaskTracker> tasks = std::make_unique<TaskTracker>();
};

// [Coalesced gathers] The all-gathers of the chunks one Acquire() uploads (a group's, or the
// next group's prefetch), started as one collective once the loop has queued them all: one NCCL
// group call and kernel per group instead of one per chunk, as FSDP2 gathers a module's
// parameters at once. A collective's kernel waits for free SMs behind the compute stream's
// kernels; one wait per group instead of one per chunk is what raises the gathers' share of the
// link's bandwidth in training (docs/benchmarks.md). Every rank forms the same batches: they
// depend only on the layout and the hook sequence.
struct GatherBatch {
  std::unique_ptr<PendingCollective> work;       // null until started (FlushGathers)
  std::vector<torch::Tensor> outputs, inputs;    // queued, until started
  int64_t bytes = 0;                             // output bytes of the whole batch
  bool waited = false;
  absl::Status status;                           // of the wait, once waited
};

struct DeviceBuffer {
  torch::Tensor storage;  // flat, model dtype, sized for the largest non-persistent chunk
  int chunk = -1;         // chunk whose current values it holds
  EventPtr ready;         // upload into it finished
  // Sharded: the all-gather (batch) writing into it, until this buffer waited for it.
  std::shared_ptr<GatherBatch> gather;
  // Sharded, CUDA: the chunk's shard copied to the device, input of `gather`; freed with it, so
  // a rank's device holds one shard per gather in flight, not 1/W of every offloaded chunk.
  torch::Tensor gather_src;
};

// The part of a parameter held in a chunk's host arrays ([Sharded chunks]): elements
// [from, from + len) of the flattened parameter, at element `at` of the arrays.
struct OwnedRange {
  int64_t from = 0;
  int64_t at = 0;
  int64_t len = 0;
};

// One piece of CPU optimizer work on a contiguous element range of one parameter.
struct RangeWork {
  int64_t begin = 0;  // element offset into the chunk's arrays
  int64_t len = 0;
  bool accumulate = false;
  bool first = false;  // first micro-batch with a grad: copy instead of add
  bool update = false;
  int64_t from = 0;  // the range's first element within its parameter (adamw8bit's block phase)
  int64_t step = 0;  // the parameter's update count after this update
  int param = 0;     // its index in the manager's parameter order ([Stochastic rounding] key)
  AdamWStepScalars scalars;  // adamw
};

absl::Status TorchError(const c10::Error& e, absl::string_view what) {
  return absl::InternalError(absl::StrCat(std::string(what), ": ", e.what_without_backtrace()));
}

}  // namespace

class ChunkManager::Impl {
 public:
  Impl(const ChunkManagerOptions& options, ChunkPacking layout, Communicator* communicator)
      : options_(options),
        layout_(std::move(layout)),
        comm_(communicator != nullptr && communicator->world_size() > 1 ? communicator : nullptr),
        world_(comm_ != nullptr ? comm_->world_size() : 1),
        rank_(comm_ != nullptr ? comm_->rank() : 0),
        pool_(std::max(0, options.cpu_threads)) {}

  ~Impl() {
    // A batch still queued (a hook unwound mid-loop) was never started: nothing to wait for, and
    // starting it now could wait on ranks that have gone.
    open_gathers_.reset();
    auto wait_started = [](const std::shared_ptr<GatherBatch>& gather) {
      if (gather && gather->work && !gather->waited) {
        gather->waited = true;
        (void)gather->work->Wait();
      }
    };
    for (DeviceBuffer& buffer : buffers_) wait_started(buffer.gather);
    for (Chunk& chunk : chunks_) wait_started(chunk.gather);
    for (Chunk& chunk : chunks_) chunk.tasks->Wait();
  }

  absl::Status Init(const ParamGroups& groups, std::vector<Param> params,
                    std::vector<std::vector<int>> group_params);

  void Acquire(int group, bool forward);
  void PostBackward(int group);
  absl::Status Step(double max_grad_norm);
  void ZeroGrad();
  std::vector<NamedParam> ParamOrder() const;
  std::vector<NamedParam> Params();
  std::vector<NamedParam> Grads();
  std::vector<NamedParam> OptimizerState();
  absl::Status LoadParamsAndState(const std::vector<NamedParam>& values,
                                  const std::vector<NamedParam>& state);
  absl::StatusOr<std::vector<TensorPiece>> LocalPieces();
  absl::Status LoadRanges(const ChunkManager::RangeReader& read, bool with_state,
                          int parallel_reads);
  ChunkMemoryStats MemoryStats() const {
    ChunkMemoryStats s = stats_;
    s.grads_from_slots = grads_from_slots_;
    return s;
  }
  ChunkUploadStats UploadStats();
  void ResetUploadStats();
  int MinBuffers() const { return min_buffers_; }
  double LastGradNorm() const { return last_grad_norm_; }
  int UpdatesStartedBeforeStep() const {
    int n = 0;
    for (const Chunk& chunk : chunks_) n += chunk.update_started ? 1 : 0;
    return n;
  }
  int PersistentReducesInBackward() const { return reduces_in_backward_; }
  int ShardReducesBesideBackward() const { return reduces_beside_backward_; }

 private:
  bool cuda() const { return options_.device.is_cuda(); }
  // Parameters only: no gradient staging, master or optimizer state (profile_only, frozen).
  bool stateless() const { return options_.profile_only || options_.frozen; }
  bool sharded() const { return world_ > 1; }
  OwnedRange Owned(const Param& p, const Chunk& chunk) const {
    const int64_t lo = std::max(p.offset_elems, chunk.shard_begin);
    const int64_t hi = std::min(p.offset_elems + p.numel, chunk.shard_begin + chunk.shard_elems);
    if (hi <= lo) return OwnedRange{};
    return OwnedRange{lo - p.offset_elems, lo - chunk.shard_begin, hi - lo};
  }
  // The elements of p this rank stores: the whole parameter in a persistent chunk (replicated),
  // else its part of this rank's shard ([Sharded persistent parameters] included).
  OwnedRange Stored(const Param& p) const {
    const Chunk& chunk = chunks_[p.chunk];
    return chunk.params_replicated() ? OwnedRange{0, 0, p.numel} : Owned(p, chunk);
  }
  // The elements of p's optimizer state this rank stores: Stored(p), except in a persistent chunk
  // whose state is sharded ([Sharded persistent state]): its part of the shard.
  OwnedRange StateStored(const Param& p) const {
    const Chunk& chunk = chunks_[p.chunk];
    return chunk.state_sharded ? Owned(p, chunk) : Stored(p);
  }
  // [Loading] `flat` holds p's elements Stored(p) (any dtype): into the parameter (and master).
  void InstallParam(Param& p, const torch::Tensor& flat);
  // The same for its optimizer state (undefined m / v: fresh zeros; undefined master: kept) and
  // step count.
  void InstallState(Param& p, const torch::Tensor& m, const torch::Tensor& v,
                    const torch::Tensor& saved_master, int64_t step);
  // A flat view of `len` elements at element `at` of a host array.
  torch::Tensor HostFlat(void* data, int64_t at, int64_t len, torch::ScalarType dtype) const {
    return HostView(data, at, {len}, len, dtype);
  }
  OptimizerKind optimizer() const { return options_.optimizer; }
  int64_t elem_size() const { return static_cast<int64_t>(torch::elementSize(dtype_)); }
  // The update runs on an fp32 master (adamw and sgd on bf16 parameters).
  bool master() const { return OptimizerKeepsMaster(optimizer(), elem_size()); }
  // adamw_bf16: parameters, grads and moments in the model dtype, at::_fused_adamw_ on them.
  bool pure() const { return optimizer() == OptimizerKind::kAdamWBf16States; }
  bool has_moments() const { return OptimizerMoments(optimizer()) > 0; }
  // adamw8bit: uint8 moments with absmax slots, no master ([8-bit optimizer state]).
  bool quantized() const { return optimizer() == OptimizerKind::kAdamW8bit; }
  torch::ScalarType moment_dtype() const {
    return quantized() ? torch::kUInt8 : pure() ? dtype_ : torch::kFloat32;
  }
  // The dtype of an offloaded chunk's grad as the update reads it (HostGrad()).
  // adamw / sgd: fp32 (the fp32 sum, or the staging copy of an fp32 model); adamw_bf16 and
  // adamw8bit: the model dtype (summed as torch sums .grad).
  torch::ScalarType host_grad_dtype() const {
    return pure() || quantized() ? dtype_ : torch::kFloat32;
  }
  torch::TensorOptions DeviceOptions() const {
    return torch::TensorOptions().dtype(dtype_).device(options_.device);
  }
  // p's slot in a flat parameter array of its chunk (device or host, in the storage dtype), as a
  // tensor of p's dtype and shape: a reinterpreting view in [Byte chunks].
  torch::Tensor ParamView(const torch::Tensor& flat, const Param& p) const {
    if (p.dtype == dtype_) return flat.narrow(0, p.offset_elems, p.numel).view(p.shape);
    const int64_t len = p.numel * static_cast<int64_t>(torch::elementSize(p.dtype)) / elem_size();
    return flat.narrow(0, p.offset_elems, len).view(p.dtype).view(p.shape);
  }
  // The same over a host array.
  torch::Tensor ParamHostView(void* data, const Param& p) const {
    char* base = static_cast<char*>(data) + p.offset_elems * elem_size();
    return torch::from_blob(base, {p.numel}, torch::TensorOptions().dtype(p.dtype)).view(p.shape);
  }
  // What a released parameter holds: a 0-dim zero of its dtype expanded to its shape.
  torch::Tensor Placeholder(const Param& p) const {
    if (p.dtype == dtype_) return placeholder_.expand(p.shape);
    return other_placeholders_.at(p.dtype).expand(p.shape);
  }
  torch::Tensor HostView(void* data, int64_t offset_elems, const std::vector<int64_t>& shape,
                         int64_t numel, torch::ScalarType dtype) const {
    char* base = static_cast<char*>(data) + offset_elems * torch::elementSize(dtype);
    return torch::from_blob(base, {numel}, torch::TensorOptions().dtype(dtype)).view(shape);
  }
  float* HostMaster(Chunk& chunk) const {
    return master() ? chunk.master.as<float>() : chunk.param_host.as<float>();
  }
  // The grad the update reads: the sum over micro-batches, or the staging copy when there is no
  // separate sum (one micro-batch without master); its dtype is host_grad_dtype().
  void* HostGrad(Chunk& chunk) const {
    return chunk.grad_accum.data() != nullptr ? chunk.grad_accum.data() : chunk.grad_stage.data();
  }

  absl::StatusOr<HostBuffer> AllocateTransfer(int64_t bytes);
  absl::Status AssignHomes();
  void Upload(int c);
  void Materialize(int c);
  void Dematerialize(int c);
  void StageGrad(Param& param, Chunk& chunk);
  // [Sharded chunks]
  // Queues the chunk's all-gather into `buffer` in the open batch ([Coalesced gathers]);
  // FlushGathers() starts the batch (at once when options_.coalesce_gathers is off).
  void StartGather(int c, DeviceBuffer& buffer);
  void FlushGathers();
  // Counts an all-gather of `bytes` (output) and returns the open batch it joins, opening one.
  std::shared_ptr<GatherBatch> JoinGatherBatch(int64_t bytes);
  // Waits for `gather` (started first if still queued) and moves it out; a failure is remembered
  // for Step(). Finished batches go to the collective timing.
  absl::Status FinishBatch(std::shared_ptr<GatherBatch>& gather);
  // [Sharded persistent parameters]: per group, the persistent chunks whose parameters are
  // gathered on use; the chunk's all-gather into its own memory (queued in the open batch), the
  // compute stream's wait for it, and giving the memory back.
  std::vector<std::vector<int>> group_pchunks_;
  void GatherPersistent(int c);
  void WaitPersistent(int c);
  void ReleasePersistent(int c);
  void ReleaseAllPersistent();
  std::shared_ptr<GatherBatch> open_gathers_;
  void WaitGather(DeviceBuffer& buffer);
  void PostBackwardSharded(int group);
  // [Reduce-scatter in backward]: a chunk's grads are reduce-scattered while the next group's
  // backward runs; finishing divides by W, stages the shard to the host and schedules the CPU
  // work. Finished at the next group's hook, by WaitAll(), or when a third would start.
  struct PendingShardReduce {
    int chunk = -1;
    std::unique_ptr<PendingCollective> work;
    torch::Tensor grad_flat;  // the input, alive until the collective is done
    torch::Tensor shard;      // the output (the host staging itself for an fp32 CPU model)
    bool in_place = false;
    bool whole_step = false;  // the step's whole grad: its squares are summed on finishing
    bool update_now = false;  // the update may start once the shard is staged
  };
  void StartShardReduce(int c, bool whole_step, bool update_now);
  absl::Status FinishShardReduce(PendingShardReduce& r);
  absl::Status FinishShardReduces();
  // [Persistent all-reduce in backward]
  absl::Status StartPersistentReduce(int c);
  absl::Status FinishPersistentReduce();
  // [State reduce-scatter per group]: waits for pending_state_reduces_ and keeps each shard.
  absl::Status FinishStateReduces();
  // [Sharded persistent state]: the step's updates of the shards and the all-gathers after them.
  absl::Status UpdateShardedPersistent(const torch::Tensor& clip_coef, float grad_scale);
  // [Persistent update] One chunk's update on the device-resident state, shared by the
  // replicated persistent chunks (whole parameters) and the sharded ones (this rank's ranges):
  // AdamW fused on the device (the exact CPU kernel on a CPU device), adamw_bf16 fused, SGD with
  // torch's ops; the clip coefficient applied where each optimizer applies it. Add() every
  // (parameter, range), then Flush() (also when the batch passes slice_elems elements: the fp32
  // grad copies of a mixed-precision model then stay one regular chunk's, [Sliced grad copy]);
  // nothing is flushed on destruction.
  class PersistentUpdate;
  // Every rank's `shard` (any device, the same size on each), concatenated in rank order, on the
  // CPU (a collective). GatherHost gathers `elems` (default: the chunk's shard) of a host array.
  torch::Tensor GatherDevice(const torch::Tensor& shard);
  absl::Status AllReducePersistentGrads();
  absl::StatusOr<double> ShardedSquaredNorm();
  torch::Tensor GatherHost(const void* data, torch::ScalarType dtype, const Chunk& chunk,
                           int64_t elems = -1);
  // adamw8bit ([8-bit optimizer state]).
  int64_t slot_elems() const { return QuantSlotElems(elem_size()); }
  void OptimizerState8bit(std::vector<NamedParam>& out);
  absl::Status LoadState8bit(const std::map<std::string, torch::Tensor>& by_key, Param& p,
                             bool fresh);
  // A failed collective inside a hook: remembered for Step() and thrown (c10::Error) so that
  // autograd unwinds.
  void FailCollective(const absl::Status& status);
  // Waits for the all-gather into `buffer`, if any; a failure is remembered for Step().
  absl::Status FinishGather(DeviceBuffer& buffer);
  void ScheduleChunkWork(int c, bool accumulate, bool update, float grad_scale);
  void WaitAll();
  void InvalidateBuffers();
  void ResetStep();
  EventPtr RecordOnCompute();
  void WaitOnCompute(const EventPtr& event);
  // [Grad copy backlog] After a group's grads were queued for the host (`touched` chunks): keep
  // at most options_.max_grad_copy_groups groups of copies in flight.
  void BoundGradCopyBacklog(const std::set<int>& touched);
  std::deque<EventPtr> grad_copies_;  // one event per group, oldest first
  // [Grad staging slots] (common/chunk_packing.h): before block group g's backward, its
  // offloaded parameters get zeroed grads in slot g % kGradStagingSlots, which autograd then
  // accumulates into; the slot is reused once the copies out of its last use are done.
  void AssignGradSlots(int group);
  bool InGradSlot(const torch::Tensor& grad) const;
  std::vector<torch::Tensor> grad_slots_;  // kGradStagingSlots flat device tensors, or none
  std::vector<EventPtr> slot_copied_;      // per slot: recorded after its last use's copies
  std::vector<int64_t> slot_offset_;       // per parameter: elements into its slot, or -1
  std::vector<int64_t> group_slot_elems_;  // per group: the elements its parameters take
  int64_t grads_from_slots_ = 0;           // ChunkMemoryStats::grads_from_slots

  ChunkManagerOptions options_;
  ChunkPacking layout_;
  Communicator* comm_ = nullptr;  // set only when world_ > 1
  int world_ = 1;
  int rank_ = 0;
  absl::Status comm_status_;  // the first failed collective
  // Keeps `s` as comm_status_ when it is the first failure; returns it.
  absl::Status NoteCollective(const absl::Status& s) {
    if (!s.ok() && comm_status_.ok()) comm_status_ = s;
    return s;
  }
  bool persistent_reduced_ = false;  // this step's persistent grads are all-reduced already
  // [Persistent all-reduce in backward]: the one in flight, its fp32 flat copy and the grads it
  // goes back into.
  struct PendingReduce {
    std::unique_ptr<PendingCollective> work;
    torch::Tensor flat;
    std::vector<torch::Tensor> grads;
    // [Sharded persistent state]: a reduce-scatter of chunk `chunk` into `shard` instead.
    int chunk = -1;
    torch::Tensor shard;
  };
  std::optional<PendingReduce> pending_reduce_;
  // [Sharded persistent state]: the reduce-scatters of the chunks the last group completed.
  std::vector<PendingReduce> pending_state_reduces_;
  std::vector<PendingShardReduce> pending_shard_reduces_;
  int reduces_in_backward_ = 0;      // persistent all-reduces started in backward this step
  int reduces_beside_backward_ = 0;  // reduce-scatters finished at a later group's hook
  torch::ScalarType dtype_ = torch::kFloat32;
  std::vector<Param> params_;                     // canonical order
  std::vector<std::vector<int>> group_params_;    // per group, indices into params_
  std::vector<std::vector<int>> group_chunks_;    // per group, non-persistent chunks it needs
  std::vector<std::vector<int>> group_stage_;     // per group, params whose grad is offloaded there
  std::unordered_map<std::string, int> by_name_;  // every name, aliases included
  std::vector<Chunk> chunks_;
  std::vector<DeviceBuffer> buffers_;  // [0, shared_buffers_) shared, then one per oversized chunk
  int shared_buffers_ = 0;
  int n_persist_ = 0;
  int min_buffers_ = 0;
  torch::Tensor placeholder_;  // 0-dim, expanded to each released parameter's shape
  // [Byte chunks] the same for each parameter dtype other than the storage dtype.
  std::map<torch::ScalarType, torch::Tensor> other_placeholders_;
  ThreadPool pool_;
  ChunkMemoryStats stats_;
  double last_grad_norm_ = 0;
  bool overrun_ = false;  // grads arrived for a chunk whose update already started
  std::atomic<bool> worker_failed_{false};  // a CPU update threw (reported by Step())
  // Upload accounting: finished durations are folded into upload_stats_; pairs of timing events
  // (start, end) whose copies may still run wait in timed_uploads_.
  ChunkUploadStats upload_stats_;
  QuantMapTensors quant_maps_;  // adamw8bit: the maps on the device, for persistent chunks
  std::vector<std::pair<EventPtr, EventPtr>> timed_uploads_;
  void FoldTimedUploads(bool wait);
  // [Collective timing] Finished all-gathers (batches) whose device time is not read yet, oldest
  // first; at most kMaxTimedGathers are kept (each may hold its input shards).
  std::deque<std::shared_ptr<GatherBatch>> timed_gathers_;
  static constexpr size_t kMaxTimedGathers = 2;
  void FoldTimedGathers(bool wait);
#ifdef MEMPLAN_CHUNKS_CUDA
  std::optional<c10::cuda::CUDAStream> upload_stream_;
  std::optional<c10::cuda::CUDAStream> offload_stream_;
#endif
};

absl::StatusOr<HostBuffer> ChunkManager::Impl::AllocateTransfer(int64_t bytes) {
  if (options_.host_memory == HostMemoryKind::kPageable || stats_.pinned_fallback) {
    return HostBuffer::AllocatePageable(bytes);
  }
  absl::StatusOr<HostBuffer> pinned = HostBuffer::AllocatePinned(bytes);
  if (pinned.ok()) return pinned;
  if (!options_.pageable_fallback) {
    return absl::Status(pinned.status().code(),
                        absl::StrCat("host_memory=pinned: ", pinned.status().message(),
                                     " (set pageable_fallback to use pageable memory)"));
  }
  stats_.pinned_fallback = true;
  stats_.pinned_fallback_reason = std::string(pinned.status().message());
  MEMPLAN_LOG(kWarning, "pinned host memory unavailable; using pageable memory for chunks")
      .Field("reason", stats_.pinned_fallback_reason)
      .Field("bytes", bytes);
  return HostBuffer::AllocatePageable(bytes);
}

absl::Status ChunkManager::Impl::Init(const ParamGroups& groups, std::vector<Param> params,
                                      std::vector<std::vector<int>> group_params) {
  params_ = std::move(params);
  group_params_ = std::move(group_params);
  dtype_ = StorageDType(params_);
  for (size_t g = 0; g < groups.size(); ++g) {
    for (const NamedParam& named : groups[g]) {
      for (int i : group_params_[g]) {
        if (params_[i].tensor.unsafeGetTensorImpl() == named.param.unsafeGetTensorImpl()) {
          by_name_.emplace(named.name, i);
        }
      }
    }
  }
  n_persist_ = std::clamp(options_.n_persist, 0, layout_.num_chunks());
  const int64_t elem_bytes = torch::elementSize(dtype_);

#ifdef MEMPLAN_CHUNKS_CUDA
  if (cuda()) {
    upload_stream_ =
        c10::cuda::getStreamFromPool(/*isHighPriority=*/false, options_.device.index());
    offload_stream_ = c10::cuda::getStreamFromPool(false, options_.device.index());
  }
#endif

  // Chunks and their storage. Values are copied before any parameter is swapped out.
  chunks_.resize(layout_.num_chunks());
  for (int c = 0; c < layout_.num_chunks(); ++c) {
    Chunk& chunk = chunks_[c];
    const ChunkInfo& info = layout_.chunks()[c];
    chunk.persistent = c < n_persist_;
    chunk.size_bytes = info.size_bytes;
    chunk.span_elems = info.size_bytes / elem_bytes;
    chunk.shard_elems = chunk.span_elems;
    chunk.padded_elems = chunk.span_elems;
    chunk.state_sharded =
        sharded() && chunk.persistent && options_.shard_persistent_state && !stateless();
    chunk.params_sharded = chunk.state_sharded && options_.shard_persistent_params;
    if (sharded() && (!chunk.persistent || chunk.state_sharded)) {
      chunk.shard_elems = ShardElems(chunk.span_elems, world_);
      chunk.shard_begin = rank_ * chunk.shard_elems;
      chunk.padded_elems = PaddedElems(chunk.span_elems, world_);
    }
    chunk.completion_group = std::numeric_limits<int>::max();
    stats_.chunk_bytes.push_back(info.size_bytes);
  }
  for (int i = 0; i < static_cast<int>(params_.size()); ++i) {
    Chunk& chunk = chunks_[params_[i].chunk];
    chunk.params.push_back(i);
    chunk.completion_group = std::min(chunk.completion_group, params_[i].first_group);
  }

  placeholder_ = torch::zeros({}, DeviceOptions());
  for (const Param& p : params_) {
    if (p.dtype != dtype_ && !other_placeholders_.count(p.dtype)) {
      other_placeholders_[p.dtype] = torch::zeros({}, DeviceOptions().dtype(p.dtype));
    }
  }
  try {
    if (quantized() && !options_.profile_only) quant_maps_ = MakeQuantMapTensors(options_.device);
    torch::NoGradGuard no_grad;
    for (int c = 0; c < layout_.num_chunks(); ++c) {
      Chunk& chunk = chunks_[c];
      if (chunk.persistent) {
        // [Sharded persistent state]: padded, the all-gather's output.
        chunk.device = torch::zeros({chunk.padded_elems}, DeviceOptions());
        for (int i : chunk.params) {
          Param& p = params_[i];
          torch::Tensor view = ParamView(chunk.device, p);
          if (!options_.deferred_values) view.copy_(p.tensor.detach());
          p.tensor.set_data(view);
        }
        stats_.persistent_device_bytes +=
            (chunk.params_sharded ? chunk.shard_elems : chunk.padded_elems) * elem_bytes;
        if (stateless()) continue;
        // Flat state over the whole span (alignment gaps included), exactly
        // PersistentStateBytesPerElem() per element; parameters' state are views into it.
        // [Sharded persistent state]: over this rank's shard of the padded span only.
        const auto fp32 = torch::TensorOptions().dtype(torch::kFloat32).device(options_.device);
        const auto moments = fp32.dtype(moment_dtype());
        const int64_t state_elems = chunk.state_sharded ? chunk.shard_elems : chunk.span_elems;
        if (master()) {
          chunk.device_master =
              chunk.device.narrow(0, chunk.shard_begin, state_elems).to(torch::kFloat32);
        }
        if (has_moments()) {
          chunk.device_exp_avg = torch::zeros({state_elems}, moments);
          chunk.device_exp_avg_sq = torch::zeros({state_elems}, moments);
        }
        if (quantized()) {
          const int64_t slots = QuantAbsmaxSlots(chunk.span_elems, elem_bytes);
          chunk.device_exp_avg_absmax = torch::zeros({slots}, fp32);
          chunk.device_exp_avg_sq_absmax = torch::zeros({slots}, fp32);
        }
        for (int i : chunk.params) {
          Param& p = params_[i];
          // Sharded state: a flat view of the parameter's part of the shard (none when this rank
          // stores none of it).
          const OwnedRange owned = chunk.state_sharded ? Owned(p, chunk) : OwnedRange{};
          auto view = [&p, &chunk, owned](const torch::Tensor& flat) {
            if (chunk.state_sharded) {
              return owned.len > 0 ? flat.narrow(0, owned.at, owned.len) : torch::Tensor();
            }
            return flat.narrow(0, p.offset_elems, p.numel).view(p.shape);
          };
          if (master()) p.master = view(chunk.device_master);
          if (has_moments()) {
            p.exp_avg = view(chunk.device_exp_avg);
            p.exp_avg_sq = view(chunk.device_exp_avg_sq);
          }
          if (quantized()) {
            // Block k of the parameter starts at chunk element offset + 256 k: slot
            // (offset + 256 k) / slot_elems, a multiple of the alignment.
            const int64_t blocks = (p.numel + kQuantBlockElems - 1) / kQuantBlockElems;
            const int64_t first = p.offset_elems / slot_elems();
            const int64_t stride = kQuantBlockElems / slot_elems();
            auto slots = [&](const torch::Tensor& flat) {
              return flat.slice(0, first, first + (blocks - 1) * stride + 1, stride);
            };
            p.exp_avg_absmax = slots(chunk.device_exp_avg_absmax);
            p.exp_avg_sq_absmax = slots(chunk.device_exp_avg_sq_absmax);
          }
          // at::_fused_adamw_ reads the step from a tensor on the parameters' device.
          if (has_moments() && !quantized() && (cuda() || pure())) {
            p.fused_step = torch::zeros({}, fp32);
          }
        }
        stats_.persistent_state_device_bytes +=
            PersistentStateBytes(optimizer(), elem_bytes, state_elems);
        if (chunk.params_sharded) {
          // [Sharded persistent parameters]: keep this rank's shard; the flat tensor gives its
          // memory back until a group needs the chunk.
          chunk.param_shard = chunk.device.narrow(0, chunk.shard_begin, chunk.shard_elems).clone();
          ReleasePersistent(c);
        }
        continue;
      }
      const int64_t shard_bytes = chunk.shard_elems * elem_bytes;
      ASSIGN_OR_RETURN(chunk.param_host, AllocateTransfer(shard_bytes));
      if (stateless()) {
        (chunk.param_host.pinned() ? stats_.host_pinned_bytes : stats_.host_pageable_bytes) +=
            chunk.param_host.size_bytes();
        for (int i : chunk.params) {
          Param& p = params_[i];
          torch::Tensor host = ParamHostView(chunk.param_host.data(), p);
          options_.deferred_values ? host.zero_() : host.copy_(p.tensor.detach().to(torch::kCPU));
          p.tensor.set_data(Placeholder(p));
        }
        continue;
      }
      ASSIGN_OR_RETURN(chunk.grad_stage, AllocateTransfer(shard_bytes));
      // The pageable state, as common/optimizer_bytes.h defines it for the planner (per element
      // of this rank's shard).
      const int64_t span = chunk.shard_elems;
      if (master()) chunk.master = HostBuffer::AllocatePageable(span * 4);
      const int64_t grad_sum = GradSumElemBytes(optimizer(), elem_bytes, options_.grad_accum);
      if (grad_sum > 0) chunk.grad_accum = HostBuffer::AllocatePageable(span * grad_sum);
      if (has_moments()) {
        const int64_t moment = OptimizerMomentElemBytes(optimizer(), elem_bytes);
        chunk.exp_avg = HostBuffer::AllocatePageable(span * moment);
        chunk.exp_avg_sq = HostBuffer::AllocatePageable(span * moment);
      }
      if (quantized()) {
        const int64_t slot_bytes = QuantAbsmaxBytes(optimizer(), elem_bytes, span) / 2;
        chunk.exp_avg_absmax = HostBuffer::AllocatePageable(slot_bytes);
        chunk.exp_avg_sq_absmax = HostBuffer::AllocatePageable(slot_bytes);
      }
      for (const HostBuffer* b : {&chunk.param_host, &chunk.grad_stage}) {
        (b->pinned() ? stats_.host_pinned_bytes : stats_.host_pageable_bytes) += b->size_bytes();
      }
      for (const HostBuffer* b :
           {&chunk.master, &chunk.grad_accum, &chunk.exp_avg, &chunk.exp_avg_sq,
            &chunk.exp_avg_absmax, &chunk.exp_avg_sq_absmax}) {
        stats_.host_pageable_bytes += b->size_bytes();
      }
      for (int i : chunk.params) {
        Param& p = params_[i];
        const OwnedRange r = Owned(p, chunk);
        if (r.len > 0 && options_.deferred_values) {
          // [Sharded loading] no values yet: zeros until LoadRanges fills this rank's part.
          HostFlat(chunk.param_host.data(), r.at, r.len, dtype_).zero_();
          if (master()) HostFlat(chunk.master.data(), r.at, r.len, torch::kFloat32).zero_();
        } else if (r.len > 0) {
          torch::Tensor value =
              p.tensor.detach().to(torch::kCPU).reshape({-1}).narrow(0, r.from, r.len);
          HostFlat(chunk.param_host.data(), r.at, r.len, dtype_).copy_(value);
          if (master()) HostFlat(chunk.master.data(), r.at, r.len, torch::kFloat32).copy_(value);
        }
        p.tensor.set_data(Placeholder(p));
      }
    }
  } catch (const c10::Error& e) {
    return TorchError(e, "copying parameters into chunks");
  }

  // Which non-persistent chunks each group needs resident, and whose grads become final where.
  group_chunks_.assign(group_params_.size(), {});
  group_pchunks_.assign(group_params_.size(), {});
  // A parameter used by several groups (a tied LM head) gets one autograd accumulation per
  // group. With one micro-batch the device sums them in autograd's order and the grad moves once,
  // after its last group; with several, the host must add the contributions in that same order
  // ((h1 + e1) + h2) + e2, so the grad moves after every group that uses it.
  group_stage_.assign(group_params_.size(), {});
  for (size_t g = 0; g < group_params_.size(); ++g) {
    std::set<int> needed, gathered;
    for (int i : group_params_[g]) {
      if (!chunks_[params_[i].chunk].persistent) needed.insert(params_[i].chunk);
      if (chunks_[params_[i].chunk].params_sharded) gathered.insert(params_[i].chunk);
      if (options_.grad_accum > 1 || params_[i].first_group == static_cast<int>(g)) {
        group_stage_[g].push_back(i);
      }
    }
    group_chunks_[g].assign(needed.begin(), needed.end());
    group_pchunks_[g].assign(gathered.begin(), gathered.end());
    int shared = 0;  // oversized chunks have buffers of their own
    for (int c : needed) shared += layout_.chunks()[c].oversized ? 0 : 1;
    min_buffers_ = std::max(min_buffers_, shared);
  }
  RETURN_IF_ERROR(AssignHomes());
  // [Sharded persistent parameters]: the most held at once, a group's chunks and the next one's
  // (PersistentGatherBytesByNPersist, common/chunk_packing.h: the planner's rule too), over the
  // chunks this manager's groups really use. Every persistent chunk is sharded or none is.
  if (std::any_of(chunks_.begin(), chunks_.end(),
                  [](const Chunk& chunk) { return chunk.params_sharded; })) {
    std::vector<std::vector<int>> used(group_params_.size());
    for (size_t g = 0; g < group_params_.size(); ++g) {
      for (int i : group_params_[g]) used[g].push_back(params_[i].chunk);
    }
    std::vector<int64_t> gathered(chunks_.size());
    for (size_t c = 0; c < chunks_.size(); ++c) gathered[c] = chunks_[c].padded_elems * elem_bytes;
    stats_.persistent_gather_device_bytes =
        PersistentGatherBytesByNPersist(used, gathered)[n_persist_];
  }
  // [Grad staging slots]: one rank, a full optimizer, something offloaded. Each block parameter
  // in an offloaded chunk takes GradSlotParamBytes in its first group's slot, the sizes the
  // planner prices (kGradStagingSlots x GradSlotBytesByFirstOffloaded).
  if (!stateless() && !sharded() && n_persist_ < layout_.num_chunks()) {
    const int64_t slot_bytes = layout_.GradSlotBytesByFirstOffloaded()[n_persist_];
    if (slot_bytes > 0) {
      // The offsets are the layout's (common/chunk_packing.h); the groups are the hooks' (the
      // last backward group of each parameter), which the check below holds to the layout's.
      const std::vector<int64_t> offsets = layout_.GradSlotOffsets(n_persist_);
      slot_offset_.assign(params_.size(), -1);
      group_slot_elems_.assign(group_params_.size(), 0);
      int64_t largest = 0;
      for (int i = 0; i < static_cast<int>(params_.size()); ++i) {
        if (offsets[i] < 0) continue;
        const Param& p = params_[i];
        int64_t& end = group_slot_elems_[p.first_group];
        slot_offset_[i] = offsets[i] / elem_bytes;
        end = std::max(end, (offsets[i] + layout_.GradSlotParamBytes(i)) / elem_bytes);
        largest = std::max(largest, end);
      }
      if (largest * elem_bytes != slot_bytes) {
        return absl::InternalError(absl::StrCat("grad staging slots: the parameters take ",
                                                largest * elem_bytes, " bytes, the layout says ",
                                                slot_bytes));
      }
      try {
        for (int k = 0; k < kGradStagingSlots; ++k) {
          grad_slots_.push_back(torch::empty({largest}, DeviceOptions()));
        }
      } catch (const c10::Error& e) {
        return TorchError(e, "allocating grad staging slots");
      }
      slot_copied_.assign(kGradStagingSlots, nullptr);
      stats_.grad_slot_device_bytes = kGradStagingSlots * slot_bytes;
    }
  }

  stats_.world_size = world_;
  stats_.n_chunks = layout_.num_chunks();
  stats_.layout_fingerprint = layout_.fingerprint();
  stats_.n_persist = n_persist_;
  stats_.n_buffer = shared_buffers_;
  stats_.n_oversized_buffers = static_cast<int>(buffers_.size()) - shared_buffers_;
  stats_.layout_bytes = layout_.TotalBytes();
  // Shared buffers fit the largest regular chunk of the layout; an oversized chunk's own buffer
  // fits it exactly. See [Fixed buffer slots].
  // Sharded: padded to a multiple of the world size ([Sharded chunks]).
  const int64_t shared_elems = PaddedElems(layout_.MaxRegularChunkBytes() / elem_bytes, world_);
  try {
    for (size_t b = 0; b < buffers_.size(); ++b) {
      int64_t elems = shared_elems;
      if (static_cast<int>(b) >= shared_buffers_) {
        for (int c = n_persist_; c < layout_.num_chunks(); ++c) {
          if (chunks_[c].home == static_cast<int>(b)) elems = chunks_[c].padded_elems;
        }
      }
      buffers_[b].storage = torch::zeros({elems}, DeviceOptions());
      stats_.buffer_device_bytes += elems * elem_bytes;
    }
  } catch (const c10::Error& e) {
    return TorchError(e, "allocating device chunk buffers");
  }
  MEMPLAN_LOG(kInfo, "chunk manager ready")
      .Field("chunks", stats_.n_chunks)
      .Field("n_persist", n_persist_)
      .Field("n_buffer", stats_.n_buffer)
      .Field("layout_bytes", stats_.layout_bytes)
      .Field("host_pinned_bytes", stats_.host_pinned_bytes)
      .Field("host_pageable_bytes", stats_.host_pageable_bytes);
  return absl::OkStatus();
}

absl::Status ChunkManager::Impl::AssignHomes() {
  const int non_persistent = layout_.num_chunks() - n_persist_;
  if (non_persistent == 0) return absl::OkStatus();
  int n_buffer = std::max(options_.n_buffer, min_buffers_);
  // Chunks that must be resident together may not share a home.
  std::vector<std::set<int>> conflicts(layout_.num_chunks());
  for (const std::vector<int>& needed : group_chunks_) {
    for (int a : needed) {
      for (int b : needed) {
        if (a != b) conflicts[a].insert(b);
      }
    }
  }
  // Round-robin with skips; a greedy colouring can need more slots than the largest group, so
  // grow until it succeeds (bounded by the chunk count).
  auto oversized = [&](int c) { return layout_.chunks()[c].oversized; };
  while (true) {
    bool ok = true;
    int next = 0;
    for (int c = n_persist_; c < layout_.num_chunks() && ok; ++c) {
      if (oversized(c)) continue;
      int home = -1;
      for (int k = 0; k < n_buffer; ++k) {
        const int candidate = (next + k) % n_buffer;
        bool clash = false;
        for (int other : conflicts[c]) {
          if (other < c && chunks_[other].home == candidate) clash = true;
        }
        if (!clash) {
          home = candidate;
          break;
        }
      }
      if (home < 0) ok = false;
      chunks_[c].home = home;
      next = (home + 1) % n_buffer;
    }
    if (ok) break;
    ++n_buffer;
  }
  if (n_buffer > options_.n_buffer) {
    MEMPLAN_LOG(kWarning, "n_buffer raised: some group needs more chunks resident at once")
        .Field("requested", options_.n_buffer)
        .Field("allocated", n_buffer)
        .Field("min_buffers", min_buffers_);
  }
  if (n_buffer > options_.n_buffer) min_buffers_ = std::max(min_buffers_, n_buffer);
  // Oversized chunks get buffers of their own after the shared ones, so one large parameter
  // (an LM head, a wide MLP matrix) does not make every shared buffer that large.
  shared_buffers_ = n_buffer;
  int home = n_buffer;
  for (int c = n_persist_; c < layout_.num_chunks(); ++c) {
    if (oversized(c)) chunks_[c].home = home++;
  }
  buffers_.resize(home);
  return absl::OkStatus();
}

EventPtr ChunkManager::Impl::RecordOnCompute() {
#ifdef MEMPLAN_CHUNKS_CUDA
  if (!cuda()) return nullptr;
  auto event = std::make_shared<Event>();
  event->record(c10::cuda::getCurrentCUDAStream(options_.device.index()));
  return event;
#else
  return nullptr;
#endif
}

void ChunkManager::Impl::BoundGradCopyBacklog(const std::set<int>& touched) {
  // [Grad copy backlog] StageGrad frees each grad as soon as its device-to-host copy is queued
  // (recordStream): the caching allocator cannot reuse the block until the offload stream has
  // run the copy. The host enqueues backward groups well ahead of the GPU, and every group it
  // is ahead by leaves that group's grads freed but not reusable (their copies have not even
  // started): on an H200, llama-3.2-3b 7x1536 with 105 of 113 chunks offloaded, the host ran ~7
  // groups ahead and 1.4 GiB of freed grads (7 x 192 MiB) stayed pending through backward, which
  // the allocator covered with new segments. Waiting on the host for the copies of the group
  // max_grad_copy_groups back bounds that run-ahead, as the activation offloader bounds its
  // forward copies (a stream-side wait does not: it orders the GPU, not the host). The GPU still
  // has the groups in between queued, so it costs time only where the copies are the slower side,
  // and then the step waits for them at its end anyway (the CPU update needs them on the host).
  if (!cuda() || touched.empty()) return;
  grad_copies_.push_back(chunks_[*touched.rbegin()].grads_copied);  // recorded after them all
  while (static_cast<int>(grad_copies_.size()) > options_.max_grad_copy_groups) {
    if (grad_copies_.front()) grad_copies_.front()->synchronize();
    grad_copies_.pop_front();
  }
}

void ChunkManager::Impl::WaitOnCompute(const EventPtr& event) {
#ifdef MEMPLAN_CHUNKS_CUDA
  if (event) event->block(c10::cuda::getCurrentCUDAStream(options_.device.index()));
#endif
}

void ChunkManager::Impl::Upload(int c) {
  Chunk& chunk = chunks_[c];
  DeviceBuffer& buffer = buffers_[chunk.home];
  if (buffer.chunk == c) return;
  if (buffer.chunk >= 0) Dematerialize(buffer.chunk);
  buffer.chunk = c;
  chunk.tasks->Wait();  // a CPU update still writing param_host would be uploaded half-done
  if (sharded()) {
    StartGather(c, buffer);
    return;
  }
  torch::Tensor src = torch::from_blob(chunk.param_host.data(), {chunk.span_elems},
                                       torch::TensorOptions().dtype(dtype_));
  torch::Tensor dst = buffer.storage.narrow(0, 0, chunk.span_elems);
#ifdef MEMPLAN_CHUNKS_CUDA
  if (cuda()) {
    // The buffer's previous chunk may still be read by kernels queued on the compute stream.
    RecordOnCompute()->block(*upload_stream_);
    c10::cuda::CUDAStreamGuard guard(*upload_stream_);
    // Timing events (the default CUDAEvent disables timing): the start is recorded after the wait
    // above, so the measured span is the copy itself.
    auto start = std::make_shared<Event>(cudaEventDefault);
    start->record(*upload_stream_);
    dst.copy_(src, /*non_blocking=*/true);
    auto ready = std::make_shared<Event>(cudaEventDefault);
    ready->record(*upload_stream_);
    buffer.ready = ready;
    chunk.uploaded = ready;
    ++upload_stats_.uploads;
    upload_stats_.bytes += chunk.span_elems * static_cast<int64_t>(torch::elementSize(dtype_));
    timed_uploads_.emplace_back(std::move(start), std::move(ready));
    if (timed_uploads_.size() >= 64) FoldTimedUploads(/*wait=*/false);
    return;
  }
#endif
  dst.copy_(src);
  buffer.ready = nullptr;
  ++upload_stats_.uploads;
  upload_stats_.bytes += chunk.span_elems * static_cast<int64_t>(torch::elementSize(dtype_));
}

void ChunkManager::Impl::FoldTimedUploads(bool wait) {
#ifdef MEMPLAN_CHUNKS_CUDA
  // Uploads finish in stream order, so the finished ones form a prefix.
  size_t done = 0;
  for (; done < timed_uploads_.size(); ++done) {
    auto& [start, end] = timed_uploads_[done];
    if (wait) {
      end->synchronize();
    } else if (!end->query()) {
      break;
    }
    upload_stats_.seconds += static_cast<double>(start->elapsed_time(*end)) / 1000.0;
  }
  timed_uploads_.erase(timed_uploads_.begin(), timed_uploads_.begin() + done);
#else
  (void)wait;
#endif
}

ChunkUploadStats ChunkManager::Impl::UploadStats() {
  FoldTimedUploads(/*wait=*/true);
  FoldTimedGathers(/*wait=*/true);
  return upload_stats_;
}

void ChunkManager::Impl::ResetUploadStats() {
  FoldTimedUploads(/*wait=*/true);
  FoldTimedGathers(/*wait=*/true);
  upload_stats_ = ChunkUploadStats();
}

void ChunkManager::Impl::Materialize(int c) {
  Chunk& chunk = chunks_[c];
  DeviceBuffer& buffer = buffers_[chunk.home];
  WaitOnCompute(buffer.ready);
  WaitGather(buffer);
  if (chunk.materialized) return;
  for (int i : chunk.params) {
    Param& p = params_[i];
    p.tensor.set_data(ParamView(buffer.storage, p));
  }
  chunk.materialized = true;
}

void ChunkManager::Impl::Dematerialize(int c) {
  Chunk& chunk = chunks_[c];
  if (!chunk.materialized) return;
  for (int i : chunk.params) {
    Param& p = params_[i];
    p.tensor.set_data(Placeholder(p));
  }
  chunk.materialized = false;
}

void ChunkManager::Impl::Acquire(int group, bool forward) {
  if (group < 0 || group >= static_cast<int>(group_chunks_.size())) {
    MEMPLAN_LOG(kError, "chunk manager hook for an unknown group").Field("group", group);
    return;
  }
  torch::NoGradGuard no_grad;
  const std::vector<int>& needed = group_chunks_[group];
  const int next = forward ? group + 1 : group - 1;
  const bool has_next = next >= 0 && next < static_cast<int>(group_chunks_.size());
  // [Sharded persistent parameters]: what neither this group nor the next uses goes first, so
  // that its memory serves the gathers below.
  const std::vector<int>& pneeded = group_pchunks_[group];
  static const std::vector<int> kNone;
  const std::vector<int>& pnext = has_next ? group_pchunks_[next] : kNone;
  for (int c = 0; c < n_persist_; ++c) {
    if (!chunks_[c].gathered) continue;
    if (std::find(pneeded.begin(), pneeded.end(), c) != pneeded.end()) continue;
    if (std::find(pnext.begin(), pnext.end(), c) != pnext.end()) continue;
    ReleasePersistent(c);
  }
  for (int c : pneeded) GatherPersistent(c);
  for (int c : needed) Upload(c);
  FlushGathers();
  for (int c : pneeded) WaitPersistent(c);
  for (int c : needed) Materialize(c);
  if (!forward) AssignGradSlots(group);
  // Prefetch the next group in this direction on the upload stream, without evicting anything
  // this group is about to use.
  if (!has_next) return;
  for (int c : pnext) GatherPersistent(c);
  for (int c : group_chunks_[next]) {
    const int holder = buffers_[chunks_[c].home].chunk;
    if (holder == c) continue;
    if (holder >= 0 && std::find(needed.begin(), needed.end(), holder) != needed.end()) continue;
    Upload(c);
  }
  FlushGathers();
}

void ChunkManager::Impl::StageGrad(Param& p, Chunk& chunk) {
  torch::Tensor grad = p.tensor.grad();
  if (!grad.defined()) return;
  p.grad_this_micro = true;
  // With one micro-batch the device grad is the final one: its norm is exactly what
  // clip_grad_norm_ computes, and on a GPU it costs no host work.
  if (options_.grad_accum == 1) p.grad_norm = grad.norm(2.0);
  torch::Tensor dst = HostView(chunk.grad_stage.data(), p.offset_elems, p.shape, p.numel, dtype_);
  const bool from_slot = InGradSlot(grad);
  if (from_slot) ++grads_from_slots_;
#ifdef MEMPLAN_CHUNKS_CUDA
  if (cuda()) {
    RecordOnCompute()->block(*offload_stream_);
    {
      c10::cuda::CUDAStreamGuard guard(*offload_stream_);
      dst.copy_(grad, /*non_blocking=*/true);
    }
    // The grad is freed below while the copy may still run on the offload stream (a slot is
    // not: it is reused only after the copies out of it, AssignGradSlots).
    if (!from_slot) {
      c10::cuda::CUDACachingAllocator::recordStream(grad.storage().data_ptr(), *offload_stream_);
    }
    p.tensor.mutable_grad().reset();
    return;
  }
#endif
  dst.copy_(grad);
  p.tensor.mutable_grad().reset();
}

bool ChunkManager::Impl::InGradSlot(const torch::Tensor& grad) const {
  for (const torch::Tensor& slot : grad_slots_) {
    if (grad.storage().is_alias_of(slot.storage())) return true;
  }
  return false;
}

void ChunkManager::Impl::AssignGradSlots(int group) {
  if (grad_slots_.empty() || group_slot_elems_[group] == 0) return;
  const int k = group % kGradStagingSlots;
  // The slot's previous group's grads must be on their way out: the compute stream waits for
  // those copies (recorded on the offload stream in PostBackward) before zeroing it.
  WaitOnCompute(slot_copied_[k]);
  const torch::Tensor& slot = grad_slots_[k];
  for (int i : group_params_[group]) {
    Param& p = params_[i];
    // A grad that exists already came from a later group (a parameter several groups use), or
    // from this group's hook running before (it is zeroed only when assigned): it stays.
    if (slot_offset_[i] < 0 || p.first_group != group || !p.tensor.requires_grad() ||
        p.tensor.grad().defined()) {
      continue;
    }
    p.tensor.mutable_grad() = slot.narrow(0, slot_offset_[i], p.numel).view(p.shape).zero_();
  }
}

void ChunkManager::Impl::PostBackward(int group) {
  if (group < 0 || group >= static_cast<int>(group_stage_.size())) {
    MEMPLAN_LOG(kError, "chunk manager hook for an unknown group").Field("group", group);
    return;
  }
  torch::NoGradGuard no_grad;
  if (stateless()) {
    for (int i : group_stage_[group]) {
      if (params_[i].tensor.grad().defined()) params_[i].tensor.mutable_grad().reset();
    }
    return;
  }
  if (sharded()) {
    PostBackwardSharded(group);
    return;
  }
  std::set<int> touched;
  for (int i : group_stage_[group]) {
    Param& p = params_[i];
    Chunk& chunk = chunks_[p.chunk];
    if (chunk.persistent) continue;  // autograd keeps accumulating these on the device
    // The staging area is reused: the accumulation of what it held before must be done.
    if (touched.insert(p.chunk).second) chunk.tasks->Wait();
    StageGrad(p, chunk);
  }
  for (int c : touched) {
    Chunk& chunk = chunks_[c];
#ifdef MEMPLAN_CHUNKS_CUDA
    if (cuda()) {
      chunk.grads_copied = std::make_shared<Event>();
      chunk.grads_copied->record(*offload_stream_);
    }
#endif
  }
  // [Grad staging slots] the copies out of this group's slot are the ones just queued.
  if (!grad_slots_.empty() && group_slot_elems_[group] > 0 && !touched.empty()) {
    slot_copied_[group % kGradStagingSlots] = chunks_[*touched.rbegin()].grads_copied;
  }
  BoundGradCopyBacklog(touched);
  for (int c : touched) {
    Chunk& chunk = chunks_[c];
    if (chunk.update_started) {
      overrun_ = true;
      continue;
    }
    const bool complete = chunk.completion_group == group;
    if (complete) ++chunk.micro_batches;
    // Without clipping the update needs nothing but this chunk's final grads, so it overlaps the
    // rest of backward. With clipping it must wait for the global norm (end of backward, in
    // Step()): the CPU then only accumulates now.
    const bool update_now =
        complete && chunk.micro_batches >= options_.grad_accum && options_.max_grad_norm == 0;
    ScheduleChunkWork(c, /*accumulate=*/true, update_now, 1.0f);
  }
}

void ChunkManager::Impl::ScheduleChunkWork(int c, bool accumulate, bool update, float grad_scale) {
  Chunk& chunk = chunks_[c];
  std::vector<RangeWork> work;
  for (int i : chunk.params) {
    Param& p = params_[i];
    RangeWork base;
    base.param = i;
    if (accumulate) {
      base.accumulate = p.grad_this_micro && chunk.grad_accum.data() != nullptr;
      base.first = !p.grad_in_step;
      p.grad_in_step = p.grad_in_step || p.grad_this_micro;
      p.grad_this_micro = false;
    }
    // torch::optim::AdamW skips parameters without a grad: no decay, no step count.
    base.update = update && p.grad_in_step;
    if (base.update) {
      base.step = ++p.step;
      base.scalars = MakeAdamWStepScalars(options_.adamw, base.step);
    }
    if (!base.accumulate && !base.update) continue;
    const OwnedRange owned = Owned(p, chunk);  // the whole parameter unless sharded
    // adamw8bit: tasks end on the parameter's block boundaries (kTaskElems is a multiple of 256
    // and the pieces are cut at parameter offsets that are multiples of it).
    const int64_t phase = quantized() ? owned.from % kTaskElems : 0;
    for (int64_t off = 0; off < owned.len;) {
      RangeWork w = base;
      w.begin = owned.at + off;
      w.from = owned.from + off;
      w.len = std::min(kTaskElems - (off == 0 ? phase : 0), owned.len - off);
      work.push_back(w);
      off += w.len;
    }
  }
  if (update) chunk.update_started = true;
  if (work.empty()) return;
  if (update && sharded() && buffers_[chunk.home].chunk == c) {
    // An all-gather may still read param_host (CPU: Gloo reads it in place).
    (void)FinishGather(buffers_[chunk.home]);
  }

  const EventPtr copied = chunk.grads_copied;
  const EventPtr uploaded = chunk.uploaded;
  const OptimizerKind kind = optimizer();
  const bool narrow = dtype_ != torch::kFloat32;  // bf16 staging copy and upload copy
  const bool keeps_master = master();
  const int64_t slot = slot_elems();
  float* exp_avg_absmax = chunk.exp_avg_absmax.as<float>();
  float* exp_avg_sq_absmax = chunk.exp_avg_sq_absmax.as<float>();
  const AdamWOptions adamw = options_.adamw;
  const SgdStepScalars sgd = MakeSgdStepScalars(adamw.lr, adamw.weight_decay);
  const bool stochastic = options_.stochastic_rounding;
  const uint64_t seed = options_.rounding_seed;
  char* stage = static_cast<char*>(chunk.grad_stage.data());
  void* grad = HostGrad(chunk);
  float* grad32 = static_cast<float*>(grad);
  float* master32 = HostMaster(chunk);
  void* exp_avg = chunk.exp_avg.data();
  void* exp_avg_sq = chunk.exp_avg_sq.data();
  uint16_t* param16 = chunk.param_host.as<uint16_t>();
  uint16_t* accum16 = chunk.grad_accum.as<uint16_t>();
  std::atomic<bool>* failed = &worker_failed_;
  TaskTracker* tracker = chunk.tasks.get();
  tracker->Add(static_cast<int>(work.size()));
  for (const RangeWork& w : work) {
    pool_.Schedule([=] {
      if (copied) copied->synchronize();
      if (w.accumulate) {
        const uint16_t* in16 = reinterpret_cast<const uint16_t*>(stage) + w.begin;
        if (kind == OptimizerKind::kAdamWBf16States ||
            (kind == OptimizerKind::kAdamW8bit && narrow)) {
          // bf16 sum rounded after every add, as torch accumulates a bf16 .grad.
          AccumulateGradBf16Rounded(w.first, w.len, in16, accum16 + w.begin);
        } else if (narrow) {
          AccumulateGradBf16(w.first, w.len, in16, grad32 + w.begin);
        } else {
          AccumulateGrad(w.first, w.len, reinterpret_cast<const float*>(stage) + w.begin,
                         grad32 + w.begin);
        }
      }
      if (!w.update) {
        tracker->Done();
        return;
      }
      if (uploaded) uploaded->synchronize();  // param_host may still be the upload source
      switch (kind) {
        case OptimizerKind::kAdamW:
          AdamWUpdate(w.scalars, grad_scale, w.len, master32 + w.begin, grad32 + w.begin,
                      static_cast<float*>(exp_avg) + w.begin,
                      static_cast<float*>(exp_avg_sq) + w.begin, &TorchSqrt);
          break;
        case OptimizerKind::kSgd:
          SgdUpdate(sgd, grad_scale, w.len, master32 + w.begin, grad32 + w.begin);
          break;
        case OptimizerKind::kAdamW8bit: {
          // [8-bit optimizer state]: a block starting at shard element e has slot ceil(e / g);
          // the range's first block is the rest of the parameter block it starts in.
          QuantBlocks blocks;
          blocks.first_block_elems = kQuantBlockElems - w.from % kQuantBlockElems;
          const int64_t first_slot = (w.begin + slot - 1) / slot;
          blocks.first_slot_gap =
              (w.begin + blocks.first_block_elems + slot - 1) / slot - first_slot;
          blocks.slot_stride = kQuantBlockElems / slot;
          uint8_t* m = static_cast<uint8_t*>(exp_avg) + w.begin;
          uint8_t* v = static_cast<uint8_t*>(exp_avg_sq) + w.begin;
          if (narrow) {
            AdamW8bitUpdateBf16(w.scalars, grad_scale, w.len, blocks, param16 + w.begin,
                                static_cast<const uint16_t*>(grad) + w.begin, m, v,
                                exp_avg_absmax + first_slot, exp_avg_sq_absmax + first_slot,
                                &TorchSqrt,
                                MakeParamRounding(stochastic, seed, w.param, w.step, w.from));
          } else {
            AdamW8bitUpdate(w.scalars, grad_scale, w.len, blocks, master32 + w.begin,
                            grad32 + w.begin, m, v, exp_avg_absmax + first_slot,
                            exp_avg_sq_absmax + first_slot, &TorchSqrt);
          }
          break;
        }
        case OptimizerKind::kAdamWBf16States:
          // torch's own fused kernel on host views of the range: the same function as the
          // persistent chunks' update and torch.optim.AdamW(fused=True) on bf16 parameters.
          try {
            auto view = [&w](void* base) {
              return torch::from_blob(static_cast<uint16_t*>(base) + w.begin, {w.len},
                                      torch::TensorOptions().dtype(torch::kBFloat16));
            };
            torch::Tensor g = view(grad);
            // clip_grad_norm_'s grad.mul_(coef): a bf16 product (coef is a bf16 value).
            if (grad_scale != 1.0f) g.mul_(static_cast<double>(grad_scale));
            at::_fused_adamw_({view(param16)}, {g}, {view(exp_avg)}, {view(exp_avg_sq)}, {},
                              {torch::full({}, static_cast<double>(w.step), torch::kFloat32)},
                              adamw.lr, adamw.beta1, adamw.beta2, adamw.weight_decay, adamw.eps,
                              /*amsgrad=*/false, /*maximize=*/false);
          } catch (const c10::Error& e) {
            MEMPLAN_LOG(kError, "CPU optimizer update failed")
                .Field("error", std::string(e.what_without_backtrace()));
            failed->store(true);
          }
          break;
      }
      if (keeps_master) RoundToBf16(w.len, master32 + w.begin, param16 + w.begin);
      tracker->Done();
    });
  }
}

// [Sharded chunks]: the collectives.

void ChunkManager::Impl::FailCollective(const absl::Status& status) {
  (void)NoteCollective(status);
  TORCH_CHECK(false, std::string(status.message()));
}

absl::Status ChunkManager::Impl::FinishGather(DeviceBuffer& buffer) {
  const absl::Status status = FinishBatch(buffer.gather);
  buffer.gather_src = torch::Tensor();
  return status;
}

absl::Status ChunkManager::Impl::FinishBatch(std::shared_ptr<GatherBatch>& gather) {
  if (!gather) return absl::OkStatus();
  std::shared_ptr<GatherBatch> batch = std::move(gather);  // leaves `gather` null
  if (!batch->work) FlushGathers();  // still queued: a buffer reused within one batch
  if (!batch->waited) {
    batch->waited = true;
    batch->status = batch->work->Wait();
    if (batch->status.ok()) {
      batch->outputs.clear();
      batch->inputs.clear();
      timed_gathers_.push_back(batch);
      FoldTimedGathers(/*wait=*/false);
    }
  }
  return NoteCollective(batch->status);
}

void ChunkManager::Impl::FoldTimedGathers(bool wait) {
  while (!timed_gathers_.empty()) {
    GatherBatch& batch = *timed_gathers_.front();
    // Beyond the bound the oldest is waited for (its collective is long done in practice).
    const bool must = wait || timed_gathers_.size() > kMaxTimedGathers;
    const absl::StatusOr<double> seconds = batch.work->DeviceSeconds(must);
    if (!seconds.ok() && absl::IsUnavailable(seconds.status())) return;  // still running
    const int64_t bytes = batch.bytes;
    if (seconds.ok()) {
      ++upload_stats_.gathers_timed;
      upload_stats_.gather_output_bytes += bytes;
      upload_stats_.gather_seconds += *seconds;
      if (upload_stats_.gather_seconds_each.size() < ChunkUploadStats::kMaxGatherSamples) {
        upload_stats_.gather_seconds_each.push_back(static_cast<float>(*seconds));
        upload_stats_.gather_sampled_bytes += bytes;
      }
    }
    timed_gathers_.pop_front();
  }
}

void ChunkManager::Impl::WaitGather(DeviceBuffer& buffer) {
  const absl::Status s = FinishGather(buffer);
  if (!s.ok()) FailCollective(s);
}

void ChunkManager::Impl::StartGather(int c, DeviceBuffer& buffer) {
  WaitGather(buffer);  // the buffer's previous all-gather may still write it
  Chunk& chunk = chunks_[c];
  torch::Tensor src = HostFlat(chunk.param_host.data(), 0, chunk.shard_elems, dtype_);
  torch::Tensor dst = buffer.storage.narrow(0, 0, chunk.padded_elems);
  buffer.ready = nullptr;
  buffer.gather = JoinGatherBatch(chunk.padded_elems * elem_size());
  GatherBatch& batch = *buffer.gather;
#ifdef MEMPLAN_CHUNKS_CUDA
  if (cuda()) {
    // The buffer's previous chunk may still be read by kernels queued on the compute stream; the
    // collective is ordered after the current (upload) stream, hence after the shard's copy.
    RecordOnCompute()->block(*upload_stream_);
    c10::cuda::CUDAStreamGuard guard(*upload_stream_);
    buffer.gather_src = torch::empty({chunk.shard_elems}, DeviceOptions());
    buffer.gather_src.copy_(src, /*non_blocking=*/true);
    auto copied = std::make_shared<Event>();
    copied->record(*upload_stream_);
    chunk.uploaded = copied;  // the CPU update must not overwrite param_host before the copy
    batch.outputs.push_back(dst);
    batch.inputs.push_back(buffer.gather_src);
    if (!options_.coalesce_gathers) FlushGathers();
    return;
  }
#endif
  batch.outputs.push_back(dst);
  batch.inputs.push_back(src);
  if (!options_.coalesce_gathers) FlushGathers();
}

std::shared_ptr<GatherBatch> ChunkManager::Impl::JoinGatherBatch(int64_t bytes) {
  ++upload_stats_.uploads;
  upload_stats_.bytes += bytes;
  ++upload_stats_.gathers;
  if (!open_gathers_) open_gathers_ = std::make_shared<GatherBatch>();
  open_gathers_->bytes += bytes;
  return open_gathers_;
}

void ChunkManager::Impl::FlushGathers() {
  if (!open_gathers_) return;
  std::shared_ptr<GatherBatch> batch = std::move(open_gathers_);  // a new batch opens next time
#ifdef MEMPLAN_CHUNKS_CUDA
  // The collective is ordered after the upload stream: after every shard's copy queued above.
  std::optional<c10::cuda::CUDAStreamGuard> guard;
  if (cuda()) guard.emplace(*upload_stream_);
#endif
  batch->work = batch->outputs.size() == 1
                    ? comm_->AllGather(batch->outputs[0], batch->inputs[0])
                    : comm_->AllGatherCoalesced(batch->outputs, batch->inputs);
}

// [Sharded persistent parameters]

void ChunkManager::Impl::GatherPersistent(int c) {
  Chunk& chunk = chunks_[c];
  if (chunk.gathered) return;
  // The memory comes from the caching allocator on the current (compute) stream; its storage
  // object is the one the parameters and autograd's saved views point into.
  c10::StorageImpl* storage = chunk.device.storage().unsafeGetStorageImpl();
  const size_t bytes = static_cast<size_t>(chunk.padded_elems * elem_size());
  storage->set_data_ptr_noswap(storage->allocator()->allocate(bytes));
  storage->set_nbytes(bytes);
  chunk.gathered = true;
  ++stats_.persistent_gathers;
  chunk.gather = JoinGatherBatch(chunk.padded_elems * elem_size());
  chunk.gather->outputs.push_back(chunk.device);
  chunk.gather->inputs.push_back(chunk.param_shard);
#ifdef MEMPLAN_CHUNKS_CUDA
  // The memory may be a block the compute stream released with readers still queued: the
  // collective (ordered after the upload stream) starts after them.
  if (cuda()) RecordOnCompute()->block(*upload_stream_);
#endif
  if (!options_.coalesce_gathers) FlushGathers();
}

void ChunkManager::Impl::WaitPersistent(int c) {
  const absl::Status s = FinishBatch(chunks_[c].gather);  // the compute stream waits for it
  if (!s.ok()) FailCollective(s);
}

void ChunkManager::Impl::ReleasePersistent(int c) {
  Chunk& chunk = chunks_[c];
  // The collective must not outlive its output; a failure is kept in comm_status_.
  (void)FinishBatch(chunk.gather);
  c10::StorageImpl* storage = chunk.device.storage().unsafeGetStorageImpl();
  storage->set_data_ptr_noswap(c10::DataPtr(nullptr, chunk.device.device()));
  storage->set_nbytes(0);
  chunk.gathered = false;
}

void ChunkManager::Impl::ReleaseAllPersistent() {
  for (int c = 0; c < n_persist_; ++c) {
    if (chunks_[c].params_sharded && chunks_[c].gathered) ReleasePersistent(c);
  }
}

void ChunkManager::Impl::PostBackwardSharded(int group) {
  // [Reduce-scatter in backward] The previous group's reduce-scatters ran beside this group's
  // backward: finish them before this group's grads are read.
  reduces_beside_backward_ += static_cast<int>(pending_shard_reduces_.size());
  if (const absl::Status s = FinishShardReduces(); !s.ok()) FailCollective(s);
  // [State reduce-scatter per group] Likewise the persistent chunks' reduce-scatters of the
  // previous group.
  if (const absl::Status s = FinishStateReduces(); !s.ok()) FailCollective(s);
  std::set<int> touched, persistent_touched;
  for (int i : group_stage_[group]) {
    Param& p = params_[i];
    Chunk& chunk = chunks_[p.chunk];
    if (chunk.persistent) {
      persistent_touched.insert(p.chunk);
      continue;
    }
    touched.insert(p.chunk);
    torch::Tensor grad = p.tensor.grad();
    if (!grad.defined()) continue;
    p.grad_this_micro = true;
    if (!chunk.grad_flat.defined()) {
      // fp32 whatever the model dtype: the reduction over the ranks runs in fp32.
      chunk.grad_flat = torch::zeros({chunk.padded_elems}, DeviceOptions().dtype(torch::kFloat32));
    }
    torch::Tensor dst = chunk.grad_flat.narrow(0, p.offset_elems, p.numel).view(p.shape);
    // A tied weight's second contribution in this micro-batch (grad_accum > 1) adds on.
    if (p.in_flat) {
      dst.add_(grad);
    } else {
      dst.copy_(grad);
    }
    p.in_flat = true;
    p.tensor.mutable_grad().reset();
  }
  for (int c : touched) {
    Chunk& chunk = chunks_[c];
    if (chunk.completion_group != group || !chunk.grad_flat.defined()) continue;
    if (chunk.update_started) {
      overrun_ = true;
      chunk.grad_flat = torch::Tensor();
      for (int i : chunk.params) params_[i].in_flat = false;
      continue;
    }
    if (options_.accumulate_sharded_grads_on_device &&
        chunk.micro_batches + 1 < options_.grad_accum) {
      // Keep grad_flat and the params' in_flat: the next micro-batch adds to them.
      ++chunk.micro_batches;
      continue;
    }
    chunk.tasks->Wait();  // the staging area is reused
    const bool whole_step =
        (options_.grad_accum == 1 || options_.accumulate_sharded_grads_on_device) &&
        chunk.micro_batches + 1 >= options_.grad_accum;
    ++chunk.micro_batches;
    const bool update_now =
        chunk.micro_batches >= options_.grad_accum && options_.max_grad_norm == 0;
    StartShardReduce(c, whole_step, update_now);
  }
  // [Persistent all-reduce in backward] A persistent chunk whose last group ran in the step's
  // last micro-batch has its final grads: its all-reduce starts now, beside the rest of backward.
  for (int c : persistent_touched) {
    Chunk& chunk = chunks_[c];
    if (chunk.completion_group != group || chunk.grads_reduced) continue;
    if (++chunk.micro_batches < options_.grad_accum) continue;
    const absl::Status s = StartPersistentReduce(c);
    if (!s.ok()) FailCollective(s);
    ++reduces_in_backward_;
  }
}

absl::Status ChunkManager::Impl::StartPersistentReduce(int c) {
  Chunk& chunk = chunks_[c];
  if (chunk.state_sharded) {
    // [Sharded persistent state]: the grads at their layout offsets in an fp32 flat tensor over
    // the padded chunk (alignment gaps and padding zeroed, nothing else written twice),
    // reduce-scattered; the parameters' own grads are not needed any more. The chunks a group
    // completes are all in flight together and finish at the next group's hook, beside that
    // group's backward ([State reduce-scatter per group]).
    chunk.grads_reduced = true;
    bool any = false;
    for (int i : chunk.params) any = any || params_[i].tensor.grad().defined();
    if (!any) return absl::OkStatus();
    PendingReduce pending;
    pending.chunk = c;
    pending.flat = torch::empty({chunk.padded_elems}, DeviceOptions().dtype(torch::kFloat32));
    std::vector<int> by_offset = chunk.params;
    std::sort(by_offset.begin(), by_offset.end(), [this](int a, int b) {
      return params_[a].offset_elems < params_[b].offset_elems;
    });
    int64_t covered = 0;  // elements written so far, from the start of the chunk
    for (int i : by_offset) {
      Param& p = params_[i];
      if (p.offset_elems > covered) pending.flat.narrow(0, covered, p.offset_elems - covered).zero_();
      torch::Tensor dst = pending.flat.narrow(0, p.offset_elems, p.numel);
      if (p.tensor.grad().defined()) {
        dst.copy_(p.tensor.grad().reshape({-1}));
        p.tensor.mutable_grad().reset();
        p.grad_in_step = true;
      } else {
        dst.zero_();
      }
      covered = p.offset_elems + p.numel;
    }
    if (chunk.padded_elems > covered) {
      pending.flat.narrow(0, covered, chunk.padded_elems - covered).zero_();
    }
    pending.shard = torch::empty({chunk.shard_elems}, pending.flat.options());
    pending.work = comm_->ReduceScatterSum(pending.shard, pending.flat);
    pending_state_reduces_.push_back(std::move(pending));
    return absl::OkStatus();
  }
  // The previous one finishes first: one fp32 copy in flight besides the one being made.
  RETURN_IF_ERROR(FinishPersistentReduce());
  chunk.grads_reduced = true;
  PendingReduce pending;
  int64_t numel = 0;
  for (int i : chunk.params) {
    if (params_[i].tensor.grad().defined()) {
      pending.grads.push_back(params_[i].tensor.grad());
      numel += pending.grads.back().numel();
    }
  }
  if (pending.grads.empty()) return absl::OkStatus();
  // Reduced in fp32 whatever the model dtype, each grad widened straight into its slice.
  pending.flat = torch::empty({numel}, DeviceOptions().dtype(torch::kFloat32));
  int64_t at = 0;
  for (const torch::Tensor& g : pending.grads) {
    pending.flat.narrow(0, at, g.numel()).copy_(g.reshape({-1}));
    at += g.numel();
  }
  pending.work = comm_->AllReduceSum(pending.flat);
  pending_reduce_ = std::move(pending);
  return absl::OkStatus();
}

absl::Status ChunkManager::Impl::FinishStateReduces() {
  absl::Status first;
  for (PendingReduce& pending : pending_state_reduces_) {
    // CUDA: the compute stream waits for it.
    const absl::Status s = NoteCollective(pending.work->Wait());
    if (!s.ok()) {
      if (first.ok()) first = s;
      continue;
    }
    // [Sharded persistent state]: the mean, rounded once to the model dtype, and its squares.
    Chunk& chunk = chunks_[pending.chunk];
    pending.shard.div_(world_);
    chunk.grad_shard = dtype_ == torch::kFloat32 ? pending.shard : pending.shard.to(dtype_);
    chunk.shard_squares = chunk.grad_shard.to(torch::kFloat64).pow(2).sum();
  }
  pending_state_reduces_.clear();
  return first;
}

absl::Status ChunkManager::Impl::FinishPersistentReduce() {
  RETURN_IF_ERROR(FinishStateReduces());
  if (!pending_reduce_.has_value()) return absl::OkStatus();
  PendingReduce pending = std::move(*pending_reduce_);
  pending_reduce_.reset();
  // CUDA: the compute stream waits for it.
  RETURN_IF_ERROR(NoteCollective(pending.work->Wait()));
  pending.flat.div_(world_);
  int64_t at = 0;
  for (torch::Tensor& g : pending.grads) {
    g.copy_(pending.flat.narrow(0, at, g.numel()).view(g.sizes()));
    at += g.numel();
  }
  return absl::OkStatus();
}

void ChunkManager::Impl::StartShardReduce(int c, bool whole_step, bool update_now) {
  // Two in flight at most (the planner's two fp32 padded chunks of grads): the oldest finishes.
  if (pending_shard_reduces_.size() >= 2) {
    const absl::Status s = FinishShardReduce(pending_shard_reduces_.front());
    pending_shard_reduces_.erase(pending_shard_reduces_.begin());
    if (!s.ok()) FailCollective(s);
  }
  Chunk& chunk = chunks_[c];
  PendingShardReduce r;
  r.chunk = c;
  r.whole_step = whole_step;
  r.update_now = update_now;
  // The flat grads go with the collective; the next micro-batch starts a new one.
  r.grad_flat = std::move(chunk.grad_flat);
  chunk.grad_flat = torch::Tensor();
  for (int i : chunk.params) params_[i].in_flat = false;
  // grad_flat is fp32: the sum over the ranks runs in fp32 and the mean is rounded once into the
  // staging area's model dtype (an fp32 model on the CPU reduces straight into it).
  r.in_place = !cuda() && dtype_ == torch::kFloat32;
  r.shard = r.in_place ? HostFlat(chunk.grad_stage.data(), 0, chunk.shard_elems, dtype_)
                       : torch::empty({chunk.shard_elems}, r.grad_flat.options());
  r.work = comm_->ReduceScatterSum(r.shard, r.grad_flat);
  pending_shard_reduces_.push_back(std::move(r));
}

absl::Status ChunkManager::Impl::FinishShardReduce(PendingShardReduce& r) {
  Chunk& chunk = chunks_[r.chunk];
  // CUDA: the current (compute) stream waits for it.
  RETURN_IF_ERROR(NoteCollective(r.work->Wait()));
  torch::Tensor& shard = r.shard;
  shard.div_(world_);
  if (r.whole_step) {
    // The host grad will hold the shard rounded to the model dtype (padding and parameters
    // without a grad are zeros): its squares, summed where the shard already is.
    torch::Tensor rounded = dtype_ == torch::kFloat32 ? shard : shard.to(dtype_);
    chunk.shard_squares = rounded.to(torch::kFloat64).pow(2).sum();
  }
  torch::Tensor stage = HostFlat(chunk.grad_stage.data(), 0, chunk.shard_elems, dtype_);
  if (cuda()) {
#ifdef MEMPLAN_CHUNKS_CUDA
    torch::Tensor narrow = shard.to(dtype_);
    RecordOnCompute()->block(*offload_stream_);
    {
      c10::cuda::CUDAStreamGuard guard(*offload_stream_);
      stage.copy_(narrow, /*non_blocking=*/true);
    }
    c10::cuda::CUDACachingAllocator::recordStream(narrow.storage().data_ptr(), *offload_stream_);
    chunk.grads_copied = std::make_shared<Event>();
    chunk.grads_copied->record(*offload_stream_);
#endif
  } else if (!r.in_place) {
    stage.copy_(shard);
  }
  ScheduleChunkWork(r.chunk, /*accumulate=*/true, r.update_now, 1.0f);
  return absl::OkStatus();
}

absl::Status ChunkManager::Impl::FinishShardReduces() {
  absl::Status first;
  for (PendingShardReduce& r : pending_shard_reduces_) {
    const absl::Status s = FinishShardReduce(r);
    if (first.ok()) first = s;
  }
  pending_shard_reduces_.clear();
  return first;
}

absl::Status ChunkManager::Impl::AllReducePersistentGrads() {
  if (persistent_reduced_) return absl::OkStatus();
  persistent_reduced_ = true;
  // The chunks that completed in backward are in flight or done; the others (grads that arrived
  // in fewer micro-batches than grad_accum, or Grads() called mid-step) are reduced here, in
  // chunk order on every rank.
  for (int c = 0; c < n_persist_; ++c) {
    if (chunks_[c].grads_reduced) continue;
    RETURN_IF_ERROR(StartPersistentReduce(c));
  }
  return FinishPersistentReduce();
}

absl::StatusOr<double> ChunkManager::Impl::ShardedSquaredNorm() {
  // Chunks whose squares were summed on the device at their reduce-scatter add those; the others
  // (several micro-batches summed on the host) are read from host memory.
  double local = 0;
  std::vector<torch::Tensor> on_device;
  for (const Chunk& chunk : chunks_) {
    if ((!chunk.persistent || chunk.state_sharded) && chunk.shard_squares.defined()) {
      on_device.push_back(chunk.shard_squares.reshape({1}));
    }
  }
  for (Param& p : params_) {
    Chunk& chunk = chunks_[p.chunk];
    if (chunk.persistent || !p.grad_in_step || chunk.shard_squares.defined()) continue;
    const OwnedRange r = Owned(p, chunk);
    if (r.len == 0) continue;
    local += HostFlat(HostGrad(chunk), r.at, r.len, host_grad_dtype())
                 .to(torch::kFloat64)
                 .pow(2)
                 .sum()
                 .item<double>();
  }
  torch::Tensor total = torch::full(
      {1}, local, torch::TensorOptions().dtype(torch::kFloat64).device(comm_->device()));
  if (!on_device.empty()) total.add_(torch::cat(on_device).sum().to(comm_->device()));
  RETURN_IF_ERROR(NoteCollective(comm_->AllReduceSum(total)->Wait()));
  double squares = total.cpu().item<double>();
  // Persistent grads are replicated (all-reduced already): every rank adds the same, once.
  std::vector<torch::Tensor> persistent;
  for (Param& p : params_) {
    const Chunk& chunk = chunks_[p.chunk];
    if (chunk.persistent && !chunk.state_sharded && p.tensor.grad().defined()) {
      persistent.push_back(p.tensor.grad().to(torch::kFloat64).pow(2).sum());
    }
  }
  if (!persistent.empty()) squares += torch::stack(persistent).sum().item<double>();
  return squares;
}

class ChunkManager::Impl::PersistentUpdate {
 public:
  PersistentUpdate(Impl& m, const torch::Tensor& clip_coef, float grad_scale, int64_t slice_elems)
      : m_(m), clip_coef_(clip_coef), grad_scale_(grad_scale), slice_elems_(slice_elems) {}

  // `grad`: the range's grad in the model dtype, clipped here (in place where the optimizer
  // clips the model-dtype grad); `target`: the fp32 master's range with a master, else the
  // parameter's; `exp_avg` / `exp_avg_sq`: the moments of the same range. p.step is already the
  // step being taken.
  void Add(Param& p, const torch::Tensor& target, torch::Tensor grad, const torch::Tensor& exp_avg,
           const torch::Tensor& exp_avg_sq) {
    const AdamWOptions& o = m_.options_.adamw;
    if (m_.optimizer() == OptimizerKind::kSgd) {
      // torch::optim::SGD's ops (in place on the grad, dropped after the step). With a master the
      // clip scales the fp32 copy, like the offloaded chunks' kernel.
      torch::Tensor d = m_.master() ? grad.to(torch::kFloat32) : grad;
      if (clip_coef_.defined()) d.mul_(clip_coef_);
      if (o.weight_decay != 0) d.add_(target, o.weight_decay);
      target.add_(d, -1 * o.lr);
      return;
    }
    if (m_.cuda() || m_.pure()) {
      // torch.optim.AdamW(fused=True) after clip_grad_norm_ (adamw_bf16 on any device).
      if (clip_coef_.defined()) grad.mul_(clip_coef_);
      p.fused_step.fill_(static_cast<double>(p.step));  // the fused kernel reads, not bumps
      const bool sliceable = grad.is_contiguous() && target.is_contiguous() &&
                             exp_avg.is_contiguous() && exp_avg_sq.is_contiguous();
      if (!m_.master() || !sliceable) {
        Batch(target, m_.master() ? grad.to(torch::kFloat32) : grad, exp_avg, exp_avg_sq, p);
        return;
      }
      const torch::Tensor g = grad.view(-1), t = target.view(-1);
      const torch::Tensor mv = exp_avg.view(-1), vv = exp_avg_sq.view(-1);
      const int64_t n = g.numel();
      for (int64_t off = 0; off < n;) {
        if (batch_elems_ >= slice_elems_) Flush();
        const int64_t len = std::min(n - off, slice_elems_ - batch_elems_);
        Batch(t.narrow(0, off, len), g.narrow(0, off, len).to(torch::kFloat32),
              mv.narrow(0, off, len), vv.narrow(0, off, len), p);
        off += len;
      }
      return;
    }
    // The CPU kernel multiplies by the clip coefficient itself (same fp32 product as
    // grad.mul_(coef)) and reproduces torch's AdamW rounding exactly.
    const torch::Tensor g = grad.to(torch::kFloat32).contiguous();
    AdamWUpdate(MakeAdamWStepScalars(o, p.step), grad_scale_, g.numel(), target.data_ptr<float>(),
                g.data_ptr<float>(), exp_avg.data_ptr<float>(), exp_avg_sq.data_ptr<float>(),
                &TorchSqrt);
  }

  void Flush() {
    batch_elems_ = 0;
    if (targets_.empty()) return;
    const AdamWOptions& o = m_.options_.adamw;
    at::_fused_adamw_(targets_, grads_, exp_avgs_, exp_avg_sqs_, /*max_exp_avg_sqs=*/{}, steps_,
                      o.lr, o.beta1, o.beta2, o.weight_decay, o.eps, /*amsgrad=*/false,
                      /*maximize=*/false);
    targets_.clear();
    grads_.clear();
    exp_avgs_.clear();
    exp_avg_sqs_.clear();
    steps_.clear();
  }

 private:
  void Batch(const torch::Tensor& target, const torch::Tensor& grad, const torch::Tensor& exp_avg,
             const torch::Tensor& exp_avg_sq, Param& p) {
    targets_.push_back(target);
    grads_.push_back(grad);
    exp_avgs_.push_back(exp_avg);
    exp_avg_sqs_.push_back(exp_avg_sq);
    steps_.push_back(p.fused_step);
    batch_elems_ += target.numel();
  }

  Impl& m_;
  const torch::Tensor clip_coef_;
  const float grad_scale_;
  const int64_t slice_elems_;
  std::vector<torch::Tensor> targets_, grads_, exp_avgs_, exp_avg_sqs_, steps_;
  int64_t batch_elems_ = 0;
};

absl::Status ChunkManager::Impl::UpdateShardedPersistent(const torch::Tensor& clip_coef,
                                                         float grad_scale) {
  // [Sharded persistent state] The same arithmetic as the replicated persistent chunks' update
  // (clip the model-dtype grad, widen it for a master, AdamW / SGD per parameter), on the owned
  // ranges of this rank's shard; then the shard goes back into the flat parameters and is
  // all-gathered. Two gathers in flight at most: each holds a copy of its shard.
  struct Gather {
    std::unique_ptr<PendingCollective> work;
    torch::Tensor src;
  };
  std::deque<Gather> gathers;
  absl::Status status;
  auto finish_oldest = [&] {
    const absl::Status s = NoteCollective(gathers.front().work->Wait());
    if (status.ok()) status = s;
    gathers.pop_front();
  };
  const int64_t slice_elems =
      StepGradCopyElems(std::numeric_limits<int64_t>::max(), options_.chunk_bytes, elem_size());
  for (int c = 0; c < n_persist_ && status.ok(); ++c) {
    Chunk& chunk = chunks_[c];
    if (!chunk.state_sharded || !chunk.grad_shard.defined()) continue;
    {
      PersistentUpdate update(*this, clip_coef, grad_scale, slice_elems);
      for (int i : chunk.params) {
        Param& p = params_[i];
        if (!p.grad_in_step) continue;
        ++p.step;  // on every rank, whether or not it stores part of p
        const OwnedRange r = Owned(p, chunk);
        if (r.len == 0) continue;
        // [Sharded persistent parameters]: the shard is all the rank holds.
        const torch::Tensor target =
            master()               ? p.master
            : chunk.params_sharded ? chunk.param_shard.narrow(0, r.at, r.len)
                                   : chunk.device.narrow(0, chunk.shard_begin + r.at, r.len);
        update.Add(p, target, chunk.grad_shard.narrow(0, r.at, r.len), p.exp_avg, p.exp_avg_sq);
      }
      update.Flush();
    }
    if (chunk.params_sharded) {
      if (master()) chunk.param_shard.copy_(chunk.device_master);
      continue;  // gathered when a group next uses it
    }
    torch::Tensor shard = chunk.device.narrow(0, chunk.shard_begin, chunk.shard_elems);
    if (master()) shard.copy_(chunk.device_master);
    if (gathers.size() >= 2) finish_oldest();
    Gather gather;
    gather.src = shard.clone();
    gather.work = comm_->AllGather(chunk.device, gather.src);
    gathers.push_back(std::move(gather));
  }
  while (!gathers.empty()) finish_oldest();
  return status;
}

torch::Tensor ChunkManager::Impl::GatherDevice(const torch::Tensor& shard) {
  // Read only: a host array on a CPU communicator is gathered in place, without a copy.
  torch::Tensor src = shard.contiguous().to(comm_->device());
  torch::Tensor full = torch::empty({src.numel() * world_}, src.options());
  const absl::Status s = comm_->AllGather(full, src)->Wait();
  if (!s.ok()) FailCollective(s);
  return full.to(torch::kCPU);
}

torch::Tensor ChunkManager::Impl::GatherHost(const void* data, torch::ScalarType dtype,
                                             const Chunk& chunk, int64_t elems) {
  if (elems < 0) elems = chunk.shard_elems;
  return GatherDevice(
      torch::from_blob(const_cast<void*>(data), {elems}, torch::TensorOptions().dtype(dtype)));
}

void ChunkManager::Impl::WaitAll() {
  (void)FinishShardReduces();  // a failure is kept in comm_status_
  for (DeviceBuffer& buffer : buffers_) (void)FinishGather(buffer);
  for (Chunk& chunk : chunks_) (void)FinishBatch(chunk.gather);
#ifdef MEMPLAN_CHUNKS_CUDA
  if (cuda()) {
    upload_stream_->synchronize();
    offload_stream_->synchronize();
  }
#endif
  for (Chunk& chunk : chunks_) chunk.tasks->Wait();
}

void ChunkManager::Impl::InvalidateBuffers() {
  ReleaseAllPersistent();  // [Sharded persistent parameters]: gathered again from the shards
  for (DeviceBuffer& buffer : buffers_) {
    (void)FinishGather(buffer);
    if (buffer.chunk >= 0) Dematerialize(buffer.chunk);
    buffer.chunk = -1;
    buffer.ready = nullptr;
  }
}

void ChunkManager::Impl::ResetStep() {
  for (Param& p : params_) {
    if (p.tensor.grad().defined()) p.tensor.mutable_grad().reset();
    p.grad_in_step = false;
    p.grad_this_micro = false;
    p.in_flat = false;
    p.grad_norm = torch::Tensor();
  }
  persistent_reduced_ = false;
  if (pending_reduce_.has_value()) {
    (void)pending_reduce_->work->Wait();  // the collective must not outlive its tensors
    pending_reduce_.reset();
  }
  for (PendingReduce& pending : pending_state_reduces_) (void)pending.work->Wait();
  pending_state_reduces_.clear();
  for (PendingShardReduce& r : pending_shard_reduces_) {
    if (r.work) (void)r.work->Wait();
  }
  pending_shard_reduces_.clear();
  reduces_in_backward_ = 0;
  reduces_beside_backward_ = 0;
  for (Chunk& chunk : chunks_) {
    chunk.grad_flat = torch::Tensor();
    chunk.grad_shard = torch::Tensor();
    chunk.shard_squares = torch::Tensor();
    chunk.micro_batches = 0;
    chunk.grads_reduced = false;
    chunk.update_started = false;
    chunk.grads_copied = nullptr;
  }
  overrun_ = false;
}

absl::Status ChunkManager::Impl::Step(double max_grad_norm) {
  grad_copies_.clear();  // backward is over: nothing more to bound
  if (options_.frozen) return absl::OkStatus();
  if (options_.profile_only) {
    return absl::FailedPreconditionError(
        "Step(): this chunk manager was created with profile_only (no optimizer state)");
  }
  torch::NoGradGuard no_grad;
  WaitAll();
  ReleaseAllPersistent();  // stale once updated; the next forward gathers the new shards
  bool started = false;
  for (const Chunk& chunk : chunks_) started = started || chunk.update_started;
  if (overrun_) {
    InvalidateBuffers();
    ResetStep();
    return absl::FailedPreconditionError(absl::StrCat(
        "gradients arrived for a chunk after its update started: more micro-batches than "
        "grad_accum (",
        options_.grad_accum, ") before Step(); the step's gradients were dropped"));
  }
  if (max_grad_norm > 0 && started) {
    InvalidateBuffers();
    ResetStep();
    return absl::FailedPreconditionError(absl::StrCat(
        "Step(max_grad_norm=", max_grad_norm,
        ") cannot clip: options.max_grad_norm=0 let CPU updates start during backward"));
  }
  if (!comm_status_.ok()) {  // a collective failed during forward/backward
    InvalidateBuffers();
    ResetStep();
    return comm_status_;
  }
  try {
    double sharded_norm = -1;  // [Sharded chunks]: the global norm over every rank's shards
    if (sharded()) {
      absl::Status reduced = AllReducePersistentGrads();
      absl::StatusOr<double> squares = 0.0;
      if (reduced.ok() && (max_grad_norm > 0 || options_.grad_accum == 1)) {
        squares = ShardedSquaredNorm();
      }
      if (!reduced.ok() || !squares.ok()) {
        InvalidateBuffers();
        ResetStep();
        return reduced.ok() ? squares.status() : reduced;
      }
      sharded_norm = std::sqrt(*squares);
    }
    // clip_grad_norm_: per-parameter norms in ParamOrder(), stacked, normed again.
    // With several micro-batches the offloaded grads' norms need a pass over host memory; skip
    // it when nothing is clipped (LastGradNorm() is then NaN).
    const bool want_norm = max_grad_norm > 0 || options_.grad_accum == 1;
    std::vector<torch::Tensor> norms;
    if (want_norm && !sharded()) {
      for (Param& p : params_) {
        Chunk& chunk = chunks_[p.chunk];
        // Norms stay on the compute device: one synchronisation for the whole step (reading
        // each one back cost a device round trip per parameter).
        if (chunk.persistent) {
          if (p.tensor.grad().defined()) norms.push_back(p.tensor.grad().norm(2.0));
          continue;
        }
        if (!p.grad_in_step) continue;
        if (!p.grad_norm.defined()) {
          p.grad_norm =
              HostView(HostGrad(chunk), p.offset_elems, p.shape, p.numel, host_grad_dtype())
                  .norm(2.0);
        }
        norms.push_back(p.grad_norm.to(options_.device));
      }
    }
    float grad_scale = 1.0f;
    torch::Tensor clip_coef;
    last_grad_norm_ = want_norm ? 0 : std::numeric_limits<double>::quiet_NaN();
    if (want_norm && sharded()) {
      last_grad_norm_ = sharded_norm;
      if (max_grad_norm > 0) {
        // clip_grad_norm_'s coefficient, in fp32 as its tensors compute it.
        grad_scale = std::min(
            1.0f, static_cast<float>(max_grad_norm) / (static_cast<float>(sharded_norm) + 1e-6f));
        clip_coef =
            torch::full({}, static_cast<double>(grad_scale),
                        torch::TensorOptions().dtype(torch::kFloat32).device(options_.device));
      }
    } else if (!norms.empty()) {
      torch::Tensor total = norms.size() == 1 ? norms[0] : torch::stack(norms).norm(2.0);
      if (max_grad_norm > 0) {
        clip_coef = torch::clamp(max_grad_norm / (total + 1e-6), std::nullopt, 1.0);
        const torch::Tensor host = torch::stack({total, clip_coef}).to(torch::kCPU);
        last_grad_norm_ = host[0].item<double>();
        grad_scale = host[1].item<float>();
      } else {
        last_grad_norm_ = total.item<double>();
      }
    }

    // Persistent chunks: on the device, one fused call per chunk, so that the fp32 copies of a
    // mixed-precision model's grads exist for one chunk at a time (not for the whole model); a
    // parameter larger than a regular chunk is updated in slices of a chunk's elements
    // ([Sliced grad copy], common/optimizer_bytes.h), so the fp32 transient never exceeds one
    // regular chunk's and the caching allocator reuses the same block for every slice.
    const int64_t slice_elems =
        StepGradCopyElems(std::numeric_limits<int64_t>::max(), options_.chunk_bytes, elem_size());
    std::vector<Param*> updated;
    {
      PersistentUpdate update(*this, clip_coef, grad_scale, slice_elems);
      int batch_chunk = -1;
      for (size_t i = 0; i < params_.size(); ++i) {
        Param& p = params_[i];
        const Chunk& owner = chunks_[p.chunk];
        if (!owner.persistent || owner.state_sharded || !p.tensor.grad().defined()) continue;
        if (p.chunk != batch_chunk) {
          update.Flush();  // one fused call per chunk at most
          batch_chunk = p.chunk;
        }
        ++p.step;
        if (quantized()) {
          AdamW8bitTorchUpdate(options_.adamw, p.step, clip_coef, quant_maps_, p.tensor.detach(),
                               p.tensor.grad(), p.exp_avg, p.exp_avg_sq, p.exp_avg_absmax,
                               p.exp_avg_sq_absmax,
                               MakeParamRounding(options_.stochastic_rounding,
                                                 options_.rounding_seed,
                                                 static_cast<int64_t>(i), p.step, 0));
          continue;
        }
        updated.push_back(&p);
        update.Add(p, master() ? p.master : p.tensor.detach(), p.tensor.grad(), p.exp_avg,
                   p.exp_avg_sq);
      }
      update.Flush();
    }
    if (master()) {
      for (Param* p : updated) p->tensor.detach().copy_(p->master);
    }
    if (sharded() && options_.shard_persistent_state) {
      if (const absl::Status s = UpdateShardedPersistent(clip_coef, grad_scale); !s.ok()) {
        InvalidateBuffers();
        ResetStep();
        return s;
      }
    }

    // Offloaded chunks not updated during backward: on the CPU pool, all chunks at once.
    for (int c = n_persist_; c < static_cast<int>(chunks_.size()); ++c) {
      if (!chunks_[c].update_started) {
        ScheduleChunkWork(c, /*accumulate=*/false, /*update=*/true, grad_scale);
      }
    }
    WaitAll();
  } catch (const c10::Error& e) {
    InvalidateBuffers();
    ResetStep();
    return TorchError(e, "optimizer step");
  }
  if (worker_failed_.exchange(false)) {
    InvalidateBuffers();
    ResetStep();
    return absl::InternalError("optimizer step: a CPU update failed (see the log)");
  }
  // Device copies of offloaded chunks are stale now; the next forward uploads fresh values.
  InvalidateBuffers();
  ResetStep();
  return absl::OkStatus();
}

void ChunkManager::Impl::ZeroGrad() {
  WaitAll();
  bool started = false;
  for (const Chunk& chunk : chunks_) started = started || chunk.update_started;
  if (started) InvalidateBuffers();
  ResetStep();
}

std::vector<NamedParam> ChunkManager::Impl::ParamOrder() const {
  std::vector<NamedParam> order;
  order.reserve(params_.size());
  for (const Param& p : params_) order.push_back({p.name, p.tensor});
  return order;
}

std::vector<NamedParam> ChunkManager::Impl::Params() {
  WaitAll();
  // Sharded: every offloaded chunk gathered from the ranks, in chunk order on every rank.
  std::map<int, torch::Tensor> gathered;
  if (sharded()) {
    for (int c = 0; c < static_cast<int>(chunks_.size()); ++c) {
      if (chunks_[c].params_sharded) gathered[c] = GatherDevice(chunks_[c].param_shard);
      if (chunks_[c].persistent) continue;
      gathered[c] = GatherHost(chunks_[c].param_host.data(), dtype_, chunks_[c]);
    }
  }
  std::vector<NamedParam> out;
  for (Param& p : params_) {
    Chunk& chunk = chunks_[p.chunk];
    torch::Tensor value;
    if (chunk.params_replicated()) {
      value = p.tensor.detach().to(torch::kCPU, /*non_blocking=*/false, /*copy=*/true);
    } else if (sharded()) {
      value = gathered[p.chunk].narrow(0, p.offset_elems, p.numel).view(p.shape).clone();
    } else {
      value = ParamHostView(chunk.param_host.data(), p).clone();
    }
    out.push_back({p.name, value});
  }
  return out;
}

std::vector<NamedParam> ChunkManager::Impl::Grads() {
  WaitAll();
  std::map<int, torch::Tensor> gathered;  // sharded: chunks with a grad in this step
  if (sharded()) {
    // The replicated chunks' grads are summed over the ranks now (Step() does not repeat it).
    if (const absl::Status s = AllReducePersistentGrads(); !s.ok()) FailCollective(s);
    // [Sharded persistent state]: the reduced shards, gathered.
    for (int c = 0; c < n_persist_; ++c) {
      if (chunks_[c].grad_shard.defined()) gathered[c] = GatherDevice(chunks_[c].grad_shard);
    }
    for (int c = n_persist_; c < static_cast<int>(chunks_.size()); ++c) {
      bool any = false;
      for (int i : chunks_[c].params) any = any || params_[i].grad_in_step;
      if (any) gathered[c] = GatherHost(HostGrad(chunks_[c]), host_grad_dtype(), chunks_[c]);
    }
  }
  std::vector<NamedParam> out;
  for (Param& p : params_) {
    Chunk& chunk = chunks_[p.chunk];
    if (chunk.state_sharded) {
      if (p.grad_in_step) {
        out.push_back(
            {p.name, gathered[p.chunk].narrow(0, p.offset_elems, p.numel).view(p.shape).clone()});
      }
    } else if (chunk.persistent) {
      if (p.tensor.grad().defined()) {
        out.push_back({p.name, p.tensor.grad().to(torch::kCPU, false, /*copy=*/true)});
      }
    } else if (p.grad_in_step && sharded()) {
      out.push_back(
          {p.name, gathered[p.chunk].narrow(0, p.offset_elems, p.numel).view(p.shape).clone()});
    } else if (p.grad_in_step) {
      out.push_back(
          {p.name,
           HostView(HostGrad(chunk), p.offset_elems, p.shape, p.numel, host_grad_dtype()).clone()});
    }
  }
  return out;
}

std::vector<NamedParam> ChunkManager::Impl::OptimizerState() {
  WaitAll();
  if (quantized()) {
    std::vector<NamedParam> out;
    OptimizerState8bit(out);
    return out;
  }
  // Sharded: the state arrays of every offloaded chunk with an updated parameter, gathered.
  std::map<const void*, torch::Tensor> gathered;
  if (sharded()) {
    // [Sharded persistent state]: the device shards of the persistent chunks, gathered.
    for (int c = 0; c < n_persist_; ++c) {
      Chunk& chunk = chunks_[c];
      bool any = false;
      for (int i : chunk.params) any = any || params_[i].step > 0;
      if (!chunk.state_sharded || !any) continue;
      for (const torch::Tensor* t :
           {&chunk.device_exp_avg, &chunk.device_exp_avg_sq, &chunk.device_master}) {
        if (t->defined()) gathered[t->data_ptr()] = GatherDevice(*t);
      }
    }
    for (int c = n_persist_; c < static_cast<int>(chunks_.size()); ++c) {
      Chunk& chunk = chunks_[c];
      bool any = false;
      for (int i : chunk.params) any = any || params_[i].step > 0;
      if (!any) continue;
      if (has_moments()) {
        gathered[chunk.exp_avg.data()] = GatherHost(chunk.exp_avg.data(), moment_dtype(), chunk);
        gathered[chunk.exp_avg_sq.data()] =
            GatherHost(chunk.exp_avg_sq.data(), moment_dtype(), chunk);
      }
      if (master()) {
        gathered[chunk.master.data()] = GatherHost(chunk.master.data(), torch::kFloat32, chunk);
      }
    }
  }
  std::vector<NamedParam> out;
  int64_t step = 0;
  for (Param& p : params_) {
    Chunk& chunk = chunks_[p.chunk];
    if (p.step == 0) continue;  // like torch's AdamW: no state before the first update
    step = std::max(step, p.step);
    auto host = [&](const HostBuffer& buffer, torch::ScalarType dtype) {
      if (sharded()) {
        return gathered[buffer.data()].narrow(0, p.offset_elems, p.numel).view(p.shape).clone();
      }
      return HostView(buffer.data(), p.offset_elems, p.shape, p.numel, dtype).clone();
    };
    auto device = [&](const torch::Tensor& t, const torch::Tensor& flat) {
      if (chunk.state_sharded) {
        return gathered[flat.data_ptr()].narrow(0, p.offset_elems, p.numel).view(p.shape).clone();
      }
      return t.to(torch::kCPU, false, /*copy=*/true);
    };
    if (has_moments()) {
      out.push_back({p.name + ".exp_avg", chunk.persistent ? device(p.exp_avg, chunk.device_exp_avg)
                                                           : host(chunk.exp_avg, moment_dtype())});
      out.push_back({p.name + ".exp_avg_sq", chunk.persistent
                                                 ? device(p.exp_avg_sq, chunk.device_exp_avg_sq)
                                                 : host(chunk.exp_avg_sq, moment_dtype())});
    }
    if (master()) {
      out.push_back({p.name + ".master", chunk.persistent ? device(p.master, chunk.device_master)
                                                          : host(chunk.master, torch::kFloat32)});
    }
  }
  if (!out.empty()) out.push_back({"step", torch::tensor(step, torch::kInt64)});
  return out;
}

// [8-bit optimizer state] in checkpoints: per parameter "<name>.exp_avg.q8" and
// "<name>.exp_avg_sq.q8" (uint8 codes, the parameter's shape) and "<name>.exp_avg.absmax",
// "<name>.exp_avg_sq.absmax" (fp32, one per 256-element block of the parameter): bitsandbytes'
// own state1/state2/absmax1/absmax2, independent of the chunk layout and world size.
void ChunkManager::Impl::OptimizerState8bit(std::vector<NamedParam>& out) {
  const int64_t g = slot_elems();
  const int64_t slots_per_shard_block = kQuantBlockElems / g;
  struct Gathered {
    torch::Tensor codes[2];
    torch::Tensor slots[2];  // every rank's slots, rank after rank
    int64_t slots_per_rank = 0;
  };
  std::map<int, Gathered> gathered;
  if (sharded()) {
    for (int c = n_persist_; c < static_cast<int>(chunks_.size()); ++c) {
      Chunk& chunk = chunks_[c];
      bool any = false;
      for (int i : chunk.params) any = any || params_[i].step > 0;
      if (!any) continue;
      Gathered& all = gathered[c];
      all.slots_per_rank = QuantAbsmaxSlots(chunk.shard_elems, elem_size());
      all.codes[0] = GatherHost(chunk.exp_avg.data(), torch::kUInt8, chunk);
      all.codes[1] = GatherHost(chunk.exp_avg_sq.data(), torch::kUInt8, chunk);
      all.slots[0] =
          GatherHost(chunk.exp_avg_absmax.data(), torch::kFloat32, chunk, all.slots_per_rank);
      all.slots[1] =
          GatherHost(chunk.exp_avg_sq_absmax.data(), torch::kFloat32, chunk, all.slots_per_rank);
    }
  }
  const float* maps[2] = {kSignedDynamicMap, kUnsignedDynamicMap};
  const char* names[2] = {".exp_avg", ".exp_avg_sq"};
  int64_t step = 0;
  for (Param& p : params_) {
    if (p.step == 0) continue;
    step = std::max(step, p.step);
    Chunk& chunk = chunks_[p.chunk];
    const int64_t blocks = (p.numel + kQuantBlockElems - 1) / kQuantBlockElems;
    for (int k = 0; k < 2; ++k) {
      torch::Tensor codes, absmax;
      if (chunk.persistent) {
        codes = (k == 0 ? p.exp_avg : p.exp_avg_sq).to(torch::kCPU, false, /*copy=*/true);
        absmax = (k == 0 ? p.exp_avg_absmax : p.exp_avg_sq_absmax)
                     .to(torch::kCPU, false, /*copy=*/true)
                     .contiguous();
      } else if (!sharded()) {
        const HostBuffer& c = k == 0 ? chunk.exp_avg : chunk.exp_avg_sq;
        const HostBuffer& a = k == 0 ? chunk.exp_avg_absmax : chunk.exp_avg_sq_absmax;
        codes = HostView(c.data(), p.offset_elems, p.shape, p.numel, torch::kUInt8).clone();
        absmax = torch::from_blob(static_cast<float*>(a.data()) + p.offset_elems / g, {blocks},
                                  {slots_per_shard_block}, torch::kFloat32)
                     .clone();
      } else {
        // Each block from its owner's slot; a block cut by shard boundaries has one absmax per
        // piece: the largest one becomes the block's, and the other pieces' codes are
        // requantized to it (the only inexact step, on those blocks only).
        const Gathered& all = gathered[p.chunk];
        codes = all.codes[k].narrow(0, p.offset_elems, p.numel).clone();
        absmax = torch::empty({blocks}, torch::kFloat32);
        const float* slots = all.slots[k].data_ptr<float>();
        uint8_t* code = codes.data_ptr<uint8_t>();
        for (int64_t b = 0; b < blocks; ++b) {
          const int64_t begin = p.offset_elems + b * kQuantBlockElems;  // chunk elements
          const int64_t end = std::min(begin + kQuantBlockElems, p.offset_elems + p.numel);
          std::vector<std::pair<int64_t, float>> pieces;  // (start, absmax)
          for (int64_t at = begin; at < end;) {
            const int64_t rank = at / chunk.shard_elems;
            const int64_t local = at - rank * chunk.shard_elems;
            pieces.emplace_back(at, slots[rank * all.slots_per_rank + (local + g - 1) / g]);
            at = (rank + 1) * chunk.shard_elems;
          }
          float block_max = 0;
          for (const auto& [at, a] : pieces) block_max = std::max(block_max, a);
          for (size_t i = 0; i < pieces.size() && pieces.size() > 1; ++i) {
            const auto [at, a] = pieces[i];
            if (a == block_max) continue;
            const int64_t piece_end = i + 1 < pieces.size() ? pieces[i + 1].first : end;
            for (int64_t e = at; e < piece_end; ++e) {
              uint8_t& c = code[e - p.offset_elems];
              const float value = maps[k][c] * a;
              c = NearestCode8bit(maps[k], block_max > 0 ? value / block_max : 0.0f);
            }
          }
          absmax.data_ptr<float>()[b] = block_max;
        }
      }
      out.push_back({p.name + names[k] + ".q8", codes.view(p.shape)});
      out.push_back({p.name + names[k] + ".absmax", absmax});
    }
  }
  if (!out.empty()) out.push_back({"step", torch::tensor(step, torch::kInt64)});
}

absl::Status ChunkManager::Impl::LoadState8bit(const std::map<std::string, torch::Tensor>& by_key,
                                               Param& p, bool fresh) {
  const int64_t g = slot_elems();
  const int64_t blocks = (p.numel + kQuantBlockElems - 1) / kQuantBlockElems;
  const char* names[2] = {".exp_avg", ".exp_avg_sq"};
  Chunk& chunk = chunks_[p.chunk];
  for (int k = 0; k < 2; ++k) {
    torch::Tensor codes = torch::zeros(p.shape, torch::kUInt8);
    torch::Tensor absmax = torch::zeros({blocks}, torch::kFloat32);
    if (!fresh) {
      const std::string q8 = p.name + names[k] + ".q8";
      const std::string am = p.name + names[k] + ".absmax";
      auto c = by_key.find(q8);
      auto a = by_key.find(am);
      if (c == by_key.end() || a == by_key.end()) {
        return absl::InvalidArgumentError(
            absl::StrCat("state: missing ", c == by_key.end() ? q8 : am));
      }
      if (c->second.scalar_type() != torch::kUInt8 || c->second.sizes().vec() != p.shape) {
        return absl::InvalidArgumentError(
            absl::StrCat("state: ", q8, " must be uint8 codes of the parameter's shape"));
      }
      if (a->second.numel() != blocks || !c10::isFloatingType(a->second.scalar_type())) {
        return absl::InvalidArgumentError(absl::StrCat("state: ", am, " must hold ", blocks,
                                                       " fp32 values (one per 256 elements)"));
      }
      codes = c->second.detach().to(torch::kCPU);
      absmax = a->second.detach().to(torch::kCPU, torch::kFloat32).contiguous();
    }
    if (chunk.persistent) {
      (k == 0 ? p.exp_avg : p.exp_avg_sq).copy_(codes);
      (k == 0 ? p.exp_avg_absmax : p.exp_avg_sq_absmax).copy_(absmax);
      continue;
    }
    const OwnedRange r = Owned(p, chunk);
    if (r.len == 0) continue;
    HostFlat((k == 0 ? chunk.exp_avg : chunk.exp_avg_sq).data(), r.at, r.len, torch::kUInt8)
        .copy_(codes.reshape({-1}).narrow(0, r.from, r.len));
    // Every block piece this shard holds takes its block's absmax (a cut block's pieces share
    // it, which reads back the same values).
    float* slots = (k == 0 ? chunk.exp_avg_absmax : chunk.exp_avg_sq_absmax).as<float>();
    const float* values = absmax.data_ptr<float>();
    for (int64_t from = r.from; from < r.from + r.len;) {
      const int64_t b = from / kQuantBlockElems;
      const int64_t local = r.at + (from - r.from);
      slots[(local + g - 1) / g] = values[b];
      from = (b + 1) * kQuantBlockElems;
    }
  }
  return absl::OkStatus();
}

absl::Status ChunkManager::Impl::LoadParamsAndState(const std::vector<NamedParam>& values,
                                                    const std::vector<NamedParam>& state) {
  if (stateless() && !state.empty()) {
    return absl::FailedPreconditionError(
        "state: this chunk manager was created frozen or profile_only (no optimizer state)");
  }
  torch::NoGradGuard no_grad;
  WaitAll();
  std::vector<bool> seen(params_.size(), false);
  try {
    for (const NamedParam& v : values) {
      auto it = by_name_.find(v.name);
      if (it == by_name_.end()) {
        return absl::InvalidArgumentError(absl::StrCat("params: unknown parameter ", v.name));
      }
      Param& p = params_[it->second];
      if (!v.param.defined() || v.param.sizes().vec() != p.shape) {
        return absl::InvalidArgumentError(
            absl::StrCat("params: ", v.name, " has the wrong shape for this model"));
      }
      seen[it->second] = true;
      if (const OwnedRange r = Stored(p); r.len > 0) {
        InstallParam(p, v.param.detach().to(torch::kCPU).reshape({-1}).narrow(0, r.from, r.len));
      }
    }
    for (size_t i = 0; i < params_.size(); ++i) {
      if (!seen[i]) {
        return absl::InvalidArgumentError(
            absl::StrCat("params: missing parameter ", params_[i].name));
      }
    }
    if (!state.empty()) {
      std::map<std::string, torch::Tensor> by_key;
      for (const NamedParam& s : state) by_key[s.name] = s.param;
      auto find = [&](const std::string& key, const Param& p,
                      bool required) -> absl::StatusOr<torch::Tensor> {
        auto it = by_key.find(key);
        if (it == by_key.end()) {
          if (!required) return torch::Tensor();
          return absl::InvalidArgumentError(absl::StrCat("state: missing ", key));
        }
        if (it->second.sizes().vec() != p.shape) {
          return absl::InvalidArgumentError(absl::StrCat("state: ", key, " has the wrong shape"));
        }
        return it->second.detach().to(torch::kCPU, torch::kFloat32);
      };
      auto step_it = by_key.find("step");
      if (step_it == by_key.end() || step_it->second.numel() != 1) {
        return absl::InvalidArgumentError("state: missing scalar \"step\"");
      }
      const int64_t step = step_it->second.item<int64_t>();
      for (Param& p : params_) {
        if (quantized()) {
          const bool fresh = by_key.count(p.name + ".exp_avg.q8") == 0 &&
                             by_key.count(p.name + ".exp_avg_sq.q8") == 0;
          RETURN_IF_ERROR(LoadState8bit(by_key, p, fresh));
          p.step = fresh ? 0 : step;
          continue;
        }
        // A parameter without state has not been updated yet: fresh state, step 0 (sgd keeps a
        // state only as the fp32 master of a bf16 model).
        const bool fresh = has_moments() ? by_key.count(p.name + ".exp_avg") == 0 &&
                                               by_key.count(p.name + ".exp_avg_sq") == 0
                                         : by_key.count(p.name + ".master") == 0;
        ASSIGN_OR_RETURN(torch::Tensor m, find(p.name + ".exp_avg", p, !fresh && has_moments()));
        ASSIGN_OR_RETURN(torch::Tensor v, find(p.name + ".exp_avg_sq", p, !fresh && has_moments()));
        ASSIGN_OR_RETURN(torch::Tensor saved_master, find(p.name + ".master", p, false));
        if (fresh) m = v = torch::Tensor();
        const OwnedRange r = StateStored(p);
        auto stored = [&r](const torch::Tensor& t) {
          return t.defined() ? t.reshape({-1}).narrow(0, r.from, r.len) : t;
        };
        InstallState(p, stored(m), stored(v), stored(saved_master), fresh ? 0 : step);
      }
    }
  } catch (const c10::Error& e) {
    return TorchError(e, "loading parameters");
  }
  InvalidateBuffers();
  return absl::OkStatus();
}

void ChunkManager::Impl::InstallParam(Param& p, const torch::Tensor& flat) {
  Chunk& chunk = chunks_[p.chunk];
  if (chunk.params_sharded) {
    // [Sharded persistent parameters]: `flat` is this rank's part, Owned(); so is the master.
    const OwnedRange r = Owned(p, chunk);
    chunk.param_shard.narrow(0, r.at, r.len).copy_(flat);
    if (master() && p.master.defined()) p.master.copy_(flat);
    return;
  }
  if (chunk.persistent) {
    p.tensor.detach().copy_(flat.view(p.shape));
    if (master() && p.master.defined()) {
      // [Sharded persistent state]: the master holds this rank's part only.
      const OwnedRange r = StateStored(p);
      p.master.copy_(flat.reshape({-1}).narrow(0, r.from, r.len).view_as(p.master));
    }
    return;
  }
  if (p.dtype != dtype_) {  // [Byte chunks]: a frozen manager, one rank, whole parameters
    ParamHostView(chunk.param_host.data(), p).copy_(flat.view(p.shape));
    return;
  }
  const OwnedRange r = Owned(p, chunk);
  HostFlat(chunk.param_host.data(), r.at, r.len, dtype_).copy_(flat);
  if (master() && !stateless())
    HostFlat(chunk.master.data(), r.at, r.len, torch::kFloat32).copy_(flat);
}

void ChunkManager::Impl::InstallState(Param& p, const torch::Tensor& m, const torch::Tensor& v,
                                      const torch::Tensor& saved_master, int64_t step) {
  Chunk& chunk = chunks_[p.chunk];
  const OwnedRange r = StateStored(p);
  auto or_zeros = [&r](const torch::Tensor& t) {
    return t.defined() ? t : torch::zeros({r.len}, torch::kFloat32);
  };
  if (chunk.persistent && r.len > 0) {
    // Replicated: whole parameters; sharded state ([Sharded persistent state]): flat parts.
    if (has_moments()) {
      p.exp_avg.copy_(or_zeros(m).view_as(p.exp_avg));
      p.exp_avg_sq.copy_(or_zeros(v).view_as(p.exp_avg_sq));
    }
    if (saved_master.defined() && master()) p.master.copy_(saved_master.view_as(p.master));
  } else if (!chunk.persistent && r.len > 0) {
    if (has_moments()) {
      HostFlat(chunk.exp_avg.data(), r.at, r.len, moment_dtype()).copy_(or_zeros(m));
      HostFlat(chunk.exp_avg_sq.data(), r.at, r.len, moment_dtype()).copy_(or_zeros(v));
    }
    if (saved_master.defined() && master()) {
      HostFlat(chunk.master.data(), r.at, r.len, torch::kFloat32).copy_(saved_master);
    }
  }
  p.step = step;
  if (p.fused_step.defined()) p.fused_step.fill_(static_cast<double>(p.step));
}

// [Per-rank checkpoint pieces] A persistent parameter is replicated: rank r writes elements
// [n r / W, n (r + 1) / W) of it. An offloaded one: exactly this rank's shard of it. Loading reads
// whatever this rank stores (Stored()) from the pieces of any world size.
absl::StatusOr<std::vector<TensorPiece>> ChunkManager::Impl::LocalPieces() {
  if (quantized() || stateless()) {
    return absl::UnimplementedError(
        "per-rank checkpoint pieces: not for adamw8bit state or a frozen/profile_only manager");
  }
  WaitAll();
  const int rank = comm_ != nullptr ? comm_->rank() : 0;
  std::vector<TensorPiece> out;
  int64_t step = 0;
  try {
    for (Param& p : params_) {
      Chunk& chunk = chunks_[p.chunk];
      OwnedRange r = Owned(p, chunk);
      if (chunk.params_replicated()) {
        r.from = p.numel * rank / world_;
        r.len = p.numel * (rank + 1) / world_ - r.from;
      }
      // A sharded state's part does not follow the parameter's slice.
      if (r.len == 0 && !chunk.state_sharded) continue;
      // Views, not copies: the writer stages one piece at a time to host memory.
      auto add = [&](const std::string& name, const torch::Tensor& device_tensor, void* host,
                     torch::ScalarType host_dtype) {
        if (chunk.state_sharded && name != p.name) {
          // [Sharded persistent state]: the state's part of this rank's shard, a flat view.
          const OwnedRange owned = Owned(p, chunk);
          if (owned.len > 0) out.push_back({name, owned.from, device_tensor.detach()});
          return;
        }
        torch::Tensor flat = chunk.params_sharded ? device_tensor.narrow(0, r.at, r.len)
                             : chunk.persistent
                                 ? device_tensor.detach().reshape({-1}).narrow(0, r.from, r.len)
                                 : HostFlat(host, r.at, r.len, host_dtype);
        out.push_back({name, r.from, flat});
      };
      // [Sharded persistent parameters]: the piece is this rank's part of the shard.
      if (r.len > 0) {
        add(p.name, chunk.params_sharded ? chunk.param_shard : p.tensor, chunk.param_host.data(),
            dtype_);
      }
      if (p.step == 0) continue;  // no state before the first update (like torch's AdamW)
      step = std::max(step, p.step);
      if (has_moments()) {
        add(p.name + ".exp_avg", p.exp_avg, chunk.exp_avg.data(), moment_dtype());
        add(p.name + ".exp_avg_sq", p.exp_avg_sq, chunk.exp_avg_sq.data(), moment_dtype());
      }
      if (master()) add(p.name + ".master", p.master, chunk.master.data(), torch::kFloat32);
    }
  } catch (const c10::Error& e) {
    return TorchError(e, "checkpoint pieces");
  }
  if (step > 0 && rank == 0) out.push_back({"step", 0, torch::tensor({step}, torch::kInt64)});
  return out;
}

absl::Status ChunkManager::Impl::LoadRanges(const ChunkManager::RangeReader& read, bool with_state,
                                            int parallel_reads) {
  if (stateless() && with_state) {
    return absl::FailedPreconditionError(
        "state: this chunk manager was created frozen or profile_only (no optimizer state)");
  }
  if (quantized() && with_state) {
    return absl::UnimplementedError("per-rank checkpoint pieces: not for adamw8bit state");
  }
  torch::NoGradGuard no_grad;
  WaitAll();
  // The tensor's part this rank stores; NOT_FOUND when the tensor is absent (or, `optional`, an
  // undefined tensor); any other failure is returned as is.
  auto part = [&](const std::string& name, const OwnedRange& r,
                  bool optional = false) -> absl::StatusOr<torch::Tensor> {
    absl::StatusOr<torch::Tensor> t = read(name, r.from, r.len);
    if (optional && absl::IsNotFound(t.status())) return torch::Tensor();
    RETURN_IF_ERROR(t.status());
    if (t->numel() != r.len) {
      return absl::DataLossError(absl::StrCat(name, ": read ", t->numel(), " elements of [", r.from,
                                              ", ", r.from + r.len, ")"));
    }
    return t->reshape({-1});
  };
  try {
    int64_t step = 0;
    if (with_state) {
      absl::StatusOr<torch::Tensor> s = read("step", 0, 1);
      if (s.ok()) {
        step = s->item<int64_t>();
      } else if (!absl::IsNotFound(s.status())) {
        return s.status();
      }
    }
    // Parameter values are read up to `parallel_reads` at a time on worker threads (drawing an
    // initial value is serial per parameter) and installed in order on this thread.
    // At most kReadAheadBytes of whole parameters (what drawing an initial value materialises)
    // in flight beyond the first: the planner's host reserve counts on it ([Host reserve]).
    constexpr int64_t kReadAheadBytes = int64_t{1} << 30;
    struct Ahead {
      std::future<absl::StatusOr<torch::Tensor>> values;
      int64_t bytes;
    };
    std::deque<Ahead> ahead;
    absl::Cleanup no_worker_outlives_this_call = [&ahead] {
      for (Ahead& a : ahead) a.values.wait();
    };
    int64_t in_flight = 0;
    size_t next_read = 0;
    auto read_ahead = [&] {
      while (next_read < params_.size() &&
             static_cast<int>(ahead.size()) < std::max(parallel_reads, 1)) {
        const int64_t bytes = params_[next_read].numel * 4;
        if (!ahead.empty() && in_flight + bytes > kReadAheadBytes) break;
        in_flight += bytes;
        const Param& q = params_[next_read++];
        const OwnedRange rq = Stored(q);
        ahead.push_back({std::async(parallel_reads > 1 ? std::launch::async : std::launch::deferred,
                                    [&part, name = q.name, rq]() -> absl::StatusOr<torch::Tensor> {
                                      if (rq.len == 0) return torch::Tensor();
                                      return part(name, rq);
                                    }),
                         bytes});
      }
    };
    for (Param& p : params_) {
      read_ahead();
      absl::StatusOr<torch::Tensor> read_values = ahead.front().values.get();
      in_flight -= ahead.front().bytes;
      ahead.pop_front();
      const OwnedRange r = Stored(p);
      if (r.len == 0) continue;
      RETURN_IF_ERROR(read_values.status());
      InstallParam(p, *read_values);
      if (!with_state) continue;
      // As LoadParamsAndState: a parameter without moments (sgd: without a master) is fresh.
      // [Sharded persistent state]: the state's part may be smaller than the parameter's, even
      // empty; whether the state exists is then asked with one element (every rank must agree on
      // the step count).
      const OwnedRange rs = StateStored(p);
      const OwnedRange ask = rs.len > 0 ? rs : OwnedRange{0, 0, std::min<int64_t>(p.numel, 1)};
      torch::Tensor m, v, saved_master;
      if (has_moments()) {
        ASSIGN_OR_RETURN(m, part(p.name + ".exp_avg", ask, /*optional=*/true));
        if (m.defined()) {
          ASSIGN_OR_RETURN(v, part(p.name + ".exp_avg_sq", ask));
        }
      }
      if (master()) {
        ASSIGN_OR_RETURN(saved_master, part(p.name + ".master", ask, /*optional=*/true));
      }
      const bool fresh = has_moments() ? !m.defined() : !saved_master.defined();
      if (rs.len == 0) m = v = saved_master = torch::Tensor();
      InstallState(p, m, v, saved_master, fresh ? 0 : step);
    }
  } catch (const c10::Error& e) {
    return TorchError(e, "loading checkpoint pieces");
  }
  InvalidateBuffers();
  return absl::OkStatus();
}

// ChunkManager: validation and the thin forwarding layer.

ChunkManager::ChunkManager(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ChunkManager::~ChunkManager() = default;

absl::StatusOr<std::unique_ptr<ChunkManager>> ChunkManager::Create(
    const ParamGroups& groups, const ChunkManagerOptions& options, Communicator* communicator) {
  if (options.chunk_bytes <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk_bytes: must be positive, got ", options.chunk_bytes));
  }
  if (options.n_persist < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("n_persist: must be >= 0, got ", options.n_persist));
  }
  if (options.n_buffer < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("n_buffer: must be >= 1, got ", options.n_buffer));
  }
  if (options.grad_accum < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("grad_accum: must be >= 1, got ", options.grad_accum));
  }
  if (options.max_grad_copy_groups < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "max_grad_copy_groups: must be >= 1, got ", options.max_grad_copy_groups));
  }
  if (options.cpu_threads < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cpu_threads: must be >= 0, got ", options.cpu_threads));
  }
  const AdamWOptions& a = options.adamw;
  if (!(a.lr >= 0) || !(a.beta1 >= 0 && a.beta1 < 1) || !(a.beta2 >= 0 && a.beta2 < 1) ||
      !(a.eps >= 0) || !(a.weight_decay >= 0)) {
    return absl::InvalidArgumentError(
        "adamw: need lr >= 0, 0 <= beta1, beta2 < 1, eps >= 0, weight_decay >= 0");
  }
  if (options.device.is_cuda() && !torch::cuda::is_available()) {
    return absl::FailedPreconditionError("device: CUDA requested but torch sees no CUDA device");
  }
  if (!options.device.is_cuda() && !options.device.is_cpu()) {
    return absl::InvalidArgumentError("device: only cpu and cuda are supported");
  }
  if (communicator != nullptr && communicator->world_size() > 1) {
    if (communicator->device().type() != options.device.type()) {
      return absl::InvalidArgumentError(
          absl::StrCat("communicator: its collectives run on ", communicator->device().str(),
                       " but the chunk manager's device is ", options.device.str()));
    }
    if (options.profile_only) {
      return absl::InvalidArgumentError(
          "profile_only: on-demand profiling runs on one rank (world size 1)");
    }
    if (options.frozen) {
      return absl::InvalidArgumentError(
          "frozen: a frozen base is not sharded yet; it runs on one rank (world size 1)");
    }
    if (options.shard_persistent_params && !options.shard_persistent_state) {
      return absl::InvalidArgumentError(
          "shard_persistent_params: needs shard_persistent_state (the parameters of a persistent "
          "chunk are sharded together with its optimizer state)");
    }
    if (options.shard_persistent_state && options.optimizer == OptimizerKind::kAdamW8bit) {
      return absl::InvalidArgumentError(
          "shard_persistent_state: not with optimizer adamw8bit (its 256-element blocks would "
          "straddle shards); use adamw, adamw_bf16 or sgd, or keep the persistent state "
          "replicated");
    }
  }

  // Unique tensors in order of first use; aliases (a tied LM head) map to the first entry.
  std::vector<Param> params;
  std::vector<std::vector<int>> group_params(groups.size());
  std::unordered_map<const void*, int> index;
  for (size_t g = 0; g < groups.size(); ++g) {
    for (const NamedParam& named : groups[g]) {
      if (!named.param.defined()) {
        return absl::InvalidArgumentError(absl::StrCat("groups: ", named.name, " is undefined"));
      }
      const void* key = named.param.unsafeGetTensorImpl();
      auto [it, inserted] = index.emplace(key, static_cast<int>(params.size()));
      if (inserted) {
        const torch::ScalarType dtype = named.param.scalar_type();
        // [Byte chunks] a frozen manager also holds uint8 parts (NF4 codes) beside other dtypes.
        const bool byte_ok = options.frozen && dtype == torch::kUInt8;
        if (dtype != torch::kFloat32 && dtype != torch::kBFloat16 && !byte_ok) {
          return absl::InvalidArgumentError(absl::StrCat(
              "groups: ", named.name, " is ", std::string(c10::toString(dtype)),
              "; the chunk manager supports float32 and bfloat16 parameters",
              options.frozen ? " (and uint8 in a frozen manager)" : ""));
        }
        if (!options.frozen && !params.empty() && dtype != params[0].tensor.scalar_type()) {
          return absl::InvalidArgumentError(absl::StrCat(
              "groups: ", named.name, " has a different dtype from ", params[0].name,
              " (mixed dtypes need a frozen manager)"));
        }
        Param p;
        p.name = named.name;
        p.tensor = named.param;
        p.shape = named.param.sizes().vec();
        p.numel = named.param.numel();
        p.dtype = dtype;
        p.first_group = static_cast<int>(g);
        params.push_back(std::move(p));
      }
      std::vector<int>& members = group_params[g];
      if (std::find(members.begin(), members.end(), it->second) == members.end()) {
        members.push_back(it->second);
      }
    }
  }
  const int64_t elem_bytes = static_cast<int64_t>(torch::elementSize(StorageDType(params)));
  if (options.frozen) {
    for (const Param& p : params) {
      if (p.tensor.requires_grad()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "frozen: parameter ", p.name, " requires grad; a frozen manager holds no gradients"));
      }
    }
  }
  if (!params.empty() && !options.profile_only && !options.frozen) {
    const DType dtype =
        params[0].tensor.scalar_type() == torch::kBFloat16 ? DType::kBFloat16 : DType::kFloat32;
    if (const std::string problem = OptimizerDTypeProblem(options.optimizer, dtype);
        !problem.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("optimizer: ", problem, "; the parameters are ",
                       std::string(c10::toString(params[0].tensor.scalar_type()))));
    }
  }
  if (options.alignment_bytes <= 0 || options.alignment_bytes % elem_bytes != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("alignment_bytes: must be a positive multiple of the element size (",
                     elem_bytes, "), got ", options.alignment_bytes));
  }
  if (options.optimizer == OptimizerKind::kAdamW8bit &&
      options.alignment_bytes % kQuantSlotBytes != 0) {
    // Block starts must fall on distinct absmax slots ([8-bit optimizer state]).
    return absl::InvalidArgumentError(
        absl::StrCat("alignment_bytes: adamw8bit needs a multiple of ", kQuantSlotBytes, ", got ",
                     options.alignment_bytes));
  }
  ASSIGN_OR_RETURN(ChunkPacking layout, LayoutOf(groups, options));
  if (layout.slots().size() != params.size()) {
    return absl::InternalError(absl::StrCat("chunk layout: LayoutOf lists ", layout.slots().size(),
                                            " parameters, Create ", params.size()));
  }
  for (size_t i = 0; i < params.size(); ++i) {
    params[i].chunk = layout.slots()[i].chunk;
    params[i].offset_elems = layout.slots()[i].offset_bytes / elem_bytes;
  }
  auto impl = std::make_unique<Impl>(options, std::move(layout), communicator);
  RETURN_IF_ERROR(impl->Init(groups, std::move(params), std::move(group_params)));
  return std::unique_ptr<ChunkManager>(new ChunkManager(std::move(impl)));
}

absl::StatusOr<ChunkPacking> ChunkManager::LayoutOf(const ParamGroups& groups,
                                                    const ChunkManagerOptions& options) {
  // Unique tensors in order of first use, the same walk as Create()'s.
  std::vector<LayoutParam> params;
  std::unordered_set<const void*> seen;
  for (size_t g = 0; g < groups.size(); ++g) {
    for (const NamedParam& named : groups[g]) {
      if (!named.param.defined()) {
        return absl::InvalidArgumentError(absl::StrCat("groups: ", named.name, " is undefined"));
      }
      if (!seen.insert(named.param.unsafeGetTensorImpl()).second) continue;
      params.push_back({named.name, named.param.numel(),
                        static_cast<int64_t>(named.param.element_size()), static_cast<int>(g)});
    }
  }
  return ChunkPacking::Build(params, {options.chunk_bytes, options.alignment_bytes});
}

void ChunkManager::PreForward(int group) { impl_->Acquire(group, /*forward=*/true); }
// Nothing is released eagerly: a chunk stays in its buffer until another chunk needs that buffer,
// so the chunks used last in forward are reused by the first groups of backward.
void ChunkManager::PostForward(int group) {}
void ChunkManager::PreBackward(int group) { impl_->Acquire(group, /*forward=*/false); }
void ChunkManager::PostBackward(int group) { impl_->PostBackward(group); }
absl::Status ChunkManager::Step(double max_grad_norm) { return impl_->Step(max_grad_norm); }
void ChunkManager::ZeroGrad() { impl_->ZeroGrad(); }
double ChunkManager::LastGradNorm() const { return impl_->LastGradNorm(); }
int ChunkManager::UpdatesStartedBeforeStep() const { return impl_->UpdatesStartedBeforeStep(); }
absl::StatusOr<std::vector<TensorPiece>> ChunkManager::LocalPieces() {
  return impl_->LocalPieces();
}
absl::Status ChunkManager::LoadRanges(const RangeReader& read, bool with_state,
                                      int parallel_reads) {
  return impl_->LoadRanges(read, with_state, parallel_reads);
}
int ChunkManager::ShardReducesBesideBackward() const { return impl_->ShardReducesBesideBackward(); }
int ChunkManager::PersistentReducesInBackward() const {
  return impl_->PersistentReducesInBackward();
}
std::vector<NamedParam> ChunkManager::ParamOrder() const { return impl_->ParamOrder(); }
std::vector<NamedParam> ChunkManager::Params() { return impl_->Params(); }
std::vector<NamedParam> ChunkManager::Grads() { return impl_->Grads(); }
std::vector<NamedParam> ChunkManager::OptimizerState() { return impl_->OptimizerState(); }
absl::Status ChunkManager::LoadParamsAndState(const std::vector<NamedParam>& params,
                                              const std::vector<NamedParam>& state) {
  return impl_->LoadParamsAndState(params, state);
}
ChunkMemoryStats ChunkManager::MemoryStats() const { return impl_->MemoryStats(); }
ChunkUploadStats ChunkManager::UploadStats() { return impl_->UploadStats(); }
void ChunkManager::ResetUploadStats() { impl_->ResetUploadStats(); }
int ChunkManager::MinBuffers() const { return impl_->MinBuffers(); }

absl::StatusOr<std::optional<GatherBandwidth>> CompareGatherTimes(Communicator& comm,
                                                                  const ChunkUploadStats& u) {
  const int w = comm.world_size();
  const auto n = static_cast<int64_t>(u.gather_seconds_each.size());
  try {
    // Every rank sees the same two sums; the samples line up iff every rank has n of them.
    const double k = static_cast<double>(n);
    torch::Tensor counts = torch::tensor({k, k * k}, torch::kFloat64).to(comm.device());
    RETURN_IF_ERROR(comm.AllReduceSum(counts)->Wait());
    const torch::Tensor c = counts.to(torch::kCPU);
    if (n == 0 || c[0].item<double>() != w * k || c[1].item<double>() != w * k * k) {
      return std::optional<GatherBandwidth>();
    }
    const torch::Tensor mine =
        torch::from_blob(const_cast<float*>(u.gather_seconds_each.data()), {n}, torch::kFloat32)
            .to(comm.device(), /*non_blocking=*/false, /*copy=*/true);
    torch::Tensor all = torch::empty({w * n}, mine.options());
    RETURN_IF_ERROR(comm.AllGather(all, mine)->Wait());
    const torch::Tensor per = all.view({w, n}).to(torch::kCPU).to(torch::kFloat64);
    const double fastest = std::get<0>(per.min(0)).sum().item<double>();
    const double slowest = std::get<0>(per.max(0)).sum().item<double>();
    if (!(fastest > 0) || !(slowest > 0)) return std::optional<GatherBandwidth>();
    const double bytes = static_cast<double>(u.gather_sampled_bytes);
    return std::optional<GatherBandwidth>(
        GatherBandwidth{n, AllGatherBusBytesPerSecond(bytes, fastest, w),
                        AllGatherBusBytesPerSecond(bytes, slowest, w)});
  } catch (const c10::Error& e) {
    return absl::InternalError(
        absl::StrCat("comparing the chunk all-gathers' times: ", e.what_without_backtrace()));
  }
}

}  // namespace memplan
