#include "agent/io/safetensors_index.h"

#include <limits>
#include <set>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace memplan::io {
namespace {

using Json = nlohmann::json;

absl::Status IndexError(absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(kSafetensorsIndexFileName, ": ", what));
}

// Shard names come from a downloaded file and are joined to the checkpoint directory; anything
// but a plain file name could escape it.
bool IsPlainShardName(const std::string& name) {
  return !name.empty() && name.find('/') == std::string::npos &&
         name.find('\\') == std::string::npos && name.find('\0') == std::string::npos &&
         name != "." && name != ".." && absl::EndsWith(name, ".safetensors") &&
         name.size() > std::string(".safetensors").size();
}

}  // namespace

absl::StatusOr<SafetensorsIndex> ParseSafetensorsIndex(absl::string_view json) {
  Json root;
  try {
    root = Json::parse(json.begin(), json.end());
  } catch (const Json::exception& e) {
    return IndexError(absl::StrCat("malformed JSON: ", e.what()));
  }
  if (!root.is_object()) return IndexError("top level must be a JSON object");
  SafetensorsIndex index;

  if (auto meta = root.find("metadata"); meta != root.end() && !meta->is_null()) {
    if (!meta->is_object()) return IndexError("\"metadata\" must be an object");
    if (auto total = meta->find("total_size"); total != meta->end() && !total->is_null()) {
      // Some exporters write total_size as a float; an integral value is accepted either way.
      if (total->is_number_unsigned() &&
          total->get<uint64_t>() <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        index.total_size_bytes = static_cast<int64_t>(total->get<uint64_t>());
      } else if (total->is_number_float() && total->get<double>() >= 0 &&
                 total->get<double>() < 9e18 &&
                 total->get<double>() ==
                     static_cast<double>(static_cast<int64_t>(total->get<double>()))) {
        index.total_size_bytes = static_cast<int64_t>(total->get<double>());
      } else {
        return IndexError(absl::StrCat(
            "\"metadata.total_size\" must be a non-negative integer, got ", total->dump()));
      }
    }
  }

  auto map = root.find("weight_map");
  if (map == root.end()) return IndexError("\"weight_map\" is required");
  if (!map->is_object() || map->empty())
    return IndexError("\"weight_map\" must be a non-empty object");
  std::set<std::string> shards;
  for (const auto& [name, shard] : map->items()) {
    if (name.empty()) return IndexError("\"weight_map\" has an empty tensor name");
    if (!shard.is_string() || !IsPlainShardName(shard.get<std::string>())) {
      return IndexError(absl::StrCat("\"weight_map\" entry \"", name, "\" = ", shard.dump(),
                                     " is not a plain *.safetensors file name"));
    }
    index.weight_map.emplace(name, shard.get<std::string>());
    shards.insert(shard.get<std::string>());
  }
  index.shards.assign(shards.begin(), shards.end());
  return index;
}

}  // namespace memplan::io
