#include "common/hf_config.h"

#include <limits.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <limits>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/hf_config_json.h"
#include "common/log.h"
#include "common/status.h"
#include "common/validate.h"
#include "nlohmann/json.hpp"

namespace memplan {
namespace {

using Json = nlohmann::json;
using hf_json::Find;
using hf_json::KeyError;
using hf_json::Nested;
using hf_json::OptionalBool;
using hf_json::OptionalInt;
using hf_json::OptionalPositiveDouble;
using hf_json::OptionalString;
using hf_json::RequiredInt;
using hf_json::RopeNumber;

// config.json files are a few KiB; anything far larger is not a model config.
constexpr int64_t kMaxConfigFileBytes = int64_t{16} << 20;
constexpr int64_t kMaxPositionEmbeddings = int64_t{1} << 31;

// Per-family values Hugging Face's config classes use when a key is absent or null.
struct FamilyDefaults {
  const char* model_type;
  const char* architecture;
  double rope_theta;
  double rms_norm_eps;
  int64_t max_position_embeddings;
  int64_t head_dim;  // 0: hidden_size / num_attention_heads
  bool qkv_bias;     // fixed by the architecture (Qwen2 always has q/k/v biases)
  bool qk_norm;      // fixed by the architecture (Qwen3 normalises q and k per head)
};

constexpr FamilyDefaults kFamilies[] = {
    {"llama", "LlamaForCausalLM", 10000.0, 1e-6, 2048, 0, false, false},
    {"qwen2", "Qwen2ForCausalLM", 10000.0, 1e-6, 32768, 0, true, false},
    {"qwen3", "Qwen3ForCausalLM", 10000.0, 1e-6, 32768, 128, false, true},
    {"mistral", "MistralForCausalLM", 10000.0, 1e-6, 4096 * 32, 0, false, false},
    {"qwen3_moe", "Qwen3MoeForCausalLM", 10000.0, 1e-6, 32768, 0, false, true},
    {"mixtral", "MixtralForCausalLM", 1000000.0, 1e-5, 4096 * 32, 0, false, false},
    // The language model of Qwen2.5-VL is Qwen2's (q/k/v biases) with the multimodal RoPE.
    {"qwen2_5_vl", "Qwen2_5_VLForConditionalGeneration", 1000000.0, 1e-5, 32768, 0, true, false},
    // Qwen2-VL's language model is the same; its tower differs (hf_config_vision.cc).
    {"qwen2_vl", "Qwen2VLForConditionalGeneration", 1000000.0, 1e-5, 32768, 0, true, false},
    // Gemma 2's block differs (four norms, GeGLU, soft caps: hf_config_gemma.cc).
    {"gemma2", "Gemma2ForCausalLM", 10000.0, 1e-6, 8192, 256, false, false},
    // Gemma 3's text decoder: Gemma 2's block with q/k norms and a RoPE per layer type.
    {"gemma3_text", "Gemma3ForCausalLM", 1000000.0, 1e-6, 131072, 256, false, true},
};

bool IsGemmaFamily(const FamilyDefaults& family) {
  const std::string type = family.model_type;
  return type == "gemma2" || type == "gemma3_text";
}

bool IsVisionLanguageFamily(const FamilyDefaults& family) {
  const std::string type = family.model_type;
  return type == "qwen2_5_vl" || type == "qwen2_vl";
}

std::string AllowedModelTypes() {
  std::string out;
  for (const FamilyDefaults& f : kFamilies)
    absl::StrAppend(&out, out.empty() ? "" : ", ", f.model_type);
  return out;
}

// model_type decides the family; "architectures", when present, must agree with it, since a
// *ForSequenceClassification checkpoint has a different head than the one we train.
absl::StatusOr<const FamilyDefaults*> ResolveFamily(const Json& root) {
  ASSIGN_OR_RETURN(std::optional<std::string> model_type, OptionalString(root, "model_type"));
  std::vector<std::string> architectures;
  if (const Json* a = Find(root, "architectures"); a != nullptr) {
    if (!a->is_array()) return KeyError("architectures", "must be an array of strings");
    for (const Json& e : *a) {
      if (!e.is_string()) return KeyError("architectures", "must be an array of strings");
      architectures.push_back(e.get<std::string>());
    }
  }
  const FamilyDefaults* family = nullptr;
  if (model_type.has_value()) {
    for (const FamilyDefaults& f : kFamilies) {
      if (*model_type == f.model_type) family = &f;
    }
    if (family == nullptr && *model_type == "gemma3") {
      // Gemma3ForConditionalGeneration: a vision tower and the text decoder under
      // "language_model."; only the decoder's own config is read.
      return KeyError("model_type",
                      "= \"gemma3\" (Gemma3ForConditionalGeneration, vision + text) is not "
                      "supported; give the text decoder's config (its \"text_config\", "
                      "model_type \"gemma3_text\", Gemma3ForCausalLM)");
    }
    if (family == nullptr) {
      return KeyError(
          "model_type",
          absl::StrCat("= \"", *model_type, "\" is not supported; allowed: ", AllowedModelTypes()));
    }
  } else {
    for (const FamilyDefaults& f : kFamilies) {
      for (const std::string& a : architectures) {
        if (a == f.architecture) family = &f;
      }
    }
    if (family == nullptr) {
      return KeyError("model_type", absl::StrCat("is required (or an \"architectures\" entry "
                                                 "naming a supported *ForCausalLM); allowed: ",
                                                 AllowedModelTypes()));
    }
  }
  if (!architectures.empty()) {
    bool found = false;
    for (const std::string& a : architectures) found = found || a == family->architecture;
    if (!found) {
      return KeyError("architectures",
                      absl::StrCat("must contain \"", family->architecture, "\" for model_type \"",
                                   family->model_type, "\""));
    }
  }
  return family;
}

// Rejects features the ModelSpec (and the agent's model) cannot represent, so a checkpoint
// never silently loads into the wrong architecture.
absl::Status CheckUnsupportedFeatures(const Json& root, const FamilyDefaults& family) {
  // Gemma 2's activation and biases are its own keys (hf_json::ParseGemma).
  if (IsGemmaFamily(family)) return absl::OkStatus();
  ASSIGN_OR_RETURN(std::optional<std::string> act, OptionalString(root, "hidden_act"));
  if (act.has_value() && *act != "silu") {
    return KeyError("hidden_act", absl::StrCat("= \"", *act, "\" is not supported; allowed: silu"));
  }
  ASSIGN_OR_RETURN(std::optional<bool> mlp_bias, OptionalBool(root, "mlp_bias"));
  if (mlp_bias.value_or(false)) return KeyError("mlp_bias", "= true is not supported");
  ASSIGN_OR_RETURN(std::optional<bool> attention_bias, OptionalBool(root, "attention_bias"));
  // Llama/Qwen3/Mistral's attention_bias adds an o_proj bias as well; Qwen2 ignores the key.
  if (attention_bias.value_or(false) && std::string(family.model_type) != "qwen2") {
    return KeyError("attention_bias", absl::StrCat("= true (q/k/v/o biases) is not supported for ",
                                                   family.model_type));
  }
  return absl::OkStatus();
}

// The RoPE types the agent computes, as Hugging Face names them.
constexpr const char* kRopeTypes[] = {"default", "linear", "dynamic", "yarn", "llama3"};

// Keys each RoPE type may carry besides rope_type/type and rope_theta (Hugging Face's validators
// accept the same sets). Anything else could change the math, so it is refused.
std::set<std::string> AllowedRopeKeys(const std::string& type, bool vision_language) {
  std::set<std::string> keys = {"rope_type", "type", "rope_theta", "partial_rotary_factor"};
  if (vision_language) keys.insert("mrope_section");
  if (type == "linear" || type == "dynamic") keys.insert("factor");
  if (type == "llama3") {
    keys.insert({"factor", "low_freq_factor", "high_freq_factor",
                 "original_max_position_embeddings"});
  }
  if (type == "yarn") {
    keys.insert({"factor", "attention_factor", "beta_fast", "beta_slow", "mscale",
                 "mscale_all_dim", "original_max_position_embeddings", "truncate"});
  }
  return keys;
}

// rope_theta and the frequency scaling, the way transformers 5.x standardises them: the RoPE
// dictionary is "rope_scaling" when set (older configs), else "rope_parameters"; its rope_theta
// wins over a top-level one; llama3/yarn take original_max_position_embeddings from the top level
// when present, else from the dictionary, else max_position_embeddings.
absl::Status ParseRope(const Json& root, const FamilyDefaults& family, ModelSpec* spec) {
  ASSIGN_OR_RETURN(std::optional<double> top_theta,
                   OptionalPositiveDouble(root, "rope_theta", 1e12));
  std::string where = "rope_scaling";
  const Json* rp = Find(root, "rope_scaling");
  if (rp == nullptr) {
    where = "rope_parameters";
    rp = Find(root, "rope_parameters");
  }
  const Json empty = Json::object();
  if (rp == nullptr) rp = &empty;
  if (!rp->is_object()) return KeyError(where, "must be an object");
  for (const auto& [key, value] : rp->items()) {
    if (value.is_object()) {
      return KeyError(absl::StrCat(where, ".", key),
                      "is a per-layer-type RoPE dictionary; only one RoPE for every layer is "
                      "supported");
    }
  }
  ASSIGN_OR_RETURN(std::optional<std::string> type, OptionalString(*rp, "rope_type"));
  if (!type.has_value()) {
    ASSIGN_OR_RETURN(type, OptionalString(*rp, "type"));
  }
  RopeScaling r;
  r.type = type.value_or("default");
  const bool vl = IsVisionLanguageFamily(family);
  // transformers reads Qwen2(.5)-VL's "mrope" as the default frequencies split by mrope_section.
  if (vl && r.type == "mrope") r.type = "default";
  if (vl && r.type != "default") {
    return KeyError(absl::StrCat(where, ".rope_type"),
                    absl::StrCat("= \"", r.type, "\" is not supported for ", family.model_type,
                                 "; allowed: default, mrope"));
  }
  bool known = false;
  for (const char* t : kRopeTypes) known = known || r.type == t;
  if (!known) {
    return KeyError(absl::StrCat(where, ".rope_type"),
                    absl::StrCat("= \"", r.type,
                                 "\" is not supported; allowed: default, linear, dynamic, yarn, "
                                 "llama3"));
  }
  const std::set<std::string> allowed = AllowedRopeKeys(r.type, vl);
  for (const auto& [key, value] : rp->items()) {
    if (allowed.count(key) == 0 && !value.is_null()) {
      return KeyError(absl::StrCat(where, ".", key),
                      absl::StrCat("is not supported for rope_type \"", r.type, "\""));
    }
  }
  for (const Json* obj : {&root, rp}) {
    ASSIGN_OR_RETURN(std::optional<double> partial,
                     OptionalPositiveDouble(*obj, "partial_rotary_factor", 1.0));
    if (partial.has_value() && *partial != 1.0) {
      return KeyError(obj == &root ? std::string("partial_rotary_factor")
                                   : absl::StrCat(where, ".partial_rotary_factor"),
                      absl::StrCat("= ", *partial, " is not supported; allowed: 1.0"));
    }
  }
  ASSIGN_OR_RETURN(std::optional<double> theta, RopeNumber(*rp, where, "rope_theta", 1e12));
  spec->rope_theta = theta.value_or(top_theta.value_or(family.rope_theta));

  ASSIGN_OR_RETURN(std::optional<double> factor, RopeNumber(*rp, where, "factor", 1e6));
  const std::string factor_key = absl::StrCat(where, ".factor");
  if (r.type == "linear" || r.type == "dynamic" || r.type == "llama3") {
    if (!factor.has_value()) return KeyError(factor_key, "is required for this rope_type");
    r.factor = *factor;
  }
  if (r.type == "llama3" || r.type == "yarn") {
    ASSIGN_OR_RETURN(std::optional<int64_t> top_orig,
                     OptionalInt(root, "original_max_position_embeddings", 1,
                                 kMaxPositionEmbeddings));
    ASSIGN_OR_RETURN(std::optional<int64_t> orig,
                     OptionalInt(*rp, "original_max_position_embeddings", 1,
                                 kMaxPositionEmbeddings));
    r.original_max_position_embeddings =
        top_orig.value_or(orig.value_or(spec->max_position_embeddings));
  }
  if (r.type == "llama3") {
    ASSIGN_OR_RETURN(std::optional<double> low, RopeNumber(*rp, where, "low_freq_factor", 1e6));
    ASSIGN_OR_RETURN(std::optional<double> high, RopeNumber(*rp, where, "high_freq_factor", 1e6));
    if (!low.has_value()) return KeyError(absl::StrCat(where, ".low_freq_factor"), "is required");
    if (!high.has_value()) {
      return KeyError(absl::StrCat(where, ".high_freq_factor"), "is required");
    }
    if (*high <= *low) {
      return KeyError(absl::StrCat(where, ".high_freq_factor"),
                      absl::StrCat("= ", *high, " must exceed low_freq_factor = ", *low));
    }
    r.low_freq_factor = *low;
    r.high_freq_factor = *high;
  }
  if (r.type == "yarn") {
    r.factor = factor.value_or(static_cast<double>(spec->max_position_embeddings) /
                               static_cast<double>(r.original_max_position_embeddings));
    ASSIGN_OR_RETURN(std::optional<double> attention,
                     RopeNumber(*rp, where, "attention_factor", 1e6));
    ASSIGN_OR_RETURN(std::optional<double> fast, RopeNumber(*rp, where, "beta_fast", 1e6));
    ASSIGN_OR_RETURN(std::optional<double> slow, RopeNumber(*rp, where, "beta_slow", 1e6));
    ASSIGN_OR_RETURN(std::optional<double> mscale, RopeNumber(*rp, where, "mscale", 1e6));
    ASSIGN_OR_RETURN(std::optional<double> mscale_all,
                     RopeNumber(*rp, where, "mscale_all_dim", 1e6));
    ASSIGN_OR_RETURN(std::optional<bool> truncate, OptionalBool(*rp, "truncate"));
    r.attention_factor = attention.value_or(0);
    r.beta_fast = fast.value_or(32);
    r.beta_slow = slow.value_or(1);
    r.mscale = mscale.value_or(0);
    r.mscale_all_dim = mscale_all.value_or(0);
    r.truncate = truncate.value_or(true);
  }
  spec->rope_scaling = r;
  if (vl) {
    // transformers' default when the key is absent.
    spec->mrope_section = {16, 24, 24};
    if (const Json* sections = Find(*rp, "mrope_section"); sections != nullptr) {
      const std::string name = absl::StrCat(where, ".mrope_section");
      if (!sections->is_array() || sections->size() != 3) {
        return KeyError(name, absl::StrCat("must be three integers (temporal, height, width), "
                                           "got ", sections->dump()));
      }
      spec->mrope_section.clear();
      for (const Json& e : *sections) {
        if (!e.is_number_integer() || e.get<int64_t>() < 1 || e.get<int64_t>() > 4096) {
          return KeyError(name, absl::StrCat("contains ", e.dump(), "; allowed: integers in [1, "
                                                                    "4096]"));
        }
        spec->mrope_section.push_back(e.get<int64_t>());
      }
    }
    const int64_t sum = spec->mrope_section[0] + spec->mrope_section[1] + spec->mrope_section[2];
    if (sum != spec->HeadDim() / 2) {
      return KeyError(absl::StrCat(where, ".mrope_section"),
                      absl::StrCat("sums to ", sum, "; must be head_dim / 2 = ",
                                   spec->HeadDim() / 2, " (the rotary frequencies it splits)"));
    }
  }
  return absl::OkStatus();
}

// The window of the config's sliding-attention layers (0: none), as Hugging Face's config classes
// decide it: Mistral slides every layer when "sliding_window" is set (default 4096 when the key is
// absent); Qwen2/Qwen3 only when "use_sliding_window" is true, on the layers "layer_types" marks
// (default: from "max_window_layers" on). Llama has no sliding window.
absl::StatusOr<int64_t> ParseSlidingWindow(const Json& root, const FamilyDefaults& family,
                                           int64_t num_layers) {
  const std::string type = family.model_type;
  if (type == "llama" || IsGemmaFamily(family)) return 0;  // Gemma: hf_json::ParseGemma
  const bool absent = root.find("sliding_window") == root.end();
  ASSIGN_OR_RETURN(std::optional<int64_t> window,
                   OptionalInt(root, "sliding_window", 1, kMaxPositionEmbeddings));
  if (type == "mistral") return absent ? 4096 : window.value_or(0);
  if (type == "mixtral") return window.value_or(0);
  ASSIGN_OR_RETURN(std::optional<bool> use, OptionalBool(root, "use_sliding_window"));
  if (type == "qwen2_5_vl" || type == "qwen2_vl") {
    if (use.value_or(false)) {
      return KeyError("use_sliding_window",
                      absl::StrCat("= true is not supported for ", type,
                                   " (transformers computes full attention there outside "
                                   "flash-attention)"));
    }
    return 0;
  }
  if (!use.value_or(false)) return 0;
  const int64_t w = absent ? 4096 : window.value_or(0);
  if (w == 0) return 0;
  // Qwen3-MoE slides every layer once use_sliding_window is set.
  if (type == "qwen3_moe") return w;
  bool any_sliding = false;
  if (const Json* types = Find(root, "layer_types"); types != nullptr) {
    if (!types->is_array()) return KeyError("layer_types", "must be an array of strings");
    for (const Json& t : *types) {
      if (!t.is_string()) return KeyError("layer_types", "must be an array of strings");
      const std::string s = t.get<std::string>();
      if (s == "sliding_attention") {
        any_sliding = true;
      } else if (s != "full_attention") {
        return KeyError("layer_types",
                        absl::StrCat("contains \"", s,
                                     "\"; allowed: full_attention, sliding_attention"));
      }
    }
  } else {
    ASSIGN_OR_RETURN(std::optional<int64_t> max_window_layers,
                     OptionalInt(root, "max_window_layers", 0, kMaxLayers));
    any_sliding = max_window_layers.value_or(28) < num_layers;
  }
  return any_sliding ? w : 0;
}

// The layers that slide, given the window ParseSlidingWindow found (none when it is 0): Qwen2 and
// Qwen3 mark them in "layer_types" (one entry per layer) or slide the layers from
// "max_window_layers" (default 28) on; every other family slides every layer.
absl::StatusOr<std::vector<int64_t>> ParseSlidingLayers(const Json& root,
                                                        const FamilyDefaults& family,
                                                        int64_t num_layers, int64_t window) {
  std::vector<int64_t> layers;
  if (window == 0) return layers;
  const std::string type = family.model_type;
  if (type != "qwen2" && type != "qwen3") {
    for (int64_t l = 0; l < num_layers; ++l) layers.push_back(l);
    return layers;
  }
  if (const Json* types = Find(root, "layer_types"); types != nullptr) {
    // ParseSlidingWindow checked the entries; transformers also wants one per layer.
    if (static_cast<int64_t>(types->size()) != num_layers) {
      return KeyError("layer_types", absl::StrCat("has ", types->size(), " entries for ",
                                                  num_layers, " layers (\"num_hidden_layers\")"));
    }
    for (int64_t l = 0; l < num_layers; ++l) {
      if ((*types)[static_cast<size_t>(l)].get<std::string>() == "sliding_attention") {
        layers.push_back(l);
      }
    }
    return layers;
  }
  ASSIGN_OR_RETURN(std::optional<int64_t> max_window_layers,
                   OptionalInt(root, "max_window_layers", 0, kMaxLayers));
  for (int64_t l = max_window_layers.value_or(28); l < num_layers; ++l) layers.push_back(l);
  return layers;
}

absl::StatusOr<std::optional<double>> OptionalNonNegativeDouble(const Json& obj, const char* key,
                                                                double hi) {
  const Json* v = Find(obj, key);
  if (v == nullptr) return std::optional<double>();
  if (!v->is_number()) return KeyError(key, absl::StrCat("must be a number, got ", v->dump()));
  const double value = v->get<double>();
  if (!std::isfinite(value) || value < 0 || value > hi) {
    return KeyError(key, absl::StrCat("= ", value, " is out of range; allowed [0, ", hi, "]"));
  }
  return std::optional<double>(value);
}

// The mixture-of-experts keys, with the defaults of transformers' Qwen3MoeConfig and
// MixtralConfig. Qwen3-MoE checkpoints name the expert count "num_experts" (transformers writes
// its alias "num_local_experts"); Mixtral's experts are as wide as intermediate_size and its
// top-k weights are always renormalised.
absl::Status ParseMoe(const Json& root, const FamilyDefaults& family, ModelSpec* spec) {
  const std::string type = family.model_type;
  if (type != "qwen3_moe" && type != "mixtral") return absl::OkStatus();
  const bool qwen = type == "qwen3_moe";
  ASSIGN_OR_RETURN(std::optional<int64_t> local,
                   OptionalInt(root, "num_local_experts", 1, kMaxExperts));
  std::optional<int64_t> named;
  if (qwen) {
    ASSIGN_OR_RETURN(named, OptionalInt(root, "num_experts", 1, kMaxExperts));
  }
  if (local.has_value() && named.has_value() && *local != *named) {
    return KeyError("num_experts", absl::StrCat("= ", *named, " contradicts \"num_local_experts\" = ",
                                                *local));
  }
  spec->num_experts = local.value_or(named.value_or(qwen ? 128 : 8));
  ASSIGN_OR_RETURN(std::optional<int64_t> top_k,
                   OptionalInt(root, "num_experts_per_tok", 1, spec->num_experts));
  spec->num_experts_per_tok = top_k.value_or(qwen ? 8 : 2);
  if (spec->num_experts_per_tok > spec->num_experts) {
    return KeyError("num_experts_per_tok",
                    absl::StrCat("= ", spec->num_experts_per_tok, " exceeds the ",
                                 spec->num_experts, " experts"));
  }
  ASSIGN_OR_RETURN(std::optional<bool> output, OptionalBool(root, "output_router_logits"));
  spec->output_router_logits = output.value_or(false);
  ASSIGN_OR_RETURN(std::optional<double> coef,
                   OptionalNonNegativeDouble(root, "router_aux_loss_coef", 1e3));
  spec->router_aux_loss_coef = coef.value_or(0.001);
  if (!qwen) {
    ASSIGN_OR_RETURN(std::optional<double> jitter,
                     OptionalNonNegativeDouble(root, "router_jitter_noise", 1.0));
    if (jitter.value_or(0) != 0) {
      return KeyError("router_jitter_noise",
                      absl::StrCat("= ", *jitter, " is not supported; allowed: 0 (the agent "
                                                  "does not draw router noise)"));
    }
    spec->moe_intermediate_size = spec->intermediate_size;
    spec->norm_topk_prob = true;
    return absl::OkStatus();
  }
  ASSIGN_OR_RETURN(std::optional<int64_t> width,
                   OptionalInt(root, "moe_intermediate_size", 1, kMaxIntermediateSize));
  spec->moe_intermediate_size = width.value_or(768);
  ASSIGN_OR_RETURN(std::optional<bool> norm, OptionalBool(root, "norm_topk_prob"));
  spec->norm_topk_prob = norm.value_or(false);
  ASSIGN_OR_RETURN(std::optional<int64_t> step,
                   OptionalInt(root, "decoder_sparse_step", 1, kMaxLayers));
  spec->decoder_sparse_step = step.value_or(1);
  if (const Json* only = Find(root, "mlp_only_layers"); only != nullptr) {
    if (!only->is_array()) return KeyError("mlp_only_layers", "must be an array of layer indices");
    for (const Json& e : *only) {
      if (!e.is_number_integer() || e.get<int64_t>() < 0 ||
          e.get<int64_t>() >= spec->num_layers) {
        return KeyError("mlp_only_layers",
                        absl::StrCat("contains ", e.dump(), "; allowed: layer indices 0 to ",
                                     spec->num_layers - 1));
      }
      spec->mlp_only_layers.push_back(e.get<int64_t>());
    }
  }
  return absl::OkStatus();
}

// The language model's keys of `root` (config.json's top level, or its "text_config").
absl::Status ParseLanguageModel(const Json& root, const FamilyDefaults* family, ModelSpec* out) {
  ModelSpec& spec = *out;
  RETURN_IF_ERROR(CheckUnsupportedFeatures(root, *family));
  ASSIGN_OR_RETURN(spec.hidden_size, RequiredInt(root, "hidden_size", 1, kMaxHiddenSize));
  ASSIGN_OR_RETURN(spec.num_layers, RequiredInt(root, "num_hidden_layers", 1, kMaxLayers));
  ASSIGN_OR_RETURN(spec.num_heads, RequiredInt(root, "num_attention_heads", 1, kMaxHeads));
  ASSIGN_OR_RETURN(std::optional<int64_t> kv_heads,
                   OptionalInt(root, "num_key_value_heads", 1, spec.num_heads));
  spec.num_kv_heads = kv_heads.value_or(spec.num_heads);
  if (spec.num_heads % spec.num_kv_heads != 0) {
    return KeyError("num_key_value_heads",
                    absl::StrCat("= ", spec.num_kv_heads,
                                 " must divide \"num_attention_heads\" = ", spec.num_heads));
  }
  ASSIGN_OR_RETURN(std::optional<int64_t> head_dim, OptionalInt(root, "head_dim", 2, 4096));
  spec.head_dim = head_dim.value_or(family->head_dim);
  if (spec.head_dim == 0 && spec.hidden_size % spec.num_heads != 0) {
    return KeyError("num_attention_heads",
                    absl::StrCat("= ", spec.num_heads, " must divide \"hidden_size\" = ",
                                 spec.hidden_size, " when \"head_dim\" is absent"));
  }
  if (spec.HeadDim() % 2 != 0) {
    return KeyError(head_dim.has_value() ? "head_dim" : "hidden_size",
                    absl::StrCat("gives head dimension ", spec.HeadDim(),
                                 ", which must be even (rotary embeddings)"));
  }
  ASSIGN_OR_RETURN(spec.intermediate_size,
                   RequiredInt(root, "intermediate_size", 1, kMaxIntermediateSize));
  ASSIGN_OR_RETURN(spec.vocab_size, RequiredInt(root, "vocab_size", 1, kMaxVocabSize));
  ASSIGN_OR_RETURN(std::optional<bool> tie, OptionalBool(root, "tie_word_embeddings"));
  spec.tie_word_embeddings = tie.value_or(false);

  ASSIGN_OR_RETURN(std::optional<double> eps, OptionalPositiveDouble(root, "rms_norm_eps", 1.0));
  spec.rms_norm_eps = eps.value_or(family->rms_norm_eps);
  ASSIGN_OR_RETURN(std::optional<int64_t> max_pos,
                   OptionalInt(root, "max_position_embeddings", 1, kMaxPositionEmbeddings));
  spec.max_position_embeddings = max_pos.value_or(family->max_position_embeddings);
  spec.qkv_bias = family->qkv_bias;
  spec.qk_norm = family->qk_norm;
  if (std::string(family->model_type) == "gemma3_text") {
    ASSIGN_OR_RETURN(const Json rope_root, hf_json::Gemma3RopeRoot(root, &spec));
    RETURN_IF_ERROR(ParseRope(rope_root, *family, &spec));
  } else {
    RETURN_IF_ERROR(ParseRope(root, *family, &spec));
  }
  ASSIGN_OR_RETURN(spec.sliding_window, ParseSlidingWindow(root, *family, spec.num_layers));
  ASSIGN_OR_RETURN(spec.sliding_layers,
                   ParseSlidingLayers(root, *family, spec.num_layers, spec.sliding_window));
  RETURN_IF_ERROR(ParseMoe(root, *family, &spec));
  if (IsGemmaFamily(*family)) {
    RETURN_IF_ERROR(hf_json::ParseGemma(root, &spec));
  }
  return absl::OkStatus();
}

absl::StatusOr<ModelSpec> ParseConfig(absl::string_view json, bool* has_name) {
  Json root;
  try {
    root = Json::parse(json.begin(), json.end());
  } catch (const Json::parse_error& e) {
    // nlohmann's message carries the byte position of the error.
    return absl::InvalidArgumentError(absl::StrCat("config.json: malformed JSON: ", e.what()));
  }
  if (!root.is_object()) {
    return absl::InvalidArgumentError("config.json: top level must be a JSON object");
  }
  ASSIGN_OR_RETURN(const FamilyDefaults* family, ResolveFamily(root));
  ModelSpec spec;
  spec.family = family->model_type;
  ASSIGN_OR_RETURN(std::optional<std::string> name, OptionalString(root, "_name_or_path"));
  *has_name = name.has_value() && !name->empty();
  spec.name = *has_name ? *name : family->model_type;

  // transformers 5 writes a vision-language model's language part under "text_config";
  // published Qwen2-VL and Qwen2.5-VL checkpoints keep it at the top level.
  const Json* text = &root;
  if (IsVisionLanguageFamily(*family)) {
    if (const Json* t = Find(root, "text_config"); t != nullptr) {
      if (!t->is_object()) return KeyError("text_config", "must be an object");
      text = t;
    }
  }
  if (absl::Status s = ParseLanguageModel(*text, family, &spec); !s.ok()) {
    return text == &root ? s : Nested(s, "text_config.");
  }
  if (IsVisionLanguageFamily(*family)) {
    // Pre-v5 saves kept tie_word_embeddings in text_config; transformers honours either.
    ASSIGN_OR_RETURN(std::optional<bool> tie, OptionalBool(root, "tie_word_embeddings"));
    spec.tie_word_embeddings = spec.tie_word_embeddings || tie.value_or(false);
    RETURN_IF_ERROR(hf_json::ParseVisionLanguage(root, &spec));
  }

  // Backstop: the checks above name JSON keys; this one guards the ModelSpec invariants.
  if (absl::Status s = ValidateModelSpec(spec, "config.json -> arch."); !s.ok()) return s;
  return spec;
}


// The RoPE dictionary of `spec` in transformers 5.x's "rope_parameters" layout.
Json RopeParametersObject(const ModelSpec& spec) {
  const RopeScaling& r = spec.rope_scaling;
  Json rp = Json::object();
  rp["rope_type"] = r.type;
  rp["rope_theta"] = spec.rope_theta;
  if (r.type != "default") rp["factor"] = r.factor;
  if (r.type == "llama3" || r.type == "yarn") {
    rp["original_max_position_embeddings"] = r.original_max_position_embeddings;
  }
  if (r.type == "llama3") {
    rp["low_freq_factor"] = r.low_freq_factor;
    rp["high_freq_factor"] = r.high_freq_factor;
  }
  if (r.type == "yarn") {
    if (r.attention_factor > 0) rp["attention_factor"] = r.attention_factor;
    rp["beta_fast"] = r.beta_fast;
    rp["beta_slow"] = r.beta_slow;
    if (r.mscale > 0) rp["mscale"] = r.mscale;
    if (r.mscale_all_dim > 0) rp["mscale_all_dim"] = r.mscale_all_dim;
    rp["truncate"] = r.truncate;
  }
  if (!spec.mrope_section.empty()) rp["mrope_section"] = spec.mrope_section;
  return rp;
}

const FamilyDefaults* FamilyOf(const std::string& model_type) {
  for (const FamilyDefaults& f : kFamilies) {
    if (model_type == f.model_type) return &f;
  }
  return nullptr;
}

}  // namespace

std::string RopeParametersJson(const ModelSpec& spec) { return RopeParametersObject(spec).dump(); }

absl::Status ParseRopeParametersJson(absl::string_view json, ModelSpec* spec) {
  Json root = Json::object();
  try {
    root["rope_parameters"] = Json::parse(json.begin(), json.end());
  } catch (const Json::parse_error& e) {
    return absl::InvalidArgumentError(absl::StrCat("rope_parameters: malformed JSON: ", e.what()));
  }
  const FamilyDefaults* family = FamilyOf(spec->family);
  if (family == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("family = \"", spec->family,
                                                   "\" is not supported; allowed: ",
                                                   AllowedModelTypes()));
  }
  return ParseRope(root, *family, spec);
}

