// Test helper: a Gemma preset against the published config.json it stands for, field by field.
#pragma once

#include "common/types.h"
#include "common/validate.h"
#include "gtest/gtest.h"

namespace memplan::testing {

inline void ExpectPresetIsConfig(const ModelSpec& preset, const ModelSpec& parsed) {
  EXPECT_TRUE(ValidateModelSpec(preset, "arch.").ok());
  EXPECT_TRUE(ValidateModelSpec(parsed, "arch.").ok());
  EXPECT_EQ(preset.family, parsed.family);
  EXPECT_EQ(preset.hidden_size, parsed.hidden_size);
  EXPECT_EQ(preset.num_layers, parsed.num_layers);
  EXPECT_EQ(preset.num_heads, parsed.num_heads);
  EXPECT_EQ(preset.num_kv_heads, parsed.num_kv_heads);
  EXPECT_EQ(preset.HeadDim(), parsed.HeadDim());
  EXPECT_EQ(preset.intermediate_size, parsed.intermediate_size);
  EXPECT_EQ(preset.vocab_size, parsed.vocab_size);
  EXPECT_EQ(preset.tie_word_embeddings, parsed.tie_word_embeddings);
  EXPECT_EQ(preset.qk_norm, parsed.qk_norm);
  EXPECT_EQ(preset.sliding_window, parsed.sliding_window);
  EXPECT_EQ(preset.sliding_layers, parsed.sliding_layers);
  EXPECT_EQ(preset.query_pre_attn_scalar, parsed.query_pre_attn_scalar);
  EXPECT_EQ(preset.attn_logit_softcapping, parsed.attn_logit_softcapping);
  EXPECT_EQ(preset.final_logit_softcapping, parsed.final_logit_softcapping);
  EXPECT_EQ(preset.embedding_padding_idx, parsed.embedding_padding_idx);
  EXPECT_EQ(preset.rms_norm_eps, parsed.rms_norm_eps);
  EXPECT_EQ(preset.rope_theta, parsed.rope_theta);
  EXPECT_EQ(preset.rope_local_base_freq, parsed.rope_local_base_freq);
  EXPECT_EQ(preset.rope_scaling.type, parsed.rope_scaling.type);
  EXPECT_EQ(preset.max_position_embeddings, parsed.max_position_embeddings);
}

}  // namespace memplan::testing
