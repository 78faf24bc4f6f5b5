#include "agent/train/trainer.h"

#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAStream.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "agent/core/foreach_groups.h"
#include "agent/io/osft_checkpoint.h"
#include "agent/io/peft_adapter.h"
#include "agent/model/layers.h"
#include "common/optimizer_bytes.h"
#include "common/osft_cost.h"
#include "common/param_shapes.h"
#include "common/status.h"

namespace memplan {
namespace {

// [Data parallel loss]
// One process on the concatenated batch takes the mean over all N scored targets (labels not
// -100) of every rank's micro-batch. Rank r computes the mean over its own n_r, so it scales its
// loss by w_r = n_r * W / N before backward; the chunk manager divides the summed grads by W,
// which leaves sum_r n_r * mean_r / N = the global mean's grads. The ranks learn N from one
// all-reduce of their counts per step. The loss reported is sum_r w_r * loss_r / W, all-reduced.
// A rank with no scored target (n_r = 0) takes part with weight 0 and a finite stand-in loss.

absl::Status FromTorch(const c10::Error& e, absl::string_view what) {
  return absl::InternalError(absl::StrCat(what, ": ", e.what_without_backtrace()));
}

bool NeedsOffloader(const BlockModes& modes) {
  for (BlockMode m : modes) {
    if (m == BlockMode::kSwap || m == BlockMode::kHsOffload) return true;
  }
  return false;
}

bool AllNone(const BlockModes& modes) {
  for (BlockMode m : modes) {
    if (m != BlockMode::kNone) return false;
  }
  return true;
}

// The chunk manager (if any) first, then the observer, at every hook.
class ObservedResidency final : public ParamResidency {
 public:
  ObservedResidency(ParamResidency* inner, ParamResidency* observer)
      : inner_(inner), observer_(observer) {}
  void PreForward(int group) override {
    if (inner_ != nullptr) inner_->PreForward(group);
    observer_->PreForward(group);
  }
  void PostForward(int group) override {
    if (inner_ != nullptr) inner_->PostForward(group);
    observer_->PostForward(group);
  }
  void PreBackward(int group) override {
    if (inner_ != nullptr) inner_->PreBackward(group);
    observer_->PreBackward(group);
  }
  void PostBackward(int group) override {
    if (inner_ != nullptr) inner_->PostBackward(group);
    observer_->PostBackward(group);
  }

 private:
  ParamResidency* inner_;
  ParamResidency* observer_;
};

// [LoRA managers] The frozen base's manager first, then the adapters' one, at every hook: a
// block's body reads both, and both are resident when the hook returns.
class PairResidency final : public ParamResidency {
 public:
  PairResidency(ParamResidency* base, ParamResidency* adapters)
      : base_(base), adapters_(adapters) {}
  void PreForward(int group) override {
    base_->PreForward(group);
    adapters_->PreForward(group);
  }
  void PostForward(int group) override {
    base_->PostForward(group);
    adapters_->PostForward(group);
  }
  void PreBackward(int group) override {
    base_->PreBackward(group);
    adapters_->PreBackward(group);
  }
  void PostBackward(int group) override {
    base_->PostBackward(group);
    adapters_->PostBackward(group);
  }

