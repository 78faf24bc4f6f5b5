#include "planner/cost/analytic_trace.h"

#include <cmath>

#include "common/head_chunking.h"
#include "common/mlp_tiling.h"
#include "common/param_shapes.h"
#include "common/presets.h"
#include "common/sliding_window.h"
#include "common/validate.h"
#include "gtest/gtest.h"
#include "planner/cost/cost_model.h"

namespace memplan {
namespace {

constexpr double kGiBd = 1024.0 * 1024.0 * 1024.0;

Trace Synth(const std::string& model, int64_t batch, int64_t seq, DType dtype = DType::kBFloat16,
            TrainingMethod training = {}, const AnalyticTraceOptions& options = {}) {
  Workload w;
  w.micro_batch = batch;
  w.seq_len = seq;
  auto t = SynthesizeTrace(*FindModelPreset(model), w, dtype, training, *FindHardwarePreset("h200"),
                           options);
  EXPECT_TRUE(t.ok()) << t.status();
  return *std::move(t);
}

// Parameter counts of the published checkpoints.
TEST(AnalyticTraceTest, ParameterCountsMatchPublishedModels) {
  EXPECT_EQ(Synth("llama-3.2-1b", 1, 128).total_param_count, 1235814400);
  EXPECT_EQ(Synth("llama-3.1-8b", 1, 128).total_param_count, 8030261248);
  EXPECT_EQ(Synth("llama-3.1-70b", 1, 128).total_param_count, 70553706496);
  EXPECT_EQ(Synth("qwen2.5-0.5b", 1, 128).total_param_count, 494032768);  // qkv bias, tied
  EXPECT_EQ(Synth("qwen3-8b", 1, 128).total_param_count, 8190735360);     // qk norm
}

Trace SynthSpec(const ModelSpec& m, int64_t batch, int64_t seq, TrainingMethod training = {}) {
  Workload w;
  w.micro_batch = batch;
  w.seq_len = seq;
  auto t = SynthesizeTrace(m, w, DType::kBFloat16, training, *FindHardwarePreset("h200"));
  EXPECT_TRUE(t.ok()) << t.status();
  return *std::move(t);
}

// Bytes of parameter group g (0 embedding, 1..L the layers, L + 1 the head) as the chunk layout
// sees them (common/param_shapes.h).
std::vector<int64_t> GroupBytes(const ModelSpec& m, int64_t dtype_bytes) {
  std::vector<int64_t> bytes(static_cast<size_t>(m.num_layers + 2), 0);
  for (const ParamShape& p : HfParamShapes(m)) {
    bytes[static_cast<size_t>(p.group)] += p.numel() * dtype_bytes;
  }
  return bytes;
}

ModelSpec QwenMoeWithDenseLayers() {
  // Every second layer sparse and layer 1 forced dense: layers 3, 5, ... are sparse.
  ModelSpec m = *FindModelPreset("qwen3-30b-a3b");
  m.num_layers = 8;
  m.decoder_sparse_step = 2;
  m.mlp_only_layers = {1};
  return m;
}

// A mixture of experts' layers hold every expert: the trace's bytes per layer are the chunk
// layout's, byte for byte, and the totals are the published parameter counts.
TEST(AnalyticTraceTest, MixtureOfExpertsParameterBytesEqualParamShapes) {
  for (const ModelSpec& m : {*FindModelPreset("qwen3-30b-a3b"), *FindModelPreset("mixtral-8x7b"),
                             QwenMoeWithDenseLayers()}) {
    SCOPED_TRACE(m.name);
    const Trace t = SynthSpec(m, 1, 256);
    const std::vector<int64_t> groups = GroupBytes(m, 2);
    ASSERT_EQ(t.blocks.size(), static_cast<size_t>(m.num_layers));
    EXPECT_EQ(t.embedding.param_bytes, groups.front());
    for (int64_t l = 0; l < m.num_layers; ++l) {
      EXPECT_EQ(t.blocks[static_cast<size_t>(l)].param_bytes, groups[static_cast<size_t>(l + 1)])
          << "layer " << l;
    }
    EXPECT_EQ(t.head.param_bytes, groups.back());
    int64_t count = 0;
    for (int64_t b : groups) count += b / 2;
    EXPECT_EQ(t.total_param_count, count);
  }
  EXPECT_EQ(Synth("qwen3-30b-a3b", 1, 128).total_param_count, 30532122624);
  EXPECT_EQ(Synth("mixtral-8x7b", 1, 128).total_param_count, 46702792704);
}

// Dense layers of a Qwen3-MoE model are priced as the dense model's blocks; the sparse ones differ.
TEST(AnalyticTraceTest, MixtureOfExpertsPricesDenseAndSparseLayersApart) {
  const ModelSpec m = QwenMoeWithDenseLayers();
  const Trace t = SynthSpec(m, 1, 1024);
  ModelSpec dense = m;
  dense.family = "qwen3";
  dense.num_experts = 0;
  dense.num_experts_per_tok = 0;
  dense.moe_intermediate_size = 0;
  dense.mlp_only_layers.clear();
  const Trace d = SynthSpec(dense, 1, 1024);
  for (int64_t l = 0; l < m.num_layers; ++l) {
    const BlockTrace& b = t.blocks[static_cast<size_t>(l)];
    const BlockTrace& ref = d.blocks[static_cast<size_t>(l)];
    if (m.IsMoeLayer(l)) {
      EXPECT_NE(b.saved_bytes, ref.saved_bytes) << "layer " << l;
      EXPECT_NE(b.param_bytes, ref.param_bytes) << "layer " << l;
    } else {
      EXPECT_EQ(b.saved_bytes, ref.saved_bytes) << "layer " << l;
      EXPECT_EQ(b.param_bytes, ref.param_bytes) << "layer " << l;
      EXPECT_EQ(b.forward_seconds, ref.forward_seconds) << "layer " << l;
    }
  }
  EXPECT_FALSE(m.IsMoeLayer(1));
  EXPECT_TRUE(m.IsMoeLayer(3));
  EXPECT_FALSE(m.IsMoeLayer(0));
}

// The routed activations grow by the same step with each extra expert per token; weights stay.
TEST(AnalyticTraceTest, MixtureOfExpertsActivationsScaleWithTopK) {
  ModelSpec m = *FindModelPreset("qwen3-30b-a3b");
  m.num_layers = 2;
  std::vector<Trace> traces;
  for (int64_t k : {2, 4, 6}) {
    m.num_experts_per_tok = k;
    traces.push_back(SynthSpec(m, 2, 512));
  }
  const int64_t step = traces[1].blocks[0].saved_bytes - traces[0].blocks[0].saved_bytes;
  EXPECT_GT(step, 0);
  EXPECT_EQ(traces[2].blocks[0].saved_bytes - traces[1].blocks[0].saved_bytes, step);
  EXPECT_EQ(traces[0].blocks[0].param_bytes, traces[2].blocks[0].param_bytes);
  EXPECT_LT(traces[0].blocks[0].forward_seconds, traces[2].blocks[0].forward_seconds);
  // Two more routed rows per token: their sorted copies, three expert intermediates (gate, up and
  // their [Fused gate] product), expert outputs, weights (bf16), the top-k index, order, inverse
  // and the fp32 renormalised weights.
  const int64_t tokens = 2 * 512, h = m.hidden_size, inter = m.moe_intermediate_size;
  EXPECT_EQ(step, tokens * 2 * (2 * 2 * h + 3 * 2 * inter + 2 + 3 * 8 + 4));
}

// The dense model with a sparse one's active parameters: intermediate = top_k x expert width.
ModelSpec DenseEquivalent(const ModelSpec& moe) {
  ModelSpec dense = moe;
  dense.family = "qwen3";
  dense.num_experts = 0;
  dense.num_experts_per_tok = 0;
  dense.intermediate_size = moe.num_experts_per_tok * moe.moe_intermediate_size;
  dense.moe_intermediate_size = 0;
  return dense;
}

// Against a dense model with the same active parameters (intermediate = top_k x expert width), a
// sparse layer keeps the same MLP intermediates plus the routing: softmax, indices, sorted copies,
// expert outputs and weights.
TEST(AnalyticTraceTest, SparseLayerKeepsTheDenseEquivalentPlusItsRouting) {
  const ModelSpec moe = *FindModelPreset("qwen3-30b-a3b");
  const ModelSpec dense = DenseEquivalent(moe);
  const int64_t tokens = 4096;
  const Trace a = SynthSpec(moe, 1, tokens);
  const Trace b = SynthSpec(dense, 1, tokens);
  const int64_t e = moe.num_experts, k = moe.num_experts_per_tok, h = moe.hidden_size;
  const int64_t routing = 4 * e + 3 * 8 * k + (4 * k + 4) + 2 * 2 * k * h + 2 * k;
  EXPECT_EQ(a.blocks[0].saved_bytes - b.blocks[0].saved_bytes, tokens * routing);
  // Same active expert flops, plus the router's: the sparse layer is slower, not by much in
  // compute; its weights are E / k times the dense equivalent's MLP.
  EXPECT_GT(a.blocks[0].forward_seconds, b.blocks[0].forward_seconds);
  EXPECT_GT(a.blocks[0].param_bytes, 10 * b.blocks[0].param_bytes);
}

// [Frozen linear] A LoRA run's router and experts are frozen (adapters on attention only) and keep
// no inputs (agent/model/moe.cc): against the dense equivalent with its MLP frozen too, a sparse
// layer keeps the routing alone, without the layer input, sorted copies or gate/up product.
TEST(AnalyticTraceTest, LoraSparseLayerKeepsNoInputsOfItsFrozenRouterAndExperts) {
  const ModelSpec moe = *FindModelPreset("qwen3-30b-a3b");
  const ModelSpec dense = DenseEquivalent(moe);
  TrainingMethod lora;
  lora.kind = TrainingKind::kLora;
  lora.lora_rank = 16;
  lora.lora_target_modules = {"q_proj", "k_proj", "v_proj", "o_proj"};
  const int64_t tokens = 4096;
  const Trace a = SynthSpec(moe, 1, tokens, lora);
  const Trace b = SynthSpec(dense, 1, tokens, lora);
  const int64_t e = moe.num_experts, k = moe.num_experts_per_tok, h = moe.hidden_size;
  const int64_t routing = 4 * e + 3 * 8 * k + (4 * k + 4) + 2 * k * h + 2 * k;
  EXPECT_EQ(a.blocks[0].saved_bytes - b.blocks[0].saved_bytes, tokens * routing);
  // A full fine-tune's keeps the sorted copies [T * k, H] on top (the layer input and the gate/up
  // product as its dense equivalent keeps its own).
  const Trace full = SynthSpec(moe, 1, tokens);
  const Trace dense_full = SynthSpec(dense, 1, tokens);
  EXPECT_EQ((full.blocks[0].saved_bytes - dense_full.blocks[0].saved_bytes) -
                (a.blocks[0].saved_bytes - b.blocks[0].saved_bytes),
            tokens * 2 * k * h);
}

// [Sparse layer price] The grouped experts stack one projection's weights of every expert
// [E, I, H] for each GEMM: a transient of E·I·H·d bytes in both passes whatever the tokens (at 512
// tokens of qwen3-30b-a3b it is most of the layer's), which scaling a trace keeps as it is; and
// stacking moves bytes with E at a fixed k, so the layer's time grows with the expert count.
TEST(AnalyticTraceTest, SparseLayerPricesTheStackedExpertWeights) {
  ModelSpec m = *FindModelPreset("qwen3-30b-a3b");
  m.num_layers = 2;
  const int64_t stacked = m.num_experts * m.moe_intermediate_size * m.hidden_size * 2;
  const Trace small = SynthSpec(m, 1, 512);
  EXPECT_GT(small.blocks[0].forward_transient_bytes, stacked);
  EXPECT_GT(small.blocks[0].backward_transient_bytes, stacked);
  EXPECT_LT(small.blocks[0].forward_transient_bytes, 2 * stacked);

  // Backward's transient is T-linear plus the stack: scaling 512 -> 2 048 tokens lands on the
  // synthesised figure.
  const Trace large = SynthSpec(m, 4, 512);
  Workload w;
  w.micro_batch = 4;
  w.seq_len = 512;
  EXPECT_EQ(ScaleTraceToWorkload(small, w).blocks[0].backward_transient_bytes,
            large.blocks[0].backward_transient_bytes);

  ModelSpec twice = m;
  twice.num_experts = 2 * m.num_experts;
  const Trace more = SynthSpec(twice, 1, 512);
  EXPECT_GT(more.blocks[0].forward_seconds, small.blocks[0].forward_seconds);
  EXPECT_GT(more.blocks[0].backward_seconds, small.blocks[0].backward_seconds);
}

// The agent refuses QLoRA and adapters on the experts' projections for a mixture of experts;
// the planner refuses the same requests with the same message (common/validate.h).
TEST(AnalyticTraceTest, MixtureOfExpertsRefusesAdaptersTheAgentRefuses) {
  const ModelSpec m = *FindModelPreset("qwen3-30b-a3b");
  Workload w;
  w.micro_batch = 1;
  w.seq_len = 128;
  TrainingMethod lora;
  lora.kind = TrainingKind::kLora;
  lora.lora_rank = 16;
  lora.lora_target_modules = {"q_proj", "up_proj"};
  absl::StatusOr<Trace> t =
      SynthesizeTrace(m, w, DType::kBFloat16, lora, *FindHardwarePreset("h200"));
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  const absl::Status agent = CheckMoeAdapters(m, false, lora.lora_target_modules, "training.");
  EXPECT_EQ(t.status(), agent);
  lora.kind = TrainingKind::kQlora;
  lora.lora_target_modules = {"q_proj", "v_proj"};
  t = SynthesizeTrace(m, w, DType::kBFloat16, lora, *FindHardwarePreset("h200"));
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("QLoRA"), std::string::npos) << t.status();
  lora.kind = TrainingKind::kLora;
  EXPECT_TRUE(SynthesizeTrace(m, w, DType::kBFloat16, lora, *FindHardwarePreset("h200")).ok());
}

// A vision-language model without images is refused, never priced as its language model alone.
TEST(AnalyticTraceTest, VisionLanguageIsRefusedNotUnderCounted) {
  ModelSpec m = *FindModelPreset("qwen2.5-7b");
  m.family = "qwen2_5_vl";
  m.vision.depth = 32;
  m.vision.hidden_size = 1280;
  m.vision.intermediate_size = 3420;
  m.vision.num_heads = 16;
  m.vision.out_hidden_size = m.hidden_size;
  m.vision.fullatt_block_indexes = {7, 15, 23, 31};
  m.image_token_id = 151655;
  m.video_token_id = 151656;
  m.vision_start_token_id = 151652;
  m.vision_end_token_id = 151653;
  m.mrope_section = {16, 24, 24};
  ASSERT_TRUE(ValidateModelSpec(m, "arch.").ok()) << ValidateModelSpec(m, "arch.");
  Workload w;
  w.micro_batch = 1;
  w.seq_len = 128;
  // Without its images the workload is refused, naming the fields.
  absl::StatusOr<Trace> t =
      SynthesizeTrace(m, w, DType::kBFloat16, {}, *FindHardwarePreset("h200"));
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(t.status().message().find("workload.images_per_sample"), std::string::npos)
      << t.status();
  // With them, the tower is priced (tests/planner/cost/vision_trace_test.cc).
  w.images_per_sample = 1;
  w.image_height = 448;
  w.image_width = 448;
  t = SynthesizeTrace(m, w, DType::kBFloat16, {}, *FindHardwarePreset("h200"));
  ASSERT_TRUE(t.ok()) << t.status();
  // Images for a text model.
  t = SynthesizeTrace(*FindModelPreset("qwen2.5-7b"), w, DType::kBFloat16, {},
                      *FindHardwarePreset("h200"));
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  // An image size without images.
  w.images_per_sample = 0;
  EXPECT_FALSE(ValidateWorkload(w, "workload.").ok());
}

// Sparse layers never run the sequence-tiled MLP (the agent tiles the dense MLP only): their
// saved bytes stay linear in the tokens where a dense layer's drop at the tiling threshold.
TEST(AnalyticTraceTest, SparseLayersAreNotTiledWhenScaled) {
  ModelSpec m = QwenMoeWithDenseLayers();
  m.num_layers = 4;  // layer 3 sparse, the others dense
  const int64_t small = 8192;
  const int64_t large = 4 * ((int64_t{2} << 30) / (m.intermediate_size * 2));
  ASSERT_EQ(MlpTileRows(small, m.intermediate_size, 2), 0);
  ASSERT_GT(MlpTileRows(large, m.intermediate_size, 2), 0);
  const Trace a = SynthSpec(m, 1, small);
  const Trace direct = SynthSpec(m, 1, large);
  Workload w;
  w.micro_batch = 1;
  w.seq_len = large;
  const Trace scaled = ScaleTraceToWorkload(a, w);
  for (size_t l = 0; l < a.blocks.size(); ++l) {
    EXPECT_EQ(scaled.blocks[l].saved_bytes, direct.blocks[l].saved_bytes) << "layer " << l;
  }
  EXPECT_EQ(direct.blocks[3].saved_bytes / large, a.blocks[3].saved_bytes / small);
  EXPECT_LT(direct.blocks[0].saved_bytes / large, a.blocks[0].saved_bytes / small);
}

TEST(AnalyticTraceTest, LoraTrainsOnlyAdapters) {
  TrainingMethod lora;
  lora.kind = TrainingKind::kLora;
  lora.lora_rank = 16;
  lora.lora_target_modules = {"q_proj", "v_proj"};
  const Trace t = Synth("llama-3.1-8b", 1, 2048, DType::kBFloat16, lora);
  EXPECT_EQ(t.trainable_param_count, 6815744);  // what PEFT reports for this configuration
  const Trace full = Synth("llama-3.1-8b", 1, 2048);
  // Frozen linears keep no inputs and frozen norms no normalised copies.
  EXPECT_LT(t.blocks[0].saved_bytes, full.blocks[0].saved_bytes);
  EXPECT_LT(t.blocks[0].backward_seconds, full.blocks[0].backward_seconds);
  EXPECT_GT(t.blocks[0].param_bytes, full.blocks[0].param_bytes);  // adapters add weights
}

// [Adapter traffic] An adapter's elementwise passes and skinny products are memory traffic that
// does not depend on its rank: adding o_proj to the targets costs d (hq + 6 h) bytes a token in
// forward and d (5 hq + 4 h) in backward at the HBM rate, beside rank-proportional flops and
// saved bytes (which the difference of two ranks cancels).
TEST(AnalyticTraceTest, AdaptersAddTheirMemoryTraffic) {
  AnalyticTraceOptions device_only;
  device_only.block_forward_floor_seconds = 0;
  device_only.block_backward_floor_seconds = 0;
  const int64_t tokens = 4096;
  auto block = [&](std::vector<std::string> targets, int64_t rank) {
    TrainingMethod lora;
    lora.kind = TrainingKind::kLora;
    lora.lora_rank = rank;
    lora.lora_target_modules = std::move(targets);
    return Synth("llama-3.1-8b", 1, tokens, DType::kBFloat16, lora, device_only).blocks[0];
  };
  const std::vector<std::string> qkv = {"q_proj", "k_proj", "v_proj"};
  const std::vector<std::string> qkvo = {"q_proj", "k_proj", "v_proj", "o_proj"};
  const BlockTrace a1 = block(qkv, 1), b1 = block(qkvo, 1), a2 = block(qkv, 2), b2 = block(qkvo, 2);
  const double fwd =
      2 * (b1.forward_seconds - a1.forward_seconds) - (b2.forward_seconds - a2.forward_seconds);
  const double bwd =
      2 * (b1.backward_seconds - a1.backward_seconds) - (b2.backward_seconds - a2.backward_seconds);
  // A preset card: the achievable HBM rate is kPresetHbmAchieved of its datasheet's.
  const double hbm = FindHardwarePreset("h200")->hbm_bytes_per_second * kPresetHbmAchieved *
                     AnalyticTraceOptions{}.adapter_hbm_efficiency;
  const double h = 4096, hq = 4096;
  EXPECT_NEAR(fwd, 2 * (hq + 6 * h) * tokens / hbm, 1e-9);
  EXPECT_NEAR(bwd, 2 * (5 * hq + 4 * h) * tokens / hbm, 1e-9);
}

TEST(AnalyticTraceTest, ActivationsScaleWithTokensAndDtype) {
  const Trace a = Synth("llama-3.2-1b", 1, 2048);
  const Trace b = Synth("llama-3.2-1b", 2, 2048);
  EXPECT_EQ(b.blocks[0].saved_bytes, 2 * a.blocks[0].saved_bytes);
  EXPECT_EQ(b.blocks[0].input_bytes, 2 * a.blocks[0].input_bytes);
  // The chunked head: the weight-gradient sum does not grow with tokens, the rest does.
  const int64_t weight_grad = int64_t{128256} * 2048 * 4;
  EXPECT_EQ(b.head.saved_bytes - weight_grad, 2 * (a.head.saved_bytes - weight_grad));
  EXPECT_EQ(a.blocks[0].input_bytes, 2048 * 2048 * 2);
  const Trace f = Synth("llama-3.2-1b", 1, 2048, DType::kFloat32);
  EXPECT_GT(f.blocks[0].saved_bytes, a.blocks[0].saved_bytes);
  EXPECT_EQ(f.blocks[0].param_bytes, 2 * a.blocks[0].param_bytes);
  // Attention FLOPs grow with the square of the sequence: per-token device time rises with seq.
  AnalyticTraceOptions device_only;
  device_only.block_forward_floor_seconds = 0;
  device_only.block_backward_floor_seconds = 0;
  const Trace shorter = Synth("llama-3.2-1b", 1, 2048, DType::kBFloat16, {}, device_only);
  const Trace longer = Synth("llama-3.2-1b", 1, 8192, DType::kBFloat16, {}, device_only);
  EXPECT_GT(longer.blocks[0].forward_seconds, 4 * shorter.blocks[0].forward_seconds);
  EXPECT_EQ(longer.blocks[0].saved_bytes, 4 * a.blocks[0].saved_bytes);  // no S x S scores
}

TEST(AnalyticTraceTest, LogitsDominateThePlainHeadAtLargeVocab) {
  // 1×512 tokens fit one head chunk (HeadChunkRows(128256) = 523): the plain path.
  ASSERT_FALSE(HeadIsChunked(512, 128256, 2048));
  const Trace t = Synth("llama-3.2-1b", 1, 512);
  const int64_t tv = int64_t{512} * 128256;
  // bf16 logits + fp32 log_softmax output kept; fp32 grads of both in backward.
  EXPECT_GE(t.head.saved_bytes, 6 * tv);
  EXPECT_LT(t.head.saved_bytes, 7 * tv);
  EXPECT_GE(t.head.backward_transient_bytes, 8 * tv);
  EXPECT_EQ(t.head.param_bytes, 2048 * 2);  // tied: the LM head is the embedding
  EXPECT_EQ(t.embedding.param_bytes, int64_t{128256} * 2048 * 2);
}

// [Fresh embedding grad] A trained embedding's backward holds the new [vocab, hidden] grad the
// lookup writes, besides its per-token terms; a frozen one (adapters) holds nothing.
TEST(AnalyticTraceTest, EmbeddingBackwardHoldsAFreshVocabularyGrad) {
  const int64_t grad = int64_t{128256} * 2048 * 2;
  const int64_t per_token = int64_t{512} * 2048 * (2 + 4);
  EXPECT_EQ(Synth("llama-3.2-1b", 1, 512).embedding.backward_transient_bytes, grad + per_token);
  EXPECT_EQ(Synth("llama-3.2-1b", 1, 512, DType::kFloat32).embedding.backward_transient_bytes,
            2 * grad + int64_t{512} * 2048 * (4 + 4));
  TrainingMethod lora;
  lora.kind = TrainingKind::kLora;
  lora.lora_rank = 8;
  lora.lora_target_modules = {"q_proj", "v_proj"};
  EXPECT_EQ(
      Synth("llama-3.2-1b", 1, 512, DType::kBFloat16, lora).embedding.backward_transient_bytes, 0);
}

// [Head chunk sums]: a plan's head chunk re-prices the head. Its bytes are ChunkedHeadMemory's at
// either size; four times fewer chunks save three quarters of the 8·V·H-byte sums, at the head's
// HBM rate (the h200 preset's, times hbm_efficiency 0.7).
TEST(AnalyticTraceTest, HeadChunkSizeRepricesTheHead) {
  const int64_t h = 2048, v = 128256, tokens = 4 * 2048, d = 2;
  ASSERT_TRUE(HeadIsChunked(tokens, v, h, kPlainHeadChunkLogitBytes));
  const HardwareSpec hw = *FindHardwarePreset("h200");
  const Trace t = Synth("llama-3.2-1b", 4, 2048);
  const Trace wide = RepriceHeadChunks(t, hw, 0, kPlainHeadChunkLogitBytes);
  const ChunkedHeadBytes narrow_c = ChunkedHeadMemory(h, v, d, tokens, true);
  const ChunkedHeadBytes wide_c =
      ChunkedHeadMemory(h, v, d, tokens, true, kPlainHeadChunkLogitBytes);
  EXPECT_EQ(HeadChunkRows(v), 523);
  EXPECT_EQ(HeadChunkRows(v, kPlainHeadChunkLogitBytes), 2092);
  // HeadMemory: the chunked head's bytes and 8 bytes a token (loss terms) in forward.
  EXPECT_EQ(t.head.forward_transient_bytes, narrow_c.forward_transient + tokens * 8);
  EXPECT_EQ(wide.head.forward_transient_bytes, wide_c.forward_transient + tokens * 8);
  EXPECT_EQ(wide.head.forward_transient_bytes - t.head.forward_transient_bytes,
            (2092 - 523) * v * (d + 4 + d));
  EXPECT_EQ(wide.head.saved_bytes - t.head.saved_bytes, wide_c.saved - narrow_c.saved);
  EXPECT_EQ(wide.head.backward_transient_bytes, t.head.backward_transient_bytes);
  EXPECT_EQ(wide.forward_end_bytes, t.forward_end_bytes);
  // 16 chunks of 523 rows, 4 of 2092: 12 fewer sums of 8·V·H bytes.
  EXPECT_EQ(HeadChunkSumBytes(tokens, v, h), 16 * 8 * v * h);
  EXPECT_EQ(HeadChunkSumBytes(tokens, v, h, kPlainHeadChunkLogitBytes), 4 * 8 * v * h);
  const double hbm_rate = hw.hbm_bytes_per_second * 0.7;
  EXPECT_NEAR(t.head.forward_seconds - wide.head.forward_seconds, 12.0 * 8 * v * h / hbm_rate,
              1e-9);
  EXPECT_GT(12.0 * 8 * v * h / hbm_rate, 5e-3);  // the 7.5 ms the H200 spent on 16 sums
  EXPECT_DOUBLE_EQ(wide.head.backward_seconds, t.head.backward_seconds);
  // And back: the default chunk's trace again.
  const Trace back = RepriceHeadChunks(wide, hw, kPlainHeadChunkLogitBytes, 0);
  EXPECT_EQ(back.head.saved_bytes, t.head.saved_bytes);
  EXPECT_EQ(back.head.forward_transient_bytes, t.head.forward_transient_bytes);
  EXPECT_NEAR(back.head.forward_seconds, t.head.forward_seconds, 1e-12);
  // LoRA: the head weight does not train, no sums to save.
  TrainingMethod lora;
  lora.kind = TrainingKind::kLora;
  lora.lora_rank = 8;
  lora.lora_target_modules = {"q_proj", "v_proj"};
  const Trace l = Synth("llama-3.2-1b", 4, 2048, DType::kBFloat16, lora);
  const Trace l_wide = RepriceHeadChunks(l, hw, 0, kPlainHeadChunkLogitBytes);
  EXPECT_NEAR(l_wide.head.forward_seconds, l.head.forward_seconds, 1e-12);
  EXPECT_GT(l_wide.head.forward_transient_bytes, l.head.forward_transient_bytes);
}

// [Chunked head]: beyond one chunk the logits are never whole. The head holds the gradients of
// its input (T×H bf16) and weight (V×H fp32) plus one chunk's logits, whatever the length, and
// less than the plain head would at its peak.
TEST(AnalyticTraceTest, ChunkedHeadHoldsNoFullLogits) {
  const int64_t h = 2048, v = 128256, rows = HeadChunkRows(v);
  AnalyticTraceOptions eager;
  eager.chunked_head = false;
  auto head_peak = [](const Trace& t) {
    return t.head.saved_bytes +
           std::max(t.head.forward_transient_bytes, t.head.backward_transient_bytes);
  };
  for (const int64_t seq : {int64_t{1024}, int64_t{2048}, int64_t{32768}}) {
    ASSERT_TRUE(HeadIsChunked(seq, v, h));
    const Trace t = Synth("llama-3.2-1b", 1, seq);
    const Trace plain = Synth("llama-3.2-1b", 1, seq, DType::kBFloat16, {}, eager);
    EXPECT_LT(head_peak(t), head_peak(plain)) << seq;
    EXPECT_GE(t.head.saved_bytes, seq * h * 2 + v * h * 4) << seq;
    EXPECT_LT(t.head.saved_bytes, seq * h * 16 + v * h * 4) << seq;  // nothing of size T×V
    const int64_t chunk_logits = rows * v * (2 + 4 + 2);
    EXPECT_GE(t.head.forward_transient_bytes, chunk_logits) << seq;
    EXPECT_LT(t.head.forward_transient_bytes, chunk_logits + seq * 64)
        << seq;  // bf16: fp32 GEMM sum
    EXPECT_LT(t.head.backward_transient_bytes, seq * h * 16 + v * h * 2) << seq;
  }
  // Just past one chunk the fp32 weight-gradient sum would outweigh the logits: plain path.
  EXPECT_FALSE(HeadIsChunked(rows + 1, v, h));
  // 32 K tokens hold about 30 GiB less than the plain formula's 14·T·V would.
  const Trace longer = Synth("llama-3.2-1b", 1, 32768);
  EXPECT_LT(longer.head.saved_bytes + longer.head.backward_transient_bytes, int64_t{3} << 30);
}

// Scaling a trace across the chunking threshold rebases the head on the formula at the new
// length: a profile at 512 tokens (plain head) scaled to 8192 tokens (chunked) gives the chunked
// head's bytes, not 16× the plain head's.
TEST(AnalyticTraceTest, ScalingAcrossTheHeadChunkThresholdRebasesTheHead) {
  const Trace short_trace = Synth("llama-3.2-1b", 1, 512);
  const Trace want = Synth("llama-3.2-1b", 4, 2048);
  const Trace got = ScaleTraceToWorkload(short_trace, want.workload);
  EXPECT_EQ(got.head.saved_bytes, want.head.saved_bytes);
  EXPECT_EQ(got.head.forward_transient_bytes, want.head.forward_transient_bytes);
  EXPECT_EQ(got.head.backward_transient_bytes, want.head.backward_transient_bytes);
  EXPECT_EQ(got.blocks[0].saved_bytes, 16 * short_trace.blocks[0].saved_bytes);
  // What a measured trace holds beyond the formula is carried over.
  Trace measured = short_trace;
  measured.head.saved_bytes += 12345;
  EXPECT_EQ(ScaleTraceToWorkload(measured, want.workload).head.saved_bytes,
            want.head.saved_bytes + 12345);
}

// [Sliding-window tiles]: a sliding layer at a sequence beyond its window is priced with the
// tiles' bytes from common/sliding_window.h (the agent's own figures) and a window's worth of
// attention per query; full layers, and every layer up to the window, are unchanged.
TEST(AnalyticTraceTest, SlidingLayersBeyondTheWindowPayForTheirTiles) {
  const ModelSpec full = *FindModelPreset("mistral-7b");
  ModelSpec sliding = full;
  sliding.sliding_window = 4096;
  sliding.sliding_layers = {1, 3};
  const HardwareSpec h200 = *FindHardwarePreset("h200");
  auto synth = [&](const ModelSpec& m, int64_t seq) {
    Workload w;
    w.micro_batch = 1;
    w.seq_len = seq;
    AnalyticTraceOptions device_only;  // the tiles' time, without the host's floor
    device_only.block_forward_floor_seconds = 0;
    device_only.block_backward_floor_seconds = 0;
    absl::StatusOr<Trace> t = SynthesizeTrace(m, w, DType::kBFloat16, {}, h200, device_only);
    EXPECT_TRUE(t.ok()) << t.status();
    return *std::move(t);
  };
  const Trace within = synth(sliding, 4096), within_full = synth(full, 4096);
  EXPECT_EQ(within.blocks[1].backward_transient_bytes,
            within_full.blocks[1].backward_transient_bytes);
  EXPECT_EQ(within.blocks[1].forward_seconds, within_full.blocks[1].forward_seconds);

  const int64_t seq = 32768;
  const Trace a = synth(sliding, seq), b = synth(full, seq);
  // Full layers as before.
  EXPECT_EQ(a.blocks[0].backward_transient_bytes, b.blocks[0].backward_transient_bytes);
  EXPECT_EQ(a.blocks[2].forward_seconds, b.blocks[2].forward_seconds);
  // Sliding layers: at least the tiles' bytes beside the incoming and output gradients.
  const SlidingWindowAttentionBytes tiles = SlidingWindowAttentionMemory(sliding, 4096, 1, seq, 2);
  const int64_t beside = seq * (2 * 2 * 4096 + 2 * 4096);
  EXPECT_GE(a.blocks[1].backward_transient_bytes, beside + tiles.backward_transient);
  EXPECT_GE(a.blocks[3].forward_transient_bytes, beside + tiles.forward_transient);
  EXPECT_GE(a.blocks[1].backward_transient_bytes, b.blocks[1].backward_transient_bytes);
  // Saved bytes do not change (q, k and v are kept, as for flash attention).
  EXPECT_EQ(a.blocks[1].saved_bytes, b.blocks[1].saved_bytes);
  // 4 * hq * (4096 + 1023) flops per token, at 1 / 2.3 of flash's rate, instead of 2 * hq * 32768:
  // forward is cheaper, forward + backward about even (measured on an H200: 52.8 vs 56.7 ms).
  EXPECT_LT(a.blocks[1].forward_seconds, b.blocks[1].forward_seconds);
  EXPECT_EQ(a.blocks[1].recompute_seconds, a.blocks[1].forward_seconds);
  // [Block time]: attention, flash or tiled, at the attention rate of the preset's achievable peak.
  const double rate =
      h200.matmul_bf16_flops * kPresetMatmulAchieved * AnalyticTraceOptions{}.attention_efficiency;
  const double t = static_cast<double>(seq);
  const double saved_fwd = (2.0 * 4096 * t * t - 2.3 * 4.0 * 4096 * 5119 * t) / rate;
  EXPECT_NEAR(b.blocks[1].forward_seconds - a.blocks[1].forward_seconds, saved_fwd,
              1e-9 * saved_fwd);
}

// [Sequence-tiled MLP] qwen3-8b (I = 12 288, bf16) tiles its MLP beyond 87 381 tokens.
TEST(AnalyticTraceTest, TiledMlpKeepsOnlyItsInputAndPaysOneMoreMlpForward) {
  const int64_t d = 2, h = 4096, inter = 12288;
  const Trace whole = Synth("qwen3-8b", 1, 65536);
  const Trace tiled = Synth("qwen3-8b", 1, 131072);
  ASSERT_EQ(MlpTileRows(65536, inter, d), 0);
  const int64_t rows = MlpTileRows(131072, inter, d);
  ASSERT_GT(rows, 0);
  // Per token, the tiled block saves exactly the three [T, I] intermediates less ([Fused gate]:
  // gate, up and their product).
  EXPECT_EQ(2 * whole.blocks[0].saved_bytes - tiled.blocks[0].saved_bytes,
            int64_t{131072} * 3 * d * inter);
  // Forward adds one tile's intermediates; backward holds far less than the whole MLP's.
  EXPECT_EQ(tiled.blocks[0].forward_transient_bytes - 2 * whole.blocks[0].forward_transient_bytes,
            rows * 3 * d * inter);
  EXPECT_LT(tiled.blocks[0].backward_transient_bytes, 2 * whole.blocks[0].backward_transient_bytes);
  EXPECT_GE(tiled.blocks[0].backward_transient_bytes, int64_t{131072} * 3 * d * h);
  // Time: the recomputed MLP forward on top of what doubling the tokens costs.
  EXPECT_GT(tiled.blocks[0].backward_seconds, 2 * whole.blocks[0].backward_seconds);

  // A trace scaled across the threshold moves the intermediates with it, both ways.
  EXPECT_EQ(ScaleTraceToWorkload(whole, tiled.workload).blocks[0].saved_bytes,
            tiled.blocks[0].saved_bytes);
  EXPECT_EQ(ScaleTraceToWorkload(tiled, whole.workload).blocks[0].saved_bytes,
            whole.blocks[0].saved_bytes);
  // LoRA on attention only: the frozen MLP's input is kept by the tiled MLP alone.
  TrainingMethod lora;
  lora.kind = TrainingKind::kLora;
  lora.lora_rank = 16;
  lora.lora_target_modules = {"q_proj", "v_proj"};
  const Trace lora_whole = Synth("qwen3-8b", 1, 65536, DType::kBFloat16, lora);
  const Trace lora_tiled = Synth("qwen3-8b", 1, 131072, DType::kBFloat16, lora);
  EXPECT_EQ(2 * lora_whole.blocks[0].saved_bytes - lora_tiled.blocks[0].saved_bytes,
            int64_t{131072} * (2 * d * inter - d * h));
  EXPECT_EQ(ScaleTraceToWorkload(lora_whole, lora_tiled.workload).blocks[0].saved_bytes,
            lora_tiled.blocks[0].saved_bytes);
}

TEST(AnalyticTraceTest, RejectsInvalidInputsNamingTheField) {
  ModelSpec m = *FindModelPreset("llama-3.2-1b");
  m.num_kv_heads = 5;
  Workload w;
  auto t = SynthesizeTrace(m, w, DType::kBFloat16, {}, *FindHardwarePreset("h200"));
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("arch.num_kv_heads"), std::string::npos);
  w.seq_len = 0;
  t = SynthesizeTrace(*FindModelPreset("llama-3.2-1b"), w, DType::kBFloat16, {},
                      *FindHardwarePreset("h200"));
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("workload.seq_len"), std::string::npos);
}

