// Internal to hf_config*.cc: reading config.json values with errors that name the key, and the
// vision-language parts of the config (hf_config_vision.cc) and Gemma 2's (hf_config_gemma.cc).
// Not for use outside common/.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/types.h"
#include "nlohmann/json.hpp"

namespace memplan {
namespace hf_json {

using Json = nlohmann::json;

// INVALID_ARGUMENT "config.json: \"<key>\" <what>".
absl::Status KeyError(absl::string_view key, absl::string_view what);
// `status` (an error naming a key of a nested object) with the key prefixed by `prefix`.
absl::Status Nested(const absl::Status& status, absl::string_view prefix);

// The member `key`, nullptr when absent or null (Hugging Face treats both as "use the default").
const Json* Find(const Json& obj, const char* key);
absl::StatusOr<std::optional<int64_t>> OptionalInt(const Json& obj, const char* key, int64_t lo,
                                                   int64_t hi);
absl::StatusOr<int64_t> RequiredInt(const Json& obj, const char* key, int64_t lo, int64_t hi);
absl::StatusOr<std::optional<double>> OptionalPositiveDouble(const Json& obj, const char* key,
                                                             double hi);
absl::StatusOr<std::optional<bool>> OptionalBool(const Json& obj, const char* key);
absl::StatusOr<std::optional<std::string>> OptionalString(const Json& obj, const char* key);
// "<where>.<key>" as a number in (0, hi].
absl::StatusOr<std::optional<double>> RopeNumber(const Json& rp, const std::string& where,
                                                 const char* key, double hi);

// The tower ("vision_config", errors name "vision_config.<key>") and the multimodal token ids at
// the top level of `root`, for spec->family qwen2_5_vl or qwen2_vl; spec->hidden_size and
// vocab_size must be set.
absl::Status ParseVisionLanguage(const Json& root, ModelSpec* spec);

// transformers 5's layout of a vision-language config: `text` (the language model's keys as
// ToHfConfigJson writes them for a causal LM) under "text_config", the tower under
// "vision_config", the token ids at the top level.
std::string VisionLanguageConfigJson(const ModelSpec& spec, nlohmann::ordered_json text);

// Gemma 2's and Gemma 3's keys (hf_config_gemma.cc; spec->family picks the defaults that differ:
// caps, the sliding layers' pattern): hidden_activation (gelu_pytorch_tanh only); attention
// biases, attention dropout and bidirectional attention refused; query_pre_attn_scalar, both soft
// caps (absent: transformers' defaults, null: off), tie_word_embeddings (default true),
// pad_token_id (the embedding's padding row, default 0) and the sliding layers ("layer_types",
// else every even layer) with their window. spec->num_layers and vocab_size must be set.
absl::Status ParseGemma(const Json& root, ModelSpec* spec);

// Gemma 3's RoPE keys: "rope_parameters" per layer type (transformers 5) or "rope_scaling" /
// "rope_theta" with "rope_local_base_freq" (published configs). Sets spec->rope_local_base_freq
// (default 10000) and returns `root` with the full layers' dictionary as its "rope_parameters",
// the one-RoPE layout the common parser reads.
absl::StatusOr<Json> Gemma3RopeRoot(const Json& root, ModelSpec* spec);

// Gemma 2's (and Gemma 3's) keys of config.json, written into `j` (a causal LM's keys as
// ToHfConfigJson writes them).
void GemmaConfigJson(const ModelSpec& spec, nlohmann::ordered_json* j);

}  // namespace hf_json
}  // namespace memplan
