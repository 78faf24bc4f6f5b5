#include "agent/io/trainer_state.h"

#include <cmath>
#include <limits>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/hf_config.h"
#include "common/status.h"
#include "common/validate.h"
#include "nlohmann/json.hpp"

namespace memplan::io {
namespace {

using Json = nlohmann::json;
using OrderedJson = nlohmann::ordered_json;

absl::Status KeyError(absl::string_view key, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("trainer.json: \"", key, "\" ", what));
}

// Typed accessors; `path` is the dotted key used in error messages.
absl::StatusOr<const Json*> Member(const Json& obj, const char* key, const std::string& path) {
  auto it = obj.find(key);
  if (it == obj.end()) return KeyError(path, "is required");
  return &*it;
}

absl::StatusOr<int64_t> GetInt(const Json& obj, const char* key, const std::string& path,
                               int64_t lo, int64_t hi) {
  ASSIGN_OR_RETURN(const Json* v, Member(obj, key, path));
  if (!v->is_number_integer()) return KeyError(path, "must be an integer");
  if (v->is_number_unsigned() &&
      v->get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    return KeyError(path, "is out of range");
  }
  const int64_t x = v->get<int64_t>();
  if (x < lo || x > hi) {
    return KeyError(path, absl::StrCat("= ", x, " is out of range; allowed [", lo, ", ", hi, "]"));
  }
  return x;
}

absl::StatusOr<uint64_t> GetUint(const Json& obj, const char* key, const std::string& path) {
  ASSIGN_OR_RETURN(const Json* v, Member(obj, key, path));
  if (!v->is_number_unsigned() && !(v->is_number_integer() && v->get<int64_t>() >= 0)) {
    return KeyError(path, "must be a non-negative integer");
  }
  return v->get<uint64_t>();
}

absl::StatusOr<double> GetDouble(const Json& obj, const char* key, const std::string& path,
                                 double lo, double hi) {
  ASSIGN_OR_RETURN(const Json* v, Member(obj, key, path));
  if (!v->is_number()) return KeyError(path, "must be a number");
  const double x = v->get<double>();
  if (!std::isfinite(x) || x < lo || x > hi) {
    return KeyError(path, absl::StrCat("= ", x, " is out of range; allowed [", lo, ", ", hi, "]"));
  }
  return x;
}

absl::StatusOr<std::string> GetString(const Json& obj, const char* key, const std::string& path) {
  ASSIGN_OR_RETURN(const Json* v, Member(obj, key, path));
  if (!v->is_string()) return KeyError(path, "must be a string");
  return v->get<std::string>();
}

absl::StatusOr<bool> GetBool(const Json& obj, const char* key, const std::string& path) {
  ASSIGN_OR_RETURN(const Json* v, Member(obj, key, path));
  if (!v->is_boolean()) return KeyError(path, "must be true or false");
  return v->get<bool>();
}

absl::StatusOr<const Json*> GetObject(const Json& obj, const char* key, const std::string& path) {
  ASSIGN_OR_RETURN(const Json* v, Member(obj, key, path));
  if (!v->is_object()) return KeyError(path, "must be an object");
  return v;
}

// The mixture-of-experts fields, only for such a model (states of dense models stay as they were).
void EncodeMoe(const ModelSpec& m, OrderedJson* j) {
  if (!m.IsMoe()) return;
  (*j)["num_experts"] = m.num_experts;
  (*j)["num_experts_per_tok"] = m.num_experts_per_tok;
  (*j)["moe_intermediate_size"] = m.moe_intermediate_size;
  (*j)["norm_topk_prob"] = m.norm_topk_prob;
  (*j)["decoder_sparse_step"] = m.decoder_sparse_step;
  (*j)["mlp_only_layers"] = m.mlp_only_layers;
  (*j)["output_router_logits"] = m.output_router_logits;
  (*j)["router_aux_loss_coef"] = m.router_aux_loss_coef;
}

absl::Status DecodeMoe(const Json& j, ModelSpec* m) {
  if (!j.contains("num_experts")) return absl::OkStatus();
  constexpr int64_t kBig = std::numeric_limits<int64_t>::max();
  ASSIGN_OR_RETURN(m->num_experts, GetInt(j, "num_experts", "model.num_experts", 1, kBig));
  ASSIGN_OR_RETURN(m->num_experts_per_tok,
                   GetInt(j, "num_experts_per_tok", "model.num_experts_per_tok", 1, kBig));
  ASSIGN_OR_RETURN(m->moe_intermediate_size,
                   GetInt(j, "moe_intermediate_size", "model.moe_intermediate_size", 1, kBig));
  ASSIGN_OR_RETURN(m->norm_topk_prob, GetBool(j, "norm_topk_prob", "model.norm_topk_prob"));
  ASSIGN_OR_RETURN(m->decoder_sparse_step,
                   GetInt(j, "decoder_sparse_step", "model.decoder_sparse_step", 1, kBig));
  ASSIGN_OR_RETURN(m->output_router_logits,
                   GetBool(j, "output_router_logits", "model.output_router_logits"));
  ASSIGN_OR_RETURN(m->router_aux_loss_coef,
                   GetDouble(j, "router_aux_loss_coef", "model.router_aux_loss_coef", 0, 1e300));
  ASSIGN_OR_RETURN(const Json* only, Member(j, "mlp_only_layers", "model.mlp_only_layers"));
  if (!only->is_array()) return KeyError("model.mlp_only_layers", "must be an array of layers");
  for (const Json& l : *only) {
    if (!l.is_number_integer()) {
      return KeyError("model.mlp_only_layers", "must be an array of layers");
    }
    m->mlp_only_layers.push_back(l.get<int64_t>());
  }
  return absl::OkStatus();
}

// Gemma's fields (families gemma2 and gemma3_text only; other families' states stay as they were).
void EncodeGemma(const ModelSpec& m, OrderedJson* j) {
  if (!m.IsGemma()) return;
  (*j)["query_pre_attn_scalar"] = m.query_pre_attn_scalar;
  (*j)["attn_logit_softcapping"] = m.attn_logit_softcapping;
  (*j)["final_logit_softcapping"] = m.final_logit_softcapping;
  (*j)["embedding_padding_idx"] = m.embedding_padding_idx;
  if (m.rope_local_base_freq > 0) (*j)["rope_local_base_freq"] = m.rope_local_base_freq;
}

absl::Status DecodeGemma(const Json& j, ModelSpec* m) {
  if (!m->IsGemma()) return absl::OkStatus();
  ASSIGN_OR_RETURN(m->query_pre_attn_scalar, GetDouble(j, "query_pre_attn_scalar",
                                                       "model.query_pre_attn_scalar", 0, 1e6));
  ASSIGN_OR_RETURN(m->attn_logit_softcapping, GetDouble(j, "attn_logit_softcapping",
                                                        "model.attn_logit_softcapping", 0, 1e6));
  ASSIGN_OR_RETURN(m->final_logit_softcapping,
                   GetDouble(j, "final_logit_softcapping", "model.final_logit_softcapping", 0, 1e6));
  ASSIGN_OR_RETURN(m->embedding_padding_idx,
                   GetInt(j, "embedding_padding_idx", "model.embedding_padding_idx", -1,
                          std::numeric_limits<int64_t>::max()));
  if (j.contains("rope_local_base_freq")) {
    ASSIGN_OR_RETURN(m->rope_local_base_freq, GetDouble(j, "rope_local_base_freq",
                                                        "model.rope_local_base_freq", 0, 1e12));
  }
  return absl::OkStatus();
}

// A vision-language model's tower and token ids, only for such a model.
void EncodeVision(const ModelSpec& m, OrderedJson* j) {
  if (!m.IsVisionLanguage()) return;
  const VisionSpec& v = m.vision;
  OrderedJson vj;
  vj["depth"] = v.depth;
  vj["hidden_size"] = v.hidden_size;
  vj["intermediate_size"] = v.intermediate_size;
  vj["num_heads"] = v.num_heads;
  vj["in_channels"] = v.in_channels;
  vj["patch_size"] = v.patch_size;
  vj["spatial_merge_size"] = v.spatial_merge_size;
  vj["temporal_patch_size"] = v.temporal_patch_size;
  vj["window_size"] = v.window_size;
  vj["out_hidden_size"] = v.out_hidden_size;
  vj["fullatt_block_indexes"] = v.fullatt_block_indexes;
  vj["rope_theta"] = v.rope_theta;
  (*j)["vision"] = vj;
  (*j)["image_token_id"] = m.image_token_id;
  (*j)["video_token_id"] = m.video_token_id;
  (*j)["vision_start_token_id"] = m.vision_start_token_id;
  (*j)["vision_end_token_id"] = m.vision_end_token_id;
}

absl::Status DecodeVision(const Json& j, ModelSpec* m) {
  if (!j.contains("vision")) return absl::OkStatus();
  constexpr int64_t kBig = std::numeric_limits<int64_t>::max();
  ASSIGN_OR_RETURN(const Json* vj, GetObject(j, "vision", "model.vision"));
  VisionSpec& v = m->vision;
  struct Field {
    const char* key;
    int64_t* slot;
  };
  const Field fields[] = {{"depth", &v.depth},
                          {"hidden_size", &v.hidden_size},
                          {"intermediate_size", &v.intermediate_size},
                          {"num_heads", &v.num_heads},
                          {"in_channels", &v.in_channels},
                          {"patch_size", &v.patch_size},
                          {"spatial_merge_size", &v.spatial_merge_size},
                          {"temporal_patch_size", &v.temporal_patch_size},
                          {"window_size", &v.window_size},
                          {"out_hidden_size", &v.out_hidden_size}};
  for (const Field& f : fields) {
    // window_size 0: a tower without windows (Qwen2-VL).
    const int64_t lo = f.slot == &v.window_size ? 0 : 1;
    ASSIGN_OR_RETURN(*f.slot, GetInt(*vj, f.key, absl::StrCat("model.vision.", f.key), lo, kBig));
  }
  ASSIGN_OR_RETURN(v.rope_theta,
                   GetDouble(*vj, "rope_theta", "model.vision.rope_theta", 0, 1e300));
  ASSIGN_OR_RETURN(const Json* full, Member(*vj, "fullatt_block_indexes",
                                            "model.vision.fullatt_block_indexes"));
  if (!full->is_array()) {
    return KeyError("model.vision.fullatt_block_indexes", "must be an array of blocks");
  }
  for (const Json& b : *full) {
    if (!b.is_number_integer()) {
      return KeyError("model.vision.fullatt_block_indexes", "must be an array of blocks");
    }
    v.fullatt_block_indexes.push_back(b.get<int64_t>());
  }
  const Field ids[] = {{"image_token_id", &m->image_token_id},
                       {"video_token_id", &m->video_token_id},
                       {"vision_start_token_id", &m->vision_start_token_id},
                       {"vision_end_token_id", &m->vision_end_token_id}};
  for (const Field& f : ids) {
    ASSIGN_OR_RETURN(*f.slot, GetInt(j, f.key, absl::StrCat("model.", f.key), 0, kBig));
  }
  return absl::OkStatus();
}

OrderedJson EncodeModel(const ModelSpec& m) {
  OrderedJson j;
  j["name"] = m.name;
  j["family"] = m.family;
  j["hidden_size"] = m.hidden_size;
  j["num_layers"] = m.num_layers;
  j["num_heads"] = m.num_heads;
  j["num_kv_heads"] = m.num_kv_heads;
  j["head_dim"] = m.head_dim;
  j["intermediate_size"] = m.intermediate_size;
  j["vocab_size"] = m.vocab_size;
  j["tie_word_embeddings"] = m.tie_word_embeddings;
  j["qkv_bias"] = m.qkv_bias;
  j["qk_norm"] = m.qk_norm;
  j["rope_theta"] = m.rope_theta;
  j["rms_norm_eps"] = m.rms_norm_eps;
  j["max_position_embeddings"] = m.max_position_embeddings;
  // Written by checkpoints since RoPE scaling is computed; older ones (without) used plain RoPE.
  j["rope_parameters"] = OrderedJson::parse(RopeParametersJson(m));
  j["sliding_window"] = m.sliding_window;
  j["sliding_layers"] = m.sliding_layers;
  EncodeMoe(m, &j);
  EncodeGemma(m, &j);
  EncodeVision(m, &j);
  return j;
}

absl::StatusOr<ModelSpec> DecodeModel(const Json& j) {
  constexpr int64_t kBig = std::numeric_limits<int64_t>::max();
  ModelSpec m;
  ASSIGN_OR_RETURN(m.name, GetString(j, "name", "model.name"));
  ASSIGN_OR_RETURN(m.family, GetString(j, "family", "model.family"));
  ASSIGN_OR_RETURN(m.hidden_size, GetInt(j, "hidden_size", "model.hidden_size", 1, kBig));
  ASSIGN_OR_RETURN(m.num_layers, GetInt(j, "num_layers", "model.num_layers", 1, kBig));
  ASSIGN_OR_RETURN(m.num_heads, GetInt(j, "num_heads", "model.num_heads", 1, kBig));
  ASSIGN_OR_RETURN(m.num_kv_heads, GetInt(j, "num_kv_heads", "model.num_kv_heads", 1, kBig));
  ASSIGN_OR_RETURN(m.head_dim, GetInt(j, "head_dim", "model.head_dim", 0, kBig));
  ASSIGN_OR_RETURN(m.intermediate_size,
                   GetInt(j, "intermediate_size", "model.intermediate_size", 1, kBig));
  ASSIGN_OR_RETURN(m.vocab_size, GetInt(j, "vocab_size", "model.vocab_size", 1, kBig));
  ASSIGN_OR_RETURN(m.tie_word_embeddings,
                   GetBool(j, "tie_word_embeddings", "model.tie_word_embeddings"));
  ASSIGN_OR_RETURN(m.qkv_bias, GetBool(j, "qkv_bias", "model.qkv_bias"));
  ASSIGN_OR_RETURN(m.qk_norm, GetBool(j, "qk_norm", "model.qk_norm"));
  ASSIGN_OR_RETURN(m.rope_theta, GetDouble(j, "rope_theta", "model.rope_theta", 0, 1e300));
  ASSIGN_OR_RETURN(m.rms_norm_eps, GetDouble(j, "rms_norm_eps", "model.rms_norm_eps", 0, 1e300));
  ASSIGN_OR_RETURN(m.max_position_embeddings,
                   GetInt(j, "max_position_embeddings", "model.max_position_embeddings", 1, kBig));
  // Before the RoPE: a vision-language model's rope_parameters carry its mrope_section.
  RETURN_IF_ERROR(DecodeVision(j, &m));
  if (auto rp = j.find("rope_parameters"); rp != j.end()) {
    if (absl::Status s = ParseRopeParametersJson(rp->dump(), &m); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("trainer.json: model.", s.message()));
    }
  }
  if (j.contains("sliding_window")) {
    ASSIGN_OR_RETURN(m.sliding_window,
                     GetInt(j, "sliding_window", "model.sliding_window", 0, kBig));
  }
  if (auto layers = j.find("sliding_layers"); layers != j.end()) {
    if (!layers->is_array()) {
      return KeyError("model.sliding_layers", "must be an array of layer indices");
    }
    for (const Json& l : *layers) {
      if (!l.is_number_integer()) {
        return KeyError("model.sliding_layers", "must be an array of layer indices");
      }
      m.sliding_layers.push_back(l.get<int64_t>());
    }
  } else if (m.sliding_window > 0) {
    // Written before the spec listed the sliding layers: those states wrote config.json with
    // every layer sliding, which is what they trained.
    for (int64_t l = 0; l < m.num_layers; ++l) m.sliding_layers.push_back(l);
  }
  RETURN_IF_ERROR(DecodeMoe(j, &m));
  RETURN_IF_ERROR(DecodeGemma(j, &m));
  RETURN_IF_ERROR(ValidateModelSpec(m, "trainer.json: model."));
  return m;
}

