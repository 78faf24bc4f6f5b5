#include "agent/train/train_config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "common/fixed_knobs.h"
#include "common/head_chunking.h"
#include "common/host_reserve.h"
#include "common/optimizer_bytes.h"

namespace memplan {
namespace {

using M = BlockMode;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(ParseTrainArgsTest, ParsesEveryKindOfFlag) {
  auto c = ParseTrainArgs({"--arch",
                           "llama-3.2-1b",
                           "--synthetic-data",
                           "--batch=4",
                           "--seq",
                           "2048",
                           "--steps",
                           "3",
                           "--grad-accum",
                           "2",
                           "--lr",
                           "3e-4",
                           "--clip",
                           "0",
                           "--dtype",
                           "bf16",
                           "--device",
                           "cuda:1",
                           "--chunk-mib",
                           "32",
                           "--n-persist",
                           "5",
                           "--n-buffer",
                           "3",
                           "--block-modes",
                           "ckpt,SWAP,hs-offload,none",
                           "--host-memory",
                           "pageable",
                           "--save",
                           "/tmp/x",
                           "--save-every",
                           "10"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->arch, "llama-3.2-1b");
  EXPECT_TRUE(c->synthetic_data);
  EXPECT_EQ(c->batch, 4);
  EXPECT_EQ(c->seq, 2048);
  EXPECT_EQ(c->grad_accum, 2);
  EXPECT_DOUBLE_EQ(c->lr, 3e-4);
  EXPECT_EQ(c->clip, 0);
  EXPECT_EQ(c->dtype, DType::kBFloat16);
  EXPECT_EQ(c->device, "cuda:1");
  EXPECT_EQ(c->chunk_bytes, int64_t{32} << 20);
  EXPECT_EQ(c->n_persist, 5);
  EXPECT_EQ(c->n_buffer, 3);
  EXPECT_THAT(*c->block_modes, ElementsAre(M::kCkpt, M::kSwap, M::kHsOffload, M::kNone));
  EXPECT_EQ(c->host_memory, HostMemoryKind::kPageable);
  EXPECT_EQ(c->save_dir, "/tmp/x");
  EXPECT_EQ(c->save_every, 10);
}

TEST(ParseTrainArgsTest, MetricsAddress) {
  auto c =
      ParseTrainArgs({"--arch", "llama-tiny", "--synthetic-data", "--metrics", "0.0.0.0:9465"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->metrics_address, "0.0.0.0:9465");
  EXPECT_EQ(ParseTrainArgs({"--arch", "llama-tiny", "--synthetic-data"})->metrics_address, "");
}

TEST(ParseTrainArgsTest, ErrorsNameTheFlag) {
  auto bad = [](std::vector<std::string> extra) {
    std::vector<std::string> args = {"--arch", "x", "--synthetic-data"};
    args.insert(args.end(), extra.begin(), extra.end());
    return ParseTrainArgs(args).status();
  };
  EXPECT_THAT(bad({"--batch", "0"}).message(), HasSubstr("--batch"));
  EXPECT_THAT(bad({"--lr", "abc"}).message(), HasSubstr("--lr"));
  EXPECT_THAT(bad({"--dtype", "fp8"}).message(), HasSubstr("--dtype"));
  EXPECT_THAT(bad({"--block-modes", "ckpt,bogus"}).message(), HasSubstr("bogus"));
  EXPECT_THAT(bad({"--host-memory", "gpu"}).message(), HasSubstr("--host-memory"));
  EXPECT_THAT(bad({"--frobnicate", "1"}).message(), HasSubstr("unknown flag --frobnicate"));
  EXPECT_THAT(bad({"--seq"}).message(), HasSubstr("needs a value"));
  EXPECT_THAT(bad({"--n-ckpt", "2", "--block-modes", "none"}).message(), HasSubstr("exclusive"));
  EXPECT_FALSE(ParseTrainArgs({"--synthetic-data"}).ok());                            // no model
  EXPECT_FALSE(ParseTrainArgs({"--arch", "x"}).ok());                                 // no data
  EXPECT_FALSE(ParseTrainArgs({"--arch", "x", "--model", "d", "--data", "f"}).ok());  // both
}

TEST(BlockModesFromCountsTest, OffloadFirstInterleavedWithCkptNoneLast) {
  auto modes = BlockModesFromCounts(6, 1, 2, 2);
  ASSERT_TRUE(modes.ok());
  EXPECT_THAT(*modes,
              ElementsAre(M::kSwap, M::kCkpt, M::kHsOffload, M::kCkpt, M::kHsOffload, M::kNone));
  EXPECT_THAT(*BlockModesFromCounts(3, 0, 3, 0), ElementsAre(M::kCkpt, M::kCkpt, M::kCkpt));
  EXPECT_THAT(*BlockModesFromCounts(2, 0, 0, 0), ElementsAre(M::kNone, M::kNone));
  EXPECT_FALSE(BlockModesFromCounts(2, 1, 1, 1).ok());
  EXPECT_FALSE(BlockModesFromCounts(2, -1, 0, 0).ok());
}

TEST(ParseTrainArgsTest, OptimizerFlag) {
  auto parse = [](std::vector<std::string> extra) {
    std::vector<std::string> args = {"--arch", "x", "--synthetic-data"};
    args.insert(args.end(), extra.begin(), extra.end());
    return ParseTrainArgs(args);
  };
  EXPECT_FALSE(parse({})->optimizer.has_value());
  EXPECT_EQ(parse({"--optimizer", "sgd"})->optimizer, OptimizerKind::kSgd);
  EXPECT_EQ(parse({"--optimizer", "adamw_bf16", "--dtype", "bf16"})->optimizer,
            OptimizerKind::kAdamWBf16States);
  EXPECT_EQ(parse({"--optimizer=adamw"})->optimizer, OptimizerKind::kAdamW);
  const absl::Status unknown = parse({"--optimizer", "adam"}).status();
  EXPECT_THAT(unknown.message(), HasSubstr("--optimizer"));
  EXPECT_THAT(unknown.message(), HasSubstr("adamw, adamw_bf16, sgd"));
  const absl::Status wrong_dtype = parse({"--optimizer", "adamw_bf16", "--dtype", "fp32"}).status();
  EXPECT_EQ(wrong_dtype.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(wrong_dtype.message(), HasSubstr("--optimizer adamw_bf16"));
  EXPECT_THAT(wrong_dtype.message(), HasSubstr("--dtype"));
  EXPECT_THAT(TrainUsage(), HasSubstr("--optimizer adamw|adamw_bf16|sgd"));
  // adamw8bit: fp32 or bf16, in the chunk manager only (--plain is refused, the run is managed).
  EXPECT_EQ(parse({"--optimizer", "adamw8bit", "--dtype", "bf16"})->optimizer,
            OptimizerKind::kAdamW8bit);
  EXPECT_EQ(parse({"--optimizer", "adamw8bit", "--dtype", "fp16"}).status().code(),
            absl::StatusCode::kInvalidArgument);
  const absl::Status plain = parse({"--optimizer", "adamw8bit", "--plain"}).status();
  EXPECT_THAT(plain.message(), HasSubstr("--plain"));
  auto run = ResolveRunPlan(*parse({"--optimizer", "adamw8bit"}), 3, std::nullopt);
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_TRUE(run->managed);
  // [Stochastic rounding] by default; nearest on request; the flag is adamw8bit's only.
  EXPECT_TRUE(parse({"--optimizer", "adamw8bit"})->stochastic_rounding);
  EXPECT_FALSE(
      parse({"--optimizer", "adamw8bit", "--param-rounding", "nearest"})->stochastic_rounding);
  const absl::Status bad_mode = parse({"--param-rounding", "up"}).status();
  EXPECT_THAT(bad_mode.message(), HasSubstr("--param-rounding"));
  EXPECT_THAT(bad_mode.message(), HasSubstr("\"up\" is not one of stochastic, nearest"));
  const absl::Status other = parse({"--optimizer", "adamw", "--param-rounding", "nearest"}).status();
  EXPECT_THAT(other.message(), HasSubstr("--param-rounding applies to --optimizer adamw8bit"));
  EXPECT_THAT(TrainUsage(), HasSubstr("--param-rounding stochastic|nearest"));
}

// [Grouped experts]: grouped by default, the per-expert loop on request (gpu-new-archs.sh's
// before/after).
TEST(ParseTrainArgsTest, MoeExpertsFlag) {
  auto parse = [](std::vector<std::string> extra) {
    std::vector<std::string> args = {"--arch", "x", "--synthetic-data"};
    args.insert(args.end(), extra.begin(), extra.end());
    return ParseTrainArgs(args);
  };
  EXPECT_FALSE(parse({})->moe_loop_experts);
  EXPECT_FALSE(parse({"--moe-experts", "grouped"})->moe_loop_experts);
  EXPECT_TRUE(parse({"--moe-experts", "loop"})->moe_loop_experts);
  const absl::Status bad = parse({"--moe-experts", "fused"}).status();
  EXPECT_THAT(bad.message(), HasSubstr("\"fused\" is not one of grouped, loop"));
  EXPECT_THAT(TrainUsage(), HasSubstr("--moe-experts grouped|loop"));
}

TEST(ParsePlanOptimizerTest, FlagAndPlanFileMustAgree) {
  auto none = PlanFileFromJson(R"({"plan": {"nChunks": 3}})");
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->optimizer.has_value());
  auto top = PlanFileFromJson(R"({"optimizer": "sgd", "plan": {"nChunks": 3}})");
  ASSERT_TRUE(top.ok());
  EXPECT_EQ(top->optimizer, OptimizerKind::kSgd);
  auto request = PlanFileFromJson(R"({"request": {"optimizer": "adamw_bf16"}, "plan": {}})");
  ASSERT_TRUE(request.ok());
  EXPECT_EQ(request->optimizer, OptimizerKind::kAdamWBf16States);
  EXPECT_FALSE(PlanFileFromJson(R"({"optimizer": "adafactor"})").ok());

  TrainConfig c;
  c.plan_file = "plan.json";
  EXPECT_EQ(*ResolveOptimizer(c, std::nullopt), OptimizerKind::kAdamW);
  EXPECT_EQ(*ResolveOptimizer(c, OptimizerKind::kSgd), OptimizerKind::kSgd);
  c.optimizer = OptimizerKind::kSgd;
  EXPECT_EQ(*ResolveOptimizer(c, OptimizerKind::kSgd), OptimizerKind::kSgd);
  const absl::Status differs = ResolveOptimizer(c, OptimizerKind::kAdamW).status();
  EXPECT_EQ(differs.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(differs.message(), HasSubstr("--optimizer sgd"));
  EXPECT_THAT(differs.message(), HasSubstr("made for optimizer adamw"));
  c.optimizer.reset();
  c.dtype = DType::kFloat32;
  EXPECT_THAT(ResolveOptimizer(c, OptimizerKind::kAdamWBf16States).status().message(),
              HasSubstr("--dtype fp32"));
}

TEST(ParsePlanJsonTest, ProtoJsonOfAPlanResponse) {
  // What protobuf's MessageToJsonString prints: lowerCamelCase, int64 as strings, enum names,
  // default values omitted.
  auto plan = ParsePlanJson(R"({"planId": "p1", "plan": {"chunkBytes": "67108864",
      "nChunks": 20, "nPersist": 4, "nBuffer": 2, "nCheckpoint": 1,
      "hostMemory": "HOST_MEMORY_PAGEABLE",
      "blockModes": ["BLOCK_MODE_CKPT", "BLOCK_MODE_NONE"], "worldSize": 1},
      "prediction": {"peakBytes": "123"}})");
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->chunk_bytes, int64_t{64} << 20);
  EXPECT_EQ(plan->n_persist, 4);
  EXPECT_EQ(plan->n_buffer, 2);
  EXPECT_EQ(plan->n_checkpoint, 1);
  EXPECT_EQ(plan->host_memory, HostMemoryKind::kPageable);
  EXPECT_THAT(plan->block_modes, ElementsAre(M::kCkpt, M::kNone));
}

TEST(ParsePlanJsonTest, BarePlanInSnakeCaseWithShortNames) {
  auto plan = ParsePlanJson(
      R"({"chunk_bytes": 1024, "n_persist": 1, "block_modes": ["swap", "hs_offload"]})");
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->chunk_bytes, 1024);
  EXPECT_EQ(plan->host_memory, HostMemoryKind::kPinned);
  EXPECT_THAT(plan->block_modes, ElementsAre(M::kSwap, M::kHsOffload));
}

TEST(ParsePlanJsonTest, CarriesTheLayoutFingerprint) {
  auto plan = ParsePlanJson(R"({"fits": true, "plan": {"chunk_bytes": "33554432",
      "n_chunks": 226, "layout_fingerprint": "0123456789abcdef"}})");
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->n_chunks, 226);
  EXPECT_EQ(plan->layout_fingerprint, "0123456789abcdef");
  plan = ParsePlanJson(R"({"plan": {"layoutFingerprint": "fedcba9876543210"}})");
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->layout_fingerprint, "fedcba9876543210");
  EXPECT_THAT(ParsePlanJson(R"({"layout_fingerprint": 7})").status().message(),
              HasSubstr("layout_fingerprint"));
}