 private:
  ParamResidency* base_;
  ParamResidency* adapters_;
};

torch::Tensor CpuCopy(const torch::Tensor& t) {
  if (!t.defined()) return t;
  return t.detach().to(torch::kCPU, /*non_blocking=*/false, /*copy=*/true);
}

}  // namespace

Trainer::Trainer(LlamaModel* model, const TrainerOptions& options)
    : model_(model), options_(options) {}
Trainer::~Trainer() = default;

absl::StatusOr<std::unique_ptr<Trainer>> Trainer::Create(LlamaModel* model,
                                                         const TrainerOptions& options) {
  if (model == nullptr) return absl::InvalidArgumentError("trainer: model is null");
  if (options.grad_accum < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("trainer: grad_accum = ", options.grad_accum, " must be >= 1"));
  }
  if (options.max_grad_norm < 0) {
    return absl::InvalidArgumentError("trainer: max_grad_norm must be >= 0 (0 = off)");
  }
  if (options.max_consecutive_nonfinite_skips < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("trainer: max_consecutive_nonfinite_skips = ",
                     options.max_consecutive_nonfinite_skips, " is outside [0, 2^31)"));
  }
  // [OSFT across ranks] replicates the whole model instead of sharding it.
  if (options.communicator != nullptr && options.communicator->world_size() > 1 &&
      !options.managed && !model->has_osft()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "trainer: world size ", options.communicator->world_size(),
        " needs a managed run (the chunk manager shards the parameters); unmanaged runs are one "
        "process"));
  }
  std::unique_ptr<Trainer> trainer(new Trainer(model, options));
  TrainerOptions& o = trainer->options_;
  if (o.block_modes.empty()) o.block_modes.assign(model->num_blocks(), BlockMode::kNone);
  if (static_cast<int>(o.block_modes.size()) != model->num_blocks()) {
    return absl::InvalidArgumentError(absl::StrCat("trainer: ", o.block_modes.size(),
                                                   " block modes for a model of ",
                                                   model->num_blocks(), " blocks"));
  }
  if (const std::string problem = OptimizerDTypeProblem(o.optimizer, model->options().dtype);
      !problem.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("trainer: ", problem, "; the model is ",
                                                   std::string(DTypeName(model->options().dtype))));
  }
  if (o.optimizer == OptimizerKind::kAdamW8bit && !o.managed) {
    return absl::InvalidArgumentError(
        "trainer: optimizer adamw8bit runs in the chunk manager (a managed run: a plan, "
        "--chunk-mib or --n-persist); the unmanaged path has no 8-bit state");
  }
  if (model->has_osft()) {
    // [OSFT] (agent/model/osft.h) The split reads the loaded weights; the low factors'
    // gradients are projected at the end of every ForwardBackward.
    if (o.managed) {
      return absl::InvalidArgumentError(
          "trainer: OSFT runs unmanaged for now (every parameter on the device, the model "
          "replicated over ranks): no plan, --chunk-mib or --n-persist");
    }
    // [OSFT resume without the SVD] (agent/model/osft.h): shaped factors, and no step until the
    // checkpoint has filled them.
    if (o.osft_factors_from_checkpoint) {
      RETURN_IF_ERROR(model->ShapeOsftFactors());
      trainer->osft_factors_pending_ = true;
    } else {
      RETURN_IF_ERROR(model->SplitOsft());
    }
    if (const torch::Device device = model->options().device; device.is_cuda()) {
      // The split replaced every dense target weight by factors of other sizes and freed its
      // float32 copies and SVD workspaces; training starts from a cache holding only what is
      // allocated (the load-time peak keeps the split's high-water mark). On llama-3.1-8b at
      // ratio 0.5 this alone did not move the steady reserved peak: the 8.8 GiB above allocated
      // came from the update's flat gradient copy ([OSFT all-reduce buckets]), not the split.
      torch::cuda::synchronize(device.has_index() ? device.index() : 0);
      c10::cuda::CUDACachingAllocator::emptyCache();
    }
  }
  trainer->params_ = model->TrainableParams();
  try {
    if (NeedsOffloader(o.block_modes)) {
      o.offload.device = model->options().device;
      ASSIGN_OR_RETURN(trainer->offloader_, ActivationOffloader::Create(o.offload));
    }
    if (o.managed) {
      o.chunks.device = model->options().device;
      o.chunks.adamw = o.adamw;
      o.chunks.grad_accum = o.grad_accum;
      o.chunks.optimizer = o.optimizer;
      // The manager starts an offloaded chunk's CPU update during backward only when it knows
      // nothing will be clipped; the trainer's clipping setting is that knowledge.
      o.chunks.max_grad_norm = o.max_grad_norm;
      // [Non-finite steps] A skipped step must not have updated anything: the manager then holds
      // every update until the step and checks the norm before it updates.
      o.chunks.skip_nonfinite = o.skip_nonfinite;
      o.chunks.deferred_values = model->options().deferred_values;
      if (model->has_lora()) {
        // [LoRA managers]
        ChunkManagerOptions base = o.chunks;
        base.frozen = true;
        ASSIGN_OR_RETURN(trainer->base_manager_,
                         ChunkManager::Create(model->ParamGroups(), base, o.communicator));
        // The plan's persistent-chunk sharding describes the base; the adapters are small, so
        // their persistent chunks stay replicated with all-reduced grads (offloaded adapter chunks
        // are sharded like a full fine-tune's).
        ChunkManagerOptions adapters = o.chunks;
        adapters.n_persist = o.adapter_n_persist < 0 ? std::numeric_limits<int>::max()
                                                     : o.adapter_n_persist;
        adapters.shard_persistent_state = false;
        adapters.shard_persistent_params = false;
        adapters.deferred_values = false;  // the model draws (or loads) adapters whole
        ASSIGN_OR_RETURN(trainer->chunk_manager_,
                         ChunkManager::Create(model->AdapterGroups(), adapters, o.communicator));
        trainer->lora_residency_ = std::make_unique<PairResidency>(
            trainer->base_manager_.get(), trainer->chunk_manager_.get());
      } else {
        ASSIGN_OR_RETURN(trainer->chunk_manager_,
                         ChunkManager::Create(model->ParamGroups(), o.chunks, o.communicator));
      }
    } else {
      // Unmanaged: every parameter (and adapter) lives on the compute device.
      torch::NoGradGuard no_grad;
      std::vector<torch::Tensor> tensors;
      if (model->has_lora() || model->has_osft()) {
        for (const auto& p : model->Params()) {
          if (p.param.device() != model->options().device) {
            p.param.set_data(p.param.to(model->options().device));
          }
        }
      }
      for (const auto& p : trainer->params_) {
        if (p.param.device() != model->options().device) {
          p.param.set_data(p.param.to(model->options().device));
        }
        tensors.push_back(p.param);
      }
      switch (o.optimizer) {
        case OptimizerKind::kAdamW:
          trainer->optimizer_ = std::make_unique<torch::optim::AdamW>(
              tensors, torch::optim::AdamWOptions(o.adamw.lr)
                           .betas({o.adamw.beta1, o.adamw.beta2})
                           .eps(o.adamw.eps)
                           .weight_decay(o.adamw.weight_decay));
          break;
        case OptimizerKind::kSgd:
          trainer->optimizer_ = std::make_unique<torch::optim::SGD>(
              tensors, torch::optim::SGDOptions(o.adamw.lr).weight_decay(o.adamw.weight_decay));
          break;
        case OptimizerKind::kAdamWBf16States:
          // torch::optim::AdamW (C++) has no fused mode; at::_fused_adamw_ is the kernel of
          // torch.optim.AdamW(fused=True) and the managed path's, so both give the same bits.
          for (const torch::Tensor& t : tensors) {
            trainer->exp_avg_.push_back(torch::zeros_like(t));
            trainer->exp_avg_sq_.push_back(torch::zeros_like(t));
            trainer->param_steps_.push_back(0);
          }
          break;
        case OptimizerKind::kAdamW8bit:
          break;  // refused above
      }
    }
  } catch (const c10::Error& e) {
    return FromTorch(e, "trainer: setup failed");
  }
  return trainer;
}

