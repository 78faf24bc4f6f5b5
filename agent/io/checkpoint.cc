#include "agent/io/checkpoint.h"

#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <map>
#include <optional>
#include <set>
#include <unordered_map>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "agent/io/safetensors_reader.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "agent/io/file_system.h"
#include "common/param_shapes.h"
#include "agent/io/safetensors_torch.h"
#include "agent/io/writable_file.h"
#include "common/hf_config.h"
#include "common/log.h"
#include "common/status.h"
#include "common/validate.h"

namespace memplan::io {
namespace {

constexpr int64_t kMaxTrainerFileBytes = int64_t{16} << 20;
constexpr const char* kStateSuffixes[] = {"exp_avg", "exp_avg_sq", "master"};

torch::ScalarType TorchDTypeOfParam(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return torch::kFloat;
    case DType::kBFloat16:
      return torch::kBFloat16;
    case DType::kFloat16:
      return torch::kHalf;
  }
  return torch::kFloat;
}

std::string ShapeString(c10::IntArrayRef shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

// Unique tensors, first name kept (a tied LM head is saved once, as the embedding).
std::vector<NamedParam> Dedup(const std::vector<NamedParam>& params) {
  std::vector<NamedParam> out;
  std::set<const void*> seen;
  for (const NamedParam& p : params) {
    if (p.param.defined() && !seen.insert(p.param.unsafeGetTensorImpl()).second) continue;
    out.push_back(p);
  }
  return out;
}

// The exact parameter set the model spec implies, in its canonical order.
absl::StatusOr<std::vector<NamedParam>> CheckParamsAgainstModel(
    const TrainerState& trainer, const std::vector<NamedParam>& params) {
  std::map<std::string, const NamedParam*> by_name;
  for (const NamedParam& p : params) {
    if (!p.param.defined()) {
      return absl::InvalidArgumentError(absl::StrCat("parameter \"", p.name, "\" is undefined"));
    }
    if (!by_name.emplace(p.name, &p).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("parameter name \"", p.name, "\" is used by two different tensors"));
    }
  }
  const torch::ScalarType dtype = TorchDTypeOfParam(trainer.param_dtype);
  std::vector<std::string> problems;
  std::vector<NamedParam> ordered;
  for (const ParamShape& expected : HfParamShapes(trainer.model)) {
    auto it = by_name.find(expected.name);
    if (it == by_name.end()) {
      problems.push_back(absl::StrCat("missing \"", expected.name, "\""));
      continue;
    }
    const torch::Tensor& t = it->second->param;
    if (t.sizes().vec() != expected.shape) {
      problems.push_back(absl::StrCat("\"", expected.name, "\" has shape ", ShapeString(t.sizes()),
                                      ", the model needs ", ShapeString(expected.shape)));
    } else if (t.scalar_type() != dtype) {
      problems.push_back(absl::StrCat(
          "\"", expected.name, "\" has dtype ", std::string(c10::toString(t.scalar_type())),
          ", param_dtype is ", std::string(DTypeName(trainer.param_dtype))));
    }
    ordered.push_back(*it->second);
    by_name.erase(it);
  }
  for (const auto& [name, p] : by_name)
    problems.push_back(absl::StrCat("unexpected \"", name, "\""));
  if (!problems.empty()) {
    const size_t shown = std::min<size_t>(problems.size(), 12);
    return absl::InvalidArgumentError(absl::StrCat(
        "parameters do not match model \"", trainer.model.name, "\" (", problems.size(),
        " problem(s)): ", absl::StrJoin(problems.begin(), problems.begin() + shown, "; "),
        problems.size() > shown ? "; ..." : ""));
  }
  return ordered;
}

// Unique sibling name for the temporary directory.
std::string TempSibling(const std::string& dir, absl::string_view tag) {
  static std::atomic<uint64_t> counter{0};
  return JoinPath(Dirname(dir), absl::StrCat(".", Basename(dir), ".", tag, "-", ::getpid(), "-",
                                             counter.fetch_add(1)));
}

absl::Status Errno(absl::string_view what, const std::string& path) {
  return absl::InternalError(absl::StrCat(what, " ", path, ": ", std::strerror(errno)));
}

// Moves `staged` to `dir`. An existing checkpoint is swapped out atomically (RENAME_EXCHANGE) and
// then deleted; where the kernel or file system lacks the exchange, it is first renamed aside,
// which leaves a short window in which `dir` is absent but both complete copies exist.
absl::Status Publish(const std::string& staged, const std::string& dir) {
  if (!PathExists(dir)) {
    if (::rename(staged.c_str(), dir.c_str()) != 0) return Errno("rename to", dir);
    return absl::OkStatus();
  }
  if (::renameat2(AT_FDCWD, staged.c_str(), AT_FDCWD, dir.c_str(), RENAME_EXCHANGE) == 0) {
    return RemoveAll(staged);  // now holds the previous checkpoint
  }
  if (errno != EINVAL && errno != ENOSYS && errno != ENOTSUP) {
    return Errno("rename (exchange) to", dir);
  }
  const std::string aside = TempSibling(dir, "old");
  if (::rename(dir.c_str(), aside.c_str()) != 0) return Errno("rename aside", dir);
  if (::rename(staged.c_str(), dir.c_str()) != 0) {
    const absl::Status failed = Errno("rename to", dir);
    ::rename(aside.c_str(), dir.c_str());
    return failed;
  }
  return RemoveAll(aside);
}

// `target` may be replaced by a checkpoint: absent, an empty directory or a checkpoint (it has
// trainer.json); its parent is created.
absl::Status CheckReplaceable(const std::string& target) {
  if (PathExists(target)) {
    absl::StatusOr<std::vector<std::string>> entries = ListDirectory(target);
    if (!IsDirectory(target) || !entries.ok() ||
        (!entries->empty() && !PathExists(JoinPath(target, kCheckpointTrainerFile)))) {
      return absl::FailedPreconditionError(absl::StrCat(
          target, " exists and is not a checkpoint directory; refusing to replace it"));
    }
  }
  return CreateDirectories(Dirname(target));
}

// config.json and trainer.json (listing `files` of `staged` with their sizes), then the
// directory synced: the last step before publishing.
absl::Status WriteManifest(const std::string& staged, const TrainerState& trainer,
                           const std::vector<std::string>& files) {
  const std::string config_path = JoinPath(staged, kCheckpointConfigFile);
  RETURN_IF_ERROR(
      WriteFileDurably(config_path, ToHfConfigJson(trainer.model, trainer.param_dtype)));
  CheckpointManifest manifest;
  manifest.trainer = trainer;
  for (const std::string& name : files) {
    ASSIGN_OR_RETURN(manifest.file_size_bytes[name], FileSizeBytes(JoinPath(staged, name)));
  }
  ASSIGN_OR_RETURN(manifest.file_size_bytes[kCheckpointConfigFile], FileSizeBytes(config_path));
  RETURN_IF_ERROR(WriteFileDurably(JoinPath(staged, kCheckpointTrainerFile),
                                   EncodeCheckpointManifest(manifest)));
  return SyncDirectory(staged);
}

// Per-rank files are the manifest's "rank-*.safetensors" entries.
bool IsShardFileName(const std::string& name) {
  return absl::StartsWith(name, "rank-") && absl::EndsWith(name, ".safetensors");
}

absl::StatusOr<CheckpointManifest> ReadManifest(const std::string& dir) {
  const std::string trainer_path = JoinPath(dir, kCheckpointTrainerFile);
  ASSIGN_OR_RETURN(std::string text, ReadSmallFile(trainer_path, kMaxTrainerFileBytes));
  absl::StatusOr<CheckpointManifest> manifest = DecodeCheckpointManifest(text);
  if (!manifest.ok()) {
    return absl::Status(manifest.status().code(),
                        absl::StrCat(dir, ": ", manifest.status().message()));
  }
  for (const auto& [name, size] : manifest->file_size_bytes) {
    const std::string path = JoinPath(dir, name);
    absl::StatusOr<int64_t> actual = FileSizeBytes(path);
    if (!actual.ok()) return absl::DataLossError(std::string(actual.status().message()));
    if (*actual != size) {
      return absl::DataLossError(
          absl::StrCat(path, " has ", *actual, " bytes; trainer.json records ", size));
    }
  }
  return manifest;
}

absl::Status WriteStaged(const std::string& staged, const TrainerState& trainer,
                         const std::vector<NamedParam>& params,
                         const std::vector<NamedParam>& optimizer_state,
                         const OsftCheckpoint& osft) {
  const std::string params_path = JoinPath(staged, kCheckpointParamsFile);
  const std::string optimizer_path = JoinPath(staged, kCheckpointOptimizerFile);
  // "format": "pt" is what Hugging Face tools expect of a model file.
  const SafetensorsMetadata params_metadata = {{"format", "pt"},
                                               {"memplan_format", kCheckpointFormat},
                                               {"step", absl::StrCat(trainer.step)}};
  const SafetensorsMetadata metadata = {{"format", kCheckpointFormat},
                                        {"step", absl::StrCat(trainer.step)}};
  RETURN_IF_ERROR(SaveSafetensorsFile(params_path, params, params_metadata));
  std::vector<std::string> files = {kCheckpointParamsFile};
  // [OSFT checkpoints]
  ASSIGN_OR_RETURN(const std::vector<std::string> osft_files, WriteOsftFiles(staged, osft));
  files.insert(files.end(), osft_files.begin(), osft_files.end());
  // No state (a model export, a merged LoRA model): no optimizer file, rather than an empty one
  // that looks like state; a run resumed from it starts the optimizer afresh.
  if (!optimizer_state.empty()) {
    RETURN_IF_ERROR(SaveSafetensorsFile(optimizer_path, optimizer_state, metadata));
    files.push_back(kCheckpointOptimizerFile);
  }
  return WriteManifest(staged, trainer, files);
}

// The tensors the optimizer state may name: the parameters and, with OSFT, the factors.
std::vector<NamedParam> StateOwners(const std::vector<NamedParam>& params,
                                    const std::vector<NamedParam>& osft_factors) {
  std::vector<NamedParam> owners = params;
  owners.insert(owners.end(), osft_factors.begin(), osft_factors.end());
  return owners;
}

}  // namespace

