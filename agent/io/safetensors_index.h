// The index of a sharded Hugging Face checkpoint, model.safetensors.index.json:
// {"metadata": {"total_size": N}, "weight_map": {"tensor name":
// "model-00001-of-00002.safetensors"}}.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace memplan::io {

inline constexpr char kSafetensorsIndexFileName[] = "model.safetensors.index.json";
inline constexpr char kSingleSafetensorsFileName[] = "model.safetensors";

struct SafetensorsIndex {
  std::map<std::string, std::string> weight_map;  // tensor name -> shard file name
  std::vector<std::string> shards;                // distinct shard names, sorted
  std::optional<int64_t> total_size_bytes;        // metadata.total_size, when present
};

// INVALID_ARGUMENT (naming the key) for malformed JSON, a missing or empty weight_map, or a shard
// name that is not a plain "*.safetensors" file name in the same directory (no '/', no "..").
absl::StatusOr<SafetensorsIndex> ParseSafetensorsIndex(absl::string_view json);

}  // namespace memplan::io
