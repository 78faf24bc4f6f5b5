#include "agent/chunks/adamw8bit_torch.h"

#include <cmath>

#include "common/optimizer_bytes.h"

#ifdef MEMPLAN_ADAMW8BIT_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "agent/chunks/adamw8bit_kernel.h"
#endif

namespace memplan {
namespace {

// `flat` (n elements) zero-padded to whole blocks, viewed [blocks, 256].
torch::Tensor AsBlocks(const torch::Tensor& flat) {
  const int64_t n = flat.numel();
  const int64_t padded = QuantBlockCount(n) * kQuantBlockElems;
  if (padded == n) return flat.view({-1, kQuantBlockElems});
  return torch::constant_pad_nd(flat, {0, padded - n}, 0).view({-1, kQuantBlockElems});
}

#ifdef MEMPLAN_ADAMW8BIT_CUDA
// The fused kernel, when the tensors are what it takes; false leaves the update to the ops.
bool FusedCudaUpdate(const AdamWOptions& o, int64_t step, const torch::Tensor& clip_coef,
                     const QuantMapTensors& maps, torch::Tensor& param, const torch::Tensor& grad,
                     torch::Tensor& exp_avg_codes, torch::Tensor& exp_avg_sq_codes,
                     torch::Tensor& exp_avg_absmax, torch::Tensor& exp_avg_sq_absmax,
                     const ParamRounding& rounding) {
  const auto dtype = param.scalar_type();
  const int64_t n = param.numel();
  const int64_t blocks = QuantBlockCount(n);
  auto codes_ok = [&](const torch::Tensor& c) {
    return c.scalar_type() == torch::kUInt8 && c.numel() == n && c.is_contiguous() &&
           c.device() == param.device();
  };
  auto absmax_ok = [&](const torch::Tensor& a) {
    return a.scalar_type() == torch::kFloat32 && a.dim() == 1 && a.size(0) == blocks &&
           a.device() == param.device() && a.stride(0) == exp_avg_absmax.stride(0);
  };
  if (!param.is_cuda() || (dtype != torch::kFloat32 && dtype != torch::kBFloat16) ||
      !param.is_contiguous() || grad.scalar_type() != dtype || !grad.is_contiguous() ||
      grad.device() != param.device() || !codes_ok(exp_avg_codes) ||
      !codes_ok(exp_avg_sq_codes) || !absmax_ok(exp_avg_absmax) ||
      !absmax_ok(exp_avg_sq_absmax) || maps.exp_avg.device() != param.device()) {
    return false;
  }
  c10::cuda::CUDAGuard guard(param.device());
  torch::Tensor clip;
  if (clip_coef.defined()) clip = clip_coef.to(param.device(), torch::kFloat32).contiguous();
  chunks_cuda::AdamW8bitKernelArgs a;
  a.param = param.data_ptr();
  a.grad = grad.data_ptr();
  a.param_bf16 = dtype == torch::kBFloat16;
  a.stochastic_rounding = rounding.stochastic;
  a.rounding_key = rounding.key;
  a.rounding_first = rounding.first;
  a.clip_coef = clip.defined() ? clip.data_ptr<float>() : nullptr;
  a.exp_avg_codes = exp_avg_codes.data_ptr<uint8_t>();
  a.exp_avg_sq_codes = exp_avg_sq_codes.data_ptr<uint8_t>();
  a.exp_avg_absmax = exp_avg_absmax.data_ptr<float>();
  a.exp_avg_sq_absmax = exp_avg_sq_absmax.data_ptr<float>();
  a.absmax_stride = blocks > 1 ? exp_avg_absmax.stride(0) : 1;
  a.signed_map = maps.exp_avg.data_ptr<float>();
  a.unsigned_map = maps.exp_avg_sq.data_ptr<float>();
  a.numel = n;
  // The scalars as the ops below pass them (double arithmetic, then fp32 in the kernels).
  const double step_d = static_cast<double>(step);
  a.beta1 = static_cast<float>(o.beta1);
  a.one_minus_beta1 = static_cast<float>(1 - o.beta1);
  a.beta2 = static_cast<float>(o.beta2);
  a.one_minus_beta2 = static_cast<float>(1 - o.beta2);
  a.bias_correction2_sqrt = static_cast<float>(std::sqrt(1 - std::pow(o.beta2, step_d)));
  a.eps = static_cast<float>(o.eps);
  a.decay = o.weight_decay != 0 ? static_cast<float>(1 - o.lr * o.weight_decay) : 1.f;
  a.step_size = static_cast<float>(-o.lr / (1 - std::pow(o.beta1, step_d)));
  const int err = chunks_cuda::LaunchAdamW8bitUpdate(a, c10::cuda::getCurrentCUDAStream().stream());
  TORCH_CHECK(err == 0, "adamw8bit CUDA kernel launch failed (cudaError ", err, ")");
  return true;
}
#endif

}  // namespace

bool AdamW8bitFusedKernelBuilt() {
#ifdef MEMPLAN_ADAMW8BIT_CUDA
  return true;
#else
  return false;
#endif
}

QuantMapTensors MakeQuantMapTensors(const torch::Device& device) {
  const auto f32 = torch::TensorOptions().dtype(torch::kFloat32);
  QuantMapTensors maps;
  maps.exp_avg = torch::from_blob(const_cast<float*>(kSignedDynamicMap), {256}, f32).to(device,
                                                                      false, /*copy=*/true);
  maps.exp_avg_sq = torch::from_blob(const_cast<float*>(kUnsignedDynamicMap), {256}, f32)
                        .to(device, false, /*copy=*/true);
  auto mids = [](const torch::Tensor& map) {
    return (map.narrow(0, 0, 255) + map.narrow(0, 1, 255)) / 2;
  };
  maps.exp_avg_mids = mids(maps.exp_avg);
  maps.exp_avg_sq_mids = mids(maps.exp_avg_sq);
  return maps;
}

torch::Tensor DequantizeBlockwise8bit(const torch::Tensor& codes, const torch::Tensor& absmax,
                                      const torch::Tensor& map) {
  const int64_t n = codes.numel();
  const torch::Tensor values = map.index_select(0, codes.reshape({-1}).to(torch::kInt64));
  return AsBlocks(values).mul_(absmax.reshape({-1, 1})).view({-1}).narrow(0, 0, n);
}

void QuantizeBlockwise8bit(const torch::Tensor& values, const torch::Tensor& mids,
                           torch::Tensor& codes, torch::Tensor& absmax) {
  const int64_t n = values.numel();
  const torch::Tensor blocks = AsBlocks(values.reshape({-1}));
  // Padding zeros leave max |x| unchanged.
  const torch::Tensor block_max = blocks.abs().amax(1);
  const torch::Tensor scale = block_max.unsqueeze(1);
  // x * (1 / absmax) in [-1, 1]; an all-zero block scales to 0, as in the CPU kernel.
  const torch::Tensor inv =
      torch::where(scale > 0, scale.reciprocal(), torch::zeros({}, scale.options()));
  const torch::Tensor normed = (blocks * inv).clamp_(-1, 1).view({-1}).narrow(0, 0, n);
  // The number of midpoints below x (ties to the lower code), as the CPU kernel counts them.
  codes.view({-1}).copy_(
      torch::bucketize(normed, mids, /*out_int32=*/true, /*right=*/false).to(torch::kUInt8));
  absmax.copy_(block_max.view(absmax.sizes()));
}

void AdamW8bitTorchUpdate(const AdamWOptions& o, int64_t step, const torch::Tensor& clip_coef,
                          const QuantMapTensors& maps, torch::Tensor param,
                          const torch::Tensor& grad, torch::Tensor exp_avg_codes,
                          torch::Tensor exp_avg_sq_codes, torch::Tensor exp_avg_absmax,
                          torch::Tensor exp_avg_sq_absmax, const ParamRounding& rounding,
                          bool torch_ops) {
  torch::NoGradGuard no_grad;
#ifdef MEMPLAN_ADAMW8BIT_CUDA
  if (!torch_ops && FusedCudaUpdate(o, step, clip_coef, maps, param, grad, exp_avg_codes,
                                    exp_avg_sq_codes, exp_avg_absmax, exp_avg_sq_absmax,
                                    rounding)) {
    return;
  }
#else
  (void)torch_ops;
#endif
  // bitsandbytes' CPU/default sequence: the grad and parameter in fp32, then the torch ops of
  // AdamW with double scalars.
  torch::Tensor g = grad.detach().reshape({-1});
  if (clip_coef.defined()) g = g * clip_coef;
  g = g.to(torch::kFloat32);
  torch::Tensor m = DequantizeBlockwise8bit(exp_avg_codes, exp_avg_absmax, maps.exp_avg);
  torch::Tensor v = DequantizeBlockwise8bit(exp_avg_sq_codes, exp_avg_sq_absmax, maps.exp_avg_sq);
  m.mul_(o.beta1).add_(g, 1 - o.beta1);
  v.mul_(o.beta2).addcmul_(g, g, 1 - o.beta2);
  const double step_d = static_cast<double>(step);
  const double bias_correction1 = 1 - std::pow(o.beta1, step_d);
  const double bias_correction2_sqrt = std::sqrt(1 - std::pow(o.beta2, step_d));
  const torch::Tensor denom = (v.sqrt() / bias_correction2_sqrt).add_(o.eps);
  torch::Tensor flat = param.detach().view({-1});
  const bool fp32 = flat.scalar_type() == torch::kFloat32;
  torch::Tensor p = fp32 ? flat : flat.to(torch::kFloat32);
  if (o.weight_decay != 0) p.mul_(1 - o.lr * o.weight_decay);
  p.addcdiv_(m, denom, -o.lr / bias_correction1);
  if (!fp32 && rounding.stochastic && flat.scalar_type() == torch::kBFloat16) {
    // The CPU kernel's rounding on a host copy (one scalar function for every path).
    const torch::Tensor host = p.to(torch::kCPU).contiguous();
    torch::Tensor bits = torch::empty({host.numel()}, host.options().dtype(torch::kBFloat16));
    RoundToBf16(rounding, host.numel(), host.data_ptr<float>(),
                reinterpret_cast<uint16_t*>(bits.data_ptr<at::BFloat16>()));
    flat.copy_(bits);
  } else if (!fp32) {
    flat.copy_(p);
  }
  QuantizeBlockwise8bit(m, maps.exp_avg_mids, exp_avg_codes, exp_avg_absmax);
  QuantizeBlockwise8bit(v, maps.exp_avg_sq_mids, exp_avg_sq_codes, exp_avg_sq_absmax);
}

}  // namespace memplan