absl::Status ValidateOptimizerState(const std::vector<NamedParam>& params,
                                    const std::vector<NamedParam>& optimizer_state) {
  std::map<std::string, const torch::Tensor*> param_by_name;
  for (const NamedParam& p : params) param_by_name.emplace(p.name, &p.param);
  std::set<std::string> seen;
  std::map<std::string, int> moments;  // param -> count of exp_avg / exp_avg_sq entries
  std::map<std::string, int> quantized;  // param -> count of 8-bit code and absmax entries
  bool has_step = false;
  for (const NamedParam& s : optimizer_state) {
    if (!s.param.defined()) {
      return absl::InvalidArgumentError(
          absl::StrCat("optimizer state \"", s.name, "\" is undefined"));
    }
    if (!seen.insert(s.name).second) {
      return absl::InvalidArgumentError(absl::StrCat("duplicate optimizer state \"", s.name, "\""));
    }
    if (s.name == "step") {
      if (s.param.numel() != 1 || c10::isFloatingType(s.param.scalar_type()) ||
          s.param.scalar_type() == torch::kBool) {
        return absl::InvalidArgumentError("optimizer state \"step\" must be an integer scalar");
      }
      has_step = true;
      continue;
    }
    // adamw8bit (common/optimizer_bytes.h, [8-bit optimizer state]): "<param>.<moment>.q8"
    // (uint8 codes, the parameter's shape) and "<param>.<moment>.absmax" (fp32, one value per
    // 256 elements of the parameter).
    const bool codes = absl::EndsWith(s.name, ".q8");
    if (codes || absl::EndsWith(s.name, ".absmax")) {
      const std::string base = s.name.substr(0, s.name.rfind('.'));
      const size_t at = base.rfind('.');
      const std::string param = at == std::string::npos ? "" : base.substr(0, at);
      const std::string moment = at == std::string::npos ? base : base.substr(at + 1);
      auto it = param_by_name.find(param);
      if ((moment != "exp_avg" && moment != "exp_avg_sq") || it == param_by_name.end()) {
        return absl::InvalidArgumentError(
            absl::StrCat("optimizer state \"", s.name,
                         "\" is not \"<param>.{exp_avg,exp_avg_sq}.{q8,absmax}\" of a known "
                         "parameter"));
      }
      const int64_t blocks = (it->second->numel() + 255) / 256;
      const bool ok = codes ? s.param.scalar_type() == torch::kUInt8 &&
                                  s.param.sizes() == it->second->sizes()
                            : s.param.scalar_type() == torch::kFloat32 && s.param.dim() == 1 &&
                                  s.param.numel() == blocks;
      if (!ok) {
        return absl::InvalidArgumentError(absl::StrCat(
            "optimizer state \"", s.name, "\" is ",
            std::string(c10::toString(s.param.scalar_type())), " ", ShapeString(s.param.sizes()),
            "; expected ",
            codes ? absl::StrCat("uint8 ", ShapeString(it->second->sizes()))
                  : absl::StrCat("float32 [", blocks, "] (one absmax per 256 elements)")));
      }
      ++quantized[param];
      continue;
    }
    const size_t dot = s.name.rfind('.');
    const std::string param = dot == std::string::npos ? "" : s.name.substr(0, dot);
    const std::string suffix = dot == std::string::npos ? s.name : s.name.substr(dot + 1);
    bool known_suffix = false;
    for (const char* k : kStateSuffixes) known_suffix = known_suffix || suffix == k;
    auto it = param_by_name.find(param);
    if (!known_suffix || it == param_by_name.end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "optimizer state \"", s.name,
          "\" is not \"step\" or \"<param>.{exp_avg,exp_avg_sq,master}\" of a known parameter"));
    }
    if (s.param.sizes() != it->second->sizes() || !c10::isFloatingType(s.param.scalar_type())) {
      return absl::InvalidArgumentError(absl::StrCat(
          "optimizer state \"", s.name, "\" is ", std::string(c10::toString(s.param.scalar_type())),
          " ", ShapeString(s.param.sizes()), "; parameter \"", param, "\" is ",
          ShapeString(it->second->sizes()), " (floating state required)"));
    }
    if (suffix != "master") ++moments[param];
  }
  for (const auto& [param, count] : moments) {
    if (count != 2) {
      return absl::InvalidArgumentError(
          absl::StrCat("optimizer state of \"", param, "\" has only one of exp_avg / exp_avg_sq"));
    }
  }
  for (const auto& [param, count] : quantized) {
    if (count != 4 || moments.count(param) != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "optimizer state of \"", param,
          "\" needs exp_avg.q8, exp_avg.absmax, exp_avg_sq.q8 and exp_avg_sq.absmax only"));
    }
  }
  if (!optimizer_state.empty() && !has_step) {
    return absl::InvalidArgumentError("optimizer state lacks \"step\"");
  }
  return absl::OkStatus();
}

