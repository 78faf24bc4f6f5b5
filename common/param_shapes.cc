#include "common/param_shapes.h"

#include "absl/strings/str_cat.h"

namespace memplan {

int64_t ParamShape::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
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
    out.push_back({p + "mlp.gate_proj.weight", {ffn, h}, g});
    out.push_back({p + "mlp.up_proj.weight", {ffn, h}, g});
    out.push_back({p + "mlp.down_proj.weight", {h, ffn}, g});
    out.push_back({p + "input_layernorm.weight", {h}, g});
    out.push_back({p + "post_attention_layernorm.weight", {h}, g});
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
