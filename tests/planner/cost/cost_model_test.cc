#include "planner/cost/cost_model.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <random>

#include "absl/strings/str_cat.h"
#include "common/optimizer_bytes.h"
#include "common/presets.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "planner/core/plan_engine.h"
#include "planner/cost/analytic_trace.h"
#include "tests/planner/cost/random_trace.h"

namespace memplan {
namespace {

using testing::kGiB;
using testing::kMiB;
using testing::RandomHardware;
using testing::RandomTrace;

CostModel MustCreate(const Trace& trace, int64_t chunk, const HardwareSpec& hw,
                     const CostOptions& options) {
  auto model = CostModel::Create(trace, chunk, hw, options);
  EXPECT_TRUE(model.ok()) << model.status();
  return *std::move(model);
}

void ExpectNear(double a, double b, const char* what) {
  EXPECT_NEAR(a, b, 1e-9 * std::max(1.0, std::fabs(b))) << what;
}

void ExpectSamePrediction(const Prediction& a, const Prediction& b) {
  EXPECT_EQ(a.peak_bytes, b.peak_bytes);
  EXPECT_EQ(a.load_peak_bytes, b.load_peak_bytes);
  EXPECT_EQ(a.host_pinned_bytes, b.host_pinned_bytes);
  EXPECT_EQ(a.host_pageable_bytes, b.host_pageable_bytes);
  EXPECT_EQ(a.breakdown.activations_bytes, b.breakdown.activations_bytes);
  EXPECT_EQ(a.breakdown.checkpoint_chain_bytes, b.breakdown.checkpoint_chain_bytes);
  EXPECT_EQ(a.breakdown.transient_bytes, b.breakdown.transient_bytes);
  EXPECT_EQ(a.breakdown.grads_bytes, b.breakdown.grads_bytes);
  ExpectNear(a.forward_seconds, b.forward_seconds, "forward");
  ExpectNear(a.backward_seconds, b.backward_seconds, "backward");
  ExpectNear(a.iteration_seconds, b.iteration_seconds, "iteration");
  ExpectNear(a.tokens_per_second, b.tokens_per_second, "tokens/s");
}

// A uniform draw in [lo, hi] as an int32 (block, chunk and mode counts of the random cases).
int32_t UniformInt32(std::mt19937_64& rng, int64_t lo, int64_t hi) {
  return static_cast<int32_t>(std::uniform_int_distribution<int64_t>(lo, hi)(rng));
}

struct RandomCase {
  Trace trace;
  HardwareSpec hardware;
  CostOptions options;
  int64_t chunk_bytes = 0;
};

RandomCase MakeCase(std::mt19937_64& rng) {
  auto uni = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  RandomCase c;
  c.trace = RandomTrace(rng, static_cast<int32_t>(uni(1, 40)));
  c.hardware = RandomHardware(rng);
  c.options.world_size = uni(0, 2) == 0 ? static_cast<int32_t>(uni(2, 8)) : 1;
  c.options.shard_persistent_state = uni(0, 1) == 1;   // in effect with W > 1, not adamw8bit
  c.options.shard_persistent_params = uni(0, 1) == 1;  // in effect with the state sharded
  c.options.grad_accum = static_cast<int32_t>(uni(1, 3));
  c.options.optimizer = static_cast<OptimizerKind>(uni(0, 3));  // adamw8bit included
  if (c.options.optimizer == OptimizerKind::kAdamWBf16States &&
      c.trace.param_dtype != DType::kBFloat16) {
    c.options.optimizer = OptimizerKind::kAdamW;  // adamw_bf16 plans bf16 models only
  }
  c.options.fragmentation_factor = 0.8 + 0.05 * static_cast<double>(uni(0, 8));
  c.options.residual_bytes = uni(-64, 64) * kMiB;
  c.chunk_bytes = uni(8, 96) * kMiB;
  // Drawn last so that the cases above stay what they were: clipping, and half of the profiles
  // with the [Two CPU passes] figures.
  c.options.cpu_optimizer_overlaps = uni(0, 1) == 1;
  if (uni(0, 1) == 1) {
    const double whole = c.hardware.cpu_adam_params_per_second;
    c.hardware.cpu_grad_accumulate_params_per_second = whole * (2.0 + 0.5 * uni(0, 4));
    c.hardware.cpu_adam_update_params_per_second = whole * (1.0 + 0.1 * uni(0, 4));
  }
  return c;
}

// The O(log N) evaluation must agree with plain loops over every phase and window.
TEST(CostModelTest, FastPredictionMatchesReferenceWalk) {
  std::mt19937_64 rng(7);
  for (int iter = 0; iter < 300; ++iter) {
    const RandomCase c = MakeCase(rng);
    const CostModel model = MustCreate(c.trace, c.chunk_bytes, c.hardware, c.options);
    const int32_t n = model.num_blocks(), chunks = model.num_chunks();
    for (int p = 0; p < 20; ++p) {
      auto uni = [&](int64_t lo, int64_t hi) { return UniformInt32(rng, lo, hi); };
      ModeCounts m;
      m.n_swap = uni(0, n);
      m.n_hs_offload = uni(0, n - m.n_swap);
      m.n_checkpoint = uni(0, n - m.n_swap - m.n_hs_offload);
      const int32_t np = uni(0, chunks);
      const int32_t nb = uni(model.MinBuffers(np), chunks - np);
      const HostMemoryKind kind = uni(0, 1) ? HostMemoryKind::kPinned : HostMemoryKind::kPageable;
      const ResidencyPlan plan = model.MakeResidencyPlan(np, nb, m, kind);
      ASSERT_TRUE(model.ValidatePlan(plan).ok());
      SCOPED_TRACE(::testing::Message() << "iter " << iter << " n=" << n << " chunks=" << chunks
                                        << " np=" << np << " nb=" << nb << " s=" << m.n_swap
                                        << " h=" << m.n_hs_offload << " c=" << m.n_checkpoint);
      ExpectSamePrediction(model.Predict(plan), model.PredictReference(plan));
    }
  }
}

// [Swapped inputs] (cost_memory.cc) A SWAP block's input stays on the device until its backward,
// as a CKPT block's does: with a head large enough to set the peak, every block SWAP costs what
// every block CKPT costs plus the last block's saved set in flight to the host, nothing less.
TEST(CostModelTest, SwappedBlocksKeepTheirInputsOnTheDevice) {
  std::mt19937_64 rng(31);
  Trace t = RandomTrace(rng, 8);
  for (BlockTrace& b : t.blocks) {
    b.input_bytes = 32 * kMiB;
    b.saved_bytes = 320 * kMiB;
    b.forward_transient_bytes = b.backward_transient_bytes = 16 * kMiB;
  }
  t.head.saved_bytes = 8192 * kMiB;
  const CostModel model = MustCreate(t, 64 * kMiB, RandomHardware(rng), CostOptions{});
  const int64_t swap = model.DynamicRawBytes(ModeCounts{8, 0, 0});
  const int64_t ckpt = model.DynamicRawBytes(ModeCounts{0, 0, 8});
  EXPECT_EQ(swap - ckpt, 320 * kMiB);
}

TEST(CostModelTest, CalibrationContractHolds) {
  std::mt19937_64 rng(11);
  for (int iter = 0; iter < 50; ++iter) {
    const RandomCase c = MakeCase(rng);
    const CostModel model = MustCreate(c.trace, c.chunk_bytes, c.hardware, c.options);
    const ResidencyPlan plan =
        model.MakeResidencyPlan(0, model.MinBuffers(0), ModeCounts{}, HostMemoryKind::kPinned);
    const Prediction p = model.Predict(plan);
    const int64_t raw = RawModelBytes(p);
    const int64_t exact = p.breakdown.exact_bytes;
    // [Exact and scaled bytes]: the persistent chunks with their optimizer state, the buffers
    // and the grad staging are exact; the factor scales the rest.
    EXPECT_EQ(exact, model.StaticRawBytes(plan.n_persist, plan.n_buffer));
    EXPECT_GE(exact, p.breakdown.persistent_chunks_bytes + p.breakdown.optimizer_state_bytes +
                         p.breakdown.buffers_bytes);
    EXPECT_LE(exact, raw);
    EXPECT_EQ(p.peak_bytes, exact +
                                static_cast<int64_t>(std::ceil(c.options.fragmentation_factor *
                                                               static_cast<double>(raw - exact))) +
                                c.options.residual_bytes + c.hardware.cuda_context_bytes);
    EXPECT_EQ(p.peak_bytes, model.Peak(exact, raw - exact));
    EXPECT_EQ(p.breakdown.fragmentation_factor, c.options.fragmentation_factor);
    EXPECT_EQ(p.breakdown.calibration_residual_bytes, c.options.residual_bytes);
    EXPECT_EQ(p.breakdown.cuda_context_bytes, c.hardware.cuda_context_bytes);
    // Room is what exact + scaled bytes may take: a prediction at the capacity fits exactly.
    EXPECT_EQ(exact + model.Scaled(raw - exact), model.Room(p.peak_bytes));
  }
}

// [Grads beside backward]: the steady peak's dynamic part is the largest of the activation walk,
// the end-of-backward grad phase and a block's backward next to the grads already produced; the
// last is non-decreasing in n_persist (the search's bounds leave it out and rely on that).
TEST(CostModelTest, BackwardPhasesCarryTheGradsAlreadyProduced) {
  std::mt19937_64 rng(17);
  for (int iter = 0; iter < 60; ++iter) {
    const RandomCase c = MakeCase(rng);
    const CostModel model = MustCreate(c.trace, c.chunk_bytes, c.hardware, c.options);
    const int32_t n = model.num_blocks(), chunks = model.num_chunks();
    auto uni = [&](int64_t lo, int64_t hi) { return UniformInt32(rng, lo, hi); };
    ModeCounts m;
    m.n_hs_offload = uni(0, n);
    m.n_checkpoint = uni(0, n - m.n_hs_offload);
    const int64_t dyn = model.DynamicRawBytes(m);
    // The searches' table answers the same for every n_persist.
    const CostModel::BackwardGradsByPersist table = model.BackwardGradsTable(m);
    int64_t previous = -1;
    for (int32_t np = 0; np <= chunks; ++np) {
      const int64_t bwd = model.BackwardGradsRawBytes(m, np);
      EXPECT_GE(bwd, previous) << "np " << np;
      previous = bwd;
      EXPECT_EQ(table.At(np), bwd) << "np " << np;
      const int64_t step = model.StepDynamicRawBytes(m, dyn, np);
      EXPECT_EQ(step, std::max({dyn, model.GradPhaseRawBytes(np), bwd}));
      EXPECT_EQ(model.StepDynamicRawBytes(table, dyn, np), step) << "np " << np;
      const int32_t nb = np == chunks ? 0 : model.MinBuffers(np);
      const Prediction p =
          model.Predict(model.MakeResidencyPlan(np, nb, m, HostMemoryKind::kPinned));
      // The breakdown names the moment of that peak: its raw bytes are static + the maximum.
      EXPECT_EQ(RawModelBytes(p), p.breakdown.exact_bytes + step) << "np " << np;
    }
  }
  // The run that showed it (H200, docs/cost-model.md): qwen2.5-3b (tied) 4 x 5376, 36 of 109
  // chunks of 64 MiB persistent, 34 HS_OFFLOAD and 2 CKPT blocks. Its peak is a late block's
  // backward beside the persistent grads of blocks after it and the tied embedding's grad, more
  // than the walk or the grad phase alone; the tied grad alone is 151 936 x 2 048 bf16 elements.
  const ModelSpec arch = *FindModelPreset("qwen2.5-3b");
  const HardwareSpec hw = *FindHardwarePreset("h200");
  Workload workload;
  workload.micro_batch = 4;
  workload.seq_len = 5376;
  auto trace = SynthesizeTrace(arch, workload, DType::kBFloat16, TrainingMethod(), hw);
  ASSERT_TRUE(trace.ok()) << trace.status();
  const CostModel model = MustCreate(*trace, int64_t{64} << 20, hw, CostOptions());
  const ModeCounts m{0, 34, 2};
  const int64_t dyn = model.DynamicRawBytes(m);
  const int64_t bwd = model.BackwardGradsRawBytes(m, 36);
  EXPECT_GT(bwd, std::max(dyn, model.GradPhaseRawBytes(36)));
  EXPECT_GE(bwd - dyn, int64_t{151936} * 2048 * 2);
  const Prediction p =
      model.Predict(model.MakeResidencyPlan(36, model.MinBuffers(36), m, HostMemoryKind::kPinned));
  EXPECT_GT(p.breakdown.grads_bytes, model.GradStagingBytes(36) + int64_t{151936} * 2048 * 2);
}

// The search's pruning rests on these monotonicity properties of the model.
TEST(CostModelTest, MonotonicityPropertiesUsedBySearch) {
  std::mt19937_64 rng(13);
  for (int iter = 0; iter < 120; ++iter) {
    const RandomCase c = MakeCase(rng);
    const CostModel model = MustCreate(c.trace, c.chunk_bytes, c.hardware, c.options);
    const int32_t n = model.num_blocks(), chunks = model.num_chunks();
    auto uni = [&](int64_t lo, int64_t hi) { return UniformInt32(rng, lo, hi); };
    const HostMemoryKind kind = uni(0, 1) ? HostMemoryKind::kPinned : HostMemoryKind::kPageable;
    ModeCounts m{uni(0, n), 0, 0};
    m.n_hs_offload = uni(0, n - m.n_swap);
    m.n_checkpoint = uni(0, n - m.total());
    const int32_t np = uni(0, chunks);
    const int32_t nb = chunks - np;
    auto secs = [&](const ModeCounts& mc, int32_t p, int32_t b, bool lb) {
      return model.IterationSeconds(model.Time(p, b, mc, kind, lb));
    };
    const double t = secs(m, np, nb, false);
    const int64_t d = model.DynamicRawBytes(m);
    if (m.total() < n) {
      ModeCounts more_ckpt = m;
      ++more_ckpt.n_checkpoint;
      EXPECT_GE(secs(more_ckpt, np, nb, false), t - 1e-12);
      EXPECT_LE(model.DynamicRawBytes(more_ckpt), d);
      ModeCounts more_hs = m;
      ++more_hs.n_hs_offload;
      EXPECT_GE(secs(more_hs, np, nb, false), t - 1e-12);
      EXPECT_LE(model.DynamicRawBytes(more_hs), d);
      EXPECT_GE(model.HostBytes(np, more_hs), model.HostBytes(np, m));
    }
    if (m.n_checkpoint > 0) {
      ModeCounts diagonal = m;
      --diagonal.n_checkpoint;
      ++diagonal.n_hs_offload;
      EXPECT_GE(secs(diagonal, np, nb, false), t - 1e-12);
      EXPECT_LE(model.DynamicRawBytes(diagonal), d);
    }
    if (np < chunks) {
      // Lower-bound time is non-increasing in n_persist (with no eviction either way) and in
      // n_buffer; persistent bytes grow, host bytes shrink.
      const StepTime a = model.Time(np, chunks - np, m, kind, true);
      const StepTime b = model.Time(np + 1, chunks - np - 1, m, kind, true);
      EXPECT_LE(b.forward_seconds, a.forward_seconds + 1e-12);
      EXPECT_LE(b.backward_seconds, a.backward_seconds + 1e-12);
      EXPECT_LE(b.cpu_optimizer_seconds, a.cpu_optimizer_seconds + 1e-12);
      EXPECT_LE(b.cpu_accumulate_seconds, a.cpu_accumulate_seconds + 1e-12);
      EXPECT_LE(b.cpu_norm_seconds, a.cpu_norm_seconds + 1e-12);
      EXPECT_GE(b.gpu_optimizer_seconds, a.gpu_optimizer_seconds - 1e-12);
      EXPECT_GE(model.PersistentRawBytes(np + 1), model.PersistentRawBytes(np));
      EXPECT_LE(model.HostBytes(np + 1, m), model.HostBytes(np, m));
      EXPECT_GE(model.LoadRawBytes(np + 1, 0), model.LoadRawBytes(np, 0));
      const int32_t need = model.MinBuffers(np);
      if (need < chunks - np) {
        EXPECT_LE(secs(m, np, need + 1, false), secs(m, np, need, false) + 1e-12);
      }
      EXPECT_LE(model.MinBuffers(np + 1), need);
      EXPECT_GE(model.MinBuffers(np + 1), need - 1);
    }
    // The lower-bound variant never exceeds the real time.
    EXPECT_LE(secs(m, np, nb, true), t + 1e-12);
  }
}

TEST(CostModelTest, ArbitraryBlockOrderUsesTheWalk) {
  std::mt19937_64 rng(17);
  const Trace trace = RandomTrace(rng, 8);
  const HardwareSpec hw = RandomHardware(rng);
  const CostModel model = MustCreate(trace, 64 * kMiB, hw, CostOptions{});
  ResidencyPlan plan =
      model.MakeResidencyPlan(0, model.MinBuffers(0), ModeCounts{1, 1, 2}, HostMemoryKind::kPinned);
  std::reverse(plan.block_modes.begin(), plan.block_modes.end());  // NONE first: not arranged
  ASSERT_TRUE(model.ValidatePlan(plan).ok());
  ExpectSamePrediction(model.Predict(plan), model.PredictReference(plan));
}

TEST(CostModelTest, CheckpointChainAndOffloadTradeoffs) {
  std::mt19937_64 rng(19);
  Trace trace = RandomTrace(rng, 12);
  trace.training.kind = TrainingKind::kFull;
  trace.trainable_param_count = trace.total_param_count;
  const HardwareSpec hw = RandomHardware(rng);
  const CostModel model = MustCreate(trace, 64 * kMiB, hw, CostOptions{});
  const int32_t n = model.num_blocks(), chunks = model.num_chunks();
  const ResidencyPlan keep =
      model.MakeResidencyPlan(chunks, 0, ModeCounts{}, HostMemoryKind::kPinned);
  const ResidencyPlan ckpt =
      model.MakeResidencyPlan(chunks, 0, ModeCounts{0, 0, n}, HostMemoryKind::kPinned);
  const ResidencyPlan hs =
      model.MakeResidencyPlan(chunks, 0, ModeCounts{0, n, 0}, HostMemoryKind::kPinned);
  const Prediction pk = model.Predict(keep), pc = model.Predict(ckpt), ph = model.Predict(hs);
  EXPECT_EQ(pk.breakdown.checkpoint_chain_bytes, 0);
  EXPECT_GT(pc.breakdown.checkpoint_chain_bytes, 0);  // inputs of checkpointed blocks stay
  EXPECT_EQ(ph.breakdown.checkpoint_chain_bytes, 0);  // hidden states live on the host
  EXPECT_LT(pc.peak_bytes, pk.peak_bytes);
  EXPECT_LE(ph.peak_bytes, pc.peak_bytes);
  EXPECT_GT(pc.iteration_seconds, pk.iteration_seconds);  // recompute costs time
  EXPECT_GT(ph.host_pinned_bytes, pc.host_pinned_bytes);

  // Offloading chunks moves state to the host and costs time; pageable is slower than pinned.
  const int32_t nb = model.MinBuffers(0);
  const Prediction off =
      model.Predict(model.MakeResidencyPlan(0, nb, ModeCounts{}, HostMemoryKind::kPinned));
  const Prediction page =
      model.Predict(model.MakeResidencyPlan(0, nb, ModeCounts{}, HostMemoryKind::kPageable));
  EXPECT_LT(off.peak_bytes, pk.peak_bytes);
  EXPECT_GT(off.host_pinned_bytes, 0);
  EXPECT_EQ(page.host_pinned_bytes, 0);
  // The same host bytes either way; pinned plans pin the transfer buffers only, the optimizer
  // state stays pageable (as ChunkMemoryStats splits it).
  EXPECT_EQ(page.host_pageable_bytes, off.host_pinned_bytes + off.host_pageable_bytes);
  EXPECT_GT(off.host_pageable_bytes, 0);
  EXPECT_EQ(off.host_pinned_bytes, off.rank_memory.chunk_host_pinned_bytes);
  EXPECT_GE(off.iteration_seconds, pk.iteration_seconds);
  EXPECT_GT(page.iteration_seconds, off.iteration_seconds);
  EXPECT_EQ(pk.host_pinned_bytes, 0);
}

TEST(CostModelTest, ValidatePlanNamesTheField) {
  std::mt19937_64 rng(23);
  const CostModel model =
      MustCreate(RandomTrace(rng, 4), 64 * kMiB, RandomHardware(rng), CostOptions{});
  ResidencyPlan plan =
      model.MakeResidencyPlan(0, model.MinBuffers(0), ModeCounts{}, HostMemoryKind::kPinned);
  plan.n_persist = model.num_chunks() + 1;
  EXPECT_NE(model.ValidatePlan(plan).message().find("plan.n_persist"), std::string::npos);
  plan = model.MakeResidencyPlan(0, model.MinBuffers(0), ModeCounts{}, HostMemoryKind::kPinned);
  plan.n_buffer = 0;
  EXPECT_NE(model.ValidatePlan(plan).message().find("plan.n_buffer"), std::string::npos);
  plan = model.MakeResidencyPlan(0, model.MinBuffers(0), ModeCounts{}, HostMemoryKind::kPinned);
  plan.n_checkpoint = 3;
  plan.n_swap = 3;
  EXPECT_FALSE(model.ValidatePlan(plan).ok());
  HardwareSpec hw = RandomHardware(rng);
  hw.nccl_allgather_bytes_per_second = 0;
  CostOptions multi;
  multi.world_size = 4;
  EXPECT_FALSE(CostModel::Create(RandomTrace(rng, 4), 64 * kMiB, hw, multi).ok());
}

}  // namespace
}  // namespace memplan

