// The vision tower's bytes and flops for one micro-batch of images: the one description of what
// the agent's tower (agent/model/vision_tower.cc, run by LlamaModel::EmbedInputs in parameter
// group 0) allocates, which the planner's analytic trace charges (planner/cost/analytic_trace.cc)
// and tests/agent/model/vision_memory_test.cc measures on the CPU. Torch-free.
//
// [Vision tower bytes] Per patch (N patches of the micro-batch, d the model dtype's bytes, Hv, Iv
// the tower's widths, hd its head size, nh its heads, u = spatial_merge_size²):
// - the pixel values stay on the device in fp32 until group 0's backward (the group's body holds
//   them), whether the tower trains or not;
// - a frozen tower (LoRA: the base, tower included, is frozen) records no autograd graph: it
//   keeps nothing, and only its transients count (the largest: a block's 2-D rotary embedding,
//   computed in fp32 beside q, k and the fused qkv projection);
// - a trained tower (full fine-tuning) keeps, per block, 8·Hv + 11·d·Hv + 4·nh + 8 + 4·d·Iv bytes
//   (two RMSNorms: fp32 input, cast normalised value, output, rstd; qkv whole, as v is a view of
//   it; q and k rotated; the attention output per window and concatenated, logsumexp; SwiGLU's
//   four [N, Iv] tensors), the rotary tables 8·hd, the merger's 4·Hv + 4·d·Hv + 4, the
//   pixel values cast to the dtype (d < 4) and the two int64 window orders.
// - a trained tower whose blocks are checkpointed ([Vision block checkpointing],
//   agent/model/vision_tower.cc) keeps per block only its input, d·Hv, in place of the block's
//   saved set; each block runs again in backward, where its whole saved set and output live
//   while its gradients are computed, one block at a time.
// Qwen2-VL's tower (common/vision_kind.h) differs in three terms: each LayerNorm keeps
// 2·d·Hv + 8 (input, output, fp32 mean and rstd) where an RMSNorm keeps 4·Hv + 2·d·Hv + 4; its
// QuickGELU MLP keeps 3·d·Iv (fc1's output, the sigmoid, their product); no window orders.
// What reaches the language model is the merged embeddings, scattered into the image tokens' rows
// of the embedding output: those rows are part of seq_len, so nothing beyond the tower's output
// (freed after the scatter) is added there.
#pragma once

#include <cstdint>

#include "common/types.h"

namespace memplan {

// Patches along each side of an image of height x width pixels. Each side is rounded up to a
// multiple of patch_size · spatial_merge_size: Qwen's processor resizes to such a multiple (the
// nearest), the agent's synthetic images are multiples already; rounding up never under-counts.
struct VisionGrid {
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t patches() const { return rows * cols; }
};
VisionGrid VisionGridFor(const VisionSpec& v, int64_t height, int64_t width);

// Parameters of the tower (VisionParamShapes' total); 0 without a tower.
int64_t VisionTowerParamCount(const ModelSpec& model);

struct VisionTowerCost {
  int64_t images = 0;        // per micro-batch
  int64_t patches = 0;       // per micro-batch
  int64_t image_tokens = 0;  // merged patches: the language model's image tokens
  int64_t param_count = 0;
  int64_t param_bytes = 0;
  // fp32 pixel values on the device, held from the forward to group 0's backward.
  int64_t pixel_bytes = 0;
  // What the tower's autograd keeps for backward (0 when frozen), beyond the pixel values.
  int64_t saved_bytes = 0;
  // Largest live bytes beyond saved_bytes (and the pixel values) while the tower runs: a frozen
  // tower's stages walked statement by statement; a trained tower's bounded by its end and its
  // last rotation, as if its whole saved set were already allocated.
  int64_t forward_transient_bytes = 0;
  // The tower's output: [image_tokens, out_hidden_size] in the dtype, freed after the scatter.
  int64_t output_bytes = 0;
  // Trained tower: largest live bytes of its backward beyond its saved set and its parameters'
  // gradients; 0 when frozen (no backward runs through it).
  int64_t backward_transient_bytes = 0;
  double forward_flops = 0;
  double backward_flops = 0;   // 0 when frozen; with checkpointed blocks, their recompute included
  double recompute_flops = 0;  // of backward_flops: the checkpointed blocks' second forward
  // Elementwise traffic (each activation written and read once in forward; twice that in
  // backward), priced at the memory rate like the blocks'.
  double forward_traffic_bytes = 0;
  double backward_traffic_bytes = 0;
};

// The tower's cost for `images` images of height x width pixels in one micro-batch, parameters in
// `dtype`, trained (full fine-tuning) or frozen, its blocks checkpointed or kept (a frozen tower
// records nothing, so `checkpoint_blocks` changes nothing for it). `model` must be a valid
// vision-language spec. Byte figures saturate at 2^60.
VisionTowerCost VisionTowerCostFor(const ModelSpec& model, int64_t images, int64_t height,
                                   int64_t width, DType dtype, bool trains,
                                   bool checkpoint_blocks = false);

}  // namespace memplan
