// LlamaModel's Gemma parts ([Gemma 2], ModelSpec's gemma fields in common/types.h): the block,
// the scaled embedding, the (1 + weight) RMSNorm, the logits' soft cap; Gemma 3 adds q/k norms and
// its sliding layers' RoPE. The math follows transformers' Gemma2ForCausalLM and
// Gemma3ForCausalLM operation by operation (order and precision), so fp32 results
// agree to rounding.
#include <cmath>

#include "agent/model/attention.h"
#include "agent/model/block_params.h"
#include "agent/model/layers.h"
#include "agent/model/rope.h"
#include "agent/model/llama_model.h"

namespace memplan {
namespace {

// Gemma2RMSNorm: normalised in fp32, multiplied by (1 + weight) in fp32, cast back afterwards
// (Llama casts before the weight).
torch::Tensor GemmaRmsNorm(const torch::Tensor& x, const torch::Tensor& weight, double eps) {
  const torch::Tensor x32 = x.to(torch::kFloat32);
  const torch::Tensor normed = x32 * torch::rsqrt(x32.pow(2).mean(-1, /*keepdim=*/true) + eps);
  return (normed * (1.0 + weight.to(torch::kFloat32))).to(x.scalar_type());
}

}  // namespace

torch::Tensor LlamaModel::GemmaEmbed(const torch::Tensor& input_ids,
                                     const torch::Tensor& weight) const {
  const ModelSpec& s = options_.spec;
  // padding_idx: the padding row gets no gradient from the lookup, as nn.Embedding's.
  const torch::Tensor e = at::embedding(weight, input_ids, s.embedding_padding_idx);
  // sqrt(hidden_size) as an fp32 scalar rounded to the weight's dtype (55.4256 becomes 55.5 in
  // bf16 for 3072), as Gemma2TextScaledWordEmbedding multiplies.
  const torch::Tensor scale =
      torch::scalar_tensor(std::pow(static_cast<double>(s.hidden_size), 0.5),
                           torch::TensorOptions().dtype(torch::kFloat32))
          .to(weight.scalar_type());
  return e * scale;
}

torch::Tensor LlamaModel::FinalNorm(const torch::Tensor& hidden) const {
  if (options_.spec.IsGemma()) return GemmaRmsNorm(hidden, norm_, options_.spec.rms_norm_eps);
  return RmsNorm(hidden, norm_, options_.spec.rms_norm_eps);
}

torch::Tensor LlamaModel::CapLogits(const torch::Tensor& logits) const {
  const double cap = options_.spec.final_logit_softcapping;
  if (cap <= 0) return logits;
  return torch::tanh(logits / cap) * cap;
}

torch::Tensor LlamaModel::GemmaBlock(const BlockParams& p, const torch::Tensor& hidden,
                                     const Rope& rope, double dropout, double scaling) const {
  const ModelSpec& s = options_.spec;
  const int64_t batch = hidden.size(0);
  const int64_t seq = hidden.size(1);
  const int64_t d = s.HeadDim();
  const double eps = s.rms_norm_eps;
  auto proj = [&p, dropout, scaling](const torch::Tensor& in, size_t module,
                                     const torch::Tensor& w) {
    return p.Project(in, module, w, torch::Tensor(), dropout, scaling);
  };

  const torch::Tensor x = GemmaRmsNorm(hidden, p.input_layernorm, eps);
  torch::Tensor q = proj(x, 0, p.q_proj).view({batch, seq, s.num_heads, d});
  torch::Tensor k = proj(x, 1, p.k_proj).view({batch, seq, s.num_kv_heads, d});
  const torch::Tensor v =
      proj(x, 2, p.v_proj).view({batch, seq, s.num_kv_heads, d}).transpose(1, 2);
  if (s.qk_norm) {
    // Gemma 3: every head's query and key normed before RoPE (over head_dim alone, so the
    // [B, S, heads, head_dim] layout gives the values the heads-first one does).
    q = GemmaRmsNorm(q, p.q_norm, eps);
    k = GemmaRmsNorm(k, p.k_norm, eps);
  }
  const int64_t window = s.LayerWindow(p.index);
  const bool local = window > 0 && rope.local_cos.defined();
  const torch::Tensor& cos = local ? rope.local_cos : rope.cos;
  const torch::Tensor& sin = local ? rope.local_sin : rope.sin;
  // [Fused RoPE], then the heads-first view attention takes.
  q = ApplyRope(q, cos, sin).transpose(1, 2);
  k = ApplyRope(k, cos, sin).transpose(1, 2);
  // [Soft-capped attention tiles] every layer, capped or not (common/softcap_attention.h).
  const torch::Tensor attn = SoftcapAttention(q, k, v, window, s.AttentionScale(),
                                              s.attn_logit_softcapping);
  const torch::Tensor attn_out =
      proj(attn.transpose(1, 2).reshape({batch, seq, s.num_heads * d}), 3, p.o_proj);
  const torch::Tensor h = hidden + GemmaRmsNorm(attn_out, p.post_attention_layernorm, eps);

  const torch::Tensor y = GemmaRmsNorm(h, p.pre_feedforward_layernorm, eps);
  // GeGLU (gelu, tanh approximation), sequence-tiled as the other families' MLP.
  const torch::Tensor m = GatedMlp(p, y, /*gelu_tanh=*/true, dropout, scaling);
  return h + GemmaRmsNorm(m, p.post_feedforward_layernorm, eps);
}

}  // namespace memplan
