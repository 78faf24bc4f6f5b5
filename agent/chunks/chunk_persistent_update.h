// ChunkOptimizer::PersistentUpdate ([Persistent update]): the device update of resident
// optimizer state, shared by chunk_optimizer_step.cc (persistent chunks) and
// chunk_device_update.cc ([Device updates of offloaded chunks]). Private to agent/chunks.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "agent/chunks/chunk_optimizer.h"
#include "agent/chunks/cpu_adamw.h"
#include "agent/chunks/torch_sqrt.h"
#include "agent/core/foreach_groups.h"

namespace memplan::chunks {

// [Persistent update] One chunk's update on the device-resident state, shared by the replicated
// persistent chunks (whole parameters) and the sharded ones (this rank's ranges): AdamW fused on
// the device (the exact CPU kernel on a CPU device), adamw_bf16 fused, SGD with torch's ops; the
// clip coefficient applied where each optimizer applies it. ClipGrads() the grads of all the
// ranges first (one foreach kernel per device and dtype where the clip scales the model-dtype grad
// in place), then Add() every (parameter, range), then Flush() (also when the batch passes
// slice_elems elements: the fp32 grad copies of a mixed-precision model then stay one regular
// chunk's, [Sliced grad copy]); nothing is flushed on destruction.
class ChunkOptimizer::PersistentUpdate {
 public:
  PersistentUpdate(ChunkOptimizer& m, const torch::Tensor& clip_coef, float grad_scale,
                   int64_t slice_elems)
      : m_(m), clip_coef_(clip_coef), grad_scale_(grad_scale), slice_elems_(slice_elems) {}

  // `grads`: every grad that Add() will be given. Where Add() would clip the model-dtype grad in
  // place (grad.mul_(coef)), clips them all now with one _foreach_mul_ per device and dtype
  // (clip_grad_norm_'s foreach path; each product is that mul_'s, bit for bit: the coefficient
  // keeps its dtype) and Add() leaves them as they are; elsewhere the clip stays in Add() (SGD
  // with a master scales the fp32 copy, the CPU kernel scales inside its update).
  void ClipGrads(const std::vector<torch::Tensor>& grads) {
    if (!clip_coef_.defined() || m_.quantized()) return;  // adamw8bit: not through Add()
    const bool in_place =
        m_.optimizer() == OptimizerKind::kSgd ? !m_.master() : m_.set_.cuda() || m_.pure();
    if (!in_place) return;
    ForeachMulInPlace(grads, clip_coef_);
    grads_clipped_ = true;
  }

  // `grad`: the range's grad in the model dtype, clipped here (in place where the optimizer
  // clips the model-dtype grad); `target`: the fp32 master's range with a master, else the
  // parameter's; `exp_avg` / `exp_avg_sq`: the moments of the same range. s.step is already the
  // step being taken.
  void Add(ParamState& s, const torch::Tensor& target, torch::Tensor grad,
           const torch::Tensor& exp_avg, const torch::Tensor& exp_avg_sq) {
    const AdamWOptions& o = m_.set_.options().adamw;
    if (m_.optimizer() == OptimizerKind::kSgd) {
      // torch::optim::SGD's ops (in place on the grad, dropped after the step). With a master the
      // clip scales the fp32 copy, like the offloaded chunks' kernel, and that copy is made at most
      // slice_elems_ elements at a time ([Sliced grad copy]: the transient the planner prices;
      // the whole fp32 grad of a vocabulary embedding took 2 GiB at the step).
      auto sgd = [&](const torch::Tensor& t, const torch::Tensor& g) {
        torch::Tensor d = m_.master() ? g.to(torch::kFloat32) : g;
        if (clip_coef_.defined() && !grads_clipped_) d.mul_(clip_coef_);
        if (o.weight_decay != 0) d.add_(t, o.weight_decay);
        t.add_(d, -1 * o.lr);
      };
      const int64_t n = grad.numel();
      if (!m_.master() || n <= slice_elems_ || !grad.is_contiguous() || !target.is_contiguous()) {
        sgd(target, grad);
        return;
      }
      const torch::Tensor g = grad.view(-1), t = target.view(-1);
      for (int64_t off = 0; off < n; off += slice_elems_) {
        const int64_t len = std::min(n - off, slice_elems_);
        sgd(t.narrow(0, off, len), g.narrow(0, off, len));
      }
      return;
    }
    if (m_.set_.cuda() || m_.pure()) {
      // torch.optim.AdamW(fused=True) after clip_grad_norm_ (adamw_bf16 on any device).
      if (clip_coef_.defined() && !grads_clipped_) grad.mul_(clip_coef_);
      const torch::Tensor step = step_tensors_.For(s.step, target);
      const bool sliceable = grad.is_contiguous() && target.is_contiguous() &&
                             exp_avg.is_contiguous() && exp_avg_sq.is_contiguous();
      if (!m_.master() || !sliceable) {
        Batch(target, m_.master() ? grad.to(torch::kFloat32) : grad, exp_avg, exp_avg_sq, step);
        return;
      }
      const torch::Tensor g = grad.view(-1), t = target.view(-1);
      const torch::Tensor mv = exp_avg.view(-1), vv = exp_avg_sq.view(-1);
      const int64_t n = g.numel();
      for (int64_t off = 0; off < n;) {
        if (batch_elems_ >= slice_elems_) Flush();
        const int64_t len = std::min(n - off, slice_elems_ - batch_elems_);
        Batch(t.narrow(0, off, len), g.narrow(0, off, len), mv.narrow(0, off, len),
              vv.narrow(0, off, len), step, /*widen=*/g.scalar_type() != torch::kFloat32);
        off += len;
      }
      return;
    }
    // The CPU kernel multiplies by the clip coefficient itself (same fp32 product as
    // grad.mul_(coef)) and reproduces torch's AdamW rounding exactly.
    const torch::Tensor g = grad.to(torch::kFloat32).contiguous();
    AdamWUpdate(MakeAdamWStepScalars(o, s.step), grad_scale_, g.numel(), target.data_ptr<float>(),
                g.data_ptr<float>(), exp_avg.data_ptr<float>(), exp_avg_sq.data_ptr<float>(),
                &TorchSqrt);
  }

