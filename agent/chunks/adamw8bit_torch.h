// 8-bit AdamW with LibTorch ops on any device: the persistent chunks' update. The same numerics
// as the CPU kernel (agent/chunks/cpu_adamw.h, AdamW8bitUpdate) written as bitsandbytes' default
// backend writes them, one tensor op per step; on the CPU both give the same bits.
// Thread-compatible.
#pragma once

#include <cstdint>

#include "agent/chunks/cpu_adamw.h"
#include "agent/core/torch_pch.h"

namespace memplan {

// The two dynamic maps (kSignedDynamicMap, kUnsignedDynamicMap) as fp32 tensors on `device`.
struct QuantMapTensors {
  torch::Tensor exp_avg;     // signed
  torch::Tensor exp_avg_sq;  // unsigned
  torch::Tensor exp_avg_mids, exp_avg_sq_mids;  // (map[i] + map[i + 1]) / 2, 255 each
};
QuantMapTensors MakeQuantMapTensors(const torch::Device& device);

// codes (uint8, n elements) -> fp32 values of one tensor quantized in 256-element blocks from its
// element 0; absmax has ceil(n / 256) entries (may be a strided view).
torch::Tensor DequantizeBlockwise8bit(const torch::Tensor& codes, const torch::Tensor& absmax,
                                      const torch::Tensor& map);
// Quantizes fp32 `values` into `codes` (uint8, same numel) and `absmax` (ceil(n / 256) entries;
// written in place, strided views allowed); `mids` are the map's midpoints.
void QuantizeBlockwise8bit(const torch::Tensor& values, const torch::Tensor& mids,
                           torch::Tensor& codes, torch::Tensor& absmax);

// One update of `param` (fp32 or bf16, on any device) in place: the grad (param's dtype) is
// multiplied by clip_coef when defined (in its dtype, as clip_grad_norm_ does), the moments are
// dequantized, updated with AdamW (step = the update count after this one), the fp32 result is
// rounded into the parameter (bf16: as `rounding` says, its `first` being 0 for a whole
// parameter; the ops path rounds stochastically on the host, a fallback) and the moments are
// quantized again. codes are the parameter's
// numel uint8 elements, absmax its ceil(numel / 256) blocks.
// On a CUDA device with the fused kernel built (adamw8bit_kernel.h) and contiguous fp32/bf16
// tensors, one kernel does it all (same operations and rounding order; results can differ from
// the ops path in the last bit where torch's CUDA ops contract or reorder, and a code by one at a
// midpoint tie then); otherwise, or with `torch_ops` set, the LibTorch ops below.
void AdamW8bitTorchUpdate(const AdamWOptions& options, int64_t step,
                          const torch::Tensor& clip_coef, const QuantMapTensors& maps,
                          torch::Tensor param, const torch::Tensor& grad,
                          torch::Tensor exp_avg_codes, torch::Tensor exp_avg_sq_codes,
                          torch::Tensor exp_avg_absmax, torch::Tensor exp_avg_sq_absmax,
                          const ParamRounding& rounding = {}, bool torch_ops = false);
// Whether this build has the fused CUDA kernel.
bool AdamW8bitFusedKernelBuilt();

}  // namespace memplan