absl::Status SaveCheckpoint(const std::string& dir, const TrainerState& trainer,
                            const std::vector<NamedParam>& params,
                            const std::vector<NamedParam>& optimizer_state,
                            const OsftCheckpoint& osft) {
  RETURN_IF_ERROR(ValidateModelSpec(trainer.model, "trainer.model."));
  ASSIGN_OR_RETURN(std::vector<NamedParam> ordered,
                   CheckParamsAgainstModel(trainer, Dedup(params)));
  OsftCheckpoint checked_osft;
  checked_osft.settings = osft.settings;
  ASSIGN_OR_RETURN(checked_osft.factors,
                   CheckOsftCheckpoint(trainer.model, trainer.param_dtype, osft));
  RETURN_IF_ERROR(
      ValidateOptimizerState(StateOwners(ordered, checked_osft.factors), optimizer_state));

  if (dir.empty()) return absl::InvalidArgumentError("empty checkpoint path");
  const std::string target = AbsolutePath(dir);
  RETURN_IF_ERROR(CheckReplaceable(target));
  const std::string staged = TempSibling(target, "tmp");
  if (::mkdir(staged.c_str(), 0755) != 0) return Errno("mkdir", staged);
  absl::Status status = WriteStaged(staged, trainer, ordered, optimizer_state, checked_osft);
  if (status.ok()) status = Publish(staged, target);
  if (status.ok()) status = SyncDirectory(Dirname(target));
  if (!status.ok()) {
    RemoveAll(staged).IgnoreError();  // best effort: the error to report is `status`
    return status;
  }
  MEMPLAN_LOG(kInfo, "checkpoint saved")
      .Field("dir", target)
      .Field("step", trainer.step)
      .Field("params", ordered.size())
      .Field("optimizer_tensors", optimizer_state.size());
  return absl::OkStatus();
}

