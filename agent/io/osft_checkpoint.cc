#include "agent/io/osft_checkpoint.h"

#include <algorithm>
#include <array>
#include <map>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "agent/io/file_system.h"
#include "agent/io/safetensors_torch.h"
#include "agent/io/writable_file.h"
#include "agent/model/layers.h"
#include "common/lora_shapes.h"
#include "common/osft_cost.h"
#include "common/status.h"
#include "nlohmann/json.hpp"

namespace memplan::io {
namespace {

constexpr int64_t kMaxConfigBytes = 1 << 16;

std::string ShapeString(c10::IntArrayRef shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

// The six suffixes, high u, s, v then low u, s, v: the names agent/model/osft.h gives.
const std::array<std::string, 6>& FactorSuffixes() {
  static const std::array<std::string, 6> suffixes = [] {
    std::array<std::string, 6> out;
    const OsftFactors none;
    std::vector<NamedParam> named = OsftFrozenNamed("", none);
    for (NamedParam& p : OsftTrainableNamed("", none)) named.push_back(std::move(p));
    for (size_t i = 0; i < out.size(); ++i) out[i] = named[i].name;
    return out;
  }();
  return suffixes;
}

// "<path>" and the factor's index in FactorSuffixes() when `name` is a factor's.
bool ParseFactorName(const std::string& name, std::string* path, size_t* index) {
  for (size_t i = 0; i < FactorSuffixes().size(); ++i) {
    if (absl::EndsWith(name, FactorSuffixes()[i])) {
      *path = name.substr(0, name.size() - FactorSuffixes()[i].size());
      *index = i;
      return true;
    }
  }
  return false;
}

absl::Status CheckSettings(const OsftSettings& osft) {
  if (!(osft.rank_ratio > 0 && osft.rank_ratio < 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat(kOsftConfigFile, ": rank_ratio = ", osft.rank_ratio, "; allowed: 0 < R < 1"));
  }
  if (osft.targets.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(kOsftConfigFile, ": targets is empty"));
  }
  for (size_t i = 0; i < osft.targets.size(); ++i) {
    const std::string& t = osft.targets[i];
    if (std::find(kLoraModules.begin(), kLoraModules.end(), t) == kLoraModules.end() ||
        std::find(osft.targets.begin(), osft.targets.begin() + i, t) != osft.targets.begin() + i) {
      return absl::InvalidArgumentError(
          absl::StrCat(kOsftConfigFile, ": targets has '", t,
                       "', unknown or repeated; allowed: ", absl::StrJoin(kLoraModules, ", ")));
    }
  }
  return absl::OkStatus();
}

}  // namespace

std::vector<ParamShape> OsftFactorShapes(const ModelSpec& model, const OsftSettings& osft) {
  std::vector<ParamShape> out;
  if (!osft.enabled()) return out;
  const std::string layers = "model.layers.";
  for (const ParamShape& p : HfParamShapes(model)) {
    if (p.shape.size() != 2 || !absl::StartsWith(p.name, layers)) continue;
    for (size_t m = 0; m < kLoraModules.size(); ++m) {
      const std::string module = kLoraModules[m];
      const std::string tail = absl::StrCat(m < 4 ? ".self_attn." : ".mlp.", module, ".weight");
      if (!absl::EndsWith(p.name, tail) ||
          std::find(osft.targets.begin(), osft.targets.end(), module) == osft.targets.end()) {
        continue;
      }
      // A block's own projection only: "model.layers.<i>" + tail.
      const std::string block = p.name.substr(0, p.name.size() - tail.size());
      if (block.find('.', layers.size()) != std::string::npos) continue;
      const std::string path = p.name.substr(0, p.name.size() - std::string(".weight").size());
      const int64_t rows = p.shape[0], cols = p.shape[1];
      const OsftRanks ranks = OsftSplitRanks(rows, cols, osft.rank_ratio);
      for (size_t part = 0; part < 2; ++part) {
        const int64_t k = part == 0 ? ranks.high : ranks.low;
        out.push_back({path + FactorSuffixes()[3 * part], {rows, k}, p.group});
        out.push_back({path + FactorSuffixes()[3 * part + 1], {k}, p.group});
        out.push_back({path + FactorSuffixes()[3 * part + 2], {cols, k}, p.group});
      }
    }
  }
  return out;
}

absl::StatusOr<std::vector<NamedParam>> CheckOsftCheckpoint(const ModelSpec& model, DType dtype,
                                                            const OsftCheckpoint& osft) {
  if (!osft.settings.enabled()) {
    if (osft.factors.empty()) return osft.factors;
    return absl::InvalidArgumentError(
        absl::StrCat(osft.factors.size(), " OSFT factors without the split's settings"));
  }
  RETURN_IF_ERROR(CheckSettings(osft.settings));
  std::map<std::string, const torch::Tensor*> by_name;
  for (const NamedParam& f : osft.factors) {
    if (!f.param.defined() || !by_name.emplace(f.name, &f.param).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("OSFT factor \"", f.name, "\" is undefined or listed twice"));
    }
  }
  const torch::ScalarType want_dtype = ToScalarType(dtype);
  std::vector<std::string> problems;
  std::vector<NamedParam> ordered;
  for (const ParamShape& expected : OsftFactorShapes(model, osft.settings)) {
    auto it = by_name.find(expected.name);
    if (it == by_name.end()) {
      problems.push_back(absl::StrCat("missing \"", expected.name, "\""));
      continue;
    }
    const torch::Tensor& t = *it->second;
    if (t.sizes().vec() != expected.shape) {
      problems.push_back(absl::StrCat("\"", expected.name, "\" has shape ", ShapeString(t.sizes()),
                                      ", the split needs ", ShapeString(expected.shape)));
    } else if (t.scalar_type() != want_dtype) {
      problems.push_back(absl::StrCat("\"", expected.name, "\" has dtype ",
                                      std::string(c10::toString(t.scalar_type())),
                                      ", the model is ", std::string(DTypeName(dtype))));
    }
    ordered.push_back({expected.name, t});
    by_name.erase(it);
  }
  for (const auto& [name, t] : by_name) {
    problems.push_back(absl::StrCat("unexpected \"", name, "\""));
  }
  if (!problems.empty()) {
    const size_t shown = std::min<size_t>(problems.size(), 12);
    return absl::InvalidArgumentError(absl::StrCat(
        "OSFT factors do not match the split (rank ratio ", osft.settings.rank_ratio, ", targets ",
        absl::StrJoin(osft.settings.targets, ","), ") of model \"", model.name, "\" (",
        problems.size(),
        " problem(s)): ", absl::StrJoin(problems.begin(), problems.begin() + shown, "; "),
        problems.size() > shown ? "; ..." : ""));
  }
  return ordered;
}

