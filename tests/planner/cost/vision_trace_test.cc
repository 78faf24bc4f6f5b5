// The analytic trace's vision tower ([Vision tower price] in docs/cost-model.md): Qwen2.5-VL-7B
// with one 448x448 image per sample, its figures derived here by hand from the published config,
// against the same language model without the tower.
#include <string>

#include "common/presets.h"
#include "common/validate.h"
#include "common/vision_cost.h"
#include "gtest/gtest.h"
#include "planner/core/plan_engine.h"
#include "planner/cost/analytic_trace.h"
#include "planner/cost/cost_model.h"

namespace memplan {
namespace {

// Qwen2.5-VL-7B-Instruct's config.json (scripts/configs/qwen2.5-vl-7b): Qwen2.5-7B's language
// model and a 32-block tower of width 1280.
ModelSpec Qwen25Vl7b() {
  ModelSpec m = *FindModelPreset("qwen2.5-7b");
  m.name = "qwen2.5-vl-7b";
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
  return m;
}

// The same language model as a text model: what the trace is without the tower.
ModelSpec TextOnly(ModelSpec m) {
  m.family = "qwen2";
  m.vision = VisionSpec{};
  m.image_token_id = m.video_token_id = m.vision_start_token_id = m.vision_end_token_id = 0;
  m.mrope_section.clear();
  return m;
}

TrainingMethod Lora() {
  TrainingMethod t;
  t.kind = TrainingKind::kLora;
  t.lora_rank = 16;
  t.lora_target_modules = {"q_proj", "k_proj", "v_proj", "o_proj"};
  return t;
}

Workload OneImage448() {
  Workload w;
  w.micro_batch = 1;
  w.seq_len = 2048;
  w.images_per_sample = 1;
  w.image_height = 448;
  w.image_width = 448;
  return w;
}

absl::StatusOr<Trace> Synth(const ModelSpec& m, const Workload& w, const TrainingMethod& t) {
  return SynthesizeTrace(m, w, DType::kBFloat16, t, *FindHardwarePreset("h200"));
}

// By hand, bf16 (2 bytes), 448x448: 32x32 patches of 14 pixels = 1024 patches, 256 merged.
constexpr int64_t kPatches = 1024, kMerged = 256, kTokens = 2048;
constexpr int64_t kHv = 1280, kIv = 3420, kHeads = 16, kHeadDim = 80, kPatchDim = 3 * 2 * 14 * 14;
constexpr int64_t kLmHidden = 3584;
// Patch embedding; per block two norms, qkv and proj with biases, SwiGLU with biases; merger
// (its norm, 5120 -> 5120 and 5120 -> 3584 with biases).
constexpr int64_t kBlockParams = 2 * kHv + (3 * kHv * kHv + 3 * kHv) + (kHv * kHv + kHv) +
                                 2 * (kIv * kHv + kIv) + kHv * kIv + kHv;
constexpr int64_t kTowerParams = kHv * kPatchDim + 32 * kBlockParams + kHv + (4 * kHv) * (4 * kHv) +
                                 4 * kHv + kLmHidden * 4 * kHv + kLmHidden;
constexpr int64_t kPixelBytes = kPatches * kPatchDim * 4;  // fp32 on the device

TEST(VisionTraceTest, TowerParametersAreThePublishedCount) {
  EXPECT_EQ(kTowerParams, 676550144);
  EXPECT_EQ(VisionTowerParamCount(Qwen25Vl7b()), kTowerParams);
  absl::StatusOr<Trace> t = Synth(Qwen25Vl7b(), OneImage448(), {});
  ASSERT_TRUE(t.ok()) << t.status();
  // Qwen2.5-VL-7B-Instruct's safetensors hold 8,292,166,656 parameters.
  EXPECT_EQ(t->total_param_count, 8292166656);
  EXPECT_EQ(t->trainable_param_count, 8292166656);
}

// A vision-language workload without its images is refused, never priced as text.
TEST(VisionTraceTest, WithoutImagesRefusedNamingTheField) {
  Workload w = OneImage448();
  w.images_per_sample = 0;
  w.image_height = w.image_width = 0;
  absl::StatusOr<Trace> t = Synth(Qwen25Vl7b(), w, Lora());
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(t.status().message().find("workload.images_per_sample is required"), std::string::npos)
      << t.status();
  // A size outside the allowed range names the field and the range.
  w = OneImage448();
  w.image_width = 70000;
  t = Synth(Qwen25Vl7b(), w, Lora());
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("workload.image_width"), std::string::npos) << t.status();
  EXPECT_NE(t.status().message().find("65536"), std::string::npos) << t.status();
}

// LoRA: the tower is frozen, so it keeps nothing for backward; the plan carries its weights (in
// the embedding's chunks), the fp32 pixel values, and its transients in the embedding's group.
TEST(VisionTraceTest, LoraAddsTheTowerToTheEmbeddingGroupOnly) {
  absl::StatusOr<Trace> vl = Synth(Qwen25Vl7b(), OneImage448(), Lora());
  Workload text_workload = OneImage448();
  text_workload.images_per_sample = 0;
  text_workload.image_height = text_workload.image_width = 0;
  absl::StatusOr<Trace> text = Synth(TextOnly(Qwen25Vl7b()), text_workload, Lora());
  ASSERT_TRUE(vl.ok()) << vl.status();
  ASSERT_TRUE(text.ok()) << text.status();

  EXPECT_EQ(vl->embedding.param_bytes - text->embedding.param_bytes, kTowerParams * 2);
  EXPECT_EQ(vl->embedding.saved_bytes - text->embedding.saved_bytes, kPixelBytes);
  // The tower's peak is inside a block's attention: the residual (2·Hv), positions (16), angles
  // (2·80), cos and sin (8·80) per patch, the window order (8 per merged patch) and the inverse
  // frequencies (20 floats) beside the norm output, qkv, q and k's rotation in fp32:
  // (5·2 + 4 + 16 + 2)·Hv per patch.
  const int64_t base =
      kPatches * (2 * kHv + 16 + 2 * kHeadDim + 8 * kHeadDim) + 8 * kMerged + kHeadDim;
  const int64_t rotation = kPatches * (5 * 2 + 4 + 16 + 2) * kHv;
  const int64_t embeds = kTokens * kLmHidden * 2;
  EXPECT_EQ(base + rotation, 45402192);
  EXPECT_EQ(vl->embedding.forward_transient_bytes, embeds + base + rotation);
  EXPECT_EQ(vl->embedding.backward_transient_bytes, text->embedding.backward_transient_bytes);
  EXPECT_EQ(vl->embedding.backward_seconds, text->embedding.backward_seconds);
  EXPECT_GT(vl->embedding.forward_seconds, text->embedding.forward_seconds);
  // The language model is the text model's, block for block.
  ASSERT_EQ(vl->blocks.size(), text->blocks.size());
  for (size_t i = 0; i < vl->blocks.size(); ++i) {
    EXPECT_EQ(vl->blocks[i].saved_bytes, text->blocks[i].saved_bytes);
    EXPECT_EQ(vl->blocks[i].param_bytes, text->blocks[i].param_bytes);
  }
  EXPECT_EQ(vl->forward_end_bytes - text->forward_end_bytes, kPixelBytes);
  EXPECT_EQ(vl->trainable_param_count, text->trainable_param_count);

  // A plan keeping every chunk on the device: the peak grows by the tower's weights (whole chunks
  // of the embedding's group) and the pixel values, the activations by the pixel values exactly.
  const HardwareSpec& hw = *FindHardwarePreset("h200");
  const int64_t chunk = int64_t{64} << 20;
  absl::StatusOr<CostModel> with = CostModel::Create(*vl, chunk, hw, {});
  absl::StatusOr<CostModel> without = CostModel::Create(*text, chunk, hw, {});
  ASSERT_TRUE(with.ok()) << with.status();
  ASSERT_TRUE(without.ok()) << without.status();
  const Prediction a = with->Predict(
      with->MakeResidencyPlan(with->num_chunks(), 0, ModeCounts{}, HostMemoryKind::kPinned));
  const Prediction b = without->Predict(
      without->MakeResidencyPlan(without->num_chunks(), 0, ModeCounts{}, HostMemoryKind::kPinned));
  const int64_t weights = a.breakdown.persistent_chunks_bytes - b.breakdown.persistent_chunks_bytes;
  EXPECT_GE(weights, kTowerParams * 2);
  EXPECT_LT(weights, kTowerParams * 2 + chunk);
  EXPECT_EQ(a.breakdown.activations_bytes - b.breakdown.activations_bytes, kPixelBytes);
  EXPECT_GE(a.peak_bytes - b.peak_bytes, kTowerParams * 2 + kPixelBytes);
}

// Full fine-tuning trains the tower: its autograd keeps, per patch and block,
// 8·Hv + 11·2·Hv + 4·heads + 8 + 4·2·Iv bytes, plus the rotary tables, the bf16 pixels, the
// merger and the two window orders, until the embedding group's backward.
TEST(VisionTraceTest, FullFineTuningKeepsTheTowersActivations) {
  absl::StatusOr<Trace> vl = Synth(Qwen25Vl7b(), OneImage448(), {});
  Workload text_workload = OneImage448();
  text_workload.images_per_sample = 0;
  text_workload.image_height = text_workload.image_width = 0;
  absl::StatusOr<Trace> text = Synth(TextOnly(Qwen25Vl7b()), text_workload, {});
  ASSERT_TRUE(vl.ok()) << vl.status();
  ASSERT_TRUE(text.ok()) << text.status();
  const int64_t block = 8 * kHv + 11 * 2 * kHv + 4 * kHeads + 8 + 4 * 2 * kIv;
  EXPECT_EQ(block, 65832);
  const int64_t merger = 4 * kHv + 4 * 2 * kHv + 4;
  const int64_t per_patch = 32 * block + 8 * kHeadDim + 2 * kPatchDim + merger;
  const int64_t saved = kPatches * per_patch + 2 * 8 * kMerged;
  EXPECT_EQ(saved, 2175983616);  // 2.03 GiB for one 448x448 image
  const VisionTowerCost tower =
      VisionTowerCostFor(Qwen25Vl7b(), 1, 448, 448, DType::kBFloat16, /*trains=*/true);
  EXPECT_EQ(tower.saved_bytes, saved);
  // With the scatter's image-token mask (a bool per token).
  EXPECT_EQ(vl->embedding.saved_bytes - text->embedding.saved_bytes, kPixelBytes + saved + kTokens);
  EXPECT_EQ(vl->forward_end_bytes - text->forward_end_bytes, kPixelBytes + saved + kTokens);
  EXPECT_GT(vl->embedding.backward_seconds, text->embedding.backward_seconds);
  EXPECT_GT(vl->embedding.backward_transient_bytes, text->embedding.backward_transient_bytes);
}

// [Vision block checkpointing] Checkpointed blocks keep their inputs (bf16 [patches, 1280]) in
// place of their saved sets: the embedding group's saved bytes drop by exactly that, by hand, and
// its backward takes the blocks' forward once more.
TEST(VisionTraceTest, CheckpointedTowerKeepsOnlyBlockInputs) {
  Workload w = OneImage448();
  absl::StatusOr<Trace> kept = Synth(Qwen25Vl7b(), w, {});
  w.vision_checkpoint = true;
  absl::StatusOr<Trace> ckpt = Synth(Qwen25Vl7b(), w, {});
  ASSERT_TRUE(kept.ok()) << kept.status();
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  const int64_t block = 8 * kHv + 11 * 2 * kHv + 4 * kHeads + 8 + 4 * 2 * kIv;
  const int64_t drop = kPatches * 32 * (block - 2 * kHv);
  EXPECT_EQ(kept->embedding.saved_bytes - ckpt->embedding.saved_bytes, drop);
  EXPECT_EQ(kept->forward_end_bytes - ckpt->forward_end_bytes, drop);
  const VisionTowerCost a = VisionTowerCostFor(Qwen25Vl7b(), 1, 448, 448, DType::kBFloat16, true);
  const VisionTowerCost b =
      VisionTowerCostFor(Qwen25Vl7b(), 1, 448, 448, DType::kBFloat16, true, true);
  EXPECT_EQ(a.saved_bytes - b.saved_bytes, drop);
  EXPECT_GT(ckpt->embedding.backward_seconds, kept->embedding.backward_seconds);
  EXPECT_EQ(ckpt->embedding.forward_seconds, kept->embedding.forward_seconds);
  EXPECT_GT(ckpt->embedding.backward_transient_bytes, kept->embedding.backward_transient_bytes);
  EXPECT_NE(ckpt->trace_id, kept->trace_id);
  // A frozen tower records nothing: the flag changes nothing.
  w.vision_checkpoint = false;
  absl::StatusOr<Trace> lora = Synth(Qwen25Vl7b(), w, Lora());
  w.vision_checkpoint = true;
  absl::StatusOr<Trace> lora_ckpt = Synth(Qwen25Vl7b(), w, Lora());
  ASSERT_TRUE(lora.ok() && lora_ckpt.ok());
  EXPECT_EQ(lora->embedding.saved_bytes, lora_ckpt->embedding.saved_bytes);
  EXPECT_EQ(lora->embedding.backward_seconds, lora_ckpt->embedding.backward_seconds);
}

// The planner checkpoints the tower by itself when only that fits: at the largest micro-batch a
// checkpointed tower allows, a plan that leaves it off is answered with it on; where the kept
// tower fits, it stays off (faster). The stored plan prices as planned.
TEST(VisionTraceTest, PlannerCheckpointsTheTowerWhenMemoryIsShort) {
  PlanInputs in;
  in.arch = Qwen25Vl7b();
  in.hardware = *FindHardwarePreset("h200");
  in.workload = OneImage448();
  in.workload.vision_checkpoint = true;
  absl::StatusOr<PlanOutcome> forced = MakePlan(in);
  ASSERT_TRUE(forced.ok()) << forced.status();
  ASSERT_TRUE(forced->fits) << forced->reason;
  EXPECT_TRUE(forced->plan.vision_checkpoint);
  const int64_t max_batch = forced->max_micro_batch;
  ASSERT_GT(max_batch, 1);

  in.skip_limits = true;
  in.workload.vision_checkpoint = false;
  absl::StatusOr<PlanOutcome> small = MakePlan(in);
  ASSERT_TRUE(small.ok()) << small.status();
  ASSERT_TRUE(small->fits) << small->reason;
  EXPECT_FALSE(small->plan.vision_checkpoint);

  in.workload.micro_batch = max_batch;
  absl::StatusOr<PlanOutcome> tight = MakePlan(in);
  ASSERT_TRUE(tight.ok()) << tight.status();
  ASSERT_TRUE(tight->fits) << tight->reason;
  EXPECT_TRUE(tight->plan.vision_checkpoint) << tight->reason;
  EXPECT_TRUE(tight->trace_used.workload.vision_checkpoint);
  EXPECT_NE(tight->reason.find("vision tower's blocks checkpointed"), std::string::npos)
      << tight->reason;
  absl::StatusOr<Prediction> again = PredictPlan(in, tight->plan);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->peak_bytes, tight->prediction.peak_bytes);
  ResidencyPlan kept_plan = tight->plan;
  kept_plan.vision_checkpoint = false;
  absl::StatusOr<Prediction> kept = PredictPlan(in, kept_plan);
  ASSERT_TRUE(kept.ok()) << kept.status();
  EXPECT_GT(kept->peak_bytes, tight->prediction.peak_bytes);
  EXPECT_LT(kept->iteration_seconds, tight->prediction.iteration_seconds);
}

