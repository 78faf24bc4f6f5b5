#include "planner/cost/chunk_layout.h"

#include <algorithm>

namespace memplan {

std::vector<int64_t> StageParamBytes(const Trace& trace) {
  std::vector<int64_t> bytes;
  bytes.reserve(trace.blocks.size() + 2);
  bytes.push_back(trace.embedding.param_bytes);
  for (const BlockTrace& b : trace.blocks) bytes.push_back(b.param_bytes);
  bytes.push_back(trace.head.param_bytes);
  return bytes;
}

std::vector<int64_t> StageTrainableBytes(const Trace& trace) {
  std::vector<int64_t> bytes = StageParamBytes(trace);
  if (trace.training.kind != TrainingKind::kLora) return bytes;
  const int64_t n = static_cast<int64_t>(trace.blocks.size());
  const int64_t per_block =
      n > 0 ? trace.trainable_param_count * DTypeBytes(trace.param_dtype) / n : 0;
  for (size_t s = 0; s < bytes.size(); ++s) {
    const bool is_block = s >= 1 && s + 1 < bytes.size();
    bytes[s] = is_block ? std::min(per_block, bytes[s]) : 0;
  }
  return bytes;
}

ChunkLayout LayoutChunks(const Trace& trace, int64_t chunk_bytes) {
  ChunkLayout layout;
  layout.chunk_bytes = chunk_bytes;
  const std::vector<int64_t> params = StageParamBytes(trace);
  const std::vector<int64_t> trainable = StageTrainableBytes(trace);
  layout.stage_first_chunk.resize(params.size());
  layout.stage_last_chunk.resize(params.size());
  int64_t fill = 0;
  auto open_chunk = [&]() {
    layout.chunk_param_bytes.push_back(0);
    layout.chunk_trainable_bytes.push_back(0);
    fill = 0;
  };
  open_chunk();
  for (size_t s = 0; s < params.size(); ++s) {
    const int64_t p = params[s];
    // A stage that does not fit in the open chunk starts a fresh one, so that a block's
    // parameters share a chunk with as few other stages as possible.
    if (p > chunk_bytes - fill && fill > 0) open_chunk();
    layout.stage_first_chunk[s] = static_cast<int32_t>(layout.chunk_param_bytes.size()) - 1;
    int64_t remaining = p;
    int64_t train_left = trainable[s];
    while (true) {
      const int64_t part = std::min(remaining, chunk_bytes - fill);
      // Trainable bytes follow the parameter bytes proportionally; the last piece takes the
      // rounding remainder so per-stage totals are exact.
      const int64_t train = part == remaining
                                ? train_left
                                : static_cast<int64_t>(static_cast<__int128>(trainable[s]) * part /
                                                       std::max<int64_t>(p, 1));
      layout.chunk_param_bytes.back() += part;
      layout.chunk_trainable_bytes.back() += train;
      fill += part;
      remaining -= part;
      train_left -= train;
      if (remaining == 0) break;
      open_chunk();
    }
    layout.stage_last_chunk[s] = static_cast<int32_t>(layout.chunk_param_bytes.size()) - 1;
  }
  return layout;
}

Trace WithChunkLayout(const Trace& trace, const ChunkLayout& layout) {
  Trace out = trace;
  out.chunk_bytes = layout.chunk_bytes;
  out.chunk_param_bytes = layout.chunk_param_bytes;
  return out;
}

}  // namespace memplan
