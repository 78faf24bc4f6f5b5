#include "agent/io/synthetic_tokens.h"

#include <map>
#include <vector>

#include "gtest/gtest.h"

namespace memplan::io {
namespace {

TEST(SyntheticTokensTest, DeterministicInRangeAndSeeded) {
  SyntheticTokenOptions options{.num_tokens = 5000, .vocab_size = 97, .seed = 1, .noise = 0.1};
  absl::StatusOr<std::vector<uint32_t>> a = MakeSyntheticTokens(options);
  absl::StatusOr<std::vector<uint32_t>> b = MakeSyntheticTokens(options);
  options.seed = 2;
  absl::StatusOr<std::vector<uint32_t>> c = MakeSyntheticTokens(options);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  EXPECT_EQ(*a, *b);
  EXPECT_NE(*a, *c);
  for (uint32_t t : *a) ASSERT_LT(t, 97u);
}

TEST(SyntheticTokensTest, MostlyFollowsAFixedSuccessor) {
  absl::StatusOr<std::vector<uint32_t>> t =
      MakeSyntheticTokens({.num_tokens = 50000, .vocab_size = 50, .seed = 9, .noise = 0.1});
  ASSERT_TRUE(t.ok());
  // For each token, the most frequent next token should account for ~90% (+ noise share).
  std::map<uint32_t, std::map<uint32_t, int>> next;
  for (size_t i = 0; i + 1 < t->size(); ++i) ++next[(*t)[i]][(*t)[i + 1]];
  int64_t top = 0, total = 0;
  for (const auto& [token, counts] : next) {
    int best = 0;
    for (const auto& [n, c] : counts) {
      best = std::max(best, c);
      total += c;
    }
    top += best;
  }
  const double share = static_cast<double>(top) / static_cast<double>(total);
  EXPECT_GT(share, 0.88);
  EXPECT_LT(share, 0.93);
}

TEST(SyntheticTokensTest, RejectsBadOptions) {
  EXPECT_FALSE(MakeSyntheticTokens({.num_tokens = 10, .vocab_size = 0}).ok());
  EXPECT_FALSE(MakeSyntheticTokens({.num_tokens = -1, .vocab_size = 10}).ok());
  EXPECT_FALSE(MakeSyntheticTokens({.num_tokens = 10, .vocab_size = 10, .noise = 1.5}).ok());
  absl::StatusOr<std::vector<uint32_t>> empty =
      MakeSyntheticTokens({.num_tokens = 0, .vocab_size = 3});
  ASSERT_TRUE(empty.ok());
  EXPECT_TRUE(empty->empty());
}

}  // namespace
}  // namespace memplan::io
