#include "agent/io/hf_checkpoint.h"

#include <set>
#include <unordered_map>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "agent/io/file_system.h"
#include "agent/io/safetensors_index.h"
#include "agent/io/safetensors_torch.h"
#include "agent/io/writable_file.h"
#include "common/log.h"
#include "common/nf4_bytes.h"
#include "common/status.h"

namespace memplan::io {
namespace {

// Index files are small; anything larger is not an index.
constexpr int64_t kMaxIndexFileBytes = int64_t{64} << 20;

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

// "a, b, c and 7 more": error messages stay readable for a wholly wrong checkpoint.
std::string Summarise(const std::vector<std::string>& items) {
  constexpr size_t kShown = 12;
  std::vector<std::string> shown(items.begin(),
                                 items.begin() + static_cast<long>(std::min(items.size(), kShown)));
  std::string out = absl::StrJoin(shown, ", ");
  if (items.size() > kShown) absl::StrAppend(&out, " and ", items.size() - kShown, " more");
  return out;
}

}  // namespace

absl::StatusOr<std::unique_ptr<HfCheckpoint>> HfCheckpoint::Open(const std::string& dir) {
  std::unique_ptr<HfCheckpoint> ckpt(new HfCheckpoint());
  ckpt->dir_ = dir;
  if (!IsDirectory(dir)) {
    return absl::NotFoundError(absl::StrCat("checkpoint directory not found: ", dir));
  }
  const std::string index_path = JoinPath(dir, kSafetensorsIndexFileName);
  const std::string single_path = JoinPath(dir, kSingleSafetensorsFileName);

  if (PathExists(index_path)) {
    ASSIGN_OR_RETURN(std::string text, ReadSmallFile(index_path, kMaxIndexFileBytes));
    absl::StatusOr<SafetensorsIndex> index = ParseSafetensorsIndex(text);
    if (!index.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(dir, "/", index.status().message()));
    }
    // Every shard the index names is looked for before any is opened: an interrupted download
    // is reported whole, not one missing file per attempt.
    std::vector<std::string> missing;
    for (const std::string& shard : index->shards) {
      if (!IsRegularFile(JoinPath(dir, shard))) missing.push_back(shard);
    }
    if (!missing.empty()) {
      return absl::NotFoundError(absl::StrCat(
          dir, ": ", kSafetensorsIndexFileName, " names ", index->shards.size(), " weight files, ",
          missing.size(), " of them missing: ", Summarise(missing),
          " (an incomplete download? fetch every *.safetensors file of the model)"));
    }
    std::map<std::string, const SafetensorsReader*> by_shard;
    for (const std::string& shard : index->shards) {
      ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsReader> reader,
                       SafetensorsReader::Open(JoinPath(dir, shard)));
      by_shard[shard] = reader.get();
      ckpt->readers_.push_back(std::move(reader));
    }
    for (const auto& [name, shard] : index->weight_map) {
      const SafetensorsReader* reader = by_shard.at(shard);
      const SafetensorsTensorInfo* info = reader->header().Find(name);
      if (info == nullptr) {
        return absl::InvalidArgumentError(absl::StrCat(dir, ": the index maps \"", name, "\" to ",
                                                       shard, ", which does not contain it"));
      }
      ckpt->tensors_[name] = {reader, info};
    }
    // A shard tensor absent from the map (or mapped to another shard) means the index and the
    // shards disagree; loading either copy could be wrong.
    int64_t tensor_bytes = 0;
    for (const auto& [shard, reader] : by_shard) {
      for (const SafetensorsTensorInfo& info : reader->header().tensors) {
        auto it = index->weight_map.find(info.name);
        if (it == index->weight_map.end() || it->second != shard) {
          return absl::InvalidArgumentError(absl::StrCat(
              dir, ": shard ", shard, " contains \"", info.name, "\", which the index ",
              it == index->weight_map.end() ? std::string("does not list")
                                            : absl::StrCat("maps to ", it->second)));
        }
        tensor_bytes += info.size_bytes();
      }
    }
    if (index->total_size_bytes.has_value() && *index->total_size_bytes != tensor_bytes) {
      // Exporters disagree on what total_size counts; it is informational only.
      MEMPLAN_LOG(kWarning, "safetensors index total_size differs from the shards' tensor bytes")
          .Field("dir", dir)
          .Field("total_size", *index->total_size_bytes)
          .Field("tensor_bytes", tensor_bytes);
    }
    return ckpt;
  }

  if (PathExists(single_path)) {
    ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsReader> reader,
                     SafetensorsReader::Open(single_path));
    for (const SafetensorsTensorInfo& info : reader->header().tensors) {
      ckpt->tensors_[info.name] = {reader.get(), &info};
    }
    ckpt->readers_.push_back(std::move(reader));
    return ckpt;
  }
  // No weights: say what the directory does hold, so a config-only download or weights in
  // another format are recognised at once.
  std::vector<std::string> safetensors, other_weights;
  if (absl::StatusOr<std::vector<std::string>> names = ListDirectory(dir); names.ok()) {
    for (const std::string& name : *names) {
      if (absl::EndsWith(name, ".safetensors")) safetensors.push_back(name);
      if (absl::EndsWith(name, ".bin") || absl::EndsWith(name, ".pt") ||
          absl::EndsWith(name, ".pth") || absl::EndsWith(name, ".gguf")) {
        other_weights.push_back(name);
      }
    }
  }
  std::string found = "no weight files at all (only a config? download the *.safetensors files)";
  if (!safetensors.empty()) {
    found = absl::StrCat("only ", Summarise(safetensors), ", which no ", kSafetensorsIndexFileName,
                         " lists (the index is missing)");
  } else if (!other_weights.empty()) {
    found = absl::StrCat("only ", Summarise(other_weights),
                         ": memplan reads safetensors weights; convert them or download the "
                         "*.safetensors files");
  }
  return absl::NotFoundError(absl::StrCat(dir, " has no model weights: neither ",
                                          kSafetensorsIndexFileName, " nor ",
                                          kSingleSafetensorsFileName, " found; it holds ", found));
}

