#include "agent/client/record_json.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <type_traits>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace memplan {
namespace {

using Json = nlohmann::json;

// ---------------------------------------------------------------- enum names

// Enum spellings accepted on input (ParseBlockModeName): lower case, '-' for '_', blanks and a
// proto prefix dropped ("DTYPE_BF16", "BLOCK_MODE_HS_OFFLOAD", "HOST_MEMORY_PINNED",
// "TRAINING_KIND_LORA" and TrainingMethod.Kind's "KIND_UNSPECIFIED" read as their short names).
std::string NormaliseEnumName(absl::string_view name) {
  std::string n = absl::AsciiStrToLower(absl::StripAsciiWhitespace(name));
  std::replace(n.begin(), n.end(), '-', '_');
  for (absl::string_view prefix :
       {"dtype_", "block_mode_", "host_memory_", "training_kind_", "kind_"}) {
    if (absl::StartsWith(n, prefix)) return n.substr(prefix.size());
  }
  return n;
}

// Proto JSON (what `memplan trace submit` reads) names enums by their proto names.
std::string ProtoDTypeName(DType dtype) {
  return absl::StrCat("DTYPE_", absl::AsciiStrToUpper(std::string(DTypeName(dtype))));
}

std::string_view ProtoTrainingKindName(TrainingKind kind) {
  switch (kind) {
    case TrainingKind::kLora:
      return "LORA";
    case TrainingKind::kQlora:
      return "QLORA";
    case TrainingKind::kOsft:
      return "OSFT";
    case TrainingKind::kFull:
      break;
  }
  return "FULL";
}

// Plan enums as JSON values: a name, or the proto number (proto JSON printed with enums as ints).
constexpr BlockMode kBlockModes[] = {BlockMode::kNone, BlockMode::kCkpt, BlockMode::kSwap,
                                     BlockMode::kHsOffload};

std::optional<BlockMode> BlockModeFromJson(const Json& v) {
  if (v.is_string()) return ParseBlockModeName(v.get<std::string>());
  if (v.is_number_integer() && v.get<int64_t>() >= 1 && v.get<int64_t>() <= 4) {
    return kBlockModes[v.get<int64_t>() - 1];  // BLOCK_MODE_NONE = 1 ...
  }
  return std::nullopt;
}

std::optional<HostMemoryKind> HostMemoryFromJson(const Json& v) {
  if (v.is_string()) return ParseHostMemoryName(v.get<std::string>());
  if (v.is_number_integer() && v.get<int64_t>() == 1) return HostMemoryKind::kPinned;
  if (v.is_number_integer() && v.get<int64_t>() == 2) return HostMemoryKind::kPageable;
  return std::nullopt;
}

// TrainingMethod.Kind: KIND_UNSPECIFIED (0) is a full fine-tune.
std::optional<TrainingKind> TrainingKindFromJson(const Json& v) {
  std::string n;
  if (v.is_string()) n = NormaliseEnumName(v.get<std::string>());
  if (v.is_number_integer()) {
    constexpr const char* kByNumber[] = {"unspecified", "full", "lora", "qlora"};
    const int64_t i = v.get<int64_t>();
    if (i >= 0 && i < 4) n = kByNumber[i];
  }
  if (n == "full" || n == "unspecified") return TrainingKind::kFull;
  if (n == "lora") return TrainingKind::kLora;
  if (n == "qlora") return TrainingKind::kQlora;
  return std::nullopt;
}

// ---------------------------------------------------------------- writing

Json ToJson(const ModelSpec& m) {
  Json j{{"name", m.name},
              {"family", m.family},
              {"hidden_size", m.hidden_size},
              {"num_layers", m.num_layers},
              {"num_heads", m.num_heads},
              {"num_kv_heads", m.num_kv_heads},
              {"head_dim", m.head_dim},
              {"intermediate_size", m.intermediate_size},
              {"vocab_size", m.vocab_size},
              {"tie_word_embeddings", m.tie_word_embeddings},
              {"qkv_bias", m.qkv_bias},
              {"qk_norm", m.qk_norm},
              {"rope_theta", m.rope_theta},
              {"rms_norm_eps", m.rms_norm_eps},
              {"max_position_embeddings", m.max_position_embeddings},
              {"sliding_window", m.sliding_window},
              {"sliding_layers", m.sliding_layers}};
  // Gemma 2's fields (ModelArch's names); other families' records stay as they were.
  if (m.IsGemma()) {
    j["query_pre_attn_scalar"] = m.query_pre_attn_scalar;
    j["attn_logit_softcapping"] = m.attn_logit_softcapping;
    j["final_logit_softcapping"] = m.final_logit_softcapping;
  }
  // A mixture of experts' fields (ModelArch's names); a dense model's record stays as it was.
  if (m.IsMoe()) {
    j["num_experts"] = m.num_experts;
    j["num_experts_per_tok"] = m.num_experts_per_tok;
    j["moe_intermediate_size"] = m.moe_intermediate_size;
    j["norm_topk_prob"] = m.norm_topk_prob;
    j["decoder_sparse_step"] = m.decoder_sparse_step;
    j["mlp_only_layers"] = m.mlp_only_layers;
    j["output_router_logits"] = m.output_router_logits;
    j["router_aux_loss_coef"] = m.router_aux_loss_coef;
  }
  return j;
}

Json ToJson(const HardwareSpec& h) {
  return Json{{"name", h.name},
              {"gpu_memory_bytes", h.gpu_memory_bytes},
              {"cuda_context_bytes", h.cuda_context_bytes},
              {"h2d_pinned_bytes_per_second", h.h2d_pinned_bytes_per_second},
              {"d2h_pinned_bytes_per_second", h.d2h_pinned_bytes_per_second},
              {"h2d_pageable_bytes_per_second", h.h2d_pageable_bytes_per_second},
              {"d2h_pageable_bytes_per_second", h.d2h_pageable_bytes_per_second},
              {"bidirectional_pinned_bytes_per_second", h.bidirectional_pinned_bytes_per_second},
              {"hbm_bytes_per_second", h.hbm_bytes_per_second},
              {"matmul_bf16_flops", h.matmul_bf16_flops},
              {"matmul_fp16_flops", h.matmul_fp16_flops},
              {"matmul_fp32_flops", h.matmul_fp32_flops},
              {"nccl_allgather_bytes_per_second", h.nccl_allgather_bytes_per_second},
              {"nccl_reduce_scatter_bytes_per_second", h.nccl_reduce_scatter_bytes_per_second},
              {"nccl_allgather_under_compute_bytes_per_second",
               h.nccl_allgather_under_compute_bytes_per_second},
              {"nccl_reduce_scatter_under_compute_bytes_per_second",
               h.nccl_reduce_scatter_under_compute_bytes_per_second},
              {"cpu_adam_params_per_second", h.cpu_adam_params_per_second},
              {"host_memory_bytes", h.host_memory_bytes},
              {"pinned_limit_bytes", h.pinned_limit_bytes},
              {"measured", h.measured},
              {"nf4_dequant_bytes_per_second", h.nf4_dequant_bytes_per_second},
              {"cpu_adamw8bit_params_per_second", h.cpu_adamw8bit_params_per_second},
              {"cpu_grad_accumulate_params_per_second", h.cpu_grad_accumulate_params_per_second},
              {"cpu_adam_update_params_per_second", h.cpu_adam_update_params_per_second},
              {"cpu_adamw_bf16_params_per_second", h.cpu_adamw_bf16_params_per_second},
              {"cpu_sgd_params_per_second", h.cpu_sgd_params_per_second}};
}

Json ToJson(const Workload& w) {
  return Json{{"micro_batch", w.micro_batch},
              {"seq_len", w.seq_len},
              {"world_size", w.world_size},
              {"grad_accum", w.grad_accum},
              {"grad_clipping", w.grad_clipping}};
}

Json ToJson(const TrainingMethod& t) {
  return Json{{"kind", ProtoTrainingKindName(t.kind)},
              {"lora_rank", t.lora_rank},
              {"lora_target_modules", t.lora_target_modules}};
}

Json ToJson(const BlockTrace& b) {
  return Json{{"param_bytes", b.param_bytes},
              {"input_bytes", b.input_bytes},
              {"saved_bytes", b.saved_bytes},
              {"forward_transient_bytes", b.forward_transient_bytes},
              {"backward_transient_bytes", b.backward_transient_bytes},
              {"forward_seconds", b.forward_seconds},
              {"backward_seconds", b.backward_seconds},
              {"recompute_seconds", b.recompute_seconds}};
}

Json ToJson(const EdgeTrace& e) {
  return Json{{"param_bytes", e.param_bytes},
              {"saved_bytes", e.saved_bytes},
              {"forward_transient_bytes", e.forward_transient_bytes},
              {"backward_transient_bytes", e.backward_transient_bytes},
              {"forward_seconds", e.forward_seconds},
              {"backward_seconds", e.backward_seconds}};
}

Json ToJson(const ResidencyPlan& p) {
  Json modes = Json::array();
  for (BlockMode m : p.block_modes) modes.push_back(BlockModeName(m));
  return Json{{"chunk_bytes", p.chunk_bytes},
              {"n_chunks", p.n_chunks},
              {"n_persist", p.n_persist},
              {"n_buffer", p.n_buffer},
              {"n_swap", p.n_swap},
              {"n_checkpoint", p.n_checkpoint},
              {"n_hs_offload", p.n_hs_offload},
              {"host_memory", HostMemoryKindName(p.host_memory)},
              {"block_modes", std::move(modes)},
              {"world_size", p.world_size},
              {"layout_fingerprint", p.layout_fingerprint},
              {"shard_persistent_state", p.shard_persistent_state},
              {"shard_persistent_params", p.shard_persistent_params},
              {"vision_checkpoint", p.vision_checkpoint},
              {"head_chunk_logit_bytes", p.head_chunk_logit_bytes}};
}

Json ToJson(const MemoryBreakdown& b) {
  return Json{{"persistent_chunks_bytes", b.persistent_chunks_bytes},
              {"buffers_bytes", b.buffers_bytes},
              {"grads_bytes", b.grads_bytes},
              {"optimizer_state_bytes", b.optimizer_state_bytes},
              {"activations_bytes", b.activations_bytes},
              {"checkpoint_chain_bytes", b.checkpoint_chain_bytes},
              {"transient_bytes", b.transient_bytes},
              {"cuda_context_bytes", b.cuda_context_bytes},
              {"fragmentation_factor", b.fragmentation_factor},
              {"calibration_residual_bytes", b.calibration_residual_bytes},
              {"head_bytes", b.head_bytes},
              {"allocator_slack_bytes", b.allocator_slack_bytes},
              {"exact_bytes", b.exact_bytes}};
}

Json ToJson(const RankMemory& r) {
  return Json{{"world_size", r.world_size},
              {"local_world_size", r.local_world_size},
              {"persistent_device_bytes", r.persistent_device_bytes},
              {"persistent_state_device_bytes", r.persistent_state_device_bytes},
              {"buffer_device_bytes", r.buffer_device_bytes},
              {"persistent_gather_device_bytes", r.persistent_gather_device_bytes},
              {"chunk_host_pinned_bytes", r.chunk_host_pinned_bytes},
              {"chunk_host_pageable_bytes", r.chunk_host_pageable_bytes},
              {"node_host_bytes", r.node_host_bytes}};
}

Json ToJson(const Prediction& p) {
  return Json{{"peak_bytes", p.peak_bytes},
              {"breakdown", ToJson(p.breakdown)},
              {"load_peak_bytes", p.load_peak_bytes},
              {"host_pinned_bytes", p.host_pinned_bytes},
              {"host_pageable_bytes", p.host_pageable_bytes},
              {"iteration_seconds", p.iteration_seconds},
              {"forward_seconds", p.forward_seconds},
              {"backward_seconds", p.backward_seconds},
              {"optimizer_seconds", p.optimizer_seconds},
              {"tokens_per_second", p.tokens_per_second},
              {"rank_memory", ToJson(p.rank_memory)}};
}

// ---------------------------------------------------------------- reading

std::string CamelCase(absl::string_view snake) {
  std::string out;
  bool upper = false;
  for (char c : snake) {
    if (c == '_') {
      upper = true;
      continue;
    }
    out.push_back(upper ? absl::ascii_toupper(static_cast<unsigned char>(c)) : c);
    upper = false;
  }
  return out;
}

// Reads fields of one JSON object; the first problem is kept and names the field by its path.
// Absent and null keys keep the struct's default.
class Reader {
 public:
  Reader(const Json& object, std::string path, absl::Status* status)
      : object_(object), path_(std::move(path)), status_(status) {
    if (status_->ok() && !object_.is_object()) {
      *status_ = absl::InvalidArgumentError(absl::StrCat(Where(), " must be a JSON object"));
    }
  }

