// The LoRA / QLoRA runs of the several-rank tests, shared by the test (one process on the global
// batch) and lora_sharded_worker (one rank on its rows): a tiny model with adapters on every
// projection (dropout 0, so every rank draws nothing), fp32 on the CPU.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "agent/train/trainer.h"
#include "tests/agent/tiny_spec.h"

namespace memplan::testing {

struct LoraShardCase {
  std::string name;
  bool nf4 = false;  // QLoRA: the base's projections in NF4 ([Byte chunks] in its manager)
  std::vector<BlockMode> modes;
  int base_n_persist = 0;
  bool base_params_sharded = false;  // shard_persistent_params: persistent base chunks sharded
  int adapter_n_persist = -1;        // -1: every adapter chunk persistent (replicated)
  int grad_accum = 1;
  double max_grad_norm = 0;
};

// Offloaded and persistent base chunks, sharded persistent base chunks, replicated and sharded
// (offloaded) adapters, accumulation and clipping, for LoRA and QLoRA.
inline std::vector<LoraShardCase> LoraShardCases() {
  using M = BlockMode;
  return {
      {"lora_base_offloaded", false, {M::kCkpt, M::kNone, M::kHsOffload, M::kSwap}, 1, false, -1,
       2, 0.05},
      {"lora_base_sharded_adapters_offloaded", false, {M::kNone, M::kCkpt, M::kNone, M::kNone}, 3,
       true, 0, 1, 0},
      {"qlora_base_offloaded", true, {M::kNone, M::kCkpt, M::kSwap, M::kHsOffload}, 0, false, -1,
       2, 0.05},
      {"qlora_base_sharded", true, {M::kCkpt, M::kNone, M::kNone, M::kCkpt}, 2, true, 1, 1, 0.05},
  };
}

// `deferred`: the base without values, as `memplan-agent train` creates a managed LoRA model
// ([Sharded loading]; QLoRA's NF4 parts too, [Sharded NF4 loading]); the trainer then fills what
// its rank stores from LlamaModel::InitialValues (QLoRA: quantizing it). The adapters always have
// their values.
inline std::unique_ptr<LlamaModel> MakeLoraShardModel(const LoraShardCase& c,
                                                      bool deferred = false) {
  LlamaModelOptions o;
  o.deferred_values = deferred;
  o.spec = TinySpec();
  o.seed = 3;
  o.param_device = torch::kCPU;
  o.lora.rank = 4;
  o.lora.alpha = 8;
  o.lora.targets = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
  o.lora.nf4_base = c.nf4;
  auto model = LlamaModel::Create(o);
  if (!model.ok()) return nullptr;
  // B = 0 would leave A's first gradient zero: start from non-zero B, the same on every rank.
  torch::NoGradGuard no_grad;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(17);
  for (auto& p : (*model)->TrainableParams()) {
    p.param.add_(at::empty_like(p.param).normal_(0, 0.05, gen));
  }
  return std::move(model).value();
}

// QLoRA: every quantized weight of `model` dequantized from `base` (values of its Params(), e.g.
// gathered from the shards) with the model's offsets, fp32, flattened and concatenated; an empty
// tensor without an NF4 base.
inline torch::Tensor DequantizedWeights(const LlamaModel& model,
                                        const std::vector<NamedParam>& base) {
  std::vector<torch::Tensor> parts;
  auto dequantized = model.DequantizedBase(base);
  if (!dequantized.ok()) return torch::full({1}, -1.0f);
  for (const std::string& name : model.QuantizedWeightNames()) {
    for (const NamedParam& p : *dequantized) {
      if (p.name == name) parts.push_back(p.param.reshape({-1}).to(torch::kFloat32));
    }
  }
  return parts.empty() ? torch::empty({0}) : torch::cat(parts);
}

inline TrainerOptions LoraShardOptions(const LoraShardCase& c) {
  TrainerOptions o;
  o.grad_accum = c.grad_accum;
  o.max_grad_norm = c.max_grad_norm;
  o.adamw.lr = 1e-2;
  o.adamw.weight_decay = 0.1;
  o.block_modes = c.modes;
  o.managed = true;
  o.chunks.chunk_bytes = 48 << 10;  // several chunks per block
  o.chunks.n_persist = c.base_n_persist;
  o.chunks.n_buffer = 2;
  o.chunks.host_memory = HostMemoryKind::kPageable;
  o.chunks.cpu_threads = 2;
  o.chunks.shard_persistent_params = c.base_params_sharded;
  o.adapter_n_persist = c.adapter_n_persist;
  return o;
}

// Rows of every global batch: divisible by 1, 2 and 3 ranks.
constexpr int kLoraGlobalRows = 6;
constexpr int kLoraSeq = 12;

// The global micro-batches of step `step` (1-based). Some targets are ignored, unevenly over the
// rows, so the mean over the global batch is not the mean of the ranks' means.
inline std::vector<MicroBatch> LoraGlobalBatches(const LoraShardCase& c, int step) {
  std::vector<MicroBatch> out;
  for (int i = 0; i < c.grad_accum; ++i) {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(900 + 10 * step + i);
    MicroBatch b;
    b.input_ids = torch::randint(128, {kLoraGlobalRows, kLoraSeq}, gen, torch::kLong);
    b.labels = b.input_ids.roll(-1, 1).clone();
    b.labels.index_put_({0, kLoraSeq - 1}, -100);
    b.labels.index_put_({0, 2}, -100);
    b.labels.index_put_({kLoraGlobalRows - 1, 4}, -100);
    b.labels.index_put_({kLoraGlobalRows - 1, 7}, -100);
    out.push_back(b);
  }
  return out;
}

inline std::vector<MicroBatch> LoraRankBatches(const std::vector<MicroBatch>& global, int rank,
                                               int world) {
  const int rows = kLoraGlobalRows / world;
  std::vector<MicroBatch> out;
  for (const MicroBatch& g : global) {
    MicroBatch b;
    b.input_ids = g.input_ids.narrow(0, rank * rows, rows).clone();
    b.labels = g.labels.narrow(0, rank * rows, rows).clone();
    out.push_back(b);
  }
  return out;
}

}  // namespace memplan::testing