torch::Tensor OsftMergedWeight(const OsftFactors& f, torch::ScalarType dtype) {
  torch::NoGradGuard no_grad;
  auto part = [](const torch::Tensor& u, const torch::Tensor& s, const torch::Tensor& v) {
    return torch::mm(u.detach().to(torch::kFloat32) * s.detach().to(torch::kFloat32),
                     v.detach().to(torch::kFloat32).t());
  };
  return part(f.u_high, f.s_high, f.v_high).add_(part(f.u_low, f.s_low, f.v_low)).to(dtype);
}

absl::StatusOr<OsftCheckpointParts> SplitOsftCheckpointParts(const std::vector<NamedParam>& named,
                                                             torch::ScalarType dtype) {
  torch::NoGradGuard no_grad;
  auto cpu_copy = [](const torch::Tensor& t) {
    return t.detach().to(torch::kCPU, /*non_blocking=*/false, /*copy=*/true);
  };
  OsftCheckpointParts out;
  std::vector<std::string> paths;  // first-seen order
  std::map<std::string, std::array<torch::Tensor, 6>> by_path;
  for (const NamedParam& p : named) {
    std::string path;
    size_t index = 0;
    if (!ParseFactorName(p.name, &path, &index)) {
      out.params.push_back({p.name, cpu_copy(p.param)});
      continue;
    }
    if (by_path.count(path) == 0) paths.push_back(path);
    by_path[path][index] = p.param;
  }
  for (const std::string& path : paths) {
    const std::array<torch::Tensor, 6>& t = by_path[path];
    for (size_t i = 0; i < t.size(); ++i) {
      if (!t[i].defined()) {
        return absl::InvalidArgumentError(
            absl::StrCat("OSFT projection ", path, " lacks its factor ", FactorSuffixes()[i]));
      }
    }
    OsftFactors f;
    f.u_high = t[0], f.s_high = t[1], f.v_high = t[2];
    f.u_low = t[3], f.s_low = t[4], f.v_low = t[5];
    out.params.push_back({path + ".weight", OsftMergedWeight(f, dtype).cpu()});
    for (size_t i = 0; i < t.size(); ++i) {
      out.factors.push_back({path + FactorSuffixes()[i], cpu_copy(t[i])});
    }
  }
  return out;
}

