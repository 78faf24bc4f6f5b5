#include "agent/quant/nf4.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "common/nf4_bytes.h"

#ifdef MEMPLAN_NF4_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "agent/quant/nf4_kernel.h"
#endif

namespace memplan::quant {
namespace {

constexpr std::array<float, 16> kNf4 = {
    -1.0f, -0.6961928009986877f, -0.5250730514526367f, -0.39491748809814453f,
    -0.28444138169288635f, -0.18477343022823334f, -0.09105003625154495f, 0.0f,
    0.07958029955625534f, 0.16093020141124725f, 0.24611230194568634f, 0.33791524171829224f,
    0.44070982933044434f, 0.5626170039176941f, 0.7229568362236023f, 1.0f};

// Elements quantized per pass: bounds the fp32/int32 temporaries of a large weight. A multiple
// of every allowed blocksize (blocks never straddle passes) and even (bytes neither).
constexpr int64_t kQuantizeSliceElems = int64_t{1} << 22;
constexpr int64_t kLutSize = 65536;

torch::Tensor Nf4Table(const torch::Device& device) {
  return torch::from_blob(const_cast<float*>(kNf4.data()), {16}, torch::kFloat32)
      .to(device, /*non_blocking=*/false, /*copy=*/true);
}

// Decision bounds of the 4-bit rounding: midpoints of consecutive NF4 values in fp32, as
// bitsandbytes' (code[:-1] + code[1:]) / 2.
torch::Tensor Nf4Bounds(const torch::Device& device) {
  std::array<float, 15> mid;
  for (int i = 0; i < 15; ++i) mid[i] = (kNf4[i] + kNf4[i + 1]) / 2.0f;
  return torch::from_blob(mid.data(), {15}, torch::kFloat32).to(device, false, /*copy=*/true);
}

// The 8-bit rounding table of bitsandbytes' CPU blockwise quantizer: entry i is the code nearest
// to -1 + 2i/65535, a value exactly on a midpoint going to the lower code. Built in fp32 as the
// kernel builds it (no product feeds a sum here, so no FMA contraction can change a value).
const torch::Tensor& DynamicLut() {
  static const torch::Tensor lut = [] {
    const torch::Tensor map = DynamicMap8Bit();
    const float* code = map.data_ptr<float>();
    std::array<float, 255> mid;
    for (int i = 0; i < 255; ++i) mid[i] = 0.5f * (code[i] + code[i + 1]);
    torch::Tensor t = torch::empty({kLutSize}, torch::kUInt8);
    uint8_t* out = t.data_ptr<uint8_t>();
    int idx = 0;
    for (int64_t i = 0; i < kLutSize; ++i) {
      const float val = -1.0f + (2.0f * static_cast<float>(i)) / static_cast<float>(kLutSize - 1);
      while (idx < 255 && mid[idx] < val) ++idx;
      out[i] = static_cast<uint8_t>(idx);
    }
    return t;
  }();
  return lut;
}

// bitsandbytes' CPU blockwise 8-bit quantization of `a` (fp32, 1-D) in blocks of `blocksize`:
// returns the codes (uint8, like a) and each block's absmax (fp32).
std::pair<torch::Tensor, torch::Tensor> QuantizeDynamic8(const torch::Tensor& a,
                                                         int64_t blocksize) {
  const int64_t n = a.numel();
  const int64_t blocks = (n + blocksize - 1) / blocksize;
  const torch::Tensor padded =
      n == blocks * blocksize ? a : torch::constant_pad_nd(a, {0, blocks * blocksize - n}, 0);
  const torch::Tensor v = padded.view({blocks, blocksize});
  // Zero padding cannot raise a block's absmax.
  const torch::Tensor absmax = v.abs().amax(1);
  const torch::Tensor inv = absmax.reciprocal().unsqueeze(1);
  // Step by step: the kernel rounds each operation to fp32.
  torch::Tensor t = (v * inv).clamp(-1.0, 1.0);
  t = t.add(1.0).mul(0.5).mul(static_cast<double>(kLutSize - 1)).add(0.5);
  // An all-zero block gets code 0 (its reciprocal is inf; the kernel writes zeros).
  t = t.nan_to_num(0.0, 0.0, 0.0);
  const torch::Tensor idx = t.to(torch::kInt64).view({-1});
  torch::Tensor codes = DynamicLut().to(a.device()).index_select(0, idx).view({blocks, blocksize});
  codes.masked_fill_((absmax == 0).unsqueeze(1), 0);
  return {codes.view({-1}).slice(0, 0, n), absmax};
}

absl::Status CheckBlocksize(int64_t blocksize) {
  if (blocksize < 32 || blocksize > 4096 || (blocksize & (blocksize - 1)) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "blocksize = ", blocksize, " is not allowed; allowed: 32, 64, ..., 4096 (powers of two)"));
  }
  return absl::OkStatus();
}

}  // namespace

