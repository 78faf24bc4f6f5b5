// Gemma 2's and Gemma 3's keys of config.json (Gemma2Config, Gemma3TextConfig), read into
// ModelSpec and written back.
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/hf_config_json.h"
#include "common/status.h"
#include "common/validate.h"

namespace memplan {
namespace hf_json {
namespace {

constexpr int64_t kMaxWindow = int64_t{1} << 31;

// A soft cap: absent takes transformers' default, null (or 0) turns it off.
absl::StatusOr<double> SoftCap(const Json& root, const char* key, double fallback) {
  if (root.find(key) == root.end()) return fallback;
  const Json* v = Find(root, key);
  if (v == nullptr) return 0.0;
  if (!v->is_number() || !std::isfinite(v->get<double>()) || v->get<double>() < 0 ||
      v->get<double>() > 1e6) {
    return KeyError(key, absl::StrCat("must be null or a number in [0, 1e6], got ", v->dump()));
  }
  return v->get<double>();
}

// The RoPE dictionary of Gemma 3's sliding layers: the default frequencies only; returns its
// rope_theta when set.
absl::StatusOr<std::optional<double>> SlidingRope(const Json& sliding) {
  const std::string where = "rope_parameters.sliding_attention";
  if (!sliding.is_object()) return KeyError(where, "must be an object");
  for (const auto& [key, value] : sliding.items()) {
    if (key != "rope_type" && key != "type" && key != "rope_theta" && !value.is_null()) {
      return KeyError(absl::StrCat(where, ".", key),
                      "is not supported (Gemma 3's sliding layers use the default RoPE)");
    }
  }
  ASSIGN_OR_RETURN(std::optional<std::string> type, OptionalString(sliding, "rope_type"));
  if (!type.has_value()) {
    ASSIGN_OR_RETURN(type, OptionalString(sliding, "type"));
  }
  if (type.value_or("default") != "default") {
    return KeyError(absl::StrCat(where, ".rope_type"),
                    absl::StrCat("= \"", *type, "\" is not supported; allowed: default"));
  }
  return OptionalPositiveDouble(sliding, "rope_theta", 1e12);
}

}  // namespace

absl::StatusOr<Json> Gemma3RopeRoot(const Json& root, ModelSpec* spec) {
  Json out = root;
  ASSIGN_OR_RETURN(std::optional<double> local,
                   OptionalPositiveDouble(root, "rope_local_base_freq", 1e12));
  const Json* rp = Find(root, "rope_parameters");
  const bool per_type = rp != nullptr && rp->is_object() &&
                        (rp->contains("full_attention") || rp->contains("sliding_attention"));
  if (per_type) {
    for (const auto& [key, value] : rp->items()) {
      if (key != "full_attention" && key != "sliding_attention") {
        return KeyError(absl::StrCat("rope_parameters.", key),
                        "is not a layer type; allowed: full_attention, sliding_attention");
      }
    }
    if (const Json* full = Find(*rp, "full_attention"); full != nullptr) {
      out["rope_parameters"] = *full;
    } else {
      out.erase("rope_parameters");
    }
    if (const Json* sliding = Find(*rp, "sliding_attention"); sliding != nullptr) {
      ASSIGN_OR_RETURN(std::optional<double> theta, SlidingRope(*sliding));
      // The dictionary's own base wins over rope_local_base_freq, as Gemma3TextConfig decides.
      if (theta.has_value()) local = theta;
    }
  }
  spec->rope_local_base_freq = local.value_or(10000.0);
  return out;
}

absl::Status ParseGemma(const Json& root, ModelSpec* spec) {
  // Gemma2MLP reads "hidden_activation"; a "hidden_act" beside it (published configs carry both)
  // is not read by transformers 5 and so not here.
  ASSIGN_OR_RETURN(std::optional<std::string> act, OptionalString(root, "hidden_activation"));
  if (act.value_or("gelu_pytorch_tanh") != "gelu_pytorch_tanh") {
    return KeyError("hidden_activation",
                    absl::StrCat("= \"", *act, "\" is not supported; allowed: gelu_pytorch_tanh"));
  }
  ASSIGN_OR_RETURN(std::optional<bool> bias, OptionalBool(root, "attention_bias"));
  if (bias.value_or(false)) {
    return KeyError("attention_bias",
                    absl::StrCat("= true (q/k/v/o biases) is not supported for ", spec->family));
  }
  ASSIGN_OR_RETURN(std::optional<bool> bidirectional,
                   OptionalBool(root, "use_bidirectional_attention"));
  if (bidirectional.value_or(false)) {
    return KeyError("use_bidirectional_attention",
                    "= true is not supported (memplan trains causal language models)");
  }
  const Json* dropout = Find(root, "attention_dropout");
  if (dropout != nullptr && (!dropout->is_number() || dropout->get<double>() != 0)) {
    return KeyError("attention_dropout",
                    absl::StrCat("= ", dropout->dump(), " is not supported; allowed: 0"));
  }
  ASSIGN_OR_RETURN(std::optional<double> scalar,
                   OptionalPositiveDouble(root, "query_pre_attn_scalar", 1e6));
  spec->query_pre_attn_scalar = scalar.value_or(256);
  // Gemma2Config caps by default (50 and 30); Gemma3TextConfig does not.
  const bool gemma3 = spec->family == "gemma3_text";
  ASSIGN_OR_RETURN(spec->attn_logit_softcapping,
                   SoftCap(root, "attn_logit_softcapping", gemma3 ? 0.0 : 50.0));
  ASSIGN_OR_RETURN(spec->final_logit_softcapping,
                   SoftCap(root, "final_logit_softcapping", gemma3 ? 0.0 : 30.0));
  ASSIGN_OR_RETURN(std::optional<bool> tie, OptionalBool(root, "tie_word_embeddings"));
  spec->tie_word_embeddings = tie.value_or(true);
  // Gemma2Model builds its embedding with padding_idx = pad_token_id (default 0).
  if (root.find("pad_token_id") == root.end()) {
    spec->embedding_padding_idx = 0;
  } else {
    ASSIGN_OR_RETURN(std::optional<int64_t> pad,
                     OptionalInt(root, "pad_token_id", 0, spec->vocab_size - 1));
    spec->embedding_padding_idx = pad.value_or(-1);
  }

  // Which layers slide: "layer_types" when given, else Gemma2Config's default (every even layer)
  // or Gemma3TextConfig's (every layer but each sliding_window_pattern-th, default 6); the window
  // is "sliding_window" (default 4096).
  spec->sliding_window = 0;
  spec->sliding_layers.clear();
  std::vector<int64_t> layers;
  if (const Json* types = Find(root, "layer_types"); types != nullptr) {
    if (!types->is_array()) return KeyError("layer_types", "must be an array of strings");
    if (static_cast<int64_t>(types->size()) != spec->num_layers) {
      return KeyError("layer_types",
                      absl::StrCat("has ", types->size(), " entries for ", spec->num_layers,
                                   " layers (\"num_hidden_layers\")"));
    }
    for (size_t l = 0; l < types->size(); ++l) {
      const Json& t = (*types)[l];
      const std::string s = t.is_string() ? t.get<std::string>() : t.dump();
      if (s == "sliding_attention") {
        layers.push_back(static_cast<int64_t>(l));
      } else if (s != "full_attention") {
        return KeyError(
            "layer_types",
            absl::StrCat("contains ", s, "; allowed: full_attention, sliding_attention"));
      }
    }
  } else if (gemma3) {
    ASSIGN_OR_RETURN(std::optional<int64_t> pattern,
                     OptionalInt(root, "sliding_window_pattern", 1, kMaxWindow));
    for (int64_t l = 0; l < spec->num_layers; ++l) {
      if ((l + 1) % pattern.value_or(6) != 0) layers.push_back(l);
    }
  } else {
    for (int64_t l = 0; l < spec->num_layers; l += 2) layers.push_back(l);
  }
  if (layers.empty()) return absl::OkStatus();
  const bool absent = root.find("sliding_window") == root.end();
  ASSIGN_OR_RETURN(std::optional<int64_t> window,
                   OptionalInt(root, "sliding_window", 1, kMaxWindow));
  if (!absent && !window.has_value()) {
    return KeyError("sliding_window",
                    "is null but layers slide (\"layer_types\"); transformers needs a window");
  }
  spec->sliding_window = window.value_or(4096);
  spec->sliding_layers = std::move(layers);
  return absl::OkStatus();
}

void GemmaConfigJson(const ModelSpec& spec, nlohmann::ordered_json* j) {
  j->erase("hidden_act");
  (*j)["hidden_activation"] = "gelu_pytorch_tanh";
  (*j)["attention_bias"] = false;
  // Gemma2Config types the scalar as an integer (and transformers 5 checks types); published
  // values are integers.
  const double scalar = spec.query_pre_attn_scalar;
  if (scalar == std::floor(scalar) && scalar < 1e15) {
    (*j)["query_pre_attn_scalar"] = static_cast<int64_t>(scalar);
  } else {
    (*j)["query_pre_attn_scalar"] = scalar;
  }
  auto cap = [](double c) { return c > 0 ? Json(c) : Json(nullptr); };
  (*j)["attn_logit_softcapping"] = cap(spec.attn_logit_softcapping);
  (*j)["final_logit_softcapping"] = cap(spec.final_logit_softcapping);
  (*j)["pad_token_id"] =
      spec.embedding_padding_idx >= 0 ? Json(spec.embedding_padding_idx) : Json(nullptr);
  // Gemma2Config wants a window even when no layer slides: any value, none of them reads it.
  (*j)["sliding_window"] = spec.sliding_window > 0 ? spec.sliding_window : int64_t{4096};
  Json types = Json::array();
  for (int64_t l = 0; l < spec.num_layers; ++l) {
    types.push_back(spec.LayerWindow(l) > 0 ? "sliding_attention" : "full_attention");
  }
  (*j)["layer_types"] = types;
  if (spec.family == "gemma3_text") {
    // Gemma3TextConfig reads one RoPE dictionary per layer type; a flat one would leave the full
    // layers at the default RoPE.
    Json full = (*j)["rope_parameters"];
    Json sliding = {{"rope_type", "default"}, {"rope_theta", spec.rope_local_base_freq}};
    (*j)["rope_parameters"] = {{"full_attention", full}, {"sliding_attention", sliding}};
  }
}

}  // namespace hf_json
}  // namespace memplan
