// The planner prices what each rank allocates: for every MemoryCase, world_size processes of
// sharded_memory_worker (Gloo on 127.0.0.1) create a sharded ChunkManager, and each rank's
// ChunkMemoryStats (persistent parameter and optimizer-state device bytes, device buffer bytes,
// pinned and pageable host bytes, buffer count, layout fingerprint) must equal, byte for byte,
// the cost model's CostModel::RankChunkMemory() for the same model (analytic trace), chunk size,
// optimizer, accumulation and world size: the figures the plan reports in
// Prediction.rank_memory. World sizes 2 and 3 (3 does not divide most chunk sizes: padding), and
// 1 in this process without a communicator.
// [State reduce-scatter per group]: with sharded persistent state each rank also trains a step,
// and the reduce-scatter buffers each group's backward hook leaves in flight (the fp32 flats and
// shards, as allocated) must equal the planner's CostModel::PersistentReduceBytes for that stage,
// byte for byte; those buffers are no part of the step-long GradStagingBytes (with every chunk
// persistent: the gathered chunks only), where the planner once charged the largest stage's.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "agent/chunks/chunk_manager.h"
#include "agent/model/llama_model.h"
#include "common/presets.h"
#include "gtest/gtest.h"
#include "planner/cost/analytic_trace.h"
#include "planner/cost/cost_model.h"
#include "tests/agent/chunks/sharded_memory_cases.h"
#include "tests/agent/subprocess.h"
#include "tests/agent/tiny_spec.h"

