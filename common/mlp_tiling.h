// The MLP in sequence tiles: the one definition the agent's model (agent/model/
// sequence_tiling.h, [Sequence-tiled MLP]) and the planner's block terms
// (planner/cost/analytic_trace.cc) share. Torch-free, header-only.
//
// [Sequence-tiled MLP] At long sequences a block's MLP intermediates (gate, up and their gated
// product: three [T, I] tensors, I = intermediate size) are most of what the block keeps for
// backward and of what its backward allocates: at 131 072 tokens of an 8 B model each is 3 GiB.
// When one of them would exceed kMlpTileThresholdBytes, the MLP runs MlpTileRows() tokens at a
// time and keeps only its input for backward; backward recomputes each tile's intermediates and
// back-propagates it before the next tile. The arithmetic per token is unchanged (row-wise
// products), so losses and gradients equal the untiled MLP's up to the order of the weight
// gradient's sums; the price is one more MLP forward per block in backward.
#pragma once

#include <algorithm>
#include <cstdint>

namespace memplan {

// One [T, I] intermediate above this many bytes tiles the MLP.
inline constexpr int64_t kMlpTileThresholdBytes = int64_t{2} << 30;
// Bytes of one [rows, I] intermediate of a tile, at most (a tile never drops below one row).
inline constexpr int64_t kMlpTileBytes = int64_t{256} << 20;

// Tokens per MLP tile for a micro-batch of `tokens` tokens of a model with intermediate size
// `intermediate` in a dtype of `dtype_bytes`; 0 when the MLP runs whole.
inline int64_t MlpTileRows(int64_t tokens, int64_t intermediate, int64_t dtype_bytes) {
  const int64_t row_bytes = std::max<int64_t>(intermediate * dtype_bytes, 1);
  if (tokens <= kMlpTileThresholdBytes / row_bytes) return 0;  // tokens x row_bytes, unoverflowed
  return std::max<int64_t>(1, kMlpTileBytes / row_bytes);
}

// Whether a micro-batch of `tokens` tokens runs the MLP in tiles under MlpTileRows().
inline bool MlpIsTiled(int64_t tokens, int64_t intermediate, int64_t dtype_bytes) {
  const int64_t rows = MlpTileRows(tokens, intermediate, dtype_bytes);
  return rows > 0 && rows < tokens;
}

}  // namespace memplan