  std::string Field(absl::string_view key) const { return absl::StrCat(path_, key); }

  // The snake_case key, else its lowerCamelCase spelling (proto JSON printers use that).
  const Json* Find(absl::string_view key) const {
    if (!status_->ok() || !object_.is_object()) return nullptr;
    auto it = object_.find(std::string(key));
    if (it == object_.end()) it = object_.find(CamelCase(key));
    return it == object_.end() || it->is_null() ? nullptr : &*it;
  }

  template <typename T>
  void Get(absl::string_view key, T* out) const {
    const Json* v = Find(key);
    if (v == nullptr) return;
    if constexpr (std::is_same_v<T, bool>) {
      if (!v->is_boolean()) return Fail(key, "must be true or false");
      *out = v->get<bool>();
    } else if constexpr (std::is_integral_v<T>) {
      GetInt(key, out, std::numeric_limits<T>::min(), std::numeric_limits<T>::max());
    } else if constexpr (std::is_floating_point_v<T>) {
      // Proto JSON writes the special values as strings.
      if (v->is_string()) {
        const std::string text = v->get<std::string>();
        if (text == "NaN") return void(*out = std::numeric_limits<T>::quiet_NaN());
        if (text == "Infinity") return void(*out = std::numeric_limits<T>::infinity());
        if (text == "-Infinity") return void(*out = -std::numeric_limits<T>::infinity());
      }
      if (!v->is_number()) return Fail(key, "is not a number");
      *out = v->get<T>();
    } else {
      if (!v->is_string()) return Fail(key, "must be a string");
      *out = v->get<T>();
    }
  }

