#include "agent/chunks/torch_sqrt.h"

#include <dlfcn.h>

#include <string>

#include "agent/core/torch_pch.h"

namespace memplan {
namespace {

// torch's fp32 CPU sqrt on MKL builds is at::vml::vsqrt = MKL's vmsSqrt in high-accuracy mode
// (ATen/cpu/vml.h), which libtorch_cpu exports. Calling it directly skips ~2 us of dispatch per
// block; builds without it go through at::sqrt_out. cpu_adamw_test checks both agree with torch.
using VmsSqrtFn = void (*)(int n, const float* in, float* out, long long mode);
constexpr long long kVmlHighAccuracy = 0x2;
constexpr long long kVmlFtzDazOff = 0x140000;
constexpr long long kVmlErrModeIgnore = 0x100;

VmsSqrtFn ResolveVmsSqrt() {
  static const VmsSqrtFn fn = reinterpret_cast<VmsSqrtFn>(dlsym(RTLD_DEFAULT, "vmsSqrt"));
  return fn;
}

}  // namespace

void TorchSqrt(const float* in, float* out, int64_t n) {
  if (VmsSqrtFn fn = ResolveVmsSqrt(); fn != nullptr) {
    fn(static_cast<int>(n), in, out, kVmlHighAccuracy | kVmlFtzDazOff | kVmlErrModeIgnore);
    return;
  }
  TorchSqrtViaDispatcher(in, out, n);
}

void TorchSqrtViaDispatcher(const float* in, float* out, int64_t n) {
  // Inference mode skips autograd bookkeeping on these temporary wrappers.
  c10::InferenceMode inference;
  const auto options = torch::TensorOptions().dtype(torch::kFloat32);
  torch::Tensor src = torch::from_blob(const_cast<float*>(in), {n}, options);
  torch::Tensor dst = torch::from_blob(out, {n}, options);
  at::sqrt_out(dst, src);
}

bool TorchSqrtUsesMkl() { return ResolveVmsSqrt() != nullptr; }

int64_t TorchBf16VectorElems() {
  static const int64_t elems = [] {
    const std::string capability = at::get_cpu_capability();
    return capability == "AVX512" ? int64_t{32} : capability == "AVX2" ? int64_t{16} : int64_t{0};
  }();
  return elems;
}

}  // namespace memplan
