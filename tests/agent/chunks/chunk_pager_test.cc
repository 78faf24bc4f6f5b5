// ChunkPager (through the ChunkManager): released parameters, profile-only residency, buffer
// counts and uploads.
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

TEST(ChunkManagerTest, ReleasedParametersArePlaceholdersOfTheSameShape) {
  const ToyModel model = ToyModel::Make(4, /*tied=*/true, 16, 32, 3, torch::kFloat32);
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const auto& [name, tensor] : model.ByName()) shapes[name] = tensor.sizes().vec();
  auto manager = ChunkManager::Create(model.Groups(), CpuOptions(/*n_persist=*/1, 1));
  ASSERT_TRUE(manager.ok()) << manager.status();
  const ChunkMemoryStats stats = (*manager)->MemoryStats();
  int placeholders = 0;
  for (const NamedParam& p : (*manager)->ParamOrder()) {
    EXPECT_EQ(p.param.sizes().vec(), shapes.at(p.name)) << p.name;
    EXPECT_EQ(p.param.scalar_type(), torch::kFloat32);
    const bool released = p.param.storage().nbytes() < static_cast<size_t>(p.param.numel() * 4);
    placeholders += released;
  }
  // Everything outside the persistent chunk 0 is released until its group runs.
  EXPECT_GT(placeholders, 0);
  EXPECT_EQ(model.embed.sizes(), torch::IntArrayRef({32, 16}));
  EXPECT_GT(model.embed.storage().nbytes(), 0u) << "chunk 0 is persistent";
  EXPECT_EQ(model.weight[3].sizes(), torch::IntArrayRef({16, 16}));
  EXPECT_LT(model.weight[3].storage().nbytes(), 16u * 16 * 4);
  (*manager)->PreForward(4);
  ASSERT_EQ(stats.n_oversized_buffers, 0);
  EXPECT_EQ(model.weight[3].storage().nbytes(),
            static_cast<size_t>(stats.buffer_device_bytes / stats.n_buffer));
  EXPECT_TRUE(model.weight[3].is_contiguous());
}

// Profile-only (on-demand profiling): the same forward and backward as the unmanaged model,
// parameters alone in host memory, every gradient dropped once final, no optimizer.
TEST(ChunkManagerTest, ProfileOnlyMovesParametersAndDropsGradients) {
  for (bool tied : {false, true}) {
    SCOPED_TRACE(tied ? "tied" : "untied");
    const ToyModel reference = ToyModel::Make(5, tied, 24, 40, 9, torch::kFloat32);
    const ToyModel managed = reference.Clone();
    ChunkManagerOptions options = CpuOptions(/*n_persist=*/1, /*n_buffer=*/2);
    options.profile_only = true;
    auto manager = ChunkManager::Create(managed.Groups(), options);
    ASSERT_TRUE(manager.ok()) << manager.status();
    const ChunkMemoryStats stats = (*manager)->MemoryStats();
    EXPECT_EQ(stats.persistent_state_device_bytes, 0);
    EXPECT_EQ(stats.host_pageable_bytes, stats.layout_bytes - stats.persistent_device_bytes)
        << "only the parameters of offloaded chunks live on the host";

    const Batch batch = MakeBatch(40, 3, torch::kCPU);
    const torch::Tensor want = RunMicroBatch(reference, nullptr, false, batch.tokens, batch.targets);
    // Every group's gradients exist until its PostBackward and are gone after it.
    int checked = 0;
    const ParamGroups managed_groups = managed.Groups();
    const torch::Tensor got = RunMicroBatch(managed, manager->get(), false, batch.tokens,
                                            batch.targets, [&](int g) {
                                              if (g + 1 >= managed.groups()) return;
                                              for (const NamedParam& p : managed_groups[g + 1]) {
                                                if (p.param.is_same(managed.embed)) continue;
                                                EXPECT_FALSE(p.param.grad().defined()) << p.name;
                                                ++checked;
                                              }
                                            });
    EXPECT_GT(checked, 0);
    EXPECT_TRUE(torch::equal(got, want)) << "same loss as the unmanaged model";
    for (const NamedParam& p : managed_groups[0]) EXPECT_FALSE(p.param.grad().defined());
    EXPECT_TRUE((*manager)->Grads().empty());
    EXPECT_TRUE((*manager)->OptimizerState().empty());
    const absl::Status step = (*manager)->Step(0);
    EXPECT_EQ(step.code(), absl::StatusCode::kFailedPrecondition) << step;
    // Parameters are unchanged: the host copies are the reference's values.
    const std::vector<NamedParam> values = (*manager)->Params();
    const ParamGroups ref_groups = reference.Groups();
    std::map<std::string, torch::Tensor> ref;
    for (const auto& group : ref_groups) {
      for (const NamedParam& p : group) ref[p.name] = p.param;
    }
    for (const NamedParam& v : values) EXPECT_TRUE(torch::equal(v.param, ref.at(v.name))) << v.name;
  }
}

TEST(ChunkManagerTest, RaisesBuffersWhenAGroupNeedsMoreChunksAtOnce) {
  // The tied head needs the embedding's chunk and its own: two buffers at least.
  const ToyModel model = ToyModel::Make(4, /*tied=*/true, 16, 32, 6, torch::kFloat32);
  auto manager = ChunkManager::Create(model.Groups(), CpuOptions(0, 1));
  ASSERT_TRUE(manager.ok()) << manager.status();
  EXPECT_GE((*manager)->MinBuffers(), 2);
  EXPECT_EQ((*manager)->MemoryStats().n_buffer, (*manager)->MinBuffers());
}

TEST(ChunkManagerTest, UploadStatsCountEachChunkUploadOnce) {
  const ToyModel model = ToyModel::Make(4, /*tied=*/false, 16, 32, 7, torch::kFloat32);
  // One buffer per offloaded chunk: nothing is evicted, so a forward uploads each chunk once.
  auto probe = ChunkManager::Create(model.Groups(), CpuOptions(/*n_persist=*/1, 1));
  ASSERT_TRUE(probe.ok()) << probe.status();
  const int offloaded = (*probe)->MemoryStats().n_chunks - 1;
  ASSERT_GT(offloaded, 1);
  probe->reset();
  const ToyModel fresh = ToyModel::Make(4, /*tied=*/false, 16, 32, 7, torch::kFloat32);
  auto manager = ChunkManager::Create(fresh.Groups(), CpuOptions(/*n_persist=*/1, offloaded));
  ASSERT_TRUE(manager.ok()) << manager.status();
  const ChunkMemoryStats stats = (*manager)->MemoryStats();
  EXPECT_EQ((*manager)->UploadStats().uploads, 0) << "creating the manager uploads nothing";
  const int groups = static_cast<int>(fresh.Groups().size());
  for (int g = 0; g < groups; ++g) (*manager)->PreForward(g);
  int64_t expected_bytes = 0;
  for (int c = 1; c < stats.n_chunks; ++c) expected_bytes += stats.chunk_bytes[c];
  const ChunkUploadStats uploads = (*manager)->UploadStats();
  EXPECT_EQ(uploads.uploads, offloaded);
  EXPECT_EQ(uploads.bytes, expected_bytes);
  EXPECT_EQ(uploads.seconds, 0) << "no CUDA events on the CPU";
  (*manager)->ResetUploadStats();
  EXPECT_EQ((*manager)->UploadStats().uploads, 0);
  EXPECT_EQ((*manager)->UploadStats().bytes, 0);
}

}  // namespace
}  // namespace memplan