// A PlanResponse that does not fit carries its least-bad plan: running it would train something
// else than asked (issue 14: 0 persistent chunks, every block NONE, without a word).
TEST(ParsePlanJsonTest, RefusesADoesNotFitVerdictQuotingTheReason) {
  const char* kResponse = R"({"fits": false,
      "reason": "does not fit: the leanest plan needs 30.0 GiB of GPU memory",
      "plan": {"chunk_bytes": "67108864", "n_chunks": 20, "n_persist": 0, "n_buffer": 4}})";
  auto plan = ParsePlanJson(kResponse);
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(plan.status().message(), HasSubstr("DOES NOT FIT"));
  EXPECT_THAT(plan.status().message(),
              HasSubstr("the leanest plan needs 30.0 GiB of GPU memory"));
  // Nested (a stored plan holding its response) and without a reason.
  plan = ParsePlanJson(R"({"plan": {"fits": false, "plan": {"n_persist": 1}}})");
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(plan.status().message(), HasSubstr("(no reason given)"));
  // A fitting verdict, or none (a bare plan), is run.
  EXPECT_TRUE(ParsePlanJson(R"({"fits": true, "reason": "fits", "plan": {"n_persist": 1}})").ok());
  EXPECT_TRUE(ParsePlanJson(R"({"n_persist": 1})").ok());
}

