// QLoRA in the cost model: the NF4 base's bytes (common/nf4_bytes.h), the chunk layout of NF4
// parts and adapters, the dequantization transient and time, and the resulting peaks.
#include <algorithm>
#include <cstdio>
#include <numeric>

#include "common/chunk_packing.h"
#include "common/nf4_bytes.h"
#include "common/optimizer_bytes.h"
#include "common/presets.h"
#include "gtest/gtest.h"
#include "planner/cost/analytic_trace.h"
#include "planner/cost/chunk_layout.h"
#include "planner/cost/cost_model.h"

namespace memplan {
namespace {

ModelSpec SmallSpec() {
  ModelSpec m;
  m.name = "small";
  m.hidden_size = 64;
  m.num_layers = 3;
  m.num_heads = 4;
  m.num_kv_heads = 2;
  m.intermediate_size = 176;
  m.vocab_size = 96;
  m.max_position_embeddings = 4096;
  return m;
}

TrainingMethod Method(TrainingKind kind, int64_t rank = 16) {
  TrainingMethod t;
  t.kind = kind;
  if (kind != TrainingKind::kFull) {
    t.lora_rank = rank;
    t.lora_target_modules = {"q_proj", "k_proj", "v_proj", "o_proj",
                             "gate_proj", "up_proj", "down_proj"};
  }
  return t;
}

// The device's time only: the host's floor under each block ([Block time]) is off, so that time
// differences between methods are the terms under test.
AnalyticTraceOptions DeviceOnly() {
  AnalyticTraceOptions o;
  o.block_forward_floor_seconds = 0;
  o.block_backward_floor_seconds = 0;
  return o;
}

Trace Synth(const ModelSpec& arch, TrainingKind kind, int64_t batch, int64_t seq,
            const HardwareSpec& hw = *FindHardwarePreset("h200")) {
  Workload w;
  w.micro_batch = batch;
  w.seq_len = seq;
  absl::StatusOr<Trace> t =
      SynthesizeTrace(arch, w, DType::kBFloat16, Method(kind), hw, DeviceOnly());
  EXPECT_TRUE(t.ok()) << t.status();
  return *std::move(t);
}

TEST(QloraCostTest, BlockBytesAreTheHeaderFormula) {
  const ModelSpec m = SmallSpec();
  const int64_t h = 64, hq = 64, hkv = 32, inter = 176, r = 16;
  // NF4 of each projection (common/nf4_bytes.h): ceil(n/2) data + ceil(n/64) codes + 4 per 256
  // blocks; norms in bf16; adapters r*(in+out) in bf16.
  auto nf4 = [](int64_t n) {
    const int64_t blocks = (n + 63) / 64;
    return (n + 1) / 2 + blocks + 4 * ((blocks + 255) / 256);
  };
  const int64_t base = nf4(h * hq) + 2 * nf4(h * hkv) + nf4(hq * h) + 3 * nf4(h * inter) + 2 * h * 2;
  const int64_t adapters =
      r * ((h + hq) + 2 * (h + hkv) + (hq + h) + 2 * (h + inter) + (inter + h));
  EXPECT_EQ(QloraBlockBaseBytes(m, 2), base);
  const Trace t = Synth(m, TrainingKind::kQlora, 1, 128);
  EXPECT_EQ(t.blocks[0].param_bytes, base + adapters * 2);
  EXPECT_EQ(t.trainable_param_count, 3 * adapters);
  // Embedding and head stay in bf16.
  EXPECT_EQ(t.embedding.param_bytes, 96 * 64 * 2);
  EXPECT_EQ(t.head.param_bytes, (64 + 96 * 64) * 2);

  // The base layout is the agent's packing of [QLoRA layout] (the frozen manager's); the adapters
  // have chunks of their own ([LoRA managers]).
  ASSERT_TRUE(ArchMatchesTrace(t));
  const int64_t chunk = 64 << 10;
  const ChunkLayout layout = LayoutChunks(t, chunk);
  const std::vector<LayoutParam> params = QloraBaseLayoutParams(m, 2);
  ChunkPackingOptions options;
  options.chunk_bytes = chunk;
  options.alignment_bytes = kChunkAlignmentBytes;
  absl::StatusOr<ChunkPacking> packing = ChunkPacking::Build(params, options);
  ASSERT_TRUE(packing.ok()) << packing.status();
  EXPECT_EQ(layout.fingerprint, packing->fingerprint());
  ASSERT_EQ(layout.num_chunks(), packing->num_chunks());
  for (int c = 0; c < layout.num_chunks(); ++c) {
    EXPECT_EQ(layout.chunk_param_bytes[c], packing->chunks()[c].size_bytes) << c;
  }
  // Another method, another layout: a QLoRA plan cannot pass for a LoRA or full one.
  EXPECT_NE(layout.fingerprint, LayoutChunks(Synth(m, TrainingKind::kFull, 1, 128), chunk).fingerprint);
}

TEST(QloraCostTest, DequantizationTransientAndTimeAreCharged) {
  const ModelSpec m = *FindModelPreset("llama-3.1-8b");
  const Trace lora = Synth(m, TrainingKind::kLora, 1, 2048);
  const Trace qlora = Synth(m, TrainingKind::kQlora, 1, 2048);
  const DequantTransient dq = QloraDequantTransient(m, 2);
  EXPECT_EQ(dq.projection, "mlp.gate_proj");
  EXPECT_EQ(dq.bytes, int64_t{14336} * 4096 * 2);
  // The same activations as LoRA, plus one bf16 copy of the largest projection in forward
  // (and recompute) and backward.
  EXPECT_EQ(qlora.blocks[0].saved_bytes, lora.blocks[0].saved_bytes);
  EXPECT_EQ(qlora.blocks[0].forward_transient_bytes,
            lora.blocks[0].forward_transient_bytes + dq.bytes);
  EXPECT_EQ(qlora.blocks[0].backward_transient_bytes,
            lora.blocks[0].backward_transient_bytes + dq.bytes);
  // Each pass reads the NF4 projections and writes their bf16 copies at 0.7 x HBM.
  const HardwareSpec h200 = *FindHardwarePreset("h200");
  const double traffic = static_cast<double>(QloraBlockDequantTrafficBytes(m, 2));
  const double seconds = traffic / (h200.hbm_bytes_per_second * 0.7);
  EXPECT_NEAR(qlora.blocks[0].forward_seconds - lora.blocks[0].forward_seconds, seconds,
              1e-9 * seconds + 1e-12);
  EXPECT_NEAR(qlora.blocks[0].backward_seconds - lora.blocks[0].backward_seconds, seconds,
              1e-9 * seconds + 1e-12);
  EXPECT_EQ(qlora.blocks[0].recompute_seconds, qlora.blocks[0].forward_seconds);
  // A measured dequantization rate replaces the HBM estimate.
  HardwareSpec measured = h200;
  measured.nf4_dequant_bytes_per_second = 1e12;
  const Trace q2 = Synth(m, TrainingKind::kQlora, 1, 2048, measured);
  EXPECT_NEAR(q2.blocks[0].forward_seconds - lora.blocks[0].forward_seconds, traffic / 1e12,
              1e-9 * traffic / 1e12);
  // The base: about 4.1 bits per projection weight (0.5 B + 1/64 B + 4/16384 B).
  const double per_weight = static_cast<double>(QloraBlockBaseBytes(m, 2) - 2 * 4096 * 2) /
                            static_cast<double>(4096 * 4096 * 2 + 4096 * 1024 * 2 + 3 * 4096 * 14336);
  EXPECT_NEAR(per_weight, 0.5 + 1.0 / 64 + 4.0 / 16384, 1e-6);
}

TEST(QloraCostTest, ScalingKeepsTheDequantizationTransient) {
  const ModelSpec m = *FindModelPreset("llama-3.2-1b");
  const Trace a = Synth(m, TrainingKind::kQlora, 1, 1024);
  const Trace b = Synth(m, TrainingKind::kQlora, 2, 2048);
  Workload w = b.workload;
  const Trace scaled = ScaleTraceToWorkload(a, w);
  EXPECT_EQ(scaled.blocks[0].forward_transient_bytes, b.blocks[0].forward_transient_bytes);
  EXPECT_EQ(scaled.blocks[0].backward_transient_bytes, b.blocks[0].backward_transient_bytes);
}

int64_t AllPersistentPeak(const Trace& trace) {
  const HardwareSpec hw = *FindHardwarePreset("h200");
  CostOptions options;
  absl::StatusOr<CostModel> model = CostModel::Create(trace, int64_t{256} << 20, hw, options);
  EXPECT_TRUE(model.ok()) << model.status();
  const ResidencyPlan plan =
      model->MakeResidencyPlan(model->num_chunks(), 0, ModeCounts{}, HostMemoryKind::kPinned);
  return model->Predict(plan).peak_bytes;
}

TEST(QloraCostTest, PeakBelowLoraBelowFull) {
  const ModelSpec m = *FindModelPreset("llama-3.1-8b");
  const int64_t full = AllPersistentPeak(Synth(m, TrainingKind::kFull, 1, 2048));
  const int64_t lora = AllPersistentPeak(Synth(m, TrainingKind::kLora, 1, 2048));
  const int64_t qlora = AllPersistentPeak(Synth(m, TrainingKind::kQlora, 1, 2048));
  EXPECT_LT(qlora, lora);
  EXPECT_LT(lora, full);
  // The projections shrink from 2 bytes to ~0.52 per weight: ~10.3 GB less than LoRA.
  EXPECT_GT(lora - qlora, int64_t{9} << 30);
}

// [Sharded frozen base] (agent/chunks/chunk_manager.cc): with W ranks each rank's host holds its
// shard of every offloaded base chunk, ceil(S / W) elements of S (bytes for QLoRA, whose frozen
// chunks are byte arrays; bf16 elements for LoRA), what the agent's MemoryStats() reports; the
// adapters stay replicated on the device (the same bytes for any W).
TEST(QloraCostTest, SeveralRanksPriceTheirShardOfTheFrozenBase) {
  const ModelSpec m = SmallSpec();
  const HardwareSpec hw = *FindHardwarePreset("h200");
  const int64_t chunk = 64 << 10;
  for (const TrainingKind kind : {TrainingKind::kLora, TrainingKind::kQlora}) {
    SCOPED_TRACE(kind == TrainingKind::kQlora ? "qlora" : "lora");
    const Trace trace = Synth(m, kind, 1, 128);
    ASSERT_TRUE(ArchMatchesTrace(trace));
    const ChunkLayout layout = LayoutChunks(trace, chunk);
    const int64_t elem = kind == TrainingKind::kQlora ? 1 : 2;
    int64_t whole = 0;
    for (const int64_t s : layout.chunk_param_bytes) whole += s;
    int64_t adapters_device = -1;
    for (const int32_t world : {1, 2, 3}) {
      SCOPED_TRACE(world);
      CostOptions options;
      options.world_size = world;
      absl::StatusOr<CostModel> model = CostModel::Create(trace, chunk, hw, options);
      ASSERT_TRUE(model.ok()) << model.status();
      ASSERT_EQ(model->num_chunks(), layout.num_chunks());
      int64_t shards = 0;
      for (const int64_t s : layout.chunk_param_bytes) shards += ShardElems(s / elem, world) * elem;
      // Every base chunk offloaded: the host holds this rank's shards, nothing else.
      EXPECT_EQ(model->HostBytes(0, ModeCounts{}), shards);
      EXPECT_LE(shards * world, whole + world * elem * layout.num_chunks());
      EXPECT_GE(shards * world, whole);
      // A persistent base stays whole on every rank (the plan does not shard it), beside the
      // replicated adapters.
      const RankMemory all = model->RankChunkMemory(model->num_chunks(), 1,
                                                    HostMemoryKind::kPinned, 0);
      EXPECT_EQ(all.chunk_host_pinned_bytes + all.chunk_host_pageable_bytes, 0);
      const RankMemory none = model->RankChunkMemory(0, 2, HostMemoryKind::kPinned, 0);
      EXPECT_EQ(all.persistent_device_bytes - none.persistent_device_bytes, whole);
      if (adapters_device < 0) adapters_device = none.persistent_device_bytes;
      EXPECT_EQ(none.persistent_device_bytes, adapters_device);
      EXPECT_GT(adapters_device, 0);
    }
  }
}

// [Sharded frozen base] with shard_persistent_params ([Sharded persistent parameters]): each
// rank keeps its shard of every persistent base chunk on the device, ceil(S / W) elements of S
// (bytes for QLoRA's byte chunks, bf16 elements for LoRA), holds a stage's and the next stage's
// chunks gathered (padded to a multiple of W elements), and all-gathers every base chunk before
// its stage runs in forward and again in backward (the head's only in forward: its backward runs
// right after its forward), beside compute. The base has no state: the state stays unsharded and
// the adapters replicated.
TEST(QloraCostTest, SeveralRanksShardThePersistentBaseAndGatherItPerStage) {
  const ModelSpec m = SmallSpec();
  ASSERT_FALSE(m.tie_word_embeddings);
  HardwareSpec hw = *FindHardwarePreset("h200");
  // A slow link: the gathers outweigh the tiny model's compute in every window.
  hw.nccl_allgather_bytes_per_second = 1e6;
  hw.nccl_allgather_under_compute_bytes_per_second = 0;
  const int64_t chunk = 64 << 10;
  for (const TrainingKind kind : {TrainingKind::kLora, TrainingKind::kQlora}) {
    SCOPED_TRACE(kind == TrainingKind::kQlora ? "qlora" : "lora");
    const Trace trace = Synth(m, kind, 1, 128, hw);
    const ChunkLayout layout = LayoutChunks(trace, chunk);
    const int64_t elem = kind == TrainingKind::kQlora ? 1 : 2;
    for (const int32_t world : {2, 3}) {
      SCOPED_TRACE(world);
      CostOptions options;
      options.world_size = world;
      options.local_world_size = world;
      EXPECT_FALSE(CostModel::CanShardPersistentState(trace, options));
      EXPECT_TRUE(CostModel::CanShardPersistentParams(trace, options));
      absl::StatusOr<CostModel> replicated = CostModel::Create(trace, chunk, hw, options);
      options.shard_persistent_params = true;
      absl::StatusOr<CostModel> sharded = CostModel::Create(trace, chunk, hw, options);
      ASSERT_TRUE(replicated.ok() && sharded.ok());
      EXPECT_TRUE(sharded->ShardsPersistentParams());
      EXPECT_FALSE(sharded->ShardsPersistentState());
      const int32_t chunks = sharded->num_chunks();
      const ResidencyPlan rp =
          replicated->MakeResidencyPlan(chunks, 0, ModeCounts{}, HostMemoryKind::kPinned);
      const ResidencyPlan sp =
          sharded->MakeResidencyPlan(chunks, 0, ModeCounts{}, HostMemoryKind::kPinned);
      EXPECT_TRUE(sp.shard_persistent_params);
      EXPECT_FALSE(sp.shard_persistent_state);
      EXPECT_TRUE(sharded->ValidatePlan(sp).ok());
      EXPECT_FALSE(replicated->ValidatePlan(sp).ok());
      const Prediction r = replicated->Predict(rp);
      const Prediction s = sharded->Predict(sp);

      int64_t whole = 0, shards = 0;
      std::vector<int64_t> padded;
      for (const int64_t bytes : layout.chunk_param_bytes) {
        whole += bytes;
        shards += ShardElems(bytes / elem, world) * elem;
        padded.push_back(PaddedElems(bytes / elem, world) * elem);
      }
      // Held gathered: the largest pair of adjacent stages' chunks.
      int64_t held = 0;
      for (size_t g = 0; g + 1 < layout.stage_first_chunk.size(); ++g) {
        int64_t bytes = 0;
        for (int32_t c = layout.stage_first_chunk[g]; c <= layout.stage_last_chunk[g + 1]; ++c) {
          bytes += padded[c];
        }
        held = std::max(held, bytes);
      }
      const int64_t adapters = replicated->RankChunkMemory(0, 2, HostMemoryKind::kPinned, 0)
                                   .persistent_device_bytes;
      EXPECT_EQ(r.rank_memory.persistent_device_bytes, adapters + whole);
      EXPECT_EQ(s.rank_memory.persistent_device_bytes, adapters + shards);
      EXPECT_EQ(s.rank_memory.persistent_gather_device_bytes, held);
      EXPECT_EQ(r.rank_memory.persistent_gather_device_bytes, 0);
      EXPECT_EQ(s.rank_memory.persistent_state_device_bytes,
                r.rank_memory.persistent_state_device_bytes);
      EXPECT_EQ(r.peak_bytes - s.peak_bytes, whole - shards - held);
      EXPECT_EQ(r.load_peak_bytes - s.load_peak_bytes, whole - shards);

      // Forward gathers every chunk, backward every chunk before the head's; (W-1)/W of each
      // crosses the link.
      double fwd_bytes = 0, bwd_bytes = 0;
      const int32_t head_first = layout.stage_first_chunk.back();
      for (int32_t c = 0; c < chunks; ++c) {
        fwd_bytes += static_cast<double>(layout.chunk_param_bytes[c]);
        if (c < head_first) bwd_bytes += static_cast<double>(layout.chunk_param_bytes[c]);
      }
      const double frac = (world - 1.0) / world;
      const double fwd = frac * fwd_bytes / hw.nccl_allgather_bytes_per_second;
      const double bwd = frac * bwd_bytes / hw.nccl_allgather_bytes_per_second;
      const double fwd_extra = s.forward_seconds - r.forward_seconds;
      const double bwd_extra = s.backward_seconds - r.backward_seconds;
      std::printf("%s W=%d: base %lld B, shards %lld B, held %lld B; gathers fwd %.4f s "
                  "(+%.4f s), bwd %.4f s (+%.4f s)\n",
                  kind == TrainingKind::kQlora ? "qlora" : "lora", world,
                  static_cast<long long>(whole), static_cast<long long>(shards),
                  static_cast<long long>(held), fwd, fwd_extra, bwd, bwd_extra);
      EXPECT_LE(fwd_extra, fwd * 1.0001);
      EXPECT_GE(fwd_extra, fwd * 0.98);
      EXPECT_LE(bwd_extra, bwd * 1.0001);
      EXPECT_GE(bwd_extra, bwd * 0.98);
      // Nothing is gathered after the step (the base is never updated): the step adds what it
      // did (the difference of the totals, to rounding).
      EXPECT_NEAR(s.optimizer_seconds, r.optimizer_seconds, 1e-6 * r.optimizer_seconds);
    }
  }
}

}  // namespace
}  // namespace memplan