// Flops: the patch embedding, every block's linears, the merger, and attention inside 16 windows
// of 8x8 patches (28 blocks) or over the whole image (4 blocks).
TEST(VisionTraceTest, TowerFlopsByHand) {
  const double n = kPatches, hv = kHv, iv = kIv;
  const double linears = 2.0 * n * kPatchDim * hv + 32.0 * 2.0 * n * (4 * hv * hv + 3 * hv * iv) +
                         2.0 * kMerged * (5120.0 * 5120.0 + 5120.0 * 3584.0);
  const double attention = 28.0 * 4.0 * hv * 16.0 * 64.0 * 64.0 + 4.0 * 4.0 * hv * n * n;
  const VisionTowerCost frozen =
      VisionTowerCostFor(Qwen25Vl7b(), 1, 448, 448, DType::kBFloat16, /*trains=*/false);
  EXPECT_DOUBLE_EQ(frozen.forward_flops, linears + attention);
  EXPECT_EQ(frozen.backward_flops, 0.0);
  EXPECT_EQ(frozen.saved_bytes, 0);
  EXPECT_EQ(frozen.image_tokens, kMerged);
  // An image of 450x440 pixels is priced as the 476x448 the rounding up gives (34x32 patches).
  const VisionTowerCost odd =
      VisionTowerCostFor(Qwen25Vl7b(), 2, 450, 440, DType::kBFloat16, /*trains=*/false);
  EXPECT_EQ(odd.patches, 2 * 34 * 32);
  EXPECT_EQ(odd.pixel_bytes, 2 * 34 * 32 * kPatchDim * 4);
}

