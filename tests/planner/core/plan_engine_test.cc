#include "planner/core/plan_engine.h"

#include <cmath>
#include <cstdio>

#include "common/nf4_bytes.h"
#include "common/presets.h"
#include "gtest/gtest.h"

namespace memplan {
namespace {

constexpr int64_t kMiB = int64_t{1} << 20;
constexpr int64_t kGiB = int64_t{1} << 30;

PlanInputs Inputs(const std::string& model, const std::string& card, int64_t batch, int64_t seq,
                  int32_t world = 1) {
  PlanInputs in;
  in.arch = *FindModelPreset(model);
  in.hardware = *FindHardwarePreset(card);
  in.workload.micro_batch = batch;
  in.workload.seq_len = seq;
  in.workload.world_size = world;
  return in;
}

std::string ErrorOf(const PlanInputs& in) {
  auto out = MakePlan(in);
  EXPECT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(out.status().message());
}

bool Fits(PlanInputs in) {
  in.skip_limits = true;
  in.max_alternatives = 0;
  auto out = MakePlan(in);
  EXPECT_TRUE(out.ok()) << out.status();
  return out->fits;
}

int64_t Required(const Prediction& p) { return std::max(p.peak_bytes, p.load_peak_bytes); }

TEST(PlanEngineTest, InvalidInputsNameTheField) {
  PlanInputs in = Inputs("llama-3.2-1b", "h100-80gb", 1, 2048);
  in.safety_margin = 0.7;
  EXPECT_NE(ErrorOf(in).find("safety_margin"), std::string::npos);
  in = Inputs("llama-3.2-1b", "h100-80gb", 1, 0);
  EXPECT_NE(ErrorOf(in).find("workload.seq_len"), std::string::npos);
  in = Inputs("llama-3.2-1b", "h100-80gb", 1, 2048);
  in.fixed.n_persist = 100000;
  const std::string msg = ErrorOf(in);
  EXPECT_NE(msg.find("fixed.n_persist = 100000 is out of range; allowed [0, "), std::string::npos)
      << msg;
  in = Inputs("llama-3.2-1b", "h100-80gb", 1, 2048);
  in.fixed.n_checkpoint = 17;
  EXPECT_NE(ErrorOf(in).find("fixed.n_checkpoint = 17 is out of range; allowed [0, 16]"),
            std::string::npos);
  in = Inputs("llama-3.2-1b", "h100-80gb", 1, 2048);
  in.fixed.n_checkpoint = 10;
  in.fixed.n_swap = 10;
  EXPECT_NE(ErrorOf(in).find("fixed.n_swap + fixed.n_checkpoint + fixed.n_hs_offload"),
            std::string::npos);
  in = Inputs("llama-3.2-1b", "h100-80gb", 1, 2048);
  in.fixed.chunk_bytes = 1000;
  EXPECT_NE(ErrorOf(in).find("fixed.chunk_bytes"), std::string::npos);
  in = Inputs("llama-3.2-1b", "h100-80gb", 1, 2048);
  in.arch.num_kv_heads = 3;
  EXPECT_NE(ErrorOf(in).find("arch.num_kv_heads"), std::string::npos);
  in = Inputs("llama-3.2-1b", "h100-80gb", 1, 2048);
  in.hardware.gpu_memory_bytes = in.hardware.cuda_context_bytes;
  EXPECT_NE(ErrorOf(in).find("hardware."), std::string::npos);
  in = Inputs("llama-3.2-1b", "h100-80gb", 1, 2048, 4);
  in.hardware.nccl_allgather_bytes_per_second = 0;
  EXPECT_NE(ErrorOf(in).find("hardware.nccl_allgather_bytes_per_second"), std::string::npos);
  in = Inputs("llama-3.2-1b", "h100-80gb", 1, 2048);
  in.fragmentation_factor = 0;
  EXPECT_NE(ErrorOf(in).find("fragmentation_factor"), std::string::npos);
  in = Inputs("llama-3.2-1b", "h100-80gb", 1, 2048);
  in.profiled_trace = Trace{};
  EXPECT_NE(ErrorOf(in).find("profiled_trace.blocks"), std::string::npos);
}

TEST(PlanEngineTest, SmallModelFitsWithoutOffload) {
  PlanInputs in = Inputs("llama-3.2-1b", "h100-80gb", 1, 2048);
  auto out = MakePlan(in);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_TRUE(out->fits);
  EXPECT_EQ(out->plan.n_persist, out->plan.n_chunks);
  EXPECT_EQ(out->plan.n_checkpoint + out->plan.n_swap + out->plan.n_hs_offload, 0);
  EXPECT_LE(Required(out->prediction), out->capacity_bytes);
  EXPECT_EQ(
      out->capacity_bytes,
      static_cast<int64_t>(std::floor(static_cast<double>(in.hardware.gpu_memory_bytes) * 0.95)));
  EXPECT_NE(out->reason.find("fits"), std::string::npos);
  EXPECT_GT(out->prediction.tokens_per_second, 0);
  EXPECT_EQ(out->trace_used.chunk_bytes, out->plan.chunk_bytes);
  EXPECT_EQ(static_cast<int32_t>(out->trace_used.chunk_param_bytes.size()), out->plan.n_chunks);
  EXPECT_GT(out->plans_evaluated, 0);
}

TEST(PlanEngineTest, BigModelOffloadsAndExplains) {
  PlanInputs in = Inputs("llama-3.1-70b", "h100-80gb", 1, 4096, 8);
  in.workload.local_world_size = 1;  // one rank per node: each has the preset's 256 GiB
  auto out = MakePlan(in);
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_TRUE(out->fits) << out->reason;
  EXPECT_LT(out->plan.n_persist, out->plan.n_chunks);
  EXPECT_GT(out->prediction.host_pinned_bytes, 0);
  EXPECT_LE(out->prediction.host_pinned_bytes, in.hardware.host_memory_bytes);
  // Alternatives lie on the frontier: each needs less memory and is no faster than the best.
  ASSERT_FALSE(out->alternatives.empty());
  EXPECT_EQ(out->alternatives.size(), out->alternative_notes.size());
  int64_t previous = Required(out->prediction);
  for (const auto& [plan, pred] : out->alternatives) {
    EXPECT_LT(Required(pred), previous);
    EXPECT_GE(pred.iteration_seconds, out->prediction.iteration_seconds * (1 - 1e-12));
    previous = Required(pred);
  }
}

TEST(PlanEngineTest, TooSmallCardDoesNotFitAndNamesTheSmallestThatDoes) {
  PlanInputs in = Inputs("llama-3.1-8b", "rtx-4090", 32, 8192);
  in.hardware.host_memory_bytes = 4096 * kGiB;
  auto out = MakePlan(in);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_FALSE(out->fits);
  EXPECT_NE(out->reason.find("does not fit"), std::string::npos) << out->reason;
  ASSERT_GT(out->min_gpu_memory_bytes, in.hardware.gpu_memory_bytes);
  EXPECT_LT(out->max_micro_batch, 32);
  // The least-bad plan fits the smallest card that fits.
  EXPECT_LE(Required(out->prediction),
            static_cast<int64_t>(static_cast<double>(out->min_gpu_memory_bytes) * 0.95));
}

TEST(PlanEngineTest, HostMemoryCanBeTheBlocker) {
  PlanInputs in = Inputs("llama-3.1-70b", "h100-80gb", 1, 4096, 1);
  in.hardware.host_memory_bytes = 64 * kGiB;
  auto out = MakePlan(in);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_FALSE(out->fits);
  EXPECT_NE(out->reason.find("host memory"), std::string::npos) << out->reason;
}

// Issue 10's target: a 45 B Llama-70B-shaped model (the 70B preset cut to 50 layers, 44.9 B
// parameters). One rank on a 126 GiB host: DOES NOT FIT (AdamW state alone is ~754 GiB of host
// memory). Eight ranks of one host with 1 TiB: FITS, each rank holding 1/8 of every offloaded
// chunk. Eight ranks on the 126 GiB host: still DOES NOT FIT, because the ranks share the node's
// RAM (host_memory_bytes / local_world_size each).
TEST(PlanEngineTest, FortyFiveBillionFitsEightRanksOfATebibyteHost) {
  PlanInputs in = Inputs("llama-3.1-70b", "h100-80gb", 1, 2048);
  in.arch.num_layers = 50;
  in.skip_limits = true;
  in.max_alternatives = 0;
  in.hardware.host_memory_bytes = 126 * kGiB;
  auto one = MakePlan(in);
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_FALSE(one->fits);
  EXPECT_NE(one->reason.find("host memory"), std::string::npos) << one->reason;
  // [Host reserve] 8 % of 126 GiB (10.1) for the system and 4 GiB for the one rank's runtime.
  EXPECT_NE(one->reason.find("111.9 GiB of RAM per GPU (126.0 GiB, 14.1 GiB held back for the "
                             "system)"),
            std::string::npos)
      << one->reason;
  std::printf("1 rank, 126 GiB: %s\n", one->reason.c_str());

  in.workload.world_size = 8;
  in.workload.local_world_size = 8;
  auto shared = MakePlan(in);
  ASSERT_TRUE(shared.ok()) << shared.status();
  EXPECT_FALSE(shared->fits);
  // 126 GiB less 10.1 GiB and 8 x 4 GiB, over 8 ranks.
  EXPECT_NE(shared->reason.find("10.5 GiB of RAM per rank (126.0 GiB shared by 8 local ranks, "
                                "42.1 GiB held back for the system)"),
            std::string::npos)
      << shared->reason;

  in.hardware.host_memory_bytes = 1024 * kGiB;
  auto eight = MakePlan(in);
  ASSERT_TRUE(eight.ok()) << eight.status();
  ASSERT_TRUE(eight->fits) << eight->reason;
  EXPECT_EQ(eight->plan.world_size, 8);
  const RankMemory& r = eight->prediction.rank_memory;
  EXPECT_EQ(r.world_size, 8);
  EXPECT_EQ(r.local_world_size, 8);
  const int64_t rank_host =
      eight->prediction.host_pinned_bytes + eight->prediction.host_pageable_bytes;
  EXPECT_EQ(r.node_host_bytes, 8 * rank_host);
  EXPECT_LE(r.node_host_bytes, in.hardware.host_memory_bytes);
  EXPECT_LE(rank_host, in.hardware.host_memory_bytes / 8);
  EXPECT_LE(r.chunk_host_pinned_bytes + r.chunk_host_pageable_bytes, rank_host);
  EXPECT_LE(eight->prediction.peak_bytes, eight->capacity_bytes);
  std::printf(
      "45 B, 8 ranks, 1 TiB: %d/%d chunks persistent, peak %.1f GiB, per rank host %.1f "
      "GiB, node %.1f GiB\n",
      eight->plan.n_persist, eight->plan.n_chunks,
      static_cast<double>(eight->prediction.peak_bytes) / kGiB,
      static_cast<double>(rank_host) / kGiB, static_cast<double>(r.node_host_bytes) / kGiB);
}

TEST(PlanEngineTest, LimitsAreTight) {
  // Four sequences per micro-batch: device memory, not the model's 131 072-token context, bounds
  // the sequence length (with the chunked head one 8B sequence of 131 072 tokens fits this card).
  PlanInputs in = Inputs("llama-3.1-8b", "a100-80gb", 4, 4096);
  auto out = MakePlan(in);
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_TRUE(out->fits) << out->reason;
  ASSERT_LT(out->max_seq_len, in.arch.max_position_embeddings);
  // Largest micro-batch and sequence length: they fit, one more does not.
  ASSERT_GE(out->max_micro_batch, 1);
  PlanInputs probe = in;
  probe.workload.micro_batch = out->max_micro_batch;
  EXPECT_TRUE(Fits(probe));
  probe.workload.micro_batch = out->max_micro_batch + 1;
  EXPECT_FALSE(Fits(probe));
  probe = in;
  probe.workload.seq_len = out->max_seq_len;
  EXPECT_TRUE(Fits(probe));
  probe.workload.seq_len = out->max_seq_len + 1;
  EXPECT_FALSE(Fits(probe));
  // Smallest card: it fits, 1 MiB less does not.
  probe = in;
  probe.hardware.gpu_memory_bytes = out->min_gpu_memory_bytes;
  EXPECT_TRUE(Fits(probe));
  probe.hardware.gpu_memory_bytes = out->min_gpu_memory_bytes - kMiB;
  EXPECT_FALSE(Fits(probe));
}

TEST(PlanEngineTest, FixedKnobsAreConstraints) {
  PlanInputs in = Inputs("llama-3.1-8b", "h100-80gb", 1, 4096);
  in.skip_limits = true;
  in.fixed.n_checkpoint = 32;
  in.fixed.chunk_bytes = 64 * kMiB;
  in.fixed.host_memory = HostMemoryKind::kPageable;
  auto out = MakePlan(in);
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_TRUE(out->fits) << out->reason;
  EXPECT_EQ(out->plan.n_checkpoint, 32);
  EXPECT_EQ(out->plan.chunk_bytes, 64 * kMiB);
  EXPECT_EQ(out->plan.host_memory, HostMemoryKind::kPageable);
  // An infeasible fixed knob is a "does not fit" naming it, never silently dropped.
  in = Inputs("llama-3.1-8b", "h100-80gb", 1, 4096);
  in.skip_limits = true;
  in.fixed.chunk_bytes = 64 * kMiB;
  in.fixed.n_persist = 0;
  in.fixed.n_buffer = 1;
  out = MakePlan(in);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_FALSE(out->fits);
  EXPECT_NE(out->reason.find("fixed.n_buffer = 1"), std::string::npos) << out->reason;
  in = Inputs("llama-3.1-8b", "h100-80gb", 1, 4096);
  in.skip_limits = true;
  in.fixed.n_persist = 220;  // too many persistent chunks (of 226 at 32 MiB) for 80 GB
  in.fixed.chunk_bytes = 32 * kMiB;
  out = MakePlan(in);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_FALSE(out->fits);
  EXPECT_NE(out->reason.find("fixed.n_persist = 220"), std::string::npos) << out->reason;
}

// [Fixed knob conflicts]: a combination that no amount of memory can run names the knob and the
// rule it breaks, not the GPU's capacity.
TEST(PlanEngineTest, ImpossibleFixedKnobsNameTheKnobNotMemory) {
  PlanInputs in = Inputs("llama-3.2-3b", "h200", 2, 4096);
  in.skip_limits = true;
  in.max_alternatives = 0;
  in.fixed.chunk_bytes = 64 * kMiB;
  in.fixed.n_persist = 40;
  in.fixed.n_buffer = 8;
  in.fixed.n_swap = 10;
  in.fixed.n_checkpoint = 8;
  in.fixed.n_hs_offload = 10;
  absl::StatusOr<PlanOutcome> out = MakePlan(in);
  ASSERT_TRUE(out.ok()) << out.status();
  // With one layout (issue 14) these knobs are possible and fit a 140 GiB card.
  EXPECT_TRUE(out->fits) << out->reason;
  EXPECT_EQ(out->plan.n_persist, 40);
  EXPECT_EQ(out->plan.n_buffer, 8);

  // n_persist beyond the chunk count of the fixed chunk size.
  in = Inputs("llama-3.2-1b", "h200", 1, 2048);
  in.skip_limits = true;
  in.max_alternatives = 0;
  in.fixed.chunk_bytes = 256 * kMiB;
  const int32_t chunks = [&] {
    PlanInputs probe = in;
    auto o = MakePlan(probe);
    EXPECT_TRUE(o.ok());
    return o.ok() ? o->plan.n_chunks : 0;
  }();
  ASSERT_GT(chunks, 2);
  // More buffers than offloaded chunks.
  in.fixed.n_persist = chunks - 2;
  in.fixed.n_buffer = 3;
  out = MakePlan(in);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_FALSE(out->fits);
  EXPECT_NE(out->reason.find("fixed.n_buffer = 3 exceeds the 2 offloaded chunks"),
            std::string::npos)
      << out->reason;
  EXPECT_EQ(out->reason.find("usable"), std::string::npos) << out->reason;
  // Buffers with every chunk persistent.
  in.fixed.n_persist = chunks;
  in.fixed.n_buffer = 1;
  out = MakePlan(in);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_FALSE(out->fits);
  EXPECT_NE(out->reason.find("fixed.n_buffer = 1 with fixed.n_persist"), std::string::npos)
      << out->reason;
  // Fewer buffers than a group needs.
  in.fixed.n_persist = 0;
  in.fixed.n_buffer = 1;
  out = MakePlan(in);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_FALSE(out->fits);
  EXPECT_NE(out->reason.find("fixed.n_buffer = 1 is below the"), std::string::npos)
      << out->reason;
}

TEST(PlanEngineTest, PredictPlanRepredictsAndHonoursTheCalibrationContract) {
  PlanInputs in = Inputs("llama-3.1-8b", "h100-80gb", 1, 4096);
  in.skip_limits = true;
  in.fragmentation_factor = 1.07;
  in.residual_bytes = 300 * kMiB;
  auto out = MakePlan(in);
  ASSERT_TRUE(out.ok()) << out.status();
  auto again = PredictPlan(in, out->plan);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->peak_bytes, out->prediction.peak_bytes);
  EXPECT_DOUBLE_EQ(again->iteration_seconds, out->prediction.iteration_seconds);
  const MemoryBreakdown& b = again->breakdown;
  ASSERT_GT(b.exact_bytes, 0);
  EXPECT_EQ(again->peak_bytes,
            b.exact_bytes +
                static_cast<int64_t>(std::ceil(
                    1.07 * static_cast<double>(RawModelBytes(*again) - b.exact_bytes))) +
                300 * kMiB + in.hardware.cuda_context_bytes);
  EXPECT_DOUBLE_EQ(b.fragmentation_factor, 1.07);
  EXPECT_EQ(b.calibration_residual_bytes, 300 * kMiB);
  // A larger alpha never predicts less.
  PlanInputs more = in;
  more.fragmentation_factor = 1.2;
  auto bigger = PredictPlan(more, out->plan);
  ASSERT_TRUE(bigger.ok());
  EXPECT_GT(bigger->peak_bytes, again->peak_bytes);
  // A malformed plan is INVALID_ARGUMENT naming the field.
  ResidencyPlan bad = out->plan;
  bad.n_persist = -1;
  auto err = PredictPlan(in, bad);
  ASSERT_FALSE(err.ok());
  EXPECT_NE(err.status().message().find("plan.n_persist"), std::string::npos);
}

TEST(PlanEngineTest, ProfiledTraceIsUsedAndScaled) {
  PlanInputs in = Inputs("llama-3.2-1b", "h100-80gb", 2, 2048);
  in.skip_limits = true;
  auto analytic = MakePlan(in);
  ASSERT_TRUE(analytic.ok());
  Trace profiled = analytic->trace_used;
  profiled.analytic = false;
  for (BlockTrace& b : profiled.blocks) b.saved_bytes *= 2;  // the profiler saw more
  in.profiled_trace = profiled;
  auto with_profile = MakePlan(in);
  ASSERT_TRUE(with_profile.ok()) << with_profile.status();
  EXPECT_FALSE(with_profile->trace_used.analytic);
  EXPECT_GT(with_profile->prediction.peak_bytes, analytic->prediction.peak_bytes);
  // A different workload scales the profiled trace linearly in tokens.
  in.workload.micro_batch = 4;
  auto scaled = MakePlan(in);
  ASSERT_TRUE(scaled.ok());
  EXPECT_EQ(scaled->trace_used.blocks[0].saved_bytes, 2 * profiled.blocks[0].saved_bytes);
}

TEST(PlanEngineTest, LoraNeedsFarLessMemory) {
  PlanInputs full = Inputs("llama-3.1-8b", "rtx-4090", 1, 2048);
  full.skip_limits = true;
  PlanInputs lora = full;
  lora.training.kind = TrainingKind::kLora;
  lora.training.lora_rank = 16;
  lora.training.lora_target_modules = {"q_proj", "k_proj", "v_proj", "o_proj"};
  auto f = MakePlan(full);
  auto l = MakePlan(lora);
  ASSERT_TRUE(f.ok() && l.ok());
  EXPECT_LT(l->prediction.host_pinned_bytes + l->prediction.breakdown.optimizer_state_bytes,
            f->prediction.host_pinned_bytes + f->prediction.breakdown.optimizer_state_bytes);
  EXPECT_TRUE(l->fits) << l->reason;
}

// Issue 31's user: qwen3-32b QLoRA (rank 64, every linear layer) on two 24 GB cards of a 32 GiB
// host. Each rank loads and quantizes only its shards ([Sharded NF4 loading], agent/train), so
// its host bytes are its shards of the offloaded NF4 base (plus its activations), and the two
// ranks share the node's RAM less the reserve (which holds the weights in flight while loading).
// The whole NF4 base on every rank, what the agent loaded before, would not fit the node; too
// small a host makes the plan not fit, naming the RAM per rank, unless the persistent base is
// sharded over the cards too.
TEST(PlanEngineTest, QloraRanksShareTheNodesRamWithTheirShards) {
  PlanInputs in = Inputs("qwen3-32b", "rtx-4090", 1, 2048, 2);
  in.training.kind = TrainingKind::kQlora;
  in.training.lora_rank = 64;
  in.training.lora_target_modules = {"q_proj", "k_proj", "v_proj", "o_proj",
                                     "gate_proj", "up_proj", "down_proj"};
  in.hardware.host_memory_bytes = 32 * kGiB;
  in.skip_limits = true;
  in.max_alternatives = 0;
  auto two = MakePlan(in);
  ASSERT_TRUE(two.ok()) << two.status();
  ASSERT_TRUE(two->fits) << two->reason;
  const RankMemory& r = two->prediction.rank_memory;
  const int64_t rank_host = two->prediction.host_pinned_bytes + two->prediction.host_pageable_bytes;
  EXPECT_EQ(r.local_world_size, 2);
  EXPECT_EQ(r.node_host_bytes, 2 * rank_host);
  EXPECT_LE(r.chunk_host_pinned_bytes + r.chunk_host_pageable_bytes, rank_host);
  // [Host reserve]: 8 % of the RAM, at least 4 GiB, and 4 GiB per rank.
  EXPECT_LE(r.node_host_bytes, in.hardware.host_memory_bytes - 4 * kGiB - 2 * 4 * kGiB);
  // The blocks' NF4 base and the bf16 embedding and (untied) LM head.
  ASSERT_FALSE(in.arch.tie_word_embeddings);
  const int64_t nf4_base = QloraBlockBaseBytes(in.arch, 2) * in.arch.num_layers +
                           2 * in.arch.vocab_size * in.arch.hidden_size * 2;
  EXPECT_GT(2 * nf4_base, in.hardware.host_memory_bytes) << "the whole base per rank would fit";
  std::printf("qwen3-32b QLoRA, 2 ranks, 32 GiB host: %d/%d chunks persistent, host %.2f GiB per "
              "rank (the whole NF4 base %.2f GiB)\n",
              two->plan.n_persist, two->plan.n_chunks, static_cast<double>(rank_host) / kGiB,
              static_cast<double>(nf4_base) / kGiB);

  in.hardware.host_memory_bytes = 14 * kGiB;
  // With the persistent base whole on every rank, 1 GiB of RAM per rank is too little.
  PlanInputs replicated = in;
  replicated.fixed.shard_persistent_params = false;
  auto small = MakePlan(replicated);
  ASSERT_TRUE(small.ok()) << small.status();
  EXPECT_FALSE(small->fits);
  EXPECT_NE(small->reason.find("1.0 GiB of RAM per rank (14.0 GiB shared by 2 local ranks"),
            std::string::npos)
      << small->reason;
  // Sharded over the two cards ([Sharded frozen base] with shard_persistent_params), the whole
  // base stays on the devices, half on each: the small host is enough.
  auto sharded = MakePlan(in);
  ASSERT_TRUE(sharded.ok()) << sharded.status();
  EXPECT_TRUE(sharded->fits) << sharded->reason;
  EXPECT_TRUE(sharded->plan.shard_persistent_params);
  EXPECT_EQ(sharded->plan.n_persist, sharded->plan.n_chunks);
}

// Issue 31's other user: llama-3.1-70b QLoRA (rank 16, every linear layer), 1x2048 per rank, on
// two 24 GB cards of a 34 GiB host (the FSDP + QLoRA recipe; a 32 GiB host fit until the host
// reserve held 4 GiB per rank, [Host reserve]). With the frozen base's persistent
// chunks whole on every rank the leanest two-rank plan needs more than the card; sharding them
// ([Sharded frozen base] with shard_persistent_params: each rank stores 1/W, gathered per stage)
// makes it fit, and the search picks it. One rank does not fit (the host binds its offloading).
TEST(PlanEngineTest, Llama70bQloraFitsTwoRanksOf24GbWithThePersistentBaseSharded) {
  PlanInputs in = Inputs("llama-3.1-70b", "rtx-4090", 1, 2048, 2);
  in.training.kind = TrainingKind::kQlora;
  in.training.lora_rank = 16;
  in.training.lora_target_modules = {"q_proj", "k_proj", "v_proj", "o_proj",
                                     "gate_proj", "up_proj", "down_proj"};
  in.hardware.host_memory_bytes = 34 * kGiB;
  in.skip_limits = true;
  in.max_alternatives = 0;
  ASSERT_LE(in.hardware.gpu_memory_bytes, 24 * kGiB);
  auto two = MakePlan(in);
  ASSERT_TRUE(two.ok()) << two.status();
  ASSERT_TRUE(two->fits) << two->reason;
  const ResidencyPlan& plan = two->plan;
  EXPECT_TRUE(plan.shard_persistent_params);
  EXPECT_FALSE(plan.shard_persistent_state);  // the base has none; the adapters' is replicated
  EXPECT_GT(plan.n_persist, 0);
  const RankMemory& r = two->prediction.rank_memory;
  EXPECT_GT(r.persistent_gather_device_bytes, 0);
  EXPECT_LE(r.node_host_bytes, in.hardware.host_memory_bytes);
  std::printf("llama-3.1-70b QLoRA r16, 2 ranks of %.1f GiB, 34 GiB host: %s; peak %.2f GiB, "
              "load %.2f GiB, persistent %.2f GiB + gathered %.2f GiB, host %.2f GiB per rank, "
              "%.0f tokens/s per GPU\n",
              static_cast<double>(in.hardware.gpu_memory_bytes) / kGiB, two->reason.c_str(),
              static_cast<double>(two->prediction.peak_bytes) / kGiB,
              static_cast<double>(two->prediction.load_peak_bytes) / kGiB,
              static_cast<double>(r.persistent_device_bytes) / kGiB,
              static_cast<double>(r.persistent_gather_device_bytes) / kGiB,
              static_cast<double>(two->prediction.host_pinned_bytes +
                                  two->prediction.host_pageable_bytes) /
                  kGiB,
              two->prediction.tokens_per_second);

  // The persistent base kept whole on every rank (what the planner offered before): too big.
  PlanInputs replicated = in;
  replicated.fixed.shard_persistent_params = false;
  auto whole = MakePlan(replicated);
  ASSERT_TRUE(whole.ok()) << whole.status();
  EXPECT_FALSE(whole->fits) << whole->reason;
  EXPECT_FALSE(whole->plan.shard_persistent_params);
  // Fixing it sharded is accepted for adapters and gives the same plan.
  PlanInputs sharded = in;
  sharded.fixed.shard_persistent_params = true;
  auto fixed = MakePlan(sharded);
  ASSERT_TRUE(fixed.ok()) << fixed.status();
  EXPECT_TRUE(fixed->fits) << fixed->reason;
  EXPECT_TRUE(fixed->plan.shard_persistent_params);
  EXPECT_EQ(fixed->plan.n_persist, plan.n_persist);
  // The adapters' state is not sharded: that knob stays refused for QLoRA.
  sharded.fixed.shard_persistent_state = true;
  EXPECT_NE(ErrorOf(sharded).find("fixed.shard_persistent_state = true needs full fine-tuning"),
            std::string::npos);

  PlanInputs one = in;
  one.workload.world_size = 1;
  auto single = MakePlan(one);
  ASSERT_TRUE(single.ok()) << single.status();
  EXPECT_FALSE(single->fits) << single->reason;
}

TEST(PlanEngineTest, ExtremeButValidInputsAreHandled) {
  // The largest model and workload validation admits: rejected as too large, never a crash.
  PlanInputs in = Inputs("llama-3.1-8b", "h100-80gb", 1, 4096);
  in.arch.hidden_size = 131072;
  in.arch.num_heads = 1024;
  in.arch.num_kv_heads = 1024;
  in.arch.head_dim = 0;
  in.arch.num_layers = 4096;
  in.arch.intermediate_size = 1 << 20;
  in.arch.vocab_size = 1 << 24;
  in.workload.micro_batch = 1 << 12;
  in.workload.seq_len = 1 << 16;
  auto out = MakePlan(in);
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);
  // A tiny profiled trace with huge per-token figures: limit probes scale it up to the token
  // bound; the ones too large to model count as "does not fit".
  PlanInputs small = Inputs("llama-tiny", "h100-80gb", 1, 1);
  small.skip_limits = true;
  auto base = MakePlan(small);
  ASSERT_TRUE(base.ok()) << base.status();
  Trace t = base->trace_used;
  for (BlockTrace& b : t.blocks) b.saved_bytes = int64_t{1} << 30;
  small.profiled_trace = t;
  small.skip_limits = false;
  auto probed = MakePlan(small);
  ASSERT_TRUE(probed.ok()) << probed.status();
  EXPECT_GE(probed->max_seq_len, 1);
  EXPECT_LT(probed->max_seq_len, 1000);
}

}  // namespace
}  // namespace memplan