bool IsPlainFileName(const std::string& name) {
  return !name.empty() && name != "." && name != ".." && name.find('/') == std::string::npos &&
         name.find('\0') == std::string::npos;
}

}  // namespace

std::string EncodeCheckpointManifest(const CheckpointManifest& manifest) {
  const TrainerState& t = manifest.trainer;
  OrderedJson j;
  j["format"] = kCheckpointFormat;
  j["version"] = kCheckpointVersion;
  j["step"] = t.step;
  j["data_position"] = t.data_position;
  j["data_seed"] = t.data_seed;
  j["rng_seed"] = t.rng_seed;
  j["max_grad_norm"] = t.max_grad_norm;
  j["optimizer"] = {{"kind", t.optimizer.kind},   {"lr", t.optimizer.lr},
                    {"beta1", t.optimizer.beta1}, {"beta2", t.optimizer.beta2},
                    {"eps", t.optimizer.eps},     {"weight_decay", t.optimizer.weight_decay}};
  j["param_dtype"] = std::string(DTypeName(t.param_dtype));
  j["model"] = EncodeModel(t.model);
  j["workload"] = {{"micro_batch", t.workload.micro_batch},
                   {"seq_len", t.workload.seq_len},
                   {"world_size", t.workload.world_size},
                   {"grad_accum", t.workload.grad_accum}};
  j["plan_id"] = t.plan_id;
  OrderedJson files = OrderedJson::object();
  for (const auto& [name, size] : manifest.file_size_bytes) files[name] = {{"size_bytes", size}};
  j["files"] = std::move(files);
  // Strings come from our own structs; replace rather than throw on invalid UTF-8.
  return j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
}