// Qwen2-VL-7B (preset qwen2-vl-7b, scripts/configs/qwen2-vl-7b) with one 448x448 image, bf16, by
// hand: per block two LayerNorms keeping 2·2·Hv + 8 each, attention 7·2·Hv + 4·heads, the QuickGELU
// MLP 3·2·Iv (Iv = 4·1280); no window orders; every block attends over all 1024 patches.
TEST(VisionTraceTest, Qwen2VlTowerByHand) {
  const ModelSpec m = *FindModelPreset("qwen2-vl-7b");
  constexpr int64_t kIv2 = 4 * kHv;
  EXPECT_EQ(VisionTowerParamCount(m), 675759104);
  const int64_t norm = 2 * 2 * kHv + 8;
  const int64_t block = 2 * norm + 7 * 2 * kHv + 4 * kHeads + 3 * 2 * kIv2;
  EXPECT_EQ(block, 58960);
  const int64_t merger = norm + 2 * 2 * kHv;
  const int64_t saved =
      kPatches * (32 * block + 8 * kHeadDim + 2 * kPatchDim + merger);  // no window orders
  EXPECT_EQ(saved, 1945559040);                                         // 1.81 GiB
  const VisionTowerCost trained =
      VisionTowerCostFor(m, 1, 448, 448, DType::kBFloat16, /*trains=*/true);
  EXPECT_EQ(trained.saved_bytes, saved);
  EXPECT_EQ(trained.param_count, 675759104);
  EXPECT_EQ(trained.output_bytes, kMerged * kLmHidden * 2);
  const double n = kPatches, hv = kHv, iv = kIv2;
  const double linears = 2.0 * n * kPatchDim * hv + 32.0 * 2.0 * n * (4 * hv * hv + 2 * hv * iv) +
                         2.0 * kMerged * (5120.0 * 5120.0 + 5120.0 * 3584.0);
  const double attention = 32.0 * 4.0 * hv * n * n;
  EXPECT_DOUBLE_EQ(trained.forward_flops, linears + attention);
  // Backward: the patch embedding's weight gradient, both gradients of every other linear,
  // attention at 2.5 times its forward.
  const double patch = 2.0 * n * kPatchDim * hv;
  EXPECT_DOUBLE_EQ(trained.backward_flops, patch + 2.0 * (linears - patch) + 2.5 * attention);
  const VisionTowerCost frozen =
      VisionTowerCostFor(m, 1, 448, 448, DType::kBFloat16, /*trains=*/false);
  EXPECT_EQ(frozen.saved_bytes, 0);
  EXPECT_EQ(frozen.image_tokens, kMerged);
  // The planner prices it (LoRA on the language model's attention, one image per sample).
  absl::StatusOr<Trace> t = Synth(m, OneImage448(), Lora());
  ASSERT_TRUE(t.ok()) << t.status();
  PlanInputs in;
  in.arch = m;
  in.hardware = *FindHardwarePreset("h200");
  in.workload = OneImage448();
  in.training = Lora();
  absl::StatusOr<PlanOutcome> plan = MakePlan(in);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_TRUE(plan->fits);
}

