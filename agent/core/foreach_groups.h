// Grouping tensors by device and dtype for the at::_foreach_* ops, as Python's
// torch.nn.utils.clip_grad_norm_(foreach=True) groups its grads: one foreach kernel per group on
// a GPU instead of one kernel per tensor. Shared by the trainer's unmanaged grads and the chunk
// manager's persistent ones.
#pragma once

#include <cstddef>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "agent/core/torch_pch.h"

namespace memplan {

// The positions of `tensors` (all defined) grouped by device and dtype: each group in input
// order, the groups in a fixed order (device name, then dtype).
inline std::vector<std::vector<size_t>> IndicesByDeviceAndDtype(
    const std::vector<torch::Tensor>& tensors) {
  std::map<std::pair<std::string, int>, std::vector<size_t>> by_kind;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const torch::Tensor& t = tensors[i];
    by_kind[{t.device().str(), static_cast<int>(t.scalar_type())}].push_back(i);
  }
  std::vector<std::vector<size_t>> groups;
  for (auto& [kind, indices] : by_kind) groups.push_back(std::move(indices));
  return groups;
}

// `tensors` (all defined) grouped as IndicesByDeviceAndDtype groups them: the lists one foreach
// kernel takes each.
inline std::vector<std::vector<torch::Tensor>> GroupByDeviceAndDtype(
    const std::vector<torch::Tensor>& tensors) {
  std::vector<std::vector<torch::Tensor>> groups;
  for (const std::vector<size_t>& indices : IndicesByDeviceAndDtype(tensors)) {
    std::vector<torch::Tensor>& group = groups.emplace_back();
    group.reserve(indices.size());
    for (size_t i : indices) group.push_back(tensors[i]);
  }
  return groups;
}

// The 2-norm of each of `tensors` (all defined), in input order: one at::_foreach_norm per device
// and dtype (clip_grad_norm_'s per-tensor norms on its foreach path), each norm in its tensor's
// dtype and on its device.
inline std::vector<torch::Tensor> ForeachNorms(const std::vector<torch::Tensor>& tensors) {
  std::vector<torch::Tensor> norms(tensors.size());
  const std::vector<std::vector<size_t>> groups = IndicesByDeviceAndDtype(tensors);
  const std::vector<std::vector<torch::Tensor>> lists = GroupByDeviceAndDtype(tensors);
  for (size_t g = 0; g < groups.size(); ++g) {
    const std::vector<torch::Tensor> group_norms = at::_foreach_norm(lists[g], 2.0);
    for (size_t k = 0; k < groups[g].size(); ++k) norms[groups[g][k]] = group_norms[k];
  }
  return norms;
}

// Every one of `tensors` (all defined) multiplied in place by the 0-dim tensor `scalar`: one
// at::_foreach_mul_ per device and dtype, `scalar` moved to each group's device (not converted:
// the products are each tensor's mul_(scalar), bit for bit; a CUDA group whose dtype is not
// `scalar`'s takes torch's per-tensor path).
inline void ForeachMulInPlace(const std::vector<torch::Tensor>& tensors,
                              const torch::Tensor& scalar) {
  for (const std::vector<torch::Tensor>& group : GroupByDeviceAndDtype(tensors)) {
    at::_foreach_mul_(group, scalar.to(group.front().device()));
  }
}

// dst[k].copy_(src[k]) for every k (same shapes, any dtypes: each value converted as copy_
// converts it, with the same static_cast), in one at::_foreach_copy_: on CUDA one multi-tensor
// kernel when every src shares a dtype and every dst shares one, instead of a launch per tensor
// (torch's per-tensor path otherwise, and on the CPU). The persistent chunks' grads widened for
// an fp32 master, copied into a reduce's flat and back ([Batched widening],
// agent/chunks/chunk_optimizer_step.cc).
inline void ForeachCopy(const std::vector<torch::Tensor>& dst, const std::vector<torch::Tensor>& src) {
  if (!dst.empty()) at::_foreach_copy_(dst, src);
}

// [Shared step tensors] at::_fused_adamw_ reads each parameter's step from a float32 scalar on
// the parameter's device and does not bump it. Parameters at the same step (on the same device)
// share one, made once per update, instead of a fill kernel per parameter (hundreds of launches
// for a model's or an adapter set's tensors). Keep the object alive until the fused call is made.
class FusedStepTensors {
 public:
  // The step tensor for `step` on the device of `like`.
  torch::Tensor For(int64_t step, const torch::Tensor& like) {
    for (const Entry& e : entries_) {
      if (e.step == step && e.tensor.device() == like.device()) return e.tensor;
    }
    entries_.push_back(Entry{step, torch::full({}, static_cast<double>(step),
                                               like.options().dtype(torch::kFloat32))});
    return entries_.back().tensor;
  }

 private:
  struct Entry {
    int64_t step;
    torch::Tensor tensor;
  };
  std::vector<Entry> entries_;
};

}  // namespace memplan
