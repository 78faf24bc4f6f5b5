#include "common/nf4_bytes.h"

#include <gtest/gtest.h>

#include "common/param_shapes.h"
#include "common/presets.h"

namespace memplan {
namespace {

TEST(Nf4BytesTest, PartsOfOneTensor) {
  // 4096 x 14336 (Llama-3.1-8B's MLP): 29.36 M codes in 14.68 MB, 917 504 absmax codes, 3 584
  // fp32 scales.
  const Nf4PartBytes p = Nf4Parts(int64_t{4096} * 14336);
  EXPECT_EQ(p.data_bytes, 29360128);
  EXPECT_EQ(p.absmax_code_bytes, 917504);
  EXPECT_EQ(p.absmax_scale_bytes, 3584 * 4);
  // Partial blocks round up; an odd count needs half a byte more.
  EXPECT_EQ(Nf4Parts(65).data_bytes, 33);
  EXPECT_EQ(Nf4Parts(65).absmax_code_bytes, 2);
  EXPECT_EQ(Nf4Parts(65).absmax_scale_bytes, 4);
  EXPECT_EQ(Nf4Parts(64 * 256 + 1).absmax_scale_bytes, 8);
  // In a chunk each part starts aligned.
  EXPECT_EQ(Nf4ChunkSpanBytes(65, 256), 256 + 256 + 4);
}

TEST(Nf4BytesTest, QloraQuantizesTheBlockProjectionsOnly) {
  EXPECT_TRUE(QloraQuantizes("model.layers.0.self_attn.q_proj.weight"));
  EXPECT_TRUE(QloraQuantizes("model.layers.31.mlp.down_proj.weight"));
  EXPECT_FALSE(QloraQuantizes("model.layers.0.self_attn.q_proj.bias"));  // qwen2 biases
  EXPECT_FALSE(QloraQuantizes("model.layers.0.input_layernorm.weight"));
  EXPECT_FALSE(QloraQuantizes("model.layers.0.self_attn.q_norm.weight"));
  EXPECT_FALSE(QloraQuantizes("model.embed_tokens.weight"));
  EXPECT_FALSE(QloraQuantizes("lm_head.weight"));
}

TEST(Nf4BytesTest, LayoutReplacesEachProjectionByItsPartsAndAdapters) {
  const ModelSpec m = *FindModelPreset("qwen2.5-0.5b");  // q/k/v biases, tied head
  TrainingMethod t;
  t.kind = TrainingKind::kQlora;
  t.lora_rank = 8;
  t.lora_target_modules = {"q_proj", "down_proj"};
  const std::vector<LayoutParam> base = LayoutParamsFor(m, 2);
  const std::vector<LayoutParam> q = QloraLayoutParams(m, 2, t);
  // 7 projections per block become 3 parts each, 2 adapted ones add 2 matrices each.
  EXPECT_EQ(q.size(), base.size() + m.num_layers * (7 * 2 + 2 * 2));
  int64_t base_bytes = 0, adapter_bytes = 0;
  for (const LayoutParam& p : q) {
    if (p.group != 1) continue;
    (IsLoraAdapterParam(p.name) ? adapter_bytes : base_bytes) += p.numel * p.dtype_bytes;
  }
  EXPECT_EQ(base_bytes, QloraBlockBaseBytes(m, 2));
  const int64_t h = 896, hq = 896, inter = 4864;
  EXPECT_EQ(adapter_bytes, 2 * 8 * ((h + hq) + (inter + h)));
  // PEFT's order: the adapter right after its projection.
  for (size_t i = 0; i + 1 < q.size(); ++i) {
    if (q[i].name == "model.layers.0.self_attn.q_proj.weight.nf4_absmax_scale") {
      EXPECT_EQ(q[i + 1].name, "model.layers.0.self_attn.q_proj.lora_A.weight");
      EXPECT_EQ(q[i + 1].numel, 8 * h);
      EXPECT_EQ(q[i + 2].name, "model.layers.0.self_attn.q_proj.lora_B.weight");
      EXPECT_EQ(q[i + 2].numel, hq * 8);
      EXPECT_EQ(q[i + 3].name, "model.layers.0.self_attn.q_proj.bias");
    }
  }
  // Without targets: the frozen base alone.
  EXPECT_EQ(QloraBaseLayoutParams(m, 2).size(), base.size() + m.num_layers * 7 * 2);
}

TEST(Nf4BytesTest, DequantTransientIsTheLargestProjection) {
  const DequantTransient t = QloraDequantTransient(*FindModelPreset("qwen2.5-32b"), 2);
  EXPECT_EQ(t.projection, "mlp.gate_proj");
  EXPECT_EQ(t.bytes, int64_t{27648} * 5120 * 2);
  // Attention wider than the MLP would name q_proj.
  ModelSpec wide = *FindModelPreset("llama-3.2-1b");
  wide.intermediate_size = 256;
  EXPECT_EQ(QloraDequantTransient(wide, 4).projection, "self_attn.q_proj");
  EXPECT_EQ(QloraDequantTransient(wide, 4).bytes, int64_t{2048} * 2048 * 4);
}

}  // namespace
}  // namespace memplan