TEST(AnalyticTraceTest, ScalingAProfiledTraceIsLinearInTokens) {
  const Trace a = Synth("llama-3.2-1b", 1, 1024);
  Workload w = a.workload;
  w.micro_batch = 3;
  const Trace s = ScaleTraceToWorkload(a, w);
  EXPECT_EQ(s.workload.micro_batch, 3);
  EXPECT_EQ(s.blocks[0].saved_bytes, 3 * a.blocks[0].saved_bytes);
  EXPECT_DOUBLE_EQ(s.blocks[0].forward_seconds, 3 * a.blocks[0].forward_seconds);
  EXPECT_EQ(s.blocks[0].param_bytes, a.blocks[0].param_bytes);
}

// Peer baseline (anchors.md): eager PyTorch, bf16 params, AdamW with bf16 states, everything on
// the GPU, the full logits (no chunked head). Peak allocated memory, no CUDA context. The
// analytic model should land within 15%.
double PeerPeakGiB(const std::string& model, int64_t batch, int64_t seq, bool ckpt) {
  AnalyticTraceOptions eager;
  eager.chunked_head = false;
  const Trace t = Synth(model, batch, seq, DType::kBFloat16, {}, eager);
  HardwareSpec hw = *FindHardwarePreset("h200");
  hw.cuda_context_bytes = 0;
  CostOptions o;
  o.optimizer = OptimizerKind::kAdamWBf16States;
  auto cm = CostModel::Create(t, int64_t{256} << 20, hw, o);
  EXPECT_TRUE(cm.ok());
  const int32_t n = cm->num_blocks();
  const ResidencyPlan plan = cm->MakeResidencyPlan(
      cm->num_chunks(), 0, ModeCounts{0, 0, ckpt ? n : 0}, HostMemoryKind::kPinned);
  return static_cast<double>(cm->Predict(plan).peak_bytes) / kGiBd;
}