absl::StatusOr<Checkpoint> LoadCheckpoint(const std::string& dir) {
  ASSIGN_OR_RETURN(CheckpointManifest manifest, ReadManifest(dir));
  const std::string trainer_path = JoinPath(dir, kCheckpointTrainerFile);
  Checkpoint ckpt;
  ckpt.trainer = manifest.trainer;
  bool per_rank = false;
  for (const auto& [name, size] : manifest.file_size_bytes) per_rank |= IsShardFileName(name);
  std::vector<NamedParam> params;
  std::string params_where, state_where;
  if (per_rank) {
    // Whole tensors assembled from every rank's pieces.
    ASSIGN_OR_RETURN(std::unique_ptr<CheckpointPieces> pieces, CheckpointPieces::Open(dir));
    params_where = state_where = dir + " (per-rank files)";
    for (const ParamShape& shape : HfParamShapes(ckpt.trainer.model)) {
      absl::StatusOr<torch::Tensor> t = pieces->Read(shape.name, 0, shape.numel());
      if (!t.ok()) return absl::InvalidArgumentError(absl::StrCat(params_where, ": ", t.status().message()));
      params.push_back({shape.name, t->view(shape.shape)});
      for (const char* suffix : {".exp_avg", ".exp_avg_sq", ".master"}) {
        const std::string key = shape.name + suffix;
        if (!pieces->Has(key)) continue;
        ASSIGN_OR_RETURN(torch::Tensor state, pieces->Read(key, 0, shape.numel()));
        ckpt.optimizer_state.push_back({key, state.view(shape.shape)});
      }
    }
    if (pieces->Has("step")) {
      ASSIGN_OR_RETURN(torch::Tensor step, pieces->Read("step", 0, 1));
      ckpt.optimizer_state.push_back({"step", step.reshape({})});
    }
  } else {
    // Checkpoints before the Hugging Face layout kept the parameters in params.safetensors.
    const char* params_file = manifest.file_size_bytes.count(kCheckpointParamsFile) > 0
                                  ? kCheckpointParamsFile
                                  : kLegacyCheckpointParamsFile;
    if (manifest.file_size_bytes.count(params_file) == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(trainer_path, ": \"files\" does not list ", params_file));
    }
    params_where = absl::StrCat(dir, "/", params_file);
    state_where = absl::StrCat(dir, "/", kCheckpointOptimizerFile);
    ASSIGN_OR_RETURN(params, ReadSafetensorsFile(JoinPath(dir, params_file)));
    // A checkpoint saved without optimizer state lists no optimizer file (trainer.json's list
    // is checked against the directory by ReadManifest).
    if (manifest.file_size_bytes.count(kCheckpointOptimizerFile) > 0) {
      ASSIGN_OR_RETURN(ckpt.optimizer_state,
                       ReadSafetensorsFile(JoinPath(dir, kCheckpointOptimizerFile)));
    }
  }
  // [OSFT checkpoints] Its files are listed in trainer.json (their sizes checked above).
  if (manifest.file_size_bytes.count(kOsftConfigFile) > 0) {
    ASSIGN_OR_RETURN(ckpt.osft, ReadOsftFiles(dir));
    absl::StatusOr<std::vector<NamedParam>> factors =
        CheckOsftCheckpoint(ckpt.trainer.model, ckpt.trainer.param_dtype, ckpt.osft);
    if (!factors.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(dir, "/", kOsftFactorsFile, ": ", factors.status().message()));
    }
    ckpt.osft.factors = *std::move(factors);
  }
  absl::StatusOr<std::vector<NamedParam>> ordered = CheckParamsAgainstModel(ckpt.trainer, params);
  if (!ordered.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(params_where, ": ", ordered.status().message()));
  }
  ckpt.params = *std::move(ordered);
  if (absl::Status s =
          ValidateOptimizerState(StateOwners(ckpt.params, ckpt.osft.factors), ckpt.optimizer_state);
      !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(state_where, ": ", s.message()));
  }
  return ckpt;
}