absl::StatusOr<std::vector<std::string>> WriteOsftFiles(const std::string& dir,
                                                        const OsftCheckpoint& osft) {
  if (!osft.settings.enabled()) return std::vector<std::string>();
  nlohmann::ordered_json config;
  config["rank_ratio"] = osft.settings.rank_ratio;
  config["targets"] = osft.settings.targets;
  RETURN_IF_ERROR(WriteFileDurably(JoinPath(dir, kOsftConfigFile), config.dump(2) + "\n"));
  RETURN_IF_ERROR(SaveSafetensorsFile(JoinPath(dir, kOsftFactorsFile), osft.factors,
                                      SafetensorsMetadata{{"format", "memplan-osft-factors"}}));
  return std::vector<std::string>{kOsftConfigFile, kOsftFactorsFile};
}

absl::StatusOr<OsftCheckpoint> ReadOsftFiles(const std::string& dir) {
  OsftCheckpoint out;
  ASSIGN_OR_RETURN(out.settings, ReadOsftSettings(dir));
  if (!out.settings.enabled()) return out;
  ASSIGN_OR_RETURN(out.factors, ReadSafetensorsFile(JoinPath(dir, kOsftFactorsFile)));
  return out;
}

absl::StatusOr<OsftSettings> ReadOsftSettings(const std::string& dir) {
  OsftSettings out;
  const std::string path = JoinPath(dir, kOsftConfigFile);
  if (!IsRegularFile(path)) return out;
  ASSIGN_OR_RETURN(const std::string text, ReadSmallFile(path, kMaxConfigBytes));
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  const auto ratio = j.is_object() ? j.find("rank_ratio") : j.end();
  const auto targets = j.is_object() ? j.find("targets") : j.end();
  if (!j.is_object() || ratio == j.end() || !ratio->is_number() || targets == j.end() ||
      !targets->is_array()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": expected {\"rank_ratio\": R, \"targets\": [...]}"));
  }
  out.rank_ratio = ratio->get<double>();
  for (const nlohmann::json& t : *targets) {
    if (!t.is_string()) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": targets must be strings"));
    }
    out.targets.push_back(t.get<std::string>());
  }
  RETURN_IF_ERROR(CheckSettings(out));
  return out;
}

absl::Status CheckOsftResume(const OsftSettings& saved, double rank_ratio,
                             const std::vector<std::string>& targets) {
  const std::string saved_targets = absl::StrJoin(saved.targets, ",");
  const std::string resume_with =
      absl::StrCat("--osft-rank-ratio ", saved.rank_ratio, " --osft-targets ", saved_targets);
  if (rank_ratio <= 0) {
    if (!saved.enabled()) return absl::OkStatus();
    return absl::FailedPreconditionError(absl::StrCat(
        "the checkpoint is an OSFT run's (no --osft-rank-ratio given): resume it with ",
        resume_with, ", or start a new run from its merged weights with --model"));
  }
  if (!saved.enabled()) {
    return absl::FailedPreconditionError(
        absl::StrCat("--osft-rank-ratio: the checkpoint is not an OSFT run's (it has no ",
                     kOsftConfigFile, "; its weights can start an OSFT run with --model)"));
  }
  if (saved.rank_ratio != rank_ratio) {
    return absl::FailedPreconditionError(
        absl::StrCat("--osft-rank-ratio ", rank_ratio, " differs from the checkpoint's ",
                     saved.rank_ratio, ": resume it with ", resume_with));
  }
  std::vector<std::string> a = saved.targets, b = targets;
  std::sort(a.begin(), a.end());
  std::sort(b.begin(), b.end());
  if (a != b) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--osft-targets ", absl::StrJoin(targets, ","), " differs from the checkpoint's ",
        saved_targets, ": resume it with ", resume_with));
  }
  return absl::OkStatus();
}

}  // namespace memplan::io
