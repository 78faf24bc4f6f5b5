// The plans of the sharded-step tests, shared by the test (the one-process reference) and
// sharded_step_worker (one rank): a tiny model, one block per chunk (6 chunks: embedding, 4
// blocks, norm + head), fp32 on the CPU, and one bf16 case.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "agent/train/trainer.h"
#include "tests/agent/tiny_spec.h"

namespace memplan::testing {

struct ShardCase {
  std::string name;
  std::vector<BlockMode> modes;  // one per block (4)
  int n_persist = 0;
  int n_buffer = 2;
  int grad_accum = 1;
  double max_grad_norm = 0;  // 0: no clipping (offloaded updates start during backward)
  bool tied = false;
  bool bf16 = false;  // bf16 parameters (fp32 master and moments), else fp32
  // Every target of the last rank's rows in the first micro-batch ignored: that rank scores none.
  bool last_rank_unscored = false;
  // ChunkManagerOptions::accumulate_sharded_grads_on_device: one reduce-scatter per offloaded
  // chunk and step instead of one per micro-batch.
  bool grads_on_device = false;
  // ChunkManagerOptions::shard_persistent_state: persistent chunks' optimizer state sharded,
  // their grads reduce-scattered ([Sharded persistent state]).
  bool shard_state = false;
  // ChunkManagerOptions::shard_persistent_params (with shard_state): their parameters sharded
  // too, gathered on use ([Sharded persistent parameters]).
  bool shard_params = false;
};

// Each block mode on every block with persistent and offloaded chunks, then all four modes mixed
// with every chunk offloaded; clipping, accumulation and a tied head spread over them.
inline std::vector<ShardCase> ShardCases() {
  using M = BlockMode;
  return {
      {"none", {M::kNone, M::kNone, M::kNone, M::kNone}, 1, 2, 1, 0.0, false},
      {"ckpt", {M::kCkpt, M::kCkpt, M::kCkpt, M::kCkpt}, 2, 2, 1, 0.5, false},
      {"swap", {M::kSwap, M::kSwap, M::kSwap, M::kSwap}, 1, 1, 2, 0.5, false},
      {"hs_offload",
       {M::kHsOffload, M::kHsOffload, M::kHsOffload, M::kHsOffload},
       1,
       2,
       1,
       0.0,
       true},
      {"mixed_all_offloaded", {M::kSwap, M::kHsOffload, M::kCkpt, M::kNone}, 0, 1, 2, 0.5, true},
      {"bf16_mixed", {M::kSwap, M::kHsOffload, M::kCkpt, M::kNone}, 1, 2, 2, 0.5, false, true},
      {"unscored_rank",
       {M::kCkpt, M::kNone, M::kHsOffload, M::kNone},
       1,
       2,
       2,
       0.5,
       false,
       false,
       true},
      {"accum3_on_device",
       {M::kCkpt, M::kNone, M::kSwap, M::kNone},
       1,
       2,
       3,
       0.5,
       false,
       false,
       false,
       true},
      {"accum3_on_device_tied_noclip",
       {M::kHsOffload, M::kNone, M::kCkpt, M::kNone},
       0,
       2,
       3,
       0.0,
       true,
       false,
       false,
       true},
      // [Sharded persistent state]: persistent and offloaded chunks side by side, accumulation
      // and clipping; every chunk persistent with a tied head, bf16 (fp32 master) and clipping;
      // every chunk persistent, fp32, no clipping.
      {"state_sharded_mixed",
       {M::kCkpt, M::kNone, M::kHsOffload, M::kSwap},
       3,
       2,
       2,
       0.5,
       false,
       false,
       false,
       false,
       true},
      {"state_sharded_bf16_tied",
       {M::kNone, M::kCkpt, M::kNone, M::kHsOffload},
       6,
       2,
       1,
       0.5,
       true,
       true,
       false,
       false,
       true},
      {"state_sharded_all_persistent",
       {M::kNone, M::kNone, M::kCkpt, M::kNone},
       6,
       2,
       1,
       0.0,
       false,
       false,
       false,
       false,
       true},
      // [Sharded persistent parameters]: beside offloaded chunks with every block mode,
      // accumulation and clipping; every chunk persistent with NONE blocks (autograd's saved
      // views of released weights), a tied head, bf16 and clipping; every chunk persistent, fp32,
      // SWAP and HS_OFFLOAD blocks, no clipping.
      {"params_sharded_mixed",
       {M::kCkpt, M::kNone, M::kHsOffload, M::kSwap},
       3,
       2,
       2,
       0.5,
       false,
       false,
       false,
       false,
       true,
       true},
      {"params_sharded_bf16_tied_none",
       {M::kNone, M::kNone, M::kCkpt, M::kNone},
       6,
       2,
       1,
       0.5,
       true,
       true,
       false,
       false,
       true,
       true},
      {"params_sharded_all_persistent",
       {M::kNone, M::kSwap, M::kNone, M::kHsOffload},
       6,
       2,
       1,
       0.0,
       false,
       false,
       false,
       false,
       true,
       true},
  };
}

// `deferred`: no values, as `memplan-agent train` creates a managed model ([Sharded loading]);
// the trainer then fills what its rank stores from LlamaModel::InitialValues.
inline std::unique_ptr<LlamaModel> MakeShardCaseModel(const ShardCase& c, bool deferred = false) {
  LlamaModelOptions options;
  options.spec = TinySpec(c.tied);
  options.dtype = c.bf16 ? DType::kBFloat16 : DType::kFloat32;
  options.seed = 7;
  options.param_device = torch::kCPU;
  options.deferred_values = deferred;
  auto model = LlamaModel::Create(options);
  return model.ok() ? std::move(model).value() : nullptr;
}

inline TrainerOptions ShardCaseOptions(const ShardCase& c, int n_blocks) {
  TrainerOptions o;
  o.grad_accum = c.grad_accum;
  o.max_grad_norm = c.max_grad_norm;
  o.adamw.lr = 1e-2;
  o.adamw.weight_decay = 0.1;
  o.block_modes = c.modes;
  o.block_modes.resize(n_blocks, BlockMode::kNone);
  o.managed = true;
  o.chunks.chunk_bytes = 128 << 10;  // one tiny block (~121 KiB) per chunk
  o.chunks.n_persist = c.n_persist;
  o.chunks.n_buffer = c.n_buffer;
  o.chunks.host_memory = HostMemoryKind::kPageable;
  o.chunks.cpu_threads = 2;
  o.chunks.accumulate_sharded_grads_on_device = c.grads_on_device;
  o.chunks.shard_persistent_state = c.shard_state;
  o.chunks.shard_persistent_params = c.shard_params;
  return o;
}

constexpr int kRowsPerRank = 2;
constexpr int kSeq = 16;

// The global batch of micro-batch i: kRowsPerRank rows per rank, rank r's rows at
// [r * kRowsPerRank, (r + 1) * kRowsPerRank). Some targets are ignored (-100), unevenly over the
// ranks, so the mean over the concatenated batch is not the mean of the ranks' means.
inline std::vector<MicroBatch> GlobalBatches(const ShardCase& c, int world_size, int64_t vocab) {
  std::vector<MicroBatch> out;
  for (int i = 0; i < c.grad_accum; ++i) {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(4000 + i);
    MicroBatch b;
    b.input_ids = torch::randint(vocab, {kRowsPerRank * world_size, kSeq}, gen, torch::kLong);
    b.labels = b.input_ids.roll(-1, 1).clone();
    b.labels.index_put_({0, kSeq - 1}, -100);
    b.labels.index_put_({0, 3}, -100);
    b.labels.index_put_({kRowsPerRank * world_size - 1, 5}, -100);
    if (c.last_rank_unscored && i == 0) {
      b.labels.narrow(0, (world_size - 1) * kRowsPerRank, kRowsPerRank).fill_(-100);
    }
    out.push_back(b);
  }
  return out;
}

inline std::vector<MicroBatch> RankBatches(const std::vector<MicroBatch>& global, int rank) {
  std::vector<MicroBatch> out;
  for (const MicroBatch& g : global) {
    MicroBatch b;
    b.input_ids = g.input_ids.narrow(0, rank * kRowsPerRank, kRowsPerRank).clone();
    b.labels = g.labels.narrow(0, rank * kRowsPerRank, kRowsPerRank).clone();
    out.push_back(b);
  }
  return out;
}

}  // namespace memplan::testing