// [Per-rank checkpoints]

std::string CheckpointShardFile(int rank, int world_size) {
  return absl::StrFormat("rank-%05d-of-%05d.safetensors", rank, world_size);
}

std::string ShardedCheckpointStaging(const std::string& dir, int64_t step, int world_size) {
  const std::string target = AbsolutePath(dir);
  return JoinPath(Dirname(target),
                  absl::StrCat(".", Basename(target), ".staged-step", step, "-w", world_size));
}

absl::Status BeginShardedCheckpoint(const std::string& dir, const std::string& staged) {
  if (dir.empty()) return absl::InvalidArgumentError("empty checkpoint path");
  RETURN_IF_ERROR(CheckReplaceable(AbsolutePath(dir)));
  if (PathExists(staged)) RETURN_IF_ERROR(RemoveAll(staged));  // a failed attempt's
  if (::mkdir(staged.c_str(), 0755) != 0) return Errno("mkdir", staged);
  return absl::OkStatus();
}

absl::Status WriteCheckpointShard(const std::string& staged, int rank, int world_size,
                                  const std::vector<TensorPiece>& pieces) {
  std::vector<NamedParam> named;
  named.reserve(pieces.size());
  for (const TensorPiece& piece : pieces) {
    named.push_back({absl::StrCat(piece.name, "@", piece.begin), piece.values.reshape({-1})});
  }
  const SafetensorsMetadata metadata = {{"format", kCheckpointFormat},
                                        {"rank", absl::StrCat(rank)},
                                        {"world_size", absl::StrCat(world_size)}};
  return SaveSafetensorsFile(JoinPath(staged, CheckpointShardFile(rank, world_size)), named,
                             metadata);
}

