// Gemma 2's attention (soft-capped scores, its own scale) in query tiles: the one definition the
// agent's attention (SoftcapAttention, agent/model/attention.cc) and the planner's block terms
// (planner/cost/analytic_trace.cc) share. Torch-free, header-only.
//
// [Soft-capped attention tiles] Flash and memory-efficient SDPA kernels cannot apply
// tanh(s / cap) * cap to the scores between the product and the softmax, so a gemma2 layer
// computes its attention as transformers' eager path does (scores = q kᵀ · scale, capped, the
// causal or sliding-window mask added, softmax in fp32 cast back, times v), for every layer,
// capped or not. It runs in tiles of SoftcapTileRows() queries: tile [t, t + R) reads the keys
// [k0, t + R) (k0 = 0 for full attention, max(0, t - W + 1) within a window W), so no tensor
// grows with seq² and one tile's fp32 scores stay under kSoftcapTileScoreBytes. Grouped-query
// heads share their key/value head through a reshape of the tile's queries (no repeated keys).
// Forward runs the tiles without autograd into one output and keeps q, k and v alone; backward
// recomputes each tile under autograd and adds its key and value gradients into per-layer sums
// (fp32 for 16-bit models, each rounded once).
#pragma once

#include <algorithm>
#include <cstdint>

#include "common/sliding_window.h"
#include "common/types.h"

namespace memplan {

// fp32 scores of one tile, at most (a tile never drops below one query row).
inline constexpr int64_t kSoftcapTileScoreBytes = int64_t{64} << 20;

// Keys one query row may see: the window, or the whole sequence for full attention.
inline int64_t SoftcapKeySpan(int64_t window, int64_t seq) {
  return window > 0 ? std::min(window, seq) : seq;
}

// Query rows per tile for `batch` sequences of `seq` tokens and `heads` query heads.
inline int64_t SoftcapTileRows(int64_t batch, int64_t heads, int64_t seq, int64_t window) {
  const int64_t row_bytes = std::max<int64_t>(1, batch * heads * SoftcapKeySpan(window, seq) * 4);
  return std::clamp<int64_t>(kSoftcapTileScoreBytes / row_bytes, 1, std::max<int64_t>(seq, 1));
}

// Keys of the widest tile.
inline int64_t SoftcapTileKeys(int64_t rows, int64_t seq, int64_t window) {
  return window > 0 ? std::min(seq, window + rows - 1) : seq;
}

// Bytes a gemma2 layer's attention allocates beyond q, k, v, its output and (in backward) the
// output's gradient, as upper bounds of what is live at once (see [Soft-capped attention tiles]);
// E = batch · heads · rows · keys scores of one tile, d the model dtype's bytes:
struct SoftcapAttentionBytes {
  // Forward: the tile's mask (the band mask of [Sliding-window tiles]: padded rows in the dtype,
  // twice while a windowed one is built) and its queries regrouped, then two score tensors at a
  // time in the dtype, or the dtype's scores beside the fp32 softmax: E · (d + 4).
  int64_t forward_transient = 0;
  // Backward: the gradients of q, k, v, the fp32 key and value sums (16-bit models), and per
  // tile the recomputed graph's saved scores (tanh output and probabilities in the dtype, fp32
  // softmax: E · (2d + 4)) with the gradients flowing back through it (E · (2d + 8)), the mask,
  // the regrouped queries and their gradient.
  int64_t backward_transient = 0;
  int64_t tile_scores = 0;  // E
};

inline SoftcapAttentionBytes SoftcapAttentionMemory(const ModelSpec& m, int64_t window,
                                                    int64_t batch, int64_t seq, int64_t d) {
  SoftcapAttentionBytes b;
  const int64_t hq = m.num_heads * m.HeadDim();
  const int64_t hkv = m.num_kv_heads * m.HeadDim();
  const int64_t rows = SoftcapTileRows(batch, m.num_heads, seq, window);
  const int64_t keys = SoftcapTileKeys(rows, seq, window);
  const int64_t scores = batch * m.num_heads * rows * keys;
  const int64_t mask = (window > 0 ? 2 : 1) * rows * SlidingWindowMaskRowElems(keys) * d;
  const int64_t queries = batch * rows * hq * d;
  b.tile_scores = scores;
  b.forward_transient = mask + 2 * queries + scores * (d + 4);
  const int64_t sums = d < 4 ? 2 * batch * seq * hkv * 4 : 0;
  const int64_t tile = mask + 3 * queries + 2 * batch * keys * hkv * d + scores * (4 * d + 12);
  b.backward_transient = batch * seq * (hq + 2 * hkv) * d + sums + tile;
  return b;
}

}  // namespace memplan
