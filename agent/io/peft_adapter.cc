#include "agent/io/peft_adapter.h"

#include <fstream>
#include <map>
#include <sstream>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "agent/io/file_system.h"
#include "agent/io/safetensors_torch.h"
#include "agent/io/writable_file.h"
#include "common/status.h"
#include "nlohmann/json.hpp"

namespace memplan::io {
namespace {

using Json = nlohmann::json;

absl::Status ConfigError(const std::string& dir, const std::string& field,
                         const std::string& problem) {
  return absl::InvalidArgumentError(
      absl::StrCat(JoinPath(dir, kPeftConfigFile), ": ", field, " ", problem));
}

constexpr absl::string_view kLoraA = ".lora_A.weight";
// Where a decoder's layers are (memplan's names) and where transformers 5 keeps a Qwen2.5-VL's.
constexpr absl::string_view kLanguageModelLayers = "model.layers.";
constexpr absl::string_view kVisionLanguageLayers = "model.language_model.layers.";
constexpr absl::string_view kLoraB = ".lora_B.weight";

}  // namespace

absl::Status SavePeftAdapter(const std::string& dir, const LoraOptions& lora,
                             const std::string& base_model,
                             const std::vector<NamedParam>& adapters, bool vision_language) {
  Json config;
  config["peft_type"] = "LORA";
  config["task_type"] = "CAUSAL_LM";
  config["r"] = lora.rank;
  config["lora_alpha"] = lora.alpha;
  config["lora_dropout"] = lora.dropout;
  // Canonical module order, as LoraTrainingMethod spells it.
  config["target_modules"] = LoraTrainingMethod(lora).lora_target_modules;
  config["bias"] = "none";
  config["base_model_name_or_path"] = base_model;
  config["fan_in_fan_out"] = false;
  config["use_rslora"] = false;
  config["use_dora"] = false;
  config["init_lora_weights"] = true;
  config["inference_mode"] = true;
  config["modules_to_save"] = nullptr;
  config["layers_to_transform"] = nullptr;
  config["rank_pattern"] = Json::object();
  config["alpha_pattern"] = Json::object();
  RETURN_IF_ERROR(CreateDirectories(dir));
  std::vector<NamedParam> prefixed;
  prefixed.reserve(adapters.size());
  for (const NamedParam& p : adapters) {
    std::string name = p.name;
    if (vision_language && absl::StartsWith(name, kLanguageModelLayers)) {
      name = absl::StrCat(kVisionLanguageLayers, name.substr(kLanguageModelLayers.size()));
    }
    prefixed.push_back({absl::StrCat(kPeftKeyPrefix, name), p.param.detach()});
  }
  RETURN_IF_ERROR(SaveSafetensorsFile(JoinPath(dir, kPeftWeightsFile), prefixed,
                                      SafetensorsMetadata{{"format", "pt"}}));
  return WriteFileDurably(JoinPath(dir, kPeftConfigFile), config.dump(2) + "\n");
}

absl::StatusOr<PeftAdapter> ReadPeftAdapter(const std::string& dir) {
  ASSIGN_OR_RETURN(PeftAdapter adapter, ReadPeftConfig(dir));
  ASSIGN_OR_RETURN(std::vector<NamedParam> tensors,
                   ReadSafetensorsFile(JoinPath(dir, kPeftWeightsFile)));
  for (NamedParam& t : tensors) {
    if (!absl::StartsWith(t.name, kPeftKeyPrefix)) {
      return absl::InvalidArgumentError(absl::StrCat(JoinPath(dir, kPeftWeightsFile), ": key ",
                                                     t.name, " lacks the prefix ", kPeftKeyPrefix));
    }
    // peft writes the adapter name into the key only for non-default adapters.
    std::string name = t.name.substr(std::string(kPeftKeyPrefix).size());
    if (absl::StartsWith(name, kVisionLanguageLayers)) {
      name = absl::StrCat(kLanguageModelLayers, name.substr(kVisionLanguageLayers.size()));
    }
    adapter.tensors.push_back({std::move(name), std::move(t.param)});
  }
  return adapter;
}

absl::StatusOr<PeftAdapter> ReadPeftConfig(const std::string& dir) {
  const std::string config_path = JoinPath(dir, kPeftConfigFile);
  std::ifstream in(config_path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(config_path, ": cannot open"));
  std::stringstream text;
  text << in.rdbuf();
  const Json config = Json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  if (!config.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(config_path, ": not a JSON object"));
  }
  auto str = [&](const char* key) -> std::string {
    auto it = config.find(key);
    return it != config.end() && it->is_string() ? it->get<std::string>() : "";
  };
  auto truthy = [&](const char* key) {
    auto it = config.find(key);
    if (it == config.end() || it->is_null()) return false;
    if (it->is_boolean()) return it->get<bool>();
    if (it->is_object() || it->is_array()) return !it->empty();
    return true;
  };
  PeftAdapter adapter;
  if (str("peft_type") != "LORA") {
    return ConfigError(dir, "peft_type", absl::StrCat("is '", str("peft_type"), "'; need LORA"));
  }
  if (config.contains("bias") && str("bias") != "none") {
    return ConfigError(dir, "bias", absl::StrCat("is '", str("bias"), "'; memplan runs none"));
  }
  for (const char* unsupported :
       {"use_rslora", "use_dora", "fan_in_fan_out", "rank_pattern", "alpha_pattern",
        "layers_to_transform", "modules_to_save", "lora_bias", "layer_replication",
        "target_parameters", "exclude_modules", "use_qalora"}) {
    if (truthy(unsupported)) {
      return ConfigError(dir, unsupported, "is set; memplan runs plain LoRA");
    }
  }
  auto number = [&](const char* key, double* out) -> absl::Status {
    auto it = config.find(key);
    if (it == config.end() || !it->is_number()) return ConfigError(dir, key, "must be a number");
    *out = it->get<double>();
    return absl::OkStatus();
  };
  double r = 0;
  RETURN_IF_ERROR(number("r", &r));
  adapter.lora.rank = static_cast<int64_t>(r);
  if (static_cast<double>(adapter.lora.rank) != r || r < 1) {
    return ConfigError(dir, "r", "must be a positive integer");
  }
  RETURN_IF_ERROR(number("lora_alpha", &adapter.lora.alpha));
  if (config.contains("lora_dropout"))
    RETURN_IF_ERROR(number("lora_dropout", &adapter.lora.dropout));
  const auto targets = config.find("target_modules");
  if (targets == config.end() || !targets->is_array()) {
    return ConfigError(dir, "target_modules",
                       "must be a list of module names (a regular expression is not supported)");
  }
  for (const Json& t : *targets) {
    if (!t.is_string()) return ConfigError(dir, "target_modules", "must hold strings");
    adapter.lora.targets.push_back(t.get<std::string>());
  }
  adapter.base_model = str("base_model_name_or_path");
  return adapter;
}