std::vector<std::string> HfCheckpoint::TensorNames() const {
  std::vector<std::string> names;
  names.reserve(tensors_.size());
  for (const auto& [name, location] : tensors_) names.push_back(name);
  return names;
}

const SafetensorsTensorInfo* HfCheckpoint::Find(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : it->second.info;
}

absl::StatusOr<torch::Tensor> HfCheckpoint::Read(const std::string& name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) {
    return absl::NotFoundError(absl::StrCat(dir_, ": no tensor \"", name, "\""));
  }
  return ReadTensor(*it->second.reader, *it->second.info);
}

absl::StatusOr<HfCheckpoint::Matched> HfCheckpoint::Match(const std::vector<NamedParam>& params,
                                                        const HfLoadOptions& options) const {
  // Group names by tensor identity, in first-listing order.
  struct Target {
    torch::Tensor param;
    std::vector<std::string> names;
  };
  std::vector<Target> targets;
  std::unordered_map<const void*, size_t> target_of;
  std::set<std::string> names_seen;
  std::vector<std::string> duplicates;
  for (const NamedParam& p : params) {
    if (!p.param.defined()) {
      return absl::InvalidArgumentError(absl::StrCat("parameter \"", p.name, "\" is undefined"));
    }
    const void* id = p.param.unsafeGetTensorImpl();
    if (!names_seen.insert(p.name).second) {
      auto it = target_of.find(id);
      const bool same =
          it != target_of.end() &&
          std::find(targets[it->second].names.begin(), targets[it->second].names.end(), p.name) !=
              targets[it->second].names.end();
      if (!same) duplicates.push_back(p.name);
      continue;  // the same (name, tensor) listed twice is harmless
    }
    auto [it, inserted] = target_of.emplace(id, targets.size());
    if (inserted) targets.push_back({p.param, {}});
    targets[it->second].names.push_back(p.name);
  }

  std::vector<std::string> missing;
  std::vector<std::string> mismatched;
  std::vector<std::pair<size_t, std::string>> plan;  // (target, checkpoint name to load)
  for (size_t i = 0; i < targets.size(); ++i) {
    const Target& t = targets[i];
    const std::string* source = nullptr;
    for (const std::string& n : t.names) {
      if (tensors_.count(n) > 0) {
        source = &n;
        break;
      }
    }
    if (source == nullptr) {
      missing.push_back(t.names.size() == 1
                            ? t.names[0]
                            : absl::StrCat(t.names[0], " (alias ",
                                           absl::StrJoin(t.names.begin() + 1, t.names.end(), ", "),
                                           ")"));
      continue;
    }
    const SafetensorsTensorInfo& info = *tensors_.at(*source).info;
    const std::vector<int64_t> want = t.param.sizes().vec();
    const torch::ScalarType stored = TorchDTypeOf(info.dtype);
    if (info.shape != want) {
      mismatched.push_back(absl::StrCat(*source, ": checkpoint ", ShapeString(info.shape),
                                        " vs parameter ", ShapeString(want)));
    } else if (c10::isFloatingType(t.param.scalar_type()) != c10::isFloatingType(stored) ||
               (!c10::isFloatingType(stored) && stored != t.param.scalar_type())) {
      mismatched.push_back(absl::StrCat(
          *source, ": checkpoint dtype ", std::string(SafetensorsDTypeName(info.dtype)),
          " cannot load into ", std::string(c10::toString(t.param.scalar_type()))));
    }
    plan.emplace_back(i, *source);
  }

  HfLoadReport report;
  std::vector<std::string> unexpected;
  for (const auto& [name, location] : tensors_) {
    if (names_seen.count(name) > 0) continue;
    bool ignored = false;
    for (const std::string& suffix : options.ignored_suffixes) {
      ignored = ignored || absl::EndsWith(name, suffix);
    }
    if (ignored || options.allow_unexpected) {
      report.skipped.push_back(name);
    } else {
      unexpected.push_back(name);
    }
  }

  if (!duplicates.empty() || !missing.empty() || !mismatched.empty() || !unexpected.empty()) {
    std::vector<std::string> parts;
    if (!duplicates.empty()) {
      parts.push_back(
          absl::StrCat(duplicates.size(),
                       " parameter name(s) used by different tensors: ", Summarise(duplicates)));
    }
    if (!missing.empty()) {
      parts.push_back(absl::StrCat(missing.size(), " missing: ", Summarise(missing)));
    }
    if (!mismatched.empty()) {
      parts.push_back(absl::StrCat(mismatched.size(), " mismatched: ", Summarise(mismatched)));
    }
    if (!unexpected.empty()) {
      parts.push_back(absl::StrCat(unexpected.size(), " unexpected: ", Summarise(unexpected)));
    }
    return absl::InvalidArgumentError(absl::StrCat(
        dir_, ": checkpoint does not match the model's parameters; ", absl::StrJoin(parts, "; ")));
  }
  Matched matched;
  matched.skipped = std::move(report.skipped);
  for (const auto& [index, name] : plan) {
    matched.loads.emplace_back(targets[index].param, name);
    for (const std::string& alias : targets[index].names) matched.source_of[alias] = name;
  }
  if (!matched.skipped.empty()) {
    MEMPLAN_LOG(kInfo, "checkpoint tensors not loaded")
        .Field("dir", dir_)
        .Field("count", matched.skipped.size())
        .Field("names", Summarise(matched.skipped));
  }
  return matched;
}

