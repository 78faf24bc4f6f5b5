// The configurations of sharded_memory_test: shared by the test (the planner's side) and
// sharded_memory_worker (one rank's ChunkManager). A tiny model (4 blocks of ~121 KiB in fp32)
// under chunk sizes that give regular, partly filled and oversized chunks, every optimizer, both
// dtypes, persistent chunks (all of them in one case) and accumulation. n_buffer is what a valid
// plan holds (at least the planner's MinBuffers(n_persist)).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/types.h"

namespace memplan::testing {

struct MemoryCase {
  std::string name;
  bool bf16 = false;
  OptimizerKind optimizer = OptimizerKind::kAdamW;
  int n_persist = 0;
  int n_buffer = 2;
  int grad_accum = 1;
  int64_t chunk_bytes = 128 << 10;
  bool tied = false;
  // Several ranks: [Sharded persistent state], and [Sharded persistent parameters] with it.
  bool shard_state = false;
  bool shard_params = false;
};

inline std::vector<MemoryCase> MemoryCases() {
  using O = OptimizerKind;
  return {
      {"fp32_adamw_offloaded", false, O::kAdamW, 0, 2, 1, 128 << 10, false},
      {"bf16_adamw_persist1_accum2_tied", true, O::kAdamW, 1, 2, 2, 96 << 10, true},
      {"bf16_adamw_bf16_all_persistent", true, O::kAdamWBf16States, 2, 2, 2, 200 << 10, false},
      {"bf16_adamw_bf16_persist1", true, O::kAdamWBf16States, 1, 2, 2, 200 << 10, false},
      {"fp32_sgd_oversized", false, O::kSgd, 0, 5, 1, 64 << 10, false},
      {"bf16_sgd_persist3_accum3", true, O::kSgd, 3, 2, 3, 128 << 10, false},
      {"bf16_adamw_persist3_state_sharded", true, O::kAdamW, 3, 2, 1, 96 << 10, false, true},
      {"bf16_adamw_persist4_params_sharded_tied",
       true, O::kAdamW, 4, 2, 2, 96 << 10, true, true, true},
      {"fp32_sgd_all_persistent_params_sharded",
       false, O::kSgd, 99, 2, 1, 64 << 10, false, true, true},
  };
}

}  // namespace memplan::testing