  void Flush() {
    batch_elems_ = 0;
    if (targets_.empty()) return;
    WidenGrads();
    const AdamWOptions& o = m_.set_.options().adamw;
    at::_fused_adamw_(targets_, grads_, exp_avgs_, exp_avg_sqs_, /*max_exp_avg_sqs=*/{}, steps_,
                      o.lr, o.beta1, o.beta2, o.weight_decay, o.eps, /*amsgrad=*/false,
                      /*maximize=*/false);
    targets_.clear();
    grads_.clear();
    exp_avgs_.clear();
    exp_avg_sqs_.clear();
    steps_.clear();
    widen_.clear();
  }

 private:
  // `widen`: `grad` is a contiguous 1-D slice in the model dtype that the fp32 master's update
  // reads widened (WidenGrads() at Flush()).
  void Batch(const torch::Tensor& target, const torch::Tensor& grad, const torch::Tensor& exp_avg,
             const torch::Tensor& exp_avg_sq, const torch::Tensor& step, bool widen = false) {
    targets_.push_back(target);
    grads_.push_back(grad);
    exp_avgs_.push_back(exp_avg);
    exp_avg_sqs_.push_back(exp_avg_sq);
    steps_.push_back(step);
    widen_.push_back(widen);
    batch_elems_ += target.numel();
  }

  // [Batched widening] The fp32 copies of the batch's model-dtype grad slices: one fp32 flat of
  // their elements (at most slice_elems_, the transient StepGradCopyElems() prices) and one
  // _foreach_copy_, which converts in its multi-tensor kernel, in place of a .to(kFloat32) launch
  // per parameter. Each value is that conversion's, exactly.
  void WidenGrads() {
    // Each copy starts on a 256-byte boundary, as a block of its own did (the fused kernel's
    // vectorised loads need 16-byte alignment).
    constexpr int64_t kAlignElems = 64;
    auto padded = [](int64_t n) { return (n + kAlignElems - 1) / kAlignElems * kAlignElems; };
    std::vector<torch::Tensor> src, dst;
    int64_t total = 0;
    for (size_t k = 0; k < grads_.size(); ++k) {
      if (widen_[k]) total += padded(grads_[k].numel());
    }
    if (total == 0) return;
    const torch::Tensor flat =
        torch::empty({total}, grads_.front().options().dtype(torch::kFloat32));
    int64_t at = 0;
    for (size_t k = 0; k < grads_.size(); ++k) {
      if (!widen_[k]) continue;
      src.push_back(grads_[k]);
      dst.push_back(flat.narrow(0, at, grads_[k].numel()));
      grads_[k] = dst.back();
      at += padded(src.back().numel());
    }
    ForeachCopy(dst, src);
  }

  ChunkOptimizer& m_;
  const torch::Tensor clip_coef_;
  const float grad_scale_;
  const int64_t slice_elems_;
  bool grads_clipped_ = false;  // ClipGrads() scaled them
  std::vector<torch::Tensor> targets_, grads_, exp_avgs_, exp_avg_sqs_, steps_;
  std::vector<bool> widen_;
  FusedStepTensors step_tensors_;  // [Shared step tensors], agent/core/foreach_groups.h
  int64_t batch_elems_ = 0;
};

}  // namespace memplan::chunks