absl::StatusOr<HfLoadReport> HfCheckpoint::LoadInto(const std::vector<NamedParam>& params,
                                                    const HfLoadOptions& options) const {
  ASSIGN_OR_RETURN(Matched matched, Match(params, options));
  HfLoadReport report;
  report.skipped = std::move(matched.skipped);
  for (const auto& [param, name] : matched.loads) {
    ASSIGN_OR_RETURN(torch::Tensor value, Read(name));
    try {
      torch::NoGradGuard no_grad;
      torch::Tensor target = param;
      target.copy_(value);
    } catch (const c10::Error& e) {
      return absl::InternalError(
          absl::StrCat("copying \"", name, "\" into the parameter: ", e.what_without_backtrace()));
    }
    ++report.tensors_loaded;
    report.bytes_read += tensors_.at(name).info->size_bytes();
  }
  return report;
}

absl::StatusOr<torch::Tensor> HfCheckpoint::ReadRange(const std::string& name, int64_t begin,
                                                      int64_t len,
                                                      torch::ScalarType dtype) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) {
    return absl::NotFoundError(absl::StrCat(dir_, ": no tensor \"", name, "\""));
  }
  const SafetensorsTensorInfo& info = *it->second.info;
  if (begin < 0 || len < 0 || begin + len > info.numel()) {
    return absl::OutOfRangeError(absl::StrCat(dir_, ": elements [", begin, ", ", begin + len,
                                              ") of \"", name, "\", which has ", info.numel()));
  }
  const torch::ScalarType stored = TorchDTypeOf(info.dtype);
  const int64_t elem = static_cast<int64_t>(torch::elementSize(stored));
  try {
    torch::Tensor raw = torch::empty({len}, torch::TensorOptions().dtype(stored));
    RETURN_IF_ERROR(it->second.reader->ReadTensorBytesAt(info, begin * elem, raw.data_ptr(),
                                                         len * elem));
    return stored == dtype ? raw : raw.to(dtype);
  } catch (const c10::Error& e) {
    return absl::ResourceExhaustedError(absl::StrCat(dir_, ": reading part of \"", name,
                                                     "\": ", e.what_without_backtrace()));
  }
}