namespace {

// The pieces of a per-rank checkpoint's files, by tensor.
struct PieceIndex {
  struct Piece {
    int64_t begin = 0;
    int64_t len = 0;
    const SafetensorsReader* reader = nullptr;
    const SafetensorsTensorInfo* info = nullptr;
  };
  struct Entry {
    SafetensorsDType dtype = SafetensorsDType::kF32;
    int64_t numel = 0;
    std::vector<Piece> pieces;  // by begin, tiling [0, numel)
  };
  TrainerState trainer;
  int world_size = 0;
  std::vector<std::unique_ptr<SafetensorsReader>> readers;
  std::map<std::string, Entry> tensors;

  // Indexes the pieces of `files` (in `dir`) and checks that they tile every tensor once.
  absl::Status Index(const std::string& dir, const std::vector<std::string>& files) {
    for (const std::string& file : files) {
      ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsReader> reader,
                       SafetensorsReader::Open(JoinPath(dir, file)));
      for (const SafetensorsTensorInfo& info : reader->header().tensors) {
        const size_t at = info.name.rfind('@');
        int64_t begin = -1;
        if (at == std::string::npos || !absl::SimpleAtoi(info.name.substr(at + 1), &begin) ||
            begin < 0 || info.shape.size() != 1) {
          return absl::DataLossError(absl::StrCat(reader->name(), ": \"", info.name,
                                                  "\" is not a 1-D piece named <tensor>@<begin>"));
        }
        Entry& entry = tensors[info.name.substr(0, at)];
        if (!entry.pieces.empty() && entry.dtype != info.dtype) {
          return absl::DataLossError(absl::StrCat(reader->name(), ": \"", info.name,
                                                  "\" has another dtype than its other pieces"));
        }
        entry.dtype = info.dtype;
        entry.pieces.push_back({begin, info.shape[0], reader.get(), &info});
      }
      readers.push_back(std::move(reader));
    }
    for (auto& [name, entry] : tensors) {
      std::sort(entry.pieces.begin(), entry.pieces.end(),
                [](const Piece& a, const Piece& b) { return a.begin < b.begin; });
      for (const Piece& piece : entry.pieces) {
        if (piece.begin != entry.numel) {
          return absl::DataLossError(absl::StrCat(
              dir, ": the pieces of ", name, piece.begin < entry.numel ? " overlap" : " leave a gap",
              " at element ", std::min(piece.begin, entry.numel)));
        }
        entry.numel += piece.len;
      }
    }
    return absl::OkStatus();
  }
};

}  // namespace

struct CheckpointPieces::Impl : PieceIndex {};

CheckpointPieces::CheckpointPieces(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CheckpointPieces::~CheckpointPieces() = default;

absl::StatusOr<std::unique_ptr<CheckpointPieces>> CheckpointPieces::Open(const std::string& dir) {
  ASSIGN_OR_RETURN(CheckpointManifest manifest, ReadManifest(dir));
  auto impl = std::make_unique<Impl>();
  impl->trainer = manifest.trainer;
  std::vector<std::string> files;
  for (const auto& [name, size] : manifest.file_size_bytes) {
    if (IsShardFileName(name)) files.push_back(name);
  }
  if (files.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(dir, ": trainer.json lists no per-rank files (rank-*.safetensors)"));
  }
  impl->world_size = static_cast<int>(files.size());
  RETURN_IF_ERROR(impl->Index(dir, files));
  return std::unique_ptr<CheckpointPieces>(new CheckpointPieces(std::move(impl)));
}

const TrainerState& CheckpointPieces::trainer() const { return impl_->trainer; }
int CheckpointPieces::world_size() const { return impl_->world_size; }
bool CheckpointPieces::Has(const std::string& name) const { return impl_->tensors.count(name) > 0; }
int64_t CheckpointPieces::Numel(const std::string& name) const {
  auto it = impl_->tensors.find(name);
  return it == impl_->tensors.end() ? -1 : it->second.numel;
}