int64_t Nf4Tensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

Nf4Tensor Nf4Tensor::To(const torch::Device& device, bool non_blocking) const {
  Nf4Tensor out = *this;
  out.data = data.to(device, non_blocking);
  out.absmax_code = absmax_code.to(device, non_blocking);
  out.absmax_scale = absmax_scale.to(device, non_blocking);
  return out;
}

const std::array<float, 16>& Nf4Values() { return kNf4; }

const torch::Tensor& DynamicMap8Bit() {
  // bitsandbytes' create_dynamic_map(signed=True, max_exponent_bits=7, total_bits=8): for
  // exponent e = 0..6, 2^e fractions (midpoints of a fp32 linspace over [0.1, 1]) scaled by
  // 10^(e-6), both signs; plus 0 and 1. The same torch ops (fp32 linspace, fp32 means, the scale
  // applied to the fp32 tensor) give the same values.
  static const torch::Tensor map = [] {
    torch::NoGradGuard no_grad;
    std::vector<float> values;
    for (int e = 0; e < 7; ++e) {
      const torch::Tensor b = torch::linspace(0.1, 1.0, (int64_t{1} << e) + 1, torch::kFloat32);
      const torch::Tensor means = (b.slice(0, 0, -1) + b.slice(0, 1)) / 2.0;
      const double scale = std::pow(10.0, e - 6);
      for (const torch::Tensor& part : {means * scale, means * -scale}) {
        const float* p = part.contiguous().data_ptr<float>();
        values.insert(values.end(), p, p + part.numel());
      }
    }
    values.push_back(0.0f);
    values.push_back(1.0f);
    std::sort(values.begin(), values.end());
    return torch::tensor(values, torch::kFloat32);
  }();
  return map;
}

absl::Status ValidateNf4(const Nf4Tensor& q) {
  if (auto s = CheckBlocksize(q.blocksize); !s.ok()) return s;
  const int64_t n = q.numel();
  if (n <= 0) return absl::InvalidArgumentError("shape has no elements");
  const Nf4PartBytes want = Nf4Parts(n, q.blocksize);
  auto check = [&](const torch::Tensor& t, const char* name, torch::ScalarType dtype,
                   int64_t numel) -> absl::Status {
    if (!t.defined() || t.scalar_type() != dtype || t.dim() != 1 || t.numel() != numel ||
        !t.is_contiguous() || t.device() != q.data.device()) {
      return absl::InvalidArgumentError(absl::StrCat(
          name, " must be a contiguous 1-D ", c10::toString(dtype), " tensor of ", numel,
          " elements on the device of data"));
    }
    return absl::OkStatus();
  };
  if (!q.data.defined()) return absl::InvalidArgumentError("data is undefined");
  if (auto s = check(q.data, "data", torch::kUInt8, want.data_bytes); !s.ok()) return s;
  if (auto s = check(q.absmax_code, "absmax_code", torch::kUInt8, want.absmax_code_bytes);
      !s.ok()) {
    return s;
  }
  return check(q.absmax_scale, "absmax_scale", torch::kFloat32, want.absmax_scale_bytes / 4);
}