  // An integer in [lo, hi], as a number or (proto JSON's 64-bit integers) a string; outside the
  // range it is refused, never truncated.
  template <typename T>
  void GetInt(absl::string_view key, T* out, int64_t lo, int64_t hi) const {
    static_assert(std::is_signed_v<T> && sizeof(T) <= sizeof(int64_t));
    const Json* v = Find(key);
    if (v == nullptr) return;
    int64_t x = 0;
    if (v->is_string()) {
      if (!absl::SimpleAtoi(v->get<std::string>(), &x)) return Fail(key, "is not an integer");
    } else if (v->is_number_unsigned() &&
               v->get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return Fail(key, absl::StrCat("= ", v->dump(), " is outside [", lo, ", ", hi, "]"));
    } else if (v->is_number_integer()) {
      x = v->get<int64_t>();
    } else {
      return Fail(key, "is not an integer");
    }
    if (x < lo || x > hi) {
      return Fail(key, absl::StrCat("= ", x, " is outside [", lo, ", ", hi, "]"));
    }
    *out = static_cast<T>(x);
  }

  // An enum by name or proto number (`parse`); `allowed` lists the names for the error.
  template <typename E>
  void GetEnum(absl::string_view key, std::optional<E> (*parse)(const Json&),
               absl::string_view allowed, E* out) const {
    const Json* v = Find(key);
    if (v == nullptr) return;
    std::optional<E> parsed = parse(*v);
    if (!parsed.has_value()) return Fail(key, absl::StrCat("= ", v->dump(), " is not ", allowed));
    *out = *parsed;
  }

