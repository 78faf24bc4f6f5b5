// The operations every part of the model (decoder blocks, the vision tower) computes with, as
// Hugging Face computes them: a linear layer whose autograd keeps the parameter itself, RMSNorm and
// rotate_half.
#pragma once

#include "agent/core/torch_pch.h"
#include "common/types.h"

namespace memplan {

torch::ScalarType ToScalarType(DType dtype);

// y = x·wᵀ + b (b may be undefined); a weight of more than two dimensions is read as
// [w.size(0), the rest flattened] (a Conv3d whose stride is its kernel, over flattened patches).
// Backward reads `w` through the parameter, never through a view of the storage it had in forward:
// a chunk manager (ParamResidency) may swap that storage between forward and backward.
torch::Tensor Linear(const torch::Tensor& x, const torch::Tensor& w,
                     const torch::Tensor& b = torch::Tensor());

// [Frozen weights stay on the device] save_for_backward of `activations` then `weights`, except
// that a weight which needs no gradient (a LoRA or QLoRA base's projections and norms, a frozen
// expert, RoPE's tables) is kept in the context's saved_data, where saved-tensor hooks do not see
// it. Swap's hooks ([Saved-tensor hooks], agent/blocks/activation_offloader.cc) copy to the host
// whatever they are handed but a parameter that trains; a frozen weight would be copied at every
// swapped block and step although it stays on the device (or in its chunk) all along, and the
// planner counts no such copy (llama-3.1-8b's frozen base is 15 GB). Read back with
// SavedForBackward, in the same order.
void SaveForBackward(torch::autograd::AutogradContext* ctx, std::vector<torch::Tensor> activations,
                     const std::vector<torch::Tensor>& weights);
torch::autograd::variable_list SavedForBackward(torch::autograd::AutogradContext* ctx);

// Hugging Face's RMSNorm (LlamaRMSNorm, Qwen2_5_VLRMSNorm): normalise in fp32, cast back, scale.
// [Fused norm] For 16-bit inputs one autograd Function keeping the input and the fp32 rstd for
// backward: the eager ops forward, the eager graph's backward ops backward (bit for bit). fp32
// inputs take the eager graph itself (RmsNormUnfused), whose gradient sums only it reproduces. The
// decoder's norms; the planner prices what each keeps (planner/cost/analytic_trace.cc,
// NormSavedBytes).
torch::Tensor RmsNorm(const torch::Tensor& x, const torch::Tensor& weight, double eps);

// The same RMSNorm as the eager ops, autograd keeping what they keep (the vision tower, whose
// price, common/vision_cost.cc, counts those tensors).
torch::Tensor RmsNormUnfused(const torch::Tensor& x, const torch::Tensor& weight, double eps);

enum class GateActivation { kSilu, kGeluTanh };

// [Fused gate] act(g) * u of a gated MLP (SwiGLU; Gemma's GeGLU with kGeluTanh), keeping g and u
// for backward and recomputing act(g) there; the eager ops' values and roundings. SiLU on CUDA is
// one kernel each way (gated_kernel.cu) when the project built CUDA kernels.
torch::Tensor GatedProduct(const torch::Tensor& g, const torch::Tensor& u,
                           GateActivation act = GateActivation::kSilu);

// [-x2, x1] for x = [x1, x2] split in halves along the last dimension (RoPE).
torch::Tensor RotateHalf(const torch::Tensor& x);

// [x2, x1] for x = [x1, x2]: RotateHalf without the sign, one flip of a [..., 2, half] view. With
// the sin table's first half negated (LlamaModel::Rope::sin), SwapHalves(x) * sin equals
// RotateHalf(x) * sin bit for bit, and its backward is one flip, where the slices and cat took
// a negation, two zero-filled slice copies and their sum (2.2 ms of llama-3.2-1b's 170 ms
// step on an H200).
torch::Tensor SwapHalves(const torch::Tensor& x);

}  // namespace memplan
