#include "agent/model/llama_model.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <exception>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "agent/blocks/activation_offloader.h"
#include "agent/blocks/group_runner.h"
#include "agent/model/attention.h"
#include "agent/model/block_params.h"
#include "agent/model/chunked_head.h"
#include "agent/model/layers.h"
#include "agent/model/rope.h"
#include "agent/model/osft.h"
#include "agent/model/moe.h"
#include "agent/model/normal_draw.h"
#include "agent/model/mrope.h"
#include "agent/model/sequence_tiling.h"
#include "agent/quant/nf4_linear.h"
#include "common/head_chunking.h"
#include "common/mlp_tiling.h"
#include "common/nf4_bytes.h"
#include "common/param_shapes.h"
#include "common/validate.h"

namespace memplan {

namespace {

// A leaf with the parameter's current storage: the tied head and the embedding each get one so
// that their gradients can be summed before they reach the parameter (see [Tied head gradient]).
torch::Tensor Alias(const torch::Tensor& param) {
  return param.variable_data().requires_grad_(param.requires_grad());
}

}  // namespace

LlamaModel::LlamaModel(const LlamaModelOptions& options) : options_(options) {}
LlamaModel::~LlamaModel() = default;

absl::StatusOr<std::unique_ptr<LlamaModel>> LlamaModel::Create(const LlamaModelOptions& options) {
  if (absl::Status s = ValidateModelSpec(options.spec, "spec."); !s.ok()) return s;
  if (options.lora.enabled()) {
    if (absl::Status s = ValidateLoraOptions(options.lora, options.spec); !s.ok()) return s;
  }
  if (options.lora.nf4_base && !options.lora.enabled()) {
    return absl::InvalidArgumentError(
        "lora.nf4_base (QLoRA) needs adapters: lora.rank must be >= 1");
  }
  if (options.osft.enabled()) {
    if (absl::Status s = ValidateOsftOptions(options.osft, options.spec); !s.ok()) return s;
    if (options.lora.enabled() || options.deferred_values ||
        (options.param_device.has_value() && options.param_device->is_meta())) {
      return absl::InvalidArgumentError("osft: needs the weights' values (no LoRA, meta or "
                                        "deferred parameters): the SVD reads them");
    }
  }
  if (options.device.is_cuda() && !torch::cuda::is_available()) {
    return absl::FailedPreconditionError("model: device cuda requested but CUDA is not available");
  }
  std::unique_ptr<LlamaModel> model(new LlamaModel(options));
  try {
    model->InitParams();
  } catch (const c10::Error& e) {
    return absl::ResourceExhaustedError(
        absl::StrCat("model: initialising parameters failed: ", e.what_without_backtrace()));
  }
  return model;
}

void LlamaModel::InitParams() {
  const ModelSpec& s = options_.spec;
  const int64_t d = s.HeadDim();
  // Matrices are drawn in fp32 on the CPU, each from its own generator seeded by (seed, its index
  // in canonical order), so a model has the same initial values on every device and (up to
  // rounding) every dtype, and the draws run in parallel: a 40B-parameter model in host memory
  // is built in about a minute on 16 cores instead of a quarter of an hour.
  const auto device_opts = torch::TensorOptions()
                               .dtype(ToScalarType(options_.dtype))
                               .device(options_.param_device.value_or(options_.device));
  // [LoRA] The base is frozen: autograd computes no weight gradient for it.
  const bool base_trainable = !options_.lora.enabled() && !options_.osft.enabled();
  auto finish = [&](torch::Tensor t) { return t.to(device_opts).requires_grad_(base_trainable); };
  struct Draw {
    torch::Tensor* slot;
    std::vector<int64_t> sizes;
  };
  std::vector<Draw> draws;
  // A meta model has shapes and dtypes only: nothing is drawn (a 70B layout costs no memory);
  // InitialValues() draws any part of any parameter later, as the draws below would have.
  const bool meta = device_opts.device().is_meta();
  std::vector<std::pair<torch::Tensor*, InitRecipe>> recipes;
  // deferred_values: every parameter's elements alias this one zero (stride 0, not a view).
  const bool deferred = options_.deferred_values && !meta;
  auto deferred_value = [&](const std::vector<int64_t>& sizes, torch::ScalarType dtype) {
    const torch::Tensor zero = torch::zeros({1}, device_opts.dtype(dtype));
    torch::Tensor t = torch::empty({0}, device_opts.dtype(dtype));
    t.set_(zero.storage(), 0, sizes, std::vector<int64_t>(sizes.size(), 0));
    return t;
  };
  auto make = [&](torch::Tensor* slot, InitRecipe recipe) {
    if (meta) {
      *slot = torch::empty(recipe.sizes, device_opts).requires_grad_(base_trainable);
    } else if (deferred) {
      *slot = deferred_value(recipe.sizes, ToScalarType(options_.dtype))
                  .requires_grad_(base_trainable);
    } else if (recipe.kind == InitRecipe::kNormal) {
      draws.push_back({slot, recipe.sizes});
    } else {
      *slot = finish(recipe.kind == InitRecipe::kOnes ? torch::ones(recipe.sizes)
                                                      : torch::zeros(recipe.sizes));
    }
    recipes.emplace_back(slot, std::move(recipe));
  };
  int64_t normal_draws = 0;
  auto normal = [&](torch::Tensor* slot, std::vector<int64_t> sizes) {
    make(slot, {InitRecipe::kNormal, std::move(sizes), normal_draws++});
  };
  auto ones = [&](torch::Tensor* slot, std::vector<int64_t> sizes) {
    make(slot, {InitRecipe::kOnes, std::move(sizes), -1});
  };
  auto zeros = [&](torch::Tensor* slot, std::vector<int64_t> sizes) {
    make(slot, {InitRecipe::kZeros, std::move(sizes), -1});
  };

  // Gemma scales by (1 + weight): its norms start at zero, as transformers initialises them.
  auto norm = [&](torch::Tensor* slot, std::vector<int64_t> sizes) {
    if (s.IsGemma()) return zeros(slot, std::move(sizes));
    ones(slot, std::move(sizes));
  };

  normal(&embed_tokens_, {s.vocab_size, s.hidden_size});
  for (int64_t i = 0; i < s.num_layers; ++i) {
    auto b = std::make_unique<BlockParams>();
    b->index = static_cast<int>(i);
    normal(&b->q_proj, {s.num_heads * d, s.hidden_size});
    if (s.qkv_bias) zeros(&b->q_bias, {s.num_heads * d});
    normal(&b->k_proj, {s.num_kv_heads * d, s.hidden_size});
    if (s.qkv_bias) zeros(&b->k_bias, {s.num_kv_heads * d});
    normal(&b->v_proj, {s.num_kv_heads * d, s.hidden_size});
    if (s.qkv_bias) zeros(&b->v_bias, {s.num_kv_heads * d});
    normal(&b->o_proj, {s.hidden_size, s.num_heads * d});
    if (s.qk_norm) {
      norm(&b->q_norm, {d});
      norm(&b->k_norm, {d});
    }
    if (s.IsMoeLayer(i)) {
      b->moe = std::make_unique<MoeParams>(MoeParams::Shaped(s, i));
      for (size_t t = 0; t < b->moe->tensors.size(); ++t) {
        normal(&b->moe->tensors[t], b->moe->shapes[t]);
      }
    } else {
      normal(&b->gate_proj, {s.intermediate_size, s.hidden_size});
      normal(&b->up_proj, {s.intermediate_size, s.hidden_size});
      normal(&b->down_proj, {s.hidden_size, s.intermediate_size});
    }
    norm(&b->input_layernorm, {s.hidden_size});
    norm(&b->post_attention_layernorm, {s.hidden_size});
    if (s.IsGemma()) {
      norm(&b->pre_feedforward_layernorm, {s.hidden_size});
      norm(&b->post_feedforward_layernorm, {s.hidden_size});
    }
    blocks_.push_back(std::move(b));
  }
  norm(&norm_, {s.hidden_size});
  if (!s.tie_word_embeddings) normal(&lm_head_, {s.vocab_size, s.hidden_size});
  if (s.IsVisionLanguage()) {
    // Drawn after the language model's parameters, which so draw as the text model's do.
    vision_ = std::make_unique<VisionParams>(VisionParams::Shaped(s));
    for (size_t t = 0; t < vision_->tensors.size(); ++t) {
      const std::vector<int64_t>& shape = vision_->shapes[t];
      const bool bias = absl::EndsWith(vision_->names[t], ".bias");
      if (shape.size() > 1) {
        normal(&vision_->tensors[t], shape);
      } else if (bias) {
        zeros(&vision_->tensors[t], shape);
      } else {
        ones(&vision_->tensors[t], shape);
      }
    }
  }

  // [QLoRA] Each projection weight is quantized as soon as it is drawn (in the model dtype, as a
  // bf16 checkpoint holds it), so the host never holds the unquantized base.
  std::unordered_map<torch::Tensor*, std::optional<quant::Nf4Tensor>*> quantized;
  if (options_.lora.nf4_base) {
    for (auto& b : blocks_) {
      const auto slots = b->Projections();
      for (size_t m = 0; m < slots.size(); ++m) quantized[slots[m]] = &b->nf4[m];
    }
  }
  std::mutex device_mu;  // one quantization at a time on a GPU: its transient stays one weight's
  // Workers take the draws in order; an exception (out of memory) is re-thrown on this thread.
  std::atomic<size_t> next{0};
  std::mutex error_mu;
  std::exception_ptr error;
  auto work = [&]() {
    for (size_t k = next++; k < draws.size(); k = next++) {
      try {
        torch::Tensor value = DrawNormal(draws[k].sizes, static_cast<int64_t>(k));
        auto q = quantized.find(draws[k].slot);
        if (q == quantized.end()) {
          *draws[k].slot = finish(value);
          continue;
        }
        value = value.to(device_opts.dtype());
        std::unique_lock<std::mutex> lock(device_mu, std::defer_lock);
        if (!options_.device.is_cpu()) lock.lock();
        *q->second = QuantizeBaseWeight(value);
      } catch (...) {
        std::lock_guard<std::mutex> lock(error_mu);
        if (!error) error = std::current_exception();
        next = draws.size();
      }
    }
  };
  const size_t threads = std::clamp<size_t>(std::thread::hardware_concurrency(), 1, 16);
  std::vector<std::thread> pool;
  for (size_t t = 1; t < std::min(threads, draws.size()); ++t) pool.emplace_back(work);
  work();
  for (std::thread& t : pool) t.join();
  if (error) std::rethrow_exception(error);
  if (meta || deferred) {
    // [QLoRA] on kMeta, or deferred ([Sharded NF4 loading]: a loader quantizes what the rank
    // stores, and sets the offset): the NF4 parts' shapes and dtypes ([NF4 storage]), no values.
    for (auto& [slot, nf4] : quantized) {
      if (!slot->defined()) continue;
      const Nf4PartBytes parts = Nf4Parts(slot->numel());
      auto part = [&](int64_t n, torch::ScalarType dtype) {
        return meta ? torch::empty({n}, device_opts.dtype(dtype)) : deferred_value({n}, dtype);
      };
      *nf4 = quant::Nf4Tensor{part(parts.data_bytes, torch::kUInt8),
                              part(parts.absmax_code_bytes, torch::kUInt8),
                              part(parts.absmax_scale_bytes / 4, torch::kFloat32), 0.0f,
                              slot->sizes().vec(), kNf4Blocksize};
    }
  }
  // A quantized weight's initial values under its Hugging Face name (InitialValues).
  for (const auto& b : blocks_) {
    const auto slots = b->Projections();
    for (size_t m = 0; m < slots.size(); ++m) {
      for (const auto& [slot, recipe] : recipes) {
        if (slot == slots[m] && quantized.count(slot) != 0) {
          init_recipes_[absl::StrCat("model.layers.", b->index, ".", BlockParams::ModulePath(m),
                                     ".weight")] = recipe;
        }
      }
    }
  }
  for (auto& [slot, nf4] : quantized) *slot = torch::Tensor();
  // Recipes by parameter name (the slots' tensors are the parameters Params() names).
  std::unordered_map<const void*, const InitRecipe*> by_tensor;
  for (const auto& [slot, recipe] : recipes) by_tensor[slot->unsafeGetTensorImpl()] = &recipe;
  for (const NamedParam& p : Params()) {
    auto it = by_tensor.find(p.param.unsafeGetTensorImpl());
    if (it != by_tensor.end()) init_recipes_[p.name] = *it->second;
  }
  if (options_.lora.enabled()) InitAdapters();
}

quant::Nf4Tensor LlamaModel::QuantizeBaseWeight(const torch::Tensor& value) const {
  // On the compute device (bitsandbytes quantizes where the model runs); the parts then go where
  // parameters are created.
  absl::StatusOr<quant::Nf4Tensor> q = quant::QuantizeNf4(value.to(options_.device), kNf4Blocksize);
  TORCH_CHECK(q.ok(), "quantizing a base weight: ", q.status().ToString());
  return q->To(options_.param_device.value_or(options_.device));
}

std::vector<std::string> LlamaModel::QuantizedWeightNames() const {
  std::vector<std::string> names;
  for (const auto& b : blocks_) {
    for (size_t m = 0; m < b->nf4.size(); ++m) {
      if (b->nf4[m].has_value()) {
        names.push_back(absl::StrCat("model.layers.", b->index, ".", BlockParams::ModulePath(m),
                                     ".weight"));
      }
    }
  }
  return names;
}

namespace {

// Block index and module (kLoraModuleNames index) of "model.layers.<b>.<path>.weight"; nullopt
// when `name` is no projection weight of a block below `blocks`.
std::optional<std::pair<int, size_t>> ProjectionOf(const std::string& name, int blocks) {
  for (int b = 0; b < blocks; ++b) {
    const std::string prefix = absl::StrCat("model.layers.", b, ".");
    if (name.rfind(prefix, 0) != 0) continue;
    for (size_t m = 0; m < kLoraModuleNames.size(); ++m) {
      const std::string path = absl::StrCat(m < 4 ? "self_attn." : "mlp.", kLoraModuleNames[m]);
      if (name == prefix + path + ".weight") return std::make_pair(b, m);
    }
  }
  return std::nullopt;
}

}  // namespace

absl::Status LlamaModel::LoadQuantizedWeight(const std::string& name, const torch::Tensor& value) {
  const auto where = ProjectionOf(name, num_blocks());
  if (!where || !blocks_[where->first]->nf4[where->second].has_value()) {
    return absl::NotFoundError(absl::StrCat("model: \"", name, "\" is not a quantized weight"));
  }
  quant::Nf4Tensor& held = *blocks_[where->first]->nf4[where->second];
  if (value.sizes().vec() != held.shape) {
    return absl::InvalidArgumentError(absl::StrCat("model: \"", name, "\" has shape [",
                                                   absl::StrJoin(value.sizes(), ", "),
                                                   "], the model's is [",
                                                   absl::StrJoin(held.shape, ", "), "]"));
  }
  try {
    torch::NoGradGuard no_grad;
    const quant::Nf4Tensor q = QuantizeBaseWeight(value.to(ToScalarType(options_.dtype)));
    held.data.copy_(q.data);
    held.absmax_code.copy_(q.absmax_code);
    held.absmax_scale.copy_(q.absmax_scale);
    held.absmax_offset = q.absmax_offset;
  } catch (const c10::Error& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("model: quantizing \"", name, "\": ", e.what_without_backtrace()));
  }
  return absl::OkStatus();
}