TEST(CheckPlanLayoutTest, RefusesAnotherLayoutNamingBoth) {
  ResidencyPlan plan;
  plan.chunk_bytes = int64_t{32} << 20;
  plan.n_chunks = 259;
  plan.n_persist = 119;
  plan.layout_fingerprint = "1111111111111111";
  std::string warning;
  absl::Status s = CheckPlanLayout(plan, "--plan-file p.json", 226, "2222222222222222", &warning);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("--plan-file p.json"));
  EXPECT_THAT(s.message(), HasSubstr("259 chunks (layout fingerprint 1111111111111111)"));
  EXPECT_THAT(s.message(), HasSubstr("226 chunks"));
  EXPECT_THAT(s.message(), HasSubstr("2222222222222222"));
  // Same fingerprint, another count: still refused (a corrupt or edited plan).
  plan.layout_fingerprint = "2222222222222222";
  EXPECT_EQ(CheckPlanLayout(plan, "x", 226, "2222222222222222", &warning).code(),
            absl::StatusCode::kFailedPrecondition);
  plan.n_chunks = 226;
  EXPECT_TRUE(CheckPlanLayout(plan, "x", 226, "2222222222222222", &warning).ok());
  EXPECT_TRUE(warning.empty());
  // No fingerprint (older planner, hand-written plan): accepted with a warning.
  plan.layout_fingerprint.clear();
  plan.n_chunks = 259;
  EXPECT_TRUE(CheckPlanLayout(plan, "--plan-file old.json", 226, "2222222222222222", &warning).ok());
  EXPECT_THAT(warning, HasSubstr("no layout fingerprint"));
  EXPECT_THAT(warning, HasSubstr("259"));
  EXPECT_THAT(warning, HasSubstr("226"));
}

TEST(ParsePlanJsonTest, RejectsMalformedPlans) {
  EXPECT_FALSE(ParsePlanJson("{not json").ok());
  EXPECT_FALSE(ParsePlanJson("[1, 2]").ok());
  EXPECT_THAT(ParsePlanJson(R"({"n_persist": -1})").status().message(), HasSubstr("n_persist"));
  EXPECT_THAT(ParsePlanJson(R"({"n_buffer": "x"})").status().message(), HasSubstr("n_buffer"));
  EXPECT_THAT(ParsePlanJson(R"({"block_modes": ["fast"]})").status().message(),
              HasSubstr("block_modes[0]"));
  EXPECT_THAT(ParsePlanJson(R"({"host_memory": "gpu"})").status().message(),
              HasSubstr("host_memory"));
}

TEST(ResolveRunPlanTest, FlagsOverrideThePlanFile) {
  ResidencyPlan file;
  file.chunk_bytes = 1 << 20;
  file.n_persist = 2;
  file.n_buffer = 3;
  file.n_checkpoint = 2;
  file.host_memory = HostMemoryKind::kPageable;
  TrainConfig c;
  c.n_persist = 7;
  auto run = ResolveRunPlan(c, 4, file);
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_TRUE(run->managed);
  EXPECT_EQ(run->chunk_bytes, 1 << 20);
  EXPECT_EQ(run->n_persist, 7);
  EXPECT_EQ(run->n_buffer, 3);
  EXPECT_EQ(run->host_memory, HostMemoryKind::kPageable);
  EXPECT_THAT(run->block_modes, ElementsAre(M::kCkpt, M::kCkpt, M::kNone, M::kNone));

  c.block_modes = std::vector<M>{M::kSwap, M::kNone, M::kNone, M::kNone};
  EXPECT_THAT(ResolveRunPlan(c, 4, file)->block_modes,
              ElementsAre(M::kSwap, M::kNone, M::kNone, M::kNone));
  EXPECT_FALSE(ResolveRunPlan(c, 5, file).ok());  // 4 modes for 5 blocks
}

