// LlamaModel::BlockParams: one transformer block's parameters (private to agent/model: the model
// and its OSFT split, llama_model_osft.cc, read them).
#pragma once

#include <array>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "agent/model/llama_model.h"
#include "agent/model/osft.h"
#include "common/nf4_bytes.h"

namespace memplan {

struct LlamaModel::BlockParams {
  int index = 0;
  torch::Tensor q_proj, q_bias, k_proj, k_bias, v_proj, v_bias, o_proj;
  torch::Tensor q_norm, k_norm;  // Qwen3 only
  torch::Tensor gate_proj, up_proj, down_proj;
  torch::Tensor input_layernorm, post_attention_layernorm;
  torch::Tensor pre_feedforward_layernorm, post_feedforward_layernorm;  // Gemma 2 only
  // A sparse layer's router and experts (ModelSpec::IsMoeLayer); gate/up/down_proj are then
  // undefined.
  std::unique_ptr<MoeParams> moe;
  // [LoRA] adapters, indexed like kLoraModuleNames; undefined for projections not targeted.
  std::array<torch::Tensor, kLoraModuleNames.size()> lora_a, lora_b;
  // [QLoRA] each projection's weight in NF4 (indexed like kLoraModuleNames) when the base is
  // quantized; the projection's tensor above is then undefined. The three parts are parameters
  // (frozen, chunk-managed); the offset is a number the model keeps.
  std::array<std::optional<quant::Nf4Tensor>, kLoraModuleNames.size()> nf4;
  // [OSFT] each split projection's factors (its weight above is then undefined).
  std::array<std::unique_ptr<OsftFactors>, kLoraModuleNames.size()> osft;

  // Hugging Face named_parameters() order; a quantized weight is listed as its three NF4 parts
  // ("<weight name>.nf4_data", ".nf4_absmax_code", ".nf4_absmax_scale"), in its place.
  std::vector<NamedParam> Named() const {
    const std::string p = absl::StrCat("model.layers.", index, ".");
    std::vector<NamedParam> out;
    auto add = [&](const std::string& name, const torch::Tensor& t) {
      if (t.defined()) out.push_back({p + name, t});
    };
    auto weight = [&](size_t module, const torch::Tensor& t) {
      const std::string name = ModulePath(module) + ".weight";
      if (osft[module]) {
        for (const NamedParam& f : OsftFrozenNamed(ModulePath(module), *osft[module])) {
          add(f.name, f.param);
        }
        return;
      }
      if (!nf4[module].has_value()) return add(name, t);
      add(name + std::string(kNf4DataSuffix), nf4[module]->data);
      add(name + std::string(kNf4AbsmaxCodeSuffix), nf4[module]->absmax_code);
      add(name + std::string(kNf4AbsmaxScaleSuffix), nf4[module]->absmax_scale);
    };
    weight(0, q_proj);
    add("self_attn.q_proj.bias", q_bias);
    weight(1, k_proj);
    add("self_attn.k_proj.bias", k_bias);
    weight(2, v_proj);
    add("self_attn.v_proj.bias", v_bias);
    weight(3, o_proj);
    add("self_attn.q_norm.weight", q_norm);
    add("self_attn.k_norm.weight", k_norm);
    weight(4, gate_proj);
    weight(5, up_proj);
    weight(6, down_proj);
    if (moe) {
      for (NamedParam& m : moe->Named()) out.push_back(std::move(m));
    }
    add("input_layernorm.weight", input_layernorm);
    add("post_attention_layernorm.weight", post_attention_layernorm);
    add("pre_feedforward_layernorm.weight", pre_feedforward_layernorm);
    add("post_feedforward_layernorm.weight", post_feedforward_layernorm);
    return out;
  }

  // Projection `module` (kLoraModuleNames index) of `in` with weight `w` and bias `b` (may be
  // undefined), with its adapter when it has one: base(x) + B(A(dropout(x))) * scaling
  // ([LoRA] in llama_model.cc). Defined in llama_model.cc.
  torch::Tensor Project(const torch::Tensor& in, size_t module, const torch::Tensor& w,
                        const torch::Tensor& b, double dropout, double scaling) const;

  // The projection tensors' slots, kLoraModuleNames order.
  std::array<torch::Tensor*, kLoraModuleNames.size()> Projections() {
    return {&q_proj, &k_proj, &v_proj, &o_proj, &gate_proj, &up_proj, &down_proj};
  }

  static std::string ModulePath(size_t module) {
    return absl::StrCat(module < 4 ? "self_attn." : "mlp.", kLoraModuleNames[module]);
  }

  // PEFT's named_parameters() order (module by module, A then B), without its wrapper prefix.
  std::vector<NamedParam> NamedAdapters() const {
    const std::string p = absl::StrCat("model.layers.", index, ".");
    std::vector<NamedParam> out;
    for (size_t m = 0; m < kLoraModuleNames.size(); ++m) {
      if (!lora_a[m].defined()) continue;
      out.push_back({absl::StrCat(p, ModulePath(m), ".lora_A.weight"), lora_a[m]});
      out.push_back({absl::StrCat(p, ModulePath(m), ".lora_B.weight"), lora_b[m]});
    }
    for (size_t m = 0; m < kLoraModuleNames.size(); ++m) {
      if (osft[m]) {
        for (NamedParam& f : OsftTrainableNamed(p + ModulePath(m), *osft[m])) out.push_back(f);
      }
    }
    return out;
  }
};

}  // namespace memplan