std::string ToHfConfigJson(const ModelSpec& spec, DType dtype) {
  const FamilyDefaults* family = FamilyOf(spec.family);
  nlohmann::ordered_json j;
  j["architectures"] = Json::array({family != nullptr ? family->architecture : "LlamaForCausalLM"});
  j["model_type"] = spec.family;
  j["hidden_size"] = spec.hidden_size;
  j["intermediate_size"] = spec.intermediate_size;
  j["num_hidden_layers"] = spec.num_layers;
  j["num_attention_heads"] = spec.num_heads;
  j["num_key_value_heads"] = spec.num_kv_heads;
  j["head_dim"] = spec.HeadDim();
  j["vocab_size"] = spec.vocab_size;
  j["max_position_embeddings"] = spec.max_position_embeddings;
  j["rms_norm_eps"] = spec.rms_norm_eps;
  j["hidden_act"] = "silu";
  j["tie_word_embeddings"] = spec.tie_word_embeddings;
  j["rope_parameters"] = RopeParametersObject(spec);
  if (spec.family == "llama" || spec.family == "qwen3" || spec.family == "mistral" ||
      spec.family == "qwen3_moe") {
    j["attention_bias"] = false;
  }
  if (spec.family == "llama") j["mlp_bias"] = false;
  if (spec.family == "mistral" || spec.family == "mixtral") {
    j["sliding_window"] = spec.sliding_window > 0 ? Json(spec.sliding_window) : Json(nullptr);
  }
  if (spec.family == "qwen3_moe") {
    j["use_sliding_window"] = spec.sliding_window > 0;
    j["sliding_window"] = spec.sliding_window > 0 ? Json(spec.sliding_window) : Json(nullptr);
    j["num_experts"] = spec.num_experts;
    j["num_experts_per_tok"] = spec.num_experts_per_tok;
    j["moe_intermediate_size"] = spec.moe_intermediate_size;
    j["norm_topk_prob"] = spec.norm_topk_prob;
    j["decoder_sparse_step"] = spec.decoder_sparse_step;
    j["mlp_only_layers"] = spec.mlp_only_layers;
  }
  if (spec.family == "mixtral") {
    j["num_local_experts"] = spec.num_experts;
    j["num_experts_per_tok"] = spec.num_experts_per_tok;
    j["router_jitter_noise"] = 0.0;
  }
  if (spec.IsMoe()) {
    j["output_router_logits"] = spec.output_router_logits;
    j["router_aux_loss_coef"] = spec.router_aux_loss_coef;
  }
  if (spec.family == "qwen2" || spec.family == "qwen3") {
    // "layer_types" says which layers slide; max_window_layers is only its default.
    j["use_sliding_window"] = spec.sliding_window > 0;
    j["sliding_window"] = spec.sliding_window > 0 ? Json(spec.sliding_window) : Json(nullptr);
    j["max_window_layers"] = spec.num_layers;
    Json types = Json::array();
    for (int64_t l = 0; l < spec.num_layers; ++l) {
      types.push_back(spec.LayerWindow(l) > 0 ? "sliding_attention" : "full_attention");
    }
    j["layer_types"] = types;
  }
  j["dtype"] = dtype == DType::kBFloat16 ? "bfloat16"
               : dtype == DType::kFloat16 ? "float16"
                                          : "float32";
  if (spec.IsGemma()) hf_json::GemmaConfigJson(spec, &j);
  if (spec.IsVisionLanguage()) return hf_json::VisionLanguageConfigJson(spec, std::move(j));
  return j.dump(2) + "\n";
}