// [Chunked head] The model runs the head chunk its plan was priced with (TrainSession sets
// LlamaModelOptions::head_chunk_logit_bytes from RunPlan's): 2 092 rows a chunk for a 1 GiB plan
// at a 128 256 vocabulary, 523 for an older plan (0), --head-chunk-mib over both, 1 GiB for
// --plain; a plan out of range is refused naming the field.
TEST(ResolveRunPlanTest, HeadChunkFromThePlanOrTheFlag) {
  const int64_t vocab = 128256;
  ResidencyPlan file;
  file.head_chunk_logit_bytes = kPlainHeadChunkLogitBytes;
  auto run = ResolveRunPlan(TrainConfig{}, 2, file);
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(HeadChunkRows(vocab, run->head_chunk_logit_bytes), 2092);
  file.head_chunk_logit_bytes = 0;
  run = ResolveRunPlan(TrainConfig{}, 2, file);
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->head_chunk_logit_bytes, kHeadChunkLogitBytes);
  EXPECT_EQ(HeadChunkRows(vocab, run->head_chunk_logit_bytes), 523);
  EXPECT_EQ(ResolveRunPlan(TrainConfig{}, 2, std::nullopt)->head_chunk_logit_bytes,
            kHeadChunkLogitBytes);

  auto c =
      ParseTrainArgs({"--arch", "llama-3.2-1b", "--synthetic-data", "--head-chunk-mib", "512"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->head_chunk_logit_bytes, int64_t{512} << 20);
  EXPECT_EQ(PlannerFixedKnobs(*c).head_chunk_logit_bytes, int64_t{512} << 20);
  EXPECT_EQ(ResolveRunPlan(*c, 2, file)->head_chunk_logit_bytes, int64_t{512} << 20);
  EXPECT_FALSE(
      ParseTrainArgs({"--arch", "llama-3.2-1b", "--synthetic-data", "--head-chunk-mib", "8192"})
          .ok());
  auto plain = ParseTrainArgs({"--arch", "llama-3.2-1b", "--synthetic-data", "--plain"});
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ(ResolveRunPlan(*plain, 2, std::nullopt)->head_chunk_logit_bytes,
            kPlainHeadChunkLogitBytes);

  file.head_chunk_logit_bytes = 4096;
  run = ResolveRunPlan(TrainConfig{}, 2, file);
  EXPECT_EQ(run.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(run.status().message(), HasSubstr("plan.head_chunk_logit_bytes = 4096"));
  EXPECT_THAT(run.status().message(), HasSubstr("[1048576, 4294967296]"));
}

TEST(ResolveRunPlanTest, NoPlanNoKnobsIsUnmanagedAllNone) {
  auto run = ResolveRunPlan(TrainConfig{}, 3, std::nullopt);
  ASSERT_TRUE(run.ok());
  EXPECT_FALSE(run->managed);
  EXPECT_THAT(run->block_modes, ElementsAre(M::kNone, M::kNone, M::kNone));
  TrainConfig c;
  c.n_buffer = 1;
  EXPECT_TRUE(ResolveRunPlan(c, 3, std::nullopt)->managed);
}

TEST(ResolveRunPlanTest, RejectsPlansForAnotherWorldSize) {
  ResidencyPlan file;
  file.world_size = 8;
  EXPECT_THAT(ResolveRunPlan(TrainConfig{}, 3, file).status().message(),
              HasSubstr("plan.world_size = 8 but this run has world size 1 (WORLD_SIZE)"));
  EXPECT_THAT(ResolveRunPlan(TrainConfig{}, 3, file, 2).status().message(),
              HasSubstr("plan.world_size = 8 but this run has world size 2"));
  auto run = ResolveRunPlan(TrainConfig{}, 3, file, 8);
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_TRUE(run->managed);
  file.world_size = 1;
  EXPECT_THAT(ResolveRunPlan(TrainConfig{}, 3, file, 2).status().message(),
              HasSubstr("plan.world_size = 1 but this run has world size 2 (WORLD_SIZE): plan "
                        "again for 2 ranks"));
}

TEST(ResolveRunPlanTest, SeveralRanksRunManagedAndRefusePlain) {
  auto run = ResolveRunPlan(TrainConfig{}, 3, std::nullopt, 2);
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_TRUE(run->managed);
  TrainConfig plain;
  plain.plain = true;
  EXPECT_THAT(ResolveRunPlan(plain, 3, std::nullopt, 2).status().message(),
              HasSubstr("--plain: world size 2 (WORLD_SIZE) runs managed"));
  EXPECT_TRUE(ResolveRunPlan(plain, 3, std::nullopt, 1).ok());
}

}  // namespace
}  // namespace memplan

