// Trainer: one optimizer step = grad_accum micro-batches of forward + backward through the model's
// grouped loss, then gradient clipping and the optimizer (adamw, adamw_bf16 or sgd) — either
// managed (ChunkManager: chunked parameter offload, CPU/GPU updates) or unmanaged (plain LibTorch:
// every parameter on the device; torch::optim::AdamW, at::_fused_adamw_ on the bf16 parameters,
// torch::optim::SGD). Both give the same losses and parameters (bit-exact on CPU for adamw and sgd
// in fp32 and for adamw_bf16).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "agent/blocks/activation_offloader.h"
#include "agent/chunks/chunk_manager.h"
#include "agent/core/torch_pch.h"
#include "agent/dist/communicator.h"
#include "agent/io/checkpoint.h"
#include "agent/model/llama_model.h"
#include "agent/train/nf4_shard_reader.h"

namespace memplan {

struct TrainerOptions {
  int grad_accum = 1;
  double max_grad_norm = 0;  // 0: no clipping
  // adamw_bf16 needs a bf16 model. sgd takes lr and weight_decay from `adamw` (no momentum).
  OptimizerKind optimizer = OptimizerKind::kAdamW;
  AdamWOptions adamw;
  BlockModes block_modes;  // one per block; empty: all NONE
  // Managed: parameters live in a ChunkManager built from `chunks` (its device, adamw,
  // grad_accum, optimizer and max_grad_norm are taken from the model and the fields above, so
  // that without clipping offloaded chunks' CPU updates overlap backward).
  bool managed = false;
  ChunkManagerOptions chunks;
  // A LoRA model (LlamaModelOptions::lora), managed: the frozen base lives in a manager built
  // from `chunks` with frozen = true (parameters only), the adapters in a second one with the
  // same chunk size and buffers whose first `adapter_n_persist` chunks stay on the device
  // (-1: all). The optimizer, gradients and clipping cover the adapters only.
  int adapter_n_persist = -1;
  // For SWAP / HS_OFFLOAD blocks (device taken from the model).
  ActivationOffloadOptions offload;
  // Unmanaged, all blocks NONE: use the model's plain-autograd loss instead of the grouped one.
  bool plain_reference = false;
  // Told about every group hook, after the chunk manager (e.g. a MemoryTimeline); not owned,
  // must outlive the trainer. Ignored with plain_reference (which has no group hooks).
  ParamResidency* observer = nullptr;
  // World size > 1 (not owned, must outlive the trainer): data parallel over its ranks with the
  // chunks sharded ZeRO-3 style (managed runs only). Each rank passes its own micro-batches; the
  // step equals one process on the ranks' micro-batches concatenated in rank order ([Data
  // parallel loss] in trainer.cc). Null or world size 1: one process.
  Communicator* communicator = nullptr;
  // [Non-finite steps] in trainer.cc. A step whose loss or gradients are NaN or infinite stops the
  // run (Step() fails, naming the step) before its update; with skip_nonfinite its gradients are
  // dropped instead and the step counts as done without an update (StepStats::skipped), unless
  // more than max_consecutive_nonfinite_skips steps in a row were non-finite.
  bool skip_nonfinite = false;
  int max_consecutive_nonfinite_skips = 8;
  // [OSFT resume without the SVD] (agent/model/osft.h): an OSFT model's factors are shaped, not
  // split (LlamaModel::ShapeOsftFactors), for a RestoreCheckpoint that supplies them; until it
  // has, ForwardBackward and EvalLoss are refused.
  bool osft_factors_from_checkpoint = false;
};

struct MicroBatch {
  torch::Tensor input_ids;  // int64 [batch, seq]
  torch::Tensor labels;     // int64 [batch, seq], -100 = ignored
  VisionInputs images;      // a vision-language model's images of these rows (may be none)
};

struct StepStats {
  int64_t step = 0;      // optimizer steps completed, this one included
  double loss = 0;       // mean over the micro-batches
  double grad_norm = 0;  // global L2 norm before clipping (0 when clipping is off)
  int64_t tokens = 0;    // input tokens of all micro-batches
  double seconds = 0;
  // Host wall time until ForwardBackward returned (GPU work may still be queued) and the rest of
  // the step (OptimizerStep and the final device synchronization): where a slow step spends it.
  double forward_backward_seconds = 0;
  double optimizer_seconds = 0;
  double tokens_per_second = 0;
  int64_t peak_allocated_bytes = 0;  // CUDA caching allocator peaks during the step (0 on CPU)
  int64_t peak_reserved_bytes = 0;
  // Managed runs: offloaded chunks whose CPU update started during backward (overlap), i.e.
  // before OptimizerStep(); 0 with clipping, which needs the global norm first.
  int offloaded_updates_in_backward = 0;
  // Managed runs: the CPU workers' grad accumulation and optimizer update of offloaded chunks
  // that finished in this step's interval, as the wall seconds of the whole pool working in
  // parallel (chunks::CpuPassStats thread-seconds over its threads), and the parameters updated.
  // cpu_updated_params / cpu_update_seconds is the update rate training reaches, beside the one
  // the hardware bench measured (the planner's price).
  double cpu_accumulate_seconds = 0;
  double cpu_update_seconds = 0;
  int64_t cpu_updated_params = 0;
  // [Device updates of offloaded chunks]: offloaded parameters updated on the device instead.
  int64_t device_updated_params = 0;
  // skip_nonfinite: the step's loss or gradients were non-finite (what, in `nonfinite`) and its
  // update was skipped.
  bool skipped = false;
  std::string nonfinite;
};

// Not thread-safe: drive it from one thread. The model must outlive the trainer.
class Trainer {
 public:
  static absl::StatusOr<std::unique_ptr<Trainer>> Create(LlamaModel* model,
                                                         const TrainerOptions& options);
  ~Trainer();

