// QLoRA's 4-bit NF4 base, in bytes: what one NF4 tensor occupies, which weights QLoRA quantizes and
// the transient of dequantizing one. The one definition the agent stores by (agent/quant) and the
// planner charges (planner/cost). Torch-free.
//
// [NF4 storage] A weight of n elements, as bitsandbytes' quantize_4bit(quant_type="nf4",
// blocksize=64, compress_statistics=True) keeps it:
//   data          uint8 [ceil(n/2)]      two 4-bit codes per byte, element 2k in the high nibble
//   absmax_code   uint8 [ceil(n/64)]     each 64-element block's absmax, 8-bit dynamic code of
//                                        (absmax - offset) (double quantization)
//   absmax_scale  fp32  [ceil(n/16384)]  the absmax of each 256 consecutive (absmax - offset)
// plus one fp32 offset (the mean absmax) per tensor, which the agent keeps on the host. In a
// chunk the three parts are three parameters of the packing ([Chunk packing rule]), each starting
// at an aligned offset.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/chunk_packing.h"
#include "common/types.h"

namespace memplan {

inline constexpr int64_t kNf4Blocksize = 64;         // elements per absmax
inline constexpr int64_t kNf4AbsmaxBlocksize = 256;  // absmax values per fp32 scale

struct Nf4PartBytes {
  int64_t data_bytes = 0;
  int64_t absmax_code_bytes = 0;
  int64_t absmax_scale_bytes = 0;
  constexpr int64_t total() const { return data_bytes + absmax_code_bytes + absmax_scale_bytes; }
};

constexpr Nf4PartBytes Nf4Parts(int64_t numel, int64_t blocksize = kNf4Blocksize) {
  const int64_t blocks = (numel + blocksize - 1) / blocksize;
  return {(numel + 1) / 2, blocks,
          4 * ((blocks + kNf4AbsmaxBlocksize - 1) / kNf4AbsmaxBlocksize)};
}

// Bytes an NF4 tensor spans inside a chunk when its parts follow each other, each starting at a
// multiple of `alignment_bytes` (the last part's tail is not padded, as a chunk's last parameter).
constexpr int64_t Nf4ChunkSpanBytes(int64_t numel, int64_t alignment_bytes,
                                    int64_t blocksize = kNf4Blocksize) {
  const Nf4PartBytes p = Nf4Parts(numel, blocksize);
  auto up = [alignment_bytes](int64_t b) {
    return (b + alignment_bytes - 1) / alignment_bytes * alignment_bytes;
  };
  return up(p.data_bytes) + up(p.absmax_code_bytes) + p.absmax_scale_bytes;
}

// Suffixes of the three parts' names in a chunk layout: "<weight name><suffix>".
inline constexpr std::string_view kNf4DataSuffix = ".nf4_data";
inline constexpr std::string_view kNf4AbsmaxCodeSuffix = ".nf4_absmax_code";
inline constexpr std::string_view kNf4AbsmaxScaleSuffix = ".nf4_absmax_scale";
// Whether a layout name is one of the three parts of a quantized weight.
inline bool IsNf4PartName(std::string_view name) {
  return name.ends_with(kNf4DataSuffix) || name.ends_with(kNf4AbsmaxCodeSuffix) ||
         name.ends_with(kNf4AbsmaxScaleSuffix);
}

// [QLoRA quantized weights] As PEFT + bitsandbytes QLoRA (BitsAndBytesConfig(load_in_4bit=True,
// bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True)) on a Llama-family model: every
// block's q/k/v/o/gate/up/down projection weight is NF4; their biases (qwen2), the norms, the
// embedding and the LM head stay in the model dtype. `name` is a Hugging Face parameter name.
bool QloraQuantizes(std::string_view name);

// [QLoRA layout] The frozen base of a QLoRA model as the chunk packing's input:
// LayoutParamsFor(model, dtype_bytes) in [Parameter order] with every quantized weight replaced
// by its three parts (data and absmax codes 1 byte wide, scales 4 bytes wide), named with the
// suffixes above. What the agent's frozen base manager packs (LlamaModel::ParamGroups with an NF4
// base) and the planner charges; the adapters are packed in chunks of their own, as for LoRA
// ([LoRA adapter order], common/lora_shapes.h).
std::vector<LayoutParam> QloraBaseLayoutParams(const ModelSpec& model, int64_t dtype_bytes);

// Bytes of a block's frozen base under QLoRA: the NF4 parts of its projections plus its other
// parameters in the model dtype (no alignment).
int64_t QloraBlockBaseBytes(const ModelSpec& model, int64_t dtype_bytes);

// [Dequantization transient] A block's NF4 projections are dequantized one at a time, right
// before their matmul, into a model-dtype copy freed after it (forward, recompute and backward
// alike: the backward dequantizes again instead of keeping the copy). The most this holds at
// once is the copy of the block's largest projection, named here.
struct DequantTransient {
  std::string projection;  // e.g. "mlp.gate_proj"
  int64_t bytes = 0;       // numel * dtype_bytes
};
DequantTransient QloraDequantTransient(const ModelSpec& model, int64_t dtype_bytes);
// Bytes one pass over a block's projections moves when it dequantizes each of them once: the NF4
// parts read plus the model-dtype copy written (the dequantization's memory traffic).
int64_t QloraBlockDequantTrafficBytes(const ModelSpec& model, int64_t dtype_bytes);

}  // namespace memplan