namespace memplan {
namespace {

// [Sharded persistent state]: the plan's choice reaches the run; --persistent-state overrides it
// and needs several ranks.
TEST(ResolveRunPlanTest, PersistentStateShardingFromThePlanOrTheFlag) {
  auto plan = ParsePlanJson(R"({"plan": {"worldSize": 2, "shardPersistentState": true}})");
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_TRUE(plan->shard_persistent_state);
  EXPECT_THAT(ParsePlanJson(R"({"shard_persistent_state": "yes"})").status().message(),
              HasSubstr("plan.shard_persistent_state must be true or false"));
  auto run = ResolveRunPlan(TrainConfig{}, 3, *plan, 2);
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_TRUE(run->shard_persistent_state);
  auto parsed = ParseTrainArgs({"--arch", "llama-tiny", "--synthetic-data", "--persistent-state",
                                "replicated"});
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  run = ResolveRunPlan(*parsed, 3, *plan, 2);
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_FALSE(run->shard_persistent_state);
  parsed = ParseTrainArgs({"--arch", "llama-tiny", "--synthetic-data", "--persistent-state",
                           "sharded"});
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_THAT(ResolveRunPlan(*parsed, 3, std::nullopt, 1).status().message(),
              HasSubstr("--persistent-state sharded: this run has one rank"));
  run = ResolveRunPlan(*parsed, 3, std::nullopt, 3);
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_TRUE(run->shard_persistent_state);
  EXPECT_THAT(
      ParseTrainArgs({"--arch", "llama-tiny", "--synthetic-data", "--persistent-state", "half"})
          .status()
          .message(),
      HasSubstr("--persistent-state: \"half\" is not one of sharded, replicated"));
}

// [Sharded persistent parameters]: from the plan (with the state sharded) or --persistent-params,
// which implies the state sharded, conflicts with --persistent-state replicated and needs several
// ranks.
TEST(ResolveRunPlanTest, PersistentParameterShardingFromThePlanOrTheFlag) {
  auto plan = ParsePlanJson(
      R"({"plan": {"worldSize": 2, "shardPersistentState": true, "shardPersistentParams": true}})");
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_TRUE(plan->shard_persistent_params);
  // A full fine-tune's plan shards its parameters with the state, never alone.
  auto alone = ParsePlanJson(R"({"plan": {"worldSize": 2, "shardPersistentParams": true}})");
  ASSERT_TRUE(alone.ok()) << alone.status();
  EXPECT_THAT(ResolveRunPlan(TrainConfig{}, 3, *alone, 2).status().message(),
              HasSubstr("needs plan.shard_persistent_state = true for a full fine-tune"));
  auto run = ResolveRunPlan(TrainConfig{}, 3, *plan, 2);
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_TRUE(run->shard_persistent_params);
  EXPECT_TRUE(run->shard_persistent_state);
  // --persistent-state replicated on top of that plan: nothing persistent is sharded.
  auto parsed = ParseTrainArgs({"--arch", "llama-tiny", "--synthetic-data", "--persistent-state",
                                "replicated"});
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  run = ResolveRunPlan(*parsed, 3, *plan, 2);
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_FALSE(run->shard_persistent_state);
  EXPECT_FALSE(run->shard_persistent_params);
  parsed = ParseTrainArgs({"--arch", "llama-tiny", "--synthetic-data", "--persistent-params",
                           "sharded"});
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  run = ResolveRunPlan(*parsed, 3, std::nullopt, 2);
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_TRUE(run->shard_persistent_params);
  EXPECT_TRUE(run->shard_persistent_state);
  EXPECT_THAT(ResolveRunPlan(*parsed, 3, std::nullopt, 1).status().message(),
              HasSubstr("--persistent-params sharded: this run has one rank"));
  parsed = ParseTrainArgs({"--arch", "llama-tiny", "--synthetic-data", "--persistent-params",
                           "sharded", "--persistent-state", "replicated"});
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_THAT(ResolveRunPlan(*parsed, 3, std::nullopt, 2).status().message(),
              HasSubstr("needs the optimizer state sharded too"));
  EXPECT_THAT(ParseTrainArgs({"--arch", "llama-tiny", "--synthetic-data", "--persistent-params",
                              "most"})
                  .status()
                  .message(),
              HasSubstr("--persistent-params"));
}

// [Sharded frozen base]: the planner's LoRA / QLoRA plan shards the frozen base's persistent
// chunks with the state replicated (the base has none, the adapters stay replicated); the run
// applies it as priced, from a plan file or the planner, and --persistent-params sharded alone
// does the same without implying a sharded state.
TEST(ResolveRunPlanTest, LoraPlansShardTheFrozenBasesPersistentChunksAlone) {
  auto plan = ParsePlanJson(
      R"({"plan": {"worldSize": 2, "shardPersistentState": false, "shardPersistentParams": true}})");
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_TRUE(plan->shard_persistent_params);
  EXPECT_FALSE(plan->shard_persistent_state);
  auto parsed = ParseTrainArgs({"--arch", "llama-tiny", "--synthetic-data", "--lora-rank", "4",
                                "--lora-targets", "all", "--qlora"});
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  auto run = ResolveRunPlan(*parsed, 3, *plan, 2);
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_TRUE(run->shard_persistent_params);
  EXPECT_FALSE(run->shard_persistent_state);
  parsed = ParseTrainArgs({"--arch", "llama-tiny", "--synthetic-data", "--lora-rank", "4",
                           "--lora-targets", "all", "--persistent-params", "sharded"});
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  run = ResolveRunPlan(*parsed, 3, std::nullopt, 2);
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_TRUE(run->shard_persistent_params);
  EXPECT_FALSE(run->shard_persistent_state);
  // With --planner the flag is a fixed knob without the state (which the planner refuses for
  // adapters).
  const FixedKnobs fixed = PlannerFixedKnobs(*parsed);
  EXPECT_EQ(fixed.shard_persistent_params, true);
  EXPECT_FALSE(fixed.shard_persistent_state.has_value());
  parsed = ParseTrainArgs({"--arch", "llama-tiny", "--synthetic-data", "--lora-rank", "4",
                           "--lora-targets", "all", "--persistent-params", "replicated"});
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  run = ResolveRunPlan(*parsed, 3, *plan, 2);
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_FALSE(run->shard_persistent_params);
}

// --accumulate-offloaded-grads device: parsed, and refused on one rank.
TEST(ResolveRunPlanTest, OffloadedGradsOnTheDeviceNeedSeveralRanks) {
  auto parsed = ParseTrainArgs({"--arch", "llama-tiny", "--synthetic-data",
                                "--accumulate-offloaded-grads", "device"});
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_TRUE(parsed->accumulate_offloaded_grads_on_device);
  EXPECT_TRUE(ResolveRunPlan(*parsed, 3, std::nullopt, 2).ok());
  EXPECT_THAT(ResolveRunPlan(*parsed, 3, std::nullopt, 1).status().message(),
              HasSubstr("--accumulate-offloaded-grads device: this run has one rank"));
  EXPECT_THAT(ParseTrainArgs({"--arch", "llama-tiny", "--synthetic-data",
                              "--accumulate-offloaded-grads", "gpu"})
                  .status()
                  .message(),
              HasSubstr("--accumulate-offloaded-grads: \"gpu\" is not one of device, host"));
}

}  // namespace
}  // namespace memplan

namespace memplan {
namespace {

TEST(ParseTrainArgsTest, ArchFileIsOneOfTheModelSources) {
  auto parsed = ParseTrainArgs({"--arch-file", "/tmp/config.json", "--synthetic-data"});
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->arch_file, "/tmp/config.json");
  EXPECT_THAT(ParseTrainArgs({"--arch-file", "c.json", "--arch", "llama-tiny", "--synthetic-data"})
                  .status()
                  .message(),
              HasSubstr("give exactly one of --arch PRESET, --arch-file CONFIG or --model DIR"));
  EXPECT_THAT(ParseTrainArgs({"--synthetic-data"}).status().message(),
              HasSubstr("give exactly one of"));
}

// [Plan knobs are refused, never clamped]: the chunk manager clamped n_persist to the chunk count
// and ignored n_buffer when every chunk was persistent.
TEST(CheckRunPlanKnobsTest, RefusesKnobsOutsideTheLayoutNamingFieldValueAndRange) {
  ResidencyPlan file;
  file.n_persist = 1;
  file.n_buffer = 1000000;
  auto run = ResolveRunPlan(TrainConfig{}, 4, file);
  ASSERT_TRUE(run.ok()) << run.status();
  absl::Status s = CheckRunPlanKnobs(*run, 1, "--plan-file p.json");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("--plan-file p.json: plan.n_buffer = 1000000 is outside [0, 0]"));

  file.n_persist = 2;
  file.n_buffer = 0;
  run = ResolveRunPlan(TrainConfig{}, 4, file);
  ASSERT_TRUE(run.ok()) << run.status();
  s = CheckRunPlanKnobs(*run, 1, "--plan-file p.json");
  EXPECT_THAT(s.message(), HasSubstr("plan.n_persist = 2 is outside [0, 1]"));

  file.n_persist = 1;
  file.n_buffer = 3;
  run = ResolveRunPlan(TrainConfig{}, 4, file);
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_THAT(CheckRunPlanKnobs(*run, 3, "p").message(), HasSubstr("plan.n_buffer = 3 is outside [1, 2]"));
  EXPECT_TRUE(CheckRunPlanKnobs(*run, 4, "p").ok());

