#include "planner/cost/chunk_layout.h"

#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "common/chunk_packing.h"
#include "common/lora_shapes.h"
#include "common/nf4_bytes.h"
#include "common/param_shapes.h"

namespace memplan {
namespace {

// The architecture's parameters in [Parameter order] (common/param_shapes.h), the list the agent
// packs, when they have exactly the trace's per-stage parameter bytes; nullopt otherwise.
std::optional<std::vector<LayoutParam>> MatchingArchParams(const Trace& trace) {
  const ModelSpec& a = trace.arch;
  const int num_blocks = static_cast<int>(trace.blocks.size());
  if (a.num_layers != num_blocks || a.hidden_size <= 0 || a.vocab_size <= 0 || a.num_heads <= 0 ||
      a.num_kv_heads <= 0 || a.intermediate_size <= 0) {
    return std::nullopt;
  }
  const int64_t dtype = DTypeBytes(trace.param_dtype);
  std::vector<int64_t> want = StageParamBytes(trace);
  // A LoRA or QLoRA trace's blocks count their adapters too; the agent packs those in chunks of
  // their own ([LoRA managers], common/lora_shapes.h), so the base list matches the rest.
  for (const LayoutParam& p : LoraLayoutParams(a, trace.training, dtype)) {
    if (p.group < 0 || p.group >= static_cast<int>(want.size())) return std::nullopt;
    want[p.group] -= p.numel * p.dtype_bytes;
  }
  std::vector<int64_t> got(want.size(), 0);
  // QLoRA's base holds NF4 parts in place of its projections ([QLoRA layout], common/nf4_bytes.h).
  std::vector<LayoutParam> params = trace.training.kind == TrainingKind::kQlora
                                        ? QloraBaseLayoutParams(a, dtype)
                                        : LayoutParamsFor(a, dtype);
  for (const LayoutParam& p : params) {
    if (p.group < 0 || p.group >= static_cast<int>(got.size())) return std::nullopt;
    got[p.group] += p.numel * p.dtype_bytes;
  }
  if (got != want) return std::nullopt;
  return params;
}

// The agent's rule. Trainable bytes: every parameter for full fine-tuning; for LoRA and QLoRA the
// stage's trainable share, spread over its chunks in proportion to their parameter bytes (the
// cost model prices the adapters' own chunks instead where the architecture is known).
absl::StatusOr<ChunkPacking> Pack(const std::vector<LayoutParam>& params, int64_t chunk_bytes) {
  ChunkPackingOptions options;
  options.chunk_bytes = chunk_bytes;
  options.alignment_bytes = kChunkAlignmentBytes;
  return ChunkPacking::Build(params, options);
}

ChunkLayout AgentLayout(const Trace& trace, const std::vector<LayoutParam>& params,
                        int64_t chunk_bytes) {
  absl::StatusOr<ChunkPacking> packing = Pack(params, chunk_bytes);
  ChunkLayout layout;
  layout.chunk_bytes = chunk_bytes;
  if (!packing.ok()) return layout;  // not reached: the list has unique names, ordered groups
  layout.fingerprint = packing->fingerprint();
  const std::vector<int64_t> stage_params = StageParamBytes(trace);
  const std::vector<int64_t> stage_trainable = StageTrainableBytes(trace);
  const size_t stages = stage_params.size();
  layout.stage_first_chunk.assign(stages, -1);
  layout.stage_last_chunk.assign(stages, -1);
  layout.chunk_param_bytes.assign(packing->num_chunks(), 0);
  layout.chunk_trainable_bytes.assign(packing->num_chunks(), 0);
  layout.chunk_oversized.assign(packing->num_chunks(), false);
  for (int c = 0; c < packing->num_chunks(); ++c) {
    layout.chunk_param_bytes[c] = packing->chunks()[c].size_bytes;
    layout.chunk_oversized[c] = packing->chunks()[c].oversized;
  }
  layout.grad_slot_bytes_by_first_offloaded = packing->GradSlotBytesByFirstOffloaded();
  for (size_t i = 0; i < params.size(); ++i) {
    const ParamSlot& slot = packing->slots()[i];
    const size_t s = static_cast<size_t>(params[i].group);
    int64_t train = 0;
    if (stage_params[s] == stage_trainable[s]) {
      train = slot.size_bytes;
    } else {
      train = static_cast<int64_t>(static_cast<__int128>(stage_trainable[s]) * slot.size_bytes /
                                   std::max<int64_t>(stage_params[s], 1));
    }
    layout.chunk_trainable_bytes[slot.chunk] += train;
    if (layout.stage_first_chunk[s] < 0) layout.stage_first_chunk[s] = slot.chunk;
    layout.stage_first_chunk[s] = std::min(layout.stage_first_chunk[s], slot.chunk);
    layout.stage_last_chunk[s] = std::max(layout.stage_last_chunk[s], slot.chunk);
  }
  return layout;
}

}  // namespace

bool ArchMatchesTrace(const Trace& trace) { return MatchingArchParams(trace).has_value(); }

std::optional<ChunkPacking> ArchPacking(const Trace& trace, int64_t chunk_bytes) {
  std::optional<std::vector<LayoutParam>> params = MatchingArchParams(trace);
  if (!params) return std::nullopt;
  absl::StatusOr<ChunkPacking> packing = Pack(*params, chunk_bytes);
  if (!packing.ok()) return std::nullopt;
  return *std::move(packing);
}

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
  if (trace.training.kind == TrainingKind::kFull) return bytes;
  const int64_t n = static_cast<int64_t>(trace.blocks.size());
  const int64_t per_block =
      n > 0 ? trace.trainable_param_count * DTypeBytes(trace.param_dtype) / n : 0;
  for (size_t s = 0; s < bytes.size(); ++s) {
    const bool is_block = s >= 1 && s + 1 < bytes.size();
    bytes[s] = is_block ? std::min(per_block, bytes[s]) : 0;
  }
  return bytes;
}

int64_t LargestBlockParamBytes(const Trace& trace) {
  const std::optional<std::vector<LayoutParam>> params = MatchingArchParams(trace);
  if (!params) return 0;
  const int last_block = static_cast<int>(trace.blocks.size());
  int64_t largest = 0;
  for (const LayoutParam& p : *params) {
    if (p.group >= 1 && p.group <= last_block) largest = std::max(largest, p.numel * p.dtype_bytes);
  }
  return largest;
}

ChunkLayout LayoutChunks(const Trace& trace, int64_t chunk_bytes) {
  if (std::optional<std::vector<LayoutParam>> params = MatchingArchParams(trace)) {
    return AgentLayout(trace, *params, chunk_bytes);
  }
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
  layout.chunk_oversized.assign(layout.chunk_param_bytes.size(), false);
  return layout;
}

Trace WithChunkLayout(const Trace& trace, const ChunkLayout& layout) {
  Trace out = trace;
  out.chunk_bytes = layout.chunk_bytes;
  out.chunk_param_bytes = layout.chunk_param_bytes;
  return out;
}

}  // namespace memplan