namespace memplan {
namespace {

struct Row {
  int64_t persistent_device = 0, persistent_state = 0, buffer = 0, pinned = 0, pageable = 0;
  int n_buffer = 0, n_persist = 0, world_size = 0;
  std::string fingerprint;
  int64_t gathered = 0;  // [Sharded persistent parameters]
  std::vector<int64_t> reduce_by_group;  // [State reduce-scatter per group], after one step
};

std::map<std::string, Row> ParseRows(const std::string& text) {
  std::map<std::string, Row> rows;
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    std::istringstream in(line);
    std::string name;
    Row r;
    size_t groups = 0;
    if (!(in >> name >> r.persistent_device >> r.persistent_state >> r.buffer >> r.pinned >>
          r.pageable >> r.n_buffer >> r.n_persist >> r.world_size >> r.fingerprint >> r.gathered >>
          groups)) {
      continue;
    }
    r.reduce_by_group.resize(groups);
    for (int64_t& bytes : r.reduce_by_group) in >> bytes;
    rows[name] = r;
  }
  return rows;
}

// The planner's side: the cost model of the case's model and knobs at `world_size` ranks.
// `grad_slots`: the agent's [Grad staging slots] bytes where it reports them (one process).
void ExpectPlannerPrices(const testing::MemoryCase& c, int world_size, const Row& got,
                         std::optional<int64_t> grad_slots = std::nullopt) {
  const std::optional<HardwareSpec> hardware = FindHardwarePreset("h100-80gb");
  ASSERT_TRUE(hardware.has_value());
  Workload workload;
  workload.micro_batch = 1;
  workload.seq_len = 16;
  workload.world_size = world_size;
  workload.grad_accum = c.grad_accum;
  const DType dtype = c.bf16 ? DType::kBFloat16 : DType::kFloat32;
  absl::StatusOr<Trace> trace =
      SynthesizeTrace(testing::TinySpec(c.tied), workload, dtype, TrainingMethod{}, *hardware);
  ASSERT_TRUE(trace.ok()) << trace.status();
  CostOptions options;
  options.optimizer = c.optimizer;
  options.world_size = world_size;
  options.local_world_size = world_size;
  options.grad_accum = c.grad_accum;
  options.shard_persistent_state = c.shard_state;
  options.shard_persistent_params = c.shard_params;
  absl::StatusOr<CostModel> cost = CostModel::Create(*trace, c.chunk_bytes, *hardware, options);
  ASSERT_TRUE(cost.ok()) << cost.status();
  EXPECT_EQ(got.fingerprint, cost->layout().fingerprint);
  EXPECT_EQ(got.world_size, world_size);
  const int n_persist = std::min(c.n_persist, cost->num_chunks());
  EXPECT_EQ(got.n_persist, n_persist);
  // A valid plan's n_buffer, which the agent allocates as given (none when every chunk is
  // persistent).
  const int n_buffer = c.n_buffer;
  EXPECT_GE(n_buffer, cost->MinBuffers(n_persist));
  EXPECT_EQ(got.n_buffer, n_persist < cost->num_chunks() ? n_buffer : 0);
  const RankMemory m =
      cost->RankChunkMemory(n_persist, n_buffer, HostMemoryKind::kPageable, /*host_bytes=*/0);
  EXPECT_EQ(got.persistent_device, m.persistent_device_bytes);
  EXPECT_EQ(got.persistent_state, m.persistent_state_device_bytes);
  EXPECT_EQ(got.buffer, m.buffer_device_bytes);
  EXPECT_EQ(got.gathered, m.persistent_gather_device_bytes);
  if (c.shard_params && world_size > 1) {
    EXPECT_GT(got.gathered, 0);
    EXPECT_TRUE(cost->ShardsPersistentParams());
  }
  EXPECT_EQ(got.pinned, m.chunk_host_pinned_bytes);
  EXPECT_EQ(got.pageable, m.chunk_host_pageable_bytes);
  // The search's host figure (no offloaded activations here) is the same bytes.
  EXPECT_EQ(cost->HostBytes(n_persist, ModeCounts{}), m.chunk_host_pageable_bytes);
  if (n_persist < cost->num_chunks()) {
    EXPECT_GT(got.pageable, 0);
  }
  if (c.shard_state && world_size > 1) {
    ASSERT_TRUE(cost->ShardsPersistentState());
    ASSERT_EQ(got.reduce_by_group.size(), static_cast<size_t>(cost->num_blocks() + 2));
    int64_t largest = 0;
    for (int32_t g = 0; g < cost->num_blocks() + 2; ++g) {
      EXPECT_EQ(got.reduce_by_group[g], cost->PersistentReduceBytes(g, n_persist)) << "group " << g;
      largest = std::max(largest, got.reduce_by_group[g]);
    }
    EXPECT_GT(largest, 0);
    if (n_persist == cost->num_chunks()) {
      EXPECT_EQ(cost->GradStagingBytes(n_persist), got.gathered);
    }
  }
  if (grad_slots.has_value()) {
    EXPECT_EQ(*grad_slots, cost->GradSlotBytes(n_persist));
    // Every case offloads a block's chunk unless all of them are persistent.
    EXPECT_EQ(*grad_slots > 0, n_persist < cost->num_chunks()) << *grad_slots;
  }
}

TEST(ShardedMemoryTest, OneProcessAllocatesWhatThePlannerPrices) {
  torch::set_num_threads(1);
  for (const testing::MemoryCase& c : testing::MemoryCases()) {
    SCOPED_TRACE(c.name);
    LlamaModelOptions model_options;
    model_options.spec = testing::TinySpec(c.tied);
    model_options.dtype = c.bf16 ? DType::kBFloat16 : DType::kFloat32;
    model_options.param_device = torch::kCPU;
    auto model = LlamaModel::Create(model_options);
    ASSERT_TRUE(model.ok()) << model.status();
    ChunkManagerOptions options;
    options.chunk_bytes = c.chunk_bytes;
    options.n_persist = c.n_persist;
    options.n_buffer = c.n_buffer;
    options.host_memory = HostMemoryKind::kPageable;
    options.optimizer = c.optimizer;
    options.grad_accum = c.grad_accum;
    options.cpu_threads = 1;
    auto manager = ChunkManager::Create((*model)->ParamGroups(), options);
    ASSERT_TRUE(manager.ok()) << manager.status();
    const ChunkMemoryStats s = (*manager)->MemoryStats();
    Row row{s.persistent_device_bytes,
            s.persistent_state_device_bytes,
            s.buffer_device_bytes,
            s.host_pinned_bytes,
            s.host_pageable_bytes,
            s.n_buffer,
            s.n_persist,
            s.world_size,
            s.layout_fingerprint,
            s.persistent_gather_device_bytes,
            {}};
    ExpectPlannerPrices(c, 1, row, s.grad_slot_device_bytes);
  }
}

class ShardedMemoryTest : public ::testing::TestWithParam<int> {};

TEST_P(ShardedMemoryTest, EachRankAllocatesWhatThePlannerPrices) {
  const int world_size = GetParam();
  const std::string prefix =
      absl::StrCat(::testing::TempDir(), "/sharded_memory_", getpid(), "_w", world_size);
  const int port = testing::FreeLoopbackPort();
  ASSERT_GT(port, 0);
  std::vector<testing::Child> children;
  for (int r = 0; r < world_size; ++r) {
    children.push_back(testing::Spawn(
        {MEMPLAN_MEMORY_WORKER, absl::StrCat(prefix, ".rank", r, ".txt")},
        {absl::StrCat("WORLD_SIZE=", world_size), absl::StrCat("RANK=", r),
         absl::StrCat("LOCAL_RANK=", r), absl::StrCat("LOCAL_WORLD_SIZE=", world_size),
         "MASTER_ADDR=127.0.0.1", absl::StrCat("MASTER_PORT=", port)},
        absl::StrCat(prefix, ".", r)));
    ASSERT_GT(children.back().pid, 0);
  }
  std::vector<std::map<std::string, Row>> ranks(world_size);
  for (int r = 0; r < world_size; ++r) {
    int status = 0;
    ASSERT_EQ(waitpid(children[r].pid, &status, 0), children[r].pid);
    const std::string err = testing::ReadFile(children[r].err_path);
    std::remove(children[r].out_path.c_str());
    std::remove(children[r].err_path.c_str());
    if (absl::StrContains(err, "no Gloo process group")) GTEST_SKIP() << err;
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "rank " << r << ":\n" << err;
    const std::string path = absl::StrCat(prefix, ".rank", r, ".txt");
    ranks[r] = ParseRows(testing::ReadFile(path));
    std::remove(path.c_str());
  }
  for (const testing::MemoryCase& c : testing::MemoryCases()) {
    for (int r = 0; r < world_size; ++r) {
      SCOPED_TRACE(absl::StrCat(c.name, ", rank ", r));
      ASSERT_TRUE(ranks[r].count(c.name));
      ExpectPlannerPrices(c, world_size, ranks[r].at(c.name));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, ShardedMemoryTest, ::testing::Values(2, 3),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return absl::StrCat("W", info.param);
                         });

}  // namespace
}  // namespace memplan
