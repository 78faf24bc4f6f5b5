// [Narrow reduce-scatter] The local sum of the 16-bit slices an all-to-all delivered, one pass on
// the GPU: out[i] = float(in[0·k + i]) + float(in[1·k + i]) + … in rank order, each addition in
// fp32, the values of the eager copy_-then-add_ loop (process_group.cc, WidenedReduce) that
// runs a mixed-dtype, unvectorised kernel per rank. CUDA-free interface; built only when the
// project found a CUDA compiler (MEMPLAN_WIDEN_CUDA).
#pragma once

#include <cstdint>

#include "agent/core/kernel_dtype.h"

namespace memplan::dist_cuda {

using cuda::KernelDtype;

// out (fp32, k contiguous elements) ← the rank-order fp32 sum of `world` contiguous slices of k
// elements of `dtype` at `in`. Launches on `stream` (a cudaStream_t); returns the cudaError_t of
// the launch (0 = success).
int LaunchWidenedSum(const void* in, int world, int64_t k, KernelDtype dtype, float* out,
                     void* stream);

}  // namespace memplan::dist_cuda