absl::Status LlamaModel::SetQuantizedOffset(const std::string& name, float offset) {
  const auto where = ProjectionOf(name, num_blocks());
  if (!where || !blocks_[where->first]->nf4[where->second].has_value()) {
    return absl::NotFoundError(absl::StrCat("model: \"", name, "\" is not a quantized weight"));
  }
  blocks_[where->first]->nf4[where->second]->absmax_offset = offset;
  return absl::OkStatus();
}

absl::StatusOr<std::vector<NamedParam>> LlamaModel::DequantizedBase(
    const std::vector<NamedParam>& base) const {
  std::unordered_map<std::string, torch::Tensor> by_name;
  for (const NamedParam& p : base) by_name.emplace(p.name, p.param);
  std::vector<NamedParam> out;
  for (const NamedParam& p : base) {
    if (!IsNf4PartName(p.name)) out.push_back(p);
    if (!p.name.ends_with(kNf4DataSuffix)) continue;  // one weight per data part
    const std::string weight = p.name.substr(0, p.name.size() - kNf4DataSuffix.size());
    const auto where = ProjectionOf(weight, num_blocks());
    auto code = by_name.find(weight + std::string(kNf4AbsmaxCodeSuffix));
    auto scale = by_name.find(weight + std::string(kNf4AbsmaxScaleSuffix));
    if (!where || !blocks_[where->first]->nf4[where->second].has_value() ||
        code == by_name.end() || scale == by_name.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("base: \"", p.name, "\" without its NF4 parts or not this model's"));
    }
    const quant::Nf4Tensor& held = *blocks_[where->first]->nf4[where->second];
    const quant::Nf4Tensor q{p.param, code->second, scale->second, held.absmax_offset, held.shape,
                             held.blocksize};
    if (absl::Status s = quant::ValidateNf4(q); !s.ok()) return s;
    out.push_back({weight, quant::DequantizeNf4(q, ToScalarType(options_.dtype))});
  }
  return out;
}


