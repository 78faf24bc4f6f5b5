// A tiny Llama-family model for agent tests: 4 blocks of hidden size 64, fast on the CPU.
#pragma once

#include <string>

#include "common/types.h"

namespace memplan::testing {

inline ModelSpec TinySpec(bool tied = false, const std::string& family = "llama") {
  ModelSpec s;
  s.name = "tiny";
  s.family = family;
  s.hidden_size = 64;
  s.num_layers = 4;
  s.num_heads = 4;
  s.num_kv_heads = 2;
  s.intermediate_size = 96;
  s.vocab_size = 128;
  s.rope_theta = 10000.0;
  s.tie_word_embeddings = tied;
  if (family == "qwen2") s.qkv_bias = true;
  if (family == "qwen3") s.qk_norm = true;
  return s;
}

}  // namespace memplan::testing