  void Fail(absl::string_view key, absl::string_view what) const {
    if (status_->ok()) {
      *status_ = absl::InvalidArgumentError(absl::StrCat(Field(key), " ", what));
    }
  }

 private:
  std::string Where() const {
    return path_.empty() ? std::string("the document") : path_.substr(0, path_.size() - 1);
  }

  const Json& object_;
  std::string path_;
  absl::Status* status_;
};

const Json& EmptyObject() {
  static const Json* empty = new Json(Json::object());
  return *empty;
}

const Json& Child(const Reader& r, absl::string_view key) {
  const Json* v = r.Find(key);
  return v == nullptr ? EmptyObject() : *v;
}

void Read(const Json& j, const std::string& path, absl::Status* s, ModelSpec* m) {
  Reader r(j, path, s);
  r.Get("name", &m->name);
  r.Get("family", &m->family);
  r.Get("hidden_size", &m->hidden_size);
  r.Get("num_layers", &m->num_layers);
  r.Get("num_heads", &m->num_heads);
  r.Get("num_kv_heads", &m->num_kv_heads);
  r.Get("head_dim", &m->head_dim);
  r.Get("intermediate_size", &m->intermediate_size);
  r.Get("vocab_size", &m->vocab_size);
  r.Get("tie_word_embeddings", &m->tie_word_embeddings);
  r.Get("qkv_bias", &m->qkv_bias);
  r.Get("qk_norm", &m->qk_norm);
  r.Get("rope_theta", &m->rope_theta);
  r.Get("rms_norm_eps", &m->rms_norm_eps);
  r.Get("max_position_embeddings", &m->max_position_embeddings);
  r.Get("sliding_window", &m->sliding_window);
  if (const Json* layers = r.Find("sliding_layers"); layers != nullptr) {
    if (!layers->is_array()) return r.Fail("sliding_layers", "must be a list");
    for (const Json& l : *layers) {
      // Proto JSON writes 64-bit integers as strings.
      int64_t index = 0;
      if (l.is_number_integer()) {
        index = l.get<int64_t>();
      } else if (!l.is_string() || !absl::SimpleAtoi(l.get<std::string>(), &index)) {
        return r.Fail("sliding_layers", "must hold layer indices");
      }
      m->sliding_layers.push_back(index);
    }
  }
  r.Get("query_pre_attn_scalar", &m->query_pre_attn_scalar);
  r.Get("attn_logit_softcapping", &m->attn_logit_softcapping);
  r.Get("final_logit_softcapping", &m->final_logit_softcapping);
  r.Get("num_experts", &m->num_experts);
  r.Get("num_experts_per_tok", &m->num_experts_per_tok);
  r.Get("moe_intermediate_size", &m->moe_intermediate_size);
  r.Get("norm_topk_prob", &m->norm_topk_prob);
  r.Get("decoder_sparse_step", &m->decoder_sparse_step);
  r.Get("output_router_logits", &m->output_router_logits);
  r.Get("router_aux_loss_coef", &m->router_aux_loss_coef);
  if (const Json* layers = r.Find("mlp_only_layers"); layers != nullptr) {
    if (!layers->is_array()) return r.Fail("mlp_only_layers", "must be a list");
    for (const Json& l : *layers) {
      int64_t index = 0;
      if (l.is_number_integer()) {
        index = l.get<int64_t>();
      } else if (!l.is_string() || !absl::SimpleAtoi(l.get<std::string>(), &index)) {
        return r.Fail("mlp_only_layers", "must hold layer indices");
      }
      m->mlp_only_layers.push_back(index);
    }
  }
}

void Read(const Json& j, const std::string& path, absl::Status* s, HardwareSpec* h) {
  Reader r(j, path, s);
  r.Get("name", &h->name);
  r.Get("gpu_memory_bytes", &h->gpu_memory_bytes);
  r.Get("cuda_context_bytes", &h->cuda_context_bytes);
  r.Get("h2d_pinned_bytes_per_second", &h->h2d_pinned_bytes_per_second);
  r.Get("d2h_pinned_bytes_per_second", &h->d2h_pinned_bytes_per_second);
  r.Get("h2d_pageable_bytes_per_second", &h->h2d_pageable_bytes_per_second);
  r.Get("d2h_pageable_bytes_per_second", &h->d2h_pageable_bytes_per_second);
  r.Get("bidirectional_pinned_bytes_per_second", &h->bidirectional_pinned_bytes_per_second);
  r.Get("hbm_bytes_per_second", &h->hbm_bytes_per_second);
  r.Get("matmul_bf16_flops", &h->matmul_bf16_flops);
  r.Get("matmul_fp16_flops", &h->matmul_fp16_flops);
  r.Get("matmul_fp32_flops", &h->matmul_fp32_flops);
  r.Get("nccl_allgather_bytes_per_second", &h->nccl_allgather_bytes_per_second);
  r.Get("nccl_reduce_scatter_bytes_per_second", &h->nccl_reduce_scatter_bytes_per_second);
  r.Get("nccl_allgather_under_compute_bytes_per_second",
        &h->nccl_allgather_under_compute_bytes_per_second);
  r.Get("nccl_reduce_scatter_under_compute_bytes_per_second",
        &h->nccl_reduce_scatter_under_compute_bytes_per_second);
  r.Get("cpu_adam_params_per_second", &h->cpu_adam_params_per_second);
  r.Get("host_memory_bytes", &h->host_memory_bytes);
  r.Get("pinned_limit_bytes", &h->pinned_limit_bytes);
  r.Get("measured", &h->measured);
  r.Get("nf4_dequant_bytes_per_second", &h->nf4_dequant_bytes_per_second);
  r.Get("cpu_adamw8bit_params_per_second", &h->cpu_adamw8bit_params_per_second);
  r.Get("cpu_grad_accumulate_params_per_second", &h->cpu_grad_accumulate_params_per_second);
  r.Get("cpu_adam_update_params_per_second", &h->cpu_adam_update_params_per_second);
  r.Get("cpu_adamw_bf16_params_per_second", &h->cpu_adamw_bf16_params_per_second);
  r.Get("cpu_sgd_params_per_second", &h->cpu_sgd_params_per_second);
}

void Read(const Json& j, const std::string& path, absl::Status* s, Workload* w) {
  Reader r(j, path, s);
  r.Get("micro_batch", &w->micro_batch);
  r.Get("seq_len", &w->seq_len);
  r.Get("world_size", &w->world_size);
  r.Get("grad_accum", &w->grad_accum);
  r.Get("grad_clipping", &w->grad_clipping);
}

void Read(const Json& j, const std::string& path, absl::Status* s, TrainingMethod* t) {
  Reader r(j, path, s);
  r.GetEnum("kind", &TrainingKindFromJson, "full, lora or qlora", &t->kind);
  r.Get("lora_rank", &t->lora_rank);
  if (const Json* modules = r.Find("lora_target_modules"); modules != nullptr) {
    if (!modules->is_array()) return r.Fail("lora_target_modules", "must be a list");
    for (const Json& m : *modules) {
      if (!m.is_string()) return r.Fail("lora_target_modules", "must hold strings");
      t->lora_target_modules.push_back(m.get<std::string>());
    }
  }
}

void Read(const Json& j, const std::string& path, absl::Status* s, BlockTrace* b) {
  Reader r(j, path, s);
  r.Get("param_bytes", &b->param_bytes);
  r.Get("input_bytes", &b->input_bytes);
  r.Get("saved_bytes", &b->saved_bytes);
  r.Get("forward_transient_bytes", &b->forward_transient_bytes);
  r.Get("backward_transient_bytes", &b->backward_transient_bytes);
  r.Get("forward_seconds", &b->forward_seconds);
  r.Get("backward_seconds", &b->backward_seconds);
  r.Get("recompute_seconds", &b->recompute_seconds);
}

void Read(const Json& j, const std::string& path, absl::Status* s, EdgeTrace* e) {
  Reader r(j, path, s);
  r.Get("param_bytes", &e->param_bytes);
  r.Get("saved_bytes", &e->saved_bytes);
  r.Get("forward_transient_bytes", &e->forward_transient_bytes);
  r.Get("backward_transient_bytes", &e->backward_transient_bytes);
  r.Get("forward_seconds", &e->forward_seconds);
  r.Get("backward_seconds", &e->backward_seconds);
}

// Plan counts are refused outside [0, kMaxPlanCount], chunk_bytes outside [0, kMaxChunkBytes].
constexpr int64_t kMaxPlanCount = int64_t{1} << 20;
constexpr int64_t kMaxChunkBytes = int64_t{1} << 44;

void Read(const Json& j, const std::string& path, absl::Status* s, ResidencyPlan* p) {
  Reader r(j, path, s);
  r.GetInt("chunk_bytes", &p->chunk_bytes, 0, kMaxChunkBytes);
  r.GetInt("n_chunks", &p->n_chunks, 0, kMaxPlanCount);
  r.GetInt("n_persist", &p->n_persist, 0, kMaxPlanCount);
  r.GetInt("n_buffer", &p->n_buffer, 0, kMaxPlanCount);
  r.GetInt("n_swap", &p->n_swap, 0, kMaxPlanCount);
  r.GetInt("n_checkpoint", &p->n_checkpoint, 0, kMaxPlanCount);
  r.GetInt("n_hs_offload", &p->n_hs_offload, 0, kMaxPlanCount);
  r.GetEnum("host_memory", &HostMemoryFromJson, "pinned or pageable", &p->host_memory);
  r.GetInt("world_size", &p->world_size, 0, kMaxPlanCount);
  r.Get("layout_fingerprint", &p->layout_fingerprint);
  r.Get("shard_persistent_state", &p->shard_persistent_state);
  r.Get("shard_persistent_params", &p->shard_persistent_params);
  r.Get("vision_checkpoint", &p->vision_checkpoint);
  // The range proper (0 or [1 MiB, 4 GiB]) is the agent's check (CheckHeadChunkLogitBytes).
  r.GetInt("head_chunk_logit_bytes", &p->head_chunk_logit_bytes, 0, kMaxChunkBytes);
  if (const Json* modes = r.Find("block_modes"); modes != nullptr) {
    if (!modes->is_array()) return r.Fail("block_modes", "must be a list");
    for (size_t i = 0; i < modes->size(); ++i) {
      const Json& m = (*modes)[i];
      std::optional<BlockMode> mode = BlockModeFromJson(m);
      if (!mode.has_value()) {
        return r.Fail(absl::StrCat("block_modes[", i, "]"),
                      absl::StrCat("= ", m.dump(), " is not none, ckpt, swap or hs_offload"));
      }
      p->block_modes.push_back(*mode);
    }
  }
}

void Read(const Json& j, const std::string& path, absl::Status* s, MemoryBreakdown* b) {
  Reader r(j, path, s);
  r.Get("persistent_chunks_bytes", &b->persistent_chunks_bytes);
  r.Get("buffers_bytes", &b->buffers_bytes);
  r.Get("grads_bytes", &b->grads_bytes);
  r.Get("optimizer_state_bytes", &b->optimizer_state_bytes);
  r.Get("activations_bytes", &b->activations_bytes);
  r.Get("checkpoint_chain_bytes", &b->checkpoint_chain_bytes);
  r.Get("transient_bytes", &b->transient_bytes);
  r.Get("cuda_context_bytes", &b->cuda_context_bytes);
  r.Get("fragmentation_factor", &b->fragmentation_factor);
  r.Get("calibration_residual_bytes", &b->calibration_residual_bytes);
  r.Get("head_bytes", &b->head_bytes);
  r.Get("allocator_slack_bytes", &b->allocator_slack_bytes);
  r.Get("exact_bytes", &b->exact_bytes);
}

void Read(const Json& j, const std::string& path, absl::Status* s, RankMemory* m) {
  Reader r(j, path, s);
  r.Get("world_size", &m->world_size);
  r.Get("local_world_size", &m->local_world_size);
  r.Get("persistent_device_bytes", &m->persistent_device_bytes);
  r.Get("persistent_state_device_bytes", &m->persistent_state_device_bytes);
  r.Get("buffer_device_bytes", &m->buffer_device_bytes);
  r.Get("persistent_gather_device_bytes", &m->persistent_gather_device_bytes);
  r.Get("chunk_host_pinned_bytes", &m->chunk_host_pinned_bytes);
  r.Get("chunk_host_pageable_bytes", &m->chunk_host_pageable_bytes);
  r.Get("node_host_bytes", &m->node_host_bytes);
}

void Read(const Json& j, const std::string& path, absl::Status* s, Prediction* p) {
  Reader r(j, path, s);
  r.Get("peak_bytes", &p->peak_bytes);
  Read(Child(r, "breakdown"), r.Field("breakdown."), s, &p->breakdown);
  r.Get("load_peak_bytes", &p->load_peak_bytes);
  r.Get("host_pinned_bytes", &p->host_pinned_bytes);
  r.Get("host_pageable_bytes", &p->host_pageable_bytes);
  r.Get("iteration_seconds", &p->iteration_seconds);
  r.Get("forward_seconds", &p->forward_seconds);
  r.Get("backward_seconds", &p->backward_seconds);
  r.Get("optimizer_seconds", &p->optimizer_seconds);
  r.Get("tokens_per_second", &p->tokens_per_second);
  if (r.Find("rank_memory") != nullptr) {
    Read(Child(r, "rank_memory"), r.Field("rank_memory."), s, &p->rank_memory);
  }
}

// A plan holder's fields but its plan (PlanFileFromJson descends to that): a PlanResponse's.
void ReadAnswer(const Json& j, const std::string& path, absl::Status* s, PlanAnswer* a) {
  Reader r(j, path, s);
  r.Get("fits", &a->fits);
  r.Get("reason", &a->reason);
  Read(Child(r, "prediction"), r.Field("prediction."), s, &a->prediction);
  r.Get("max_micro_batch", &a->max_micro_batch);
  r.Get("max_seq_len", &a->max_seq_len);
  r.Get("min_gpu_memory_bytes", &a->min_gpu_memory_bytes);
  if (const Json* alts = r.Find("alternatives"); alts != nullptr) {
    if (!alts->is_array()) return r.Fail("alternatives", "must be a list");
    for (size_t i = 0; i < alts->size() && s->ok(); ++i) {
      const std::string p = r.Field(absl::StrCat("alternatives[", i, "]."));
      PlanAlternative alt;
      Reader ar((*alts)[i], p, s);
      Read(Child(ar, "plan"), p + "plan.", s, &alt.plan);
      Read(Child(ar, "prediction"), p + "prediction.", s, &alt.prediction);
      ar.Get("note", &alt.note);
      a->alternatives.push_back(std::move(alt));
    }
  }
  r.Get("plan_id", &a->plan_id);
  r.Get("trace_id", &a->trace_id);
  r.Get("analytic_trace", &a->analytic_trace);
  r.Get("capacity_bytes", &a->capacity_bytes);
  r.Get("search_seconds", &a->search_seconds);
  r.Get("plans_evaluated", &a->plans_evaluated);
}

// What a plan was made for: "optimizer" and "training" in `j` or in its "request" object; the
// first found (outermost level first, `j` before its request) wins.
void ReadMadeFor(const Json& j, const std::string& path, absl::Status* s, PlanFile* file) {
  Reader r(j, path, s);
  const Json* request = r.Find("request");
  const std::pair<const Json*, std::string> places[] = {{&j, path}, {request, r.Field("request.")}};
  for (const auto& [object, where] : places) {
    if (object == nullptr) continue;
    Reader o(*object, where, s);
    if (!file->optimizer.has_value() && o.Find("optimizer") != nullptr) {
      std::string name;
      o.Get("optimizer", &name);
      if (!s->ok()) return;
      file->optimizer = ParseOptimizer(name);
      if (!file->optimizer.has_value()) {
        return o.Fail("optimizer", absl::StrCat("= \"", name, "\" is not one of ",
                                                std::string(OptimizerAllowList())));
      }
    }
    if (const Json* t = o.Find("training"); !file->training.has_value() && t != nullptr) {
      TrainingMethod method;
      Read(*t, o.Field("training."), s, &method);
      file->training = std::move(method);
    }
  }
}

absl::StatusOr<Json> Parse(absl::string_view text, absl::string_view what) {
  Json doc = Json::parse(text.begin(), text.end(), /*cb=*/nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) {
    return absl::InvalidArgumentError(absl::StrCat(what, " is not valid JSON"));
  }
  return doc;
}

}  // namespace

