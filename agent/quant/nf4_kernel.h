// The NF4 dequantization CUDA kernel (nf4_kernel.cu), behind a CUDA-free interface so that only
// that file needs nvcc. Built only when the project found a CUDA compiler (MEMPLAN_NF4_CUDA).
#pragma once

#include <cstdint>

namespace memplan::quant {

enum class Nf4OutType { kFloat32, kBFloat16, kFloat16 };

// Writes `numel` values to `out` (contiguous, `out_type`) on `stream` (a cudaStream_t):
// nf4[code] * (dynamic_map[absmax_code[b]] * absmax_scale[b / 256] + absmax_offset), each
// product and sum rounded to fp32 ([NF4 numerics], agent/quant/nf4.h). Device pointers. Returns
// the cudaError_t of the launch (0 = success).
int LaunchNf4Dequant(const uint8_t* data, const uint8_t* absmax_code, const float* absmax_scale,
                     const float* dynamic_map, float absmax_offset, int64_t numel,
                     int64_t blocksize, void* out, Nf4OutType out_type, void* stream);

}  // namespace memplan::quant
