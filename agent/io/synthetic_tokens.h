// Synthetic, learnable token streams for demos and tests: token[i+1] = successor[token[i]]
// (a seeded random permutation of the vocabulary), replaced with probability `noise` by a
// uniformly random id. A model that learns the successor table drives its loss towards the noise
// entropy; noise = 1 gives i.i.d. uniform tokens (loss ln(vocab)). Deterministic across platforms.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"

namespace memplan::io {

struct SyntheticTokenOptions {
  int64_t num_tokens = 0;
  int64_t vocab_size = 0;  // ids in [0, vocab_size), vocab_size in [1, kMaxVocabSize]
  uint64_t seed = 0;
  double noise = 0.1;  // in [0, 1]
};

absl::StatusOr<std::vector<uint32_t>> MakeSyntheticTokens(const SyntheticTokenOptions& options);

}  // namespace memplan::io
