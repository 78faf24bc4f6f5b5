// [OSFT] Orthogonal subspace fine-tuning of one projection weight W [out, in] (the options and the
// rank split are in osft_options.h): W = U diag(S) Vᵀ by an fp32 SVD, the high singular directions
// frozen, the low ones trainable; y = x·W_highᵀ + x·W_lowᵀ computed from the factors (W is never
// formed again); after backward the low factors' gradients lose their components in the frozen
// subspaces, in factored form: dU_low -= U_high (U_highᵀ dU_low), dV_low -= V_high (V_highᵀ dV_low).
// The PyTorch reference of the same math is tests/python/osft_reference.py.
#pragma once

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "agent/core/param_residency.h"
#include "agent/core/torch_pch.h"

namespace memplan {

// U [out, k], S [k], V [in, k] (V's columns are the right singular vectors) of each part.
struct OsftFactors {
  torch::Tensor u_high, s_high, v_high;  // frozen (requires_grad false)
  torch::Tensor u_low, s_low, v_low;     // trainable leaves
};

// Splits `weight` ([out, in], any float dtype) at `rank_ratio` (OsftSplitRanks): the SVD runs in
// fp32 on `compute`, each singular pair's sign is fixed so that the largest-magnitude entry of its
// left vector is positive (reproducible across runs and devices), and the factors are stored with
// `store`'s dtype and device.
OsftFactors OsftSplit(const torch::Tensor& weight, double rank_ratio, const torch::Device& compute,
                      const torch::TensorOptions& store);

// [OSFT resume without the SVD] A resume copies every factor from its checkpoint, so splitting
// the loaded weights first (about 0.3 s per 4096 x 4096 matrix on an H200, far longer on the CPU)
// would be thrown away. These are factors of OsftSplit's shapes for a [out_features, in_features]
// weight at `rank_ratio`, zero-filled with `store`'s dtype and device, the low ones trainable:
// the places the checkpoint's values are copied into.
OsftFactors OsftZeroFactors(int64_t out_features, int64_t in_features, double rank_ratio,
                            const torch::TensorOptions& store);

// x [..., in] -> [..., out]: ((x V_high) * S_high) U_highᵀ + b, then ((x V_low) * S_low) U_lowᵀ
// added in place (mm + addmm_). `bias` may be undefined.
torch::Tensor OsftLinear(const torch::Tensor& x, const OsftFactors& f, const torch::Tensor& bias);

// Projects the accumulated gradients of u_low and v_low (those defined) orthogonal to the frozen
// subspaces, in place. Linear in the gradient: projecting each rank's part before a sum equals
// projecting the sum.
void ProjectOsftGrads(const OsftFactors& f);

// Parameter names: "<module path>.osft_u_high" etc. (module path like
// "model.layers.3.self_attn.q_proj"): the frozen factors (u, s, v) and the trainable ones.
std::vector<NamedParam> OsftFrozenNamed(const std::string& module_path, const OsftFactors& f);
std::vector<NamedParam> OsftTrainableNamed(const std::string& module_path, const OsftFactors& f);

// [Parameter order] with OSFT: each "<path>.weight" that `listed` lacks but whose
// "<path>.osft_u_high" it has is replaced, in its place and group, by its frozen factors' names.
std::vector<std::pair<std::string, int>> ExpandOsftOrder(
    const std::vector<std::pair<std::string, int>>& order,
    const std::function<bool(const std::string&)>& listed);

}  // namespace memplan