// A trace scaled to another workload carries the tower of that workload's images: the embedding
// group's bytes equal a synthesis there, whether the micro-batch (and so the images) or only the
// sequence grows.
TEST(VisionTraceTest, ScaledTraceFollowsTheImages) {
  for (const TrainingMethod& training : {TrainingMethod{}, Lora()}) {
    absl::StatusOr<Trace> base = Synth(Qwen25Vl7b(), OneImage448(), training);
    ASSERT_TRUE(base.ok()) << base.status();
    for (const auto& [batch, seq] : {std::pair<int64_t, int64_t>{2, 2048}, {1, 4096}}) {
      Workload w = OneImage448();
      w.micro_batch = batch;
      w.seq_len = seq;
      SCOPED_TRACE(testing::Message()
                   << batch << "x" << seq << " kind " << static_cast<int>(training.kind));
      const Trace scaled = ScaleTraceToWorkload(*base, w);
      absl::StatusOr<Trace> direct = Synth(Qwen25Vl7b(), w, training);
      ASSERT_TRUE(direct.ok()) << direct.status();
      EXPECT_EQ(scaled.embedding.saved_bytes, direct->embedding.saved_bytes);
      EXPECT_EQ(scaled.embedding.forward_transient_bytes,
                direct->embedding.forward_transient_bytes);
      EXPECT_EQ(scaled.embedding.backward_transient_bytes,
                direct->embedding.backward_transient_bytes);
      EXPECT_EQ(scaled.forward_end_bytes, direct->forward_end_bytes);
    }
  }
}

