// Chunk layout: parameters packed in execution order (embedding, blocks 0..N-1, final norm +
// LM head; a tied LM head counts once, with the embedding) into chunks of a nominal size.
// When the trace's architecture lists its parameters (every Llama-family preset and HF config),
// the layout is the agent's own (common/chunk_packing.h: whole parameters, 256-byte aligned, a
// parameter larger than the chunk size in an oversized chunk of its own), so chunk counts and
// sizes are the ones the runtime will allocate. Otherwise stages are split byte-wise over chunks.
// Thread-compatible value type; pure computation.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/chunk_packing.h"
#include "common/types.h"

namespace memplan {

struct ChunkLayout {
  int64_t chunk_bytes = 0;  // nominal size; oversized chunks are larger
  // Per chunk: bytes it occupies (param dtype, alignment gaps included: what the agent allocates
  // for it) and the trainable parameter bytes in it.
  std::vector<int64_t> chunk_param_bytes;
  std::vector<int64_t> chunk_trainable_bytes;
  // Per chunk: holds one parameter larger than chunk_bytes (the agent gives such a chunk a
  // device buffer of its own when it is not persistent).
  std::vector<bool> chunk_oversized;
  // Per stage (0 = embedding, 1..N = blocks, N+1 = head): first and last chunk it uses.
  // Consecutive stages share at most one chunk; ranges are non-decreasing.
  std::vector<int32_t> stage_first_chunk;
  std::vector<int32_t> stage_last_chunk;
  // [Grad staging slots] (common/chunk_packing.h), from the agent's packing (empty when the
  // stages were split byte-wise): element f = the size of one slot when chunks [f, num_chunks())
  // are offloaded (GradSlotBytesByFirstOffloaded).
  std::vector<int64_t> grad_slot_bytes_by_first_offloaded;
  // LayoutFingerprint of the agent's packing ([Layout fingerprint], common/chunk_packing.h);
  // empty when the stages were split byte-wise (no parameter list: the agent's layout unknown).
  std::string fingerprint;

  int32_t num_chunks() const { return static_cast<int32_t>(chunk_param_bytes.size()); }
};

// Parameter bytes per stage (embedding, blocks, head) as the trace records them.
std::vector<int64_t> StageParamBytes(const Trace& trace);
// Trainable parameter bytes per stage: everything for full fine-tuning; for LoRA and QLoRA the
// adapters, spread evenly over the blocks (embedding and head are frozen).
std::vector<int64_t> StageTrainableBytes(const Trace& trace);

// The agent's alignment of every parameter inside its chunk (ChunkManagerOptions).
inline constexpr int64_t kChunkAlignmentBytes = 256;

// Packs the trace's parameters into chunks of `chunk_bytes` (> 0), with the agent's rule when
// ArchMatchesTrace(trace), else stage by stage.
ChunkLayout LayoutChunks(const Trace& trace, int64_t chunk_bytes);
// Whether the architecture's parameter list (common/param_shapes.h) has exactly the trace's
// per-stage parameter bytes, so that the agent's packing rule can be applied to it.
bool ArchMatchesTrace(const Trace& trace);
// The packing LayoutChunks uses when ArchMatchesTrace(trace) (the parameter list of every chunk,
// [Parameter order]); nullopt otherwise.
std::optional<ChunkPacking> ArchPacking(const Trace& trace, int64_t chunk_bytes);
// Bytes of the largest parameter inside a transformer block (0 when !ArchMatchesTrace): chunk
// sizes below it make every such parameter an oversized chunk.
int64_t LargestBlockParamBytes(const Trace& trace);

// Copy of `trace` with chunk_bytes / chunk_param_bytes set from `layout`.
Trace WithChunkLayout(const Trace& trace, const ChunkLayout& layout);

}  // namespace memplan