uint64_t LlamaModel::DrawSeed(int64_t k) const {
  return options_.seed * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(k) + 1;
}

torch::Tensor LlamaModel::DrawNormal(const std::vector<int64_t>& sizes, int64_t k) const {
  int64_t numel = 1;
  for (int64_t d : sizes) numel *= d;
  // Create draws parameters on several threads already: one thread per draw.
  return DrawNormalRange(DrawSeed(k), numel, 0, numel, /*max_threads=*/1).view(sizes);
}

absl::StatusOr<torch::Tensor> LlamaModel::InitialValues(const std::string& name, int64_t begin,
                                                        int64_t len) const {
  auto it = init_recipes_.find(name);
  if (it == init_recipes_.end()) {
    return absl::NotFoundError(absl::StrCat("model: no base parameter \"", name, "\""));
  }
  const InitRecipe& r = it->second;
  int64_t numel = 1;
  for (int64_t d : r.sizes) numel *= d;
  if (begin < 0 || len < 0 || begin + len > numel) {
    return absl::OutOfRangeError(absl::StrCat("model: elements [", begin, ", ", begin + len,
                                              ") of \"", name, "\", which has ", numel));
  }
  try {
    // Only the segments around the range are drawn ([Segmented draws]), each rounded to the model
    // dtype exactly as Create rounds it, into the result (no fp32 copy of the range).
    const torch::ScalarType dtype = ToScalarType(options_.dtype);
    if (r.kind == InitRecipe::kNormal) {
      return DrawNormalRange(DrawSeed(r.draw), numel, begin, len, at::get_num_threads(), dtype);
    }
    return r.kind == InitRecipe::kOnes ? torch::ones({len}, dtype) : torch::zeros({len}, dtype);
  } catch (const c10::Error& e) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "model: drawing the initial value of \"", name, "\": ", e.what_without_backtrace()));
  }
}

