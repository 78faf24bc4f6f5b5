// HfCheckpoint: the weights of a Hugging Face checkpoint directory (model.safetensors, or shards
// listed by model.safetensors.index.json), validated on open, and loaded by name into a model's
// parameters with dtype conversion. The model is not a dependency: callers pass (name, tensor)
// pairs, e.g. the flattened ParamGroups.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "agent/core/torch_pch.h"
#include "agent/io/safetensors_reader.h"
#include "agent/model/llama_model.h"
#include "agent/core/param_residency.h"

namespace memplan::io {

struct HfLoadOptions {
  // Checkpoint tensors that no parameter claims are an error unless their name ends with one
  // of these (buffers some exporters save, not parameters).
  std::vector<std::string> ignored_suffixes = {".rotary_emb.inv_freq"};
  bool allow_unexpected = false;  // true: unclaimed tensors are skipped (logged)
};

struct HfLoadReport {
  int64_t tensors_loaded = 0;
  int64_t bytes_read = 0;
  std::vector<std::string> skipped;  // checkpoint tensors not loaded (ignored or unexpected)
};

// Thread-compatible: const methods may run concurrently.
class HfCheckpoint {
 public:
  // Opens `dir`: the index when present (every shard opened and validated, every weight_map
  // entry found in its shard, no shard tensor missing from the map), else model.safetensors.
  static absl::StatusOr<std::unique_ptr<HfCheckpoint>> Open(const std::string& dir);

  // Names of all tensors, sorted.
  std::vector<std::string> TensorNames() const;
  // nullptr when absent.
  const SafetensorsTensorInfo* Find(const std::string& name) const;
  // One tensor as a CPU tensor of its stored dtype (NOT_FOUND when absent).
  absl::StatusOr<torch::Tensor> Read(const std::string& name) const;

  // Copies the checkpoint into `params` (under NoGradGuard, converting to each parameter's dtype
  // and keeping its device). Everything is checked before anything is written: a missing
  // parameter, a shape mismatch, a non-floating tensor for a floating parameter, a duplicate
  // parameter name or an unexpected tensor fails with INVALID_ARGUMENT listing them all and
  // leaves `params` untouched. A tensor object listed under several names (tied embeddings) is
  // loaded once, from the first of its names the checkpoint has.
  absl::StatusOr<HfLoadReport> LoadInto(const std::vector<NamedParam>& params,
                                        const HfLoadOptions& options) const;

  // LoadInto's checks without reading anything: which checkpoint tensor each parameter loads
  // from. [Sharded loading] A rank that stores only parts of the model matches once and then
  // reads its ranges with ReadRange.
  struct Matched {
    std::vector<std::pair<torch::Tensor, std::string>> loads;  // (parameter, tensor), once each
    std::map<std::string, std::string> source_of;  // every parameter name (aliases too) -> tensor
    std::vector<std::string> skipped;              // checkpoint tensors no parameter claims
  };
  absl::StatusOr<Matched> Match(const std::vector<NamedParam>& params,
                                const HfLoadOptions& options) const;
  // Elements [begin, begin + len) of the flattened tensor `name`, converted to `dtype`: one
  // positional read of exactly those bytes, the rest of the file untouched. NOT_FOUND when
  // absent, OUT_OF_RANGE when the range leaves the tensor.
  absl::StatusOr<torch::Tensor> ReadRange(const std::string& name, int64_t begin, int64_t len,
                                          torch::ScalarType dtype) const;

 private:
  struct Location {
    const SafetensorsReader* reader;
    const SafetensorsTensorInfo* info;
  };
  HfCheckpoint() = default;

  std::string dir_;
  std::vector<std::unique_ptr<SafetensorsReader>> readers_;
  std::map<std::string, Location> tensors_;
};

// A model's checkpoint: LoadInto over FlattenParamGroups(model.ParamGroups()), except that with an
// NF4 base (QLoRA) each weight of model.QuantizedWeightNames() is read whole, quantized into its
// NF4 parts (LlamaModel::LoadQuantizedWeight) and dropped, one at a time, so the host never holds
// the unquantized base. Before a ChunkManager takes the parameters.
absl::StatusOr<HfLoadReport> LoadModelCheckpoint(const HfCheckpoint& checkpoint, LlamaModel& model);

// HfCheckpoint::Open(dir) then LoadInto(params, options).
absl::StatusOr<HfLoadReport> LoadHfCheckpoint(const std::string& dir,
                                              const std::vector<NamedParam>& params,
                                              const HfLoadOptions& options = {});

// Flattens groups into one list (a tensor listed in several groups appears once per listing).
std::vector<NamedParam> FlattenParamGroups(const ParamGroups& groups);

}  // namespace memplan::io
