// ChunkSet (through the ChunkManager): host and device memory exactly as the layout and
// common/optimizer_bytes.h define it, and the pinned-memory fallback.
#include "agent/chunks/chunk_manager.h"

#include <condition_variable>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "agent/chunks/cpu_adamw.h"
#include "agent/chunks/torch_sqrt.h"
#include "agent/core/torch_pch.h"
#include "agent/dist/communicator.h"
#include "agent/dist/counting_communicator.h"
#include "common/chunk_packing.h"
#include "common/optimizer_bytes.h"
#include "gtest/gtest.h"
#include "tests/agent/chunks/chunk_test_util.h"

namespace memplan {
namespace {

using namespace chunk_test;  // NOLINT(build/namespaces): the shared toy model and helpers

TEST(ChunkManagerTest, HostMemoryIsExactlyTheLayout) {
  for (OptimizerKind kind : {OptimizerKind::kAdamW, OptimizerKind::kAdamWBf16States,
                            OptimizerKind::kSgd, OptimizerKind::kAdamW8bit}) {
  for (bool bf16 : {false, true}) {
    if (kind == OptimizerKind::kAdamWBf16States && !bf16) continue;
    for (int grad_accum : {1, 2}) {
      const ToyModel model =
          ToyModel::Make(5, false, 24, 40, 5,
                         torch::TensorOptions().dtype(bf16 ? torch::kBFloat16 : torch::kFloat32));
      ChunkManagerOptions options = CpuOptions(/*n_persist=*/2, /*n_buffer=*/2);
      options.grad_accum = grad_accum;
      options.optimizer = kind;
      auto manager = ChunkManager::Create(model.Groups(), options);
      ASSERT_TRUE(manager.ok()) << manager.status();
      const ChunkMemoryStats stats = (*manager)->MemoryStats();

      // Independent layout of the same parameters.
      std::vector<LayoutParam> params;
      const int64_t elem = bf16 ? 2 : 4;
      const ParamGroups groups = model.Groups();
      for (size_t g = 0; g < groups.size(); ++g) {
        for (const NamedParam& p : groups[g]) {
          params.push_back({p.name, p.param.numel(), elem, static_cast<int>(g)});
        }
      }
      auto layout = ChunkPacking::Build(params, {options.chunk_bytes, options.alignment_bytes});
      ASSERT_TRUE(layout.ok());
      ASSERT_EQ(stats.n_chunks, layout->num_chunks());
      EXPECT_EQ(stats.layout_bytes, layout->TotalBytes());
      int64_t offloaded = 0;
      int64_t absmax_host = 0, absmax_device = 0;  // adamw8bit: one fp32 slot per 256 bytes
      for (int c = 0; c < layout->num_chunks(); ++c) {
        EXPECT_EQ(stats.chunk_bytes[c], layout->chunks()[c].size_bytes);
        if (c >= 2) offloaded += layout->chunks()[c].size_bytes;
        const int64_t n = layout->chunks()[c].size_bytes / elem, g = 256 / elem;
        const int64_t slots = kind == OptimizerKind::kAdamW8bit ? (n - 1 + g - 1) / g + 1 : 0;
        (c >= 2 ? absmax_host : absmax_device) += 2 * 4 * slots;
      }
      EXPECT_EQ(stats.persistent_device_bytes, layout->RangeBytes(0, 2));
      int64_t own_buffers = 0;  // oversized non-persistent chunks have a buffer each
      int oversized = 0;
      for (int c = 2; c < layout->num_chunks(); ++c) {
        if (!layout->chunks()[c].oversized) continue;
        own_buffers += layout->chunks()[c].size_bytes;
        ++oversized;
      }
      EXPECT_EQ(stats.n_oversized_buffers, oversized);
      EXPECT_EQ(stats.buffer_device_bytes,
                stats.n_buffer * layout->MaxRegularChunkBytes() + own_buffers);
      // Per offloaded chunk: parameters + grad staging in the model dtype, then the optimizer's
      // arrays. Spelled out here, independently of common/optimizer_bytes.h.
      int64_t per_elem = 0;
      switch (kind) {
        case OptimizerKind::kAdamW:  // fp32 moments, master and grad sum for bf16
          per_elem = 4 * (2 + (bf16 ? 2 : (grad_accum > 1 ? 1 : 0)));
          break;
        case OptimizerKind::kAdamWBf16States:  // bf16 moments, bf16 grad sum with accumulation
          per_elem = 2 * (2 + (grad_accum > 1 ? 1 : 0));
          break;
        case OptimizerKind::kSgd:  // fp32 master and grad sum for bf16
          per_elem = 4 * (bf16 ? 2 : (grad_accum > 1 ? 1 : 0));
          break;
        case OptimizerKind::kAdamW8bit:  // uint8 codes, grad sum in the model dtype
          per_elem = 2 + (grad_accum > 1 ? elem : 0);
          break;
      }
      const int64_t expected = 2 * offloaded + per_elem * (offloaded / elem) + absmax_host;
      const std::string what = absl::StrCat(std::string(OptimizerName(kind)), " bf16=", bf16,
                                            " accum=", grad_accum);
      EXPECT_EQ(stats.host_pinned_bytes, 0);
      EXPECT_EQ(stats.host_pageable_bytes, expected) << what;
      // The planner's definition (common/optimizer_bytes.h) gives the same bytes, chunk by chunk.
      int64_t planner_host = 0, planner_state = 0;
      for (int c = 0; c < layout->num_chunks(); ++c) {
        const int64_t bytes = layout->chunks()[c].size_bytes;
        if (c < 2) {
          planner_state += PersistentStateBytes(kind, elem, bytes / elem);
        } else {
          planner_host += OffloadedChunkHost(kind, elem, grad_accum, bytes).total();
        }
      }
      EXPECT_EQ(stats.host_pageable_bytes, planner_host) << what;
      EXPECT_EQ(stats.persistent_state_device_bytes, planner_state) << what;
      if (kind == OptimizerKind::kAdamW8bit) {
        EXPECT_EQ(stats.persistent_state_device_bytes,
                  2 * layout->RangeBytes(0, 2) / elem + absmax_device)
            << what;
      }
    }
  }
  }
}

TEST(ChunkManagerTest, PinnedWithoutCudaFallsBackAndSaysWhy) {
  if (torch::cuda::is_available()) GTEST_SKIP() << "pinned memory works here";
  const ToyModel model = ToyModel::Make(2, false, 16, 32, 4, torch::kFloat32);
  ChunkManagerOptions options = CpuOptions(0, 2);
  options.host_memory = HostMemoryKind::kPinned;
  options.pageable_fallback = true;
  auto manager = ChunkManager::Create(model.Groups(), options);
  ASSERT_TRUE(manager.ok()) << manager.status();
  const ChunkMemoryStats stats = (*manager)->MemoryStats();
  EXPECT_TRUE(stats.pinned_fallback);
  EXPECT_NE(stats.pinned_fallback_reason.find("CUDA"), std::string::npos)
      << stats.pinned_fallback_reason;
  EXPECT_EQ(stats.host_pinned_bytes, 0);
  EXPECT_GT(stats.host_pageable_bytes, 0);

  const ToyModel model2 = ToyModel::Make(2, false, 16, 32, 4, torch::kFloat32);
  options.pageable_fallback = false;
  auto refused = ChunkManager::Create(model2.Groups(), options);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.status().message().find("pinned"), absl::string_view::npos);
}

}  // namespace
}  // namespace memplan