// [LoRA] A is U(-1/sqrt(in), 1/sqrt(in)), what kaiming_uniform_(a = sqrt(5)) draws for a [r, in]
// weight (gain sqrt(1/3) times sqrt(3 / fan_in)); B is zero, so the model starts as its base.
// Each A has its own generator seeded from (seed, its index in AdapterGroups() order), a stream
// apart from the base draws, so the adapters do not depend on the base's initialisation.
void LlamaModel::InitAdapters() {
  const ModelSpec& s = options_.spec;
  const int64_t d = s.HeadDim();
  const int64_t r = options_.lora.rank;
  const auto opts = torch::TensorOptions()
                        .dtype(ToScalarType(options_.dtype))
                        .device(options_.param_device.value_or(options_.device));
  const bool meta = opts.device().is_meta();
  // (in, out) of each projection, kLoraModuleNames order.
  const std::array<std::pair<int64_t, int64_t>, kLoraModuleNames.size()> dims = {{
      {s.hidden_size, s.num_heads * d},
      {s.hidden_size, s.num_kv_heads * d},
      {s.hidden_size, s.num_kv_heads * d},
      {s.num_heads * d, s.hidden_size},
      {s.hidden_size, s.intermediate_size},
      {s.hidden_size, s.intermediate_size},
      {s.intermediate_size, s.hidden_size},
  }};
  uint64_t k = 0;
  for (auto& b : blocks_) {
    for (size_t m = 0; m < kLoraModuleNames.size(); ++m) {
      if (!options_.lora.Targets(kLoraModuleNames[m])) continue;
      const auto [in, out] = dims[m];
      if (meta) {
        b->lora_a[m] = torch::empty({r, in}, opts);
      } else {
        auto gen = at::make_generator<at::CPUGeneratorImpl>(
            (options_.seed ^ 0x4C6F5241ull) * 0x9E3779B97F4A7C15ull + ++k);
        const double bound = 1.0 / std::sqrt(static_cast<double>(in));
        b->lora_a[m] = at::empty({r, in}, torch::kFloat32).uniform_(-bound, bound, gen).to(opts);
      }
      b->lora_b[m] = meta ? torch::empty({out, r}, opts) : torch::zeros({out, r}, opts);
      b->lora_a[m].requires_grad_(true);
      b->lora_b[m].requires_grad_(true);
    }
  }
}

// Groups and their order are [Parameter order] (common/param_shapes.h), the list the planner
// packs, so the chunk manager builds the planner's layout by construction.
memplan::ParamGroups LlamaModel::ParamGroups() const {
  std::unordered_map<std::string, torch::Tensor> by_name;
  by_name.emplace("model.embed_tokens.weight", embed_tokens_);
  if (vision_) {
    for (NamedParam& p : vision_->Named()) by_name.emplace(std::move(p.name), std::move(p.param));
  }
  for (const auto& b : blocks_) {
    for (NamedParam& p : b->Named()) by_name.emplace(std::move(p.name), std::move(p.param));
  }
  by_name.emplace("model.norm.weight", norm_);
  if (lm_head_.defined()) by_name.emplace("lm_head.weight", lm_head_);
  memplan::ParamGroups groups(static_cast<size_t>(num_groups()));
  size_t listed = 0;
  // [QLoRA] a quantized weight's place holds its NF4 parts (QloraBaseLayoutParams, the list the
  // planner packs for QLoRA).
  std::vector<std::pair<std::string, int>> order;
  if (options_.lora.nf4_base) {
    for (const LayoutParam& p :
         QloraBaseLayoutParams(options_.spec, torch::elementSize(ToScalarType(options_.dtype)))) {
      order.emplace_back(p.name, p.group);
    }
  } else {
    for (const ParamShape& p : HfParamShapes(options_.spec)) order.emplace_back(p.name, p.group);
  }
  if (osft_split_) {
    order = ExpandOsftOrder(order, [&by_name](const std::string& n) { return by_name.count(n) > 0; });
  }
  for (const auto& [name, group] : order) {
    auto it = by_name.find(name);
    TORCH_INTERNAL_ASSERT(it != by_name.end() && group >= 0 && group < num_groups(),
                          "[Parameter order] lists ", name, ", which the model lacks");
    groups[static_cast<size_t>(group)].push_back({name, it->second});
    ++listed;
  }
  TORCH_INTERNAL_ASSERT(listed == by_name.size(), "the model has parameters that ",
                        "[Parameter order] does not list");
  // A tied head reads the embedding's tensor: listed again in the last group, packed once.
  if (!lm_head_.defined()) groups.back().push_back({"model.embed_tokens.weight", embed_tokens_});
  return groups;
}

