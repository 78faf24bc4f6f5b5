// TorchSqrt: the VectorSqrtFn (agent/chunks/cpu_adamw.h) that runs torch's own CPU sqrt kernel on
// raw fp32 arrays, so the CPU AdamW rounds exactly like torch::optim::AdamW. Thread-safe.
#pragma once

#include <cstdint>

namespace memplan {

// out[i] = torch::sqrt(in[i]). Calls the MKL routine torch's kernel uses when libtorch exports
// it, else TorchSqrtViaDispatcher.
void TorchSqrt(const float* in, float* out, int64_t n);
// Through at::sqrt_out; n <= kSqrtBlockElems keeps torch on the calling thread.
void TorchSqrtViaDispatcher(const float* in, float* out, int64_t n);
// Whether TorchSqrt found MKL's vmsSqrt.
bool TorchSqrtUsesMkl();

// Vectorized<BFloat16>::size() of the CPU kernel torch dispatches at::_fused_adamw_ to (what
// AdamWBf16Update needs to reproduce it, cpu_adamw.h): 32 for AVX-512, 16 for AVX2, 0 for any
// other dispatch (which AdamWBf16Update does not reproduce).
int64_t TorchBf16VectorElems();

}  // namespace memplan