absl::StatusOr<torch::Tensor> CheckpointPieces::Read(const std::string& name, int64_t begin,
                                                     int64_t len) const {
  auto it = impl_->tensors.find(name);
  if (it == impl_->tensors.end()) {
    return absl::NotFoundError(absl::StrCat("no tensor ", name, " in the checkpoint"));
  }
  const PieceIndex::Entry& entry = it->second;
  if (begin < 0 || len < 0 || begin + len > entry.numel) {
    return absl::OutOfRangeError(absl::StrCat(name, ": elements [", begin, ", ", begin + len,
                                              ") of ", entry.numel));
  }
  torch::Tensor out = torch::empty({len}, torch::TensorOptions().dtype(TorchDTypeOf(entry.dtype)));
  const int64_t elem = static_cast<int64_t>(out.element_size());
  char* dst = static_cast<char*>(out.data_ptr());
  for (const PieceIndex::Piece& piece : entry.pieces) {
    const int64_t lo = std::max(begin, piece.begin);
    const int64_t hi = std::min(begin + len, piece.begin + piece.len);
    if (lo >= hi) continue;
    RETURN_IF_ERROR(piece.reader->ReadTensorBytesAt(*piece.info, (lo - piece.begin) * elem,
                                                    dst + (lo - begin) * elem, (hi - lo) * elem));
  }
  return out;
}

bool IsPerRankCheckpoint(const std::string& dir) {
  absl::StatusOr<std::string> text =
      ReadSmallFile(JoinPath(dir, kCheckpointTrainerFile), kMaxTrainerFileBytes);
  if (!text.ok()) return false;
  absl::StatusOr<CheckpointManifest> manifest = DecodeCheckpointManifest(*text);
  if (!manifest.ok()) return false;
  for (const auto& [name, size] : manifest->file_size_bytes) {
    if (IsShardFileName(name)) return true;
  }
  return false;
}

absl::Status FinishShardedCheckpoint(const std::string& staged, const std::string& dir,
                                     const TrainerState& trainer, int world_size) {
  RETURN_IF_ERROR(ValidateModelSpec(trainer.model, "trainer.model."));
  std::vector<std::string> files;
  for (int r = 0; r < world_size; ++r) files.push_back(CheckpointShardFile(r, world_size));
  // Every parameter tiled exactly, in the model dtype; state only for known parameters.
  PieceIndex index;
  RETURN_IF_ERROR(index.Index(staged, files));
  ASSIGN_OR_RETURN(SafetensorsDType dtype,
                   SafetensorsDTypeOf(TorchDTypeOfParam(trainer.param_dtype)));
  std::map<std::string, int64_t> numel;
  for (const ParamShape& shape : HfParamShapes(trainer.model)) {
    numel[shape.name] = shape.numel();
    auto it = index.tensors.find(shape.name);
    if (it == index.tensors.end() || it->second.numel != shape.numel() ||
        it->second.dtype != dtype) {
      return absl::InternalError(absl::StrCat(
          "per-rank checkpoint: parameter ", shape.name, " is ",
          it == index.tensors.end() ? "missing" : "not tiled in the model dtype", " (",
          shape.numel(), " elements expected)"));
    }
  }
  for (const auto& [name, entry] : index.tensors) {
    if (numel.count(name) > 0 || name == "step") continue;
    // "<param>.exp_avg_sq" ends in ".exp_avg_sq": strip one known suffix.
    std::string param;
    for (const char* suffix : {".exp_avg_sq", ".exp_avg", ".master"}) {
      if (absl::EndsWith(name, suffix)) param = name.substr(0, name.size() - std::strlen(suffix));
      if (!param.empty()) break;
    }
    if (param.empty() || numel.count(param) == 0 || numel[param] != entry.numel) {
      return absl::InternalError(
          absl::StrCat("per-rank checkpoint: ", name, " is not the state of a parameter"));
    }
  }
  index.readers.clear();  // close before the rename
  RETURN_IF_ERROR(WriteManifest(staged, trainer, files));
  const std::string target = AbsolutePath(dir);
  RETURN_IF_ERROR(Publish(staged, target));
  RETURN_IF_ERROR(SyncDirectory(Dirname(target)));
  MEMPLAN_LOG(kInfo, "checkpoint saved")
      .Field("dir", target)
      .Field("step", trainer.step)
      .Field("ranks", world_size)
      .Field("tensors", index.tensors.size());
  return absl::OkStatus();
}

