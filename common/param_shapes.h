// The Hugging Face parameter names and shapes of a Llama/Qwen2/Qwen3/Mistral causal LM, derived
// from its ModelSpec: what a checkpoint of that model must contain. Torch-free.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/types.h"

namespace memplan {

struct ParamShape {
  std::string name;  // e.g. "model.layers.0.self_attn.q_proj.weight"
  std::vector<int64_t> shape;
};

// In execution order: embedding, each layer, final norm, then "lm_head.weight" unless
// tie_word_embeddings (a tied head shares "model.embed_tokens.weight").
std::vector<ParamShape> HfParamShapes(const ModelSpec& model);

}  // namespace memplan
