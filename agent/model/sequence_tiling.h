// SequenceTiled: a row-wise function (the MLP) applied to a long sequence a tile of rows at a
// time, keeping only its input for backward ([Sequence-tiled MLP], common/mlp_tiling.h).
#pragma once

#include <cstdint>
#include <functional>

#include "agent/core/torch_pch.h"

namespace memplan {

// Row-wise: row r of the result depends on row r of the input only (and on parameters).
using RowFunction = std::function<torch::Tensor(const torch::Tensor& rows)>;

// fn(x) computed over `tile_rows` tokens at a time, x of shape [..., H] (leading dimensions are
// tokens). With autograd recording, the result is one node that saves x; its backward reruns fn
// on each tile with the forward's RNG state (LoRA dropout draws the same masks) and back-
// propagates the tile before the next one, accumulating parameter gradients into .grad as
// agent/blocks' groups do. `fn` must stay callable until that backward has run.
torch::Tensor SequenceTiled(const RowFunction& fn, const torch::Tensor& x, int64_t tile_rows);

}  // namespace memplan