absl::Status CopyParamsByName(const std::vector<NamedParam>& source,
                              const std::vector<NamedParam>& targets) {
  std::map<std::string, const torch::Tensor*> by_name;
  for (const NamedParam& s : source) {
    if (!by_name.emplace(s.name, &s.param).second) {
      return absl::InvalidArgumentError(absl::StrCat("source lists \"", s.name, "\" twice"));
    }
  }
  // Resolve every target first so that a mismatch leaves all targets untouched.
  std::vector<std::pair<torch::Tensor, const torch::Tensor*>> copies;
  std::set<std::string> used;
  std::unordered_map<const void*, size_t> resolved;  // target identity -> index in copies
  std::map<const void*, std::vector<std::string>> unresolved;
  for (const NamedParam& t : targets) {
    const void* id = t.param.unsafeGetTensorImpl();
    auto s = by_name.find(t.name);
    if (s == by_name.end()) {
      if (resolved.count(id) == 0) unresolved[id].push_back(t.name);
      continue;
    }
    if (s->second->sizes() != t.param.sizes()) {
      return absl::InvalidArgumentError(absl::StrCat("\"", t.name, "\": source ",
                                                     ShapeString(s->second->sizes()), " vs target ",
                                                     ShapeString(t.param.sizes())));
    }
    used.insert(t.name);
    unresolved.erase(id);
    if (resolved.emplace(id, copies.size()).second) copies.emplace_back(t.param, s->second);
  }
  if (!unresolved.empty()) {
    std::vector<std::string> names;
    for (const auto& [id, n] : unresolved) names.push_back(n.front());
    return absl::InvalidArgumentError(
        absl::StrCat("no source value for: ", absl::StrJoin(names, ", ")));
  }
  std::vector<std::string> unused;
  for (const auto& [name, tensor] : by_name) {
    if (used.count(name) == 0) unused.push_back(name);
  }
  if (!unused.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("source entries matching no target: ", absl::StrJoin(unused, ", ")));
  }
  try {
    torch::NoGradGuard no_grad;
    for (auto& [target, value] : copies) target.copy_(*value);
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("copying parameters: ", e.what_without_backtrace()));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<NamedParam>> ExportAdamWState(torch::optim::AdamW& optimizer,
                                                         const std::vector<NamedParam>& params) {
  std::vector<NamedParam> out;
  std::optional<int64_t> step;
  auto& state = optimizer.state();
  for (const NamedParam& p : Dedup(params)) {
    auto it = state.find(p.param.unsafeGetTensorImpl());
    if (it == state.end()) continue;
    const auto& s = static_cast<const torch::optim::AdamWParamState&>(*it->second);
    if (step.has_value() && *step != s.step()) {
      return absl::InternalError(absl::StrCat("AdamW step differs between parameters (", *step,
                                              " vs ", s.step(), " for \"", p.name, "\")"));
    }
    step = s.step();
    out.push_back({p.name + ".exp_avg", s.exp_avg().detach().to(torch::kCPU).clone()});
    out.push_back({p.name + ".exp_avg_sq", s.exp_avg_sq().detach().to(torch::kCPU).clone()});
  }
  if (step.has_value()) out.push_back({"step", torch::tensor(*step, torch::kLong)});
  return out;
}

absl::Status ImportAdamWState(const std::vector<NamedParam>& optimizer_state,
                              const std::vector<NamedParam>& params,
                              torch::optim::AdamW& optimizer) {
  const std::vector<NamedParam> unique = Dedup(params);
  RETURN_IF_ERROR(ValidateOptimizerState(unique, optimizer_state));
  std::map<std::string, const torch::Tensor*> by_name;
  for (const NamedParam& s : optimizer_state) by_name.emplace(s.name, &s.param);
  if (by_name.count("step") == 0) return absl::OkStatus();  // fresh state
  const int64_t step = by_name.at("step")->item<int64_t>();

  std::set<const void*> in_optimizer;
  for (const auto& group : optimizer.param_groups()) {
    for (const torch::Tensor& p : group.params()) in_optimizer.insert(p.unsafeGetTensorImpl());
  }
  auto& state = optimizer.state();
  try {
    for (const NamedParam& p : unique) {
      auto m = by_name.find(p.name + ".exp_avg");
      if (m == by_name.end()) continue;
      if (in_optimizer.count(p.param.unsafeGetTensorImpl()) == 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("parameter \"", p.name, "\" is not in the optimizer's param groups"));
      }
      auto s = std::make_unique<torch::optim::AdamWParamState>();
      s->step(step);
      // Same dtype and device as the parameter, as AdamW's own lazily created state.
      s->exp_avg(m->second->to(p.param.options()).clone());
      s->exp_avg_sq(by_name.at(p.name + ".exp_avg_sq")->to(p.param.options()).clone());
      state[p.param.unsafeGetTensorImpl()] = std::move(s);
    }
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("importing AdamW state: ", e.what_without_backtrace()));
  }
  return absl::OkStatus();
}

}  // namespace memplan::io