// A profile of a vision-language model without an image never ran the tower: refused. A plan
// made from a profile with one image for a workload of two carries the second image's bytes; a
// text-only workload for it is refused.
TEST(VisionTraceTest, ProfilesAndPlansCarryTheirImages) {
  absl::StatusOr<Trace> profile = Synth(Qwen25Vl7b(), OneImage448(), Lora());
  ASSERT_TRUE(profile.ok()) << profile.status();
  profile->analytic = false;
  EXPECT_TRUE(ValidateTrace(*profile, "trace.").ok()) << ValidateTrace(*profile, "trace.");
  Trace text_profile = *profile;
  text_profile.workload.images_per_sample = 0;
  text_profile.workload.image_height = text_profile.workload.image_width = 0;
  const absl::Status refused = ValidateTrace(text_profile, "trace.");
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.message().find("trace.workload.images_per_sample is required"),
            std::string::npos)
      << refused;

  PlanInputs in;
  in.arch = Qwen25Vl7b();
  in.profiled_trace = *profile;
  in.hardware = *FindHardwarePreset("h200");
  in.workload = OneImage448();
  in.training = Lora();
  in.skip_limits = true;
  absl::StatusOr<PlanOutcome> one = MakePlan(in);
  in.workload.images_per_sample = 2;
  absl::StatusOr<PlanOutcome> two = MakePlan(in);
  ASSERT_TRUE(one.ok()) << one.status();
  ASSERT_TRUE(two.ok()) << two.status();
  EXPECT_EQ(two->trace_used.embedding.saved_bytes - one->trace_used.embedding.saved_bytes,
            kPixelBytes);
  EXPECT_GT(two->trace_used.embedding.forward_transient_bytes,
            one->trace_used.embedding.forward_transient_bytes);
  in.workload.images_per_sample = 0;
  in.workload.image_height = in.workload.image_width = 0;
  absl::StatusOr<PlanOutcome> text = MakePlan(in);
  ASSERT_FALSE(text.ok());
  EXPECT_NE(text.status().message().find("workload.images_per_sample is required"),
            std::string::npos)
      << text.status();
}