  // Flags are named as flags.
  TrainConfig c;
  c.n_persist = 9;
  run = ResolveRunPlan(c, 4, std::nullopt);
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_THAT(CheckRunPlanKnobs(*run, 5, "").message(), HasSubstr("--n-persist = 9 is outside [0, 5]"));
  c.n_persist = 5;
  c.n_buffer = 1;
  run = ResolveRunPlan(c, 4, std::nullopt);
  EXPECT_THAT(CheckRunPlanKnobs(*run, 5, "").message(), HasSubstr("--n-buffer = 1 is outside [0, 0]"));
  // 0, as the planner prints an all-persistent plan: accepted only when nothing is offloaded.
  const auto zero = ParseTrainArgs(
      {"--arch", "llama-3.2-1b", "--synthetic-data", "--n-persist", "5", "--n-buffer", "0"});
  ASSERT_TRUE(zero.ok()) << zero.status();
  EXPECT_EQ(zero->n_buffer, 0);
  c.n_buffer = 0;
  run = ResolveRunPlan(c, 4, std::nullopt);
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_TRUE(CheckRunPlanKnobs(*run, 5, "").ok());
  c.n_persist = 4;
  run = ResolveRunPlan(c, 4, std::nullopt);
  EXPECT_THAT(CheckRunPlanKnobs(*run, 5, "").message(), HasSubstr("--n-buffer = 0 is outside [1, 1]"));
}

TEST(CheckRunPlanKnobsTest, AcceptsWhatThePlannerWritesAndTheDefaults) {
  ResidencyPlan file;  // every chunk persistent: the planner writes n_buffer 0
  file.n_persist = 3;
  auto run = ResolveRunPlan(TrainConfig{}, 4, file);
  ASSERT_TRUE(run.ok());
  EXPECT_TRUE(CheckRunPlanKnobs(*run, 3, "p").ok());
  file.n_persist = 1;
  file.n_buffer = 2;
  run = ResolveRunPlan(TrainConfig{}, 4, file);
  EXPECT_TRUE(CheckRunPlanKnobs(*run, 3, "p").ok());
  TrainConfig c;  // --chunk-mib alone: n_persist 0, the default n_buffer
  c.chunk_bytes = 1 << 20;
  run = ResolveRunPlan(c, 4, std::nullopt);
  ASSERT_TRUE(run.ok());
  EXPECT_TRUE(CheckRunPlanKnobs(*run, 1, "").ok());
}

TEST(CheckSeqWithinPositionsTest, RefusesSequencesBeyondThePositionsNamingBothNumbers) {
  ModelSpec spec;
  spec.max_position_embeddings = 256;
  EXPECT_TRUE(CheckSeqWithinPositions(spec, 256).ok());
  const absl::Status s = CheckSeqWithinPositions(spec, 100000);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("--seq 100000"));
  EXPECT_THAT(s.message(), HasSubstr("max_position_embeddings = 256"));
}

TEST(CheckSeqWithinPositionsTest, RopeScalingExtendsThePositions) {
  ModelSpec linear;
  linear.max_position_embeddings = 4096;
  linear.rope_scaling.type = "linear";
  linear.rope_scaling.factor = 4;
  EXPECT_EQ(MaxTrainablePositions(linear), 16384);
  EXPECT_TRUE(CheckSeqWithinPositions(linear, 16384).ok());
  const absl::Status s = CheckSeqWithinPositions(linear, 16385);
  EXPECT_THAT(s.message(), HasSubstr("--seq 16385 exceeds the 16384 positions"));
  EXPECT_THAT(s.message(), HasSubstr("max_position_embeddings = 4096"));

  ModelSpec llama3;  // Llama 3.1: 8192 x 8 = 65536 within the config's 131072
  llama3.max_position_embeddings = 131072;
  llama3.rope_scaling.type = "llama3";
  llama3.rope_scaling.factor = 8;
  llama3.rope_scaling.original_max_position_embeddings = 8192;
  EXPECT_EQ(MaxTrainablePositions(llama3), 131072);

  ModelSpec yarn;
  yarn.max_position_embeddings = 32768;
  yarn.rope_scaling.type = "yarn";
  yarn.rope_scaling.factor = 4;
  yarn.rope_scaling.original_max_position_embeddings = 32768;
  EXPECT_EQ(MaxTrainablePositions(yarn), 131072);
  EXPECT_FALSE(CheckSeqWithinPositions(yarn, 131073).ok());
}

}  // namespace
}  // namespace memplan

