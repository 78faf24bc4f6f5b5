#include "planner/cost/chunk_layout.h"

#include <numeric>
#include <random>

#include "gtest/gtest.h"
#include "tests/planner/cost/random_trace.h"

namespace memplan {
namespace {

using testing::kMiB;

TEST(ChunkLayoutTest, PacksStagesInExecutionOrder) {
  std::mt19937_64 rng(3);
  for (int iter = 0; iter < 200; ++iter) {
    const Trace trace = testing::RandomTrace(rng, 1 + iter % 30);
    const int64_t chunk = (4 + iter % 90) * kMiB;
    const ChunkLayout layout = LayoutChunks(trace, chunk);
    const std::vector<int64_t> stages = StageParamBytes(trace);
    const std::vector<int64_t> trainable = StageTrainableBytes(trace);
    ASSERT_EQ(layout.stage_first_chunk.size(), stages.size());
    // Every byte is placed once; no chunk overflows; trainable totals match.
    EXPECT_EQ(std::accumulate(layout.chunk_param_bytes.begin(), layout.chunk_param_bytes.end(),
                              int64_t{0}),
              std::accumulate(stages.begin(), stages.end(), int64_t{0}));
    EXPECT_EQ(std::accumulate(layout.chunk_trainable_bytes.begin(),
                              layout.chunk_trainable_bytes.end(), int64_t{0}),
              std::accumulate(trainable.begin(), trainable.end(), int64_t{0}));
    for (size_t c = 0; c < layout.chunk_param_bytes.size(); ++c) {
      EXPECT_GT(layout.chunk_param_bytes[c], 0);
      EXPECT_LE(layout.chunk_param_bytes[c], chunk);
      EXPECT_LE(layout.chunk_trainable_bytes[c], layout.chunk_param_bytes[c]);
    }
    for (size_t s = 0; s < stages.size(); ++s) {
      const int32_t first = layout.stage_first_chunk[s], last = layout.stage_last_chunk[s];
      EXPECT_LE(first, last);
      if (s > 0) {
        // Ranges advance; neighbours share at most one chunk.
        EXPECT_GE(first, layout.stage_last_chunk[s - 1]);
        EXPECT_LE(first, layout.stage_last_chunk[s - 1] + 1);
      }
      // A stage that fits in one chunk is never split; a larger one spans the fewest chunks.
      const int64_t span = last - first + 1;
      if (stages[s] <= chunk) {
        EXPECT_EQ(span, 1) << "stage " << s;
      } else {
        EXPECT_EQ(span, (stages[s] + chunk - 1) / chunk) << "stage " << s;
      }
    }
  }
}

TEST(ChunkLayoutTest, LoraTrainsOnlyBlocks) {
  std::mt19937_64 rng(5);
  Trace trace = testing::RandomTrace(rng, 6);
  trace.training.kind = TrainingKind::kLora;
  trace.trainable_param_count = 6 * 1000;
  const std::vector<int64_t> trainable = StageTrainableBytes(trace);
  EXPECT_EQ(trainable.front(), 0);
  EXPECT_EQ(trainable.back(), 0);
  for (size_t s = 1; s + 1 < trainable.size(); ++s) {
    EXPECT_EQ(trainable[s], 1000 * DTypeBytes(trace.param_dtype));
  }
}

TEST(ChunkLayoutTest, WithChunkLayoutRecordsTheLayout) {
  std::mt19937_64 rng(9);
  const Trace trace = testing::RandomTrace(rng, 5);
  const ChunkLayout layout = LayoutChunks(trace, 32 * kMiB);
  const Trace out = WithChunkLayout(trace, layout);
  EXPECT_EQ(out.chunk_bytes, 32 * kMiB);
  EXPECT_EQ(out.chunk_param_bytes, layout.chunk_param_bytes);
}

}  // namespace
}  // namespace memplan