TEST(AnalyticTraceTest, PeakMatchesPeerAnchorsWithin15Percent) {
  const double one_b = PeerPeakGiB("llama-3.2-1b", 4, 2048, false);
  const double one_b_ckpt = PeerPeakGiB("llama-3.2-1b", 4, 2048, true);
  const double eight_b = PeerPeakGiB("llama-3.1-8b", 1, 4096, false);
  EXPECT_NEAR(one_b, 33.6, 0.15 * 33.6);
  EXPECT_NEAR(one_b_ckpt, 20.8, 0.15 * 20.8);
  EXPECT_NEAR(eight_b, 75.5, 0.15 * 75.5);
  std::printf(
      "anchors (GiB): 1B 4x2048 %.1f (peer 33.6), ckpt %.1f (20.8), 8B 1x4096 %.1f "
      "(75.5)\n",
      one_b, one_b_ckpt, eight_b);
}

// [Block time] The host's floor: a block of a few hundred tokens takes about the floor (the device
// waits on the CPU issuing its kernels), a large one about its device time, and never less than
// either; the combination is (device^p + floor^p)^(1/p).
TEST(AnalyticTraceTest, BlocksTakeTheHostsFloorWhenSmallAndTheirDeviceTimeWhenLarge) {
  AnalyticTraceOptions device_only;
  device_only.block_forward_floor_seconds = 0;
  device_only.block_backward_floor_seconds = 0;
  const AnalyticTraceOptions with_floor;  // [Host runs ahead]: the larger of the two
  AnalyticTraceOptions synced;            // blocks timed between synchronisations
  synced.host_overlap_exponent = 1.5;
  const double f = with_floor.block_forward_floor_seconds;
  const double b = with_floor.block_backward_floor_seconds;
  for (const int64_t seq : {256, 2048, 32768}) {
    SCOPED_TRACE(seq);
    const Trace dev = Synth("llama-3.1-8b", 1, seq, DType::kBFloat16, {}, device_only);
    const Trace all = Synth("llama-3.1-8b", 1, seq, DType::kBFloat16, {}, with_floor);
    const Trace sync = Synth("llama-3.1-8b", 1, seq, DType::kBFloat16, {}, synced);
    for (size_t i : {size_t{0}, dev.blocks.size() - 1}) {
      const BlockTrace& d = dev.blocks[i];
      const BlockTrace& a = all.blocks[i];
      const BlockTrace& s = sync.blocks[i];
      EXPECT_DOUBLE_EQ(a.forward_seconds, std::max(d.forward_seconds, f));
      EXPECT_DOUBLE_EQ(a.backward_seconds, std::max(d.backward_seconds, b));
      const double p = synced.host_overlap_exponent;
      EXPECT_NEAR(s.forward_seconds,
                  std::pow(std::pow(d.forward_seconds, p) + std::pow(f, p), 1.0 / p), 1e-12);
      EXPECT_NEAR(s.backward_seconds,
                  std::pow(std::pow(d.backward_seconds, p) + std::pow(b, p), 1.0 / p), 1e-12);
      EXPECT_GT(s.forward_seconds, a.forward_seconds);
      EXPECT_EQ(a.recompute_seconds, a.forward_seconds);
      // The same bytes: the floor is time only.
      EXPECT_EQ(a.saved_bytes, d.saved_bytes);
    }
    // The edges keep their own time.
    EXPECT_EQ(all.head.forward_seconds, dev.head.forward_seconds);
    EXPECT_EQ(all.embedding.backward_seconds, dev.embedding.backward_seconds);
  }
  // 256 tokens: the floor; 32 768 tokens: the device time.
  const Trace small_dev = Synth("llama-3.1-8b", 1, 256, DType::kBFloat16, {}, device_only);
  const Trace small = Synth("llama-3.1-8b", 1, 256);
  EXPECT_LT(small_dev.blocks[0].forward_seconds, f);
  EXPECT_DOUBLE_EQ(small.blocks[0].forward_seconds, f);
  const Trace large_dev = Synth("llama-3.1-8b", 1, 32768, DType::kBFloat16, {}, device_only);
  const Trace large = Synth("llama-3.1-8b", 1, 32768);
  EXPECT_DOUBLE_EQ(large.blocks[0].backward_seconds, large_dev.blocks[0].backward_seconds);
  AnalyticTraceOptions negative;
  negative.host_overlap_exponent = 0.5;
  Workload w0;
  w0.seq_len = 128;
  EXPECT_FALSE(SynthesizeTrace(*FindModelPreset("llama-3.2-1b"), w0, DType::kBFloat16, {},
                               *FindHardwarePreset("h200"), negative)
                   .ok());
  // Out-of-range options are refused, naming the option.
  AnalyticTraceOptions bad;
  bad.attention_efficiency = 1.5;
  Workload w;
  w.seq_len = 128;
  absl::StatusOr<Trace> refused = SynthesizeTrace(
      *FindModelPreset("llama-3.2-1b"), w, DType::kBFloat16, {}, *FindHardwarePreset("h200"), bad);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("attention_efficiency"), std::string::npos);
  bad = {};
  bad.host_overlap_exponent = 0.5;
  EXPECT_FALSE(SynthesizeTrace(*FindModelPreset("llama-3.2-1b"), w, DType::kBFloat16, {},
                               *FindHardwarePreset("h200"), bad)
                   .ok());
}

