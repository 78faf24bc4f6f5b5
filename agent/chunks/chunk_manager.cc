// ChunkManager: the facade over the layers (README.md, "Layers"): it validates the options,
// builds the layers bottom-up and forwards each call to the layer that owns it.
#include "agent/chunks/chunk_manager.h"

#include <algorithm>
#include <chrono>
#include <memory>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "agent/chunks/chunk_collectives.h"
#include "agent/chunks/chunk_optimizer.h"
#include "agent/chunks/chunk_pager.h"
#include "agent/chunks/chunk_set.h"
#include "agent/chunks/chunk_state_io.h"
#include "agent/chunks/chunk_streams.h"
#include "agent/core/seconds_since.h"
#include "common/chunk_packing.h"
#include "common/log.h"
#include "common/optimizer_bytes.h"
#include "common/status.h"

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

// [Byte chunks]
// A frozen manager may hold parameters of several dtypes (QLoRA's base: NF4 codes in uint8,
// their fp32 scales, norms in bf16). Its chunk arrays are then bytes: offsets and spans count
// bytes (the layout's own units), and each parameter is a view of its slot reinterpreted as its
// dtype (ChunkSet::ParamView). Every slot starts at a multiple of alignment_bytes, so the
// reinterpretation is always aligned. With one dtype the arrays have that dtype.

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
// [Sharded frozen base]
// A frozen manager (a LoRA run's base) with W > 1 shards as above: an offloaded chunk's host copy
// is this rank's P / W elements, all-gathered into its home buffer where it would be uploaded;
// with shard_persistent_params a persistent chunk's parameters are sharded and gathered on use
// as in [Sharded persistent parameters] (there is no state, so shard_persistent_state is not
// needed). Nothing else: no gradients, no reduce-scatter, Step() does nothing. In [Byte chunks]
// (QLoRA: NF4 codes, scales and norms in one chunk) shards count bytes, so a boundary may cut a
// parameter anywhere, even inside an NF4 block or an fp32 scale: the gathered chunk is the
// concatenation of the shards, byte for byte the unsharded chunk.
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

// The layers, bottom-up; each holds references to the ones below it, and the only calls upward
// are the callbacks wired here.
class ChunkManager::Impl {
 public:
  Impl(const ChunkManagerOptions& options, ChunkPacking layout, Communicator* communicator)
      : options_(options),
        comm_(communicator != nullptr && communicator->world_size() > 1 ? communicator : nullptr),
        streams_(options_.device),
        set_(options_, std::move(layout), comm_ != nullptr ? comm_->world_size() : 1,
             comm_ != nullptr ? comm_->rank() : 0),
        collectives_(set_, streams_, comm_),
        pager_(set_, streams_, collectives_, [this](int c) { optimizer_.WaitTasks(c); }),
        optimizer_(set_, streams_, collectives_, pager_),
        io_(set_, collectives_, pager_, optimizer_) {
    collectives_.SetCallbacks(
        [this](const chunks::ChunkCollectives::ShardStaged& staged) {
          optimizer_.OnShardStaged(staged);
        },
        [this](int c, const torch::Tensor& shard) { optimizer_.OnStateShardReduced(c, shard); });
  }

  ~Impl() {
    collectives_.DropOpenBatch();
    pager_.WaitStartedGathers();
    optimizer_.WaitAllTasks();
  }

  absl::Status Init(const ParamGroups& groups, std::vector<chunks::Param> params,
                    std::vector<std::vector<int>> group_params) {
    streams_.Init();
    const auto init_start = std::chrono::steady_clock::now();
    try {
      optimizer_.PrepareInit();
    } catch (const c10::Error& e) {
      return chunks::TorchError(e, "copying parameters into chunks");
    }
    RETURN_IF_ERROR(set_.Init(groups, std::move(params), std::move(group_params),
                              [this](int c) { return optimizer_.InitChunk(c); }));
    RETURN_IF_ERROR(pager_.AssignHomes());
    RETURN_IF_ERROR(optimizer_.InitGradSlots());
    RETURN_IF_ERROR(pager_.AllocateBuffers());
    const ChunkMemoryStats stats = MemoryStats();
    MEMPLAN_LOG(kInfo, "chunk manager ready")
        .Field("chunks", stats.n_chunks)
        .Field("n_persist", stats.n_persist)
        .Field("n_buffer", stats.n_buffer)
        .Field("layout_bytes", stats.layout_bytes)
        .Field("host_pinned_bytes", stats.host_pinned_bytes)
        .Field("host_pageable_bytes", stats.host_pageable_bytes)
        .Field("seconds", SecondsSince(init_start));
    return absl::OkStatus();
  }

