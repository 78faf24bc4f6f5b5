// Sliding-window attention in query tiles: the one definition the agent's attention
// (agent/model/attention.cc) and the planner's memory terms (planner/cost/analytic_trace.cc)
// share. Torch-free, header-only.
//
// [Sliding-window tiles] A layer with window W (ModelSpec::LayerWindow) lets the query at
// position i see the keys j with i - W < j <= i (transformers' sliding-window overlay on the
// causal mask). For a sequence of at most W tokens that is plain causal attention, which runs as
// such. A longer one runs in query tiles of SlidingWindowTileRows(W) rows: tile [t, t + T) reads
// the keys [max(0, t - W + 1), t + T) under an additive band mask in the model dtype (0 where a
// query sees the key, -inf elsewhere), so no tensor grows with seq² and a tile's scores span at
// most W + T - 1 keys. Forward runs the tiles without autograd into one output. Backward
// recomputes each tile under autograd and adds its key and value gradients into per-layer sums
// (fp32 for 16-bit models, so each sum is rounded once, as flash attention's are): what is kept
// for backward is q, k and v alone. Grouped-query layers repeat a tile's keys and values for
// every query head; in backward the repeated heads' gradients are summed back per kv head in the
// same dtype as the sums (so a 16-bit key gradient is rounded once, as one kernel over the whole
// sequence rounds it).
#pragma once

#include <algorithm>
#include <cstdint>

#include "common/types.h"

namespace memplan {

// Query rows per tile, at most: bounds the mask (rows x (W + rows - 1)) and a tile's key range
// for long windows, while the wasted (masked) share of a tile's scores stays below rows / W.
inline constexpr int64_t kSlidingWindowMaxTileRows = 1024;
// A mask row is allocated padded to this many elements: SDPA's memory-efficient kernel takes a
// mask whose row stride is a multiple of 16 as it is and copies any other into a padded one.
inline constexpr int64_t kSlidingWindowMaskRowAlignment = 16;

inline int64_t SlidingWindowTileRows(int64_t window) {
  return std::max<int64_t>(1, std::min(window, kSlidingWindowMaxTileRows));
}

inline int64_t SlidingWindowMaskRowElems(int64_t keys) {
  const int64_t a = kSlidingWindowMaskRowAlignment;
  return (keys + a - 1) / a * a;
}

// Whether a layer with window `window` (0: full attention) runs tiled at `seq` tokens.
inline bool SlidingWindowTiled(int64_t window, int64_t seq) { return window > 0 && seq > window; }

// Bytes the tiled attention of one layer allocates (see [Sliding-window tiles]) for a micro-batch
// of `batch` sequences of `seq` tokens in a model of dtype_bytes d; both 0 when the layer does not
// run tiled. Every term is an upper bound of what is live at once:
struct SlidingWindowAttentionBytes {
  // Forward, beside q, k, v and the output: the band mask (twice while it is built) and, per
  // tile, the keys and values repeated per query head (grouped-query layers) and the tile's
  // output before it is copied into the layer's.
  int64_t forward_transient = 0;
  // Backward, beside q, k, v, the output and its gradient: the gradients of q, k and v, the fp32
  // key and value sums (16-bit models), and per tile the mask (twice while built), the repeated
  // keys and values and their gradients, the tile's key and value gradients (summed over the
  // groups in fp32 for grouped layers), the recomputed output, its log-sum-exp, the tile's query
  // gradient and the kernel's fp32 query-gradient workspace.
  int64_t backward_transient = 0;
};

inline SlidingWindowAttentionBytes SlidingWindowAttentionMemory(const ModelSpec& m, int64_t window,
                                                                int64_t batch, int64_t seq,
                                                                int64_t d) {
  SlidingWindowAttentionBytes b;
  if (!SlidingWindowTiled(window, seq)) return b;
  const int64_t hq = m.num_heads * m.HeadDim();
  const int64_t hkv = m.num_kv_heads * m.HeadDim();
  const bool grouped = m.num_heads != m.num_kv_heads;
  const int64_t rows = std::min(seq, SlidingWindowTileRows(window));
  const int64_t keys = std::min(seq, window + rows - 1);
  const int64_t mask = 2 * rows * SlidingWindowMaskRowElems(keys) * d;
  const int64_t repeated = grouped ? 2 * batch * keys * hq * d : 0;
  b.forward_transient = mask + repeated + batch * rows * hq * d;
  const int64_t lse = batch * m.num_heads * ((rows + 31) / 32 * 32) * 4;
  const int64_t kv_grad_bytes = grouped ? std::max<int64_t>(d, 4) : d;
  const int64_t tile_grads = 2 * batch * keys * hkv * kv_grad_bytes + (grouped ? repeated : 0) +
                             batch * rows * hq * d + batch * rows * hq * 4;
  const int64_t tile = mask + repeated + batch * rows * hq * d + lse + tile_grads;
  const int64_t sums = d < 4 ? 2 * batch * seq * hkv * 4 : 0;
  b.backward_transient = batch * seq * (hq + 2 * hkv) * d + sums + tile;
  return b;
}

}  // namespace memplan