std::string PlanAnswerToJson(const PlanAnswer& a) {
  Json alternatives = Json::array();
  for (const PlanAlternative& alt : a.alternatives) {
    alternatives.push_back(Json{
        {"plan", ToJson(alt.plan)}, {"prediction", ToJson(alt.prediction)}, {"note", alt.note}});
  }
  const Json j{{"fits", a.fits},
               {"reason", a.reason},
               {"plan", ToJson(a.plan)},
               {"prediction", ToJson(a.prediction)},
               {"max_micro_batch", a.max_micro_batch},
               {"max_seq_len", a.max_seq_len},
               {"min_gpu_memory_bytes", a.min_gpu_memory_bytes},
               {"alternatives", std::move(alternatives)},
               {"plan_id", a.plan_id},
               {"trace_id", a.trace_id},
               {"analytic_trace", a.analytic_trace},
               {"capacity_bytes", a.capacity_bytes},
               {"search_seconds", a.search_seconds},
               {"plans_evaluated", a.plans_evaluated}};
  return j.dump(2) + "\n";
}

absl::StatusOr<PlanFile> PlanFileFromJson(absl::string_view json) {
  ASSIGN_OR_RETURN(const Json doc, Parse(json, "plan file"));
  absl::Status s;
  PlanFile file;
  // Descend through "plan" keys (PlanResponse -> plan, {"plan": PlanResponse} -> PlanResponse ->
  // plan): each object on the way holds the next, the last one is the plan.
  const Json* object = &doc;
  std::string path;
  const Json* holder = nullptr;
  std::string holder_path;
  for (;;) {
    ReadMadeFor(*object, path, &s, &file);
    Reader r(*object, path, &s);
    const Json* inner = r.Find("plan");
    if (inner == nullptr) break;
    holder = object;
    holder_path = path;
    bool fits = true;
    r.Get("fits", &fits);
    if (!fits && !file.does_not_fit_reason.has_value()) {
      std::string reason;
      r.Get("reason", &reason);
      file.does_not_fit_reason = reason;
    }
    object = inner;
    path += "plan.";
  }
  file.bare = holder == nullptr;
  if (holder != nullptr) ReadAnswer(*holder, holder_path, &s, &file.answer);
  // A bare plan's fields are named like a held one's ("plan.n_persist").
  Read(*object, file.bare ? "plan." : path, &s, &file.answer.plan);
  RETURN_IF_ERROR(s);
  return file;
}

