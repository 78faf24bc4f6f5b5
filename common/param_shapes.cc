#include "common/param_shapes.h"

#include "absl/strings/str_cat.h"

namespace memplan {

std::vector<ParamShape> HfParamShapes(const ModelSpec& m) {
  const int64_t h = m.hidden_size;
  const int64_t d = m.HeadDim();
  const int64_t q = m.num_heads * d;
  const int64_t kv = m.num_kv_heads * d;
  const int64_t ffn = m.intermediate_size;
  std::vector<ParamShape> out;
  out.push_back({"model.embed_tokens.weight", {m.vocab_size, h}});
  for (int64_t i = 0; i < m.num_layers; ++i) {
    const std::string p = absl::StrCat("model.layers.", i, ".");
    out.push_back({p + "input_layernorm.weight", {h}});
    out.push_back({p + "self_attn.q_proj.weight", {q, h}});
    if (m.qkv_bias) out.push_back({p + "self_attn.q_proj.bias", {q}});
    out.push_back({p + "self_attn.k_proj.weight", {kv, h}});
    if (m.qkv_bias) out.push_back({p + "self_attn.k_proj.bias", {kv}});
    out.push_back({p + "self_attn.v_proj.weight", {kv, h}});
    if (m.qkv_bias) out.push_back({p + "self_attn.v_proj.bias", {kv}});
    out.push_back({p + "self_attn.o_proj.weight", {h, q}});
    if (m.qk_norm) {
      out.push_back({p + "self_attn.q_norm.weight", {d}});
      out.push_back({p + "self_attn.k_norm.weight", {d}});
    }
    out.push_back({p + "post_attention_layernorm.weight", {h}});
    out.push_back({p + "mlp.gate_proj.weight", {ffn, h}});
    out.push_back({p + "mlp.up_proj.weight", {ffn, h}});
    out.push_back({p + "mlp.down_proj.weight", {h, ffn}});
  }
  out.push_back({"model.norm.weight", {h}});
  if (!m.tie_word_embeddings) out.push_back({"lm_head.weight", {m.vocab_size, h}});
  return out;
}

}  // namespace memplan
