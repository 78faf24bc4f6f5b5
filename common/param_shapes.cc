#include "common/param_shapes.h"

#include "absl/strings/str_cat.h"
#include "common/vision_kind.h"

namespace memplan {

int64_t ParamShape::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string MoeRouterName(const ModelSpec& m, int64_t layer) {
  return absl::StrCat("model.layers.", layer,
                      m.family == "mixtral" ? ".block_sparse_moe.gate.weight" : ".mlp.gate.weight");
}

std::string MoeExpertName(const ModelSpec& m, int64_t layer, int64_t expert, MoeProjection which) {
  // Mixtral's checkpoints call the SwiGLU's gate w1, its down projection w2 and its up one w3.
  const bool mixtral = m.family == "mixtral";
  const char* proj = which == MoeProjection::kGate ? (mixtral ? "w1" : "gate_proj")
                     : which == MoeProjection::kUp ? (mixtral ? "w3" : "up_proj")
                                                   : (mixtral ? "w2" : "down_proj");
  return absl::StrCat("model.layers.", layer, mixtral ? ".block_sparse_moe" : ".mlp", ".experts.",
                      expert, ".", proj, ".weight");
}

std::vector<ParamShape> VisionParamShapes(const ModelSpec& m) {
  std::vector<ParamShape> out;
  if (!m.IsVisionLanguage()) return out;
  const VisionSpec& v = m.vision;
  const int64_t h = v.hidden_size;
  const int64_t ffn = v.intermediate_size;
  const int64_t merged = h * v.spatial_merge_size * v.spatial_merge_size;
  out.push_back({"visual.patch_embed.proj.weight",
                 {h, v.in_channels, v.temporal_patch_size, v.patch_size, v.patch_size},
                 0});
  for (int64_t b = 0; b < v.depth; ++b) {
    const std::string p = absl::StrCat("visual.blocks.", b, ".");
    for (const char* norm : {"norm1", "norm2"}) {
      out.push_back({absl::StrCat(p, norm, ".weight"), {h}, 0});
      if (VisionLayerNorm(m)) out.push_back({absl::StrCat(p, norm, ".bias"), {h}, 0});
    }
    out.push_back({p + "attn.qkv.weight", {3 * h, h}, 0});
    out.push_back({p + "attn.qkv.bias", {3 * h}, 0});
    out.push_back({p + "attn.proj.weight", {h, h}, 0});
    out.push_back({p + "attn.proj.bias", {h}, 0});
    if (VisionGatedMlp(m)) {
      out.push_back({p + "mlp.gate_proj.weight", {ffn, h}, 0});
      out.push_back({p + "mlp.gate_proj.bias", {ffn}, 0});
    }
    const char* up = VisionGatedMlp(m) ? "mlp.up_proj." : "mlp.fc1.";
    const char* down = VisionGatedMlp(m) ? "mlp.down_proj." : "mlp.fc2.";
    out.push_back({absl::StrCat(p, up, "weight"), {ffn, h}, 0});
    out.push_back({absl::StrCat(p, up, "bias"), {ffn}, 0});
    out.push_back({absl::StrCat(p, down, "weight"), {h, ffn}, 0});
    out.push_back({absl::StrCat(p, down, "bias"), {h}, 0});
  }
  out.push_back({"visual.merger.ln_q.weight", {h}, 0});
  if (VisionLayerNorm(m)) out.push_back({"visual.merger.ln_q.bias", {h}, 0});
  out.push_back({"visual.merger.mlp.0.weight", {merged, merged}, 0});
  out.push_back({"visual.merger.mlp.0.bias", {merged}, 0});
  out.push_back({"visual.merger.mlp.2.weight", {v.out_hidden_size, merged}, 0});
  out.push_back({"visual.merger.mlp.2.bias", {v.out_hidden_size}, 0});
  return out;
}

// See [Parameter order] in the header.
std::vector<ParamShape> HfParamShapes(const ModelSpec& m) {
  const int64_t h = m.hidden_size;
  const int64_t d = m.HeadDim();
  const int64_t q = m.num_heads * d;
  const int64_t kv = m.num_kv_heads * d;
  const int64_t ffn = m.intermediate_size;
  const int head_group = static_cast<int>(m.num_layers) + 1;
  std::vector<ParamShape> out;
  out.push_back({"model.embed_tokens.weight", {m.vocab_size, h}, 0});
  for (ParamShape& p : VisionParamShapes(m)) out.push_back(std::move(p));
  for (int64_t i = 0; i < m.num_layers; ++i) {
    const std::string p = absl::StrCat("model.layers.", i, ".");
    const int g = static_cast<int>(i) + 1;
    out.push_back({p + "self_attn.q_proj.weight", {q, h}, g});
    if (m.qkv_bias) out.push_back({p + "self_attn.q_proj.bias", {q}, g});
    out.push_back({p + "self_attn.k_proj.weight", {kv, h}, g});
    if (m.qkv_bias) out.push_back({p + "self_attn.k_proj.bias", {kv}, g});
    out.push_back({p + "self_attn.v_proj.weight", {kv, h}, g});
    if (m.qkv_bias) out.push_back({p + "self_attn.v_proj.bias", {kv}, g});
    out.push_back({p + "self_attn.o_proj.weight", {h, q}, g});
    if (m.qk_norm) {
      out.push_back({p + "self_attn.q_norm.weight", {d}, g});
      out.push_back({p + "self_attn.k_norm.weight", {d}, g});
    }
    if (m.IsMoeLayer(i)) {
      const int64_t e_ffn = m.moe_intermediate_size;
      out.push_back({MoeRouterName(m, i), {m.num_experts, h}, g});
      for (int64_t e = 0; e < m.num_experts; ++e) {
        out.push_back({MoeExpertName(m, i, e, MoeProjection::kGate), {e_ffn, h}, g});
        out.push_back({MoeExpertName(m, i, e, MoeProjection::kUp), {e_ffn, h}, g});
        out.push_back({MoeExpertName(m, i, e, MoeProjection::kDown), {h, e_ffn}, g});
      }
    } else {
      out.push_back({p + "mlp.gate_proj.weight", {ffn, h}, g});
      out.push_back({p + "mlp.up_proj.weight", {ffn, h}, g});
      out.push_back({p + "mlp.down_proj.weight", {h, ffn}, g});
    }
    out.push_back({p + "input_layernorm.weight", {h}, g});
    out.push_back({p + "post_attention_layernorm.weight", {h}, g});
    if (m.IsGemma()) {
      out.push_back({p + "pre_feedforward_layernorm.weight", {h}, g});
      out.push_back({p + "post_feedforward_layernorm.weight", {h}, g});
    }
  }
  out.push_back({"model.norm.weight", {h}, head_group});
  if (!m.tie_word_embeddings) out.push_back({"lm_head.weight", {m.vocab_size, h}, head_group});
  return out;
}

std::vector<LayoutParam> LayoutParamsFor(const ModelSpec& model, int64_t dtype_bytes) {
  std::vector<LayoutParam> params;
  for (const ParamShape& p : HfParamShapes(model)) {
    params.push_back({p.name, p.numel(), dtype_bytes, p.group});
  }
  return params;
}

}  // namespace memplan
