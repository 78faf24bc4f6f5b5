#include "common/chunk_packing.h"

#include <algorithm>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace memplan {
namespace {

LayoutParam P(std::string name, int64_t numel, int group, int64_t dtype_bytes = 4) {
  return LayoutParam{std::move(name), numel, dtype_bytes, group};
}

ChunkPacking BuildOrDie(const std::vector<LayoutParam>& params, int64_t chunk_bytes,
                       int64_t alignment_bytes = 256) {
  auto layout = ChunkPacking::Build(params, {chunk_bytes, alignment_bytes});
  EXPECT_TRUE(layout.ok()) << layout.status();
  return *std::move(layout);
}

// Invariants every layout must satisfy, whatever the input.
void CheckInvariants(const std::vector<LayoutParam>& params, const ChunkPacking& layout) {
  const int64_t chunk_bytes = layout.options().chunk_bytes;
  const int64_t align = layout.options().alignment_bytes;
  ASSERT_EQ(layout.slots().size(), params.size());
  int previous = -1;
  int64_t total = 0;
  for (int c = 0; c < layout.num_chunks(); ++c) {
    const ChunkInfo& chunk = layout.chunks()[c];
    ASSERT_FALSE(chunk.params.empty());
    int64_t end = 0;
    for (int i : chunk.params) {
      EXPECT_EQ(i, previous + 1) << "parameters must stay in execution order";
      previous = i;
      const ParamSlot& slot = layout.slots()[i];
      EXPECT_EQ(slot.chunk, c);
      EXPECT_EQ(slot.offset_bytes % align, 0);
      EXPECT_GE(slot.offset_bytes, end) << "overlap";
      EXPECT_LT(slot.offset_bytes - end, align) << "gap larger than the alignment";
      EXPECT_EQ(slot.size_bytes, params[i].numel * params[i].dtype_bytes);
      EXPECT_EQ(slot.group, params[i].group);
      end = slot.offset_bytes + slot.size_bytes;
    }
    EXPECT_EQ(chunk.size_bytes, end) << "a chunk is sized exactly to its last parameter";
    if (chunk.oversized) {
      EXPECT_EQ(chunk.params.size(), 1u);
      EXPECT_GT(chunk.size_bytes, chunk_bytes);
    } else {
      EXPECT_LE(chunk.size_bytes, chunk_bytes);
    }
    EXPECT_EQ(chunk.first_group, params[chunk.params.front()].group);
    EXPECT_EQ(chunk.last_group, params[chunk.params.back()].group);
    total += chunk.size_bytes;
  }
  EXPECT_EQ(previous + 1, static_cast<int>(params.size()));
  EXPECT_EQ(layout.TotalBytes(), total);
}

TEST(ChunkPackingTest, PacksSmallGroupsTogetherInOrder) {
  // Three groups of two 100-float params (400 B each, aligned to 512 B slots).
  std::vector<LayoutParam> params = {P("a0", 100, 0), P("a1", 100, 0), P("b0", 100, 1),
                                     P("b1", 100, 1), P("c0", 100, 2), P("c1", 100, 2)};
  ChunkPacking layout = BuildOrDie(params, 4096);
  CheckInvariants(params, layout);
  ASSERT_EQ(layout.num_chunks(), 1);
  EXPECT_EQ(layout.slots()[1].offset_bytes, 512);
  EXPECT_EQ(layout.slots()[5].offset_bytes, 5 * 512);
  EXPECT_EQ(layout.chunks()[0].size_bytes, 5 * 512 + 400);
}

TEST(ChunkPackingTest, StartsANewChunkRatherThanSplittingAGroupThatFits) {
  // 1000 B chunks, alignment 8: group 0 uses 600 B; group 1 (2 x 200 B) would fit only by
  // splitting, so it opens chunk 1 although 400 B are left in chunk 0.
  std::vector<LayoutParam> params = {P("a", 150, 0), P("b0", 50, 1), P("b1", 50, 1),
                                     P("b2", 50, 1), P("b3", 50, 1), P("c", 10, 2)};
  ChunkPacking layout = BuildOrDie(params, 1000, 8);
  CheckInvariants(params, layout);
  ASSERT_EQ(layout.num_chunks(), 2);
  EXPECT_EQ(layout.chunks()[0].size_bytes, 600);
  EXPECT_EQ(layout.slots()[1].chunk, 1);
  EXPECT_EQ(layout.slots()[4].chunk, 1);
  // Group 2 (40 B) still fits after group 1's 800 B.
  EXPECT_EQ(layout.slots()[5].chunk, 1);
  EXPECT_EQ(layout.slots()[5].offset_bytes, 800);
  EXPECT_EQ(layout.chunks()[1].size_bytes, 840);
  EXPECT_EQ(layout.ChunksOfGroup(1), std::vector<int>({1}));
}

TEST(ChunkPackingTest, GroupLargerThanAChunkContinuesTheOpenChunk) {
  // Group 1 needs 4 x 400 B = 1600 B > 1000 B: packed param by param from the open chunk.
  std::vector<LayoutParam> params = {P("a", 100, 0), P("b0", 100, 1), P("b1", 100, 1),
                                     P("b2", 100, 1), P("b3", 100, 1)};
  ChunkPacking layout = BuildOrDie(params, 1000, 8);
  CheckInvariants(params, layout);
  ASSERT_EQ(layout.num_chunks(), 3);
  EXPECT_EQ(layout.slots()[1].chunk, 0);  // shares chunk 0 with group 0
  EXPECT_EQ(layout.slots()[2].chunk, 1);
  EXPECT_EQ(layout.slots()[3].chunk, 1);
  EXPECT_EQ(layout.slots()[4].chunk, 2);
  EXPECT_EQ(layout.ChunksOfGroup(1), std::vector<int>({0, 1, 2}));
}

TEST(ChunkPackingTest, OversizedParameterGetsItsOwnChunk) {
  std::vector<LayoutParam> params = {P("small", 10, 0), P("huge", 1000, 1), P("after", 10, 1),
                                     P("next", 10, 2)};
  ChunkPacking layout = BuildOrDie(params, 1024, 256);
  CheckInvariants(params, layout);
  ASSERT_EQ(layout.num_chunks(), 3);
  EXPECT_TRUE(layout.chunks()[1].oversized);
  EXPECT_EQ(layout.chunks()[1].size_bytes, 4000);
  EXPECT_EQ(layout.slots()[1].offset_bytes, 0);
  EXPECT_EQ(layout.slots()[2].chunk, 2);  // the chunk after an oversized one is fresh
  EXPECT_EQ(layout.slots()[3].chunk, 2);
  EXPECT_EQ(layout.MaxChunkBytesFrom(0), 4000);
  EXPECT_EQ(layout.MaxChunkBytesFrom(2), layout.chunks()[2].size_bytes);
  EXPECT_EQ(layout.RangeBytes(0, 2), 40 + 4000);
}

TEST(ChunkPackingTest, MixedDtypeBytesAreExact) {
  std::vector<LayoutParam> params = {P("bf16", 3, 0, 2), P("fp32", 3, 0, 4)};
  ChunkPacking layout = BuildOrDie(params, 4096, 256);
  CheckInvariants(params, layout);
  EXPECT_EQ(layout.slots()[0].size_bytes, 6);
  EXPECT_EQ(layout.slots()[1].offset_bytes, 256);
  EXPECT_EQ(layout.TotalBytes(), 256 + 12);
}

// [Grad staging slots]: one slot holds the largest block group's offloaded parameters, each
// rounded up to the alignment; the embedding (first group) and the head (last group) never count.
TEST(ChunkPackingTest, GradSlotBytesFollowTheOffloadedBlockParameters) {
  // fp32, chunks of 1 KiB, alignment 256: embedding 1 KiB (its own chunk), block 1 = 100 + 60
  // elements (400 + 240 bytes: 512 + 256 in a slot), block 2 = 200 elements (800 bytes: 1 KiB
  // in a slot), head 10 elements.
  const std::vector<LayoutParam> params = {P("emb", 256, 0), P("b1.a", 100, 1), P("b1.b", 60, 1),
                                           P("b2.a", 200, 2), P("head", 10, 3)};
  const ChunkPacking layout = BuildOrDie(params, 1024);
  ASSERT_EQ(layout.num_chunks(), 4);  // [emb] [b1.a b1.b] [b2.a] [head]
  EXPECT_EQ(layout.GradSlotParamBytes(1), 512);
  EXPECT_EQ(layout.GradSlotParamBytes(2), 256);
  EXPECT_EQ(layout.GradSlotParamBytes(3), 1024);
  EXPECT_FALSE(layout.IsBlockGroup(0));
  EXPECT_TRUE(layout.IsBlockGroup(1));
  EXPECT_TRUE(layout.IsBlockGroup(2));
  EXPECT_FALSE(layout.IsBlockGroup(3));
  // First offloaded chunk 0..4: everything (block 2's 1 KiB is the larger group), block 1's
  // chunk persistent (still block 2), only block 2's chunk, only the head, nothing.
  EXPECT_EQ(layout.GradSlotBytesByFirstOffloaded(),
            (std::vector<int64_t>{1024, 1024, 1024, 0, 0}));
  // With block 2 smaller than block 1, keeping block 1's chunk lowers the slot.
  const ChunkPacking small = BuildOrDie(
      {P("emb", 256, 0), P("b1.a", 100, 1), P("b1.b", 60, 1), P("b2.a", 100, 2), P("head", 10, 3)},
      1024);
  ASSERT_EQ(small.num_chunks(), 3);  // [emb] [b1.a b1.b] [b2.a head]
  EXPECT_EQ(small.GradSlotBytesByFirstOffloaded(), (std::vector<int64_t>{768, 768, 512, 0}));
  // The offsets inside each group's slot: packed in input order, GradSlotParamBytes apart, -1 for
  // the embedding, the head and parameters of persistent chunks.
  EXPECT_EQ(layout.GradSlotOffsets(0), (std::vector<int64_t>{-1, 0, 512, 0, -1}));
  EXPECT_EQ(layout.GradSlotOffsets(2), (std::vector<int64_t>{-1, -1, -1, 0, -1}));
  EXPECT_EQ(layout.GradSlotOffsets(4), (std::vector<int64_t>{-1, -1, -1, -1, -1}));
  // For every first offloaded chunk the largest group's end is the slot size.
  for (const ChunkPacking* l : {&layout, &small}) {
    const std::vector<int64_t> sizes = l->GradSlotBytesByFirstOffloaded();
    for (int f = 0; f <= l->num_chunks(); ++f) {
      const std::vector<int64_t> offsets = l->GradSlotOffsets(f);
      int64_t largest = 0;
      for (size_t i = 0; i < offsets.size(); ++i) {
        if (offsets[i] >= 0) {
          largest = std::max(largest, offsets[i] + l->GradSlotParamBytes(static_cast<int>(i)));
        }
      }
      EXPECT_EQ(largest, sizes[f]) << "first offloaded " << f;
    }
  }
}

// [Sharded persistent parameters] The rule both the planner and the agent read: a hand-worked
// case (a tied head listing the embedding's chunk) and random groups against the direct sum.
TEST(PersistentGatherBytesTest, LargestAdjacentPairOverThePersistentChunks) {
  // Groups: embedding {0}, blocks {1, 2} and {2, 3}, head {4} plus the tied embedding {0}.
  const std::vector<std::vector<int>> used = {{0}, {1, 2}, {2, 3}, {4, 0}};
  const std::vector<int64_t> bytes = {100, 10, 20, 30, 1};
  const std::vector<int64_t> got = PersistentGatherBytesByNPersist(used, bytes);
  // np = 0: nothing; 1: chunk 0 (embedding alone, or with the head); 2: {0, 1} = 110;
  // 3: {0, 1, 2} = 130; 4: the same (pairs {1,2,3} = 60, {2,3,0} = 150); 5: {2, 3, 4, 0} = 151.
  EXPECT_EQ(got, (std::vector<int64_t>{0, 100, 110, 130, 150, 151}));
  EXPECT_EQ(PersistentGatherBytesByNPersist({}, bytes), std::vector<int64_t>(6, 0));
  EXPECT_EQ(PersistentGatherBytesByNPersist({{3, 1}}, bytes),
            (std::vector<int64_t>{0, 0, 10, 10, 40, 40}));

  std::mt19937 rng(11);
  for (int trial = 0; trial < 200; ++trial) {
    const int chunks = 1 + static_cast<int>(rng() % 12);
    const int groups = 1 + static_cast<int>(rng() % 8);
    std::vector<int64_t> b(chunks);
    for (auto& x : b) x = static_cast<int64_t>(rng() % 1000);
    std::vector<std::vector<int>> u(groups);
    for (auto& g : u) {
      const int k = static_cast<int>(rng() % 4);
      for (int i = 0; i < k; ++i) g.push_back(static_cast<int>(rng() % chunks));
    }
    const std::vector<int64_t> fast = PersistentGatherBytesByNPersist(u, b);
    ASSERT_EQ(fast.size(), static_cast<size_t>(chunks + 1));
    for (int np = 0; np <= chunks; ++np) {
      int64_t most = 0;
      for (int g = 0; g < groups; ++g) {
        std::vector<bool> in(chunks, false);
        for (int c : u[g]) in[c] = true;
        if (g + 1 < groups) {
          for (int c : u[g + 1]) in[c] = true;
        }
        int64_t sum = 0;
        for (int c = 0; c < np; ++c) sum += in[c] ? b[c] : 0;
        most = std::max(most, sum);
      }
      EXPECT_EQ(fast[np], most) << "trial " << trial << " np " << np;
    }
  }
}

TEST(ChunkPackingTest, RejectsInvalidInput) {
  EXPECT_FALSE(ChunkPacking::Build({P("a", 1, 0)}, {0, 256}).ok());
  EXPECT_FALSE(ChunkPacking::Build({P("a", 1, 0)}, {1024, 0}).ok());
  EXPECT_FALSE(ChunkPacking::Build({P("a", 1, 1), P("b", 1, 0)}, {1024, 256}).ok());
  EXPECT_FALSE(ChunkPacking::Build({P("a", -1, 0)}, {1024, 256}).ok());
  // A tied weight is passed once, at its first use; a second entry is a caller error.
  auto tied = ChunkPacking::Build({P("embed", 8, 0), P("embed", 8, 2)}, {1024, 256});
  EXPECT_FALSE(tied.ok());
  EXPECT_NE(tied.status().message().find("embed"), absl::string_view::npos);
}

TEST(ChunkPackingTest, EmptyInputHasNoChunks) {
  ChunkPacking layout = BuildOrDie({}, 1024);
  EXPECT_EQ(layout.num_chunks(), 0);
  EXPECT_EQ(layout.TotalBytes(), 0);
  EXPECT_EQ(layout.MaxChunkBytesFrom(0), 0);
}

TEST(ChunkPackingTest, RandomModelsKeepEveryFittingGroupWhole) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    const int64_t chunk_bytes = 512 * (1 + static_cast<int64_t>(rng() % 16));
    const int64_t align = int64_t{1} << (rng() % 9);
    std::vector<LayoutParam> params;
    const int groups = 1 + static_cast<int>(rng() % 12);
    for (int g = 0; g < groups; ++g) {
      const int n = 1 + static_cast<int>(rng() % 5);
      for (int k = 0; k < n; ++k) {
        params.push_back(P(std::to_string(g) + "." + std::to_string(k),
                           static_cast<int64_t>(rng() % 1200), g, (rng() % 2) ? 2 : 4));
      }
    }
    ChunkPacking layout = BuildOrDie(params, chunk_bytes, align);
    CheckInvariants(params, layout);
    // A group whose packed size fits in an empty chunk lives in exactly one chunk.
    for (int g = 0; g < groups; ++g) {
      int64_t packed = 0;
      for (const LayoutParam& p : params) {
        if (p.group != g) continue;
        packed = (packed + align - 1) / align * align + p.numel * p.dtype_bytes;
      }
      if (packed <= chunk_bytes) {
        EXPECT_EQ(layout.ChunksOfGroup(g).size(), 1u) << "trial " << trial << " group " << g;
      }
    }
  }
}

}  // namespace
}  // namespace memplan
