// LoRA adapters as the agent allocates them, torch-free: their names, shapes and chunk packing,
// and the device bytes of the adapter chunks (all persistent), the one definition that the agent
// (LlamaModel::AdapterGroups, its adapter ChunkManager) and the planner's cost model share.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "common/chunk_packing.h"
#include "common/param_shapes.h"
#include "common/types.h"

namespace memplan {

// The projections an adapter can wrap, in Hugging Face's module order inside a block.
inline constexpr std::array<const char*, 7> kLoraModules = {
    "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};

// [LoRA adapter order] Per block (group b + 1), the targeted projections in kLoraModules order,
// each lora_A [rank, in] then lora_B [out, rank], named
// "model.layers.<b>.<self_attn|mlp>.<module>.lora_<A|B>.weight" (PEFT's names without its
// "base_model.model." prefix). Empty for a full fine-tune.
std::vector<ParamShape> LoraParamShapes(const ModelSpec& model, const TrainingMethod& method);
std::vector<LayoutParam> LoraLayoutParams(const ModelSpec& model, const TrainingMethod& method,
                                          int64_t dtype_bytes);

// What the agent's adapter ChunkManager holds on the device when every adapter chunk is
// persistent (the default), for `optimizer` (common/optimizer_bytes.h):
struct LoraAdapterBytes {
  int64_t params = 0;            // adapter parameter count
  int64_t chunk_bytes = 0;       // the adapter chunks (packed like the base, exact sizes)
  int64_t grad_bytes = 0;        // their .grad tensors (param bytes, no alignment gaps)
  int64_t state_bytes = 0;       // PersistentStateBytesPerElem over every chunk's span
  int64_t step_extra_bytes = 0;  // fp32 copy of the largest chunk's grads during its update
  int num_chunks = 0;
};
absl::StatusOr<LoraAdapterBytes> PersistentLoraAdapterBytes(const ModelSpec& model,
                                                            const TrainingMethod& method,
                                                            int64_t dtype_bytes,
                                                            const ChunkPackingOptions& packing,
                                                            OptimizerKind optimizer);

}  // namespace memplan