memplan::ParamGroups LlamaModel::AdapterGroups() const {
  memplan::ParamGroups groups(static_cast<size_t>(num_groups()));
  for (const auto& b : blocks_) groups[static_cast<size_t>(b->index + 1)] = b->NamedAdapters();
  return groups;
}

std::vector<NamedParam> LlamaModel::TrainableParams() const {
  if (!has_lora() && !has_osft()) return Params();
  std::vector<NamedParam> out;
  for (auto& group : AdapterGroups()) {
    for (auto& p : group) out.push_back(std::move(p));
  }
  return out;
}

std::vector<NamedParam> LlamaModel::Params() const {
  // By TensorImpl: a mixture of experts has tens of thousands of parameters, and a pairwise
  // is_same scan over them is quadratic.
  std::vector<NamedParam> out;
  std::unordered_set<const c10::TensorImpl*> seen;
  for (auto& group : ParamGroups()) {
    for (auto& p : group) {
      if (seen.insert(p.param.unsafeGetTensorImpl()).second) out.push_back(std::move(p));
    }
  }
  return out;
}

namespace {

// [RoPE parity] The inverse frequencies use the same tensor operations, in the same order and
// precision, as transformers' RoPE initialisers (modeling_rope_utils.py), so cos and sin are
// bit-identical to theirs: Python's `number / tensor` is `tensor.reciprocal() * number` (RDiv, one
// rounding more than a division), and dynamic scaling's run-time base is a float32 tensor.
torch::Tensor RDiv(double number, const torch::Tensor& t) { return t.reciprocal() * number; }

// transformers' yarn attention scale: 0.1 * mscale * ln(scale) + 1 above scale 1.
double YarnMscale(double scale, double mscale) {
  return scale <= 1 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0;
}

}  // namespace

LlamaModel::Rope LlamaModel::MakeRope(int64_t seq_len, const torch::Tensor& mrope_positions) const {
  const ModelSpec& s = options_.spec;
  const RopeScaling& r = s.rope_scaling;
  const int64_t d = s.HeadDim();
  // Like transformers, the frequencies are computed on the CPU at model creation (dynamic
  // scaling's run-time update aside), and the angles and cos/sin on the compute device.
  const auto f32 = torch::TensorOptions().dtype(torch::kFloat32);
  const auto i64 = torch::TensorOptions().dtype(torch::kLong);
  // arange(0, dim, 2) / dim in fp32, where every initialiser starts.
  const torch::Tensor exponent = torch::arange(0, d, 2, i64).to(torch::kFloat32) / d;
  const double dim_power = static_cast<double>(d) / static_cast<double>(d - 2);
  torch::Tensor inv_freq;
  double attention_scaling = 1.0;
  if (r.type == "dynamic" && seq_len > s.max_position_embeddings) {
    // The forward-time update for a sequence beyond max_position_embeddings: the base rescaled
    // for the current length, computed on fp32 tensors as transformers does.
    const torch::Tensor len = torch::scalar_tensor(seq_len, i64.device(options_.device));
    const torch::Tensor base =
        ((len * r.factor) / s.max_position_embeddings - (r.factor - 1)).pow(dim_power) *
        s.rope_theta;
    inv_freq = RDiv(1.0, torch::pow(base, exponent.to(options_.device)));
  } else if (r.type == "dynamic") {
    const double max_pos = static_cast<double>(s.max_position_embeddings);
    const double base =
        s.rope_theta * std::pow((r.factor * max_pos / max_pos) - (r.factor - 1), dim_power);
    inv_freq = RDiv(1.0, torch::pow(base, exponent));
  } else if (r.type == "yarn") {
    const double base = s.rope_theta;
    const double orig = static_cast<double>(r.original_max_position_embeddings);
    attention_scaling = r.attention_factor;
    if (attention_scaling <= 0) {
      attention_scaling =
          r.mscale > 0 && r.mscale_all_dim > 0
              ? YarnMscale(r.factor, r.mscale) / YarnMscale(r.factor, r.mscale_all_dim)
              : YarnMscale(r.factor, 1.0);
    }
    // The dimension index at which a frequency completes `rotations` turns over the original
    // context; the ramp between the two bounds blends interpolated and extrapolated frequencies.
    auto correction_dim = [&](double rotations) {
      return (static_cast<double>(d) * std::log(orig / (rotations * 2 * M_PI))) /
             (2 * std::log(base));
    };
    double low = correction_dim(r.beta_fast);
    double high = correction_dim(r.beta_slow);
    if (r.truncate) {
      low = std::floor(low);
      high = std::ceil(high);
    }
    low = std::max(low, 0.0);
    high = std::min(high, static_cast<double>(d - 1));
    if (low == high) high += 0.001;
    const torch::Tensor ramp = torch::clamp((torch::arange(d / 2, f32) - low) / (high - low), 0, 1);
    const torch::Tensor pos_freqs = torch::pow(base, exponent);
    const torch::Tensor extrapolation = RDiv(1.0, pos_freqs);
    const torch::Tensor interpolation = RDiv(1.0, pos_freqs * r.factor);
    const torch::Tensor extrapolation_factor = 1 - ramp;
    inv_freq = interpolation * (1 - extrapolation_factor) + extrapolation * extrapolation_factor;
  } else {
    inv_freq = RDiv(1.0, torch::pow(s.rope_theta, exponent));
    if (r.type == "linear") inv_freq = inv_freq / r.factor;
    if (r.type == "llama3") {
      // Long wavelengths divided by factor, short ones kept, the band between blended.
      const double old_context = static_cast<double>(r.original_max_position_embeddings);
      const double low_wavelen = old_context / r.low_freq_factor;
      const double high_wavelen = old_context / r.high_freq_factor;
      const torch::Tensor wavelen = RDiv(2 * M_PI, inv_freq);
      const torch::Tensor scaled = torch::where(wavelen > low_wavelen, inv_freq / r.factor, inv_freq);
      const torch::Tensor smooth = (RDiv(old_context, wavelen) - r.low_freq_factor) /
                                   (r.high_freq_factor - r.low_freq_factor);
      const torch::Tensor smoothed = (1 - smooth) * scaled / r.factor + smooth * scaled;
      const torch::Tensor medium =
          torch::logical_not(wavelen < high_wavelen) * torch::logical_not(wavelen > low_wavelen);
      inv_freq = torch::where(medium, smoothed, scaled);
    }
  }
  const auto dtype = ToScalarType(options_.dtype);
  // cos and sin of the angles `freqs` (both halves), scaled, in the model dtype; the sin table's
  // first half negated (Rope::sin).
  auto rotation = [dtype](const torch::Tensor& freqs, double scaling, torch::Tensor* cos,
                          torch::Tensor* sin) {
    const torch::Tensor emb = torch::cat({freqs, freqs}, -1);
    *cos = (emb.cos() * scaling).to(dtype);
    const torch::Tensor half_sin = freqs.sin();
    *sin = (torch::cat({-half_sin, half_sin}, -1) * scaling).to(dtype);
  };
  Rope rope;
  if (mrope_positions.defined()) {
    rotation(
        MropeAngles(mrope_positions.to(options_.device), inv_freq, s.mrope_section).unsqueeze(1),
        attention_scaling, &rope.cos, &rope.sin);
    return rope;
  }
  const torch::Tensor positions =
      torch::arange(seq_len, i64.device(options_.device)).to(torch::kFloat32);
  rotation(positions.unsqueeze(1) * inv_freq.to(options_.device), attention_scaling, &rope.cos,
           &rope.sin);
  if (s.rope_local_base_freq > 0) {
    // Gemma 3's sliding layers: the default frequencies of their own base, never scaled.
    const torch::Tensor local = RDiv(1.0, torch::pow(s.rope_local_base_freq, exponent));
    rotation(positions.unsqueeze(1) * local.to(options_.device), 1.0, &rope.local_cos,
             &rope.local_sin);
  }
  return rope;
}

