// Test helper: small random traces and hardware for property and oracle tests.
#pragma once

#include <cstdint>
#include <random>

#include <string>
#include <vector>

#include "common/param_shapes.h"
#include "common/types.h"

namespace memplan::testing {

inline constexpr int64_t kMiB = int64_t{1} << 20;
inline constexpr int64_t kGiB = int64_t{1} << 30;

// Figures loosely shaped like a small decoder, but non-uniform per block so that every
// prefix-sum / range-max path is exercised.
inline Trace RandomTrace(std::mt19937_64& rng, int32_t num_blocks) {
  auto uni = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  auto real = [&](double lo, double hi) {
    return std::uniform_real_distribution<double>(lo, hi)(rng);
  };
  Trace t;
  t.param_dtype = uni(0, 3) == 0 ? DType::kFloat32 : DType::kBFloat16;
  t.workload.micro_batch = uni(1, 4);
  t.workload.seq_len = 512 * uni(1, 4);
  t.arch.tie_word_embeddings = uni(0, 2) == 0;
  t.arch.num_layers = num_blocks;
  t.training.kind = uni(0, 3) == 0 ? TrainingKind::kLora : TrainingKind::kFull;
  for (int32_t j = 0; j < num_blocks; ++j) {
    BlockTrace b;
    b.param_bytes = uni(4, 40) * kMiB;
    b.input_bytes = uni(8, 64) * kMiB;
    b.saved_bytes = b.input_bytes * uni(3, 20);
    b.forward_transient_bytes = uni(10, 200) * kMiB;
    b.backward_transient_bytes = uni(10, 400) * kMiB;
    b.forward_seconds = real(0.002, 0.02);
    b.backward_seconds = b.forward_seconds * real(1.5, 2.5);
    b.recompute_seconds = b.forward_seconds * real(0.9, 1.1);
    t.blocks.push_back(b);
  }
  t.embedding.param_bytes = uni(10, 120) * kMiB;
  t.embedding.saved_bytes = uni(0, 4) * kMiB;
  t.embedding.forward_transient_bytes = uni(8, 64) * kMiB;
  t.embedding.backward_transient_bytes = uni(8, 64) * kMiB;
  t.embedding.forward_seconds = real(0.0005, 0.002);
  t.embedding.backward_seconds = real(0.0005, 0.004);
  t.head.param_bytes = t.arch.tie_word_embeddings ? kMiB / 64 : uni(10, 120) * kMiB;
  t.head.saved_bytes = uni(50, 1200) * kMiB;
  t.head.forward_transient_bytes = uni(50, 800) * kMiB;
  t.head.backward_transient_bytes = uni(100, 1600) * kMiB;
  t.head.forward_seconds = real(0.002, 0.02);
  t.head.backward_seconds = real(0.004, 0.04);
  if (uni(0, 1) == 0) {
    // Half of the traces carry a real (small) architecture whose parameter bytes they match, so
    // the planner lays chunks out with the agent's rule, oversized chunks included.
    ModelSpec& a = t.arch;
    a.hidden_size = 512 * uni(1, 6);
    a.num_heads = a.hidden_size / 64;
    a.num_kv_heads = a.num_heads / (uni(0, 1) == 0 ? 1 : 2);
    a.intermediate_size = a.hidden_size * uni(2, 4);
    a.vocab_size = 1024 * uni(4, 40);
    a.qkv_bias = uni(0, 3) == 0;
    std::vector<int64_t> stage(static_cast<size_t>(num_blocks) + 2, 0);
    for (const ParamShape& p : HfParamShapes(a)) {
      int64_t numel = 1;
      for (int64_t d : p.shape) numel *= d;
      size_t s = stage.size() - 1;
      if (p.name.rfind("model.embed_tokens.", 0) == 0) s = 0;
      if (p.name.rfind("model.layers.", 0) == 0) {
        s = 1 + static_cast<size_t>(std::stoi(p.name.substr(13)));
      }
      stage[s] += numel * DTypeBytes(t.param_dtype);
    }
    t.embedding.param_bytes = stage.front();
    for (int32_t j = 0; j < num_blocks; ++j) t.blocks[j].param_bytes = stage[j + 1];
    t.head.param_bytes = stage.back();
  }
  int64_t total = t.embedding.param_bytes + t.head.param_bytes;
  for (const BlockTrace& b : t.blocks) total += b.param_bytes;
  t.total_param_count = total / DTypeBytes(t.param_dtype);
  t.trainable_param_count =
      t.training.kind == TrainingKind::kFull ? t.total_param_count : t.total_param_count / 50;
  return t;
}

// A PCIe-4-like card with slow links so that transfers, swapping and offloading matter.
inline HardwareSpec RandomHardware(std::mt19937_64& rng) {
  auto real = [&](double lo, double hi) {
    return std::uniform_real_distribution<double>(lo, hi)(rng);
  };
  HardwareSpec h;
  h.name = "test-card";
  h.gpu_memory_bytes = 8 * kGiB;
  h.cuda_context_bytes = 256 * kMiB;
  h.h2d_pinned_bytes_per_second = real(5e9, 25e9);
  h.d2h_pinned_bytes_per_second = real(5e9, 25e9);
  h.h2d_pageable_bytes_per_second = h.h2d_pinned_bytes_per_second * 0.2;
  h.d2h_pageable_bytes_per_second = h.d2h_pinned_bytes_per_second * 0.3;
  h.bidirectional_pinned_bytes_per_second =
      real(0, 1) < 0.5 ? 0 : 1.5 * h.h2d_pinned_bytes_per_second;
  h.hbm_bytes_per_second = real(0.5e12, 3e12);
  h.matmul_bf16_flops = 300e12;
  h.matmul_fp16_flops = 300e12;
  h.matmul_fp32_flops = 60e12;
  h.nccl_allgather_bytes_per_second = real(20e9, 300e9);
  h.nccl_reduce_scatter_bytes_per_second = real(20e9, 300e9);
  h.cpu_adam_params_per_second = real(0.05e9, 2e9);
  h.host_memory_bytes = 64 * kGiB;
  return h;
}

}  // namespace memplan::testing
