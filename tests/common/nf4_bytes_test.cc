#include "common/nf4_bytes.h"

#include <gtest/gtest.h>

#include <algorithm>

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

TEST(Nf4BytesTest, LayoutReplacesEachProjectionByItsParts) {
  const ModelSpec m = *FindModelPreset("qwen2.5-0.5b");  // q/k/v biases, tied head
  const std::vector<LayoutParam> base = LayoutParamsFor(m, 2);
  const std::vector<LayoutParam> q = QloraBaseLayoutParams(m, 2);
  // 7 projections per block become 3 parts each.
  ASSERT_EQ(q.size(), base.size() + m.num_layers * 7 * 2);
  int64_t block_bytes = 0;
  for (const LayoutParam& p : q) {
    if (p.group == 1) block_bytes += p.numel * p.dtype_bytes;
  }
  EXPECT_EQ(block_bytes, QloraBlockBaseBytes(m, 2));
  // In place, in [Parameter order]: q_proj's parts, then its bias.
  for (size_t i = 0; i + 3 < q.size(); ++i) {
    if (q[i].name != "model.layers.0.self_attn.q_proj.weight.nf4_data") continue;
    const int64_t n = 896 * 896;
    EXPECT_EQ(q[i].numel, n / 2);
    EXPECT_EQ(q[i].dtype_bytes, 1);
    EXPECT_EQ(q[i + 1].name, "model.layers.0.self_attn.q_proj.weight.nf4_absmax_code");
    EXPECT_EQ(q[i + 1].numel, n / 64);
    EXPECT_EQ(q[i + 2].name, "model.layers.0.self_attn.q_proj.weight.nf4_absmax_scale");
    EXPECT_EQ(q[i + 2].dtype_bytes, 4);
    EXPECT_EQ(q[i + 2].numel, (n / 64 + 255) / 256);
    EXPECT_EQ(q[i + 3].name, "model.layers.0.self_attn.q_proj.bias");
  }
  // Everything that is not a projection weight stays as it was.
  size_t kept = 0;
  for (const LayoutParam& p : base) {
    if (QloraQuantizes(p.name)) continue;
    const bool found = std::any_of(q.begin(), q.end(), [&p](const LayoutParam& x) {
      return x.name == p.name && x.numel == p.numel && x.dtype_bytes == 2 && x.group == p.group;
    });
    EXPECT_TRUE(found) << p.name;
    ++kept;
  }
  EXPECT_EQ(kept + m.num_layers * 7, base.size());
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
