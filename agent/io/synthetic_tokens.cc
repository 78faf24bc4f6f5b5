#include "agent/io/synthetic_tokens.h"

#include <cmath>
#include <numeric>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/validate.h"

namespace memplan::io {
namespace {

// splitmix64 stream: fixed arithmetic, so the same seed gives the same file everywhere.
class SplitMix {
 public:
  explicit SplitMix(uint64_t seed) : state_(seed) {}
  uint64_t Next() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  // Uniform in [0, n) by rejection (no modulo bias).
  uint64_t Below(uint64_t n) {
    const uint64_t limit = UINT64_MAX - UINT64_MAX % n;
    uint64_t x;
    do {
      x = Next();
    } while (x >= limit);
    return x % n;
  }
  // Uniform in [0, 1) with 53 bits.
  double Unit() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }

 private:
  uint64_t state_;
};

}  // namespace

absl::StatusOr<std::vector<uint32_t>> MakeSyntheticTokens(const SyntheticTokenOptions& options) {
  if (options.vocab_size < 1 || options.vocab_size > kMaxVocabSize) {
    return absl::InvalidArgumentError(absl::StrCat(
        "vocab_size = ", options.vocab_size, " is out of range; allowed [1, ", kMaxVocabSize, "]"));
  }
  if (options.num_tokens < 0 || options.num_tokens > (int64_t{1} << 36)) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_tokens = ", options.num_tokens, " is out of range; allowed [0, 2^36]"));
  }
  if (!(options.noise >= 0.0 && options.noise <= 1.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("noise = ", options.noise, " is out of range; allowed [0, 1]"));
  }
  SplitMix rng(options.seed);
  const uint64_t vocab = static_cast<uint64_t>(options.vocab_size);
  // Fisher-Yates over the vocabulary: the successor table.
  std::vector<uint32_t> successor(vocab);
  std::iota(successor.begin(), successor.end(), 0u);
  for (uint64_t i = vocab; i > 1; --i) std::swap(successor[i - 1], successor[rng.Below(i)]);

  std::vector<uint32_t> tokens(static_cast<size_t>(options.num_tokens));
  uint32_t current = static_cast<uint32_t>(rng.Below(vocab));
  for (int64_t i = 0; i < options.num_tokens; ++i) {
    tokens[i] = current;
    current =
        rng.Unit() < options.noise ? static_cast<uint32_t>(rng.Below(vocab)) : successor[current];
  }
  return tokens;
}

}  // namespace memplan::io
