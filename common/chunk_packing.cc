#include "common/chunk_packing.h"

#include <algorithm>
#include <set>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace memplan {
namespace {

int64_t AlignUp(int64_t value, int64_t alignment) {
  return (value + alignment - 1) / alignment * alignment;
}

// Builds chunks incrementally; `open` is the chunk parameters are currently added to.
class Packer {
 public:
  Packer(const ChunkPackingOptions& options, std::vector<ChunkInfo>* chunks,
         std::vector<ParamSlot>* slots)
      : options_(options), chunks_(chunks), slots_(slots) {}

  // End offset of the chunk after appending params [begin, end) at `start`.
  int64_t EndAfter(const std::vector<LayoutParam>& params, int begin, int end,
                   int64_t start) const {
    int64_t cursor = start;
    for (int i = begin; i < end; ++i) {
      cursor = AlignUp(cursor, options_.alignment_bytes) + Bytes(params[i]);
    }
    return cursor;
  }

  void PackGroup(const std::vector<LayoutParam>& params, int begin, int end) {
    const int64_t used = open_ ? chunks_->back().size_bytes : 0;
    if (open_ && EndAfter(params, begin, end, used) <= options_.chunk_bytes) {
      for (int i = begin; i < end; ++i) Place(params, i);
      return;
    }
    if (EndAfter(params, begin, end, 0) <= options_.chunk_bytes) {
      // Keeping a block whole in one chunk is worth the unused tail of the previous chunk:
      // its parameters then move in one transfer.
      Close();
      for (int i = begin; i < end; ++i) Place(params, i);
      return;
    }
    for (int i = begin; i < end; ++i) {
      if (Bytes(params[i]) > options_.chunk_bytes) {
        Close();
        Place(params, i);
        chunks_->back().oversized = true;
        Close();
        continue;
      }
      if (open_ && EndAfter(params, i, i + 1, chunks_->back().size_bytes) > options_.chunk_bytes) {
        Close();
      }
      Place(params, i);
    }
  }

 private:
  static int64_t Bytes(const LayoutParam& p) { return p.numel * p.dtype_bytes; }

  void Close() { open_ = false; }

  void Place(const std::vector<LayoutParam>& params, int i) {
    if (!open_) {
      chunks_->push_back(ChunkInfo{});
      chunks_->back().first_group = params[i].group;
      open_ = true;
    }
    ChunkInfo& chunk = chunks_->back();
    const int64_t offset = AlignUp(chunk.size_bytes, options_.alignment_bytes);
    ParamSlot& slot = (*slots_)[i];
    slot.chunk = static_cast<int>(chunks_->size()) - 1;
    slot.offset_bytes = offset;
    slot.size_bytes = Bytes(params[i]);
    slot.group = params[i].group;
    chunk.size_bytes = offset + slot.size_bytes;
    chunk.last_group = params[i].group;
    chunk.params.push_back(i);
  }

  const ChunkPackingOptions& options_;
  std::vector<ChunkInfo>* chunks_;
  std::vector<ParamSlot>* slots_;
  bool open_ = false;
};

// FNV-1a, 64 bit.
class Fnv1a {
 public:
  void Bytes(const void* data, size_t n) {
    const auto* p = static_cast<const unsigned char*>(data);
    for (size_t i = 0; i < n; ++i) {
      hash_ ^= p[i];
      hash_ *= 0x100000001b3ull;
    }
  }
  // Little-endian whatever the host, so fingerprints agree across machines.
  void Int(int64_t value) {
    unsigned char le[8];
    const auto u = static_cast<uint64_t>(value);
    for (int i = 0; i < 8; ++i) le[i] = static_cast<unsigned char>(u >> (8 * i));
    Bytes(le, sizeof(le));
  }
  uint64_t value() const { return hash_; }

 private:
  uint64_t hash_ = 0xcbf29ce484222325ull;
};

}  // namespace

std::string LayoutFingerprint(const std::vector<LayoutParam>& params,
                              const ChunkPackingOptions& options) {
  Fnv1a h;
  h.Int(static_cast<int64_t>(params.size()));
  for (const LayoutParam& p : params) {
    h.Int(static_cast<int64_t>(p.name.size()));
    h.Bytes(p.name.data(), p.name.size());
    h.Int(p.numel);
    h.Int(p.dtype_bytes);
    h.Int(p.group);
  }
  h.Int(options.chunk_bytes);
  h.Int(options.alignment_bytes);
  return absl::StrFormat("%016x", h.value());
}

