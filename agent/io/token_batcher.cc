#include "agent/io/token_batcher.h"

#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace memplan::io {
namespace {

// splitmix64: a fixed, platform-independent mixer (std:: distributions are implementation-defined,
// which would make batches differ between standard libraries).
uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

int HalfBits(int64_t n) {
  int bits = 0;
  while (bits < 62 && (int64_t{1} << bits) < n) ++bits;
  return (bits + 1) / 2;
}

int64_t Feistel(int64_t x, int half_bits, uint64_t key) {
  const uint64_t mask = (uint64_t{1} << half_bits) - 1;
  uint64_t left = static_cast<uint64_t>(x) >> half_bits;
  uint64_t right = static_cast<uint64_t>(x) & mask;
  for (uint64_t round = 0; round < 4; ++round) {
    const uint64_t f = Mix(right ^ Mix(key + round)) & mask;
    const uint64_t next = left ^ f;
    left = right;
    right = next;
  }
  return static_cast<int64_t>((left << half_bits) | right);
}

}  // namespace

int64_t PermuteIndex(int64_t index, int64_t n, uint64_t key) {
  if (n <= 1) return 0;
  const int half_bits = HalfBits(n);
  // The Feistel network permutes [0, 4^half_bits) ⊇ [0, n); walking the cycle until we land back
  // inside [0, n) restricts it to a permutation of [0, n). The domain is < 4n, so few steps.
  int64_t x = index;
  do {
    x = Feistel(x, half_bits, key);
  } while (x >= n);
  return x;
}

TokenBatcher::TokenBatcher(std::shared_ptr<const TokenFile> file,
                           const TokenBatcherOptions& options, int64_t num_windows)
    : file_(std::move(file)), options_(options), num_windows_(num_windows) {}

absl::StatusOr<std::unique_ptr<TokenBatcher>> TokenBatcher::Create(
    std::shared_ptr<const TokenFile> file, const TokenBatcherOptions& options) {
  if (file == nullptr) return absl::InvalidArgumentError("token file is null");
  if (options.seq_len < 1 || options.seq_len > (int64_t{1} << 24)) {
    return absl::InvalidArgumentError(
        absl::StrCat("seq_len = ", options.seq_len, " is out of range; allowed [1, 2^24]"));
  }
  if (options.batch_size < 1 || options.batch_size > (int64_t{1} << 16)) {
    return absl::InvalidArgumentError(
        absl::StrCat("batch_size = ", options.batch_size, " is out of range; allowed [1, 65536]"));
  }
  if (options.world_size < 1 || options.rank < 0 || options.rank >= options.world_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rank = ", options.rank, " must be in [0, world_size = ", options.world_size, ")"));
  }
  if (file->num_tokens() < options.seq_len + 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "token file has ", file->num_tokens(), " tokens; a sequence of seq_len = ", options.seq_len,
        " needs at least ", options.seq_len + 1, " (inputs plus the next token)"));
  }
  const int64_t windows = (file->num_tokens() - 1) / options.seq_len;
  return std::unique_ptr<TokenBatcher>(new TokenBatcher(std::move(file), options, windows));
}

int64_t TokenBatcher::WindowOf(int64_t step, int64_t row) const {
  // Sample indices are computed modulo-safely: step * world * batch overflows only after
  // ~2^63 samples, far beyond any run; clamp defensively rather than wrap.
  const int64_t per_step = options_.batch_size * options_.world_size;
  const int64_t max_step = std::numeric_limits<int64_t>::max() / per_step - 1;
  const int64_t s = step < 0 ? 0 : (step > max_step ? max_step : step);
  const int64_t g = s * per_step + options_.rank * options_.batch_size + row;
  const int64_t epoch = g / num_windows_;
  const int64_t position = g % num_windows_;
  if (!options_.shuffle || num_windows_ == 1) return position;
  const uint64_t key = Mix(options_.seed ^ Mix(static_cast<uint64_t>(epoch)));
  return PermuteIndex(position, num_windows_, key);
}

absl::Status TokenBatcher::Fill(int64_t step, int64_t* input_ids, int64_t* labels) const {
  if (step < 0) return absl::InvalidArgumentError(absl::StrCat("step = ", step, " < 0"));
  const int64_t seq = options_.seq_len;
  std::vector<int64_t> window(static_cast<size_t>(seq + 1));
  for (int64_t row = 0; row < options_.batch_size; ++row) {
    const int64_t w = WindowOf(step, row);
    RETURN_IF_ERROR(file_->Read(w * seq, seq + 1, window.data()));
    for (int64_t t = 0; t < seq; ++t) {
      input_ids[row * seq + t] = window[t];
      labels[row * seq + t] = window[t + 1];
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<TokenBatch> TokenBatcher::Batch(int64_t step) const {
  TokenBatch batch;
  batch.batch_size = options_.batch_size;
  batch.seq_len = options_.seq_len;
  batch.input_ids.resize(static_cast<size_t>(options_.batch_size * options_.seq_len));
  batch.labels.resize(batch.input_ids.size());
  RETURN_IF_ERROR(Fill(step, batch.input_ids.data(), batch.labels.data()));
  for (int64_t row = 0; row < options_.batch_size; ++row) {
    batch.windows.push_back(WindowOf(step, row));
  }
  return batch;
}

}  // namespace memplan::io