absl::StatusOr<ModelSpec> ParseHfConfigJson(absl::string_view json) {
  bool has_name = false;
  return ParseConfig(json, &has_name);
}

absl::StatusOr<ModelSpec> LoadHfConfigFile(const std::string& path) {
  // POSIX calls rather than std::filesystem: this also runs in Torch-linked binaries, where
  // libtorch.so's exported std::filesystem symbols interpose on ours and are not ABI-safe.
  std::string file = path;
  struct stat st;
  if (::stat(file.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
    file = absl::StrCat(path, path.empty() || path.back() == '/' ? "" : "/", "config.json");
  }
  if (::stat(file.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) {
    return absl::NotFoundError(absl::StrCat("config file not found: ", file));
  }
  if (st.st_size > kMaxConfigFileBytes) {
    return absl::InvalidArgumentError(absl::StrCat(file, ": size ", st.st_size,
                                                   " is not a plausible config.json (limit ",
                                                   kMaxConfigFileBytes, " bytes)"));
  }
  std::ifstream in(file, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  if (!in.good() && !in.eof()) {
    return absl::InternalError(absl::StrCat("failed to read ", file));
  }
  const std::string contents = text.str();
  bool has_name = false;
  absl::StatusOr<ModelSpec> spec = ParseConfig(contents, &has_name);
  if (!spec.ok()) {
    return absl::Status(spec.status().code(), absl::StrCat(file, ": ", spec.status().message()));
  }
  // Name the model after its directory when config.json does not say.
  if (!has_name) {
    char resolved[PATH_MAX];
    if (::realpath(file.c_str(), resolved) != nullptr) {
      std::string dir(resolved);
      dir = dir.substr(0, dir.rfind('/'));
      const std::string base = dir.substr(dir.rfind('/') + 1);
      if (!base.empty()) spec->name = base;
    }
  }
  return spec;
}

}  // namespace memplan