absl::StatusOr<HfLoadReport> LoadModelCheckpoint(const HfCheckpoint& checkpoint, LlamaModel& model) {
  std::vector<NamedParam> plain;  // everything but the NF4 parts (all of it without QLoRA)
  for (const NamedParam& p : FlattenParamGroups(model.ParamGroups())) {
    if (!IsNf4PartName(p.name)) plain.push_back(p);
  }
  HfLoadOptions options;
  const std::vector<std::string> quantized = model.QuantizedWeightNames();
  // Claimed below; a suffix that is a whole name matches that tensor only.
  options.ignored_suffixes.insert(options.ignored_suffixes.end(), quantized.begin(),
                                  quantized.end());
  ASSIGN_OR_RETURN(HfLoadReport report, checkpoint.LoadInto(plain, options));
  for (const std::string& name : quantized) {
    ASSIGN_OR_RETURN(torch::Tensor value, checkpoint.Read(name));
    RETURN_IF_ERROR(model.LoadQuantizedWeight(name, value));
    ++report.tensors_loaded;
    report.bytes_read += value.numel() * value.element_size();
    std::erase(report.skipped, name);
  }
  return report;
}

absl::StatusOr<HfLoadReport> LoadHfCheckpoint(const std::string& dir,
                                              const std::vector<NamedParam>& params,
                                              const HfLoadOptions& options) {
  ASSIGN_OR_RETURN(std::unique_ptr<HfCheckpoint> ckpt, HfCheckpoint::Open(dir));
  return ckpt->LoadInto(params, options);
}

std::vector<NamedParam> FlattenParamGroups(const ParamGroups& groups) {
  std::vector<NamedParam> out;
  for (const std::vector<NamedParam>& group : groups) {
    out.insert(out.end(), group.begin(), group.end());
  }
  return out;
}

}  // namespace memplan::io
