// [Fused norm] The element-wise passes of a 16-bit RMSNorm and of its backward, one kernel each,
// where the eager ops run five forward and about ten backward, most of them fp32 copies or
// broadcasts that do not vectorise. The two row reductions (the mean of the squares forward, the
// row sum of the product backward) stay ATen's own ops on the same fp32 tensors, and every
// product and sum here is rounded where the eager op rounds it (no contraction into FMAs), so
// the results are the eager ops' bit for bit (agent/model/layers.cc, RmsNormFunction, runs those
// ops on the CPU). x, g and the outputs are [rows, width] contiguous; the weight is [width] in
// x's dtype; rstd and gsq are [rows] fp32. CUDA-free interface; built only when the project found
// a CUDA compiler (MEMPLAN_RMS_NORM_CUDA). Each launcher runs on `stream` (a cudaStream_t) and
// returns the cudaError_t of the launch (0 = success); dtype kFloat32 is refused.
#pragma once

#include <cstdint>

#include "agent/core/kernel_dtype.h"

namespace memplan::model_cuda {

using cuda::KernelDtype;

// sq = float(x)², the input of the mean.
int LaunchRmsNormSquares(const void* x, int64_t n, KernelDtype dtype, float* sq, void* stream);

// y = round(w · round(float(x) · rstd[row])).
int LaunchRmsNormForward(const void* x, const void* w, const float* rstd, int64_t rows,
                         int64_t width, KernelDtype dtype, void* y, void* stream);

// prod = float(round(g · w)) · float(x), fp32: the row sum gives the gradient of rstd's factor.
int LaunchRmsNormGradProduct(const void* g, const void* w, const void* x, int64_t rows,
                             int64_t width, KernelDtype dtype, float* prod, void* stream);

// gx = round(float(round(g · w)) · rstd[row] + gsq[row] · (2 · float(x))).
int LaunchRmsNormGradInput(const void* g, const void* w, const void* x, const float* rstd,
                           const float* gsq, int64_t rows, int64_t width, KernelDtype dtype,
                           void* gx, void* stream);

// gwp = round(g · round(float(x) · rstd[row])): summed over the rows, the weight's gradient.
int LaunchRmsNormWeightGradProduct(const void* g, const void* x, const float* rstd, int64_t rows,
                                   int64_t width, KernelDtype dtype, void* gwp, void* stream);

}  // namespace memplan::model_cuda