namespace {

absl::Status CheckQuantizable(const torch::Tensor& weight) {
  if (!weight.defined() || weight.numel() == 0) {
    return absl::InvalidArgumentError("weight is empty; NF4 needs at least one element");
  }
  const torch::ScalarType dtype = weight.scalar_type();
  if (dtype != torch::kFloat32 && dtype != torch::kBFloat16 && dtype != torch::kFloat16) {
    return absl::InvalidArgumentError(absl::StrCat("weight dtype ", c10::toString(dtype),
                                                   " cannot be quantized; allowed: fp32, bf16, fp16"));
  }
  if (!torch::isfinite(weight).all().item<bool>()) {
    return absl::InvalidArgumentError("weight has non-finite values; NF4 needs finite ones");
  }
  return absl::OkStatus();
}

// The 4-bit pass over `flat`, elements [first, first + flat.numel()) of a weight of `numel`
// elements (first a multiple of blocksize; the range ends on a block boundary or at numel):
// each block's absmax into `absmax` (its blocks, from 0) and, when `data` is defined, the packed
// codes into it (its bytes, from 0). Every value depends only on its own block, so any range gives
// the bytes the whole weight gives there ([Sharded NF4 loading]).
void QuantizeBlocks(const torch::Tensor& flat, int64_t first, int64_t numel, int64_t blocksize,
                    const torch::Tensor& absmax, const torch::Tensor& data) {
  const int64_t n = flat.numel();
  const bool ends_partial = first + n == numel && numel % blocksize != 0;
  const int64_t full_elems = ends_partial ? n - numel % blocksize : n;
  const torch::Tensor bounds = data.defined() ? Nf4Bounds(flat.device()) : torch::Tensor();
  // Packs fp32 values already scaled to [-1, 1] (even count) into data from byte `first_byte`.
  auto pack = [&](const torch::Tensor& scaled, int64_t first_byte) {
    if (!data.defined()) return;
    const torch::Tensor codes = torch::bucketize(scaled, bounds, /*out_int32=*/true).to(torch::kUInt8);
    const torch::Tensor pairs = codes.view({-1, 2});
    const torch::Tensor bytes =
        torch::bitwise_or(torch::bitwise_left_shift(pairs.select(1, 0), 4), pairs.select(1, 1));
    data.slice(0, first_byte, first_byte + bytes.numel()).copy_(bytes);
  };
  for (int64_t start = 0; start < full_elems; start += kQuantizeSliceElems) {
    const int64_t end = std::min(start + kQuantizeSliceElems, full_elems);
    const torch::Tensor x = flat.slice(0, start, end).to(torch::kFloat32).view({-1, blocksize});
    const torch::Tensor am = x.abs().amax(1);
    absmax.slice(0, start / blocksize, end / blocksize).copy_(am);
    if (!data.defined()) continue;
    // bitsandbytes: A * (1.0 / absmax.clamp(min=1e-38)); 1.0 / t is t.reciprocal() in torch.
    const torch::Tensor scaled =
        (x * am.clamp_min(1e-38).reciprocal().unsqueeze(1)).clamp(-1.0, 1.0).view({-1});
    pack(scaled, start / 2);
  }
  if (ends_partial) {
    // The trailing partial block: bitsandbytes divides by its (clamped) absmax and stores the
    // clamped value; an odd count pads with 0, whose code is that of 0.0.
    const torch::Tensor x = flat.slice(0, full_elems).to(torch::kFloat32);
    const torch::Tensor am = x.abs().max().clamp_min(1e-38);
    absmax.slice(0, full_elems / blocksize).fill_(am);
    torch::Tensor scaled = (x / am).clamp(-1.0, 1.0);
    if (scaled.numel() % 2 != 0) scaled = torch::constant_pad_nd(scaled, {0, 1}, 0);
    pack(scaled, full_elems / 2);
  }
}

// Double quantization of every block's absmax (the whole weight's).
Nf4AbsmaxState DoubleQuantize(const torch::Tensor& absmax) {
  const torch::Tensor offset = absmax.mean();
  auto [codes, scales] = QuantizeDynamic8(absmax - offset, kNf4AbsmaxBlocksize);
  return {codes.contiguous(), scales.contiguous(), offset.item<float>()};
}

torch::TensorOptions On(const torch::Device& device, torch::ScalarType dtype) {
  return torch::TensorOptions().dtype(dtype).device(device);
}

}  // namespace

