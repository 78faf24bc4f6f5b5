#include "agent/io/token_batcher.h"

#include <algorithm>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace memplan::io {
namespace {

using ::testing::HasSubstr;

// token i = i % 1000, so a window's content reveals where it came from.
std::shared_ptr<const TokenFile> Counting(int64_t n) {
  std::vector<uint32_t> tokens(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) tokens[i] = static_cast<uint32_t>(i % 1000);
  absl::StatusOr<std::string> bytes = EncodeTokenFile(tokens, 2, 1000);
  EXPECT_TRUE(bytes.ok());
  absl::StatusOr<std::unique_ptr<TokenFile>> f = TokenFile::Open(NewMemoryFile(*bytes), {});
  EXPECT_TRUE(f.ok());
  return std::shared_ptr<const TokenFile>(std::move(*f));
}

TEST(PermuteIndexTest, IsABijectionForManySizes) {
  for (int64_t n : {1, 2, 3, 5, 16, 17, 100, 1000, 4097}) {
    for (uint64_t key : {0ull, 1ull, 0xdeadbeefull}) {
      std::vector<bool> hit(static_cast<size_t>(n), false);
      for (int64_t i = 0; i < n; ++i) {
        const int64_t p = PermuteIndex(i, n, key);
        ASSERT_GE(p, 0);
        ASSERT_LT(p, n);
        ASSERT_FALSE(hit[p]) << "n=" << n << " key=" << key;
        hit[p] = true;
      }
    }
  }
}

TEST(PermuteIndexTest, KeysGiveDifferentOrders) {
  int differ = 0;
  for (int64_t i = 0; i < 100; ++i) differ += PermuteIndex(i, 100, 1) != PermuteIndex(i, 100, 2);
  EXPECT_GT(differ, 50);
}

TEST(TokenBatcherTest, LabelsAreInputsShiftedByOne) {
  auto file = Counting(1000);
  absl::StatusOr<std::unique_ptr<TokenBatcher>> b =
      TokenBatcher::Create(file, {.seed = 7, .batch_size = 4, .seq_len = 16});
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ((*b)->num_windows(), (1000 - 1) / 16);
  absl::StatusOr<TokenBatch> batch = (*b)->Batch(3);
  ASSERT_TRUE(batch.ok()) << batch.status();
  ASSERT_EQ(batch->input_ids.size(), 64u);
  for (int64_t row = 0; row < 4; ++row) {
    const int64_t start = batch->windows[row] * 16;
    for (int64_t t = 0; t < 16; ++t) {
      EXPECT_EQ(batch->input_ids[row * 16 + t], start + t);
      EXPECT_EQ(batch->labels[row * 16 + t], start + t + 1);
    }
  }
}

TEST(TokenBatcherTest, DeterministicAcrossInstancesAndSeedDependent) {
  auto file = Counting(5000);
  TokenBatcherOptions options{.seed = 11, .batch_size = 3, .seq_len = 32};
  auto a = TokenBatcher::Create(file, options);
  auto b = TokenBatcher::Create(file, options);
  options.seed = 12;
  auto c = TokenBatcher::Create(file, options);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  int differ = 0;
  for (int64_t step = 0; step < 20; ++step) {
    absl::StatusOr<TokenBatch> x = (*a)->Batch(step);
    absl::StatusOr<TokenBatch> y = (*b)->Batch(step);
    absl::StatusOr<TokenBatch> z = (*c)->Batch(step);
    ASSERT_TRUE(x.ok() && y.ok() && z.ok());
    EXPECT_EQ(x->input_ids, y->input_ids);
    differ += x->windows != z->windows;
  }
  EXPECT_GT(differ, 10);
}

TEST(TokenBatcherTest, EachEpochVisitsEveryWindowOnceThenWraps) {
  auto file = Counting(10 * 8 + 1);  // exactly 10 windows of 8
  absl::StatusOr<std::unique_ptr<TokenBatcher>> b =
      TokenBatcher::Create(file, {.seed = 3, .batch_size = 2, .seq_len = 8});
  ASSERT_TRUE(b.ok());
  ASSERT_EQ((*b)->num_windows(), 10);
  std::vector<int64_t> epoch0, epoch1;
  for (int64_t step = 0; step < 10; ++step) {
    for (int64_t row = 0; row < 2; ++row) {
      (step < 5 ? epoch0 : epoch1).push_back((*b)->WindowOf(step, row));
    }
  }
  std::vector<int64_t> all(10);
  for (int i = 0; i < 10; ++i) all[i] = i;
  std::vector<int64_t> s0 = epoch0, s1 = epoch1;
  std::sort(s0.begin(), s0.end());
  std::sort(s1.begin(), s1.end());
  EXPECT_EQ(s0, all);
  EXPECT_EQ(s1, all);
  EXPECT_NE(epoch0, epoch1);  // each epoch is shuffled with its own key
  // Far-away steps still work (wrap-around, no overflow).
  EXPECT_TRUE((*b)->Batch(int64_t{1} << 40).ok());
}

TEST(TokenBatcherTest, UnshuffledReadsInFileOrder) {
  auto file = Counting(100);
  absl::StatusOr<std::unique_ptr<TokenBatcher>> b =
      TokenBatcher::Create(file, {.batch_size = 2, .seq_len = 10, .shuffle = false});
  ASSERT_TRUE(b.ok());
  EXPECT_EQ((*b)->WindowOf(0, 0), 0);
  EXPECT_EQ((*b)->WindowOf(0, 1), 1);
  EXPECT_EQ((*b)->WindowOf(4, 1), 0);  // 9 windows: sample 9 wraps to window 0
}

TEST(TokenBatcherTest, RanksReadDisjointRowsOfTheGlobalBatch) {
  auto file = Counting(20000);
  std::set<int64_t> seen;
  for (int rank = 0; rank < 4; ++rank) {
    auto b = TokenBatcher::Create(
        file, {.seed = 5, .batch_size = 3, .seq_len = 16, .rank = rank, .world_size = 4});
    ASSERT_TRUE(b.ok());
    for (int64_t row = 0; row < 3; ++row) seen.insert((*b)->WindowOf(2, row));
  }
  EXPECT_EQ(seen.size(), 12u);
}

TEST(TokenBatcherTest, RejectsTooShortFilesAndBadOptions) {
  auto file = Counting(16);
  EXPECT_THAT(std::string(TokenBatcher::Create(file, {.seq_len = 16}).status().message()),
              HasSubstr("needs at least 17"));
  EXPECT_TRUE(TokenBatcher::Create(file, {.seq_len = 15}).ok());
  EXPECT_FALSE(TokenBatcher::Create(file, {.batch_size = 0, .seq_len = 4}).ok());
  EXPECT_FALSE(TokenBatcher::Create(file, {.seq_len = 0}).ok());
  EXPECT_FALSE(TokenBatcher::Create(file, {.seq_len = 4, .rank = 2, .world_size = 2}).ok());
  EXPECT_FALSE(TokenBatcher::Create(nullptr, {.seq_len = 4}).ok());
}

}  // namespace
}  // namespace memplan::io