  // Pre{Forward,Backward}: the group's chunks, then (backward) its grad slots, then the next
  // group's prefetch, in the order the compute and upload streams see them.
  void Acquire(int group, bool forward) {
    torch::NoGradGuard no_grad;
    if (!pager_.Acquire(group, forward)) return;
    if (!forward) optimizer_.AssignGradSlots(group);
    pager_.Prefetch(group, forward);
  }

  ChunkMemoryStats MemoryStats() const {
    ChunkMemoryStats stats = set_.stats();
    pager_.AddStats(stats);
    optimizer_.AddStats(stats);
    return stats;
  }

  // Not const: SetLearningRate() changes adamw.lr between steps (the layers below hold a
  // reference to it and read it when they update).
  ChunkManagerOptions options_;
  Communicator* const comm_;  // set only when the world size is > 1
  chunks::ChunkStreams streams_;
  chunks::ChunkSet set_;
  chunks::ChunkCollectives collectives_;
  chunks::ChunkPager pager_;
  chunks::ChunkOptimizer optimizer_;
  chunks::ChunkStateIO io_;
};

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
    if (options.shard_persistent_params && !options.shard_persistent_state && !options.frozen) {
      return absl::InvalidArgumentError(
          "shard_persistent_params: needs shard_persistent_state (the parameters of a persistent "
          "chunk are sharded together with its optimizer state)");
    }
    if (options.shard_persistent_state && options.optimizer == OptimizerKind::kAdamW8bit &&
        !options.frozen) {
      return absl::InvalidArgumentError(
          "shard_persistent_state: not with optimizer adamw8bit (its 256-element blocks would "
          "straddle shards); use adamw, adamw_bf16 or sgd, or keep the persistent state "
          "replicated");
    }
  }

  // Unique tensors in order of first use; aliases (a tied LM head) map to the first entry.
  std::vector<chunks::Param> params;
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
        chunks::Param p;
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
  const int64_t elem_bytes = static_cast<int64_t>(torch::elementSize(chunks::StorageDType(params)));
  if (options.frozen) {
    for (const chunks::Param& p : params) {
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
void ChunkManager::PostBackward(int group) { impl_->optimizer_.PostBackward(group); }
absl::Status ChunkManager::Step(double max_grad_norm) {
  return impl_->optimizer_.Step(max_grad_norm);
}
void ChunkManager::ZeroGrad() { impl_->optimizer_.ZeroGrad(); }
void ChunkManager::SetLearningRate(double lr) { impl_->options_.adamw.lr = lr; }
double ChunkManager::LastGradNorm() const { return impl_->optimizer_.LastGradNorm(); }
bool ChunkManager::LastStepSkipped() const { return impl_->optimizer_.LastStepSkipped(); }
CpuPassStats ChunkManager::TakeCpuPassStats() { return impl_->optimizer_.TakeCpuPassStats(); }
ChunkManager::SpeculationCounts ChunkManager::Speculation() const {
  return impl_->optimizer_.Speculation();
}

int ChunkManager::UpdatesStartedBeforeStep() const {
  return impl_->optimizer_.UpdatesStartedBeforeStep();
}
absl::StatusOr<std::vector<TensorPiece>> ChunkManager::LocalPieces() {
  return impl_->io_.LocalPieces();
}
absl::Status ChunkManager::LoadRanges(const RangeReader& read, bool with_state,
                                      int parallel_reads) {
  return impl_->io_.LoadRanges(read, with_state, parallel_reads);
}
int ChunkManager::ShardReducesBesideBackward() const {
  return impl_->optimizer_.ShardReducesBesideBackward();
}
int ChunkManager::PersistentReducesInBackward() const {
  return impl_->optimizer_.PersistentReducesInBackward();
}
std::vector<NamedParam> ChunkManager::ParamOrder() const { return impl_->io_.ParamOrder(); }
std::vector<NamedParam> ChunkManager::Params() { return impl_->io_.Params(); }
std::vector<NamedParam> ChunkManager::Grads() { return impl_->io_.Grads(); }
std::vector<NamedParam> ChunkManager::OptimizerState() { return impl_->io_.OptimizerState(); }
absl::Status ChunkManager::LoadParamsAndState(const std::vector<NamedParam>& params,
                                              const std::vector<NamedParam>& state) {
  return impl_->io_.LoadParamsAndState(params, state);
}
ChunkMemoryStats ChunkManager::MemoryStats() const { return impl_->MemoryStats(); }
ChunkUploadStats ChunkManager::UploadStats() { return impl_->pager_.UploadStats(); }
void ChunkManager::ResetUploadStats() { impl_->pager_.ResetUploadStats(); }
int ChunkManager::MinBuffers() const { return impl_->pager_.min_buffers(); }

}  // namespace memplan