absl::StatusOr<std::vector<NamedParam>> MergeLora(const std::vector<NamedParam>& base,
                                                  const std::vector<NamedParam>& adapters,
                                                  const LoraOptions& lora) {
  std::map<std::string, torch::Tensor> by_name;
  for (const NamedParam& a : adapters) by_name[a.name] = a.param;
  std::vector<NamedParam> out;
  out.reserve(base.size());
  size_t merged = 0;
  torch::NoGradGuard no_grad;
  for (const NamedParam& p : base) {
    // "model.layers.3.self_attn.q_proj.weight" -> its adapters' "....q_proj.lora_A.weight".
    constexpr absl::string_view kWeight = ".weight";
    torch::Tensor value = p.param.detach();
    if (absl::EndsWith(p.name, kWeight)) {
      const std::string stem = p.name.substr(0, p.name.size() - kWeight.size());
      auto a = by_name.find(stem + std::string(kLoraA));
      auto b = by_name.find(stem + std::string(kLoraB));
      if (a != by_name.end() && b != by_name.end()) {
        const torch::Tensor& A = a->second;
        const torch::Tensor& B = b->second;
        if (A.dim() != 2 || B.dim() != 2 || B.size(1) != A.size(0) || value.dim() != 2 ||
            B.size(0) != value.size(0) || A.size(1) != value.size(1)) {
          return absl::InvalidArgumentError(
              absl::StrCat("merge: adapter shapes of ", stem, " do not chain with its weight"));
        }
        const bool narrow = value.scalar_type() != torch::kFloat32;
        torch::Tensor delta = narrow ? B.to(torch::kFloat32).mm(A.to(torch::kFloat32)) : B.mm(A);
        delta = (delta * lora.scaling()).to(value.scalar_type()).to(value.device());
        value = value + delta;
        merged += 2;
      }
    }
    out.push_back({p.name, value});
  }
  if (merged != by_name.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("merge: ", by_name.size() - merged, " adapter tensors have no base weight"));
  }
  return out;
}

