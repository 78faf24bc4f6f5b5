// NF4 4-bit quantization of frozen weights (QLoRA), exactly as bitsandbytes 0.50 defines it on
// the CPU: quantize_4bit(quant_type="nf4", blocksize=64, compress_statistics=True) and
// dequantize_4bit. Storage layout: [NF4 storage] in common/nf4_bytes.h.
//
// [NF4 numerics]
// * 4-bit codes: per block of 64 elements, absmax = max |x|; x * (1 / max(absmax, 1e-38)) in fp32,
//   clamped to [-1, 1] (a trailing partial block divides instead of multiplying by the
//   reciprocal), mapped to the nearest of the 16 NF4 values, a value exactly between two going
//   to the lower one. An odd element count pads the last byte's low nibble with the code of 0.
// * Double quantization: offset = mean of the absmax (fp32); (absmax - offset) is quantized per
//   256 values with bitsandbytes' signed 8-bit dynamic map, rounding as its CPU kernel does: the
//   value v, scaled by the block's reciprocal absmax and clamped, selects entry
//   trunc(((v + 1) * 0.5) * 65535 + 0.5) of a 65536-entry table of nearest codes. That is not
//   always the nearest code (it can pick a neighbour within 2/65535 of the value).
// * Dequantization: absmax = map[code] * scale + offset, then value = nf4[code] * absmax, each
//   product and sum rounded to fp32, the result rounded to the output dtype (nearest-even).
// Results on a CUDA device equal the CPU's except the offset, a mean whose summation order
// differs (a few fp32 ulps).
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "agent/core/torch_pch.h"

namespace memplan::quant {

// A weight in NF4 storage; all tensors on one device. Thread-compatible value type.
struct Nf4Tensor {
  torch::Tensor data;          // uint8 [ceil(numel/2)], element 2k in the high nibble of byte k
  torch::Tensor absmax_code;   // uint8 [n_blocks], 8-bit dynamic code of (absmax - offset)
  torch::Tensor absmax_scale;  // fp32 [ceil(n_blocks/256)]
  float absmax_offset = 0;     // mean of the block absmax values
  std::vector<int64_t> shape;  // the weight's shape
  int64_t blocksize = 64;

  int64_t numel() const;
  int64_t n_blocks() const { return (numel() + blocksize - 1) / blocksize; }
  torch::Device device() const { return data.device(); }
  // The same tensor with its parts on `device`.
  Nf4Tensor To(const torch::Device& device, bool non_blocking = false) const;
};

// bitsandbytes' NF4 values (get_4bit_type("nf4")), ascending; code i is entry i.
const std::array<float, 16>& Nf4Values();
// bitsandbytes' signed 8-bit dynamic map (create_dynamic_map()): 256 ascending fp32 values, CPU.
const torch::Tensor& DynamicMap8Bit();

// Quantizes a floating-point weight (fp32, bf16 or fp16; any shape; any device, computed there).
// INVALID_ARGUMENT for another dtype, an empty tensor, a blocksize other than 32..4096 (powers
// of two, bitsandbytes' range) or non-finite values.
absl::StatusOr<Nf4Tensor> QuantizeNf4(const torch::Tensor& weight, int64_t blocksize = 64);

// [Sharded NF4 loading] QuantizeNf4 in parts, bit for bit its result (on the same device), so a
// rank can quantize only the bytes it stores. A data byte depends only on its 64-element block;
// the absmax codes and scales on every block's absmax (their mean is the offset).
struct Nf4AbsmaxState {
  torch::Tensor absmax_code;   // as Nf4Tensor's
  torch::Tensor absmax_scale;  // as Nf4Tensor's
  float absmax_offset = 0;
};
// The double-quantized absmax of the whole `weight` (its data is not packed).
absl::StatusOr<Nf4AbsmaxState> QuantizeNf4Absmax(const torch::Tensor& weight,
                                                 int64_t blocksize = 64);
// The data bytes of elements [first_block * blocksize, + values.numel()) of a weight of `numel`
// elements, given those elements: whole blocks, or the weight's last ones (the bytes of
// QuantizeNf4(weight).data from first_block * blocksize / 2 on). INVALID_ARGUMENT otherwise.
absl::StatusOr<torch::Tensor> QuantizeNf4Blocks(const torch::Tensor& values, int64_t first_block,
                                                int64_t numel, int64_t blocksize = 64);

// The weight back in `out_dtype` (fp32, bf16 or fp16), shaped q.shape, on q's device: the CUDA
// kernel on a CUDA device when it was built (Nf4CudaKernelBuilt()), LibTorch ops otherwise. Both
// give the same bits. Preconditions: q is what QuantizeNf4 made (ValidateNf4 passes).
torch::Tensor DequantizeNf4(const Nf4Tensor& q, torch::ScalarType out_dtype);

// The two implementations, for tests and the benchmark. DequantizeNf4Ops works on any device and
// holds at most kNf4OpsSliceElems elements of fp32/int64 temporaries beside its output;
// DequantizeNf4Kernel needs a CUDA tensor and a build with the kernel (FAILED_PRECONDITION).
torch::Tensor DequantizeNf4Ops(const Nf4Tensor& q, torch::ScalarType out_dtype);
absl::StatusOr<torch::Tensor> DequantizeNf4Kernel(const Nf4Tensor& q, torch::ScalarType out_dtype);
inline constexpr int64_t kNf4OpsSliceElems = int64_t{1} << 20;
bool Nf4CudaKernelBuilt();

// The fp32 absmax of every block (the double quantization undone), on q's device.
torch::Tensor DequantizeAbsmax(const Nf4Tensor& q);

// INVALID_ARGUMENT naming the part whose dtype, size or device does not match [NF4 storage].
absl::Status ValidateNf4(const Nf4Tensor& q);

}  // namespace memplan::quant
