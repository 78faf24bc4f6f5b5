#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/hf_config_json.h"
#include "common/status.h"
#include "common/validate.h"

namespace memplan {
namespace hf_json {
namespace {

struct IntKey {
  const char* key;
  int64_t* slot;
  int64_t fallback;
  int64_t hi;
};

// The tower's 2-D rotary base ("rope_parameters", type axial).
absl::Status ParseVisionRope(const Json& v, VisionSpec* out) {
  VisionSpec& vs = *out;
  if (const Json* rp = Find(v, "rope_parameters"); rp != nullptr) {
    if (!rp->is_object()) return KeyError("rope_parameters", "must be an object");
    ASSIGN_OR_RETURN(std::optional<std::string> type, OptionalString(*rp, "rope_type"));
    if (type.value_or("axial") != "axial") {
      return KeyError("rope_parameters.rope_type",
                      absl::StrCat("= \"", *type, "\" is not supported; allowed: axial"));
    }
    ASSIGN_OR_RETURN(std::optional<double> theta,
                     RopeNumber(*rp, "rope_parameters", "rope_theta", 1e12));
    vs.rope_theta = theta.value_or(10000.0);
  }
  return absl::OkStatus();
}

// Qwen2.5-VL's "vision_config" (transformers' Qwen2_5_VLVisionConfig defaults for absent keys).
absl::Status ParseQwen25VisionConfig(const Json& v, VisionSpec* out) {
  VisionSpec& vs = *out;
  ASSIGN_OR_RETURN(std::optional<std::string> act, OptionalString(v, "hidden_act"));
  if (act.value_or("silu") != "silu") {
    return KeyError("hidden_act", absl::StrCat("= \"", *act, "\" is not supported; allowed: silu"));
  }
  const IntKey keys[] = {
      {"depth", &vs.depth, 32, kMaxLayers},
      {"hidden_size", &vs.hidden_size, 3584, kMaxHiddenSize},
      {"intermediate_size", &vs.intermediate_size, 3420, kMaxIntermediateSize},
      {"num_heads", &vs.num_heads, 16, kMaxHeads},
      {"in_channels", &vs.in_channels, 3, 16},
      {"patch_size", &vs.patch_size, 14, 1024},
      {"spatial_merge_size", &vs.spatial_merge_size, 2, 64},
      {"temporal_patch_size", &vs.temporal_patch_size, 2, 64},
      {"window_size", &vs.window_size, 112, int64_t{1} << 20},
      {"out_hidden_size", &vs.out_hidden_size, 3584, kMaxHiddenSize},
  };
  for (const IntKey& k : keys) {
    ASSIGN_OR_RETURN(std::optional<int64_t> value, OptionalInt(v, k.key, 1, k.hi));
    *k.slot = value.value_or(k.fallback);
  }
  if (vs.hidden_size % vs.num_heads != 0 || (vs.hidden_size / vs.num_heads) % 4 != 0) {
    return KeyError("num_heads", absl::StrCat("= ", vs.num_heads,
                                              " must divide \"hidden_size\" = ", vs.hidden_size,
                                              " into heads of a multiple of 4 dimensions (2-D "
                                              "rotary embedding)"));
  }
  if (vs.WindowMergedPatches() < 1) {
    return KeyError("window_size",
                    absl::StrCat("= ", vs.window_size, " must span at least one merged patch (",
                                 vs.spatial_merge_size * vs.patch_size, " pixels)"));
  }
  vs.fullatt_block_indexes = {7, 15, 23, 31};
  if (const Json* full = Find(v, "fullatt_block_indexes"); full != nullptr) {
    if (!full->is_array()) return KeyError("fullatt_block_indexes", "must be an array of blocks");
    vs.fullatt_block_indexes.clear();
    for (const Json& e : *full) {
      if (!e.is_number_integer() || e.get<int64_t>() < 0 || e.get<int64_t>() >= vs.depth) {
        return KeyError("fullatt_block_indexes",
                        absl::StrCat("contains ", e.dump(), "; allowed: block indices 0 to ",
                                     vs.depth - 1, " (\"depth\" = ", vs.depth, ")"));
      }
      vs.fullatt_block_indexes.push_back(e.get<int64_t>());
    }
    std::sort(vs.fullatt_block_indexes.begin(), vs.fullatt_block_indexes.end());
    vs.fullatt_block_indexes.erase(
        std::unique(vs.fullatt_block_indexes.begin(), vs.fullatt_block_indexes.end()),
        vs.fullatt_block_indexes.end());
  } else {
    // transformers' default names blocks of its 32-block tower; a shallower one keeps those
    // that exist.
    std::erase_if(vs.fullatt_block_indexes, [&](int64_t b) { return b >= vs.depth; });
  }
  return ParseVisionRope(v, &vs);
}

// Qwen2-VL's "vision_config" (transformers' Qwen2VLVisionConfig defaults for absent keys): its
// embed_dim is the tower's width, its hidden_size the merger's output, the MLP embed_dim ·
// mlp_ratio wide; published checkpoints say "in_chans" for in_channels. No windows.
absl::Status ParseQwen2VisionConfig(const Json& v, VisionSpec* out) {
  VisionSpec& vs = *out;
  ASSIGN_OR_RETURN(std::optional<std::string> act, OptionalString(v, "hidden_act"));
  if (act.value_or("quick_gelu") != "quick_gelu") {
    return KeyError("hidden_act",
                    absl::StrCat("= \"", *act, "\" is not supported; allowed: quick_gelu"));
  }
  ASSIGN_OR_RETURN(std::optional<int64_t> in_chans, OptionalInt(v, "in_chans", 1, 16));
  int64_t mlp_ratio = 0;
  const IntKey keys[] = {
      {"depth", &vs.depth, 32, kMaxLayers},
      {"embed_dim", &vs.hidden_size, 1280, kMaxHiddenSize},
      {"hidden_size", &vs.out_hidden_size, 3584, kMaxHiddenSize},
      {"mlp_ratio", &mlp_ratio, 4, 64},
      {"num_heads", &vs.num_heads, 16, kMaxHeads},
      {"in_channels", &vs.in_channels, in_chans.value_or(3), 16},
      {"patch_size", &vs.patch_size, 14, 1024},
      {"spatial_merge_size", &vs.spatial_merge_size, 2, 64},
      {"temporal_patch_size", &vs.temporal_patch_size, 2, 64},
  };
  for (const IntKey& k : keys) {
    ASSIGN_OR_RETURN(std::optional<int64_t> value, OptionalInt(v, k.key, 1, k.hi));
    *k.slot = value.value_or(k.fallback);
  }
  vs.intermediate_size = vs.hidden_size * mlp_ratio;
  if (vs.intermediate_size > kMaxIntermediateSize) {
    return KeyError("mlp_ratio",
                    absl::StrCat("= ", mlp_ratio, " makes the MLP ", vs.intermediate_size,
                                 " wide; allowed at most ", kMaxIntermediateSize));
  }
  if (vs.hidden_size % vs.num_heads != 0 || (vs.hidden_size / vs.num_heads) % 4 != 0) {
    return KeyError("num_heads", absl::StrCat("= ", vs.num_heads,
                                              " must divide \"embed_dim\" = ", vs.hidden_size,
                                              " into heads of a multiple of 4 dimensions (2-D "
                                              "rotary embedding)"));
  }
  vs.window_size = 0;
  vs.fullatt_block_indexes.clear();
  return ParseVisionRope(v, &vs);
}

}  // namespace

absl::Status ParseVisionLanguage(const Json& root, ModelSpec* spec) {
  const Json empty = Json::object();
  const Json* v = Find(root, "vision_config");
  if (v == nullptr) v = &empty;
  if (!v->is_object()) return KeyError("vision_config", "must be an object");
  const bool qwen2 = spec->family == "qwen2_vl";
  if (absl::Status s = qwen2 ? ParseQwen2VisionConfig(*v, &spec->vision)
                             : ParseQwen25VisionConfig(*v, &spec->vision);
      !s.ok()) {
    return Nested(s, "vision_config.");
  }
  if (spec->vision.out_hidden_size != spec->hidden_size) {
    return KeyError(qwen2 ? "vision_config.hidden_size" : "vision_config.out_hidden_size",
                    absl::StrCat("= ", spec->vision.out_hidden_size,
                                 " must equal the language "
                                 "model's \"hidden_size\" = ",
                                 spec->hidden_size));
  }
  struct IdKey {
    const char* key;
    int64_t* slot;
    int64_t fallback;
  };
  const IdKey ids[] = {
      {"image_token_id", &spec->image_token_id, 151655},
      {"video_token_id", &spec->video_token_id, 151656},
      {"vision_start_token_id", &spec->vision_start_token_id, 151652},
      {"vision_end_token_id", &spec->vision_end_token_id, 151653},
  };
  for (const IdKey& k : ids) {
    ASSIGN_OR_RETURN(std::optional<int64_t> id, OptionalInt(root, k.key, 0, spec->vocab_size - 1));
    if (!id.has_value() && k.fallback >= spec->vocab_size) {
      return KeyError(k.key, absl::StrCat("is required: its default ", k.fallback,
                                          " is outside the vocabulary (\"vocab_size\" = ",
                                          spec->vocab_size, ")"));
    }
    *k.slot = id.value_or(k.fallback);
  }
  return absl::OkStatus();
}

std::string VisionLanguageConfigJson(const ModelSpec& spec, nlohmann::ordered_json text) {
  const VisionSpec& v = spec.vision;
  nlohmann::ordered_json j;
  j["architectures"] = text["architectures"];
  j["model_type"] = spec.family;
  j["dtype"] = text["dtype"];
  j["tie_word_embeddings"] = spec.tie_word_embeddings;
  j["image_token_id"] = spec.image_token_id;
  j["video_token_id"] = spec.video_token_id;
  j["vision_start_token_id"] = spec.vision_start_token_id;
  j["vision_end_token_id"] = spec.vision_end_token_id;
  text.erase("architectures");
  const bool qwen2 = spec.family == "qwen2_vl";
  text["model_type"] = qwen2 ? "qwen2_vl_text" : "qwen2_5_vl_text";
  text["use_sliding_window"] = false;
  j["text_config"] = std::move(text);
  nlohmann::ordered_json vj;
  if (qwen2) {
    vj["model_type"] = "qwen2_vl_vision";
    vj["depth"] = v.depth;
    vj["embed_dim"] = v.hidden_size;
    vj["hidden_size"] = v.out_hidden_size;
    vj["mlp_ratio"] = v.intermediate_size / v.hidden_size;
    vj["num_heads"] = v.num_heads;
    vj["hidden_act"] = "quick_gelu";
    vj["in_channels"] = v.in_channels;
    vj["patch_size"] = v.patch_size;
    vj["spatial_merge_size"] = v.spatial_merge_size;
    vj["temporal_patch_size"] = v.temporal_patch_size;
    vj["rope_parameters"] = {{"rope_type", "axial"}, {"rope_theta", v.rope_theta}};
    j["vision_config"] = std::move(vj);
    return j.dump(2) + "\n";
  }
  vj["model_type"] = "qwen2_5_vl_vision";
  vj["depth"] = v.depth;
  vj["hidden_size"] = v.hidden_size;
  vj["intermediate_size"] = v.intermediate_size;
  vj["num_heads"] = v.num_heads;
  vj["hidden_act"] = "silu";
  vj["in_channels"] = v.in_channels;
  vj["patch_size"] = v.patch_size;
  vj["spatial_merge_size"] = v.spatial_merge_size;
  vj["temporal_patch_size"] = v.temporal_patch_size;
  vj["window_size"] = v.window_size;
  vj["out_hidden_size"] = v.out_hidden_size;
  vj["fullatt_block_indexes"] = v.fullatt_block_indexes;
  vj["rope_parameters"] = {{"rope_type", "axial"}, {"rope_theta", v.rope_theta}};
  j["vision_config"] = std::move(vj);
  return j.dump(2) + "\n";
}

}  // namespace hf_json
}  // namespace memplan