// [Block time] A measured card prices from its bench; a preset from kPresetMatmulAchieved and
// kPresetHbmAchieved of its datasheet peaks: the same card either way when the bench reached them.
TEST(AnalyticTraceTest, APresetPricesBlocksAtTheFractionOfItsPeakThatABenchReaches) {
  const HardwareSpec preset = *FindHardwarePreset("h200");
  HardwareSpec benched = preset;
  benched.measured = true;
  benched.matmul_bf16_flops = preset.matmul_bf16_flops * kPresetMatmulAchieved;
  benched.hbm_bytes_per_second = preset.hbm_bytes_per_second * kPresetHbmAchieved;
  AnalyticTraceOptions device_only;
  device_only.block_forward_floor_seconds = 0;
  device_only.block_backward_floor_seconds = 0;
  Workload w;
  w.seq_len = 4096;
  const ModelSpec m = *FindModelPreset("qwen3-8b");
  const Trace a = *SynthesizeTrace(m, w, DType::kBFloat16, {}, preset, device_only);
  const Trace b = *SynthesizeTrace(m, w, DType::kBFloat16, {}, benched, device_only);
  EXPECT_NEAR(a.blocks[3].forward_seconds, b.blocks[3].forward_seconds,
              1e-9 * b.blocks[3].forward_seconds);
  EXPECT_NEAR(a.blocks[3].backward_seconds, b.blocks[3].backward_seconds,
              1e-9 * b.blocks[3].backward_seconds);
  // Measured at the bench's own rates, the same card with half the matmul rate is slower.
  benched.matmul_bf16_flops /= 2;
  const Trace c = *SynthesizeTrace(m, w, DType::kBFloat16, {}, benched, device_only);
  EXPECT_GT(c.blocks[3].forward_seconds, 1.5 * b.blocks[3].forward_seconds);
}

}  // namespace
}  // namespace memplan