absl::StatusOr<Nf4Tensor> QuantizeNf4(const torch::Tensor& weight, int64_t blocksize) {
  if (auto s = CheckBlocksize(blocksize); !s.ok()) return s;
  if (auto s = CheckQuantizable(weight); !s.ok()) return s;
  torch::NoGradGuard no_grad;
  const torch::Tensor flat = weight.detach().reshape({-1});
  const int64_t n = flat.numel();
  Nf4Tensor q;
  q.shape = weight.sizes().vec();
  q.blocksize = blocksize;
  q.data = torch::empty({(n + 1) / 2}, On(flat.device(), torch::kUInt8));
  const torch::Tensor absmax =
      torch::empty({(n + blocksize - 1) / blocksize}, On(flat.device(), torch::kFloat32));
  QuantizeBlocks(flat, 0, n, blocksize, absmax, q.data);
  Nf4AbsmaxState state = DoubleQuantize(absmax);
  q.absmax_code = std::move(state.absmax_code);
  q.absmax_scale = std::move(state.absmax_scale);
  q.absmax_offset = state.absmax_offset;
  return q;
}

absl::StatusOr<Nf4AbsmaxState> QuantizeNf4Absmax(const torch::Tensor& weight, int64_t blocksize) {
  if (auto s = CheckBlocksize(blocksize); !s.ok()) return s;
  if (auto s = CheckQuantizable(weight); !s.ok()) return s;
  torch::NoGradGuard no_grad;
  const torch::Tensor flat = weight.detach().reshape({-1});
  const torch::Tensor absmax = torch::empty({(flat.numel() + blocksize - 1) / blocksize},
                                            On(flat.device(), torch::kFloat32));
  QuantizeBlocks(flat, 0, flat.numel(), blocksize, absmax, torch::Tensor());
  return DoubleQuantize(absmax);
}

absl::StatusOr<torch::Tensor> QuantizeNf4Blocks(const torch::Tensor& values, int64_t first_block,
                                                int64_t numel, int64_t blocksize) {
  if (auto s = CheckBlocksize(blocksize); !s.ok()) return s;
  if (auto s = CheckQuantizable(values); !s.ok()) return s;
  const int64_t first = first_block * blocksize;
  const int64_t n = values.numel();
  if (first_block < 0 || first + n > numel || (first + n != numel && n % blocksize != 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "elements [", first, ", ", first + n, ") of a weight of ", numel,
        " are not whole blocks of ", blocksize, " (or the weight's last ones)"));
  }
  torch::NoGradGuard no_grad;
  const torch::Tensor flat = values.detach().reshape({-1});
  const torch::Tensor data = torch::empty({(n + 1) / 2}, On(flat.device(), torch::kUInt8));
  const torch::Tensor absmax =
      torch::empty({(n + blocksize - 1) / blocksize}, On(flat.device(), torch::kFloat32));
  QuantizeBlocks(flat, first, numel, blocksize, absmax, data);
  return data;
}

torch::Tensor DequantizeAbsmax(const Nf4Tensor& q) {
  torch::NoGradGuard no_grad;
  const torch::Device device = q.device();
  const int64_t blocks = q.absmax_code.numel();
  const torch::Tensor values =
      DynamicMap8Bit().to(device).index_select(0, q.absmax_code.to(torch::kInt64));
  const torch::Tensor scale =
      q.absmax_scale.repeat_interleave(kNf4AbsmaxBlocksize).slice(0, 0, blocks);
  return (values * scale).add_(q.absmax_offset);
}