absl::Status LlamaModel::CheckSequenceLength(int64_t seq_len) const {
  return memplan::CheckSequenceLength(options_.spec, seq_len);
}

torch::Tensor LlamaModel::Embed(const torch::Tensor& input_ids, const torch::Tensor& weight) const {
  if (options_.spec.IsGemma()) return GemmaEmbed(input_ids, weight);
  return at::embedding(weight, input_ids);
}

// [Vision-language inputs] transformers' order: the token embeddings, then the vision tower, whose
// merged patches replace the embeddings of the image tokens (masked_scatter, row-major), and
// M-RoPE positions computed from the same ids and grids (MropePositions checks that they agree).
LlamaModel::Rope LlamaModel::InputRope(const torch::Tensor& input_ids,
                                       const VisionInputs& images) const {
  TORCH_CHECK(vision_ || images.num_images() == 0, "images given to ", options_.spec.family,
              ", which has no vision tower");
  if (!vision_) return MakeRope(input_ids.size(1));
  absl::StatusOr<torch::Tensor> positions =
      MropePositions(options_.spec, input_ids, images.image_grid_thw);
  TORCH_CHECK(positions.ok(), positions.status().ToString());
  return MakeRope(input_ids.size(1), *positions);
}

torch::Tensor LlamaModel::EmbedInputs(const torch::Tensor& input_ids, const torch::Tensor& weight,
                                      const VisionInputs& images) const {
  const torch::Tensor embeds = Embed(input_ids, weight);
  if (!vision_ || images.num_images() == 0) return embeds;
  const torch::Tensor features =
      VisionTowerForward(options_.spec, *vision_, images, options_.vision_checkpoint)
          .to(embeds.scalar_type());
  const torch::Tensor mask = (input_ids == options_.spec.image_token_id).unsqueeze(-1);
  return embeds.masked_scatter(mask, features);
}

torch::Tensor LlamaModel::BlockParams::Project(const torch::Tensor& in, size_t module,
                                               const torch::Tensor& w, const torch::Tensor& b,
                                               double dropout, double scaling) const {
  // [QLoRA] the NF4 weight dequantized for this product only (agent/quant/nf4_linear.h).
  if (osft[module]) return OsftLinear(in, *osft[module], b);
  const torch::Tensor base =
      nf4[module].has_value() ? quant::Nf4Linear(in, *nf4[module], b) : Linear(in, w, b);
  if (!lora_a[module].defined()) return base;
  const torch::Tensor dropped = dropout > 0 ? at::dropout(in, dropout, /*train=*/true) : in;
  return base + Linear(Linear(dropped, lora_a[module]), lora_b[module]) * scaling;
}