absl::StatusOr<PlanAnswer> PlanAnswerFromJson(absl::string_view json) {
  ASSIGN_OR_RETURN(PlanFile file, PlanFileFromJson(json));
  if (file.bare) return absl::InvalidArgumentError("plan is missing");
  return std::move(file.answer);
}

std::string TraceToJson(const Trace& t) {
  Json blocks = Json::array();
  for (const BlockTrace& b : t.blocks) blocks.push_back(ToJson(b));
  const Json j{{"trace_id", t.trace_id},
               {"arch", ToJson(t.arch)},
               {"workload", ToJson(t.workload)},
               {"param_dtype", ProtoDTypeName(t.param_dtype)},
               {"training", ToJson(t.training)},
               {"hardware_name", t.hardware_name},
               {"analytic", t.analytic},
               {"embedding", ToJson(t.embedding)},
               {"blocks", std::move(blocks)},
               {"head", ToJson(t.head)},
               {"trainable_param_count", t.trainable_param_count},
               {"total_param_count", t.total_param_count},
               {"forward_end_bytes", t.forward_end_bytes},
               {"chunk_bytes", t.chunk_bytes},
               {"chunk_param_bytes", t.chunk_param_bytes}};
  return j.dump(2) + "\n";
}

absl::StatusOr<Trace> TraceFromJson(absl::string_view json) {
  ASSIGN_OR_RETURN(const Json doc, Parse(json, "trace file"));
  absl::Status s;
  Trace t;
  Reader r(doc, "", &s);
  r.Get("trace_id", &t.trace_id);
  Read(Child(r, "arch"), "arch.", &s, &t.arch);
  Read(Child(r, "workload"), "workload.", &s, &t.workload);
  if (r.Find("param_dtype") == nullptr && s.ok()) r.Fail("param_dtype", "is missing");
  std::string dtype;
  r.Get("param_dtype", &dtype);
  if (s.ok()) {
    std::optional<DType> parsed = ParseDType(NormaliseEnumName(dtype));
    if (!parsed.has_value()) r.Fail("param_dtype", absl::StrCat("= \"", dtype, "\" is unknown"));
    if (parsed.has_value()) t.param_dtype = *parsed;
  }
  Read(Child(r, "training"), "training.", &s, &t.training);
  r.Get("hardware_name", &t.hardware_name);
  r.Get("analytic", &t.analytic);
  Read(Child(r, "embedding"), "embedding.", &s, &t.embedding);
  if (const Json* blocks = r.Find("blocks"); blocks != nullptr) {
    if (!blocks->is_array()) {
      r.Fail("blocks", "must be a list");
    } else {
      t.blocks.resize(blocks->size());
      for (size_t i = 0; i < blocks->size(); ++i) {
        Read((*blocks)[i], absl::StrCat("blocks[", i, "]."), &s, &t.blocks[i]);
      }
    }
  }
  Read(Child(r, "head"), "head.", &s, &t.head);
  r.Get("trainable_param_count", &t.trainable_param_count);
  r.Get("total_param_count", &t.total_param_count);
  r.Get("forward_end_bytes", &t.forward_end_bytes);
  r.Get("chunk_bytes", &t.chunk_bytes);
  if (const Json* chunks = r.Find("chunk_param_bytes"); chunks != nullptr) {
    if (!chunks->is_array()) {
      r.Fail("chunk_param_bytes", "must be a list");
    } else {
      for (const Json& c : *chunks) {
        if (!c.is_number_integer()) {
          r.Fail("chunk_param_bytes", "must hold integers");
          break;
        }
        t.chunk_param_bytes.push_back(c.get<int64_t>());
      }
    }
  }
  RETURN_IF_ERROR(s);
  return t;
}

