// The fused 8-bit AdamW update of one parameter on the GPU (adamw8bit_kernel.cu): dequantize both
// moments, AdamW in fp32, round into the parameter, requantize with the new block absmax, in one
// pass over the parameter (the LibTorch-ops path makes a dozen passes and holds several fp32
// copies of the parameter at once). CUDA-free interface; built only when the project found a CUDA
// compiler (MEMPLAN_ADAMW8BIT_CUDA).
#pragma once

#include <cstdint>

namespace memplan::chunks_cuda {

struct AdamW8bitKernelArgs {
  void* param = nullptr;       // numel elements, fp32 or bf16 (param_bf16), contiguous
  const void* grad = nullptr;  // same dtype and layout as param
  bool param_bf16 = false;
  // bf16 parameters: rounded stochastically ([Stochastic rounding], stochastic_rounding.h) with
  // this key, element i of the launch being element rounding_first + i of its parameter.
  bool stochastic_rounding = false;
  uint64_t rounding_key = 0;
  int64_t rounding_first = 0;
  const float* clip_coef = nullptr;  // device scalar; null = no clipping
  uint8_t* exp_avg_codes = nullptr;  // numel codes each, contiguous
  uint8_t* exp_avg_sq_codes = nullptr;
  float* exp_avg_absmax = nullptr;  // one per 256-element block, every absmax_stride floats
  float* exp_avg_sq_absmax = nullptr;
  int64_t absmax_stride = 1;
  const float* signed_map = nullptr;    // 256 fp32 values (device)
  const float* unsigned_map = nullptr;  // 256 fp32 values (device)
  int64_t numel = 0;
  // The scalars as the LibTorch path hands them to its ops (fp32).
  float beta1 = 0, one_minus_beta1 = 0, beta2 = 0, one_minus_beta2 = 0;
  float bias_correction2_sqrt = 1, eps = 0;
  float decay = 1;  // 1 - lr * weight_decay; exactly 1 skips the multiply
  float step_size = 0;  // -lr / bias_correction1
};

// Launches on `stream` (a cudaStream_t); returns the cudaError_t of the launch (0 = success).
int LaunchAdamW8bitUpdate(const AdamW8bitKernelArgs& args, void* stream);

}  // namespace memplan::chunks_cuda
