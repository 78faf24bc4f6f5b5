// LoRA through the Trainer: the managed run (frozen base manager + adapter manager) against the
// unmanaged one (torch::optim::AdamW on the adapters), bit for bit in fp32 on the CPU, and what
// each manager holds.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "agent/train/trainer.h"
#include "common/optimizer_bytes.h"

namespace memplan {
namespace {

const bool kSingleThread = [] {
  torch::set_num_threads(1);
  return true;
}();

ModelSpec TinySpec(bool tied) {
  ModelSpec s;
  s.name = "tiny-lora";
  s.family = "llama";
  s.hidden_size = 64;
  s.num_layers = 4;
  s.num_heads = 4;
  s.num_kv_heads = 2;
  s.intermediate_size = 96;
  s.vocab_size = 128;
  s.rope_theta = 10000.0;
  s.rms_norm_eps = 1e-5;
  s.tie_word_embeddings = tied;
  return s;
}

std::unique_ptr<LlamaModel> MakeModel(bool tied, double dropout, bool nf4 = false) {
  LlamaModelOptions o;
  o.spec = TinySpec(tied);
  o.seed = 3;
  o.lora.rank = 4;
  o.lora.alpha = 8;
  o.lora.dropout = dropout;
  o.lora.targets = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
  o.lora.nf4_base = nf4;  // QLoRA: the base's projections in NF4 ([Byte chunks] in its manager)
  auto model = LlamaModel::Create(o);
  EXPECT_TRUE(model.ok()) << model.status();
  // B = 0 would leave A's first gradient zero: start from non-zero B, the same in both runs.
  torch::NoGradGuard no_grad;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(17);
  for (auto& p : (*model)->TrainableParams()) {
    p.param.add_(at::empty_like(p.param).normal_(0, 0.05, gen));
  }
  return std::move(model).value();
}

std::vector<MicroBatch> Batches(uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  std::vector<MicroBatch> out;
  for (int i = 0; i < 2; ++i) {
    MicroBatch b;
    b.input_ids = torch::randint(128, {2, 10}, gen, torch::kLong);
    b.labels = torch::randint(128, {2, 10}, gen, torch::kLong);
    out.push_back(b);
  }
  return out;
}

struct RunResult {
  std::vector<double> losses;
  std::vector<NamedParam> grads;   // of the last step, before its update
  std::vector<NamedParam> params;  // after the last step
  std::vector<NamedParam> base;    // base values after the last step
};

RunResult Train(const TrainerOptions& options, bool tied, double dropout, bool nf4) {
  auto model = MakeModel(tied, dropout, nf4);
  auto trainer = Trainer::Create(model.get(), options);
  EXPECT_TRUE(trainer.ok()) << trainer.status();
  RunResult r;
  torch::manual_seed(77);
  for (uint64_t step = 0; step < 2; ++step) {
    auto loss = (*trainer)->ForwardBackward(Batches(step + 1));
    EXPECT_TRUE(loss.ok()) << loss.status();
    r.losses.push_back(*loss);
    if (step == 1) r.grads = (*trainer)->Grads();
    EXPECT_TRUE((*trainer)->OptimizerStep().ok());
  }
  r.params = (*trainer)->Params();
  r.base = (*trainer)->BaseParams();
  return r;
}

void ExpectEqualNamed(const std::vector<NamedParam>& want, const std::vector<NamedParam>& got,
                      const std::string& what) {
  ASSERT_EQ(want.size(), got.size()) << what;
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(want[i].name, got[i].name) << what;
    EXPECT_TRUE(torch::equal(want[i].param, got[i].param))
        << what << " " << want[i].name << " max diff "
        << (want[i].param - got[i].param).abs().max().item<double>();
  }
}

struct LoraPlan {
  std::string name;
  bool tied;
  int base_n_persist;
  int adapter_n_persist;
  std::vector<BlockMode> modes;
  bool nf4 = false;
};
void PrintTo(const LoraPlan& p, std::ostream* os) { *os << p.name; }

class LoraTrainerTest : public ::testing::TestWithParam<LoraPlan> {};

TEST_P(LoraTrainerTest, ManagedEqualsUnmanagedBitForBit) {
  const LoraPlan& plan = GetParam();
  TrainerOptions reference;
  reference.grad_accum = 2;
  reference.adamw.lr = 1e-2;
  reference.adamw.weight_decay = 0.1;
  reference.block_modes = plan.modes;
  TrainerOptions managed = reference;
  managed.managed = true;
  managed.chunks.chunk_bytes = 48 << 10;
  managed.chunks.n_persist = plan.base_n_persist;
  managed.chunks.n_buffer = 2;
  managed.chunks.cpu_threads = 2;
  managed.adapter_n_persist = plan.adapter_n_persist;

  const RunResult want = Train(reference, plan.tied, 0.1, plan.nf4);
  const RunResult got = Train(managed, plan.tied, 0.1, plan.nf4);
  ASSERT_EQ(want.losses.size(), got.losses.size());
  for (size_t i = 0; i < want.losses.size(); ++i) EXPECT_EQ(want.losses[i], got.losses[i]) << i;
  ExpectEqualNamed(want.grads, got.grads, "grads");
  ExpectEqualNamed(want.params, got.params, "adapters after two steps");
  ExpectEqualNamed(want.base, got.base, "frozen base");
  // Only adapters are trained; the base equals a fresh model's.
  auto fresh = MakeModel(plan.tied, 0.1, plan.nf4);
  std::vector<NamedParam> initial;
  for (const auto& p : fresh->Params()) initial.push_back({p.name, p.param.detach()});
  ExpectEqualNamed(initial, got.base, "base unchanged");
  for (const auto& g : got.grads) EXPECT_NE(g.name.find(".lora_"), std::string::npos) << g.name;
}

using M = BlockMode;
INSTANTIATE_TEST_SUITE_P(
    Plans, LoraTrainerTest,
    ::testing::Values(LoraPlan{"base_offloaded_adapters_resident",
                               false,
                               0,
                               -1,
                               {M::kNone, M::kNone, M::kNone, M::kNone}},
                      LoraPlan{"base_persistent_adapters_offloaded",
                               false,
                               100,
                               0,
                               {M::kCkpt, M::kCkpt, M::kCkpt, M::kCkpt}},
                      LoraPlan{
                          "mixed_tied", true, 2, 1, {M::kCkpt, M::kSwap, M::kHsOffload, M::kNone}},
                      LoraPlan{"all_offloaded_hs_offload",
                               false,
                               0,
                               0,
                               {M::kHsOffload, M::kHsOffload, M::kHsOffload, M::kHsOffload}},
                      LoraPlan{"qlora_base_offloaded",
                               false,
                               0,
                               -1,
                               {M::kNone, M::kCkpt, M::kNone, M::kHsOffload},
                               true},
                      LoraPlan{"qlora_mixed_tied",
                               true,
                               1,
                               0,
                               {M::kCkpt, M::kSwap, M::kHsOffload, M::kNone},
                               true}),
    [](const ::testing::TestParamInfo<LoraPlan>& info) { return info.param.name; });

// [LoRA managers] What each manager allocates: the frozen base parameters only (no grad
// staging, master or optimizer state anywhere), the adapters everything AdamW needs.
TEST(LoraTrainerTest, FrozenBaseHoldsParametersOnly) {
  auto model = MakeModel(false, 0);
  TrainerOptions options;
  options.managed = true;
  options.chunks.chunk_bytes = 48 << 10;
  options.chunks.n_persist = 2;
  options.chunks.cpu_threads = 1;
  options.adapter_n_persist = 1;
  options.grad_accum = 2;
  auto trainer = Trainer::Create(model.get(), options);
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  ChunkManager* base = (*trainer)->base_chunk_manager();
  ChunkManager* adapters = (*trainer)->chunk_manager();
  ASSERT_NE(base, nullptr);
  ASSERT_NE(adapters, nullptr);
  const ChunkMemoryStats b = base->MemoryStats();
  EXPECT_GT(b.n_chunks, 3);
  EXPECT_EQ(b.n_persist, 2);
  EXPECT_EQ(b.persistent_state_device_bytes, 0);
  int64_t persistent = 0;
  for (int c = 0; c < b.n_persist; ++c) persistent += b.chunk_bytes[c];
  EXPECT_EQ(b.persistent_device_bytes, persistent);
  // CPU: no pinned memory; the host holds exactly the offloaded chunks' parameters.
  EXPECT_EQ(b.host_pinned_bytes + b.host_pageable_bytes, b.layout_bytes - persistent);

  const ChunkMemoryStats a = adapters->MemoryStats();
  ASSERT_GT(a.n_chunks, 1);
  EXPECT_EQ(a.n_persist, 1);
  EXPECT_EQ(a.persistent_state_device_bytes,
            a.chunk_bytes[0] / 4 * PersistentStateBytesPerElem(OptimizerKind::kAdamW, 4));
  int64_t host = 0;
  for (int c = 1; c < a.n_chunks; ++c) {
    host += OffloadedChunkHost(OptimizerKind::kAdamW, 4, 2, a.chunk_bytes[c]).total();
  }
  EXPECT_EQ(a.host_pinned_bytes + a.host_pageable_bytes, host);

  const auto loss = (*trainer)->ForwardBackward(Batches(5));
  ASSERT_TRUE(loss.ok()) << loss.status();
  EXPECT_TRUE(base->Grads().empty());
  EXPECT_EQ(adapters->Grads().size(), model->TrainableParams().size());
  ASSERT_TRUE((*trainer)->OptimizerStep().ok());
  EXPECT_TRUE(base->OptimizerState().empty());
  EXPECT_FALSE(adapters->OptimizerState().empty());
}

TEST(LoraTrainerTest, FrozenManagerRefusesTrainableParameters) {
  torch::Tensor w = torch::ones({4, 4}).requires_grad_(true);
  ParamGroups groups = {{{"w", w}}};
  ChunkManagerOptions options;
  options.frozen = true;
  auto manager = ChunkManager::Create(groups, options);
  ASSERT_FALSE(manager.ok());
  EXPECT_NE(manager.status().message().find("frozen: parameter w requires grad"), std::string::npos)
      << manager.status();
}

}  // namespace
}  // namespace memplan