absl::StatusOr<CheckpointManifest> DecodeCheckpointManifest(absl::string_view text) {
  Json j;
  try {
    j = Json::parse(text.begin(), text.end());
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("trainer.json: malformed JSON: ", e.what()));
  }
  if (!j.is_object()) return absl::InvalidArgumentError("trainer.json: must be a JSON object");
  ASSIGN_OR_RETURN(std::string format, GetString(j, "format", "format"));
  if (format != kCheckpointFormat) {
    return KeyError("format",
                    absl::StrCat("= \"", format, "\"; expected \"", kCheckpointFormat, "\""));
  }
  ASSIGN_OR_RETURN(int64_t version, GetInt(j, "version", "version", 1, 1'000'000));
  if (version != kCheckpointVersion) {
    return KeyError("version",
                    absl::StrCat("= ", version, "; this build reads version ", kCheckpointVersion));
  }
  constexpr int64_t kBig = std::numeric_limits<int64_t>::max();
  CheckpointManifest manifest;
  TrainerState& t = manifest.trainer;
  ASSIGN_OR_RETURN(t.step, GetInt(j, "step", "step", 0, kBig));
  ASSIGN_OR_RETURN(t.data_position, GetInt(j, "data_position", "data_position", 0, kBig));
  ASSIGN_OR_RETURN(t.data_seed, GetUint(j, "data_seed", "data_seed"));
  ASSIGN_OR_RETURN(t.rng_seed, GetUint(j, "rng_seed", "rng_seed"));
  ASSIGN_OR_RETURN(t.max_grad_norm, GetDouble(j, "max_grad_norm", "max_grad_norm", 0, 1e300));

  ASSIGN_OR_RETURN(const Json* opt, GetObject(j, "optimizer", "optimizer"));
  ASSIGN_OR_RETURN(t.optimizer.kind, GetString(*opt, "kind", "optimizer.kind"));
  if (!ParseOptimizer(t.optimizer.kind).has_value()) {
    return KeyError(
        "optimizer.kind",
        absl::StrCat("= \"", t.optimizer.kind, "\"; allowed: ", std::string(OptimizerAllowList())));
  }
  ASSIGN_OR_RETURN(t.optimizer.lr, GetDouble(*opt, "lr", "optimizer.lr", 0, 1e6));
  ASSIGN_OR_RETURN(t.optimizer.beta1, GetDouble(*opt, "beta1", "optimizer.beta1", 0, 1));
  ASSIGN_OR_RETURN(t.optimizer.beta2, GetDouble(*opt, "beta2", "optimizer.beta2", 0, 1));
  ASSIGN_OR_RETURN(t.optimizer.eps, GetDouble(*opt, "eps", "optimizer.eps", 0, 1));
  ASSIGN_OR_RETURN(t.optimizer.weight_decay,
                   GetDouble(*opt, "weight_decay", "optimizer.weight_decay", 0, 1e6));

  ASSIGN_OR_RETURN(std::string dtype, GetString(j, "param_dtype", "param_dtype"));
  std::optional<DType> parsed_dtype = ParseDType(dtype);
  if (!parsed_dtype.has_value()) {
    return KeyError("param_dtype", absl::StrCat("= \"", dtype, "\"; allowed: fp32, bf16, fp16"));
  }
  t.param_dtype = *parsed_dtype;

  ASSIGN_OR_RETURN(const Json* model, GetObject(j, "model", "model"));
  ASSIGN_OR_RETURN(t.model, DecodeModel(*model));

  ASSIGN_OR_RETURN(const Json* workload, GetObject(j, "workload", "workload"));
  ASSIGN_OR_RETURN(t.workload.micro_batch,
                   GetInt(*workload, "micro_batch", "workload.micro_batch", 1, kMaxMicroBatch));
  ASSIGN_OR_RETURN(t.workload.seq_len,
                   GetInt(*workload, "seq_len", "workload.seq_len", 1, kMaxSeqLen));
  ASSIGN_OR_RETURN(int64_t world,
                   GetInt(*workload, "world_size", "workload.world_size", 1, kMaxWorldSize));
  ASSIGN_OR_RETURN(int64_t accum,
                   GetInt(*workload, "grad_accum", "workload.grad_accum", 1, kMaxGradAccum));
  t.workload.world_size = static_cast<int32_t>(world);
  t.workload.grad_accum = static_cast<int32_t>(accum);
  ASSIGN_OR_RETURN(t.plan_id, GetString(j, "plan_id", "plan_id"));

  ASSIGN_OR_RETURN(const Json* files, GetObject(j, "files", "files"));
  for (const auto& [name, entry] : files->items()) {
    const std::string path = absl::StrCat("files.", name);
    if (!IsPlainFileName(name)) return KeyError(path, "is not a plain file name");
    if (!entry.is_object()) return KeyError(path, "must be an object");
    ASSIGN_OR_RETURN(int64_t size,
                     GetInt(entry, "size_bytes", absl::StrCat(path, ".size_bytes"), 0, kBig));
    manifest.file_size_bytes.emplace(name, size);
  }
  return manifest;
}

}  // namespace memplan::io