std::string HardwareSpecToJson(const HardwareSpec& hardware) {
  return ToJson(hardware).dump(2) + "\n";
}

absl::StatusOr<HardwareSpec> HardwareSpecFromJson(absl::string_view json) {
  ASSIGN_OR_RETURN(const Json doc, Parse(json, "hardware file"));
  absl::Status s;
  HardwareSpec h;
  Read(doc, "", &s, &h);
  RETURN_IF_ERROR(s);
  return h;
}

std::optional<BlockMode> ParseBlockModeName(absl::string_view name) {
  const std::string n = NormaliseEnumName(name);
  if (n == "checkpoint") return BlockMode::kCkpt;
  for (BlockMode mode : kBlockModes) {
    if (BlockModeName(mode) == n) return mode;
  }
  return std::nullopt;
}

std::optional<HostMemoryKind> ParseHostMemoryName(absl::string_view name) {
  const std::string n = NormaliseEnumName(name);
  for (HostMemoryKind kind : {HostMemoryKind::kPinned, HostMemoryKind::kPageable}) {
    if (HostMemoryKindName(kind) == n) return kind;
  }
  return std::nullopt;
}

absl::Status WriteTextFile(const std::string& path, absl::string_view contents) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) return absl::PermissionDeniedError(absl::StrCat("cannot write ", tmp));
    out.write(contents.data(), static_cast<std::streamsize>(contents.size()));
    out.flush();
    if (!out) return absl::DataLossError(absl::StrCat("writing ", tmp, " failed"));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    return absl::PermissionDeniedError(absl::StrCat("cannot rename ", tmp, " to ", path));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadTextFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::ostringstream contents;
  contents << in.rdbuf();
  if (in.bad()) return absl::DataLossError(absl::StrCat("reading ", path, " failed"));
  return contents.str();
}

}  // namespace memplan
