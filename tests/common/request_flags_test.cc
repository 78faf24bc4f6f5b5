#include "common/request_flags.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "common/fixed_knobs.h"

namespace memplan {
namespace {

using ::testing::ElementsAre;

TEST(FixedKnobFlagsTest, EveryKnobOfTheTableHasItsFlag) {
  FixedKnobs knobs;
  FlagSet flags;
  AddFixedKnobFlags(&flags, &knobs);
  for (const FixedKnobEntry& entry : FixedKnobTable()) {
    EXPECT_TRUE(flags.Has(entry.flag)) << entry.field;
  }
  EXPECT_EQ(flags.Names().size(), FixedKnobTable().size());
}

TEST(FixedKnobFlagsTest, ParsesEveryKnob) {
  FixedKnobs knobs;
  FlagSet flags;
  AddFixedKnobFlags(&flags, &knobs);
  ASSERT_TRUE(
      flags
          .Parse({"--chunk-mib", "64", "--n-persist", "3", "--n-buffer=0", "--n-swap", "0",
                  "--n-ckpt", "12", "--n-hs-offload", "4", "--host-memory", "HOST_MEMORY_PAGEABLE",
                  "--persistent-state", "sharded", "--persistent-params=replicated"})
          .ok());
  EXPECT_EQ(knobs.chunk_bytes, int64_t{64} << 20);
  EXPECT_EQ(knobs.n_persist, 3);
  EXPECT_EQ(knobs.n_buffer, 0);
  EXPECT_EQ(knobs.n_swap, 0);
  EXPECT_EQ(knobs.n_checkpoint, 12);
  EXPECT_EQ(knobs.n_hs_offload, 4);
  EXPECT_EQ(knobs.host_memory, HostMemoryKind::kPageable);
  EXPECT_EQ(knobs.shard_persistent_state, true);
  EXPECT_EQ(knobs.shard_persistent_params, false);
}

// The flags' ranges are the request's (common/validate.h), not numbers of their own.
TEST(FixedKnobFlagsTest, RangesAreTheRequestBounds) {
  FixedKnobs knobs;
  FlagSet flags;
  AddFixedKnobFlags(&flags, &knobs, /*min_n_buffer=*/1);
  auto error = [&flags](std::vector<std::string> args) {
    return std::string(flags.Parse(args).message());
  };
  EXPECT_EQ(kChunkMibFlag.lo << 20, kMinChunkBytes);
  EXPECT_EQ(kChunkMibFlag.hi << 20, kMaxChunkBytes);
  EXPECT_EQ(error({"--chunk-mib", "0"}), "--chunk-mib: 0 is outside [1, 16384]");
  EXPECT_EQ(error({"--chunk-mib", "16385"}), "--chunk-mib: 16385 is outside [1, 16384]");
  EXPECT_EQ(error({"--n-persist", "-1"}), "--n-persist: -1 is outside [0, 1048576]");
  EXPECT_EQ(error({"--n-buffer", "0"}), "--n-buffer: 0 is outside [1, 1048576]");
  EXPECT_EQ(error({"--n-ckpt", "4097"}), "--n-ckpt: 4097 is outside [0, 4096]");
  EXPECT_EQ(error({"--host-memory", "numa"}),
            "--host-memory: \"numa\" is not one of pinned, pageable");
  EXPECT_EQ(error({"--persistent-state", "yes"}),
            "--persistent-state: \"yes\" is not one of sharded, replicated");
}

TEST(RequestFlagsTest, WorkloadAndMarginSpecsAreTheValidationBounds) {
  EXPECT_EQ(kBatchFlag.hi, kMaxMicroBatch);
  EXPECT_EQ(kSeqFlag.hi, kMaxSeqLen);
  EXPECT_EQ(kGradAccumFlag.hi, kMaxGradAccum);
  EXPECT_EQ(kLoraRankFlag.hi, kMaxLoraRank);
  EXPECT_EQ(kSafetyMarginFlag.range.lo, kMinSafetyMargin);
  EXPECT_EQ(kSafetyMarginFlag.range.hi, kMaxSafetyMargin);
  int64_t seq = 0;
  FlagSet flags;
  flags.Int(kSeqFlag, &seq);
  EXPECT_EQ(flags.Parse({"--seq", "16777217"}).message(),
            "--seq: 16777217 is outside [1, 16777216]");
}

TEST(RequestFlagsTest, DTypeOptimizerAndLoraTargets) {
  std::optional<DType> dtype;
  std::optional<OptimizerKind> optimizer;
  std::vector<std::string> targets;
  FlagSet flags;
  AddDTypeFlag(&flags, "--dtype", &dtype);
  AddOptimizerFlag(&flags, &optimizer);
  AddLoraTargetsFlag(&flags, &targets);
  ASSERT_TRUE(
      flags.Parse({"--dtype", "BF16", "--optimizer=adamw8bit", "--lora-targets", "all"}).ok());
  EXPECT_EQ(dtype, DType::kBFloat16);
  EXPECT_EQ(optimizer, OptimizerKind::kAdamW8bit);
  EXPECT_EQ(targets.size(), 7u);
  EXPECT_EQ(flags.Parse({"--dtype", "int8"}).message(),
            "--dtype: \"int8\" is not one of fp32, bf16, fp16");
  EXPECT_EQ(flags.Parse({"--optimizer", "adamx"}).message(),
            "--optimizer: \"adamx\" is not one of adamw, adamw_bf16, sgd, adamw8bit");
  EXPECT_EQ(flags.Parse({"--lora-targets", "q_proj,qkv"}).message(),
            "--lora-targets: \"qkv\" is not one of q_proj, k_proj, v_proj, o_proj, gate_proj, "
            "up_proj, down_proj (or all)");

  std::string name = "adamw";
  FlagSet cli;
  AddOptimizerFlag(&cli, &name);
  ASSERT_TRUE(cli.Parse({"--optimizer", "adamw_bf16"}).ok());
  EXPECT_EQ(name, "adamw_bf16");
  EXPECT_FALSE(cli.Parse({"--optimizer", "lion"}).ok());
  EXPECT_EQ(name, "adamw_bf16");
}

}  // namespace
}  // namespace memplan
