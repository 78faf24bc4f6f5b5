#include "common/fixed_knobs.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <set>
#include <string>

namespace memplan {
namespace {

FixedKnobs AllSet() {
  FixedKnobs f;
  f.chunk_bytes = int64_t{64} << 20;
  f.n_persist = 3;
  f.n_buffer = 2;
  f.n_swap = 0;
  f.n_checkpoint = 12;
  f.n_hs_offload = 4;
  f.host_memory = HostMemoryKind::kPageable;
  f.shard_persistent_state = true;
  f.shard_persistent_params = false;
  f.head_chunk_logit_bytes = int64_t{1} << 30;
  return f;
}

TEST(FixedKnobTableTest, CoversEveryMemberOnce) {
  std::set<std::string> fields;
  std::set<std::string> flags;
  for (const FixedKnobEntry& e : FixedKnobTable()) {
    fields.insert(std::string(e.field));
    flags.insert(std::string(e.flag));
  }
  EXPECT_EQ(fields.size(), 10u);
  EXPECT_EQ(flags.size(), 10u);
  EXPECT_FALSE(AnyFixedKnob(FixedKnobs{}));
  EXPECT_TRUE(AnyFixedKnob(AllSet()));
}

TEST(FixedKnobTableTest, ClearingEachLeavesNoneSet) {
  FixedKnobs f = AllSet();
  for (const FixedKnobEntry& e : FixedKnobTable()) {
    EXPECT_TRUE(e.is_set(f)) << e.field;
    e.clear(&f);
    EXPECT_FALSE(e.is_set(f)) << e.field;
  }
  EXPECT_FALSE(AnyFixedKnob(f));
}

TEST(FixedKnobTableTest, TextNamesFieldAndValue) {
  const FixedKnobs f = AllSet();
  std::vector<std::string> texts;
  std::vector<std::string> relaxed;
  for (const FixedKnobEntry& e : FixedKnobTable()) {
    texts.push_back(FixedKnobText(e, f, "fixed."));
    if (e.relaxed_when_no_fit) relaxed.push_back(std::string(e.field));
  }
  EXPECT_THAT(texts, ::testing::ElementsAre("fixed.chunk_bytes = 67108864", "fixed.n_persist = 3",
                                            "fixed.n_buffer = 2", "fixed.n_swap = 0",
                                            "fixed.n_checkpoint = 12", "fixed.n_hs_offload = 4",
                                            "fixed.host_memory = pageable",
                                            "fixed.shard_persistent_state = true",
                                            "fixed.shard_persistent_params = false",
                                            "fixed.head_chunk_logit_bytes = 1073741824"));
  EXPECT_THAT(relaxed, ::testing::ElementsAre("chunk_bytes", "n_persist", "n_buffer", "n_swap",
                                              "n_checkpoint", "n_hs_offload", "host_memory",
                                              "head_chunk_logit_bytes"));
}

}  // namespace
}  // namespace memplan