absl::StatusOr<ChunkPacking> ChunkPacking::Build(const std::vector<LayoutParam>& params,
                                               const ChunkPackingOptions& options) {
  if (options.chunk_bytes <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk_bytes: must be positive, got ", options.chunk_bytes));
  }
  if (options.alignment_bytes <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("alignment_bytes: must be positive, got ", options.alignment_bytes));
  }
  std::set<std::string> names;
  for (size_t i = 0; i < params.size(); ++i) {
    const LayoutParam& p = params[i];
    if (p.numel < 0 || p.dtype_bytes <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("params[", i, "] (", p.name, "): numel must be >= 0 and dtype_bytes > 0"));
    }
    if (i > 0 && p.group < params[i - 1].group) {
      return absl::InvalidArgumentError(
          absl::StrCat("params[", i, "] (", p.name, "): group ", p.group, " follows group ",
                       params[i - 1].group, "; parameters must be in execution order"));
    }
    if (!names.insert(p.name).second) {
      return absl::InvalidArgumentError(absl::StrCat(
          "params[", i, "]: name ", p.name, " appears twice; pass each tensor once (first use)"));
    }
  }

  ChunkPacking layout;
  layout.options_ = options;
  layout.fingerprint_ = LayoutFingerprint(params, options);
  layout.params_ = params;
  layout.slots_.resize(params.size());
  Packer packer(options, &layout.chunks_, &layout.slots_);
  const int n = static_cast<int>(params.size());
  for (int begin = 0; begin < n;) {
    int end = begin;
    while (end < n && params[end].group == params[begin].group) ++end;
    packer.PackGroup(params, begin, end);
    begin = end;
  }
  return layout;
}

int64_t ChunkPacking::TotalBytes() const { return RangeBytes(0, num_chunks()); }

int64_t ChunkPacking::RangeBytes(int first, int last) const {
  int64_t total = 0;
  for (int c = std::max(first, 0); c < std::min(last, num_chunks()); ++c) {
    total += chunks_[c].size_bytes;
  }
  return total;
}

int64_t ChunkPacking::GradSlotParamBytes(int param) const {
  const int64_t a = options_.alignment_bytes;
  return (slots_[param].size_bytes + a - 1) / a * a;
}

bool ChunkPacking::IsBlockGroup(int group) const {
  return !params_.empty() && group > params_.front().group && group < params_.back().group;
}

std::vector<int64_t> ChunkPacking::GradSlotBytesByFirstOffloaded() const {
  // Walk the chunks from the last: each step offloads one more chunk, so every group's sum only
  // grows, and the running maximum is the answer for that first offloaded chunk.
  std::vector<int64_t> result(num_chunks() + 1, 0);
  std::vector<int64_t> by_group(params_.empty() ? 0 : params_.back().group + 1, 0);
  int64_t largest = 0;
  for (int c = num_chunks() - 1; c >= 0; --c) {
    for (int i : chunks_[c].params) {
      const int g = params_[i].group;
      if (!IsBlockGroup(g)) continue;
      by_group[g] += GradSlotParamBytes(i);
      largest = std::max(largest, by_group[g]);
    }
    result[c] = largest;
  }
  return result;
}

std::vector<int64_t> ChunkPacking::GradSlotOffsets(int first_offloaded) const {
  std::vector<int64_t> offsets(params_.size(), -1);
  std::vector<int64_t> end(params_.empty() ? 0 : params_.back().group + 1, 0);
  for (size_t i = 0; i < params_.size(); ++i) {
    const int g = params_[i].group;
    if (slots_[i].chunk < first_offloaded || !IsBlockGroup(g)) continue;
    offsets[i] = end[g];
    end[g] += GradSlotParamBytes(static_cast<int>(i));
  }
  return offsets;
}

int64_t ChunkPacking::MaxChunkBytesFrom(int first) const {
  int64_t largest = 0;
  for (int c = std::max(first, 0); c < num_chunks(); ++c) {
    largest = std::max(largest, chunks_[c].size_bytes);
  }
  return largest;
}

int64_t ChunkPacking::MaxRegularChunkBytes() const {
  int64_t largest = 0;
  for (const ChunkInfo& c : chunks_) {
    if (!c.oversized) largest = std::max(largest, c.size_bytes);
  }
  return largest;
}

std::vector<int> ChunkPacking::ChunksOfGroup(int group) const {
  std::vector<int> result;
  for (int c = 0; c < num_chunks(); ++c) {
    for (int i : chunks_[c].params) {
      if (slots_[i].group == group) {
        result.push_back(c);
        break;
      }
    }
  }
  return result;
}

std::vector<int64_t> PersistentGatherBytesByNPersist(
    const std::vector<std::vector<int>>& chunks_used, const std::vector<int64_t>& gathered_bytes) {
  const int count = static_cast<int>(gathered_bytes.size());
  // For one pair of adjacent groups, the bytes held when chunks [0, np) are persistent only grow
  // with np, by each chunk of the pair from np = c + 1 on. So the maximum over pairs at np is the
  // largest partial sum whose last chunk is below np: record each partial sum at c + 1, then take
  // a running maximum.
  std::vector<int64_t> result(count + 1, 0);
  // One group alone is a "pair" too.
  for (size_t g = 0; g < chunks_used.size() && (g == 0 || g + 1 < chunks_used.size()); ++g) {
    std::vector<int> held = chunks_used[g];
    if (g + 1 < chunks_used.size()) {
      held.insert(held.end(), chunks_used[g + 1].begin(), chunks_used[g + 1].end());
    }
    std::sort(held.begin(), held.end());
    held.erase(std::unique(held.begin(), held.end()), held.end());
    int64_t sum = 0;
    for (int c : held) {
      if (c < 0 || c >= count) continue;
      sum += gathered_bytes[c];
      result[c + 1] = std::max(result[c + 1], sum);
    }
  }
  for (int np = 1; np <= count; ++np) result[np] = std::max(result[np], result[np - 1]);
  return result;
}

}  // namespace memplan
