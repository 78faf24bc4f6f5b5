// TokenBatcher: deterministic language-model batches from a TokenFile. The file is cut into
// W = (num_tokens - 1) / seq_len windows of seq_len + 1 tokens (window w starts at w * seq_len);
// sample g of the run (g = (step * world_size + rank) * batch_size + row) is window
// Permute_epoch(g mod W) of epoch g / W, where each epoch uses its own seeded bijection of [0, W).
// Same seed -> same batches on every run and machine; the data wraps around epoch after epoch.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "agent/io/token_file.h"

namespace memplan::io {

struct TokenBatcherOptions {
  uint64_t seed = 0;
  int64_t batch_size = 1;  // rows per micro-batch on this rank
  int64_t seq_len = 0;
  int rank = 0;  // data-parallel rank: ranks read disjoint rows of the same global batch
  int world_size = 1;
  bool shuffle = true;  // false: windows in file order (epoch after epoch)
};

// input_ids[r][t] = token(window_start + t), labels[r][t] = token(window_start + t + 1).
struct TokenBatch {
  int64_t batch_size = 0;
  int64_t seq_len = 0;
  std::vector<int64_t> input_ids;  // row-major [batch_size, seq_len]
  std::vector<int64_t> labels;     // row-major [batch_size, seq_len]
  std::vector<int64_t> windows;    // the window index of each row
};

// Thread-safe (const after Create).
class TokenBatcher {
 public:
  // INVALID_ARGUMENT when the file has fewer than seq_len + 1 tokens or options are out of range.
  static absl::StatusOr<std::unique_ptr<TokenBatcher>> Create(std::shared_ptr<const TokenFile> file,
                                                              const TokenBatcherOptions& options);

  int64_t num_windows() const { return num_windows_; }
  const TokenBatcherOptions& options() const { return options_; }

  // Window index of `row` of micro-batch `step` (step >= 0).
  int64_t WindowOf(int64_t step, int64_t row) const;
  // Fills input_ids and labels (batch_size * seq_len each) for micro-batch `step`.
  absl::Status Fill(int64_t step, int64_t* input_ids, int64_t* labels) const;
  absl::StatusOr<TokenBatch> Batch(int64_t step) const;

 private:
  TokenBatcher(std::shared_ptr<const TokenFile> file, const TokenBatcherOptions& options,
               int64_t num_windows);

  std::shared_ptr<const TokenFile> file_;
  TokenBatcherOptions options_;
  int64_t num_windows_;
};

// A seeded bijection of [0, n) (a 4-round Feistel network with cycle walking): the shuffle the
// batcher uses, exposed for tests. n >= 1, 0 <= index < n.
int64_t PermuteIndex(int64_t index, int64_t n, uint64_t key);

}  // namespace memplan::io