torch::Tensor LlamaModel::Block(const BlockParams& p, const torch::Tensor& hidden,
                                const Rope& rope, bool train, MoeRouterLoss* router_loss) const {
  const ModelSpec& s = options_.spec;
  const int64_t batch = hidden.size(0);
  const int64_t seq = hidden.size(1);
  const int64_t d = s.HeadDim();
  // [LoRA] PEFT's LoraLayer.forward: result + lora_B(lora_A(dropout(x))) * scaling, in that order
  // of operations. The dropout draws from the default generator of x's device, whose state
  // agent/blocks restores when CKPT/HS_OFFLOAD recompute the block, so the recompute draws the
  // forward's masks.
  const double dropout = train ? options_.lora.dropout : 0.0;
  const double scaling = has_lora() ? options_.lora.scaling() : 1.0;
  if (s.IsGemma()) return GemmaBlock(p, hidden, rope, dropout, scaling);
  auto proj = [&p, dropout, scaling](const torch::Tensor& in, size_t module, const torch::Tensor& w,
                                     const torch::Tensor& b = torch::Tensor()) {
    return p.Project(in, module, w, b, dropout, scaling);
  };

  const torch::Tensor x = RmsNorm(hidden, p.input_layernorm, s.rms_norm_eps);
  torch::Tensor q = proj(x, 0, p.q_proj, p.q_bias).view({batch, seq, s.num_heads, d});
  torch::Tensor k = proj(x, 1, p.k_proj, p.k_bias).view({batch, seq, s.num_kv_heads, d});
  torch::Tensor v = proj(x, 2, p.v_proj, p.v_bias).view({batch, seq, s.num_kv_heads, d});
  if (s.qk_norm) {
    q = RmsNorm(q, p.q_norm, s.rms_norm_eps);
    k = RmsNorm(k, p.k_norm, s.rms_norm_eps);
  }
  // [Fused RoPE] on the [B, S, heads, head_dim] projections, then the heads-first view.
  q = ApplyRope(q, rope.cos, rope.sin).transpose(1, 2);
  k = ApplyRope(k, rope.cos, rope.sin).transpose(1, 2);
  v = v.transpose(1, 2);
  const torch::Tensor attn = CausalAttention(q, k, v, s.LayerWindow(p.index));
  const torch::Tensor attn_out =
      proj(attn.transpose(1, 2).reshape({batch, seq, s.num_heads * d}), 3, p.o_proj);
  const torch::Tensor h = hidden + attn_out;

  const torch::Tensor y = RmsNorm(h, p.post_attention_layernorm, s.rms_norm_eps);
  if (p.moe) return h + MoeMlp(s, *p.moe, y, router_loss, options_.moe_experts);
  return h + GatedMlp(p, y, /*gelu_tanh=*/false, dropout, scaling);
}

torch::Tensor LlamaModel::GatedMlp(const BlockParams& p, const torch::Tensor& y, bool gelu_tanh,
                                   double dropout, double scaling) const {
  // By value but for the block's parameters: the sequence-tiled MLP calls it again in backward.
  // Gate before up, as transformers evaluates them: with LoRA dropout each draws a mask, and the
  // order of the draws is part of the result.
  auto mlp = [&p, dropout, scaling, gelu_tanh](const torch::Tensor& in) {
    const torch::Tensor g = p.Project(in, 4, p.gate_proj, torch::Tensor(), dropout, scaling);
    const torch::Tensor up = p.Project(in, 5, p.up_proj, torch::Tensor(), dropout, scaling);
    const torch::Tensor product =
        GatedProduct(g, up, gelu_tanh ? GateActivation::kGeluTanh : GateActivation::kSilu);
    return p.Project(product, 6, p.down_proj, torch::Tensor(), dropout, scaling);
  };
  // [Sequence-tiled MLP] (common/mlp_tiling.h); an explicit mlp_tile_rows (tests) forces it.
  const int64_t rows = y.size(0) * y.size(1);
  const int64_t forced = options_.mlp_tile_rows;
  const int64_t tile_rows =
      forced != 0
          ? forced
          : MlpTileRows(rows, options_.spec.intermediate_size, DTypeBytes(options_.dtype));
  return tile_rows > 0 && tile_rows < rows ? SequenceTiled(mlp, y, tile_rows) : mlp(y);
}

torch::Tensor LlamaModel::HeadLoss(const torch::Tensor& hidden, const torch::Tensor& targets,
                                   const torch::Tensor& head_weight) const {
  const torch::Tensor x = FinalNorm(hidden);
  // An explicit head_chunk_rows (tests) forces chunking beyond that many tokens; otherwise the
  // rule the planner prices (common/head_chunking.h).
  const ModelSpec& s = options_.spec;
  const int64_t tokens = x.numel() / x.size(-1);
  const int64_t forced = options_.head_chunk_rows;
  const int64_t logit_bytes = options_.head_chunk_logit_bytes;
  const int64_t rows = forced > 0 ? forced : HeadChunkRows(s.vocab_size, logit_bytes);
  if (forced > 0 ? tokens > forced
                 : HeadIsChunked(tokens, s.vocab_size, s.hidden_size, logit_bytes)) {
    return ChunkedHeadLoss(x, head_weight, targets, rows, s.final_logit_softcapping);
  }
  const torch::Tensor logits = CapLogits(Linear(x, head_weight)).to(torch::kFloat32);
  // Hugging Face's ForCausalLMLoss given shift_labels: the sum over non-ignored positions divided
  // by their count, in fp32.
  return at::cross_entropy_loss(logits.view({-1, logits.size(-1)}), targets.reshape({-1}),
                                /*weight=*/{}, at::Reduction::Mean, /*ignore_index=*/-100,
                                /*label_smoothing=*/0.0);
}

torch::Tensor LlamaModel::Logits(const torch::Tensor& input_ids, const VisionInputs& images) {
  TORCH_CHECK(input_ids.dim() == 2, "Logits: input_ids must be [batch, seq]");
  const absl::Status seq_ok = CheckSequenceLength(input_ids.size(1));
  TORCH_CHECK(seq_ok.ok(), seq_ok.ToString());
  const Rope rope = InputRope(input_ids, images);
  torch::Tensor h = EmbedInputs(input_ids, embed_tokens_, images);
  for (const auto& b : blocks_) h = Block(*b, h, rope, /*train=*/false);
  return CapLogits(Linear(FinalNorm(h), lm_head_.defined() ? lm_head_ : embed_tokens_));
}

