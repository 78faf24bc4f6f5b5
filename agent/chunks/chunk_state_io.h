// ChunkStateIO: reading and writing what the lower layers store, as ChunkManager's accessors
// define it (chunk_manager.h): parameters, gradients, optimizer state, checkpoint pieces and
// range loading. Owns nothing but the formats ([8-bit optimizer state], [Per-rank checkpoint
// pieces]). Promise: every call first waits for the work in flight; a load ends with every
// device buffer invalidated, so the next hook uploads the loaded values. Sharded, the reads
// gather over the ranks (collectives: every rank calls them). Not thread-safe. Private to
// agent/chunks.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "agent/chunks/chunk_collectives.h"
#include "agent/chunks/chunk_manager.h"
#include "agent/chunks/chunk_optimizer.h"
#include "agent/chunks/chunk_pager.h"
#include "agent/chunks/chunk_set.h"
#include "agent/core/torch_pch.h"

namespace memplan::chunks {

class ChunkStateIO {
 public:
  // The collaborators outlive this.
  ChunkStateIO(ChunkSet& set, ChunkCollectives& collectives, ChunkPager& pager,
               ChunkOptimizer& optimizer)
      : set_(set), collectives_(collectives), pager_(pager), optimizer_(optimizer) {}

  std::vector<NamedParam> ParamOrder() const;
  std::vector<NamedParam> Params();
  std::vector<NamedParam> Grads();
  std::vector<NamedParam> OptimizerState();
  absl::Status LoadParamsAndState(const std::vector<NamedParam>& values,
                                  const std::vector<NamedParam>& state);
  absl::StatusOr<std::vector<TensorPiece>> LocalPieces();
  absl::Status LoadRanges(const ChunkManager::RangeReader& read, bool with_state,
                          int parallel_reads);

 private:
  // [Loading] `flat` holds p's elements Stored(p) (any dtype): into the parameter (and master).
  void InstallParam(int i, const torch::Tensor& flat);
  // The same for its optimizer state (undefined m / v: fresh zeros; undefined master: kept) and
  // step count.
  void InstallState(int i, const torch::Tensor& m, const torch::Tensor& v,
                    const torch::Tensor& saved_master, int64_t step);
  // adamw8bit ([8-bit optimizer state]).
  void OptimizerState8bit(std::vector<NamedParam>& out);
  absl::Status LoadState8bit(const std::map<std::string, torch::Tensor>& by_key, int i,
                             bool fresh);

  ChunkSet& set_;
  ChunkCollectives& collectives_;
  ChunkPager& pager_;
  ChunkOptimizer& optimizer_;
};

}  // namespace memplan::chunks