  // ForwardBackward then OptimizerStep; resets the device memory peaks first. ABORTED naming the
  // step and what was non-finite ([Non-finite steps]) unless the options skip it.
  absl::StatusOr<StepStats> Step(const std::vector<MicroBatch>& micro_batches);
  // Accumulates the gradients of `micro_batches` (exactly grad_accum of them); returns the mean
  // loss (over every rank's micro-batches with a communicator). Gradients stay until
  // OptimizerStep.
  absl::StatusOr<double> ForwardBackward(const std::vector<MicroBatch>& micro_batches);
  // Clips, updates every parameter, clears the gradients; returns the pre-clip global norm
  // (0 when clipping is off).
  absl::StatusOr<double> OptimizerStep();

  // The learning rate of the updates from the next step on (a schedule's value; every optimizer
  // kind, managed or not). Call between steps. INVALID_ARGUMENT for a negative or non-finite lr.
  absl::Status SetLearningRate(double lr);
  // The mean loss of one micro-batch under the current parameters: forward only, no gradients,
  // nothing of the step in progress touched (held-out evaluation between steps). The same value
  // the step's forward computes on that batch. One rank's (no collective).
  absl::StatusOr<double> EvalLoss(const MicroBatch& batch);

  // Full values of the trainable parameters (the adapters with LoRA) by name as CPU tensors
  // (model dtype), canonical order. With a
  // communicator these, Grads and OptimizerState are collectives (every rank calls them).
  std::vector<NamedParam> Params();
  // LoRA: the frozen base's values by Hugging Face name as CPU tensors (what a merged export
  // adds the adapters to); empty without LoRA.
  std::vector<NamedParam> BaseParams();
  // Accumulated gradients by name as CPU tensors (before OptimizerStep).
  std::vector<NamedParam> Grads();
  // Optimizer state in the checkpoint naming (agent/io/checkpoint.h).
  absl::StatusOr<std::vector<NamedParam>> OptimizerState();

  // Writes a layout-independent checkpoint; `state` supplies data position, seeds, workload;
  // step, optimizer hyper-parameters, model spec and dtype are filled in here. With a
  // communicator every rank calls it: a managed full fine-tune (adamw, adamw_bf16, sgd) writes a
  // per-rank checkpoint, each rank its own pieces, nothing gathered ([Per-rank checkpoints],
  // agent/io/checkpoint.h); LoRA and adamw8bit runs gather the shards and rank 0 writes. Every
  // rank returns the same verdict.
  absl::Status SaveCheckpoint(const std::string& dir, io::TrainerState state);
  // Restores parameters, optimizer state and the step count from a checkpoint written under any
  // plan (managed or not). The model spec, dtype and optimizer kind must match.
  absl::Status RestoreCheckpoint(const io::Checkpoint& checkpoint);
  // The same from a per-rank checkpoint of any world size, reading only what this rank stores
  // (managed runs; others load the assembled checkpoint with RestoreCheckpoint).
  absl::Status RestoreFromPieces(const io::CheckpointPieces& pieces);
  // [Sharded loading] A managed run of a model created with deferred_values (a full fine-tune, or
  // LoRA's frozen base, whose adapters have values): fills the parameters
  // this rank stores (its shards, the whole persistent chunks) through `read`, by name and element
  // range (e.g. LlamaModel::InitialValues, or ranges of a Hugging Face checkpoint), optimizer
  // state fresh. `read` runs on up to chunks.cpu_threads threads at once (it must be thread-safe).
  // QLoRA: `read` gives the quantized weights by their Hugging Face names, unquantized, and this
  // rank quantizes the bytes it stores ([Sharded NF4 loading], nf4_shard_reader.h); every rank
  // calls it (the offsets are all-gathered).
  absl::Status LoadParamRanges(const ChunkManager::RangeReader& read);
  // What the last LoadParamRanges quantized and read of a QLoRA base (zeros otherwise).
  const Nf4ShardReader::Counts& nf4_load_counts() const { return nf4_load_counts_; }
  // Whether SaveCheckpoint writes a per-rank checkpoint, and RestoreFromPieces can read one.
  bool UsesPerRankCheckpoints() const;