torch::Tensor LlamaModel::Loss(const torch::Tensor& input_ids, const torch::Tensor& targets,
                               const VisionInputs& images) {
  TORCH_CHECK(input_ids.dim() == 2 && targets.sizes() == input_ids.sizes(),
              "Loss: input_ids and targets must be [batch, seq] of the same shape");
  const absl::Status seq_ok = CheckSequenceLength(input_ids.size(1));
  TORCH_CHECK(seq_ok.ok(), seq_ok.ToString());
  const Rope rope = InputRope(input_ids, images);
  // [Router load balance] (agent/model/moe.h)
  std::optional<MoeRouterLoss> router_loss;
  if (options_.spec.HasRouterAuxLoss()) router_loss.emplace(options_.spec);
  MoeRouterLoss* aux = router_loss ? &*router_loss : nullptr;
  torch::Tensor h = EmbedInputs(input_ids, embed_tokens_, images);
  for (const auto& b : blocks_) h = Block(*b, h, rope, /*train=*/true, aux);
  const torch::Tensor loss = HeadLoss(h, targets, lm_head_.defined() ? lm_head_ : embed_tokens_);
  return aux != nullptr ? aux->AddTo(loss) : loss;
}

// [Tied head gradient] With tied embeddings the plain graph sums the head's and the embedding's
// contributions first and adds that sum to .grad once (G + (h + e)). Run as two groups, each
// would accumulate separately ((G + h) + e), which differs in the last bit once G is non-zero
// (gradient accumulation). So both groups use aliases of the weight, and the embedding group's
// backward adds h + e to the parameter's .grad itself.
torch::Tensor LlamaModel::Loss(const torch::Tensor& input_ids, const torch::Tensor& targets,
                               const BlockModes& modes, ParamResidency* residency,
                               ActivationOffloader* offloader, const VisionInputs& images) {
  TORCH_CHECK(input_ids.dim() == 2 && targets.sizes() == input_ids.sizes(),
              "Loss: input_ids and targets must be [batch, seq] of the same shape");
  const absl::Status seq_ok = CheckSequenceLength(input_ids.size(1));
  TORCH_CHECK(seq_ok.ok(), seq_ok.ToString());
  TORCH_CHECK(static_cast<int>(modes.size()) == num_blocks(), "Loss: got ", modes.size(),
              " block modes for ", num_blocks(), " blocks");
  bool needs_offloader = false;
  for (BlockMode m : modes) {
    needs_offloader = needs_offloader || m == BlockMode::kSwap || m == BlockMode::kHsOffload;
  }
  if (needs_offloader && offloader == nullptr) {
    if (!default_offloader_) {
      ActivationOffloadOptions o;
      o.device = options_.device;
      auto created = ActivationOffloader::Create(o);
      TORCH_CHECK(created.ok(), "Loss: ", created.status().ToString());
      default_offloader_ = std::move(created).value();
    }
    offloader = default_offloader_.get();
  }
  const GroupRunnerOptions run{residency, offloader};
  const Rope rope = InputRope(input_ids, images);
  // [Router load balance] (agent/model/moe.h): every block records its routing, recomputes too.
  std::shared_ptr<MoeRouterLoss> router_loss;
  if (options_.spec.HasRouterAuxLoss()) router_loss = std::make_shared<MoeRouterLoss>(options_.spec);
  const bool tied = !lm_head_.defined();

  struct TiedState {
    torch::Tensor embed_alias;
    torch::Tensor head_alias;
    torch::Tensor head_grad;
  };
  auto tied_state = std::make_shared<TiedState>();

  GroupSpec embed;
  embed.group = 0;
  embed.body = [this, tied, tied_state, images](const torch::Tensor& ids) {
    if (!tied) return EmbedInputs(ids, embed_tokens_, images);
    tied_state->embed_alias = Alias(embed_tokens_);
    return EmbedInputs(ids, tied_state->embed_alias, images);
  };
  if (tied) {
    embed.before_backward = [this, tied_state] {
      tied_state->embed_alias.set_data(embed_tokens_.variable_data());
    };
    embed.after_backward = [this, tied_state] {
      torch::Tensor sum = tied_state->embed_alias.grad();
      if (tied_state->head_grad.defined()) {
        sum = sum.defined() ? tied_state->head_grad + sum : tied_state->head_grad;
      }
      tied_state->embed_alias.reset();
      tied_state->head_grad.reset();
      if (!sum.defined()) return;
      torch::Tensor& grad = embed_tokens_.mutable_grad();
      if (grad.defined()) {
        grad.add_(sum);
      } else {
        grad = sum;
      }
    };
  }
  torch::Tensor h = RunGroup(embed, input_ids, run);

  for (int i = 0; i < num_blocks(); ++i) {
    GroupSpec block;
    block.group = i + 1;
    block.mode = modes[i];
    const BlockParams* params = blocks_[i].get();
    block.body = [this, params, rope, router_loss](const torch::Tensor& x) {
      return Block(*params, x, rope, true, router_loss.get());
    };
    h = RunGroup(block, h, run);
  }

  GroupSpec head;
  head.group = num_blocks() + 1;
  head.body = [this, tied, tied_state, targets](const torch::Tensor& x) {
    if (!tied) return HeadLoss(x, targets, lm_head_);
    tied_state->head_alias = Alias(embed_tokens_);
    return HeadLoss(x, targets, tied_state->head_alias);
  };
  if (tied) {
    head.before_backward = [this, tied_state] {
      tied_state->head_alias.set_data(embed_tokens_.variable_data());
    };
    head.after_backward = [tied_state] {
      tied_state->head_grad = tied_state->head_alias.grad();
      tied_state->head_alias.reset();
    };
  }
  const torch::Tensor loss = RunGroup(head, h, run);
  return router_loss ? router_loss->AddTo(loss) : loss;
}

}  // namespace memplan