absl::Status SaveLoraCheckpoint(const std::string& dir, const TrainerState& trainer,
                                const LoraOptions& lora, const std::string& base_model,
                                const std::vector<NamedParam>& adapters,
                                const std::vector<NamedParam>& optimizer_state) {
  RETURN_IF_ERROR(ValidateOptimizerState(adapters, optimizer_state));
  RETURN_IF_ERROR(
      SavePeftAdapter(dir, lora, base_model, adapters, trainer.model.IsVisionLanguage()));
  const std::string optimizer_path = JoinPath(dir, kCheckpointOptimizerFile);
  RETURN_IF_ERROR(SaveSafetensorsFile(
      optimizer_path, optimizer_state,
      SafetensorsMetadata{{"format", kCheckpointFormat}, {"step", absl::StrCat(trainer.step)}}));
  CheckpointManifest manifest;
  manifest.trainer = trainer;
  for (const char* name : {kPeftConfigFile, kPeftWeightsFile, kCheckpointOptimizerFile}) {
    ASSIGN_OR_RETURN(manifest.file_size_bytes[name], FileSizeBytes(JoinPath(dir, name)));
  }
  return WriteFileDurably(JoinPath(dir, kCheckpointTrainerFile),
                          EncodeCheckpointManifest(manifest));
}

bool IsLoraCheckpoint(const std::string& dir) {
  return IsRegularFile(JoinPath(dir, kPeftConfigFile));
}

absl::StatusOr<Checkpoint> LoadLoraCheckpoint(const std::string& dir) {
  const std::string manifest_path = JoinPath(dir, kCheckpointTrainerFile);
  std::ifstream in(manifest_path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(manifest_path, ": cannot open"));
  std::stringstream text;
  text << in.rdbuf();
  ASSIGN_OR_RETURN(CheckpointManifest manifest, DecodeCheckpointManifest(text.str()));
  for (const auto& [name, size] : manifest.file_size_bytes) {
    ASSIGN_OR_RETURN(const int64_t actual, FileSizeBytes(JoinPath(dir, name)));
    if (actual != size) {
      return absl::DataLossError(absl::StrCat(JoinPath(dir, name), " has ", actual,
                                              " bytes, trainer.json recorded ", size));
    }
  }
  ASSIGN_OR_RETURN(PeftAdapter adapter, ReadPeftAdapter(dir));
  Checkpoint checkpoint;
  checkpoint.trainer = manifest.trainer;
  checkpoint.params = std::move(adapter.tensors);
  ASSIGN_OR_RETURN(checkpoint.optimizer_state,
                   ReadSafetensorsFile(JoinPath(dir, kCheckpointOptimizerFile)));
  RETURN_IF_ERROR(ValidateOptimizerState(checkpoint.params, checkpoint.optimizer_state));
  return checkpoint;
}

}  // namespace memplan::io