namespace memplan {
namespace {

TEST(PlannerFixedKnobsTest, CarriesEveryKnobFlagAndShardedParamsImplyShardedState) {
  TrainConfig c;
  EXPECT_FALSE(AnyFixedKnob(PlannerFixedKnobs(c)));
  c.chunk_bytes = int64_t{32} << 20;
  c.n_persist = 2;
  c.n_buffer = 1;
  c.n_ckpt = 3;
  c.n_swap = 0;
  c.n_hs_offload = 1;
  c.host_memory = HostMemoryKind::kPageable;
  c.shard_persistent_params = true;
  const FixedKnobs f = PlannerFixedKnobs(c);
  EXPECT_EQ(f.chunk_bytes, int64_t{32} << 20);
  EXPECT_EQ(f.n_persist, 2);
  EXPECT_EQ(f.n_buffer, 1);
  EXPECT_EQ(f.n_checkpoint, 3);
  EXPECT_EQ(f.n_swap, 0);
  EXPECT_EQ(f.n_hs_offload, 1);
  EXPECT_EQ(f.host_memory, HostMemoryKind::kPageable);
  EXPECT_EQ(f.shard_persistent_state, true);
  EXPECT_EQ(f.shard_persistent_params, true);
}

// transformers' schedule lambdas written out again (optimization.py): the factor after `step`
// scheduler steps of a run of `total` with `warmup` warmup steps.
double ReferenceCosine(int64_t step, int64_t warmup, int64_t total, double min_ratio) {
  if (step < warmup) return static_cast<double>(step) / std::max<double>(1.0, warmup);
  const double progress = static_cast<double>(step - warmup) / std::max<double>(1.0, total - warmup);
  const double num_cycles = 0.5;
  double factor = 0.5 * (1.0 + std::cos(3.14159265358979323846 * num_cycles * 2.0 * progress));
  factor = factor * (1.0 - min_ratio) + min_ratio;
  return std::max(0.0, factor);
}

TEST(LearningRateFactorTest, CosineWithWarmupIsTransformersFormula) {
  LrSchedule cosine;
  cosine.kind = LrSchedule::Kind::kCosine;
  cosine.warmup_steps = 10;
  for (int64_t step : {0, 1, 5, 9, 10, 11, 30, 55, 99, 100}) {
    EXPECT_DOUBLE_EQ(LearningRateFactor(cosine, step, 100), ReferenceCosine(step, 10, 100, 0))
        << step;
  }
  // Landmarks: 0 at the start, half way up the warmup, the peak, half way down, the end.
  EXPECT_EQ(LearningRateFactor(cosine, 0, 100), 0.0);
  EXPECT_DOUBLE_EQ(LearningRateFactor(cosine, 5, 100), 0.5);
  EXPECT_DOUBLE_EQ(LearningRateFactor(cosine, 10, 100), 1.0);
  EXPECT_NEAR(LearningRateFactor(cosine, 55, 100), 0.5, 1e-15);
  EXPECT_NEAR(LearningRateFactor(cosine, 100, 100), 0.0, 1e-15);

  cosine.min_lr_ratio = 0.1;
  for (int64_t step : {0, 3, 10, 40, 77, 100}) {
    EXPECT_DOUBLE_EQ(LearningRateFactor(cosine, step, 100), ReferenceCosine(step, 10, 100, 0.1))
        << step;
  }
  EXPECT_NEAR(LearningRateFactor(cosine, 100, 100), 0.1, 1e-15);
  // No warmup: the first update already runs at the full rate.
  cosine.warmup_steps = 0;
  EXPECT_DOUBLE_EQ(LearningRateFactor(cosine, 0, 100), 1.0);
}

TEST(LearningRateFactorTest, ConstantKeepsTheRateAfterItsWarmup) {
  LrSchedule constant;
  EXPECT_EQ(LearningRateFactor(constant, 0, 10), 1.0);
  EXPECT_EQ(LearningRateFactor(constant, 9, 10), 1.0);
  constant.warmup_steps = 4;
  EXPECT_EQ(LearningRateFactor(constant, 0, 10), 0.0);
  EXPECT_EQ(LearningRateFactor(constant, 2, 10), 0.5);
  EXPECT_EQ(LearningRateFactor(constant, 4, 10), 1.0);
}

// [Device updates of offloaded chunks]: off unless asked for, a share in [0, 1].
TEST(ParseTrainArgsTest, DeviceUpdateShare) {
  auto c = ParseTrainArgs({"--arch", "llama-tiny", "--synthetic-data"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->device_update_share, 0.0);
  c = ParseTrainArgs({"--arch", "llama-tiny", "--synthetic-data", "--device-update-share", "0.5"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->device_update_share, 0.5);
  const auto bad =
      ParseTrainArgs({"--arch", "llama-tiny", "--synthetic-data", "--device-update-share", "1.5"});
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("--device-update-share"));
}

TEST(ParseTrainArgsTest, ScheduleAndEvaluationFlags) {
  const std::vector<std::string> base = {"--arch", "llama-tiny", "--synthetic-data"};
  auto with = [&base](std::vector<std::string> more) {
    std::vector<std::string> args = base;
    args.insert(args.end(), more.begin(), more.end());
    return ParseTrainArgs(args);
  };
  auto c = with({});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->lr_schedule.kind, LrSchedule::Kind::kConstant);
  EXPECT_EQ(c->lr_schedule.warmup_steps, 0);
  EXPECT_TRUE(c->eval_tokens_file.empty());

  c = with({"--lr-schedule", "cosine", "--warmup-steps", "20", "--min-lr-ratio", "0.1",
            "--eval-tokens", "held.tokens", "--eval-every", "50", "--eval-batches", "8"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->lr_schedule.kind, LrSchedule::Kind::kCosine);
  EXPECT_EQ(c->lr_schedule.warmup_steps, 20);
  EXPECT_EQ(c->lr_schedule.min_lr_ratio, 0.1);
  EXPECT_EQ(c->eval_tokens_file, "held.tokens");
  EXPECT_EQ(c->eval_every, 50);
  EXPECT_EQ(c->eval_batches, 8);

  EXPECT_THAT(with({"--lr-schedule", "linear"}).status().message(), HasSubstr("--lr-schedule"));
  EXPECT_THAT(with({"--lr-schedule", "cosine", "--min-lr-ratio", "1.5"}).status().message(),
              HasSubstr("--min-lr-ratio"));
  EXPECT_THAT(with({"--min-lr-ratio", "0.1"}).status().message(),
              HasSubstr("--min-lr-ratio: applies to --lr-schedule cosine"));
  EXPECT_THAT(with({"--eval-every", "5"}).status().message(),
              HasSubstr("--eval-every: needs --eval-tokens"));
  EXPECT_THAT(with({"--eval-tokens", "x", "--eval-batches", "0"}).status().message(),
              HasSubstr("--eval-batches"));
}

// --pinned-activations: auto (the default), caching or exact; anything else is refused by name.
TEST(TrainConfigTest, PinnedActivationsChoosesTheHostAllocator) {
  auto plain = ParseTrainArgs({"--arch", "llama-tiny", "--synthetic-data"});
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ(plain->pinned_activations, PinnedActivations::kAuto);
  for (const auto& [name, mode] : {std::pair<std::string, PinnedActivations>{
                                       "auto", PinnedActivations::kAuto},
                                   {"caching", PinnedActivations::kCaching},
                                   {"exact", PinnedActivations::kExact}}) {
    auto parsed = ParseTrainArgs(
        {"--arch", "llama-tiny", "--synthetic-data", "--pinned-activations", name});
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(parsed->pinned_activations, mode) << name;
  }
  EXPECT_THAT(ParseTrainArgs(
                  {"--arch", "llama-tiny", "--synthetic-data", "--pinned-activations", "pow2"})
                  .status()
                  .message(),
              HasSubstr("--pinned-activations: \"pow2\" is not one of auto, caching, exact"));
}

// [Pinned copies by the plan's room] auto page-locks the copies at their exact size exactly when
// twice them (the caching allocator's worst case) beside the plan's other host bytes would not
// fit the node's RAM less the planner's [Host reserve], on every local rank.
TEST(TrainConfigTest, AutoPinnedActivationsGoExactWhereRoundingCouldNotFit) {
  constexpr int64_t kGiB = int64_t{1} << 30;
  PinnedActivationsRoom room;
  room.prediction_known = true;
  room.pinned_plan = true;
  room.local_ranks = 1;
  room.host_memory_bytes = 126 * kGiB;
  // The reserve of 126 GiB and one rank: 10.1 + 4 GiB; a plan may use 111.9 GiB.
  const int64_t usable = room.host_memory_bytes - HostReserveBytes(room.host_memory_bytes, 1);
  EXPECT_NEAR(static_cast<double>(usable) / kGiB, 111.9, 0.05);
  // The seed-4848 plan: 115.3 GiB of host bytes, nearly all of them activation copies.
  room.planned_host_bytes = static_cast<int64_t>(115.3 * kGiB);
  room.pinned_activation_bytes = static_cast<int64_t>(115.0 * kGiB);
  PinnedActivationsChoice c = ChoosePinnedActivations(PinnedActivations::kAuto, room);
  EXPECT_TRUE(c.exact);
  EXPECT_THAT(c.reason, HasSubstr("115.0 GiB of activation copies a rank"));
  EXPECT_THAT(c.reason, HasSubstr("230.3 GiB of the 111.9 GiB"));
  // At the edge: worst case = usable fits, one byte more does not.
  room.planned_host_bytes = usable / 2;
  room.pinned_activation_bytes = usable - usable / 2;
  EXPECT_FALSE(ChoosePinnedActivations(PinnedActivations::kAuto, room).exact);
  room.pinned_activation_bytes += 1;
  EXPECT_TRUE(ChoosePinnedActivations(PinnedActivations::kAuto, room).exact);
  // Two local ranks share the node: each rank's bytes count twice, and the reserve holds 4 GiB
  // more.
  room.planned_host_bytes = 30 * kGiB;
  room.pinned_activation_bytes = 27 * kGiB;  // 57 GiB fits 111.9; 2 x 57 does not fit 107.9
  EXPECT_FALSE(ChoosePinnedActivations(PinnedActivations::kAuto, room).exact);
  room.local_ranks = 2;
  EXPECT_TRUE(ChoosePinnedActivations(PinnedActivations::kAuto, room).exact);
  // No prediction, no pinned copies or pageable copies: the caching allocator.
  PinnedActivationsRoom unknown = room;
  unknown.prediction_known = false;
  c = ChoosePinnedActivations(PinnedActivations::kAuto, unknown);
  EXPECT_FALSE(c.exact);
  EXPECT_THAT(c.reason, HasSubstr("no planner prediction"));
  PinnedActivationsRoom pageable = room;
  pageable.pinned_plan = false;
  EXPECT_FALSE(ChoosePinnedActivations(PinnedActivations::kAuto, pageable).exact);
  PinnedActivationsRoom no_copies = room;
  no_copies.pinned_activation_bytes = 0;
  EXPECT_FALSE(ChoosePinnedActivations(PinnedActivations::kAuto, no_copies).exact);
  // The flags win either way.
  EXPECT_FALSE(ChoosePinnedActivations(PinnedActivations::kCaching, room).exact);
  EXPECT_TRUE(ChoosePinnedActivations(PinnedActivations::kExact, no_copies).exact);
}

// [Speculative clipped updates] auto speculates exactly when the plan's host bytes and the
// copies fit the node's RAM less the [Host reserve] on every local rank; never where speculation
// does not apply or without a prediction; the flags win.
TEST(TrainConfigTest, AutoSpeculativeClipNeedsRoomForTheCopies) {
  constexpr int64_t kGiB = int64_t{1} << 30;
  // llama-3.1-8b adamw_bf16, 62 offloaded 128 MiB chunks: 6 bytes of copies per element.
  EXPECT_EQ(SpeculationBackupBytes(OptimizerKind::kAdamWBf16States, 2, 128 << 20), 384 << 20);
  // adamw on bf16: the fp32 master and fp32 moments (the parameters are rounded from the master).
  EXPECT_EQ(SpeculationBackupBytes(OptimizerKind::kAdamW, 2, 128 << 20), int64_t{768} << 20);
  SpeculativeClipRoom room;
  room.applies = true;
  room.pays = true;
  room.prediction_known = true;
  room.local_ranks = 1;
  room.host_memory_bytes = 126 * kGiB;
  const int64_t usable = PlanHostBytes(room.host_memory_bytes, 1);
  room.backup_bytes = 62 * (int64_t{384} << 20);
  room.planned_host_bytes = usable - room.backup_bytes;
  SpeculativeClipChoice c = ChooseSpeculativeClip(SpeculativeClip::kAuto, room);
  EXPECT_TRUE(c.on) << c.reason;
  EXPECT_THAT(c.reason, HasSubstr("23.2 GiB of copies a rank fits the 111.9 GiB"));
  room.planned_host_bytes += 1;
  c = ChooseSpeculativeClip(SpeculativeClip::kAuto, room);
  EXPECT_FALSE(c.on);
  EXPECT_THAT(c.reason, HasSubstr("more than the 111.9 GiB"));
  // Two local ranks: each rank's bytes count twice.
  room.planned_host_bytes = 40 * kGiB;
  EXPECT_TRUE(ChooseSpeculativeClip(SpeculativeClip::kAuto, room).on);
  room.local_ranks = 2;
  EXPECT_FALSE(ChooseSpeculativeClip(SpeculativeClip::kAuto, room).on);
  room.local_ranks = 1;
  SpeculativeClipRoom unknown = room;
  unknown.prediction_known = false;
  EXPECT_THAT(ChooseSpeculativeClip(SpeculativeClip::kAuto, unknown).reason,
              HasSubstr("no planner prediction"));
  EXPECT_TRUE(ChooseSpeculativeClip(SpeculativeClip::kOn, unknown).on);
  SpeculativeClipRoom not_applying = room;
  not_applying.applies = false;
  EXPECT_FALSE(ChooseSpeculativeClip(SpeculativeClip::kOn, not_applying).on);
  EXPECT_FALSE(ChooseSpeculativeClip(SpeculativeClip::kOff, room).on);
  // Where speculation is not measured to pay auto leaves it off; on still turns it on.
  SpeculativeClipRoom unmeasured = room;
  unmeasured.pays = false;
  EXPECT_THAT(ChooseSpeculativeClip(SpeculativeClip::kAuto, unmeasured).reason,
              HasSubstr("not measured to pay"));
  EXPECT_FALSE(ChooseSpeculativeClip(SpeculativeClip::kAuto, unmeasured).on);
  EXPECT_TRUE(ChooseSpeculativeClip(SpeculativeClip::kOn, unmeasured).on);
  EXPECT_TRUE(SpeculationPays(OptimizerKind::kAdamW8bit));
  EXPECT_TRUE(SpeculationPays(OptimizerKind::kAdamWBf16States));
  EXPECT_FALSE(SpeculationPays(OptimizerKind::kAdamW));
  EXPECT_FALSE(SpeculationPays(OptimizerKind::kSgd));
  // What applies: clipping, one rank, one micro-batch, no non-finite check.
  EXPECT_TRUE(SpeculationApplies(true, 1, 1, false));
  EXPECT_FALSE(SpeculationApplies(false, 1, 1, false));
  EXPECT_FALSE(SpeculationApplies(true, 2, 1, false));
  EXPECT_FALSE(SpeculationApplies(true, 1, 2, false));
  EXPECT_FALSE(SpeculationApplies(true, 1, 1, true));
}

}  // namespace
}  // namespace memplan