// The limits follow the images: the largest micro-batch brings its samples' images (2.03 GiB of
// saved activations each when the tower trains), and a plan at that micro-batch fits while one
// more sample does not.
TEST(VisionTraceTest, LargestMicroBatchCountsItsImages) {
  PlanInputs in;
  in.arch = Qwen25Vl7b();
  in.hardware = *FindHardwarePreset("h200");
  in.workload = OneImage448();
  absl::StatusOr<PlanOutcome> one = MakePlan(in);
  ASSERT_TRUE(one.ok()) << one.status();
  ASSERT_TRUE(one->fits) << one->reason;
  const int64_t max_batch = one->max_micro_batch;
  ASSERT_GT(max_batch, 1);
  in.skip_limits = true;
  in.workload.micro_batch = max_batch;
  absl::StatusOr<PlanOutcome> at = MakePlan(in);
  ASSERT_TRUE(at.ok()) << at.status();
  EXPECT_TRUE(at->fits) << at->reason;
  in.workload.micro_batch = max_batch + 1;
  absl::StatusOr<PlanOutcome> above = MakePlan(in);
  ASSERT_TRUE(above.ok()) << above.status();
  EXPECT_FALSE(above->fits) << "micro-batch " << max_batch + 1;
  // The longest sequence keeps one image per sample (the probe counts at least that many).
  in.workload.micro_batch = 1;
  in.workload.seq_len = one->max_seq_len;
  absl::StatusOr<PlanOutcome> longest = MakePlan(in);
  ASSERT_TRUE(longest.ok()) << longest.status();
  EXPECT_TRUE(longest->fits) << longest->reason;
}

}  // namespace
}  // namespace memplan
