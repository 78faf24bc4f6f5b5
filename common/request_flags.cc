#include "common/request_flags.h"

#include <algorithm>
#include <cassert>
#include <cmath>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "common/fixed_knobs.h"
#include "common/head_chunking.h"
#include "common/lora_shapes.h"

namespace memplan {
namespace {

// The flag of FixedKnobs member `field` (FixedKnobTable).
absl::string_view KnobFlag(absl::string_view field) {
  for (const FixedKnobEntry& entry : FixedKnobTable()) {
    if (entry.field == field) return entry.flag;
  }
  assert(false && "not a FixedKnobs member");
  return field;
}

// "pinned", "PAGEABLE", "host_memory_pinned" (the proto enum's name): the spellings plan files use.
std::optional<HostMemoryKind> ParseHostMemoryName(absl::string_view text) {
  std::string name = absl::AsciiStrToLower(text);
  if (absl::StartsWith(name, "host_memory_")) name = name.substr(12);
  if (name == HostMemoryKindName(HostMemoryKind::kPinned)) return HostMemoryKind::kPinned;
  if (name == HostMemoryKindName(HostMemoryKind::kPageable)) return HostMemoryKind::kPageable;
  return std::nullopt;
}

}  // namespace

void AddDTypeFlag(FlagSet* flags, absl::string_view name, std::optional<DType>* out) {
  flags->Choice<std::optional<DType>, DType>(
      name, out, [](absl::string_view v) { return ParseDType(absl::AsciiStrToLower(v)); },
      "fp32, bf16, fp16");
}

void AddOptimizerFlag(FlagSet* flags, std::optional<OptimizerKind>* out) {
  flags->Choice<std::optional<OptimizerKind>, OptimizerKind>(
      "--optimizer", out,
      [](absl::string_view v) { return ParseOptimizer(std::string_view(v.data(), v.size())); },
      std::string(OptimizerAllowList()));
}

void AddOptimizerFlag(FlagSet* flags, std::string* out) {
  flags->Choice<std::string, std::string>(
      "--optimizer", out,
      [](absl::string_view v) -> std::optional<std::string> {
        if (!ParseOptimizer(std::string_view(v.data(), v.size()))) return std::nullopt;
        return std::string(v);
      },
      std::string(OptimizerAllowList()));
}

void AddNodeFlags(FlagSet* flags, std::optional<int32_t>* gpus_per_node,
                  std::optional<int64_t>* host_memory_bytes) {
  flags->Int(kGpusPerNodeFlag, gpus_per_node)
      .Alias(kLocalWorldSizeAlias, kGpusPerNodeFlag.name)
      .Custom(kHostMemoryGibFlag.name, [host_memory_bytes](absl::string_view v) -> absl::Status {
        absl::StatusOr<double> gib = ParseDoubleValue(v, kHostMemoryGibFlag.range);
        if (!gib.ok()) return gib.status();
        *host_memory_bytes = static_cast<int64_t>(std::llround(*gib * 0x1p30));
        return absl::OkStatus();
      });
}

void AddLoraTargetsFlag(FlagSet* flags, std::vector<std::string>* out) {
  flags->List("--lora-targets", out, kLoraModules, "all");
}

void AddFixedKnobFlags(FlagSet* flags, FixedKnobs* knobs, int32_t min_n_buffer) {
  flags->Custom(KnobFlag("chunk_bytes"), [knobs](absl::string_view v) -> absl::Status {
    absl::StatusOr<int64_t> mib = ParseIntValue(v, kChunkMibFlag.lo, kChunkMibFlag.hi);
    if (!mib.ok()) return mib.status();
    knobs->chunk_bytes = *mib << 20;
    return absl::OkStatus();
  });
  flags->Int(KnobFlag("n_persist"), &knobs->n_persist, 0, kMaxChunkCount);
  flags->Int(KnobFlag("n_buffer"), &knobs->n_buffer, min_n_buffer, kMaxChunkCount);
  flags->Int(KnobFlag("n_swap"), &knobs->n_swap, 0, kMaxLayers);
  flags->Int(KnobFlag("n_checkpoint"), &knobs->n_checkpoint, 0, kMaxLayers);
  flags->Int(KnobFlag("n_hs_offload"), &knobs->n_hs_offload, 0, kMaxLayers);
  flags->Choice<std::optional<HostMemoryKind>, HostMemoryKind>(
      KnobFlag("host_memory"), &knobs->host_memory, ParseHostMemoryName, "pinned, pageable");
  const FlagSet::Choices<bool> sharding = {{"sharded", true}, {"replicated", false}};
  flags->Choice(KnobFlag("shard_persistent_state"), &knobs->shard_persistent_state, sharding);
  flags->Choice(KnobFlag("shard_persistent_params"), &knobs->shard_persistent_params, sharding);
  flags->Custom(KnobFlag("head_chunk_logit_bytes"), [knobs](absl::string_view v) -> absl::Status {
    absl::StatusOr<int64_t> mib =
        ParseIntValue(v, kMinHeadChunkLogitBytes >> 20, kMaxHeadChunkLogitBytes >> 20);
    if (!mib.ok()) return mib.status();
    knobs->head_chunk_logit_bytes = *mib << 20;
    return absl::OkStatus();
  });
}

}  // namespace memplan
