// One rank of sharded_memory_test (started world_size times with torchrun's variables on a
// loopback port): joins the Gloo group, creates a ChunkManager for every MemoryCase and writes
// what it allocated (ChunkMemoryStats) to PATH, one line per case:
//   name persistent_device persistent_state buffer host_pinned host_pageable n_buffer n_persist
//   world_size fingerprint gathered G reduce_0 ... reduce_{G-1}
// With sharded persistent state the case then trains one step (grad_accum micro-batches of
// 1 x 16 tokens through the grouped model, no clipping) and reduce_g is what group g's backward
// hook left in flight of the persistent chunks' reduce-scatter buffers
// (ChunkMemoryStats::state_reduce_device_bytes_by_group); G = 0 otherwise.
//   sharded_memory_worker PATH
// Exit status: 0, or 1 with "rank R: <error>" on stderr.
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "agent/chunks/chunk_manager.h"
#include "agent/dist/process_group.h"
#include "agent/model/llama_model.h"
#include "tests/agent/chunks/sharded_memory_cases.h"
#include "tests/agent/gloo_environment.h"
#include "tests/agent/tiny_spec.h"

namespace memplan {
namespace {

int Fail(int rank, const absl::Status& status) {
  std::fprintf(stderr, "rank %d: %s\n", rank, std::string(status.message()).c_str());
  return 1;
}

int Run(const std::string& path) {
  torch::set_num_threads(1);
  absl::StatusOr<DistOptions> dist =
      testing::GlooOptionsFromEnvironment(30, 200);
  if (!dist.ok()) return Fail(-1, dist.status());
  absl::StatusOr<std::unique_ptr<ProcessGroup>> group = ProcessGroup::Join(*dist);
  if (!group.ok()) return Fail(dist->rank, group.status());
  const int rank = (*group)->rank();
  std::ofstream out(path);
  for (const testing::MemoryCase& c : testing::MemoryCases()) {
    LlamaModelOptions model_options;
    model_options.spec = testing::TinySpec(c.tied);
    model_options.dtype = c.bf16 ? DType::kBFloat16 : DType::kFloat32;
    model_options.seed = 7;
    model_options.param_device = torch::kCPU;
    absl::StatusOr<std::unique_ptr<LlamaModel>> model = LlamaModel::Create(model_options);
    if (!model.ok()) return Fail(rank, model.status());
    ChunkManagerOptions options;
    options.chunk_bytes = c.chunk_bytes;
    options.n_persist = c.n_persist;
    options.n_buffer = c.n_buffer;
    options.host_memory = HostMemoryKind::kPageable;
    options.optimizer = c.optimizer;
    options.grad_accum = c.grad_accum;
    options.cpu_threads = 1;
    options.shard_persistent_state = c.shard_state;
    options.shard_persistent_params = c.shard_params;
    absl::StatusOr<std::unique_ptr<ChunkManager>> manager =
        ChunkManager::Create((*model)->ParamGroups(), options, group->get());
    if (!manager.ok()) return Fail(rank, manager.status());
    std::vector<int64_t> reduce_by_group;
    if (c.shard_state) {
      torch::manual_seed(11 + rank);
      const BlockModes modes(static_cast<size_t>(model_options.spec.num_layers), BlockMode::kNone);
      for (int micro = 0; micro < c.grad_accum; ++micro) {
        const int64_t vocab = model_options.spec.vocab_size;
        const torch::Tensor ids = torch::randint(vocab, {1, 16}, torch::kLong);
        const torch::Tensor targets = torch::randint(vocab, {1, 16}, torch::kLong);
        (*model)->Loss(ids, targets, modes, manager->get()).backward();
      }
      if (const absl::Status st = (*manager)->Step(0.0); !st.ok()) return Fail(rank, st);
      reduce_by_group = (*manager)->MemoryStats().state_reduce_device_bytes_by_group;
    }
    const ChunkMemoryStats s = (*manager)->MemoryStats();
    out << c.name << ' ' << s.persistent_device_bytes << ' ' << s.persistent_state_device_bytes
        << ' ' << s.buffer_device_bytes << ' ' << s.host_pinned_bytes << ' '
        << s.host_pageable_bytes << ' ' << s.n_buffer << ' ' << s.n_persist << ' ' << s.world_size
        << ' ' << s.layout_fingerprint << ' ' << s.persistent_gather_device_bytes << ' '
        << reduce_by_group.size();
    for (int64_t bytes : reduce_by_group) out << ' ' << bytes;
    out << '\n';
  }
  out.close();
  return out ? 0 : Fail(rank, absl::InternalError("writing " + path));
}

}  // namespace
}  // namespace memplan

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: sharded_memory_worker PATH\n");
    return 2;
  }
  return memplan::Run(argv[1]);
}
