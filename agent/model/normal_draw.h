// Synthetic initial values: normal(0, 0.02) draws that any range of can be drawn alone.
//
// [Segmented draws] A normal draw of more than kDrawSegment elements is made of segments of
// kDrawSegment elements, segment j drawn from its own generator: segment 0 from the whole draw's
// seed (so a parameter of at most kDrawSegment elements has the values one draw gives it), the
// others from that seed mixed with j. Any range then draws only the segments around it, and the
// segments draw in parallel: a 70B QLoRA base, read by ranges on each rank, no longer draws every
// weight whole on one thread.
#pragma once

#include <cstdint>

#include "agent/core/torch_pch.h"

namespace memplan {

inline constexpr int64_t kDrawSegment = int64_t{1} << 22;

// Elements [begin, begin + len) of the segmented normal(0, 0.02) draw seeded by `seed` over
// `numel` elements, flat, drawn on up to `max_threads` threads; in `dtype`, each value the fp32
// draw's rounded to it (another dtype holds at most one fp32 segment per thread beside the
// result, not an fp32 copy of the range: 4.7 GB -> 1.6 GB while drawing qwen3-32b's embedding).
torch::Tensor DrawNormalRange(uint64_t seed, int64_t numel, int64_t begin, int64_t len,
                              int max_threads, torch::ScalarType dtype = torch::kFloat32);

}  // namespace memplan
