// ChunkPacking: packs parameters into fixed-size chunks in execution order (torch-free).
// The planner's cost model must use the same rule to predict chunk sizes and counts:
//
//  [Chunk packing rule]
//  * Input: each distinct parameter tensor once, at its first use, in execution order
//    (group 0 = embedding, 1..N = blocks, N+1 = final norm + LM head). A tied LM head weight
//    is the embedding's tensor, so it is packed once, in the embedding's chunk.
//  * A parameter occupies numel * dtype_bytes bytes starting at an offset rounded up to
//    alignment_bytes inside its chunk; a chunk's size is the end of its last parameter (no tail
//    padding), so host memory for a chunk is exactly that size.
//  * Groups are never split when they fit in an empty chunk: if the whole group (with alignment)
//    does not fit in the space left in the current chunk, the current chunk is closed and the
//    group starts a new one.
//  * A group larger than chunk_bytes is packed parameter by parameter, continuing the current
//    chunk and opening a new chunk whenever the next parameter does not fit.
//  * A parameter larger than chunk_bytes gets an oversized chunk of its own (size = its bytes);
//    the chunk before it is closed and the next parameter starts a new chunk.
// Thread-compatible value type.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace memplan {

struct LayoutParam {
  std::string name;
  int64_t numel = 0;
  int64_t dtype_bytes = 0;
  int group = 0;  // non-decreasing along the input
};

struct ChunkPackingOptions {
  int64_t chunk_bytes = int64_t{64} << 20;
  int64_t alignment_bytes = 256;
};

// Where one parameter lives.
struct ParamSlot {
  int chunk = 0;
  int64_t offset_bytes = 0;  // from the start of the chunk, a multiple of alignment_bytes
  int64_t size_bytes = 0;    // numel * dtype_bytes
  int group = 0;
};

struct ChunkInfo {
  int64_t size_bytes = 0;  // end of the last parameter: the exact bytes the chunk needs
  bool oversized = false;  // holds a single parameter larger than chunk_bytes
  int first_group = 0;
  int last_group = 0;
  std::vector<int> params;  // indices into the input, in packing order
};

// [Grad staging slots] With one rank, the grads of a transformer block's offloaded parameters
// are produced in one of kGradStagingSlots device slots (block group g uses slot g % slots),
// copied to the host from there, and the slot is reused two groups later, once that copy is done.
// Autograd accumulates into a grad that is already defined, so the slot is what it writes: the
// grads no longer come and go between the activations of backward (each block's freed grads left
// holes that the caching allocator covered with new memory: reserved up to 2.4 GB above allocated
// on an H200 for llama-3.2-3b 7x1536 with 105 of 113 chunks offloaded). The embedding's and the
// head's grads (once per step, at the two ends of backward) and a parameter several groups use are
// not staged in slots (the planner prices those two inside the head's and the embedding's
// backward phases). The planner charges kGradStagingSlots x GradSlotBytes(n_persist); the agent
// allocates exactly that.
inline constexpr int kGradStagingSlots = 2;

// [Layout fingerprint] 16 lowercase hex digits: FNV-1a (64 bit) of the ordered
// (name, numel, dtype_bytes, group) list, chunk_bytes and alignment_bytes. Equal fingerprints mean
// the same packing input, hence the same chunks; the planner puts it in every plan
// (ResidencyPlan::layout_fingerprint) and the agent refuses a plan whose fingerprint is not the
// one of the layout it builds. Stable across builds and machines (no std::hash).
std::string LayoutFingerprint(const std::vector<LayoutParam>& params,
                              const ChunkPackingOptions& options);

// [Sharded persistent parameters] The gathered bytes a rank holds at most: Acquire(g) keeps
// group g's sharded persistent chunks and the next group's, so the most held at once is the
// largest pair of adjacent groups' chunks. `chunks_used[g]`: the chunks holding group g's
// parameters, any use (a tied LM head's group lists the embedding's chunks); `gathered_bytes[c]`:
// chunk c's bytes once gathered (padded for the world size). Element np of the result, np in
// [0, gathered_bytes.size()], counts only chunks [0, np) (the persistent ones). The planner (from
// its stage ranges) and the agent (from its modules' groups) both read it: one rule for both.
std::vector<int64_t> PersistentGatherBytesByNPersist(
    const std::vector<std::vector<int>>& chunks_used, const std::vector<int64_t>& gathered_bytes);

class ChunkPacking {
 public:
  // INVALID_ARGUMENT for a non-positive chunk size or alignment, negative sizes, decreasing
  // groups, or a repeated name.
  static absl::StatusOr<ChunkPacking> Build(const std::vector<LayoutParam>& params,
                                           const ChunkPackingOptions& options);

  const std::vector<ChunkInfo>& chunks() const { return chunks_; }
  const std::vector<ParamSlot>& slots() const { return slots_; }  // indexed like the input
  const std::vector<LayoutParam>& params() const { return params_; }  // the input
  const ChunkPackingOptions& options() const { return options_; }
  int num_chunks() const { return static_cast<int>(chunks_.size()); }
  // LayoutFingerprint(params, options) of the input: what a plan carries to name this layout.
  const std::string& fingerprint() const { return fingerprint_; }

  // Sum of all chunk sizes.
  int64_t TotalBytes() const;
  // Sum of the sizes of chunks [first, last).
  int64_t RangeBytes(int first, int last) const;
  // Largest chunk size among chunks [first, num_chunks()); 0 when the range is empty.
  int64_t MaxChunkBytesFrom(int first) const;
  // Largest size among chunks that are not oversized (at most chunk_bytes); 0 if none.
  int64_t MaxRegularChunkBytes() const;
  // Chunks holding parameters of `group` (first use only), ascending.
  std::vector<int> ChunksOfGroup(int group) const;
  // [Grad staging slots] A parameter's bytes in a slot: its size rounded up to the alignment.
  int64_t GradSlotParamBytes(int param) const;
  // Whether `group` is a transformer block's: neither the first (embedding) nor the last (final
  // norm and head) group of the input.
  bool IsBlockGroup(int group) const;
  // The size of one slot when chunks [first_offloaded, num_chunks()) are offloaded: the largest
  // sum of GradSlotParamBytes over one block group's parameters in those chunks (0 when none);
  // element f of the result is the size for first_offloaded = f, f in [0, num_chunks()].
  std::vector<int64_t> GradSlotBytesByFirstOffloaded() const;
  // Where each parameter's grad sits in its group's slot when chunks [first_offloaded,
  // num_chunks()) are offloaded: byte offsets, indexed like the input, each group's parameters
  // packed in input order from 0, GradSlotParamBytes apart; -1 for a parameter that is not
  // staged in a slot (in a persistent chunk, or not a block group's). The largest group's end is
  // GradSlotBytesByFirstOffloaded()[first_offloaded]. What the agent lays its slots out by.
  std::vector<int64_t> GradSlotOffsets(int first_offloaded) const;

 private:
  ChunkPackingOptions options_;
  std::string fingerprint_;
  std::vector<LayoutParam> params_;
  std::vector<ChunkInfo> chunks_;
  std::vector<ParamSlot> slots_;
};

}  // namespace memplan
