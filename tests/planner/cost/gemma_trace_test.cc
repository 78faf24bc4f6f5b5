// The analytic trace of Gemma 2 and 3 ([Gemma 2 block price] in planner/cost/analytic_trace.cc):
// four norms per block (Gemma 3: and q/k norms), the eager soft-capped attention in tiles
// ([Soft-capped attention tiles], common/softcap_attention.h) on local and global layers, the
// capped logits, and plans for the gemma-2-9b and gemma-3 presets.
#include <string>

#include "common/param_shapes.h"
#include "common/presets.h"
#include "common/softcap_attention.h"
#include "gtest/gtest.h"
#include "planner/core/plan_engine.h"
#include "planner/cost/analytic_trace.h"

namespace memplan {
namespace {

Workload Tokens(int64_t batch, int64_t seq) {
  Workload w;
  w.micro_batch = batch;
  w.seq_len = seq;
  return w;
}

absl::StatusOr<Trace> Synth(const ModelSpec& m, const Workload& w, DType dtype,
                            const TrainingMethod& t = TrainingMethod{}) {
  return SynthesizeTrace(m, w, dtype, t, *FindHardwarePreset("h200"));
}

// Parameters: every block's bytes are its HfParamShapes (four norms), the head is the final norm
// alone (tied), and the count is the published model's 9.24 B.
// The trace's parameters of preset `name` (bf16) against its HfParamShapes; returns the count.
int64_t TraceParamsAreTheCheckpoints(const std::string& name) {
  const ModelSpec m = *FindModelPreset(name);
  const absl::StatusOr<Trace> t = Synth(m, Tokens(1, 4096), DType::kBFloat16);
  EXPECT_TRUE(t.ok()) << t.status();
  if (!t.ok()) return 0;
  int64_t block0 = 0, total = 0;
  for (const ParamShape& p : HfParamShapes(m)) {
    total += p.numel();
    if (p.group == 1) block0 += p.numel();
  }
  EXPECT_EQ(t->blocks[0].param_bytes, 2 * block0) << name;
  EXPECT_EQ(t->head.param_bytes, 2 * m.hidden_size) << name;  // tied: the final norm alone
  EXPECT_EQ(t->total_param_count, total) << name;
  return total;
}

TEST(GemmaTraceTest, ParametersAreTheCheckpointsTensors) {
  EXPECT_NEAR(static_cast<double>(TraceParamsAreTheCheckpoints("gemma-2-9b")) / 1e9, 9.24, 0.01);
}

// Every layer's transients cover its attention tiles; a sliding layer's tiles (keys within the
// window) are smaller than a full layer's once the sequence is longer than the window.
TEST(GemmaTraceTest, AttentionTilesAreCharged) {
  const ModelSpec m = *FindModelPreset("gemma-2-9b");
  const Workload w = Tokens(1, 8192);
  const absl::StatusOr<Trace> t = Synth(m, w, DType::kBFloat16);
  ASSERT_TRUE(t.ok()) << t.status();
  for (int64_t l = 0; l < 2; ++l) {
    const SoftcapAttentionBytes tiles = SoftcapAttentionMemory(m, m.LayerWindow(l), 1, 8192, 2);
    EXPECT_GE(t->blocks[l].backward_transient_bytes, tiles.backward_transient) << l;
    EXPECT_GE(t->blocks[l].forward_transient_bytes, tiles.forward_transient) << l;
  }
  // The sliding layer reads fewer keys: less time.
  EXPECT_LT(t->blocks[0].forward_seconds, t->blocks[1].forward_seconds);
  // No tensor grows with seq²: a tile's fp32 scores stay near the budget.
  EXPECT_LE(SoftcapAttentionMemory(m, 0, 1, 8192, 2).tile_scores * 4, 2 * kSoftcapTileScoreBytes);
}

// Saved bytes per token of a full fine-tune, by hand from the block (bf16, d = 2, H = 3584,
// q = 16 * 256, kv = 8 * 256, I = 14336): input 2H; input norm fp32 copy 4H + fp32 normalised
// 4H + output 2H + 4; q, k, v 2 (q + 2 kv); attention output 2q; post-attention norm 4H + 4H + 4;
// pre-MLP norm 4H + 4H + 2H + 4; MLP 3 * 2I (gate, up and their product: [Fused gate] recomputes
// the GELU); post-MLP norm 4H + 4H + 4.
TEST(GemmaTraceTest, SavedBytesByHand) {
  const ModelSpec m = *FindModelPreset("gemma-2-9b");
  const int64_t h = 3584, q = 16 * 256, kv = 8 * 256, inter = 14336;
  const int64_t per_token = 2 * h + (10 * h + 4) + 2 * (q + 2 * kv) + 2 * q + (8 * h + 4) +
                            (10 * h + 4) + 6 * inter + (8 * h + 4);
  const absl::StatusOr<Trace> t = Synth(m, Tokens(1, 1024), DType::kBFloat16);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->blocks[1].saved_bytes, 1024 * per_token);
}

// The final soft cap keeps its tanh output beside the logits (plain head, short sequence).
TEST(GemmaTraceTest, FinalSoftCapKeepsItsOutput) {
  ModelSpec m = *FindModelPreset("gemma-2-2b");
  const Workload w = Tokens(1, 128);
  const absl::StatusOr<Trace> capped = Synth(m, w, DType::kBFloat16);
  m.final_logit_softcapping = 0;
  const absl::StatusOr<Trace> plain = Synth(m, w, DType::kBFloat16);
  ASSERT_TRUE(capped.ok() && plain.ok());
  EXPECT_EQ(capped->head.saved_bytes - plain->head.saved_bytes, 128 * m.vocab_size * 2);
}

// gemma-2-9b LoRA plans on an H200 and on a 24 GiB card.
TEST(GemmaTraceTest, PresetPlans) {
  PlanInputs in;
  in.arch = *FindModelPreset("gemma-2-9b");
  in.hardware = *FindHardwarePreset("h200");
  in.workload = Tokens(1, 4096);
  in.skip_limits = true;
  absl::StatusOr<PlanOutcome> full = MakePlan(in);
  ASSERT_TRUE(full.ok()) << full.status();
  EXPECT_TRUE(full->fits) << full->reason;
  in.training.kind = TrainingKind::kLora;
  in.training.lora_rank = 16;
  in.training.lora_target_modules = {"q_proj",    "k_proj",  "v_proj",   "o_proj",
                                     "gate_proj", "up_proj", "down_proj"};
  absl::StatusOr<PlanOutcome> lora = MakePlan(in);
  ASSERT_TRUE(lora.ok()) << lora.status();
  EXPECT_TRUE(lora->fits) << lora->reason;
}

// gemma-3-1b: the checkpoint's tensors (q/k norms included), 999 885 952 parameters as published.
TEST(GemmaTraceTest, Gemma3ParametersAreTheCheckpointsTensors) {
  EXPECT_EQ(TraceParamsAreTheCheckpoints("gemma-3-1b"), 999885952);
}

// Gemma 2's per-token bytes plus the q and k norms (bf16, H = 1152, q = 4 * 256, kv = 256,
// I = 6912): each keeps its fp32 input copy and fp32 normalised value, and one fp32 rstd per head.
TEST(GemmaTraceTest, Gemma3SavedBytesByHand) {
  const ModelSpec m = *FindModelPreset("gemma-3-1b");
  const int64_t h = 1152, q = 4 * 256, kv = 256, inter = 6912;
  const int64_t gemma2 = 2 * h + (10 * h + 4) + 2 * (q + 2 * kv) + 2 * q + (8 * h + 4) +
                         (10 * h + 4) + 6 * inter + (8 * h + 4);
  const int64_t qk_norms = 8 * q + 8 * kv + 4 * (4 + 1);
  for (int64_t l : {0, 5}) {  // a local and a global layer keep the same
    const absl::StatusOr<Trace> t = Synth(m, Tokens(1, 1024), DType::kBFloat16);
    ASSERT_TRUE(t.ok()) << t.status();
    EXPECT_EQ(t->blocks[l].saved_bytes, 1024 * (gemma2 + qk_norms)) << l;
  }
}

// 5 local : 1 global: the local layers' tiles read at most the window's keys.
TEST(GemmaTraceTest, Gemma3LocalLayersReadTheWindow) {
  const ModelSpec m = *FindModelPreset("gemma-3-4b");
  const absl::StatusOr<Trace> t = Synth(m, Tokens(1, 8192), DType::kBFloat16);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(m.LayerWindow(4), 1024);
  EXPECT_EQ(m.LayerWindow(5), 0);
  for (int64_t l : {4, 5}) {
    const SoftcapAttentionBytes tiles = SoftcapAttentionMemory(m, m.LayerWindow(l), 1, 8192, 2);
    EXPECT_GE(t->blocks[l].backward_transient_bytes, tiles.backward_transient) << l;
  }
  EXPECT_LT(t->blocks[4].forward_seconds, t->blocks[5].forward_seconds);
}

// Every gemma-3 preset plans on an H200 at 4096 tokens: full fine-tuning up to 12b, LoRA for 27b
// (whose full fine-tune needs about 500 GiB of host memory for its offloaded states).
TEST(GemmaTraceTest, Gemma3PresetPlans) {
  for (const char* name : {"gemma-3-1b", "gemma-3-4b", "gemma-3-12b", "gemma-3-27b"}) {
    PlanInputs in;
    in.arch = *FindModelPreset(name);
    in.hardware = *FindHardwarePreset("h200");
    in.workload = Tokens(1, 4096);
    in.skip_limits = true;
    if (std::string(name) == "gemma-3-27b") {
      in.training.kind = TrainingKind::kLora;
      in.training.lora_rank = 16;
      in.training.lora_target_modules = {"q_proj", "k_proj", "v_proj", "o_proj"};
    }
    absl::StatusOr<PlanOutcome> plan = MakePlan(in);
    ASSERT_TRUE(plan.ok()) << name << ": " << plan.status();
    EXPECT_TRUE(plan->fits) << name << ": " << plan->reason;
  }
}

}  // namespace
}  // namespace memplan
