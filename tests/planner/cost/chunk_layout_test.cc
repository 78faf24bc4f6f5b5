#include "planner/cost/chunk_layout.h"

#include <numeric>
#include <random>

#include <string>
#include <vector>

#include "common/chunk_packing.h"
#include "common/param_shapes.h"
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
    if (ArchMatchesTrace(trace)) continue;  // the agent's rule: AgentRuleLayout below
    EXPECT_TRUE(layout.fingerprint.empty());  // no parameter list: the agent's layout unknown
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

// With an architecture the layout is ArchPacking's chunks (the [Parameter order] list packed by
// the agent's rule), with stage ranges and trainable bytes derived from it. That this is the
// layout the agent really builds from LlamaModel is tests/agent/chunks/plan_layout_test.cc.
TEST(ChunkLayoutTest, AgentRuleLayoutIsTheArchPacking) {
  std::mt19937_64 rng(7);
  int arch_traces = 0, with_oversized = 0;
  for (int iter = 0; iter < 200; ++iter) {
    Trace trace = testing::RandomTrace(rng, 1 + iter % 12);
    if (!ArchMatchesTrace(trace)) continue;
    ++arch_traces;
    const int64_t chunk = (4 + iter % 90) * kMiB;
    const ChunkLayout layout = LayoutChunks(trace, chunk);
    const std::vector<int64_t> stages = StageParamBytes(trace);

    const std::optional<ChunkPacking> packing = ArchPacking(trace, chunk);
    ASSERT_TRUE(packing.has_value());
    EXPECT_EQ(layout.fingerprint, packing->fingerprint());
    EXPECT_EQ(packing->fingerprint(),
              LayoutFingerprint(LayoutParamsFor(trace.arch, DTypeBytes(trace.param_dtype)),
                                {chunk, kChunkAlignmentBytes}));
    ASSERT_EQ(layout.num_chunks(), packing->num_chunks());
    bool any_oversized = false;
    for (int c = 0; c < layout.num_chunks(); ++c) {
      EXPECT_EQ(layout.chunk_param_bytes[c], packing->chunks()[c].size_bytes);
      EXPECT_EQ(layout.chunk_oversized[c], packing->chunks()[c].oversized);
      if (!layout.chunk_oversized[c]) {
        EXPECT_LE(layout.chunk_param_bytes[c], chunk);
      }
      any_oversized |= layout.chunk_oversized[c];
    }
    with_oversized += any_oversized;
    // Stage ranges come from where the agent put each stage's parameters.
    for (size_t g = 0; g < stages.size(); ++g) {
      const std::vector<int> chunks = packing->ChunksOfGroup(static_cast<int>(g));
      ASSERT_FALSE(chunks.empty());
      EXPECT_EQ(layout.stage_first_chunk[g], chunks.front());
      EXPECT_EQ(layout.stage_last_chunk[g], chunks.back());
    }
    if (trace.training.kind == TrainingKind::kFull) {
      EXPECT_EQ(std::accumulate(layout.chunk_trainable_bytes.begin(),
                                layout.chunk_trainable_bytes.end(), int64_t{0}),
                std::accumulate(stages.begin(), stages.end(), int64_t{0}));
    }
  }
  EXPECT_GT(arch_traces, 50);
  EXPECT_GT(with_oversized, 20);
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