  int64_t step() const { return step_; }
  const TrainerOptions& options() const { return options_; }
  // The manager of the trainable parameters (the adapters with LoRA), and with LoRA the frozen
  // base's manager (null otherwise).
  ChunkManager* chunk_manager() { return chunk_manager_.get(); }
  ChunkManager* base_chunk_manager() { return base_manager_.get(); }
  ActivationOffloader* offloader() { return offloader_.get(); }

 private:
  Trainer(LlamaModel* model, const TrainerOptions& options);
  torch::Tensor MicroBatchLoss(const MicroBatch& batch);
  bool distributed() const {
    return options_.communicator != nullptr && options_.communicator->world_size() > 1;
  }
  // [Data parallel loss]: per micro-batch, this rank's share of the targets the ranks score.
  absl::StatusOr<std::vector<double>> LossWeights(const std::vector<MicroBatch>& micro_batches);
  // [OSFT across ranks] in trainer.cc: the low factors' gradients averaged in one all-reduce.
  absl::Status AllReduceOsftGrads();
  void FusedBf16AdamWStep();  // unmanaged adamw_bf16
  // [Non-finite steps] The update of a step whose mean loss is `loss`, unless something is
  // non-finite: `nonfinite` says what ("" when all is finite), `applied` whether the parameters
  // were updated all the same (a managed run learns its norm inside the chunk manager's step).
  struct CheckedUpdate {
    double grad_norm = 0;
    std::string nonfinite;
    bool applied = false;
  };
  absl::StatusOr<CheckedUpdate> UpdateIfFinite(double loss);
  // Unmanaged: whether any accumulated gradient holds a NaN or an infinity (one fused pass).
  bool UnmanagedGradsNonFinite();
  // Unmanaged: the defined grads grouped by device and dtype (in a fixed order), the lists one
  // foreach kernel takes each (GroupByDeviceAndDtype, agent/core/foreach_groups.h).
  std::vector<std::vector<torch::Tensor>> GradsByDeviceAndDtype() const;
  // Unmanaged, max_grad_norm > 0: clips the grads by their global norm and returns it; a LibTorch
  // error becomes a Status prefixed with `failure`.
  absl::StatusOr<double> ClipUnmanagedGrads(absl::string_view failure);
  // Unmanaged: the optimizer's update, then the gradients cleared.
  absl::Status UnmanagedUpdate();
  absl::Status ImportOptimizerState(const std::vector<NamedParam>& state);  // unmanaged
  // The checkpoint's dtype and optimizer are this run's (FAILED_PRECONDITION naming both).
  absl::Status CheckResumable(const io::TrainerState& saved) const;
  // [OSFT checkpoints] The checkpoint's split is this run's: the same rank ratio and targets, or
  // neither run OSFT (FAILED_PRECONDITION naming the flag).
  absl::Status CheckOsftResumable(const io::OsftSettings& saved) const;
  absl::Status RestoreOsftParams(const io::Checkpoint& checkpoint);  // unmanaged OSFT
  // FAILED_PRECONDITION while shaped OSFT factors wait for RestoreCheckpoint.
  absl::Status CheckOsftFactorsRestored() const;
  // [Data parallel checkpoints] Every rank's `mine`, agreed: an error if any rank failed.
  absl::Status AgreeAcrossRanks(const absl::Status& mine, absl::string_view what);

  LlamaModel* model_;
  TrainerOptions options_;
  std::vector<NamedParam> params_;  // trainable, canonical order, unique
  std::unique_ptr<ChunkManager> chunk_manager_;
  std::unique_ptr<ChunkManager> base_manager_;      // LoRA, managed: the frozen base
  Nf4ShardReader::Counts nf4_load_counts_;
  std::unique_ptr<ParamResidency> lora_residency_;  // LoRA, managed: base then adapters
  // Unmanaged only: torch::optim::AdamW (adamw) or SGD (sgd); for adamw_bf16 the state below,
  // updated by at::_fused_adamw_ (the kernel of torch.optim.AdamW(fused=True)), per params_ entry.
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  std::vector<torch::Tensor> exp_avg_, exp_avg_sq_;
  std::vector<int64_t> param_steps_;
  std::unique_ptr<ActivationOffloader> offloader_;
  std::unique_ptr<ParamResidency> observed_;  // chunk manager + options_.observer
  int64_t step_ = 0;
  bool osft_factors_pending_ = false;  // shaped, not yet restored
  int consecutive_nonfinite_ = 0;
};

}  // namespace memplan