torch::Tensor DequantizeNf4Ops(const Nf4Tensor& q, torch::ScalarType out_dtype) {
  torch::NoGradGuard no_grad;
  const torch::Device device = q.device();
  const int64_t n = q.numel();
  const int64_t bs = q.blocksize;
  torch::Tensor out = torch::empty({n}, torch::TensorOptions().dtype(out_dtype).device(device));
  const torch::Tensor absmax = DequantizeAbsmax(q);
  const torch::Tensor table = Nf4Table(device);
  for (int64_t start = 0; start < n; start += kNf4OpsSliceElems) {
    const int64_t end = std::min(start + kNf4OpsSliceElems, n);
    const torch::Tensor bytes = q.data.slice(0, start / 2, (end + 1) / 2);
    // Unpacked codes in element order: high nibble first.
    const torch::Tensor codes =
        torch::stack({torch::bitwise_right_shift(bytes, 4), torch::bitwise_and(bytes, 15)}, 1)
            .view({-1})
            .slice(0, 0, end - start);
    const torch::Tensor scale =
        absmax.slice(0, start / bs, (end + bs - 1) / bs).repeat_interleave(bs).slice(0, 0, end - start);
    out.slice(0, start, end).copy_(table.index_select(0, codes.to(torch::kInt64)) * scale);
  }
  return out.view(q.shape);
}

bool Nf4CudaKernelBuilt() {
#ifdef MEMPLAN_NF4_CUDA
  return true;
#else
  return false;
#endif
}

absl::StatusOr<torch::Tensor> DequantizeNf4Kernel(const Nf4Tensor& q,
                                                  torch::ScalarType out_dtype) {
#ifdef MEMPLAN_NF4_CUDA
  if (!q.device().is_cuda()) {
    return absl::FailedPreconditionError("the NF4 CUDA kernel needs CUDA tensors");
  }
  Nf4OutType type;
  switch (out_dtype) {
    case torch::kFloat32:
      type = Nf4OutType::kFloat32;
      break;
    case torch::kBFloat16:
      type = Nf4OutType::kBFloat16;
      break;
    case torch::kFloat16:
      type = Nf4OutType::kFloat16;
      break;
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          "out_dtype ", c10::toString(out_dtype), " is not allowed; allowed: fp32, bf16, fp16"));
  }
  const c10::cuda::CUDAGuard guard(q.device());
  torch::Tensor out =
      torch::empty(q.shape, torch::TensorOptions().dtype(out_dtype).device(q.device()));
  // One copy of the 1 KiB map per device, kept for the process (never destroyed: at exit the
  // CUDA allocator may be gone before static destructors run).
  static std::mutex mu;
  static auto* maps = new std::map<int, torch::Tensor>();
  torch::Tensor map;
  {
    std::lock_guard<std::mutex> lock(mu);
    torch::Tensor& m = (*maps)[q.device().index()];
    if (!m.defined()) m = DynamicMap8Bit().to(q.device());
    map = m;
  }
  const int err = LaunchNf4Dequant(
      q.data.data_ptr<uint8_t>(), q.absmax_code.data_ptr<uint8_t>(),
      q.absmax_scale.data_ptr<float>(), map.data_ptr<float>(), q.absmax_offset, q.numel(),
      q.blocksize, out.data_ptr(), type, c10::cuda::getCurrentCUDAStream(q.device().index()).stream());
  if (err != 0) {
    return absl::InternalError(absl::StrCat("NF4 dequantization kernel launch failed: CUDA error ", err));
  }
  return out;
#else
  (void)q;
  (void)out_dtype;
  return absl::FailedPreconditionError("this build has no NF4 CUDA kernel (nvcc was not found)");
#endif
}

torch::Tensor DequantizeNf4(const Nf4Tensor& q, torch::ScalarType out_dtype) {
  if (Nf4CudaKernelBuilt() && q.device().is_cuda()) {
    absl::StatusOr<torch::Tensor> out = DequantizeNf4Kernel(q, out_dtype);
    TORCH_CHECK(out.ok(), out.status().ToString());
    return *std::move(out);
  }
  return DequantizeNf4Ops(q, out_dtype);
}

}  // namespace memplan::quant
