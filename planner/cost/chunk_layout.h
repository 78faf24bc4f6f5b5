// Chunk layout: parameters packed in execution order (embedding, blocks 0..N-1, final norm +
// LM head; a tied LM head counts once, with the embedding) into fixed-size chunks. A stage's
// parameters go into one chunk where they fit; a stage larger than a chunk spans several.
// Thread-compatible value type; pure computation.
#pragma once

#include <cstdint>
#include <vector>

#include "common/types.h"

namespace memplan {

struct ChunkLayout {
  int64_t chunk_bytes = 0;
  // Per chunk: parameter bytes packed into it (param dtype) and the trainable share of them.
  std::vector<int64_t> chunk_param_bytes;
  std::vector<int64_t> chunk_trainable_bytes;
  // Per stage (0 = embedding, 1..N = blocks, N+1 = head): first and last chunk it uses.
  // Consecutive stages share at most one chunk; ranges are non-decreasing.
  std::vector<int32_t> stage_first_chunk;
  std::vector<int32_t> stage_last_chunk;

  int32_t num_chunks() const { return static_cast<int32_t>(chunk_param_bytes.size()); }
};

// Parameter bytes per stage (embedding, blocks, head) as the trace records them.
std::vector<int64_t> StageParamBytes(const Trace& trace);
// Trainable parameter bytes per stage: everything for full fine-tuning; for LoRA the adapters,
// spread evenly over the blocks (embedding and head are frozen).
std::vector<int64_t> StageTrainableBytes(const Trace& trace);

// Packs the trace's stages into chunks of `chunk_bytes` (> 0).
ChunkLayout LayoutChunks(const Trace& trace, int64_t chunk_bytes);

// Copy of `trace` with chunk_bytes / chunk_param_bytes set from `layout`.
Trace WithChunkLayout(const Trace& trace, const ChunkLayout& layout);

}  // namespace memplan