namespace memplan {
namespace {

// [Persistent all-reduce in backward] (agent/chunks/chunk_manager.cc): with W ranks an
// all-persistent plan holds what one rank holds plus the fp32 copies of the two largest chunks'
// grads whose all-reduce is in flight, and the reductions move fp32 (twice a bf16 model's grad
// bytes): with a slow interconnect backward takes the reduce traffic's time.
// llama-3.2-1b 1x512 in bf16 on an H200 whose NCCL links are slow enough (1 GB/s) that the
// reduce traffic sets backward's time.
HardwareSpec SlowLinkH200() {
  HardwareSpec hw = *FindHardwarePreset("h200");
  hw.nccl_allgather_bytes_per_second = 1e9;
  hw.nccl_reduce_scatter_bytes_per_second = 1e9;
  return hw;
}
absl::StatusOr<Trace> OneBTrace(const HardwareSpec& hw, int32_t world_size) {
  Workload workload;
  workload.micro_batch = 1;
  workload.seq_len = 512;
  workload.world_size = world_size;
  return SynthesizeTrace(*FindModelPreset("llama-3.2-1b"), workload, DType::kBFloat16,
                         TrainingMethod(), hw);
}

TEST(StepTimeTest, ShardedPersistentGradsReduceInFp32BesideBackward) {
  const HardwareSpec hw = SlowLinkH200();
  auto trace = OneBTrace(hw, 1);
  ASSERT_TRUE(trace.ok()) << trace.status();
  CostOptions one;
  CostOptions two;
  two.world_size = 2;
  auto cm1 = CostModel::Create(*trace, int64_t{64} << 20, hw, one);
  auto cm2 = CostModel::Create(*trace, int64_t{64} << 20, hw, two);
  ASSERT_TRUE(cm1.ok() && cm2.ok());
  const int32_t chunks = cm2->num_chunks();
  // Two copies of the blocks' (and head's) chunks in fp32 for the step; the tied embedding's
  // (llama-3.2-1b's chunk 0) at the end of backward, the peak here (a short sequence).
  const std::vector<int64_t>& all = cm2->layout().chunk_trainable_bytes;
  const int32_t rest = cm2->layout().stage_last_chunk[0] + 1;
  std::vector<int64_t> train(all.begin() + rest, all.end());
  std::sort(train.rbegin(), train.rend());
  ASSERT_GE(train.size(), 2u);
  const int64_t in_flight = (train[0] + train[1]) / 2 * 4;  // bf16 elements as fp32
  const int64_t embedding = *std::max_element(all.begin(), all.begin() + rest) / 2 * 4;
  const ResidencyPlan plan =
      cm2->MakeResidencyPlan(chunks, chunks, ModeCounts{}, HostMemoryKind::kPinned);
  const Prediction p1 = cm1->Predict(plan);
  const Prediction p2 = cm2->Predict(plan);
  EXPECT_EQ(p2.breakdown.grads_bytes - p1.breakdown.grads_bytes, in_flight + embedding);
  EXPECT_GT(p2.peak_bytes - p1.peak_bytes, in_flight);  // the embedding's beside other terms
  // Every trainable byte is all-reduced once in backward: 2 (W-1)/W x 2 x its bf16 bytes over the
  // link, at least that long.
  int64_t total_train = 0;
  for (int64_t b : cm2->layout().chunk_trainable_bytes) total_train += b;
  const double traffic_seconds = 2.0 * 0.5 * 2.0 * static_cast<double>(total_train) / 1e9;
  EXPECT_GE(p2.backward_seconds, 0.9 * traffic_seconds);
  EXPECT_GT(p2.backward_seconds, p1.backward_seconds + 0.5 * traffic_seconds);
}

// OneBTrace on two ranks of SlowLinkH200(), 64 MiB chunks: the persistent chunks' state
// replicated (`replicated`) and sharded (`sharded`).
struct TwoRankModels {
  std::optional<CostModel> replicated, sharded;
};
TwoRankModels TwoRankOneB(const HardwareSpec& hw) {
  TwoRankModels m;
  auto trace = OneBTrace(hw, 2);
  EXPECT_TRUE(trace.ok()) << trace.status();
  if (!trace.ok()) return m;
  CostOptions options;
  options.world_size = 2;
  auto r = CostModel::Create(*trace, int64_t{64} << 20, hw, options);
  options.shard_persistent_state = true;
  auto s = CostModel::Create(*trace, int64_t{64} << 20, hw, options);
  EXPECT_TRUE(r.ok() && s.ok());
  if (r.ok() && s.ok()) {
    m.replicated.emplace(*std::move(r));
    m.sharded.emplace(*std::move(s));
  }
  return m;
}

// [Sharded persistent state]: each rank holds 1/W of the persistent chunks' state and of their
// grads after the reduce-scatter, which moves half an all-reduce's bytes; the update runs on 1/W
// of the parameters and the parameters are all-gathered after it.
TEST(StepTimeTest, ShardedPersistentStateHoldsAShardAndReducesOnce) {
  const HardwareSpec hw = SlowLinkH200();
  const TwoRankModels models = TwoRankOneB(hw);
  ASSERT_TRUE(models.replicated && models.sharded);
  const CostModel* cmr = &*models.replicated;
  const CostModel* cms = &*models.sharded;
  EXPECT_FALSE(cmr->ShardsPersistentState());
  EXPECT_TRUE(cms->ShardsPersistentState());
  const int32_t chunks = cms->num_chunks();
  const ResidencyPlan pr = cmr->MakeResidencyPlan(chunks, 0, ModeCounts{}, HostMemoryKind::kPinned);
  const ResidencyPlan ps = cms->MakeResidencyPlan(chunks, 0, ModeCounts{}, HostMemoryKind::kPinned);
  EXPECT_FALSE(pr.shard_persistent_state);
  EXPECT_TRUE(ps.shard_persistent_state);
  // A plan is priced by the model of its own choice.
  EXPECT_THAT(cmr->ValidatePlan(ps).message(),
              ::testing::HasSubstr("plan.shard_persistent_state = true"));
  const Prediction r = cmr->Predict(pr);
  const Prediction s = cms->Predict(ps);
  // What the agent allocates per rank (agent/chunks/chunk_manager.cc, [Sharded persistent
  // state]): each chunk padded to a multiple of W elements, the state over one shard of it.
  int64_t params = 0, state = 0, train = 0;
  for (int64_t fill : cms->layout().chunk_param_bytes) {
    params += PaddedElems(fill / 2, 2) * 2;
    state += PersistentStateBytes(OptimizerKind::kAdamW, 2, ShardElems(fill / 2, 2));
  }
  for (int64_t b : cms->layout().chunk_trainable_bytes) train += b;
  EXPECT_EQ(s.rank_memory.persistent_device_bytes, params);
  EXPECT_EQ(s.rank_memory.persistent_state_device_bytes, state);
  EXPECT_LE(2 * state, r.rank_memory.persistent_state_device_bytes + chunks * 2 * 16);
  EXPECT_LT(s.peak_bytes, r.peak_bytes - state / 2);
  // Backward: the grads cross the link once ((W-1)/W of their bf16 bytes: [Narrow
  // reduce-scatter]), not twice in fp32.
  const double once = 0.5 * static_cast<double>(train) / 1e9;
  EXPECT_GE(s.backward_seconds, 0.9 * once);
  EXPECT_LT(s.backward_seconds, 1.5 * once);  // not the fp32 bytes
  EXPECT_LT(s.backward_seconds, r.backward_seconds - 0.5 * once);
  // Step: half the update, beside the all-gather of the bf16 parameters ((W-1)/W of them).
  const double gather = 0.5 * static_cast<double>(params) / 1e9;
  EXPECT_NEAR(s.optimizer_seconds, std::max(gather, r.optimizer_seconds / 2),
              0.02 * r.optimizer_seconds + 1e-6);
}

// [Local reduce passes]: with several ranks the persistent chunks' grads pass through device
// memory on the compute stream around their collective, bytes per grad byte (bf16, W = 2): the
// all-reduce's widen, divide and copy back 2 + 16/2; the sharded state's flat copy, widened sum
// and rounded mean 2 + 1 + 1 + 1 + 1/2. Priced at the device's memory bandwidth beside backward's
// compute (a fast link: the collectives stay hidden), so halving the bandwidth's price halves
// them and changes nothing else in backward.
TEST(StepTimeTest, PersistentGradsPassThroughDeviceMemoryAroundTheirCollective) {
  HardwareSpec hw = *FindHardwarePreset("h200");
  hw.nccl_allgather_bytes_per_second = 1e13;
  hw.nccl_reduce_scatter_bytes_per_second = 1e13;
  HardwareSpec fast_hbm = hw;
  fast_hbm.hbm_bytes_per_second *= 2;
  auto trace = OneBTrace(hw, 2);
  ASSERT_TRUE(trace.ok()) << trace.status();
  for (bool sharded : {false, true}) {
    CostOptions options;
    options.world_size = 2;
    options.shard_persistent_state = sharded;
    auto slow = CostModel::Create(*trace, int64_t{64} << 20, hw, options);
    auto fast = CostModel::Create(*trace, int64_t{64} << 20, fast_hbm, options);
    ASSERT_TRUE(slow.ok() && fast.ok());
    const int32_t chunks = slow->num_chunks();
    const ResidencyPlan plan =
        slow->MakeResidencyPlan(chunks, 0, ModeCounts{}, HostMemoryKind::kPinned);
    int64_t train = 0;
    for (int64_t b : slow->layout().chunk_trainable_bytes) train += b;
    const double per_byte = sharded ? 2 + 1 + 1 + 1 + 0.5 : 2 + 16 / 2.0;
    const double local = static_cast<double>(train) * per_byte /
                         (hw.hbm_bytes_per_second * CostOptions().hbm_efficiency);
    const double saved =
        slow->Predict(plan).backward_seconds - fast->Predict(plan).backward_seconds;
    EXPECT_NEAR(saved, local / 2, 1e-3 * local) << (sharded ? "sharded" : "all-reduced");
  }
  // One rank has no collective and no such passes.
  auto one_trace = OneBTrace(hw, 1);
  ASSERT_TRUE(one_trace.ok());
  auto slow1 = CostModel::Create(*one_trace, int64_t{64} << 20, hw, CostOptions());
  auto fast1 = CostModel::Create(*one_trace, int64_t{64} << 20, fast_hbm, CostOptions());
  ASSERT_TRUE(slow1.ok() && fast1.ok());
  const ResidencyPlan plan1 =
      slow1->MakeResidencyPlan(slow1->num_chunks(), 0, ModeCounts{}, HostMemoryKind::kPinned);
  EXPECT_DOUBLE_EQ(slow1->Predict(plan1).backward_seconds, fast1->Predict(plan1).backward_seconds);
}

// [Sharded persistent parameters]: each rank holds 1/W of the persistent chunks' parameters as
// well; a stage's chunks are all-gathered before it runs, in forward and again in backward, and
// a stage's and the next one's are held at once; nothing is gathered after the update.
TEST(StepTimeTest, ShardedPersistentParametersHoldAShardAndGatherPerStage) {
  const HardwareSpec hw = SlowLinkH200();
  const TwoRankModels models = TwoRankOneB(hw);
  ASSERT_TRUE(models.sharded);
  auto trace = OneBTrace(hw, 2);
  ASSERT_TRUE(trace.ok()) << trace.status();
  CostOptions options;
  options.world_size = 2;
  options.shard_persistent_state = true;
  options.shard_persistent_params = true;
  auto z3 = CostModel::Create(*trace, int64_t{64} << 20, hw, options);
  ASSERT_TRUE(z3.ok()) << z3.status();
  const CostModel* cms = &*models.sharded;
  EXPECT_TRUE(z3->ShardsPersistentParams());
  EXPECT_FALSE(cms->ShardsPersistentParams());
  const int32_t chunks = z3->num_chunks();
  const ResidencyPlan p2 = cms->MakeResidencyPlan(chunks, 0, ModeCounts{}, HostMemoryKind::kPinned);
  const ResidencyPlan p3 = z3->MakeResidencyPlan(chunks, 0, ModeCounts{}, HostMemoryKind::kPinned);
  EXPECT_TRUE(p3.shard_persistent_state);
  EXPECT_TRUE(p3.shard_persistent_params);
  EXPECT_THAT(cms->ValidatePlan(p3).message(),
              ::testing::HasSubstr("plan.shard_persistent_params = true"));
  const Prediction s2 = cms->Predict(p2);
  const Prediction s3 = z3->Predict(p3);
  // Per rank: the shard of each chunk's parameters; held gathered: the largest two adjacent
  // stages' chunks (padded), from the layout's stage ranges.
  const ChunkLayout& layout = z3->layout();
  int64_t shards = 0, padded_all = 0;
  std::vector<int64_t> padded;
  for (int64_t fill : layout.chunk_param_bytes) {
    shards += ShardElems(fill / 2, 2) * 2;
    padded.push_back(PaddedElems(fill / 2, 2) * 2);
    padded_all += padded.back();
  }
  int64_t held = 0;
  for (size_t g = 0; g + 1 < layout.stage_first_chunk.size(); ++g) {
    int64_t bytes = 0;
    for (int32_t c = layout.stage_first_chunk[g]; c <= layout.stage_last_chunk[g + 1]; ++c) {
      bytes += padded[c];
    }
    if (g + 2 == layout.stage_first_chunk.size() && trace->arch.tie_word_embeddings) {
      // The tied head uses the embedding's chunks too.
      for (int32_t c = layout.stage_first_chunk[0];
           c <= layout.stage_last_chunk[0] && c < layout.stage_first_chunk[g]; ++c) {
        bytes += padded[c];
      }
    }
    held = std::max(held, bytes);
  }
  EXPECT_EQ(s3.rank_memory.persistent_device_bytes, shards);
  EXPECT_EQ(s3.rank_memory.persistent_gather_device_bytes, held);
  EXPECT_EQ(s2.rank_memory.persistent_gather_device_bytes, 0);
  EXPECT_EQ(s3.rank_memory.persistent_state_device_bytes,
            s2.rank_memory.persistent_state_device_bytes);
  // The peak drops by the parameters given up, less what is held gathered.
  EXPECT_NEAR(static_cast<double>(s2.peak_bytes - s3.peak_bytes),
              static_cast<double>(padded_all - shards - held), 0.05 * (padded_all - shards));
  // Every chunk crosses the link twice per step ((W-1)/W of it, forward and backward), the tied
  // embedding's three times (the head gathers it again in forward), beside compute; the step's
  // update has no all-gather after it.
  int64_t embedding = 0;
  for (int32_t c = layout.stage_first_chunk[0]; c <= layout.stage_last_chunk[0]; ++c) {
    embedding += padded[c];
  }
  ASSERT_TRUE(trace->arch.tie_word_embeddings);
  const double gathers =
      0.5 * static_cast<double>(2 * padded_all + embedding) / 1e9;  // SlowLinkH200: 1 GB/s
  const double extra =
      s3.forward_seconds + s3.backward_seconds - (s2.forward_seconds + s2.backward_seconds);
  std::printf("gathers %.3f s, of which hidden by compute %.3f s\n", gathers, gathers - extra);
  EXPECT_GE(extra, 0);
  EXPECT_LE(extra, gathers * 1.001);
  EXPECT_GT(extra, 0.5 * gathers);  // a slow link: most of it shows
  EXPECT_LT(s3.optimizer_seconds, s2.optimizer_seconds);
}

// [Collectives under compute]: the windows' gathers run at the profile's figure beside GEMMs where
// it has one; the gathers after the optimizer step (sharded state, replicated parameters) keep the
// plain figure. Halving only the all-gather's under-compute figure leaves a plan without window
// gathers as it was and adds one more pass of the gathered bytes to a ZeRO-3 plan on a slow link.
TEST(StepTimeTest, WindowGathersUseTheUnderComputeFigure) {
  const HardwareSpec hw = SlowLinkH200();
  HardwareSpec beside = hw;
  beside.nccl_allgather_under_compute_bytes_per_second = 0.5e9;  // half the plain 1 GB/s
  auto trace = OneBTrace(hw, 2);
  ASSERT_TRUE(trace.ok()) << trace.status();
  CostOptions state;
  state.world_size = 2;
  state.shard_persistent_state = true;
  CostOptions zero3 = state;
  zero3.shard_persistent_params = true;
  auto s2 = CostModel::Create(*trace, int64_t{64} << 20, hw, state);
  auto s2_beside = CostModel::Create(*trace, int64_t{64} << 20, beside, state);
  auto z3 = CostModel::Create(*trace, int64_t{64} << 20, hw, zero3);
  auto z3_beside = CostModel::Create(*trace, int64_t{64} << 20, beside, zero3);
  ASSERT_TRUE(s2.ok() && s2_beside.ok() && z3.ok() && z3_beside.ok());
  const int32_t chunks = z3->num_chunks();
  auto predict = [chunks](const CostModel& cm) {
    return cm.Predict(cm.MakeResidencyPlan(chunks, 0, ModeCounts{}, HostMemoryKind::kPinned));
  };
  const Prediction a = predict(*s2), b = predict(*s2_beside);
  EXPECT_DOUBLE_EQ(b.iteration_seconds, a.iteration_seconds);
  EXPECT_DOUBLE_EQ(b.optimizer_seconds, a.optimizer_seconds);
  EXPECT_GT(a.optimizer_seconds, 0);
  const Prediction z = predict(*z3), zb = predict(*z3_beside);
  // Forward and backward gather every chunk once each ((W-1)/W of its padded bytes), the tied
  // embedding once more; at 1 GB/s that time is what the slower figure adds again.
  double gathered = 0;
  for (int64_t fill : z3->layout().chunk_param_bytes) {
    gathered += static_cast<double>(PaddedElems(fill / 2, 2) * 2);
  }
  const double gathers = 0.5 * 2 * gathered / 1e9;
  const double added =
      (zb.forward_seconds + zb.backward_seconds) - (z.forward_seconds + z.backward_seconds);
  EXPECT_GT(added, 0.8 * gathers);
  EXPECT_LT(added, 1.2 * gathers);
  // No profile figure: the plain one, as before.
  EXPECT_DOUBLE_EQ(z.iteration_seconds, predict(*z3).iteration_seconds);
}

// The reductions' buffers count the chunks they reduce only. Offloaded chunks' staging: the two
// largest offloaded chunks (a persistent embedding does not size it). Replicated state: the two
// largest persistent chunks' grads in fp32 for the step, the embedding stage's chunks left to the
// end of backward. Sharded state: no constant; each stage's persistent chunks' flat and shard in
// fp32 (PersistentReduceBytes), in the phase after its hook (the embedding's: end of backward).
TEST(StepTimeTest, PersistentReduceBuffersCountOnlyPersistentChunks) {
  const TwoRankModels models = TwoRankOneB(SlowLinkH200());
  ASSERT_TRUE(models.replicated && models.sharded);
  const CostModel* cmr = &*models.replicated;
  const CostModel* cms = &*models.sharded;
  const int32_t chunks = cms->num_chunks();
  ASSERT_GT(chunks, 4);
  const ChunkLayout& layout = cmr->layout();
  auto top_two = [&](const std::vector<int64_t>& v, int32_t lo, int32_t hi) {
    std::vector<int64_t> t(v.begin() + lo, v.begin() + hi);
    std::sort(t.rbegin(), t.rend());
    return std::make_pair(t.size() > 0 ? t[0] : 0, t.size() > 1 ? t[1] : 0);
  };
  auto staging = [&](int32_t n) {  // [Sharded chunks], bf16 over 2 ranks
    const auto [a, b] = top_two(layout.chunk_param_bytes, n, chunks);
    const int64_t shard = ShardElems(a / 2, 2);
    return (PaddedElems(a / 2, 2) + PaddedElems(b / 2, 2)) * 4 + shard * 6 + 2 * shard * 2;
  };
  const int32_t rest = layout.stage_last_chunk[0] + 1;  // the embedding stage's chunks: [0, rest)
  for (int32_t n : {0, 1, 2, chunks / 2, chunks - 1}) {
    SCOPED_TRACE(n);
    const auto [a, b] = top_two(layout.chunk_trainable_bytes, std::min(rest, n), n);
    EXPECT_EQ(cmr->GradStagingBytes(n), staging(n) + (a + b) / 2 * 4);
    EXPECT_EQ(cms->GradStagingBytes(n), staging(n));
  }
  EXPECT_LT(staging(1), staging(0)) << "the embedding's chunk is the largest";
  EXPECT_EQ(cms->GradStagingBytes(chunks), 0);
  // Sharded state per stage: the embedding's stage owns chunk 0.
  const int64_t e0 = layout.chunk_param_bytes[0] / 2;
  EXPECT_EQ(cms->PersistentReduceBytes(0, 1), (PaddedElems(e0, 2) + ShardElems(e0, 2)) * 4);
  EXPECT_EQ(cms->PersistentReduceBytes(0, 0), 0);
  EXPECT_EQ(cmr->PersistentReduceBytes(0, chunks), 0);
  int64_t sum = 0;
  for (int32_t s = 0; s <= cms->num_blocks() + 1; ++s) sum += cms->PersistentReduceBytes(s, chunks);
  for (int64_t b : layout.chunk_param_bytes) sum -= StateReduceScatterBytes(b / 2, 2);
  EXPECT_EQ(sum, 0) << "every chunk in exactly one stage";
  // The embedding stage's buffers, larger than any block's, come at the end of backward: beside
  // every persistent grad shard but no activation.
  EXPECT_GE(cms->GradPhaseRawBytes(chunks), cms->PersistentReduceBytes(0, chunks));
  for (const ModeCounts counts : {ModeCounts{}, ModeCounts{0, 0, 3}}) {  // the search's table
    const CostModel::BackwardGradsByPersist table = cms->BackwardGradsTable(counts);
    for (int32_t n = 0; n <= chunks; ++n) {
      EXPECT_EQ(table.At(n), cms->BackwardGradsRawBytes(counts, n)) << n;
    }
  }
}

// Offloaded trainable parameters of a plan with n_persist persistent chunks (full fine-tuning).
double OffloadedParams(const CostModel& model, int32_t n_persist, int64_t dtype_bytes) {
  double params = 0;
  for (size_t c = static_cast<size_t>(n_persist); c < model.layout().chunk_trainable_bytes.size();
       ++c) {
    params += static_cast<double>(model.layout().chunk_trainable_bytes[c] / dtype_bytes);
  }
  return params;
}

// A random trace of a bf16 full fine-tune (every parameter trains) with `blocks` blocks.
Trace FullBf16Trace(std::mt19937_64& rng, int32_t blocks) {
  Trace trace = RandomTrace(rng, blocks);
  trace.param_dtype = DType::kBFloat16;
  trace.training.kind = TrainingKind::kFull;
  trace.trainable_param_count = trace.total_param_count;
  return trace;
}

// A profile with the two figures: T_acc and T_upd are the offloaded parameters at each rate, the
// host norm (clipping, several micro-batches) a 4-byte read per element at the accumulate's bytes
// per second; adamw8bit updates at its own measured rate.
TEST(CostModelTest, TwoPassProfilePricesEachPass) {
  std::mt19937_64 rng(29);
  Trace trace = FullBf16Trace(rng, 10);
  HardwareSpec hw = RandomHardware(rng);
  hw.cpu_adam_params_per_second = 1.0e9;
  hw.cpu_grad_accumulate_params_per_second = 4.0e9;
  hw.cpu_adam_update_params_per_second = 1.25e9;
  hw.cpu_adamw8bit_params_per_second = 0.5e9;
  CostOptions o;
  o.grad_accum = 2;
  o.cpu_optimizer_overlaps = false;
  const CostModel model = MustCreate(trace, 32 * kMiB, hw, o);
  const int32_t np = model.num_chunks() / 3;
  const int32_t nb = model.MinBuffers(np);
  const double p = OffloadedParams(model, np, 2);
  ASSERT_GT(p, 0);
  const StepTime t = model.Time(np, nb, ModeCounts{}, HostMemoryKind::kPinned);
  ExpectNear(t.cpu_accumulate_seconds, p / 4.0e9, "T_acc");
  ExpectNear(t.cpu_optimizer_seconds, p / 1.25e9, "T_upd");
  ExpectNear(t.cpu_norm_seconds, p * 4 / (4.0e9 * 10), "T_norm");
  const Prediction pred =
      model.Predict(model.MakeResidencyPlan(np, nb, {}, HostMemoryKind::kPinned));
  const double bwd = std::max(t.backward_seconds, p / 4.0e9);
  // [CPU windows]: real windows of this plan, inside the forward and the backward.
  ASSERT_GT(t.cpu_forward_tail_seconds, 0);
  ASSERT_LT(t.cpu_forward_tail_seconds, t.forward_seconds);
  ASSERT_GT(t.cpu_backward_lead_seconds, 0);
  ASSERT_LT(t.cpu_backward_lead_seconds, t.backward_seconds);
  const double hidden = t.forward_seconds - t.cpu_forward_tail_seconds;
  ExpectNear(pred.iteration_seconds,
             2 * t.forward_seconds + 2 * bwd + p * 4 / 4.0e10 +
                 // [Deferred CPU updates]: one rank, the next forward hides T_upd until it
                 // uploads the last offloaded chunk.
                 std::max(t.gpu_optimizer_seconds, p / 1.25e9 - hidden) + t.fixed_seconds,
             "clipped step");

  // One micro-batch: the norms come from the device grads.
  o.grad_accum = 1;
  EXPECT_EQ(MustCreate(trace, 32 * kMiB, hw, o)
                .Time(np, nb, {}, HostMemoryKind::kPinned)
                .cpu_norm_seconds,
            0);
  // No clipping: no norm pass either.
  o.grad_accum = 2;
  o.cpu_optimizer_overlaps = true;
  EXPECT_EQ(MustCreate(trace, 32 * kMiB, hw, o)
                .Time(np, nb, {}, HostMemoryKind::kPinned)
                .cpu_norm_seconds,
            0);
  // Unclipped on one rank, [Deferred CPU updates] as well: what is left of T_acc + T_upd after
  // backward and the GPU update runs beside the next forward (an update slow enough to leave some).
  hw.cpu_adam_update_params_per_second = 1.25e7;
  const CostModel unclipped = MustCreate(trace, 32 * kMiB, hw, o);
  const StepTime u = unclipped.Time(np, nb, {}, HostMemoryKind::kPinned);
  EXPECT_TRUE(u.cpu_optimizer_deferred);
  // [CPU windows]: the CPU starts T_lead into the last backward.
  const double cpu_side = u.cpu_backward_lead_seconds + u.cpu_accumulate_seconds +
                          u.cpu_optimizer_seconds -
                          (u.forward_seconds - u.cpu_forward_tail_seconds);
  ASSERT_GT(cpu_side, u.backward_seconds + u.gpu_optimizer_seconds);
  ExpectNear(unclipped.Predict(unclipped.MakeResidencyPlan(np, nb, {}, HostMemoryKind::kPinned))
                 .iteration_seconds,
             2 * u.forward_seconds + std::max(u.backward_seconds, u.cpu_accumulate_seconds) +
                 cpu_side + u.fixed_seconds,
             "unclipped step");
  hw.cpu_adam_update_params_per_second = 1.25e9;
  // adamw8bit: the same accumulate, its own update rate; adamw_bf16 reads bf16 grads for the norm.
  o.cpu_optimizer_overlaps = false;
  o.optimizer = OptimizerKind::kAdamW8bit;
  const StepTime q = MustCreate(trace, 32 * kMiB, hw, o).Time(np, nb, {}, HostMemoryKind::kPinned);
  ExpectNear(q.cpu_accumulate_seconds, p / 4.0e9, "adamw8bit T_acc");
  ExpectNear(q.cpu_optimizer_seconds, p / 0.5e9, "adamw8bit T_upd");
  o.optimizer = OptimizerKind::kAdamWBf16States;
  const StepTime b = MustCreate(trace, 32 * kMiB, hw, o).Time(np, nb, {}, HostMemoryKind::kPinned);
  ExpectNear(b.cpu_norm_seconds, p * 2 / (4.0e9 * 10), "adamw_bf16 T_norm");
}

// [Pending updates in chunk order] Unclipped on one rank, the CPU works through the offloaded
// chunks last first during backward; what is left is the lowest chunks' work, and the next
// forward waits for the last of those, not for the last chunk. The tail the updates cannot hide
// is then the forward from that chunk's first user on: longer than the last chunk's, which stays
// the tail when backward leaves nothing (or everything) pending.
TEST(CostModelTest, UnclippedForwardWaitsForTheLastPendingChunk) {
  std::mt19937_64 rng(31);
  Trace trace = FullBf16Trace(rng, 12);
  HardwareSpec hw = RandomHardware(rng);
  hw.cpu_adam_params_per_second = 1.0e9;
  hw.cpu_grad_accumulate_params_per_second = 1.0e15;  // negligible: the update alone decides
  CostOptions o;
  o.optimizer = OptimizerKind::kAdamW;
  o.cpu_optimizer_overlaps = true;
  auto time_at = [&](double update_rate, int32_t np, int32_t nb) {
    hw.cpu_adam_update_params_per_second = update_rate;
    return MustCreate(trace, 32 * kMiB, hw, o).Time(np, nb, {}, HostMemoryKind::kPinned);
  };
  const CostModel probe = MustCreate(trace, 32 * kMiB, hw, o);
  const int32_t chunks = probe.num_chunks();
  ASSERT_GE(chunks, 8);
  const int32_t np = chunks / 4;
  const int32_t nb = probe.MinBuffers(np);
  // Backward and its lead do not depend on the CPU's rate.
  const StepTime fast = time_at(1.0e15, np, nb);
  EXPECT_TRUE(fast.cpu_optimizer_deferred);
  const double budget = fast.backward_seconds - fast.cpu_backward_lead_seconds;
  ASSERT_GT(budget, 0);
  // An update rate at which backward finishes chunks [k, C) and leaves [np, k) pending.
  const int32_t k = (np + chunks) / 2;
  const double done_params = OffloadedParams(probe, k, 2);
  ASSERT_GT(done_params, 0);
  const double mid_rate = done_params / (0.999 * budget);
  const StepTime mid = time_at(mid_rate, np, nb);
  const StepTime slow = time_at(1.0e3, np, nb);  // nothing done in backward
  ASSERT_GT(mid.cpu_accumulate_seconds + mid.cpu_optimizer_seconds, budget);
  EXPECT_EQ(slow.cpu_forward_tail_seconds, fast.cpu_forward_tail_seconds);
  EXPECT_GT(mid.cpu_forward_tail_seconds, fast.cpu_forward_tail_seconds);
  EXPECT_LE(mid.cpu_forward_tail_seconds, mid.forward_seconds);
  // Faster updates leave fewer chunks pending, the last of them no later: the tail never
  // shrinks while something is left.
  double previous = slow.cpu_forward_tail_seconds;
  for (double scale = 0.25; scale <= 4.0; scale *= 1.25) {
    const StepTime t = time_at(mid_rate * scale, np, nb);
    if (t.cpu_accumulate_seconds + t.cpu_optimizer_seconds <= budget) continue;
    EXPECT_GE(t.cpu_forward_tail_seconds, previous) << scale;
    previous = t.cpu_forward_tail_seconds;
  }
  // The step reads that tail; the plain-loop reference agrees.
  hw.cpu_adam_update_params_per_second = mid_rate;
  const CostModel model = MustCreate(trace, 32 * kMiB, hw, o);
  const ResidencyPlan plan = model.MakeResidencyPlan(np, nb, {}, HostMemoryKind::kPinned);
  const Prediction pred = model.Predict(plan);
  ExpectNear(pred.iteration_seconds,
             mid.forward_seconds +
                 std::max(mid.backward_seconds + mid.gpu_optimizer_seconds,
                          mid.cpu_backward_lead_seconds + mid.cpu_accumulate_seconds +
                              mid.cpu_optimizer_seconds -
                              (mid.forward_seconds - mid.cpu_forward_tail_seconds)) +
                 mid.fixed_seconds,
             "unclipped step");
  ExpectSamePrediction(pred, model.PredictReference(plan));
  // Clipped, every update waits for the norm and runs in chunk order: the last chunk's tail.
  o.cpu_optimizer_overlaps = false;
  EXPECT_EQ(time_at(mid_rate, np, nb).cpu_forward_tail_seconds, fast.cpu_forward_tail_seconds);
}

// [Shared host CPU] (cost_model.cc): the local ranks of a node run their CPU passes over their
// shards at once on one host, each at the profile's one-process rate / local_world_size; ranks on
// nodes of their own do not share it. Two ranks of llama-3.2-1b, clipping over two micro-batches
// (all three host passes priced), half the chunks offloaded.
TEST(StepTimeTest, LocalRanksShareTheHostCpuPasses) {
  const HardwareSpec hw = SlowLinkH200();
  ASSERT_GT(hw.cpu_grad_accumulate_params_per_second, 0);
  ASSERT_GT(hw.cpu_adam_update_params_per_second, 0);
  auto trace = OneBTrace(hw, 2);
  ASSERT_TRUE(trace.ok()) << trace.status();
  CostOptions two_nodes;
  two_nodes.world_size = 2;
  two_nodes.local_world_size = 1;
  two_nodes.grad_accum = 2;
  two_nodes.cpu_optimizer_overlaps = false;
  CostOptions one_node = two_nodes;
  one_node.local_world_size = 2;
  const CostModel split = MustCreate(*trace, 64 * kMiB, hw, two_nodes);
  const CostModel shared = MustCreate(*trace, 64 * kMiB, hw, one_node);
  const int32_t np = split.num_chunks() / 2;
  const int32_t nb = split.MinBuffers(np);
  // Each rank's shard of the offloaded chunks' parameters.
  const double shard = OffloadedParams(split, np, 2) / 2;
  ASSERT_GT(shard, 0);
  const StepTime a = split.Time(np, nb, {}, HostMemoryKind::kPinned);
  const StepTime b = shared.Time(np, nb, {}, HostMemoryKind::kPinned);
  // Two nodes: each rank has a host to itself, at the profile's rates.
  ExpectNear(a.cpu_accumulate_seconds, shard / hw.cpu_grad_accumulate_params_per_second,
             "two nodes T_acc");
  ExpectNear(a.cpu_optimizer_seconds, shard / hw.cpu_adam_update_params_per_second,
             "two nodes T_upd");
  ASSERT_GT(a.cpu_norm_seconds, 0);
  // One node: the same shard bytes take twice as long in every host pass.
  EXPECT_DOUBLE_EQ(b.cpu_accumulate_seconds, 2 * a.cpu_accumulate_seconds);
  EXPECT_DOUBLE_EQ(b.cpu_optimizer_seconds, 2 * a.cpu_optimizer_seconds);
  EXPECT_DOUBLE_EQ(b.cpu_norm_seconds, 2 * a.cpu_norm_seconds);
  // Nothing else changes.
  EXPECT_EQ(b.forward_seconds, a.forward_seconds);
  EXPECT_EQ(b.backward_seconds, a.backward_seconds);
  EXPECT_EQ(b.gpu_optimizer_seconds, a.gpu_optimizer_seconds);
  EXPECT_EQ(b.fixed_seconds, a.fixed_seconds);
  const ResidencyPlan plan = split.MakeResidencyPlan(np, nb, {}, HostMemoryKind::kPinned);
  EXPECT_GT(shared.Predict(plan).iteration_seconds, split.Predict(plan).iteration_seconds);
  EXPECT_DOUBLE_EQ(shared.Predict(plan).iteration_seconds, b.IterationSeconds(2));
  // An all-persistent plan has no host passes: the two placements predict the same step.
  const int32_t all = split.num_chunks();
  const ResidencyPlan persistent =
      split.MakeResidencyPlan(all, split.MinBuffers(all), {}, HostMemoryKind::kPinned);
  EXPECT_EQ(shared.Predict(persistent).iteration_seconds,
            split.Predict(persistent).iteration_seconds);
}

// A profile without the two figures (older agents) is priced as before they existed: one whole
// pass per step, after backward when clipping, no accumulate or norm term. The previous formula
// and prefix sums are spelled out here and must match bit for bit.
TEST(CostModelTest, ProfilesWithoutTwoPassFiguresPriceOneWholePass) {
  std::mt19937_64 rng(31);
  for (int iter = 0; iter < 60; ++iter) {
    RandomCase c = MakeCase(rng);
    c.trace.training.kind = TrainingKind::kFull;
    c.trace.trainable_param_count = c.trace.total_param_count;
    c.hardware.cpu_grad_accumulate_params_per_second = 0;
    c.hardware.cpu_adam_update_params_per_second = 0;
    c.options.shard_persistent_state = false;
    c.options.time_factor = 0.75 + 0.125 * UniformInt32(rng, 0, 4);
    const CostModel model = MustCreate(c.trace, c.chunk_bytes, c.hardware, c.options);
    const int32_t chunks = model.num_chunks();
    const int64_t dtype_bytes = DTypeBytes(c.trace.param_dtype);
    // The whole pass at the optimizer's rate ([CPU pass bytes]).
    const double rate =
        CpuOptimizerPassRates(c.options.optimizer, c.hardware, dtype_bytes, c.options.grad_accum)
            .update_params_per_second;
    std::vector<double> prefix(static_cast<size_t>(chunks) + 1, 0.0);
    for (int32_t k = 0; k < chunks; ++k) {
      prefix[k + 1] =
          prefix[k] + static_cast<double>(model.layout().chunk_trainable_bytes[k] / dtype_bytes) /
                          static_cast<double>(c.options.world_size) / rate;
    }
    for (int rep = 0; rep < 5; ++rep) {
      const int32_t np = UniformInt32(rng, 0, chunks);
      const int32_t nb = model.MinBuffers(np);
      const ModeCounts m{0, 0, UniformInt32(rng, 0, model.num_blocks())};
      const StepTime t = model.Time(np, nb, m, HostMemoryKind::kPinned);
      EXPECT_EQ(t.cpu_accumulate_seconds, 0);
      EXPECT_EQ(t.cpu_norm_seconds, 0);
      EXPECT_EQ(t.cpu_optimizer_seconds, prefix[chunks] - prefix[np]);
      const double ga = c.options.grad_accum;
      // [Deferred CPU updates] on one rank, clipped or not, hidden until the forward uploads
      // the last offloaded chunk ([CPU windows]).
      const double left = StepUpdatesDeferred(c.options.world_size)
                              ? t.cpu_optimizer_seconds -
                                    std::max(0.0, t.forward_seconds - t.cpu_forward_tail_seconds)
                              : t.cpu_optimizer_seconds;
      const double tail = c.options.cpu_optimizer_overlaps
                              ? std::max(t.backward_seconds + t.gpu_optimizer_seconds,
                                         t.cpu_backward_lead_seconds + left)
                              : t.backward_seconds + std::max(t.gpu_optimizer_seconds, left);
      const double previous =
          ga * t.forward_seconds + (ga - 1) * t.backward_seconds + tail + t.fixed_seconds;
      const Prediction pred =
          model.Predict(model.MakeResidencyPlan(np, nb, m, HostMemoryKind::kPinned));
      EXPECT_DOUBLE_EQ(pred.iteration_seconds, c.options.time_factor * previous);
    }
  }
}

}  // namespace
}  // namespace memplan