torch::Tensor Trainer::MicroBatchLoss(const MicroBatch& batch) {
  const torch::Device device = model_->options().device;
  const torch::Tensor ids = batch.input_ids.to(device);
  const torch::Tensor labels = batch.labels.to(device);
  VisionInputs images = batch.images;
  if (images.pixel_values.defined()) images.pixel_values = images.pixel_values.to(device);
  if (!options_.managed && options_.plain_reference && AllNone(options_.block_modes)) {
    return model_->Loss(ids, labels, images);
  }
  ParamResidency* residency = lora_residency_ ? lora_residency_.get()
                                              : static_cast<ParamResidency*>(chunk_manager_.get());
  if (options_.observer != nullptr) {
    // Autograd calls the hooks during backward(), after this returns: the wrapper must live on.
    if (!observed_) {
      observed_ = std::make_unique<ObservedResidency>(residency, options_.observer);
    }
    return model_->Loss(ids, labels, options_.block_modes, observed_.get(), offloader_.get(),
                        images);
  }
  return model_->Loss(ids, labels, options_.block_modes, residency, offloader_.get(), images);
}

absl::Status Trainer::SetLearningRate(double lr) {
  if (!(lr >= 0) || !std::isfinite(lr)) {
    return absl::InvalidArgumentError(absl::StrCat("trainer: learning rate ", lr,
                                                   " is not a finite number >= 0"));
  }
  options_.adamw.lr = lr;  // what the fused bf16 update and the checkpoint read
  if (chunk_manager_) chunk_manager_->SetLearningRate(lr);
  if (optimizer_) {
    for (torch::optim::OptimizerParamGroup& group : optimizer_->param_groups()) {
      group.options().set_lr(lr);
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<double> Trainer::EvalLoss(const MicroBatch& batch) {
  RETURN_IF_ERROR(CheckOsftFactorsRestored());
  try {
    torch::NoGradGuard no_grad;
    const torch::Device device = model_->options().device;
    const torch::Tensor ids = batch.input_ids.to(device);
    const torch::Tensor labels = batch.labels.to(device);
    if (!options_.managed && options_.plain_reference && AllNone(options_.block_modes)) {
      return model_->Loss(ids, labels).item<double>();
    }
    // Every block without a mode: no activation is kept or offloaded for a backward that never
    // comes; the chunks are fetched through the same residency hooks as in training (the
    // timeline observer is left out: this is no step).
    ParamResidency* residency = lora_residency_
                                    ? lora_residency_.get()
                                    : static_cast<ParamResidency*>(chunk_manager_.get());
    const BlockModes none(options_.block_modes.empty()
                              ? static_cast<size_t>(model_->options().spec.num_layers)
                              : options_.block_modes.size(),
                          BlockMode::kNone);
    return model_->Loss(ids, labels, none, residency, nullptr).item<double>();
  } catch (const c10::Error& e) {
    return FromTorch(e, "trainer: evaluation forward failed");
  }
}

absl::Status Trainer::CheckOsftFactorsRestored() const {
  if (!osft_factors_pending_) return absl::OkStatus();
  return absl::FailedPreconditionError(
      "trainer: the OSFT factors were shaped for a checkpoint (osft_factors_from_checkpoint) and "
      "none has been restored: RestoreCheckpoint first");
}

absl::StatusOr<double> Trainer::ForwardBackward(const std::vector<MicroBatch>& micro_batches) {
  RETURN_IF_ERROR(CheckOsftFactorsRestored());
  if (static_cast<int>(micro_batches.size()) != options_.grad_accum) {
    return absl::InvalidArgumentError(absl::StrCat("trainer: got ", micro_batches.size(),
                                                   " micro-batches, grad_accum is ",
                                                   options_.grad_accum));
  }
  std::vector<double> weights;
  if (distributed()) {
    ASSIGN_OR_RETURN(weights, LossWeights(micro_batches));
  }
  try {
    torch::Tensor loss_sum;
    for (size_t i = 0; i < micro_batches.size(); ++i) {
      torch::Tensor loss;
      if (distributed() && weights[i] == 0) {
        // [Data parallel loss] No scored target on this rank: its mean is 0/0. It still runs
        // forward and backward (its all-gathers and reduce-scatters pair with the other ranks'),
        // on a copy with one target scored, so loss and gradients stay finite; the weight 0 makes
        // them contribute nothing.
        MicroBatch scored = micro_batches[i];
        scored.labels = scored.labels.clone(at::MemoryFormat::Contiguous);
        scored.labels.view({-1}).narrow(0, 0, 1).fill_(0);
        loss = MicroBatchLoss(scored);
      } else {
        loss = MicroBatchLoss(micro_batches[i]);
      }
      if (distributed()) {
        // [Data parallel loss]
        loss = loss * weights[i];
      }
      // Scaling the loss (not the gradients) keeps the reference and managed paths identical:
      // every group's backward sees the same upstream gradient.
      (loss / options_.grad_accum).backward();
      loss = loss.detach();
      loss_sum = loss_sum.defined() ? loss_sum + loss : loss;
    }
    // [OSFT] Linear in the gradients: once on the accumulated sum, before clipping and the update.
    if (model_->has_osft()) {
      if (distributed()) RETURN_IF_ERROR(AllReduceOsftGrads());
      model_->ProjectOsftGrads();
    }
    if (distributed()) {
      torch::Tensor total =
          loss_sum.to(torch::kFloat64).reshape({1}).to(options_.communicator->device());
      RETURN_IF_ERROR(options_.communicator->AllReduceSum(total)->Wait());
      return total.cpu().item<double>() / options_.communicator->world_size() / options_.grad_accum;
    }
    return loss_sum.item<double>() / options_.grad_accum;
  } catch (const c10::Error& e) {
    if (offloader_) offloader_->ClearAll();
    return FromTorch(e, "trainer: forward/backward failed");
  }
}

// [OSFT across ranks] Every rank holds the whole model (the frozen factors and the low ones) and
// takes the same update: the low factors' gradients are summed by all-reduces of buckets of them,
// each flattened into one buffer ([OSFT all-reduce buckets], common/osft_cost.h), and divided by
// the world size, the mean the chunk managers' reductions take ([Data parallel loss] weights each
// rank's loss for it). The projection that follows is local: U_high and V_high are the same on
// every rank.
absl::Status Trainer::AllReduceOsftGrads() {
  Communicator& comm = *options_.communicator;
  std::vector<torch::Tensor> grads;
  std::vector<int64_t> bytes;
  for (const NamedParam& p : params_) {
    if (!p.param.grad().defined()) p.param.mutable_grad() = torch::zeros_like(p.param);
    grads.push_back(p.param.grad());
    bytes.push_back(p.param.grad().numel() * p.param.grad().element_size());
  }
  for (const auto& [begin, end] : OsftAllReduceBuckets(bytes, kOsftAllReduceBucketBytes)) {
    std::vector<torch::Tensor> flat;
    for (size_t i = begin; i < end; ++i) flat.push_back(grads[i].reshape({-1}));
    torch::Tensor bucket = torch::cat(flat).to(comm.device());
    RETURN_IF_ERROR(comm.AllReduceSum(bucket)->Wait());
    bucket.div_(comm.world_size());
    int64_t offset = 0;
    for (size_t i = begin; i < end; ++i) {
      grads[i].copy_(bucket.narrow(0, offset, grads[i].numel()).view_as(grads[i]));
      offset += grads[i].numel();
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<double>> Trainer::LossWeights(
    const std::vector<MicroBatch>& micro_batches) {
  std::vector<double> local;
  for (const MicroBatch& b : micro_batches) {
    local.push_back(b.labels.ne(-100).sum().item<double>());
  }
  Communicator& comm = *options_.communicator;
  torch::Tensor counts = torch::tensor(local, torch::kFloat64).to(comm.device());
  RETURN_IF_ERROR(comm.AllReduceSum(counts)->Wait());
  counts = counts.cpu();
  std::vector<double> weights;
  for (size_t i = 0; i < local.size(); ++i) {
    const double global = counts[static_cast<int64_t>(i)].item<double>();
    weights.push_back(global > 0 ? local[i] * comm.world_size() / global : 0.0);
  }
  return weights;
}

absl::StatusOr<double> Trainer::OptimizerStep() {
  double norm = 0;
  if (chunk_manager_) {
    RETURN_IF_ERROR(chunk_manager_->Step(options_.max_grad_norm));
    if (options_.max_grad_norm > 0) norm = chunk_manager_->LastGradNorm();
  } else {
    if (options_.max_grad_norm > 0) {
      ASSIGN_OR_RETURN(norm, ClipUnmanagedGrads("trainer: optimizer step failed"));
    }
    RETURN_IF_ERROR(UnmanagedUpdate());
  }
  ++step_;
  return norm;
}

absl::StatusOr<double> Trainer::ClipUnmanagedGrads(absl::string_view failure) {
  try {
    // torch.nn.utils.clip_grad_norm_ as Python runs it on a GPU (foreach=True): one norm kernel
    // and one scaling kernel per device and dtype, not two per parameter (LibTorch's C++ version;
    // 3.5 % of llama-3.2-1b's --plain step on an H200). Norms in the grads' dtype, their 2-norm,
    // coefficient max_norm / (norm + 1e-6) clamped at 1, every grad scaled by it.
    torch::NoGradGuard no_grad;
    const std::vector<std::vector<torch::Tensor>> groups = GradsByDeviceAndDtype();
    if (groups.empty()) return 0.0;
    std::vector<torch::Tensor> norms;
    const torch::Device first = groups.front().front().device();
    for (const std::vector<torch::Tensor>& grads : groups) {
      for (const torch::Tensor& n : at::_foreach_norm(grads, 2.0)) norms.push_back(n.to(first));
    }
    const torch::Tensor total = at::linalg_vector_norm(torch::stack(norms), 2.0);
    const torch::Tensor coef =
        torch::clamp(options_.max_grad_norm / (total + 1e-6), c10::nullopt, 1.0);
    for (const std::vector<torch::Tensor>& grads : groups) {
      at::_foreach_mul_(grads, coef.to(grads.front().device()));
    }
    return total.item<double>();
  } catch (const c10::Error& e) {
    return FromTorch(e, failure);
  }
}

absl::Status Trainer::UnmanagedUpdate() {
  try {
    if (optimizer_) {
      optimizer_->step();
      optimizer_->zero_grad(/*set_to_none=*/true);
    } else {
      FusedBf16AdamWStep();
    }
  } catch (const c10::Error& e) {
    return FromTorch(e, "trainer: optimizer step failed");
  }
  return absl::OkStatus();
}

// [Non-finite steps]
// A NaN or infinite loss or gradient would poison the parameters and the optimizer state and,
// saved, every run resumed from them. The loss is read every step anyway (it is logged), so it is
// checked first, before any update; the gradients are checked through the global norm where one
// is computed (clipping, or a managed run with grad_accum 1), else, unmanaged, by one pass over
// the grads' largest magnitudes (UnmanagedGradsNonFinite). A managed run learns its norm inside
// the chunk manager's step: without the skip option after the update (that step cannot be
// skipped, only stopped before anything is saved); with it the manager holds every update until
// the step (none starts during backward), computes the norm first and drops a non-finite step
// without updating (ChunkManagerOptions::skip_nonfinite). Skipping drops the step's gradients.
// With several ranks the loss and the norm are global, so every rank takes the same decision.
absl::StatusOr<Trainer::CheckedUpdate> Trainer::UpdateIfFinite(double loss) {
  CheckedUpdate out;
  if (!std::isfinite(loss)) {
    out.nonfinite = absl::StrCat("the loss is ", loss);
    return out;
  }
  if (chunk_manager_) {
    RETURN_IF_ERROR(chunk_manager_->Step(options_.max_grad_norm));
    if (chunk_manager_->LastStepSkipped()) {
      out.nonfinite = absl::StrCat("the global gradient norm is ", chunk_manager_->LastGradNorm());
      return out;
    }
    out.applied = true;
    ++step_;
    const double norm = chunk_manager_->LastGradNorm();
    if (options_.max_grad_norm > 0) out.grad_norm = norm;
    // LastGradNorm() is NaN by design when it was not computed (no clipping, grad_accum > 1).
    const bool computed = options_.max_grad_norm > 0 || options_.grad_accum == 1;
    if (computed && !std::isfinite(norm)) {
      out.nonfinite = absl::StrCat("the global gradient norm is ", norm);
    }
    return out;
  }
  if (options_.max_grad_norm > 0) {
    ASSIGN_OR_RETURN(out.grad_norm, ClipUnmanagedGrads("trainer: checking the gradients failed"));
    if (!std::isfinite(out.grad_norm)) {
      out.nonfinite = absl::StrCat("the global gradient norm is ", out.grad_norm);
      return out;
    }
  }
  try {
    if (options_.max_grad_norm <= 0 && UnmanagedGradsNonFinite()) {
      // The rare path: one more pass names the first parameter.
      std::string name;
      for (const auto& p : params_) {
        const torch::Tensor& g = p.param.grad();
        if (g.defined() && !torch::isfinite(g).all().item<bool>()) {
          name = p.name;
          break;
        }
      }
      out.nonfinite = absl::StrCat("the gradient of ", name, " holds NaN or infinite values");
      return out;
    }
  } catch (const c10::Error& e) {
    return FromTorch(e, "trainer: checking the gradients failed");
  }
  RETURN_IF_ERROR(UnmanagedUpdate());
  out.applied = true;
  ++step_;
  return out;
}

bool Trainer::UnmanagedGradsNonFinite() {
  torch::NoGradGuard no_grad;
  // The largest magnitude of every grad (_foreach_norm with ord inf: one kernel per device and
  // dtype): NaN propagates through it and, unlike the 2-norm, finite values cannot overflow it.
  // AMP's non-finite check would be one call too, but CUDA has no bf16 version of it.
  for (const std::vector<torch::Tensor>& grads : GradsByDeviceAndDtype()) {
    const std::vector<torch::Tensor> maxima =
        at::_foreach_norm(grads, std::numeric_limits<double>::infinity());
    if (!torch::stack(maxima).isfinite().all().item<bool>()) return true;
  }
  return false;
}

std::vector<std::vector<torch::Tensor>> Trainer::GradsByDeviceAndDtype() const {
  std::vector<torch::Tensor> grads;
  for (const auto& p : params_) {
    if (p.param.grad().defined()) grads.push_back(p.param.grad());
  }
  return GroupByDeviceAndDtype(grads);
}

void Trainer::FusedBf16AdamWStep() {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> params, grads, exp_avgs, exp_avg_sqs, steps;
  FusedStepTensors step_tensors;  // [Shared step tensors]
  for (size_t i = 0; i < params_.size(); ++i) {
    const torch::Tensor& p = params_[i].param;
    if (!p.grad().defined()) continue;  // like torch: no state, no step without a grad
    params.push_back(p.detach());
    grads.push_back(p.grad());
    exp_avgs.push_back(exp_avg_[i]);
    exp_avg_sqs.push_back(exp_avg_sq_[i]);
    steps.push_back(step_tensors.For(++param_steps_[i], p));  // torch bumps, then calls
  }
  if (!params.empty()) {
    const AdamWOptions& o = options_.adamw;
    at::_fused_adamw_(params, grads, exp_avgs, exp_avg_sqs, /*max_exp_avg_sqs=*/{}, steps, o.lr,
                      o.beta1, o.beta2, o.weight_decay, o.eps, /*amsgrad=*/false,
                      /*maximize=*/false);
  }
  for (const auto& p : params_) {
    if (p.param.grad().defined()) p.param.mutable_grad().reset();
  }
}

absl::StatusOr<StepStats> Trainer::Step(const std::vector<MicroBatch>& micro_batches) {
  const torch::Device device = model_->options().device;
  const bool cuda = device.is_cuda();
  const c10::DeviceIndex index = cuda ? (device.has_index() ? device.index() : 0) : 0;
  // A step is timed to the end of its work on the compute stream. What the chunk manager leaves
  // running on its side streams past Step() ([Device updates of offloaded chunks]) runs beside
  // the next forward, which waits for each chunk before uploading it, as it waits for the
  // deferred CPU updates: a device-wide synchronisation here would serialise it again.
  auto sync_compute = [index] { c10::cuda::getCurrentCUDAStream(index).synchronize(); };
  if (cuda) {
    sync_compute();
    c10::cuda::CUDACachingAllocator::resetPeakStats(index);
  }
  const auto start = std::chrono::steady_clock::now();
  StepStats stats;
  ASSIGN_OR_RETURN(stats.loss, ForwardBackward(micro_batches));
  const auto backward_done = std::chrono::steady_clock::now();
  if (chunk_manager_) {
    stats.offloaded_updates_in_backward = chunk_manager_->UpdatesStartedBeforeStep();
  }
  // [Non-finite steps]
  const int64_t this_step = step_ + 1;
  ASSIGN_OR_RETURN(const CheckedUpdate update, UpdateIfFinite(stats.loss));
  stats.grad_norm = update.grad_norm;
  if (update.nonfinite.empty()) {
    consecutive_nonfinite_ = 0;
  } else {
    ++consecutive_nonfinite_;
    if (!options_.skip_nonfinite || update.applied) {
      return absl::AbortedError(absl::StrCat(
          "step ", this_step, ": ", update.nonfinite, "; training stopped",
          update.applied ? " (the chunk manager had already applied this step's update, which "
                           "cannot be skipped)"
                         : " before the step's update",
          ", nothing of this step saved",
          options_.skip_nonfinite ? "" : " (skipping such steps is an option: --skip-nonfinite)"));
    }
    if (consecutive_nonfinite_ > options_.max_consecutive_nonfinite_skips) {
      return absl::AbortedError(absl::StrCat(
          "step ", this_step, ": ", update.nonfinite, "; ", consecutive_nonfinite_,
          " non-finite steps in a row, more than the ", options_.max_consecutive_nonfinite_skips,
          " skipped at most: the parameters or the data are broken; training stopped"));
    }
    try {
      if (chunk_manager_) {
        chunk_manager_->ZeroGrad();
      } else {
        for (const auto& p : params_) {
          if (p.param.grad().defined()) p.param.mutable_grad().reset();
        }
      }
    } catch (const c10::Error& e) {
      return FromTorch(e, "trainer: dropping a non-finite step's gradients failed");
    }
    ++step_;
    stats.skipped = true;
    stats.nonfinite = update.nonfinite;
  }
  if (cuda) sync_compute();
  const auto end = std::chrono::steady_clock::now();
  stats.seconds = std::chrono::duration<double>(end - start).count();
  stats.forward_backward_seconds = std::chrono::duration<double>(backward_done - start).count();
  stats.optimizer_seconds = std::chrono::duration<double>(end - backward_done).count();
  stats.step = step_;
  for (const MicroBatch& b : micro_batches) stats.tokens += b.input_ids.numel();
  stats.tokens_per_second = stats.seconds > 0 ? stats.tokens / stats.seconds : 0;
  if (chunk_manager_) {
    const CpuPassStats passes = chunk_manager_->TakeCpuPassStats();
    const double threads = std::max(1, passes.threads);
    stats.cpu_accumulate_seconds = passes.accumulate_thread_seconds / threads;
    stats.cpu_update_seconds = passes.update_thread_seconds / threads;
    stats.cpu_updated_params = passes.updated_elems;
    stats.device_updated_params = passes.device_updated_elems;
  }
  if (cuda) {
    const auto mem = c10::cuda::CUDACachingAllocator::getDeviceStats(index);
    const auto aggregate = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
    stats.peak_allocated_bytes = mem.allocated_bytes[aggregate].peak;
    stats.peak_reserved_bytes = mem.reserved_bytes[aggregate].peak;
  }
  return stats;
}

std::vector<NamedParam> Trainer::Params() {
  if (chunk_manager_) return chunk_manager_->Params();
  std::vector<NamedParam> out;
  for (const auto& p : params_) out.push_back({p.name, CpuCopy(p.param)});
  return out;
}

std::vector<NamedParam> Trainer::BaseParams() {
  if (!model_->has_lora()) return {};
  if (base_manager_) return base_manager_->Params();
  std::vector<NamedParam> out;
  for (const auto& p : model_->Params()) out.push_back({p.name, CpuCopy(p.param)});
  return out;
}

std::vector<NamedParam> Trainer::Grads() {
  if (chunk_manager_) return chunk_manager_->Grads();
  std::vector<NamedParam> out;
  for (const auto& p : params_) out.push_back({p.name, CpuCopy(p.param.grad())});
  return out;
}

absl::StatusOr<std::vector<NamedParam>> Trainer::OptimizerState() {
  if (chunk_manager_) return chunk_manager_->OptimizerState();
  try {
    switch (options_.optimizer) {
      case OptimizerKind::kAdamW:
        return io::ExportAdamWState(static_cast<torch::optim::AdamW&>(*optimizer_), params_);
      case OptimizerKind::kSgd:
      case OptimizerKind::kAdamW8bit:  // managed only
        return std::vector<NamedParam>();  // no momentum: no state
      case OptimizerKind::kAdamWBf16States: {
        std::vector<NamedParam> out;
        int64_t step = 0;
        for (size_t i = 0; i < params_.size(); ++i) {
          if (param_steps_[i] == 0) continue;
          step = std::max(step, param_steps_[i]);
          out.push_back({params_[i].name + ".exp_avg", CpuCopy(exp_avg_[i])});
          out.push_back({params_[i].name + ".exp_avg_sq", CpuCopy(exp_avg_sq_[i])});
        }
        if (!out.empty()) out.push_back({"step", torch::tensor(step, torch::kInt64)});
        return out;
      }
    }
    return std::vector<NamedParam>();
  } catch (const c10::Error& e) {
    return FromTorch(e, "trainer: exporting optimizer state failed");
  }
}

absl::Status Trainer::SaveCheckpoint(const std::string& dir, io::TrainerState state) {
  state.step = step_;
  state.max_grad_norm = options_.max_grad_norm;
  state.optimizer.kind = std::string(OptimizerName(options_.optimizer));
  state.optimizer.lr = options_.adamw.lr;
  state.optimizer.beta1 = options_.adamw.beta1;
  state.optimizer.beta2 = options_.adamw.beta2;
  state.optimizer.eps = options_.adamw.eps;
  state.optimizer.weight_decay = options_.adamw.weight_decay;
  state.model = model_->spec();
  state.param_dtype = model_->options().dtype;
  if (UsesPerRankCheckpoints()) {
    // [Per-rank checkpoints] Rank 0 prepares the staging directory, every rank writes its own
    // pieces, rank 0 checks the tiling and publishes; every phase is agreed across the ranks.
    Communicator& comm = *options_.communicator;
    const int rank = comm.rank(), world = comm.world_size();
    const std::string staged = io::ShardedCheckpointStaging(dir, state.step, world);
    RETURN_IF_ERROR(AgreeAcrossRanks(
        rank == 0 ? io::BeginShardedCheckpoint(dir, staged) : absl::OkStatus(),
        "preparing the checkpoint directory"));
    absl::StatusOr<std::vector<TensorPiece>> pieces = chunk_manager_->LocalPieces();
    const absl::Status written =
        pieces.ok() ? io::WriteCheckpointShard(staged, rank, world, *pieces) : pieces.status();
    RETURN_IF_ERROR(AgreeAcrossRanks(written, "writing its checkpoint file"));
    return AgreeAcrossRanks(
        rank == 0 ? io::FinishShardedCheckpoint(staged, dir, state, world) : absl::OkStatus(),
        "publishing the checkpoint");
  }
  // [Data parallel checkpoints] Otherwise, with a communicator the state and the parameters are
  // gathered from every rank's shards (collectives) and rank 0 writes the one layout-independent
  // checkpoint; every rank then learns whether the write succeeded. Any world size resumes it.
  absl::Status written;
  try {
    ASSIGN_OR_RETURN(std::vector<NamedParam> optimizer_state, OptimizerState());
    std::vector<NamedParam> params = Params();
    if (!distributed() || options_.communicator->rank() == 0) {
      if (model_->has_lora()) {
        // [LoRA checkpoints] (agent/io/peft_adapter.h): adapters and their state only.
        written = io::SaveLoraCheckpoint(dir, state, model_->options().lora, model_->spec().name,
                                         params, optimizer_state);
      } else if (model_->has_osft()) {
        // [OSFT checkpoints] (agent/io/osft_checkpoint.h): the merged weights under Hugging Face
        // names, the split and its factors beside them. Every rank holds the same model.
        std::vector<NamedParam> named = model_->Params();
        named.insert(named.end(), params.begin(), params.end());
        absl::StatusOr<io::OsftCheckpointParts> parts =
            io::SplitOsftCheckpointParts(named, ToScalarType(model_->options().dtype));
        if (parts.ok()) {
          io::OsftCheckpoint osft;
          osft.settings.rank_ratio = model_->options().osft.rank_ratio;
          osft.settings.targets = model_->options().osft.targets;
          osft.factors = std::move(parts->factors);
          written = io::SaveCheckpoint(dir, state, parts->params, optimizer_state, osft);
        } else {
          written = parts.status();
        }
      } else {
        written = io::SaveCheckpoint(dir, state, params, optimizer_state);
      }
    }
  } catch (const c10::Error& e) {
    return FromTorch(e, "trainer: saving checkpoint failed");
  }
  if (!distributed()) return written;
  return AgreeAcrossRanks(written, "writing the checkpoint");
}

absl::Status Trainer::AgreeAcrossRanks(const absl::Status& mine, absl::string_view what) {
  Communicator& comm = *options_.communicator;
  torch::Tensor failed =
      torch::full({1}, mine.ok() ? 0.0 : 1.0,
                  torch::TensorOptions().dtype(torch::kFloat64).device(comm.device()));
  RETURN_IF_ERROR(comm.AllReduceSum(failed)->Wait());
  if (!mine.ok()) return mine;
  if (failed.cpu().item<double>() > 0) {
    return absl::InternalError(absl::StrCat("trainer: another rank failed ", what,
                                            " (see its log); the checkpoint was not replaced"));
  }
  return absl::OkStatus();
}

bool Trainer::UsesPerRankCheckpoints() const {
  return distributed() && chunk_manager_ != nullptr && !model_->has_lora() &&
         options_.optimizer != OptimizerKind::kAdamW8bit;
}

absl::Status Trainer::CheckResumable(const io::TrainerState& saved) const {
  if (saved.param_dtype != model_->options().dtype) {
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoint dtype ", std::string(DTypeName(saved.param_dtype)),
        " differs from the model dtype ", std::string(DTypeName(model_->options().dtype))));
  }
  if (saved.optimizer.kind != OptimizerName(options_.optimizer)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoint optimizer ", saved.optimizer.kind, " differs from --optimizer ",
        std::string(OptimizerName(options_.optimizer)),
        ": its state cannot be converted; resume with --optimizer ", saved.optimizer.kind));
  }
  return absl::OkStatus();
}

// [OSFT checkpoints] The split is part of the state: a resume runs the checkpoint's rank ratio
// and targets (the factors' shapes and the trained subspace depend on both).
absl::Status Trainer::CheckOsftResumable(const io::OsftSettings& saved) const {
  const OsftOptions& mine = model_->options().osft;
  return io::CheckOsftResume(saved, mine.enabled() ? mine.rank_ratio : 0, mine.targets);
}

// [OSFT checkpoints] The frozen parameters (the untargeted weights, norms, embedding from
// model.safetensors; the high factors) and the low factors, by name; a split projection's merged
// weight is not read back (it would not split into the trained factors again).
absl::Status Trainer::RestoreOsftParams(const io::Checkpoint& checkpoint) {
  std::vector<NamedParam> targets = model_->Params();
  std::set<std::string> names;
  for (const NamedParam& p : targets) names.insert(p.name);
  targets.insert(targets.end(), params_.begin(), params_.end());
  std::vector<NamedParam> source;
  for (const NamedParam& p : checkpoint.params) {
    if (names.count(p.name) != 0) source.push_back(p);
  }
  source.insert(source.end(), checkpoint.osft.factors.begin(), checkpoint.osft.factors.end());
  return io::CopyParamsByName(source, targets);
}

absl::Status Trainer::RestoreFromPieces(const io::CheckpointPieces& pieces) {
  RETURN_IF_ERROR(CheckResumable(pieces.trainer()));
  if (chunk_manager_ == nullptr || model_->has_lora()) {
    return absl::FailedPreconditionError(
        "per-rank checkpoint pieces are read by a managed full fine-tune; load the assembled "
        "checkpoint (RestoreCheckpoint) otherwise");
  }
  // Every parameter (and any state saved for it) has this model's element count.
  for (const ParamShape& shape : HfParamShapes(model_->spec())) {
    for (const char* suffix : {"", ".exp_avg", ".exp_avg_sq", ".master"}) {
      const std::string name = shape.name + suffix;
      const int64_t n = pieces.Numel(name);
      if ((n < 0 && *suffix == '\0') || (n >= 0 && n != shape.numel())) {
        return absl::InvalidArgumentError(absl::StrCat(
            "checkpoint: ", name, n < 0 ? " is missing" : absl::StrCat(" has ", n, " elements"),
            "; this model's ", shape.name, " has ", shape.numel()));
      }
    }
  }
  RETURN_IF_ERROR(chunk_manager_->LoadRanges(
      [&pieces](const std::string& name, int64_t begin, int64_t len) {
        return pieces.Read(name, begin, len);
      },
      /*with_state=*/true));
  step_ = pieces.trainer().step;
  return absl::OkStatus();
}

absl::Status Trainer::LoadParamRanges(const ChunkManager::RangeReader& read) {
  // A managed LoRA run stores parts of its frozen base ([Sharded frozen base]); its adapters
  // have their values already.
  ChunkManager* target = model_->has_lora() ? base_manager_.get() : chunk_manager_.get();
  if (target == nullptr) {
    return absl::FailedPreconditionError(
        "loading parameter ranges: only a managed run stores parts of the model");
  }
  const int threads = std::max(options_.chunks.cpu_threads, 1);
  if (!model_->has_nf4_base()) return target->LoadRanges(read, /*with_state=*/false, threads);
  // [Sharded NF4 loading] (nf4_shard_reader.h): this rank quantizes the NF4 bytes it stores.
  Nf4ShardReader nf4(*model_, read);
  RETURN_IF_ERROR(target->LoadRanges(
      [&nf4](const std::string& name, int64_t begin, int64_t len) {
        return nf4.Read(name, begin, len);
      },
      /*with_state=*/false, threads));
  RETURN_IF_ERROR(nf4.SetOffsets(*model_, options_.communicator));
  nf4_load_counts_ = nf4.counts();
  return absl::OkStatus();
}

absl::Status Trainer::ImportOptimizerState(const std::vector<NamedParam>& state) {
  switch (options_.optimizer) {
    case OptimizerKind::kAdamW:
      return io::ImportAdamWState(state, params_, static_cast<torch::optim::AdamW&>(*optimizer_));
    case OptimizerKind::kSgd:
    case OptimizerKind::kAdamW8bit:  // managed only
      return absl::OkStatus();  // no state (a managed bf16 run's fp32 masters are not used here)
    case OptimizerKind::kAdamWBf16States:
      break;
  }
  std::map<std::string, torch::Tensor> by_name;
  for (const NamedParam& s : state) by_name[s.name] = s.param;
  const int64_t step = by_name.count("step") != 0 ? by_name["step"].item<int64_t>() : 0;
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < params_.size(); ++i) {
    auto m = by_name.find(params_[i].name + ".exp_avg");
    auto v = by_name.find(params_[i].name + ".exp_avg_sq");
    if (m == by_name.end() || v == by_name.end()) {  // never updated: fresh state
      exp_avg_[i].zero_();
      exp_avg_sq_[i].zero_();
      param_steps_[i] = 0;
      continue;
    }
    exp_avg_[i].copy_(m->second);
    exp_avg_sq_[i].copy_(v->second);
    param_steps_[i] = step;
  }
  return absl::OkStatus();
}

absl::Status Trainer::RestoreCheckpoint(const io::Checkpoint& checkpoint) {
  RETURN_IF_ERROR(CheckResumable(checkpoint.trainer));
  RETURN_IF_ERROR(CheckOsftResumable(checkpoint.osft.settings));
  try {
    if (chunk_manager_) {
      RETURN_IF_ERROR(
          chunk_manager_->LoadParamsAndState(checkpoint.params, checkpoint.optimizer_state));
    } else {
      RETURN_IF_ERROR(io::ValidateOptimizerState(params_, checkpoint.optimizer_state));
      RETURN_IF_ERROR(model_->has_osft() ? RestoreOsftParams(checkpoint)
                                         : io::CopyParamsByName(checkpoint.params, params_));
      RETURN_IF_ERROR(ImportOptimizerState(checkpoint.optimizer_state));
      osft_factors_pending_ = false;  // every factor was copied (CopyParamsByName checks)
    }
  } catch (const c10::Error& e) {
    return FromTorch(e, "trainer: restoring checkpoint failed");
  }
  step_ = checkpoint.trainer.step;
  return absl::OkStatus();
}

}  // namespace memplan
